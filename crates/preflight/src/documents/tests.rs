use super::*;
use crate::tests::codes_of;

const PLUGIN: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvidia-device-plugin
  namespace: gpu
spec:
  selector:
    matchLabels: {app: nvidia-device-plugin}
  template:
    metadata:
      labels: {app: nvidia-device-plugin}
    spec:
      priorityClassName: system-node-critical
      tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      containers:
      - name: plugin
        image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1
        resources:
          requests: {cpu: 50m, memory: 64Mi}
          limits: {memory: 128Mi}
        volumeMounts:
        - {name: dp, mountPath: /var/lib/kubelet/device-plugins}
      volumes:
      - name: dp
        hostPath: {path: /var/lib/kubelet/device-plugins}
"#;

fn lint(yaml: &str) -> Vec<(DocRef, Vec<Finding>)> {
    lint_documents(yaml, None).unwrap_or_else(|e| panic!("{e}"))
}

fn lint_err(yaml: &str) -> LintError {
    match lint_documents(yaml, None) {
        Ok(r) => panic!("expected an error, got {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn splitting() {
    let chunks = split_documents(
        "\u{feff}# header\n---\na: 1\n--- # c\r\nb: 2\n...\n---\n--- {c: 3}\n---x: 1\n",
    );
    let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(
        texts,
        [
            "# header\n",
            "   \na: 1\n",
            "    # c\r\nb: 2\n",
            "",
            "   \n",
            "    {c: 3}\n---x: 1\n"
        ]
    );
    let lines: Vec<usize> = chunks.iter().map(|c| c.first_line).collect();
    // After `...` a new (here empty) document starts on the next line.
    assert_eq!(lines, [1, 2, 4, 7, 7, 8]);
    let content: Vec<Option<usize>> = chunks.iter().map(Chunk::content_line).collect();
    assert_eq!(content, [None, Some(3), Some(5), None, None, Some(8)]);
    assert!(is_marker("---", "---") && is_marker("--- ", "---") && is_marker("---\t#", "---"));
    assert!(!is_marker("----", "---") && !is_marker(" ---", "---"));
    assert_eq!(split_documents("").len(), 1);
}

#[test]
fn a_good_daemonset_has_no_findings() {
    let results = lint(PLUGIN);
    assert_eq!(results.len(), 1);
    let (doc, findings) = &results[0];
    assert!(findings.is_empty(), "{findings:?}");
    assert_eq!(doc.document, 1);
    assert_eq!(doc.line, 1);
    assert_eq!(doc.kind, "DaemonSet");
    assert_eq!(doc.name.as_deref(), Some("nvidia-device-plugin"));
    assert_eq!(
        doc.to_string(),
        "document 1 (line 1): DaemonSet gpu/nvidia-device-plugin"
    );
    // PSA is applied when given.
    let results = lint_documents(PLUGIN, Some(PsaLevel::Baseline)).unwrap();
    assert_eq!(codes_of(&results[0].1), ["SR202"]);
}

#[test]
fn multi_document_input() {
    let yaml = format!(
        "# Licensed under the Apache License\n\
         ---\n\
         {PLUGIN}\
         ---\n\
         ---\n\
         # only a comment\n\
         ---\n\
         ~\n\
         ---\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata: {{name: cfg, namespace: gpu}}\n\
         ---\n\
         apiVersion: saferollout.dev/v1alpha1\n\
         kind: SafeRollout\n\
         metadata: {{name: nvidia, namespace: gpu}}\n\
         spec:\n  targetRef: {{name: Bad_Name}}\n\
         ---\n\
         apiVersion: v1\n\
         kind: List\n\
         items:\n\
         - apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {{name: amd-device-plugin}}\n\
         - apiVersion: v1\n  kind: Service\n  metadata: {{name: metrics}}\n"
    );
    let results = lint(&yaml);
    // (document, item, line, kind, codes)
    type Summary<'a> = (usize, Option<usize>, usize, &'a str, Vec<&'a str>);
    let summary: Vec<Summary> = results
        .iter()
        .map(|(d, f)| (d.document, d.item, d.line, d.kind.as_str(), codes_of(f)))
        .collect();
    assert_eq!(
        summary,
        [
            (1, None, 3, "DaemonSet", vec![]),
            (2, None, 35, "ConfigMap", vec!["SR301"]),
            (3, None, 39, "SafeRollout", vec!["SR001"]),
            (4, Some(0), 45, "DaemonSet", vec!["SR102", "SR108", "SR109"]),
            (4, Some(1), 45, "Service", vec!["SR301"]),
        ]
    );
    assert_eq!(results[1].1[0].severity, crate::Severity::Info);
}

#[test]
fn unserved_api_versions_and_foreign_kinds() {
    let results = lint("apiVersion: extensions/v1beta1\nkind: DaemonSet\nmetadata: {name: old}\n");
    assert_eq!(codes_of(&results[0].1), ["SR302"]);
    let results = lint("apiVersion: apps/v1beta2\nkind: DaemonSet\nmetadata: {name: old}\n");
    assert_eq!(codes_of(&results[0].1), ["SR302"]);
    let results = lint(
        "apiVersion: saferollout.dev/v1\nkind: SafeRollout\nmetadata: {name: x}\nspec: {targetRef: {name: x}}\n",
    );
    assert_eq!(codes_of(&results[0].1), ["SR011"]);
    // OpenKruise's Advanced DaemonSet is another kind.
    let results =
        lint("apiVersion: apps.kruise.io/v1alpha1\nkind: DaemonSet\nmetadata: {name: x}\n");
    assert_eq!(codes_of(&results[0].1), ["SR301"]);
}

#[test]
fn empty_and_comment_only_inputs() {
    for yaml in [
        "",
        "\n\n",
        "# nothing\n# here\n",
        "---\n---\n...\n",
        "%YAML 1.2\n---\n",
        "null\n",
    ] {
        assert!(lint(yaml).is_empty(), "{yaml:?}");
    }
}

#[test]
fn garbage_is_a_syntax_error_with_a_position() {
    let e = lint_err("a: [1, 2\nb: }\n");
    assert_eq!(e.kind, LintErrorKind::Syntax);
    assert_eq!(e.document, 1);
    assert!(e.line.is_some() && e.column.is_some(), "{e:?}");
    assert!(!e.message.contains(" at line "), "{}", e.message);

    // Binary-ish input.
    let e = lint_err("\u{0}\u{1}\u{2}\u{7f}\u{fffd}ELF\u{3}");
    assert_eq!(e.kind, LintErrorKind::Syntax);
    assert_eq!((e.line, e.column), (Some(1), Some(1)));

    // Tabs for indentation, in the second document: lines count from the input's start.
    let e = lint_err(&format!(
        "{PLUGIN}---\napiVersion: v1\nkind: ConfigMap\ndata:\n\tkey: v\n"
    ));
    assert_eq!(e.kind, LintErrorKind::Syntax);
    assert_eq!(e.document, 2);
    assert_eq!(e.line, Some(31), "{e}");

    // A duplicated key.
    let e = lint_err("apiVersion: apps/v1\nkind: DaemonSet\nkind: DaemonSet\n");
    assert_eq!((e.kind, e.line), (LintErrorKind::Syntax, Some(3)));
}

#[test]
fn a_truncated_document_is_an_error() {
    let cut = &PLUGIN[..PLUGIN.find("nvcr.io").unwrap() + 3];
    let truncated = format!("{PLUGIN}---\n{}\"nvc", &cut[..cut.len() - 3]);
    let e = lint_err(&truncated);
    assert_eq!(e.document, 2);
    assert_eq!(e.kind, LintErrorKind::Syntax);
    assert_eq!(e.line, Some(27 + 18), "{e}");
    assert!(e.message.contains("quote"), "{e}");
}

#[test]
fn a_list_where_a_map_is_expected() {
    let yaml = PLUGIN.replace(
        "      containers:\n      - name: plugin\n",
        "      containers:\n        name: plugin\n",
    );
    let e = lint_err(&yaml);
    assert_eq!(e.kind, LintErrorKind::Invalid);
    assert_eq!(e.line, Some(17), "{e}");
    assert!(
        e.message
            .starts_with("does not deserialise as a DaemonSet: "),
        "{e}"
    );

    let yaml = PLUGIN.replace("  selector:\n", "  selector:\n  - x\n  selectorX:\n");
    let e = lint_err(&yaml);
    assert_eq!(e.kind, LintErrorKind::Invalid);
    assert_eq!(e.line, Some(8), "{e}");

    // The same inside a List: no line of its own, the item's index instead.
    let e = lint_err(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: DaemonSet\n  spec: [1]\n",
    );
    assert_eq!(
        (e.kind, e.item, e.line),
        (LintErrorKind::Invalid, Some(0), Some(1))
    );
    assert!(
        e.to_string()
            .starts_with("document 1 item 0, line 1: invalid object: "),
        "{e}"
    );
}

#[test]
fn documents_that_are_not_objects() {
    for (yaml, message) in [
        ("- a\n- b\n", "found a list"),
        ("just a string\n", "found a string"),
        ("kind: DaemonSet\n", "no apiVersion"),
        (
            "apiVersion: apps/v1\nkind: [DaemonSet]\n",
            "kind must be a non-empty string",
        ),
        (
            "apiVersion: v1\nkind: List\nitems:\n- 42\n",
            "found a number",
        ),
    ] {
        let e = lint_err(yaml);
        assert_eq!(e.kind, LintErrorKind::NotAnObject, "{yaml:?}");
        assert!(e.message.contains(message), "{yaml:?}: {e}");
    }
    let e = lint_err("# header\n---\n\n- a\n");
    assert_eq!((e.document, e.line), (1, Some(4)));
    assert_eq!(
        e.to_string(),
        "document 1, line 4: not a Kubernetes object: expected a mapping with apiVersion and kind, found a list"
    );
}

#[test]
fn never_panics_on_truncated_or_mangled_input() {
    let multi = format!(
        "{PLUGIN}---\napiVersion: saferollout.dev/v1alpha1\nkind: SafeRollout\nmetadata: {{name: x}}\nspec:\n  targetRef: {{name: nvidia-device-plugin}}\n  stages: [{{nodes: 1}}]\n"
    );
    let boundaries: Vec<usize> = multi.char_indices().map(|(i, _)| i).collect();
    for &end in &boundaries {
        let _ = lint_documents(&multi[..end], Some(PsaLevel::Restricted));
    }
    for replacement in [
        "\u{0}",
        "- ",
        ": ",
        "{",
        "]",
        "&a ",
        "*a",
        "!!binary ",
        "'",
        "\t",
        "\n---\n",
    ] {
        for &at in boundaries.iter().step_by(7) {
            let mangled = format!("{}{replacement}{}", &multi[..at], &multi[at..]);
            let _ = lint_documents(&mangled, Some(PsaLevel::Baseline));
        }
    }
}

#[test]
fn errors_and_refs_serialise() {
    let e = lint_err("- a\n");
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["kind"], "NotAnObject");
    assert_eq!(json["document"], 1);
    let (doc, _) = &lint(PLUGIN)[0];
    let json = serde_json::to_value(doc).unwrap();
    assert_eq!(json["apiVersion"], "apps/v1");
    assert!(json.get("item").is_none());
}

#[test]
fn a_namespace_in_the_input_sets_the_level_of_its_objects() {
    let in_other_namespace = PLUGIN.replace("namespace: gpu", "namespace: other");
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gpu\n  labels:\n    {ENFORCE_LABEL}: baseline\n---\n{PLUGIN}---\n{in_other_namespace}"
    );
    let results = lint(&yaml);
    let codes: Vec<Vec<&str>> = results.iter().map(|(_, f)| codes_of(f)).collect();
    assert_eq!(codes, [vec!["SR301"], vec!["SR202"], vec![]]);
    // The caller's level still applies to other namespaces.
    let results = lint_documents(&yaml, Some(PsaLevel::Restricted)).unwrap();
    let codes: Vec<Vec<&str>> = results.iter().map(|(_, f)| codes_of(f)).collect();
    assert_eq!(
        codes,
        [
            vec!["SR301"],
            vec!["SR202"],
            vec!["SR202", "SR211", "SR212", "SR213", "SR214"]
        ]
    );
}

/// The line each finding of `results` is reported at, as `(code, line)`:
/// its field's line, or `None` when it names no field or it was not found.
fn lines(results: &[(DocRef, Vec<Finding>)]) -> Vec<(&'static str, Option<usize>)> {
    results
        .iter()
        .flat_map(|(_, f)| f.iter().map(|f| (f.code, f.line)))
        .collect()
}

#[test]
fn findings_on_a_field_carry_its_line_in_the_whole_input() {
    let latest = PLUGIN.replace("k8s-device-plugin:v0.17.1", "k8s-device-plugin:latest");
    // The second document starts on line 4: lines count from the input's start.
    let yaml = format!("# header\n---\n---\n{latest}");
    let results = lint(&yaml);
    assert_eq!(lines(&results), [("SR110", Some(18 + 3))]);
    let f = &results[0].1[0];
    assert_eq!(
        f.field.as_deref(),
        Some("spec.template.spec.containers[0].image")
    );
    assert_eq!(
        yaml.lines().nth(20),
        Some("        image: nvcr.io/nvidia/k8s-device-plugin:latest")
    );
    let json = serde_json::to_value(f).unwrap();
    assert_eq!(json["line"], 21);
    assert_eq!(json["field"], "spec.template.spec.containers[0].image");

    // A finding about the whole object has neither.
    let results = lint(&PLUGIN.replace("      priorityClassName: system-node-critical\n", ""));
    assert_eq!(lines(&results), [("SR108", None)]);
    assert!(
        serde_json::to_value(&results[0].1[0])
            .unwrap()
            .get("line")
            .is_none()
    );

    // In a List, the item's field is found under `items[i]`.
    let list = "\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: c}
- apiVersion: apps/v1
  kind: DaemonSet
  metadata: {name: amdgpu-device-plugin-daemonset}
  spec:
    template:
      spec:
        priorityClassName: system-node-critical
        tolerations: [{operator: Exists}]
        containers:
        - name: dp
          image: rocm/k8s-device-plugin
          resources: {requests: {cpu: 10m}, limits: {memory: 64Mi}}
          volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]
        volumes: [{name: dp, hostPath: {path: /var/lib/kubelet/device-plugins}}]
";
    let results = lint(list);
    assert_eq!(lines(&results), [("SR301", None), ("SR110", Some(17))]);
}

#[test]
fn a_field_merged_in_from_an_anchor_is_at_the_merge_key() {
    // The second container takes its keys from the first (`<<: *c`): its
    // image is reported where it is merged in, the first's where it is written.
    let yaml = PLUGIN
        .replace(
            "      - name: plugin\n        image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1\n",
            "      - &c\n        name: plugin\n        image: example/device-plugin:devel\n",
        )
        .replace(
            "      volumes:\n",
            "      - <<: *c\n        name: second\n      volumes:\n",
        );
    assert_eq!(yaml.lines().nth(24), Some("      - <<: *c"));
    let results = lint(&yaml);
    assert_eq!(lines(&results), [("SR110", Some(19)), ("SR110", Some(25))]);
}

const NVIDIA_NO_INIT_FAIL: &str = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin-daemonset, namespace: kube-system}
spec:
  template:
    spec:
      priorityClassName: system-node-critical
      tolerations: [{key: nvidia.com/gpu, operator: Exists}]
      containers:
      - name: ctr
        image: nvcr.io/nvidia/k8s-device-plugin:v0.17.4
        env:
        - name: FAIL_ON_INIT_ERROR
          value: \"false\"
        resources: {requests: {cpu: 10m}, limits: {memory: 64Mi}}
        volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]
      volumes: [{name: dp, hostPath: {path: /var/lib/kubelet/device-plugins}}]
";

fn rollout(namespace: &str, target: &str, gates: &str) -> String {
    format!(
        "---\napiVersion: saferollout.dev/v1alpha1\nkind: SafeRollout\nmetadata: {{name: sr, namespace: {namespace}}}\nspec:\n  targetRef: {{name: {target}}}\n{gates}"
    )
}

#[test]
fn a_saferollout_in_the_input_gates_its_target() {
    let alone = lint(NVIDIA_NO_INIT_FAIL);
    assert_eq!(lines(&alone), [("SR111", Some(13))]);
    assert!(
        alone[0].1[0]
            .message
            .contains("no SafeRollout in the input targets it")
    );

    // An allocatable gate with a floor counts the plugin's GPUs: silent.
    let gated = format!(
        "{NVIDIA_NO_INIT_FAIL}{}",
        rollout(
            "kube-system",
            "nvidia-device-plugin-daemonset",
            "  gates:\n    allocatable:\n    - {resource: nvidia.com/gpu}\n"
        )
    );
    assert_eq!(lines(&lint(&gated)), []);

    // A SafeRollout without one: the warning says so.
    let ungated = format!(
        "{NVIDIA_NO_INIT_FAIL}{}",
        rollout("kube-system", "nvidia-device-plugin-daemonset", "")
    );
    let results = lint(&ungated);
    assert_eq!(lines(&results), [("SR111", Some(13))]);
    assert!(
        results[0].1[0].message.contains("no allocatable gate"),
        "{:?}",
        results[0].1
    );

    // One in another namespace, or for another DaemonSet, gates nothing here.
    for (ns, target) in [
        ("gpu", "nvidia-device-plugin-daemonset"),
        ("kube-system", "other"),
    ] {
        let elsewhere = format!(
            "{NVIDIA_NO_INIT_FAIL}{}",
            rollout(
                ns,
                target,
                "  gates:\n    allocatable:\n    - {resource: nvidia.com/gpu}\n"
            )
        );
        let results = lint(&elsewhere);
        assert!(
            results[0].1[0].message.contains("no SafeRollout"),
            "{ns}/{target}"
        );
    }

    // A DaemonSet of unknown kind with a moving tag: only once a SafeRollout
    // rolls it out is it an agent whose image matters.
    let agent = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: gpu}
spec:
  template:
    spec:
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      containers:
      - {name: a, image: example/agent:main, resources: {requests: {cpu: 1m}, limits: {memory: 1Mi}}}
";
    assert_eq!(lines(&lint(agent)), []);
    let rolled = format!("{agent}{}", rollout("gpu", "agent", ""));
    assert_eq!(lines(&lint(&rolled)), [("SR110", Some(10))]);
}
