//! Every gate is complete: each field of `spec.gates`, read from the CRD
//! the types generate (so a field added to `Gates` is checked without
//! being listed here), has what `docs/development.md` ("Adding a gate")
//! asks of it:
//!
//! - its page: a row in a table of `docs/gates.md` that starts with its
//!   field (`` `<field>` ``, `` `<field>[]` `` or `` `<field>/<name>` ``);
//! - a CEL rule: an `x-kubernetes-validations` rule in its schema whose
//!   message names it (`gates.<field>...`);
//! - a malformed case: a manifest in `tests/malformed/` whose expectation is
//!   on it (`# expect: spec.gates.<field>...`);
//! - its status rendering: judged ([`super::judge`]) with the gates of the
//!   repository's examples (`examples/*.yaml`), some result recorded in
//!   status is named after it (`<field>` or `<field>/...`), which is what
//!   the `Degraded` condition, the metrics and `kubectl saferollout status`
//!   show. A field the core never judges fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kube_core::CustomResourceExt;
use saferollout_api::{SafeRollout, SafeRolloutSpec, StageStatus};
use serde_json::Value;

use super::test_support::World;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fields of `spec.gates` and their schemas, from the generated CRD.
fn gate_fields() -> Vec<(String, Value)> {
    let crd = serde_json::to_value(SafeRollout::crd()).unwrap();
    let gates = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["gates"]["properties"];
    let fields: Vec<(String, Value)> = gates
        .as_object()
        .expect("spec.gates has properties")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(fields.len() >= 9, "{fields:?}");
    fields
}

/// `name` followed by the end or a character that cannot continue a field name.
fn names(text: &str, name: &str, after: &[char]) -> bool {
    text.strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(after))
}

fn messages(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            for rule in map
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.extend(rule["message"].as_str().map(str::to_string));
            }
            map.values().for_each(|v| messages(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| messages(v, out)),
        _ => {}
    }
}

fn has_docs_row(docs: &str, field: &str) -> bool {
    docs.lines().any(|l| {
        l.strip_prefix("| `")
            .is_some_and(|cell| names(cell, field, &['`', '[', '/']))
    })
}

fn has_cel_rule(schema: &Value, field: &str) -> bool {
    let mut found = Vec::new();
    messages(schema, &mut found);
    let named = format!("gates.{field}");
    found.iter().any(|m| {
        m.match_indices(&named)
            .any(|(i, _)| names(&m[i..], &named, &['.', '[', ' ', ',', ':']))
    })
}

fn malformed_expectations() -> Vec<String> {
    let dir = repo().join("tests/malformed");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let first = text.lines().next()?.strip_prefix("# expect: ")?;
            Some(first.trim().to_string())
        })
        .collect()
}

/// The SafeRollout specs of `examples/*.yaml`.
fn example_specs() -> Vec<(String, SafeRolloutSpec)> {
    let dir = repo().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut specs = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let docs: Vec<Value> =
            serde_yaml::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        for doc in docs.iter().filter(|d| d["kind"] == "SafeRollout") {
            let spec = serde_json::from_value(doc["spec"].clone())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            specs.push((p.display().to_string(), spec));
        }
    }
    specs
}

/// The gate names (up to a `/`) of the results judging `spec` records in
/// status, on two nodes running a Ready new agent.
fn recorded_gates(spec: &SafeRolloutSpec) -> BTreeSet<String> {
    let w = World::healthy(2, 8);
    let mut stages = vec![StageStatus {
        index: 0,
        nodes: w.nodes.clone(),
        ..Default::default()
    }];
    let judged = w.with_snapshot(|snap| super::judge(spec, snap, &mut stages, 0, "rollout"));
    judged
        .verdicts
        .iter()
        .map(|v| v.result.gate.split('/').next().unwrap().to_string())
        .collect()
}

#[test]
fn every_field_of_gates_has_its_page_cel_rule_malformed_case_and_status() {
    let docs = std::fs::read_to_string(repo().join("docs/gates.md")).unwrap();
    let malformed = malformed_expectations();
    let mut recorded = BTreeSet::new();
    for (_, spec) in example_specs() {
        recorded.extend(recorded_gates(&spec));
    }
    let mut missing = Vec::new();
    for (field, schema) in gate_fields() {
        if !has_docs_row(&docs, &field) {
            missing.push(format!(
                "{field}: no row starting with `{field}` in a table of docs/gates.md"
            ));
        }
        if !has_cel_rule(&schema, &field) {
            missing.push(format!(
                "{field}: no CEL rule (x-kubernetes-validations) whose message names gates.{field}"
            ));
        }
        let path = format!("spec.gates.{field}");
        if !malformed.iter().any(|e| names(e, &path, &['.', '['])) {
            missing.push(format!(
                "{field}: no tests/malformed/*.yaml with `# expect: {path}...`"
            ));
        }
        if !recorded.contains(&field) {
            missing.push(format!(
                "{field}: judged with the gates of examples/*.yaml, no result named {field} in status \
                 (not judged in gates::judge, or in no example)"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "gates incomplete (docs/development.md, \"Adding a gate\"):\n{}",
        missing.join("\n")
    );
}

/// The checks above tell a complete gate from an incomplete one.
#[test]
fn the_checks_see_what_is_missing() {
    assert!(has_docs_row("| `allocatable[]` | a |", "allocatable"));
    assert!(has_docs_row("| `prometheus/<name>` | a |", "prometheus"));
    assert!(!has_docs_row("| `allocatableX` | a |", "allocatable"));
    assert!(!has_docs_row("see `allocatable`", "allocatable"));
    let schema = serde_json::json!({"properties": {"soak": {"x-kubernetes-validations": [
        {"rule": "true", "message": "gates.nodeConditions.soak must be a duration"}]}}});
    assert!(has_cel_rule(&schema, "nodeConditions"));
    assert!(!has_cel_rule(&schema, "node"));
    assert!(!has_cel_rule(
        &serde_json::json!({"type": "string"}),
        "nodeConditions"
    ));
    assert!(names(
        "spec.gates.logs.window",
        "spec.gates.logs",
        &['.', '[']
    ));
    assert!(!names("spec.gates.logsX", "spec.gates.logs", &['.', '[']));
    // An example without a gate: only podsReady (always judged) is recorded.
    let spec = SafeRolloutSpec::for_daemonset("agent");
    assert_eq!(
        recorded_gates(&spec),
        BTreeSet::from(["podsReady".to_string()])
    );
}
