//! The malformed corpus at `tests/malformed/` (repository root): every manifest
//! is a well-formed SafeRollout document that is invalid in exactly one way, and
//! its first line `# expect: <substring>` names the field the API server's error
//! names. The API server is the authority (another test applies these to a real
//! kube-apiserver); here the client-side validator, which mirrors the schema,
//! must reject each one on that field and on no other.

use std::path::PathBuf;

use saferollout_api::SafeRollout;

fn corpus() -> Vec<(String, String, String)> {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../../tests/malformed");
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
            let first = text.lines().next().unwrap_or_default();
            let expect = first
                .strip_prefix("# expect: ")
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
        "only {} malformed manifests",
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
        let doc: serde_json::Value =
            serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(doc["apiVersion"], "saferollout.dev/v1alpha1", "{file}");
        assert_eq!(doc["kind"], "SafeRollout", "{file}");
        assert!(
            doc["metadata"].get("namespace").is_none(),
            "{file}: must be namespace-less"
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
        match serde_yaml::from_str::<SafeRollout>(&text) {
            // Only a missing required field fails to deserialise; serde names it.
            Err(e) => {
                let field = expect.rsplit('.').next().unwrap();
                assert!(
                    e.to_string().contains(field),
                    "{file}: serde error {e} does not name {field}"
                );
            }
            Ok(sr) => {
                let errors = sr.validate();
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
