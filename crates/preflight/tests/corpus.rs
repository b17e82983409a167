//! Runs every manifest of `tests/lint-corpus/` (see its README) through
//! `lint_documents` and checks it against the file's name and header:
//! `good-*` has no Error, `bad-*` has exactly the `# expect:` codes among its
//! Errors (and every expected code among its findings), `malformed-*` fails.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use saferollout_preflight::rules::is_secret_like_name;
use saferollout_preflight::{Finding, LintErrorKind, PsaLevel, Severity, codes, lint_documents};
use serde_json::Value;

fn corpus_dir() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../../tests/lint-corpus")
}

/// What a file's leading comment lines say.
#[derive(Debug, Default)]
struct Header {
    expect: BTreeSet<String>,
    psa: Option<PsaLevel>,
    expect_error: Option<(LintErrorKind, Option<usize>)>,
}

fn header(file: &str, text: &str) -> Header {
    let mut header = Header::default();
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        let line = line.trim_start_matches('#').trim();
        if let Some(code) = line.strip_prefix("expect:") {
            let code = code.trim();
            assert!(codes::lookup(code).is_some(), "{file}: unknown code {code}");
            assert!(
                header.expect.insert(code.to_string()),
                "{file}: {code} twice"
            );
        } else if let Some(level) = line.strip_prefix("psa:") {
            header.psa = Some(level.parse().unwrap_or_else(|e| panic!("{file}: {e}")));
        } else if let Some(rest) = line.strip_prefix("expect-error:") {
            let mut words = rest.split_whitespace();
            let kind = match words.next() {
                Some("Syntax") => LintErrorKind::Syntax,
                Some("NotAnObject") => LintErrorKind::NotAnObject,
                Some("Invalid") => LintErrorKind::Invalid,
                other => panic!("{file}: unknown error kind {other:?}"),
            };
            let line = match (words.next(), words.next()) {
                (Some("line"), Some(n)) => Some(n.parse().expect("a line number")),
                (None, _) => None,
                other => panic!("{file}: expected `line N`, got {other:?}"),
            };
            header.expect_error = Some((kind, line));
        }
    }
    header
}

/// The literal values of secret-like env vars anywhere in the file.
fn secret_values(text: &str) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let (Some(Value::String(name)), Some(Value::String(v))) =
                    (map.get("name"), map.get("value"))
                    && is_secret_like_name(name)
                    && !v.is_empty()
                {
                    out.push(v.clone());
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    // Malformed files may not parse; they have no findings to leak into.
    if let Ok(docs) = serde_yaml::from_multiple::<Value>(text) {
        docs.iter().for_each(|d| walk(d, &mut out));
    }
    out
}

#[derive(Default)]
struct Tally {
    good: usize,
    bad: usize,
    malformed: usize,
    multi_document: usize,
}

#[test]
fn every_corpus_file_lints_as_its_name_and_header_say() {
    let mut files: Vec<PathBuf> = fs::read_dir(corpus_dir())
        .expect("tests/lint-corpus exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut tally = Tally::default();
    let mut failures = Vec::new();

    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let header = header(&file, &text);
        let result = lint_documents(&text, header.psa);

        if file.starts_with("malformed-") {
            tally.malformed += 1;
            if let Err(e) = &result {
                eprintln!("== {file}\n  {e}");
            }
            match (&result, header.expect_error) {
                (Ok(r), _) => failures.push(format!("{file}: linted, expected an error: {r:?}")),
                (Err(e), Some((kind, line))) => {
                    if e.kind != kind || (line.is_some() && e.line != line) {
                        failures.push(format!(
                            "{file}: expected {kind:?} at line {line:?}, got {:?} at line {:?}: {e}",
                            e.kind, e.line
                        ));
                    }
                }
                (Err(_), None) => {}
            }
            continue;
        }

        let results = match result {
            Ok(results) => results,
            Err(e) => {
                failures.push(format!("{file}: {e}"));
                continue;
            }
        };
        if results.len() > 1 {
            tally.multi_document += 1;
        }
        let findings: Vec<&Finding> = results.iter().flat_map(|(_, f)| f).collect();
        // Shown with --nocapture: what `kubectl saferollout lint` would print.
        eprintln!("== {file}");
        for (doc, doc_findings) in &results {
            eprintln!("  {doc}");
            doc_findings.iter().for_each(|f| eprintln!("    {f}"));
        }
        let errors: BTreeSet<String> = findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| f.code.to_string())
            .collect();
        let all: BTreeSet<String> = findings.iter().map(|f| f.code.to_string()).collect();

        let json = serde_json::to_string(&findings).unwrap();
        for secret in secret_values(&text) {
            if json.contains(&secret) {
                failures.push(format!("{file}: a finding contains the value {secret:?}"));
            }
        }
        for f in &findings {
            assert!(
                !f.message.contains('\n') && !f.fix.contains('\n'),
                "{file}: {f}"
            );
        }

        if file.starts_with("good-") {
            tally.good += 1;
            assert!(
                header.expect.is_empty(),
                "{file}: a good file expects codes"
            );
            if !errors.is_empty() {
                let shown: Vec<String> = findings
                    .iter()
                    .filter(|f| f.severity == Severity::Error)
                    .map(|f| f.to_string())
                    .collect();
                failures.push(format!("{file}: errors in a good file: {shown:#?}"));
            }
        } else if file.starts_with("bad-") {
            tally.bad += 1;
            assert!(!header.expect.is_empty(), "{file}: no `# expect:` line");
            let expected_errors: BTreeSet<String> = header
                .expect
                .iter()
                .filter(|c| codes::lookup(c).is_some_and(|i| i.severity == Severity::Error))
                .cloned()
                .collect();
            let missing: Vec<&String> = header.expect.difference(&all).collect();
            let unexpected: Vec<&String> = errors.difference(&expected_errors).collect();
            if !missing.is_empty() || !unexpected.is_empty() {
                let shown: Vec<String> = findings.iter().map(|f| f.to_string()).collect();
                failures.push(format!(
                    "{file}: missing {missing:?}, unexpected errors {unexpected:?}; findings: {shown:#?}"
                ));
            }
        } else {
            panic!("{file}: corpus files are named good-*, bad-* or malformed-*");
        }
    }

    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        tally.good >= 4 && tally.bad >= 4 && tally.malformed >= 1 && tally.multi_document >= 1,
        "the corpus shrank: {} good, {} bad, {} malformed, {} multi-document",
        tally.good,
        tally.bad,
        tally.malformed,
        tally.multi_document
    );
}

/// Each kind of agent the corpus covers has a good and a bad manifest.
#[test]
fn the_corpus_covers_every_agent() {
    let names: Vec<String> = fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    for agent in ["nvidia", "amd", "intel", "dra"] {
        for prefix in ["good-", "bad-"] {
            assert!(
                names
                    .iter()
                    .any(|n| n.starts_with(prefix) && n.contains(agent)),
                "no {prefix}*{agent}* file"
            );
        }
    }
}
