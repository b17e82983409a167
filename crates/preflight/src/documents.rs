//! Multi-document YAML in, findings per object out (what `kubectl saferollout
//! lint FILE` prints).
//!
//! The input is split into documents at `---` / `...` lines first, and each
//! document is parsed alone. YAML forbids those markers at the start of a line
//! inside content, so the split is exact, and it lets an error name its
//! document and the line in the whole file.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use saferollout_api::SafeRollout;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_yaml::{RenderOptions, SnippetMode};

use crate::locate::Located;
use crate::psa::ENFORCE_LABEL;
use crate::{
    Finding, Gating, Kind, PsaLevel, codes, lint_daemonset, lint_safe_rollout, object_ref,
};

/// Which object of the input a list of findings is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DocRef {
    /// 1-based position among the documents that hold something (empty and
    /// comment-only documents are not counted).
    pub document: usize,
    /// 0-based index in the `items` of a `List` document, if it came from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    /// 1-based line of the input where the document's content starts.
    pub line: usize,
    pub api_version: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl std::fmt::Display for DocRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, " item {item}")?;
        }
        write!(
            f,
            " (line {}): {}",
            self.line,
            object_ref(&self.kind, self.namespace.as_deref(), self.name.as_deref())
        )
    }
}

/// Why an input could not be linted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LintErrorKind {
    /// Not YAML (syntax error, duplicate key, control characters...).
    Syntax,
    /// YAML, but not a mapping with `apiVersion` and `kind`.
    NotAnObject,
    /// An object of a linted kind that does not deserialise as that kind
    /// (e.g. a list where a map is expected).
    Invalid,
}

/// An input that could not be linted: which document, where, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
pub struct LintError {
    /// 1-based, counted as in [`DocRef::document`].
    pub document: usize,
    /// 0-based index in a `List` document's items.
    pub item: Option<usize>,
    /// 1-based line in the whole input, when the parser knows it.
    pub line: Option<usize>,
    /// 1-based column, when the parser knows it.
    pub column: Option<usize>,
    pub kind: LintErrorKind,
    /// The parser's message (without its position, which is in `line`/`column`).
    pub message: String,
}

impl std::fmt::Display for LintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, " item {item}")?;
        }
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, ", line {line}, column {column}")?,
            (Some(line), None) => write!(f, ", line {line}")?,
            _ => {}
        }
        let what = match self.kind {
            LintErrorKind::Syntax => "invalid YAML",
            LintErrorKind::NotAnObject => "not a Kubernetes object",
            LintErrorKind::Invalid => "invalid object",
        };
        write!(f, ": {what}: {}", self.message)
    }
}

/// Lints every document of a (multi-document) YAML input.
///
/// - Empty documents, comment-only documents and `null` documents are skipped.
/// - `DaemonSet` (`apps/v1`) -> [`lint_daemonset`] with [`Kind::Unknown`]
///   (detected); `SafeRollout` -> [`lint_safe_rollout`].
/// - A `List` (`kind: List`, `DaemonSetList`, ... with `items`) -> each item.
/// - Any other kind -> one Info finding `SR301` ("skipped").
/// - A DaemonSet or SafeRollout of an unserved `apiVersion` -> one Error
///   (`SR302`, `SR011`) instead of the rules.
///
/// `psa` is the Pod Security level to check against. When the input itself
/// holds a `Namespace` with a `pod-security.kubernetes.io/enforce` label (as
/// install bundles often do), that level applies to the objects of that
/// namespace instead: it is what the API server will enforce on them.
///
/// A DaemonSet that a SafeRollout of the input targets (same namespace, or
/// neither has one: a bundle applied with `-n`) is linted as rolled out by
/// it, with its gates ([`Gating::by`]; several SafeRollouts on one
/// DaemonSet: any of them counting devices counts); any other DaemonSet as
/// [`Gating::ALONE`].
///
/// A finding that names its field ([`Finding::field`]) gets the line where
/// that field is written ([`Finding::line`]), inside List items too (a
/// field taken from an anchor is at the line that refers to it); one whose
/// field is not found keeps only the object's line ([`DocRef::line`]).
///
/// Fails with a [`LintError`] on a document that is not YAML, not an object,
/// or does not deserialise as its kind (every document is parsed as YAML
/// before any is linted, so a syntax error anywhere comes first).
pub fn lint_documents(
    yaml: &str,
    psa: Option<PsaLevel>,
) -> Result<Vec<(DocRef, Vec<Finding>)>, LintError> {
    let documents = parse_documents(yaml)?;
    let namespace_levels = namespace_levels(&documents);
    let level_for = |header: &Header| {
        header
            .namespace
            .as_ref()
            .and_then(|ns| namespace_levels.get(ns).copied())
            .or(psa)
    };
    let rollouts = rolled_out(&documents);
    let gating_for = |header: &Header| {
        let key = (
            header.namespace.clone(),
            header.name.clone().unwrap_or_default(),
        );
        rollouts.get(&key).copied().unwrap_or(Gating::ALONE)
    };
    let mut results = Vec::new();
    for parsed in &documents {
        let at = parsed.at;
        let header = Header::of(&parsed.value, &at)?;
        // Parsed for positions once, and only when a finding names a field.
        let mut located: Option<Option<Located>> = None;
        let mut place = |findings: &mut Vec<Finding>, prefix: &str| {
            for f in findings.iter_mut() {
                let Some(field) = &f.field else { continue };
                let doc = located.get_or_insert_with(|| Located::parse(&parsed.chunk.text));
                f.line = doc
                    .as_ref()
                    .and_then(|d| d.line_of(&format!("{prefix}{field}")))
                    .filter(|line| *line > 0)
                    .map(|line| parsed.chunk.first_line + line - 1);
            }
        };
        match list_items(&header, &parsed.value) {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let at = Position {
                        item: Some(i),
                        ..at
                    };
                    let header = Header::of(item, &at)?;
                    let mut findings =
                        lint_object(&header, level_for(&header), gating_for(&header), || {
                            from_value(item, &header, &at)
                        })?;
                    place(&mut findings, &format!("items[{i}]."));
                    results.push((header.doc_ref(&at), findings));
                }
            }
            None => {
                let mut findings =
                    lint_object(&header, level_for(&header), gating_for(&header), || {
                        parsed.chunk.parse_as(at.document, &header.kind)
                    })?;
                place(&mut findings, "");
                results.push((header.doc_ref(&at), findings));
            }
        }
    }
    Ok(results)
}

/// The DaemonSets the input's SafeRollouts target, by (namespace, name),
/// with the gating they get. SafeRollouts that do not deserialise are
/// skipped here (linting them reports why).
fn rolled_out(documents: &[Parsed]) -> BTreeMap<(Option<String>, String), Gating> {
    let mut targets: BTreeMap<(Option<String>, String), Gating> = BTreeMap::new();
    let values = documents.iter().flat_map(|d| {
        let items = d.value.get("items").and_then(Value::as_array);
        std::iter::once(&d.value).chain(items.into_iter().flatten())
    });
    for value in values {
        if value.get("kind").and_then(Value::as_str) != Some("SafeRollout")
            || value.get("apiVersion").and_then(Value::as_str) != Some(saferollout_api::API_VERSION)
        {
            continue;
        }
        let Ok(sr) = serde_json::from_value::<SafeRollout>(value.clone()) else {
            continue;
        };
        let key = (
            sr.metadata.namespace.clone(),
            sr.spec.target_ref.name.clone(),
        );
        let gating = Gating::by(&sr.spec);
        targets
            .entry(key)
            .and_modify(|g| {
                g.counts_devices =
                    Some(g.counts_devices == Some(true) || gating.counts_devices == Some(true));
            })
            .or_insert(gating);
    }
    targets
}

/// A document that is YAML and not empty.
struct Parsed {
    chunk: Chunk,
    at: Position,
    value: Value,
}

fn parse_documents(yaml: &str) -> Result<Vec<Parsed>, LintError> {
    let mut documents = Vec::new();
    for chunk in split_documents(yaml) {
        let Some(line) = chunk.content_line() else {
            continue;
        };
        let document = documents.len() + 1;
        let value: Value = chunk.parse(document, LintErrorKind::Syntax)?;
        if value.is_null() {
            continue;
        }
        documents.push(Parsed {
            chunk,
            at: Position {
                document,
                item: None,
                line,
            },
            value,
        });
    }
    Ok(documents)
}

/// The enforced Pod Security level of each `Namespace` in the input (top
/// level or in a List).
fn namespace_levels(documents: &[Parsed]) -> BTreeMap<String, PsaLevel> {
    let mut levels = BTreeMap::new();
    let values = documents.iter().flat_map(|d| {
        let items = d.value.get("items").and_then(Value::as_array);
        std::iter::once(&d.value).chain(items.into_iter().flatten())
    });
    for value in values {
        if value.get("kind").and_then(Value::as_str) != Some("Namespace")
            || value.get("apiVersion").and_then(Value::as_str) != Some("v1")
        {
            continue;
        }
        let metadata = value.get("metadata");
        let name = metadata.and_then(|m| m.get("name")).and_then(Value::as_str);
        let level = metadata
            .and_then(|m| m.get("labels"))
            .and_then(|l| l.get(ENFORCE_LABEL))
            .and_then(Value::as_str)
            .and_then(|l| l.parse().ok());
        if let (Some(name), Some(level)) = (name, level) {
            levels.insert(name.to_string(), level);
        }
    }
    levels
}

/// Where an object is in the input.
#[derive(Debug, Clone, Copy)]
struct Position {
    document: usize,
    item: Option<usize>,
    line: usize,
}

impl Position {
    fn error(&self, kind: LintErrorKind, message: String) -> LintError {
        LintError {
            document: self.document,
            item: self.item,
            line: Some(self.line),
            column: None,
            kind,
            message,
        }
    }
}

/// What every Kubernetes object says about itself.
struct Header {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Header {
    fn of(value: &Value, at: &Position) -> Result<Self, LintError> {
        let Some(map) = value.as_object() else {
            return Err(at.error(
                LintErrorKind::NotAnObject,
                format!(
                    "expected a mapping with apiVersion and kind, found {}",
                    describe(value)
                ),
            ));
        };
        let field = |key: &str| -> Result<String, LintError> {
            match map.get(key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(other) => Err(at.error(
                    LintErrorKind::NotAnObject,
                    format!(
                        "{key} must be a non-empty string, found {}",
                        describe(other)
                    ),
                )),
                None => Err(at.error(LintErrorKind::NotAnObject, format!("no {key}"))),
            }
        };
        let metadata = map.get("metadata");
        let meta = |key: &str| {
            metadata
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Ok(Self {
            api_version: field("apiVersion")?,
            kind: field("kind")?,
            namespace: meta("namespace"),
            name: meta("name"),
        })
    }

    fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", self.api_version.as_str()),
        }
    }

    fn object(&self) -> String {
        object_ref(&self.kind, self.namespace.as_deref(), self.name.as_deref())
    }

    fn doc_ref(&self, at: &Position) -> DocRef {
        DocRef {
            document: at.document,
            item: at.item,
            line: at.line,
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// The items of a `List` / `*List` document, if it is one.
fn list_items<'v>(header: &Header, value: &'v Value) -> Option<&'v Vec<Value>> {
    if !header.kind.ends_with("List") {
        return None;
    }
    value.get("items")?.as_array()
}

/// A typed object, parsed by the caller (from the document's text, for
/// positions, or from a List item's value).
enum Typed {
    DaemonSet(Box<DaemonSet>),
    SafeRollout(Box<SafeRollout>),
}

fn lint_object(
    header: &Header,
    psa: Option<PsaLevel>,
    gating: Gating,
    parse: impl FnOnce() -> Result<Typed, LintError>,
) -> Result<Vec<Finding>, LintError> {
    let (group, version) = header.group_version();
    let object = header.object();
    let unserved = match header.kind.as_str() {
        // extensions/v1beta1 and apps/v1beta2 DaemonSets: removed in 1.16.
        "DaemonSet" if group == "apps" || group == "extensions" => {
            (header.api_version != "apps/v1").then(|| {
                Finding::error(
                    codes::DAEMONSET_API_VERSION,
                    &object,
                    format!(
                        "apiVersion {} is no longer served (removed in Kubernetes 1.16)",
                        header.api_version
                    ),
                    "use apiVersion: apps/v1 (spec.selector is then required)",
                )
            })
        }
        "SafeRollout" if group == saferollout_api::GROUP => (version != saferollout_api::VERSION)
            .then(|| {
                Finding::error(
                    codes::SAFEROLLOUT_API_VERSION,
                    &object,
                    format!(
                        "apiVersion {} is not served; the operator serves {}",
                        header.api_version,
                        saferollout_api::API_VERSION
                    ),
                    format!("use apiVersion: {}", saferollout_api::API_VERSION),
                )
            }),
        _ => {
            return Ok(vec![Finding::info(
                codes::SKIPPED,
                &object,
                format!(
                    "skipped: {} ({}) is not linted",
                    header.kind, header.api_version
                ),
                "nothing to do; only DaemonSets and SafeRollouts are linted",
            )]);
        }
    };
    if let Some(finding) = unserved {
        return Ok(vec![finding]);
    }
    Ok(match parse()? {
        Typed::DaemonSet(ds) => lint_daemonset(&ds, Kind::Unknown, psa, gating),
        Typed::SafeRollout(sr) => lint_safe_rollout(&sr, psa),
    })
}

fn from_value(item: &Value, header: &Header, at: &Position) -> Result<Typed, LintError> {
    fn typed<T: DeserializeOwned>(item: &Value, at: &Position, kind: &str) -> Result<T, LintError> {
        serde_json::from_value(item.clone()).map_err(|e| {
            at.error(
                LintErrorKind::Invalid,
                format!("does not deserialise as a {kind}: {e}"),
            )
        })
    }
    Ok(match header.kind.as_str() {
        "DaemonSet" => Typed::DaemonSet(Box::new(typed(item, at, "DaemonSet")?)),
        _ => Typed::SafeRollout(Box::new(typed(item, at, "SafeRollout")?)),
    })
}

/// "a list", "a string", ... for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// One document's text. Its first line is line `first_line` of the input; a
/// `---` marker on it is blanked out (columns stay right).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    text: String,
    first_line: usize,
}

impl Chunk {
    /// The input line of the first line with content; `None` when the
    /// document is empty, comments only, or directives only.
    fn content_line(&self) -> Option<usize> {
        self.text
            .lines()
            .position(|line| {
                let trimmed = line.trim();
                !(trimmed.is_empty() || trimmed.starts_with('#') || line.starts_with('%'))
            })
            .map(|i| self.first_line + i)
    }

    fn parse<T: DeserializeOwned>(
        &self,
        document: usize,
        kind: LintErrorKind,
    ) -> Result<T, LintError> {
        serde_yaml::from_str(&self.text).map_err(|e| self.error(document, kind, &e, ""))
    }

    fn parse_as(&self, document: usize, kind: &str) -> Result<Typed, LintError> {
        let prefix = format!("does not deserialise as a {kind}: ");
        let invalid =
            |e: serde_yaml::Error| self.error(document, LintErrorKind::Invalid, &e, &prefix);
        Ok(match kind {
            "DaemonSet" => {
                Typed::DaemonSet(Box::new(serde_yaml::from_str(&self.text).map_err(invalid)?))
            }
            _ => Typed::SafeRollout(Box::new(serde_yaml::from_str(&self.text).map_err(invalid)?)),
        })
    }

    /// A [`LintError`] at the parser's position, moved to input lines.
    fn error(
        &self,
        document: usize,
        kind: LintErrorKind,
        error: &serde_yaml::Error,
        prefix: &str,
    ) -> LintError {
        let location = error
            .location()
            .and_then(|l| {
                Some((
                    usize::try_from(l.line()).ok()?,
                    usize::try_from(l.column()).ok()?,
                ))
            })
            .filter(|(line, _)| *line > 0);
        let mut options = RenderOptions::default();
        options.snippets = SnippetMode::Off;
        let mut message = error.render_with_options(options);
        // The position is reported in input lines, not the document's.
        if let Some((line, column)) = location
            && let Some(stripped) =
                message.strip_suffix(&format!(" at line {line}, column {column}"))
        {
            message = stripped.to_string();
        }
        let message = message
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        LintError {
            document,
            item: None,
            line: location.map(|(line, _)| self.first_line + line - 1),
            column: location.map(|(_, column)| column),
            kind,
            message: format!("{prefix}{message}"),
        }
    }
}

/// Whether `line` (without its line break) is the marker `---` or `...`,
/// alone or followed by a space or tab.
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// Splits the input into documents at `---` and `...` lines.
fn split_documents(input: &str) -> Vec<Chunk> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    let mut chunks = Vec::new();
    let mut text = String::new();
    let mut first_line = 1;
    for (index, line) in input.split_inclusive('\n').enumerate() {
        let number = index + 1;
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            chunks.push(Chunk {
                text: std::mem::take(&mut text),
                first_line,
            });
            first_line = number;
            // Keep what follows the marker (`--- # comment`, `--- {a: 1}`).
            text.push_str("   ");
            text.push_str(&line[3..]);
        } else if is_marker(bare, "...") {
            chunks.push(Chunk {
                text: std::mem::take(&mut text),
                first_line,
            });
            first_line = number + 1;
        } else {
            text.push_str(line);
        }
    }
    chunks.push(Chunk { text, first_line });
    chunks
}

#[cfg(test)]
mod tests;
