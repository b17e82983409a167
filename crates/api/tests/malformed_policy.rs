//! The malformed policy corpus at `tests/malformed-policy/` (repository
//! root): every manifest is a SafeRolloutPolicy invalid in exactly one way,
//! its first line `# expect: <field path>`. The client-side validator, which
//! mirrors the policy CRD's schema, must reject each one on that field and
//! on no other.

use std::path::PathBuf;

use saferollout_api::SafeRolloutPolicy;

fn corpus() -> Vec<(String, String, String)> {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../../tests/malformed-policy");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let expect = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# expect: "))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: first line must be `# expect: <substring>`",
                        p.display()
                    )
                })
                .trim()
                .to_string();
            assert!(!expect.is_empty(), "{}: empty expectation", p.display());
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                expect,
                text,
            )
        })
        .collect()
}

#[test]
fn corpus_is_large_enough_and_well_formed() {
    let corpus = corpus();
    assert!(
        corpus.len() >= 12,
        "only {} malformed policies",
        corpus.len()
    );
    let mut names = std::collections::BTreeSet::new();
    for (file, _, text) in &corpus {
        let (num, _) = file
            .split_once('-')
            .unwrap_or_else(|| panic!("{file}: name must be NN-name.yaml"));
        assert!(
            num.len() == 2 && num.bytes().all(|b| b.is_ascii_digit()),
            "{file}: name must be NN-name.yaml"
        );
        assert!(
            text.lines().nth(1).is_some_and(|l| l.starts_with("# ")),
            "{file}: line 2 must say what is wrong"
        );
        let doc: serde_json::Value =
            serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(doc["apiVersion"], "saferollout.dev/v1alpha1", "{file}");
        assert_eq!(doc["kind"], "SafeRolloutPolicy", "{file}");
        assert!(
            doc["metadata"].get("namespace").is_none(),
            "{file}: a policy is cluster-scoped"
        );
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no metadata.name"));
        assert!(
            names.insert(name.to_string()),
            "{file}: duplicate metadata.name {name}"
        );
    }
}

#[test]
fn every_manifest_is_rejected_on_the_expected_field_only() {
    for (file, expect, text) in corpus() {
        match serde_yaml::from_str::<SafeRolloutPolicy>(&text) {
            // Only a missing required field fails to deserialise; serde names it.
            Err(e) => {
                let field = expect.rsplit('.').next().unwrap();
                assert!(
                    e.to_string().contains(field),
                    "{file}: serde error {e} does not name {field}"
                );
            }
            Ok(policy) => {
                let errors = policy.validate();
                assert!(
                    !errors.is_empty(),
                    "{file}: accepted, expected an error on {expect}"
                );
                for err in &errors {
                    assert!(
                        err.to_string().contains(&expect),
                        "{file}: error `{err}` is not about {expect} (all: {errors:?})"
                    );
                }
            }
        }
    }
}

#[test]
fn the_corpus_fixed_is_valid() {
    // Each file is wrong in one way only: the same policy with the field
    // removed validates, so the rejection above is that field's.
    let fixed = r#"
apiVersion: saferollout.dev/v1alpha1
kind: SafeRolloutPolicy
metadata: {name: gpu-node-stack}
spec:
  selector: {rolloutSelector: {matchLabels: {saferollout.dev/stack: gpu}}}
  maxDisruptedNodes: "10%"
  maxConcurrentRollouts: 2
  ordering:
  - rollouts: {matchLabels: {agent: device-plugin}}
    after: [{matchLabels: {agent: driver}}]
  maintenanceWindows:
  - {days: [Monday, Saturday], start: "22:00", end: "04:00", timeZone: Europe/Paris}
"#;
    let policy: SafeRolloutPolicy = serde_yaml::from_str(fixed).unwrap();
    assert_eq!(policy.validate(), vec![]);
}
