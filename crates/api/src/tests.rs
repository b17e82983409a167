//! Crate-level tests: serde round trips, defaults, and the generated schema.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use crate::*;

const FULL_EXAMPLE: &str = r#"
apiVersion: saferollout.dev/v1alpha1
kind: SafeRollout
metadata:
  name: nvidia-device-plugin
  namespace: gpu-operator
spec:
  targetRef:
    name: nvidia-device-plugin-daemonset
  template:
    metadata:
      labels:
        app: nvidia-device-plugin
    spec:
      containers:
        - name: plugin
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1
  canary:
    nodeSelector:
      matchLabels:
        saferollout.dev/canary: "true"
  stages:
    - nodes: 1
      soak: 5m
      pause: true
    - nodes: "25%"
      soak: 10m
    - nodes: "100%"
  maxUnavailable: "10%"
  progressDeadline: 15m
  gates:
    podsReady:
      timeout: 5m
    allocatable:
      - resource: nvidia.com/gpu
        min: baseline
        max: "capacityLabel:nvidia.com/gpu.count"
        soak: 30s
      - resource: example.com/fpga
        min: 1
        max: 4
  paused: false
status:
  observedGeneration: 3
  phase: Progressing
  conditions:
    - type: Ready
      status: "False"
      reason: Progressing
      message: stage 1 of 3
      lastTransitionTime: "2026-01-02T03:04:05Z"
      observedGeneration: 3
  stableRevision: 6d4b7c9f8
  targetRevision: 5f7d8c6b4
  blockedRevisions:
    - revision: 7a8b9c0d1
      reason: GateFailed
      message: allocatable nvidia.com/gpu dropped to 0 on node-a
      blockedAt: "2026-01-01T00:00:00Z"
  currentStage: 1
  stages:
    - index: 0
      nodes: [node-a]
      state: Passed
      startedAt: "2026-01-02T03:00:00Z"
      verifiedAt: "2026-01-02T03:01:00Z"
      gates:
        - gate: podsReady
          status: Passed
          reason: AllReady
          message: 1/1 pods ready
        - gate: allocatable/nvidia.com/gpu
          status: Passed
          reason: WithinBounds
          message: ok
          node: node-a
          observed: "8"
          expected: ">= 8"
          since: "2026-01-02T03:00:30Z"
      baseline:
        node-a:
          nvidia.com/gpu: 8
    - index: 1
      nodes: [node-b, node-c]
      state: Replacing
      startedAt: "2026-01-02T03:02:00Z"
  lastGoodTemplate:
    controllerRevision: nvidia-device-plugin-daemonset-6d4b7c9f8
    revision: 6d4b7c9f8
  originalUpdateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  lastRetry: 7a8b9c0d1
  message: rolling out 5f7d8c6b4
"#;

fn ts(s: &str) -> Time {
    Time(s.parse::<jiff::Timestamp>().unwrap())
}

#[test]
fn full_example_deserialises_and_round_trips() {
    let sr: SafeRollout = serde_yaml::from_str(FULL_EXAMPLE).unwrap();
    let spec = &sr.spec;
    assert_eq!(spec.target_ref.name, "nvidia-device-plugin-daemonset");
    assert_eq!(spec.max_unavailable, IntOrString::String("10%".into()));
    assert_eq!(
        spec.progress_deadline_duration(),
        Ok(Duration::from_secs(900))
    );
    assert_eq!(spec.pods_ready_timeout(), Ok(Duration::from_secs(300)));
    let stages = spec.stages.as_ref().unwrap();
    assert_eq!(stages.len(), 3);
    assert!(stages[0].pause);
    assert_eq!(stages[2].soak.as_str(), "0s", "default soak");
    let gates = spec.allocatable_gates();
    assert_eq!(gates.len(), 2);
    assert_eq!(
        gates[0].max_bound(),
        Ok(Bound::CapacityLabel("nvidia.com/gpu.count".into()))
    );
    assert_eq!(gates[1].min_bound(), Ok(Bound::Value(1)));
    assert_eq!(gates[1].soak.as_str(), "10s", "default allocatable soak");
    assert_eq!(
        spec.canary
            .as_ref()
            .unwrap()
            .node_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["saferollout.dev/canary"],
        "true"
    );
    let template = spec.typed_template().unwrap().unwrap();
    assert_eq!(
        template.spec.unwrap().containers[0].image.as_deref(),
        Some("nvcr.io/nvidia/k8s-device-plugin:v0.17.1")
    );

    assert_eq!(sr.validate(), vec![], "the full example is valid");

    let status = sr.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(Phase::Progressing));
    assert_eq!(status.condition(CONDITION_READY).unwrap().status, "False");
    assert!(status.is_blocked("7a8b9c0d1"));
    assert_eq!(
        status.stage(0).unwrap().baseline["node-a"].get("nvidia.com/gpu"),
        Some(&8)
    );
    assert_eq!(
        status.stage(0).unwrap().gates[1].since,
        Some(ts("2026-01-02T03:00:30Z"))
    );
    assert_eq!(status.stage(1).unwrap().state, StageState::Replacing);
    assert_eq!(
        status
            .original_update_strategy
            .as_ref()
            .unwrap()
            .rolling_update
            .as_ref()
            .unwrap()
            .max_unavailable,
        Some(IntOrString::Int(1))
    );

    // JSON round trip is lossless, and YAML too.
    let json = serde_json::to_value(&sr).unwrap();
    let back: SafeRollout = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, sr);
    let yaml = serde_yaml::to_string(&sr).unwrap();
    let back: SafeRollout = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(back, sr);
    // camelCase on the wire.
    assert_eq!(json["spec"]["gates"]["podsReady"]["timeout"], "5m");
    assert_eq!(
        json["status"]["stages"][0]["verifiedAt"],
        "2026-01-02T03:01:00Z"
    );
    assert_eq!(json["status"]["phase"], "Progressing");
}

#[test]
fn status_built_in_code_serialises_deterministically() {
    let mut baseline = BTreeMap::new();
    baseline.insert(
        "node-b".to_string(),
        [("nvidia.com/gpu".to_string(), 4)].into_iter().collect(),
    );
    // Resources inserted out of order: a node's counts are sorted all the same.
    let mut node_a = ResourceCounts::new();
    node_a.insert("nvidia.com/gpu".to_string(), 8);
    node_a.insert("amd.com/gpu".to_string(), 2);
    baseline.insert("node-a".to_string(), node_a);
    // A node whose gates read no extended resource (DRA gates only).
    baseline.insert("node-c".to_string(), ResourceCounts::new());
    let status = SafeRolloutStatus {
        observed_generation: Some(1),
        phase: Some(Phase::RollingBack),
        conditions: vec![Condition {
            type_: CONDITION_DEGRADED.into(),
            status: "True".into(),
            reason: "GateFailed".into(),
            message: "allocatable".into(),
            last_transition_time: ts("2026-01-01T00:00:00Z"),
            observed_generation: Some(1),
        }],
        stages: vec![StageStatus {
            index: 0,
            nodes: vec!["node-a".into(), "node-b".into()],
            state: StageState::Failed,
            gates: vec![GateResult {
                gate: GATE_PODS_READY.into(),
                status: GateStatus::Failed,
                reason: "CrashLoopBackOff".into(),
                node: Some("node-a".into()),
                ..Default::default()
            }],
            baseline,
            ..Default::default()
        }],
        original_update_strategy: Some(DaemonSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable: Some(IntOrString::String("10%".into())),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let a = serde_json::to_string(&status).unwrap();
    let b = serde_json::to_string(&status.clone()).unwrap();
    assert_eq!(a, b);
    // Baseline groups are ordered by their counts whatever the insertion
    // order, a node's counts are a JSON object (sorted by resource), and
    // empty counts are an object too.
    assert!(
        a.contains(
            r#""baselineGroups":[{"counts":{},"nodes":["node-c"]},{"counts":{"amd.com/gpu":2,"nvidia.com/gpu":8},"nodes":["node-a"]},{"counts":{"nvidia.com/gpu":4},"nodes":["node-b"]}]"#
        ),
        "{a}"
    );
    // Absent optional fields are not serialised.
    assert!(!a.contains("null"), "{a}");
    assert!(!a.contains("lastGoodTemplate"));
    assert_eq!(
        serde_json::from_str::<SafeRolloutStatus>(&a).unwrap(),
        status
    );
    assert_eq!(
        serde_json::to_value(SafeRolloutStatus::default()).unwrap(),
        json!({})
    );
}

#[test]
fn minimal_spec_gets_defaults() {
    let sr: SafeRollout = serde_yaml::from_str(
        "apiVersion: saferollout.dev/v1alpha1\nkind: SafeRollout\nmetadata: {name: x}\nspec:\n  targetRef: {name: ds}\n",
    )
    .unwrap();
    assert_eq!(sr.spec, SafeRolloutSpec::for_daemonset("ds"));
    let spec = &sr.spec;
    assert_eq!(spec.max_unavailable, IntOrString::Int(1));
    assert_eq!(spec.progress_deadline.as_str(), "10m");
    assert_eq!(
        spec.progress_deadline_duration(),
        Ok(Duration::from_secs(600))
    );
    assert_eq!(spec.pods_ready_timeout(), Ok(Duration::from_secs(600)));
    assert!(!spec.paused);
    assert!(spec.allocatable_gates().is_empty());
    assert_eq!(spec.typed_template().unwrap(), None);
    let stages = spec.effective_stages();
    assert_eq!(stages, default_stages());
    let nodes: Vec<_> = stages.iter().map(|s| s.nodes.clone()).collect();
    assert_eq!(
        nodes,
        vec![
            IntOrString::Int(1),
            IntOrString::String("10%".into()),
            IntOrString::String("50%".into()),
            IntOrString::String("100%".into())
        ]
    );
    assert!(stages.iter().all(|s| s.soak.as_str() == "0s" && !s.pause));
    // Serialising the defaulted spec writes the defaults explicitly.
    let json = serde_json::to_value(spec).unwrap();
    assert_eq!(
        json,
        json!({"targetRef": {"name": "ds"}, "maxUnavailable": 1, "progressDeadline": "10m", "paused": false})
    );
    // A null for a defaulted int-or-string is not silently accepted by serde,
    // which is why the schema makes the API server prune and default it.
    assert!(
        serde_json::from_value::<SafeRolloutSpec>(
            json!({"targetRef": {"name": "ds"}, "maxUnavailable": null})
        )
        .is_err()
    );
    assert!(
        serde_json::from_value::<SafeRolloutSpec>(
            json!({"targetRef": {"name": "ds"}, "template": null, "stages": null})
        )
        .is_ok()
    );
}

#[test]
fn effective_stages_ends_with_all_nodes() {
    let mut spec = SafeRolloutSpec::for_daemonset("ds");
    spec.stages = Some(vec![Stage::new(IntOrString::Int(2))]);
    let stages = spec.effective_stages();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0].nodes, IntOrString::Int(2));
    assert!(stages[1].is_full());

    spec.stages = Some(vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("100%".into())),
    ]);
    assert_eq!(spec.effective_stages().len(), 2);

    // An empty list (rejected by the API server) falls back to the defaults.
    spec.stages = Some(vec![]);
    assert_eq!(spec.effective_stages(), default_stages());
}

#[test]
fn typed_template_round_trips_and_reports_errors() {
    let mut spec = SafeRolloutSpec::for_daemonset("ds");
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("app".to_string(), "plugin".to_string())])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "plugin".into(),
                image: Some("example.com/plugin:v2".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    };
    spec.set_template(&template).unwrap();
    assert_eq!(spec.typed_template().unwrap(), Some(template));
    spec.template = Some(json!({"spec": {"containers": "not-a-list"}}));
    assert!(spec.typed_template().is_err());
}

#[test]
fn constants() {
    assert_eq!(RETRY_ANNOTATION, "saferollout.dev/retry");
    assert_eq!(STAGE_LABEL, "saferollout.dev/stage");
    assert_eq!(ROLLOUT_LABEL, "saferollout.dev/rollout");
    assert_eq!(FIELD_MANAGER, "saferollout-operator");
    assert_eq!(SafeRollout::crd_name(), CRD_NAME);
    assert_eq!(SafeRollout::api_resource().api_version, API_VERSION);
    assert_eq!(SafeRollout::api_resource().kind, KIND);
    assert_eq!(SafeRollout::api_resource().plural, PLURAL);
    for (p, s) in [
        (Phase::RollingBack, "RollingBack"),
        (Phase::Succeeded, "Succeeded"),
    ] {
        assert_eq!(p.as_str(), s);
        assert_eq!(serde_json::to_value(p).unwrap(), json!(s));
    }
    assert_eq!(StageState::Soaking.to_string(), "Soaking");
    assert_eq!(GateStatus::default(), GateStatus::Pending);
}

// ---------------------------------------------------------------------------
// The generated CRD and its schema.

fn crd_json() -> Value {
    serde_json::to_value(SafeRollout::crd()).unwrap()
}

fn root_schema() -> Value {
    crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Follows a path of property names; `[]` steps into array items.
fn at(schema: &Value, path: &str) -> Value {
    let mut cur = schema.clone();
    for part in path.split('.') {
        cur = if part == "[]" {
            cur["items"].clone()
        } else {
            cur["properties"][part].clone()
        };
        assert!(!cur.is_null(), "no schema at {path} (stuck at {part})");
    }
    cur
}

fn rules(schema: &Value) -> Vec<(String, String)> {
    schema["x-kubernetes-validations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_string(),
                        r["message"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn crd_metadata() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "saferollouts.saferollout.dev");
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "saferollout.dev");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "SafeRollout");
    assert_eq!(spec["names"]["plural"], "saferollouts");
    assert_eq!(spec["names"]["shortNames"], json!(["sr"]));
    assert!(
        spec["names"].get("categories").is_none_or(|c| !c
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "all"))
    );
    let version = &spec["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["served"], true);
    assert_eq!(version["storage"], true);
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<(String, String)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().into(),
                c["jsonPath"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected = [
        ("Phase", ".status.phase"),
        ("Stage", ".status.currentStage"),
        ("Target", ".status.targetRevision"),
        ("Ready", ".status.conditions[?(@.type==\"Ready\")].status"),
        ("Age", ".metadata.creationTimestamp"),
    ];
    assert_eq!(
        columns,
        expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn schema_has_field_naming_validations() {
    let root = root_schema();
    assert_eq!(root["properties"]["spec"]["required"], json!(["targetRef"]));

    let name = at(&root, "spec.targetRef.name");
    assert_eq!(name["maxLength"], 253);
    let r = rules(&name);
    assert!(r[0].0.contains("self.matches('^[a-z0-9]"));
    assert!(r[0].1.starts_with("targetRef.name must be"));
    assert_eq!(r[1].0, "self == oldSelf");

    let stages = at(&root, "spec.stages");
    assert_eq!(stages["minItems"], 1);
    assert_eq!(stages["maxItems"], crate::schema::MAX_STAGES);
    assert_eq!(stages["items"]["required"], json!(["nodes"]));

    let nodes = at(&root, "spec.stages.[].nodes");
    assert_eq!(nodes["x-kubernetes-int-or-string"], true);
    let r = rules(&nodes);
    assert!(
        r[0].0
            .starts_with("type(self) == int ? (self >= 1 && self <= 2147483647)"),
        "{}",
        r[0].0
    );
    assert!(r[0].0.contains("'1%', '2%'") && r[0].0.contains("'100%']"));
    assert!(!r[0].0.contains("'0%'") && !r[0].0.contains("'101%'"));
    assert!(
        !r[0].0.contains("matches"),
        "no regex on int-or-string (CEL cost)"
    );
    assert!(r[0].1.starts_with(
        "stages[].nodes must be a positive node count or a percentage between 1% and 100%"
    ));

    let soak = at(&root, "spec.stages.[].soak");
    assert_eq!(soak["default"], "0s");
    assert_eq!(soak["type"], "string");
    assert!(rules(&soak)[0].0.contains(duration::DURATION_REGEX));
    assert_eq!(at(&root, "spec.stages.[].pause")["default"], false);

    let mu = at(&root, "spec.maxUnavailable");
    assert_eq!(mu["default"], 1);
    assert_eq!(mu["nullable"], false);
    assert!(rules(&mu)[0].1.starts_with("maxUnavailable must be"));

    let pd = at(&root, "spec.progressDeadline");
    assert_eq!(pd["default"], "10m");
    let r = rules(&pd);
    assert_eq!(r.len(), 2);
    assert!(r[0].1.starts_with("progressDeadline must be a duration"));
    assert_eq!(r[1].1, "progressDeadline must be longer than zero");

    assert_eq!(at(&root, "spec.paused")["default"], false);
    assert_eq!(
        at(&root, "spec.template")["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(at(&root, "spec.template")["type"], "object");
    assert!(at(&root, "spec.canary.nodeSelector.matchLabels").is_object());

    assert!(
        rules(&at(&root, "spec.gates.podsReady.timeout"))[0]
            .1
            .starts_with("gates.podsReady.timeout must be")
    );

    let alloc = at(&root, "spec.gates.allocatable");
    assert_eq!(alloc["maxItems"], 8);
    assert_eq!(alloc["x-kubernetes-list-type"], "map");
    assert_eq!(alloc["x-kubernetes-list-map-keys"], json!(["resource"]));
    assert_eq!(alloc["items"]["required"], json!(["resource"]));
    let r = rules(&alloc["items"]);
    assert!(r[0].0.contains("self.min <= self.max"));
    assert_eq!(
        alloc["items"]["x-kubernetes-validations"][0]["fieldPath"],
        ".min"
    );
    let res = at(&root, "spec.gates.allocatable.[].resource");
    assert_eq!(res["maxLength"], 317);
    assert!(
        rules(&res)[0]
            .0
            .contains("!self.contains('kubernetes.io/')")
    );
    let min = at(&root, "spec.gates.allocatable.[].min");
    assert_eq!(min["default"], "baseline");
    assert!(rules(&min)[0].0.contains("self == 'baseline'"));
    let max = at(&root, "spec.gates.allocatable.[].max");
    assert_eq!(max["default"], "baseline");
    assert!(
        rules(&max)[0]
            .0
            .contains("self.startsWith('capacityLabel:')")
    );
    assert_eq!(
        at(&root, "spec.gates.allocatable.[].soak")["default"],
        "10s"
    );
}

#[test]
fn status_schema_list_maps_and_enums() {
    let root = root_schema();
    let conditions = at(&root, "status.conditions");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    let blocked = at(&root, "status.blockedRevisions");
    assert_eq!(blocked["x-kubernetes-list-map-keys"], json!(["revision"]));
    assert_eq!(
        at(&root, "status.stages")["x-kubernetes-list-map-keys"],
        json!(["index"])
    );
    assert_eq!(
        at(&root, "status.phase")["enum"],
        // kube renders an optional enum as nullable with a null member.
        json!([
            "Pending",
            "Progressing",
            "Paused",
            "Succeeded",
            "RollingBack",
            "Degraded",
            "Failed",
            null
        ])
    );
    assert_eq!(at(&root, "status.phase")["nullable"], true);
    assert_eq!(
        at(&root, "status.stages.[].state")["enum"],
        json!([
            "Pending",
            "Replacing",
            "Verifying",
            "Soaking",
            "Paused",
            "Passed",
            "Failed"
        ])
    );
    assert_eq!(
        at(&root, "status.stages.[].gates.[].status")["enum"],
        json!(["Pending", "Passed", "Failed"])
    );
    let groups = at(&root, "status.stages.[].baselineGroups");
    assert_eq!(groups["type"], "array");
    assert_eq!(
        groups["items"]["properties"]["counts"]["additionalProperties"]["type"],
        "integer"
    );
    assert_eq!(groups["items"]["properties"]["nodes"]["type"], "array");
    // What older operators wrote stays in the schema, or the API server
    // would prune it from a stored status before the operator read it.
    let legacy = at(&root, "status.stages.[].baseline");
    assert_eq!(legacy["type"], "object");
    assert_eq!(
        legacy["additionalProperties"]["additionalProperties"]["type"],
        "integer"
    );
    assert_eq!(
        at(&root, "status.stages.[].startedAt")["format"],
        "date-time"
    );
}

/// A stage's per-node fields are one field each for server-side apply: with
/// granular maps and list-maps, managedFields held an entry per node and
/// field (half of a 774 KB object at 5,000 nodes). A list without a list
/// type is atomic already; none of these may gain one but `atomic`.
#[test]
fn per_node_stage_fields_are_atomic_for_server_side_apply() {
    let root = root_schema();
    for field in ["baseline", "deviceBaseline"] {
        let s = at(&root, &format!("status.stages.[].{field}"));
        assert_eq!(s["type"], "object", "{field}");
        assert_eq!(s["x-kubernetes-map-type"], "atomic", "{field}");
    }
    for field in [
        "baselineGroups",
        "deviceBaselineGroups",
        "skipped",
        "probes",
    ] {
        let s = at(&root, &format!("status.stages.[].{field}"));
        assert_eq!(s["x-kubernetes-list-type"], "atomic", "{field}");
        assert!(s.get("x-kubernetes-list-map-keys").is_none(), "{field}");
    }
    for field in ["nodes", "failedNodes", "probed"] {
        let s = at(&root, &format!("status.stages.[].{field}"));
        assert_eq!(s["type"], "array", "{field}");
        assert!(
            s.get("x-kubernetes-list-type")
                .is_none_or(|t| t == "atomic"),
            "{field}: {s}"
        );
    }
}

/// Walks every schema node with its path.
fn walk(schema: &Value, path: &str, f: &mut dyn FnMut(&str, &Value)) {
    f(path, schema);
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            walk(v, &format!("{path}.{k}"), f);
        }
    }
    if schema["items"].is_object() {
        walk(&schema["items"], &format!("{path}[]"), f);
    }
    if schema["additionalProperties"].is_object() {
        walk(&schema["additionalProperties"], &format!("{path}{{}}"), f);
    }
}

/// What keeps a CRD schema from being structural or its CEL rules from
/// having a bounded cost; `bounded_lists` are lists (paths from the root)
/// that carry rules inside and must have a maxItems.
fn structural_problems(root: &Value, bounded_lists: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    walk(root, "", &mut |path, s| {
        let int_or_string = s["x-kubernetes-int-or-string"] == true;
        let preserve = s["x-kubernetes-preserve-unknown-fields"] == true;
        // Structural: every node has a type, except int-or-string and preserve-unknown-fields ones.
        if s.get("type").is_none() && !int_or_string && !preserve {
            problems.push(format!("{path}: no type"));
        }
        for forbidden in [
            "$ref",
            "oneOf",
            "allOf",
            "not",
            "definitions",
            "$defs",
            "const",
            "uniqueItems",
        ] {
            if s.get(forbidden).is_some() {
                problems.push(format!("{path}: has {forbidden}"));
            }
        }
        if s.get("anyOf").is_some() {
            problems.push(format!("{path}: has anyOf"));
        }
        if let Some(t) = s.get("type")
            && !t.is_string()
        {
            problems.push(format!("{path}: type is not a single string: {t}"));
        }
        // list-map keys must be required (or defaulted) in the items.
        if s["x-kubernetes-list-type"] == "map" {
            for key in s["x-kubernetes-list-map-keys"].as_array().unwrap() {
                let required = s["items"]["required"]
                    .as_array()
                    .is_some_and(|r| r.contains(key));
                let defaulted = s["items"]["properties"][key.as_str().unwrap()]
                    .get("default")
                    .is_some();
                if !required && !defaulted {
                    problems.push(format!(
                        "{path}: list-map key {key} neither required nor defaulted"
                    ));
                }
            }
        }
        // CEL cost: a string carrying rules has a maxLength; regexes and
        // substring searches never run on int-or-string values.
        for (rule, message) in rules(s) {
            if s["type"] == "string" && s.get("maxLength").is_none() {
                problems.push(format!("{path}: string with rules but no maxLength"));
            }
            if int_or_string
                && [
                    "matches",
                    "contains",
                    "split",
                    "replace",
                    "substring",
                    "find",
                ]
                .iter()
                .any(|f| rule.contains(f))
            {
                problems.push(format!(
                    "{path}: costly string function on int-or-string: {rule}"
                ));
            }
            if message.is_empty() {
                problems.push(format!("{path}: rule without message"));
            }
            // CEL string literals use single quotes; no backslashes to escape.
            if rule.contains('\\') || rule.contains('"') {
                problems.push(format!("{path}: rule needs escaping: {rule}"));
            }
        }
    });
    for path in bounded_lists {
        if at(root, path).get("maxItems").is_none() {
            problems.push(format!("{path}: no maxItems"));
        }
    }
    problems
}

#[test]
fn schema_is_structural_and_cel_is_bounded() {
    // Lists under spec that carry rules inside must be bounded.
    let problems = structural_problems(&root_schema(), &["spec.stages", "spec.gates.allocatable"]);
    assert!(
        problems.is_empty(),
        "schema problems:\n{}",
        problems.join("\n")
    );
}

fn policy_root_schema() -> Value {
    serde_json::to_value(SafeRolloutPolicy::crd()).unwrap()["spec"]["versions"][0]["schema"]
        ["openAPIV3Schema"]
        .clone()
}

#[test]
fn policy_schema_is_structural_and_cel_is_bounded() {
    let root = policy_root_schema();
    let problems = structural_problems(
        &root,
        &[
            "spec.ordering",
            "spec.ordering.[].after",
            "spec.maintenanceWindows",
            "spec.maintenanceWindows.[].days",
        ],
    );
    assert!(
        problems.is_empty(),
        "policy schema problems:\n{}",
        problems.join("\n")
    );
    // The planted checker must see the rules it bounds: a walk that found
    // none would pass vacuously.
    let mut ruled = Vec::new();
    walk(&root, "", &mut |path, s| {
        if !rules(s).is_empty() {
            ruled.push(path.to_string());
        }
    });
    assert!(ruled.len() >= 6, "rules found only at {ruled:?}");
}

#[test]
fn policy_crd_metadata_and_field_naming_rules() {
    let crd = serde_json::to_value(SafeRolloutPolicy::crd()).unwrap();
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["group"], "saferollout.dev");
    assert_eq!(crd["spec"]["names"]["kind"], "SafeRolloutPolicy");
    assert_eq!(crd["spec"]["names"]["plural"], "saferolloutpolicies");
    assert_eq!(crd["spec"]["versions"][0]["name"], "v1alpha1");
    assert!(crd["spec"]["versions"][0]["subresources"]["status"].is_object());
    let root = policy_root_schema();
    for (path, field) in [
        ("spec.maxDisruptedNodes", "maxDisruptedNodes"),
        ("spec.maxConcurrentRollouts", "maxConcurrentRollouts"),
        (
            "spec.maintenanceWindows.[].start",
            "maintenanceWindows[].start",
        ),
        ("spec.maintenanceWindows.[].end", "maintenanceWindows[].end"),
        (
            "spec.maintenanceWindows.[].timeZone",
            "maintenanceWindows[].timeZone",
        ),
        ("spec.maintenanceWindows.[]", "maintenanceWindows[].end"),
    ] {
        let r = rules(&at(&root, path));
        assert!(!r.is_empty(), "{path}: no rule");
        for (_, message) in r {
            assert!(message.starts_with(field), "{path}: {message}");
        }
    }
    let days = at(&root, "spec.maintenanceWindows.[].days");
    assert_eq!(days["x-kubernetes-list-type"], "set");
    assert_eq!(days["minItems"], 1);
    assert_eq!(days["items"]["enum"].as_array().unwrap().len(), 7);
    let conditions = at(&root, "status.conditions");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    assert!(
        at(&root, "spec")["required"]
            .as_array()
            .unwrap()
            .contains(&json!("selector"))
    );
}

#[test]
fn schema_defaults_are_valid_values() {
    // Defaults are applied by the API server and must deserialise in Rust.
    let root = root_schema();
    let spec_default = json!({
        "targetRef": {"name": "ds"},
        "maxUnavailable": at(&root, "spec.maxUnavailable")["default"],
        "progressDeadline": at(&root, "spec.progressDeadline")["default"],
        "paused": at(&root, "spec.paused")["default"],
        "stages": [{"nodes": 1, "soak": at(&root, "spec.stages.[].soak")["default"]}],
        "gates": {"allocatable": [{
            "resource": "nvidia.com/gpu",
            "min": at(&root, "spec.gates.allocatable.[].min")["default"],
            "max": at(&root, "spec.gates.allocatable.[].max")["default"],
            "soak": at(&root, "spec.gates.allocatable.[].soak")["default"],
        }]},
    });
    let spec: SafeRolloutSpec = serde_json::from_value(spec_default).unwrap();
    assert_eq!(
        spec.allocatable_gates()[0],
        AllocatableGate::new("nvidia.com/gpu")
    );
    assert_eq!(
        spec.progress_deadline_duration(),
        Ok(Duration::from_secs(600))
    );
}

#[test]
fn held_nodes_are_those_of_the_current_stage_and_before_and_holds_node_agrees() {
    let stage = |index: i32, nodes: &[&str]| StageStatus {
        index,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let mut st = SafeRolloutStatus {
        stages: vec![stage(0, &["a"]), stage(1, &["b", "c"]), stage(2, &["d"])],
        ..Default::default()
    };
    assert!(st.held_nodes().is_empty(), "no current stage holds nothing");
    assert!(!st.holds_node("a"));
    st.current_stage = Some(1);
    assert_eq!(
        st.held_nodes().into_iter().collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    for node in ["a", "b", "c", "d", "e"] {
        assert_eq!(
            st.holds_node(node),
            st.held_nodes().contains(node),
            "{node}"
        );
    }
}
