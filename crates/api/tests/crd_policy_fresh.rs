//! deploy/crd-policy.yaml must be exactly what the code generates.

use std::path::PathBuf;

#[test]
fn deploy_crd_policy_yaml_is_fresh() {
    let path =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../../deploy/crd-policy.yaml");
    let generated = saferollout_api::policy_crd_yaml();
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
             Regenerate it with:\n\n    cargo run -p saferollout-api --bin crdgen -- policy > deploy/crd-policy.yaml\n",
            path.display()
        );
    }
}

#[test]
fn deploy_crd_policy_yaml_parses_back_to_the_crd() {
    let generated = saferollout_api::policy_crd_yaml();
    let parsed: serde_json::Value = serde_yaml::from_str(&generated).expect("crd yaml parses");
    let expected = serde_json::to_value(
        <saferollout_api::SafeRolloutPolicy as kube::CustomResourceExt>::crd(),
    )
    .unwrap();
    assert_eq!(parsed, expected);
}
