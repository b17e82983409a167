//! `lint`: offline checks of manifests with `saferollout-preflight`. No cluster access.

use std::io::Read;
use std::path::Path;

use saferollout_preflight::{
    DocRef, Finding, LintError, LintErrorKind, PsaLevel, Severity, lint_documents,
};
use serde::Serialize;

use crate::cli::LintArgs;
use crate::error::CliError;
use crate::output::{emit, serialize};
use crate::table::Table;

/// What `lint -o json|yaml` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LintReport {
    /// Every object checked, in input order, with its findings (possibly none).
    pub objects: Vec<LintedObject>,
    pub summary: Summary,
}

/// One object of the input and its findings.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LintedObject {
    /// The file it came from (`<stdin>` for `-`).
    pub file: String,
    #[serde(flatten)]
    pub doc: DocRef,
    pub findings: Vec<Finding>,
}

/// Counts of a report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub files: usize,
    pub objects: usize,
    pub errors: usize,
    pub warnings: usize,
    pub infos: usize,
}

/// One input: a display name and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub name: String,
    pub text: String,
}

/// Lints every input; the first one that cannot be parsed fails the whole run
/// with `FILE: document N line L: ...`.
pub fn lint_inputs(inputs: &[Input], psa: Option<PsaLevel>) -> Result<LintReport, CliError> {
    let mut objects = Vec::new();
    for input in inputs {
        let results = lint_documents(&input.text, psa)
            .map_err(|e| CliError::failed(format_lint_error(&input.name, &e)))?;
        objects.extend(results.into_iter().map(|(doc, findings)| LintedObject {
            file: input.name.clone(),
            doc,
            findings,
        }));
    }
    let mut summary = Summary {
        files: inputs.len(),
        objects: objects.len(),
        ..Summary::default()
    };
    for f in objects.iter().flat_map(|o| &o.findings) {
        match f.severity {
            Severity::Error => summary.errors += 1,
            Severity::Warning => summary.warnings += 1,
            Severity::Info => summary.infos += 1,
        }
    }
    Ok(LintReport { objects, summary })
}

/// `FILE: document N[ item I] line L[ column C]: invalid YAML: message`.
pub fn format_lint_error(file: &str, e: &LintError) -> String {
    let mut s = format!("{file}: document {}", e.document);
    if let Some(item) = e.item {
        s.push_str(&format!(" item {item}"));
    }
    if let Some(line) = e.line {
        s.push_str(&format!(" line {line}"));
        if let Some(column) = e.column {
            s.push_str(&format!(" column {column}"));
        }
    }
    let what = match e.kind {
        LintErrorKind::Syntax => "invalid YAML",
        LintErrorKind::NotAnObject => "not a Kubernetes object",
        LintErrorKind::Invalid => "invalid object",
    };
    format!("{s}: {what}: {}", e.message)
}

/// 1 when any finding is an Error, else 0.
pub fn exit_code(report: &LintReport) -> u8 {
    u8::from(report.summary.errors > 0)
}

/// The findings as a table, most severe first (input order within a
/// severity), then a summary line.
pub fn render_table(report: &LintReport) -> String {
    let mut rows: Vec<(&LintedObject, &Finding)> = report
        .objects
        .iter()
        .flat_map(|o| o.findings.iter().map(move |f| (o, f)))
        .collect();
    rows.sort_by_key(|(_, f)| std::cmp::Reverse(f.severity));
    let mut out = String::new();
    if !rows.is_empty() {
        let mut table = Table::new(&["SEVERITY", "CODE", "OBJECT", "SOURCE", "MESSAGE", "FIX"]);
        for (o, f) in rows {
            table.row([
                f.severity.to_string(),
                f.code.to_string(),
                f.object.clone(),
                // The finding's field when it names one, else its object.
                format!("{}:{}", o.file, f.line.unwrap_or(o.doc.line)),
                f.message.clone(),
                f.fix.clone(),
            ]);
        }
        out.push_str(&table.render(""));
        out.push('\n');
    }
    out.push_str(&summary_line(&report.summary));
    out.push('\n');
    out
}

fn summary_line(s: &Summary) -> String {
    fn n(count: usize, one: &str, many: &str) -> String {
        format!("{count} {}", if count == 1 { one } else { many })
    }
    format!(
        "{} in {}: {}, {}, {}",
        n(s.objects, "object", "objects"),
        n(s.files, "file", "files"),
        n(s.errors, "error", "errors"),
        n(s.warnings, "warning", "warnings"),
        n(s.infos, "info", "infos"),
    )
}

/// Reads the inputs named on the command line: files, directories (their
/// `*.yaml`, `*.yml`, `*.json`, sorted) and `-` (stdin, once).
pub fn read_inputs(names: &[String]) -> Result<Vec<Input>, CliError> {
    let mut inputs = Vec::new();
    let mut stdin_read = false;
    for name in names {
        if name == "-" {
            if stdin_read {
                return Err(CliError::usage("-f - (stdin) given more than once"));
            }
            stdin_read = true;
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| CliError::usage(format!("cannot read stdin: {e}")))?;
            inputs.push(Input {
                name: "<stdin>".into(),
                text,
            });
            continue;
        }
        let path = Path::new(name);
        if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .map_err(|e| CliError::usage(format!("cannot read directory {name}: {e}")))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            files.sort();
            for file in files {
                inputs.push(read_file(&file.display().to_string())?);
            }
        } else {
            inputs.push(read_file(name)?);
        }
    }
    Ok(inputs)
}

fn read_file(name: &str) -> Result<Input, CliError> {
    let text = std::fs::read_to_string(name)
        .map_err(|e| CliError::usage(format!("cannot read {name}: {e}")))?;
    Ok(Input {
        name: name.to_string(),
        text,
    })
}

/// Runs `lint`; returns the exit code (0 or 1).
pub fn run(args: &LintArgs) -> Result<u8, CliError> {
    let inputs = read_inputs(&args.files)?;
    let report = lint_inputs(&inputs, args.psa_level.map(PsaLevel::from))?;
    let text = match serialize(&report, args.output)? {
        Some(text) => text,
        None => render_table(&report),
    };
    emit(&text);
    if report.summary.errors > 0 {
        eprintln!(
            "error: lint found {} Error finding(s)",
            report.summary.errors
        );
    }
    Ok(exit_code(&report))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD_SR: &str = "\
apiVersion: saferollout.dev/v1alpha1
kind: SafeRollout
metadata: {name: sr, namespace: gpu}
spec:
  targetRef: {name: plugin}
";

    const SECRET_DS: &str = "\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: plugin, namespace: gpu}
spec:
  selector: {matchLabels: {app: p}}
  template:
    metadata: {labels: {app: p}}
    spec:
      containers:
      - name: p
        image: example/plugin:1
        env:
        - {name: API_TOKEN, value: hunter2}
";

    fn input(name: &str, text: &str) -> Input {
        Input {
            name: name.into(),
            text: text.into(),
        }
    }

    #[test]
    fn errors_make_exit_1_and_come_first_in_the_table() {
        let report = lint_inputs(
            &[input("sr.yaml", GOOD_SR), input("ds.yaml", SECRET_DS)],
            None,
        )
        .unwrap();
        assert_eq!(report.summary.files, 2);
        assert_eq!(report.summary.objects, 2);
        assert!(report.summary.errors >= 1, "{report:#?}");
        assert_eq!(exit_code(&report), 1);
        let table = render_table(&report);
        let first_row = table.lines().nth(1).unwrap();
        assert!(first_row.starts_with("Error "), "{table}");
        assert!(table.contains("ds.yaml:1"), "{table}");
        // The secret's value never shows, only the variable's name.
        assert!(!table.contains("hunter2"), "{table}");
        assert!(table.contains("API_TOKEN"), "{table}");
        assert!(table.lines().next().unwrap().starts_with("SEVERITY"));
        assert!(table.trim_end().ends_with("infos") || table.trim_end().ends_with("info"));
    }

    #[test]
    fn no_error_findings_is_exit_0() {
        let report = lint_inputs(&[input("sr.yaml", GOOD_SR)], None).unwrap();
        assert_eq!(report.summary.errors, 0, "{report:#?}");
        assert_eq!(exit_code(&report), 0);
        let empty = lint_inputs(&[input("empty.yaml", "# nothing\n")], None).unwrap();
        assert_eq!(exit_code(&empty), 0);
        assert_eq!(
            render_table(&empty),
            "0 objects in 1 file: 0 errors, 0 warnings, 0 infos\n"
        );
    }

    #[test]
    fn malformed_yaml_names_file_document_and_line() {
        let text = format!("{GOOD_SR}---\nkind: DaemonSet\nmetadata: {{name: [\n");
        let err = lint_inputs(&[input("bad.yaml", &text)], None).unwrap_err();
        assert_eq!(err.code, 1);
        assert!(
            err.message.starts_with("bad.yaml: document 2 line "),
            "{}",
            err.message
        );
        assert!(err.message.contains("invalid YAML"), "{}", err.message);
    }

    #[test]
    fn lint_error_format() {
        let e = LintError {
            document: 3,
            item: Some(1),
            line: Some(12),
            column: Some(4),
            kind: LintErrorKind::NotAnObject,
            message: "missing kind".into(),
        };
        assert_eq!(
            format_lint_error("<stdin>", &e),
            "<stdin>: document 3 item 1 line 12 column 4: not a Kubernetes object: missing kind"
        );
    }

    #[test]
    fn a_finding_on_a_field_shows_the_field_line() {
        // The image (no tag: SR110) is on line 11 of the
        // file; the missing resources (SR107) are about the object, line 1.
        let text = SECRET_DS
            .replace("example/plugin:1", "example/device-plugin")
            .replace(
                "        env:\n        - {name: API_TOKEN, value: hunter2}\n",
                "",
            );
        assert_eq!(
            text.lines().nth(10),
            Some("        image: example/device-plugin")
        );
        let report = lint_inputs(&[input("ds.yaml", &text)], None).unwrap();
        let table = render_table(&report);
        let row = |code: &str| {
            table
                .lines()
                .find(|l| l.contains(code))
                .unwrap_or_else(|| panic!("no {code} in\n{table}"))
                .to_string()
        };
        assert!(row("SR110").contains("ds.yaml:11 "), "{table}");
        assert!(row("SR107").contains("ds.yaml:1 "), "{table}");
        let v = serde_json::to_value(&report).unwrap();
        let sr110 = v["objects"][0]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["code"] == "SR110")
            .unwrap()
            .clone();
        assert_eq!(sr110["line"], 11);
        assert_eq!(sr110["field"], "spec.template.spec.containers[0].image");
    }

    #[test]
    fn json_report_is_flat_per_object() {
        let report = lint_inputs(&[input("ds.yaml", SECRET_DS)], None).unwrap();
        let v = serde_json::to_value(&report).unwrap();
        let obj = &v["objects"][0];
        assert_eq!(obj["file"], "ds.yaml");
        assert_eq!(obj["document"], 1);
        assert_eq!(obj["kind"], "DaemonSet");
        assert_eq!(obj["name"], "plugin");
        assert!(obj["findings"][0]["code"].is_string());
        assert_eq!(v["summary"]["files"], 1);
    }

    #[test]
    fn directories_and_missing_files() {
        let dir = std::env::temp_dir().join(format!("sr-cli-lint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.yaml"), GOOD_SR).unwrap();
        std::fs::write(dir.join("a.yml"), GOOD_SR).unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let inputs = read_inputs(&[dir.display().to_string()]).unwrap();
        let names: Vec<_> = inputs
            .iter()
            .map(|i| {
                Path::new(&i.name)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a.yml", "b.yaml"]);
        let missing = read_inputs(&[dir.join("nope.yaml").display().to_string()]).unwrap_err();
        assert_eq!(missing.code, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
