//! Property-based fuzzing of manifest parsing (`lint_documents`, what
//! `kubectl saferollout lint FILE` runs on a user's YAML): the lint corpus
//! (`tests/lint-corpus/`) mutated line by line and byte by byte (lines
//! dropped, repeated, moved, re-indented; values replaced by near-valid and
//! absurd ones; document markers inserted; text spliced), joined into
//! multi-document inputs, and raw bytes. It must never panic, and what it
//! reports must point inside the input: documents counted from 1, lines
//! and columns within the text. The coverage-guided target is
//! `fuzz/fuzz_targets/lint_documents.rs`.
//!
//! `PROPTEST_CASES` sets the number of cases (default 300 each).

use std::sync::OnceLock;

use proptest::prelude::*;
use saferollout_preflight::{PsaLevel, lint_documents};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(300);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn corpus() -> &'static [String] {
    static CORPUS: OnceLock<Vec<String>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/lint-corpus");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let texts: Vec<String> = files
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        assert!(texts.len() >= 10, "the lint corpus is missing");
        texts
    })
}

#[derive(Debug, Clone)]
enum Edit {
    DropLine(usize),
    RepeatLine(usize),
    MoveLine(usize, usize),
    Indent(usize, usize),
    Dedent(usize),
    /// Replace what follows the first `: ` of a line.
    Value(usize, String),
    Insert(usize, String),
    Splice(usize, usize, String),
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "~",
            "null",
            "[]",
            "{}",
            "[",
            "{",
            "\"",
            "'",
            "|",
            ">",
            "&a",
            "*a",
            "!!str",
            "!!binary 8",
            "<<: *a",
            "0",
            "-1",
            "1e999",
            "0x1F",
            "99999999999999999999999",
            "1.5",
            "100%",
            "101%",
            "baseline",
            "capacityLabel:",
            "capacityLabel:nvidia.com/gpu.count",
            "10m",
            "-5s",
            "OnDelete",
            "RollingUpdate",
            "apps/v1",
            "DaemonSet",
            "SafeRollout",
            "List",
            "saferollout.dev/v1alpha1",
            "privileged",
            "restricted",
            "true",
            "yes",
            "on",
            "- a",
            "- {a: 1}",
            "? a",
            "a: b: c",
            "# comment",
            "\t",
            "é",
            "\u{0}",
            "\u{feff}",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,20}",
        any::<String>(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let line = prop_oneof![
        scalar(),
        Just("---".to_string()),
        Just("...".to_string()),
        Just("--- !!map".to_string()),
        Just("%YAML 1.2".to_string()),
        Just("kind: List".to_string()),
        Just("items:".to_string()),
        Just("- apiVersion: apps/v1".to_string()),
    ];
    prop_oneof![
        1 => any::<usize>().prop_map(Edit::DropLine),
        1 => any::<usize>().prop_map(Edit::RepeatLine),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::MoveLine(a, b)),
        1 => (any::<usize>(), 1usize..5).prop_map(|(a, n)| Edit::Indent(a, n)),
        1 => any::<usize>().prop_map(Edit::Dedent),
        3 => (any::<usize>(), scalar()).prop_map(|(a, v)| Edit::Value(a, v)),
        1 => (any::<usize>(), line).prop_map(|(a, l)| Edit::Insert(a, l)),
        1 => (any::<usize>(), 0usize..10, "[ -~\n\t]{0,8}").prop_map(|(a, n, t)| Edit::Splice(a, n, t)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        let n = lines.len().max(1);
        match e {
            Edit::DropLine(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Edit::RepeatLine(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Edit::MoveLine(a, b) if !lines.is_empty() => {
                let l = lines.remove(a % n);
                lines.insert(b % n.max(1) % (lines.len() + 1), l);
            }
            Edit::Indent(i, k) if !lines.is_empty() => {
                lines[i % n].insert_str(0, &" ".repeat(*k));
            }
            Edit::Dedent(i) if !lines.is_empty() => {
                let l = &mut lines[i % n];
                *l = l.trim_start().to_string();
            }
            Edit::Value(i, v) if !lines.is_empty() => {
                let l = &mut lines[i % n];
                if let Some(at) = l.find(": ") {
                    l.replace_range(at + 2.., v);
                }
            }
            Edit::Insert(i, l) => lines.insert(i % (lines.len() + 1), l.clone()),
            Edit::Splice(at, k, t) => {
                let mut s = lines.join("\n");
                let mut start = at % (s.len() + 1);
                while !s.is_char_boundary(start) {
                    start -= 1;
                }
                let mut end = (start + k).min(s.len());
                while !s.is_char_boundary(end) {
                    end += 1;
                }
                s.replace_range(start..end, t);
                lines = s.lines().map(str::to_string).collect();
            }
            _ => {}
        }
    }
    lines.join("\n")
}

/// Lines as YAML counts them: a line break is LF, CRLF or a lone CR (an
/// editor shows a lone CR as a break too), so a parser's position may lie
/// past what `str::lines` counts.
fn yaml_lines(text: &str) -> usize {
    1 + text.replace("\r\n", "\n").matches(['\r', '\n']).count()
}

/// Lints `yaml`; whatever it says points inside the input.
fn check(yaml: &str, psa: Option<PsaLevel>) -> Result<(), TestCaseError> {
    let lines = yaml_lines(yaml);
    match lint_documents(yaml, psa) {
        Ok(results) => {
            for (doc, findings) in results {
                prop_assert!(doc.document >= 1);
                prop_assert!(
                    (1..=lines).contains(&doc.line),
                    "line {} of {lines}",
                    doc.line
                );
                for f in findings {
                    prop_assert!(!f.code.is_empty() && !f.message.is_empty(), "{f:?}");
                }
            }
        }
        Err(e) => {
            prop_assert!(e.document >= 1);
            if let Some(line) = e.line {
                // A parser may point just past the last line (end of input).
                prop_assert!(
                    (1..=lines + 1).contains(&line),
                    "{e}: line {line} of {lines}"
                );
            }
            prop_assert!(e.column.is_none_or(|c| c >= 1), "{e}");
            prop_assert!(!e.to_string().is_empty());
        }
    }
    Ok(())
}

fn psa() -> impl Strategy<Value = Option<PsaLevel>> {
    prop::sample::select(vec![
        None,
        Some(PsaLevel::Privileged),
        Some(PsaLevel::Baseline),
        Some(PsaLevel::Restricted),
    ])
}

proptest! {
    #![proptest_config(config())]

    /// A corpus manifest, edited.
    #[test]
    fn edited_manifests_lint_or_fail_cleanly(
        file in any::<prop::sample::Index>(),
        edits in prop::collection::vec(edit(), 1..6),
        psa in psa(),
    ) {
        let corpus = corpus();
        let yaml = apply(&corpus[file.index(corpus.len())], &edits);
        check(&yaml, psa)?;
    }

    /// Several corpus manifests, edited, as one multi-document input.
    #[test]
    fn edited_bundles_lint_or_fail_cleanly(
        files in prop::collection::vec(any::<prop::sample::Index>(), 2..4),
        edits in prop::collection::vec(edit(), 0..4),
        separator in prop::sample::select(vec!["\n---\n", "\n...\n---\n", "\n--- \n", "\n---\r\n"]),
    ) {
        let corpus = corpus();
        let docs: Vec<&str> = files.iter().map(|f| corpus[f.index(corpus.len())].as_str()).collect();
        check(&apply(&docs.join(separator), &edits), None)?;
    }

    /// Any text at all.
    #[test]
    fn any_text_lints_or_fails_cleanly(
        text in prop_oneof![
            any::<String>(),
            "[ -~\n\t]{0,200}",
            prop::collection::vec(any::<u8>(), 0..300).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ],
    ) {
        check(&text, None)?;
    }
}

/// The edits leave many manifests lintable (and make many fail): the
/// properties above exercise the rules, not only the YAML parser.
#[test]
fn edited_manifests_are_often_still_linted() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let corpus = corpus();
    let mut runner = TestRunner::deterministic();
    let (mut linted, mut failed) = (0, 0);
    for i in 0..500 {
        let edits = prop::collection::vec(edit(), 1..6)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        match lint_documents(&apply(&corpus[i % corpus.len()], &edits), None) {
            Ok(r) if !r.is_empty() => linted += 1,
            Ok(_) => {}
            Err(_) => failed += 1,
        }
    }
    assert!(linted >= 50, "{linted}/500 edited manifests linted");
    assert!(
        failed >= 50,
        "{failed}/500 edited manifests failed to parse"
    );
}
