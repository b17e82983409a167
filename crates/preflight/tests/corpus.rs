//! Runs every manifest of `tests/lint-corpus/` (see its README) through
//! `lint_documents` and checks it against the file's name and header:
//! `good-*` has no Error, `bad-*` has at least one; in both the Errors and
//! Warnings found are exactly the `# expect:` codes of those severities,
//! every expected code is found, and a code expected `line N` is found at
//! exactly those lines; `malformed-*` fails.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use saferollout_preflight::rules::is_secret_like_name;
use saferollout_preflight::{
    DocRef, Finding, LintErrorKind, PsaLevel, Severity, codes, lint_documents,
};
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
    /// Expected codes, each with the lines its findings must be at (empty:
    /// any line, at least one finding).
    expect: BTreeMap<String, Vec<usize>>,
    psa: Option<PsaLevel>,
    expect_error: Option<(LintErrorKind, Option<usize>)>,
}

fn header(file: &str, text: &str) -> Header {
    let mut header = Header::default();
    for line in text.lines().take_while(|l| l.starts_with('#')) {
        let line = line.trim_start_matches('#').trim();
        if let Some(rest) = line.strip_prefix("expect:") {
            // `CODE` or `CODE line N`.
            let mut words = rest.split_whitespace();
            let code = words.next().unwrap_or_default();
            assert!(codes::lookup(code).is_some(), "{file}: unknown code {code}");
            let at = match (words.next(), words.next(), words.next()) {
                (None, _, _) => None,
                (Some("line"), Some(n), None) => Some(n.parse::<usize>().expect("a line number")),
                other => panic!("{file}: expected `{code}` or `{code} line N`, got {other:?}"),
            };
            let lines = header.expect.entry(code.to_string());
            match (lines, at) {
                (std::collections::btree_map::Entry::Vacant(v), at) => {
                    v.insert(at.into_iter().collect());
                }
                (std::collections::btree_map::Entry::Occupied(mut o), Some(n))
                    if !o.get().is_empty() =>
                {
                    o.get_mut().push(n);
                }
                _ => panic!("{file}: {code} expected twice without a line to tell them apart"),
            }
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
            for f in doc_findings {
                eprintln!("    line {}: {f}", line_of(doc, f));
            }
        }
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

        let is_error =
            |code: &String| codes::lookup(code).is_some_and(|i| i.severity == Severity::Error);
        let expects_error = header.expect.keys().any(is_error);
        if file.starts_with("good-") {
            tally.good += 1;
            if expects_error {
                failures.push(format!("{file}: a good file expects an Error code"));
            }
        } else if file.starts_with("bad-") {
            tally.bad += 1;
            if !expects_error {
                failures.push(format!("{file}: a bad file expects no Error code"));
            }
        } else {
            panic!("{file}: corpus files are named good-*, bad-* or malformed-*");
        }
        if let Some(problem) = compare(&header, &results) {
            failures.push(format!("{file}: {problem}"));
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

/// The line a finding is reported at: its field's, else its object's.
fn line_of(doc: &DocRef, f: &Finding) -> usize {
    f.line.unwrap_or(doc.line)
}

/// What differs between the findings and the header's expectations, shown
/// with every finding and its line; `None` when they agree: the Errors and
/// Warnings found are exactly the expected codes of those severities, every
/// expected code (Infos too) is found, and a code expected at lines is found
/// at exactly those lines, as many times.
fn compare(header: &Header, results: &[(DocRef, Vec<Finding>)]) -> Option<String> {
    let mut found: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (doc, findings) in results {
        for f in findings {
            found
                .entry(f.code.to_string())
                .or_default()
                .push(line_of(doc, f));
        }
    }
    let mut problems = Vec::new();
    for (code, lines) in &found {
        let severity = codes::lookup(code).map(|i| i.severity);
        if severity >= Some(Severity::Warning) && !header.expect.contains_key(code) {
            problems.push(format!("unexpected {code} at lines {lines:?}"));
        }
    }
    for (code, expected) in &header.expect {
        let mut lines = found.get(code).cloned().unwrap_or_default();
        let mut expected = expected.clone();
        lines.sort_unstable();
        expected.sort_unstable();
        if lines.is_empty() {
            problems.push(format!("missing {code}"));
        } else if !expected.is_empty() && lines != expected {
            problems.push(format!("{code} at lines {lines:?}, expected {expected:?}"));
        }
    }
    if problems.is_empty() {
        return None;
    }
    let shown: Vec<String> = results
        .iter()
        .flat_map(|(doc, findings)| {
            findings
                .iter()
                .map(move |f| format!("line {}: {f}", line_of(doc, f)))
        })
        .collect();
    Some(format!("{}; findings: {shown:#?}", problems.join(", ")))
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

/// The checker itself: what it must refuse, on small inputs.
#[test]
fn the_checker_holds_files_to_their_headers() {
    let plugin = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: p, namespace: gpu}
spec:
  template:
    spec:
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      containers:
      - name: p
        image: example/device-plugin:latest
        volumeMounts: [{name: dp, mountPath: /var/lib/kubelet/device-plugins}]
      volumes: [{name: dp, hostPath: {path: /var/lib/kubelet/device-plugins}}]
";
    let results = lint_documents(plugin, None).unwrap();
    let check = |expect: &str| compare(&header("t.yaml", expect), &results);
    // SR110 at the image's line; SR107 (a Warning) at the object's.
    assert_eq!(
        check("# expect: SR110 line 11\n# expect: SR107 line 1\n"),
        None
    );
    assert_eq!(check("# expect: SR110\n# expect: SR107\n"), None);
    let wrong_line = check("# expect: SR110 line 1\n# expect: SR107\n").unwrap();
    assert!(
        wrong_line.starts_with("SR110 at lines [11], expected [1]"),
        "{wrong_line}"
    );
    let twice =
        check("# expect: SR110 line 11\n# expect: SR110 line 12\n# expect: SR107\n").unwrap();
    assert!(
        twice.starts_with("SR110 at lines [11], expected [11, 12]"),
        "{twice}"
    );
    let unexpected_warning = check("# expect: SR110\n").unwrap();
    assert!(
        unexpected_warning.starts_with("unexpected SR107"),
        "{unexpected_warning}"
    );
    let missing = check("# expect: SR110\n# expect: SR107\n# expect: SR109\n").unwrap();
    assert!(missing.starts_with("missing SR109"), "{missing}");
}
