//! deploy/crd.yaml and deploy/crd-policy.yaml must be exactly what the code
//! generates, and parse back to the CRDs.

use std::path::PathBuf;

/// Fails naming the first differing line and the command that regenerates
/// `file` (under `deploy/`) when it is not `generated`.
fn assert_fresh(file: &str, generated: &str, regenerate: &str) {
    let path =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../../deploy")
            .join(file);
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != generated {
        let first_diff = on_disk
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or(on_disk.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "{} is stale or missing (first difference at line {first_diff}).\n\
             Regenerate it with:\n\n    {regenerate}\n",
            path.display()
        );
    }
}

/// `yaml` parses back to `crd`: guards against YAML serialisation surprises
/// (quoting of "10m", "1%", rules).
fn assert_parses_back(yaml: &str, crd: impl serde::Serialize) {
    let parsed: serde_json::Value = serde_yaml::from_str(yaml).expect("crd yaml parses");
    assert_eq!(parsed, serde_json::to_value(crd).unwrap());
}

#[test]
fn deploy_crd_yaml_is_fresh() {
    assert_fresh(
        "crd.yaml",
        &saferollout_api::crd_yaml(),
        "cargo run -p saferollout-api --bin crdgen > deploy/crd.yaml",
    );
}

#[test]
fn deploy_crd_yaml_parses_back_to_the_crd() {
    assert_parses_back(
        &saferollout_api::crd_yaml(),
        <saferollout_api::SafeRollout as kube::CustomResourceExt>::crd(),
    );
}

#[test]
fn deploy_crd_policy_yaml_is_fresh() {
    assert_fresh(
        "crd-policy.yaml",
        &saferollout_api::policy_crd_yaml(),
        "cargo run -p saferollout-api --bin crdgen -- policy > deploy/crd-policy.yaml",
    );
}

#[test]
fn deploy_crd_policy_yaml_parses_back_to_the_crd() {
    assert_parses_back(
        &saferollout_api::policy_crd_yaml(),
        <saferollout_api::SafeRolloutPolicy as kube::CustomResourceExt>::crd(),
    );
}
