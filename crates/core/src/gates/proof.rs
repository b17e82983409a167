//! What the probe, logs and prometheus gates observe, gathered by the
//! runtime (probe pods from its watch, agent logs through `pods/log`,
//! Prometheus queries over HTTP) and handed in through
//! [`super::Evidence::proof`]; and the text hygiene they share: what a
//! status keeps of a log line is truncated and has secrets masked.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use jiff::Timestamp;
use regex::Regex;

/// Everything the three gates observe for one SafeRollout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProofEvidence {
    /// This rollout's probe pods, as the watch sees them.
    pub probe_pods: Vec<ProbePod>,
    /// Why creating a probe pod failed, by pod name (the last error).
    pub probe_errors: BTreeMap<String, String>,
    /// What reading each agent pod's log found, by pod UID.
    pub agent_logs: BTreeMap<String, LogObservation>,
    /// The latest measurement of each prometheus gate, by gate name.
    pub measurements: BTreeMap<String, Measurement>,
}

/// A probe pod as observed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbePod {
    pub name: String,
    pub uid: String,
    /// From the probe's node label.
    pub node: String,
    pub deleting: bool,
    /// `status.phase` (Pending, Running, Succeeded, Failed, Unknown).
    pub phase: String,
    /// The PodScheduled condition when it is False: (reason, message).
    pub unschedulable: Option<(String, String)>,
    /// The first container's state: waiting reason, or terminated exit code,
    /// reason and message.
    pub waiting_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub terminated_reason: Option<String>,
    pub terminated_message: Option<String>,
    /// The pod's own message (e.g. an eviction or NodePrepareResources failure).
    pub message: Option<String>,
    /// The last lines of the probe's log, read once it ended (already
    /// cleaned with [`clean_lines`]).
    pub log_tail: Option<String>,
}

/// What reading an agent pod's log found.
#[derive(Debug, Clone, PartialEq)]
pub struct LogObservation {
    pub pod: String,
    /// When the container (or pod) started: the window counts from here.
    pub started_at: Option<Timestamp>,
    pub read: LogRead,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LogRead {
    /// Not read yet.
    Unread,
    /// Read at `at`; no line matched.
    Clean { at: Timestamp },
    /// A line matched (see [`super::logs::scan`]).
    Matched(super::logs::LogMatch),
    /// The last read failed; earlier reads (if any) were clean up to `clean_at`.
    Unreadable {
        error: String,
        clean_at: Option<Timestamp>,
    },
}

/// One run of a prometheus gate's query.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub at: Timestamp,
    /// The `$STAGE_NODES` value the query ran with: a measurement over other
    /// nodes than the rollout holds now is not counted.
    pub stage_nodes: String,
    pub outcome: MeasurementOutcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MeasurementOutcome {
    /// The samples of the result: each sample's labels and value. Empty: no data.
    Samples(Vec<Sample>),
    /// The query failed or timed out (the message carries no credentials).
    Error(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Longest line a status keeps.
pub const MAX_LINE: usize = 200;

fn secret_patterns() -> &'static [(Regex, &'static str)] {
    static PATTERNS: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        [
            // Bearer/Basic credentials in headers.
            (r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+", "$1 ***"),
            // key=value / key: value where the key names a secret.
            (
                r#"(?i)\b([a-z0-9_.-]*(?:token|password|passwd|pwd|secret|api[_-]?key|access[_-]?key|private[_-]?key|credentials?|license[_-]?key))(["']?\s*[=:]\s*["']?)[^\s"',;&]+"#,
                "$1$2***",
            ),
            // user:password@ in URLs.
            (r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@", "$1***@"),
        ]
        .into_iter()
        .map(|(p, r)| (Regex::new(p).expect("secret patterns compile"), r))
        .collect()
    })
}

/// Masks values that look like secrets (`token=...`, `password: ...`,
/// `Bearer ...`, `user:pass@` in URLs).
pub fn mask_secrets(line: &str) -> String {
    let mut out = line.to_string();
    for (re, replacement) in secret_patterns() {
        out = re.replace_all(&out, *replacement).into_owned();
    }
    out
}

/// At most `max` characters, with `...` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max.saturating_sub(3)).collect();
    format!("{cut}...")
}

/// What a status may keep of a line: control characters out, secrets
/// masked (before cutting, so a cut never leaves half a secret), truncated.
pub fn clean_line(line: &str) -> String {
    let printable: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    truncate(mask_secrets(printable.trim()).as_str(), MAX_LINE)
}

/// The last `n` non-empty lines of `text`, each cleaned, joined with ` | `.
pub fn clean_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| clean_line(l))
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked() {
        let cases = [
            (
                "Loaded license server credentials: url=https://license.sim.invalid token=simtok-0123456789abcdef",
                "simtok-0123456789abcdef",
            ),
            (
                "auth: Bearer eyJhbGciOiJIUzI1NiJ9.x.y failed",
                "eyJhbGciOiJIUzI1NiJ9",
            ),
            ("PASSWORD=hunter2 rest", "hunter2"),
            (
                "connecting to https://admin:s3cr3t@registry.example/v2",
                "s3cr3t",
            ),
            ("{\"api_key\": \"abc123\"}", "abc123"),
            ("NGC_API_KEY=nvapi-xyz", "nvapi-xyz"),
        ];
        for (line, secret) in cases {
            let masked = clean_line(line);
            assert!(!masked.contains(secret), "{line} -> {masked}");
            assert!(masked.contains("***"), "{masked}");
        }
        // Lines without secrets are left alone.
        let plain = "Failed to initialize NVML: could not load NVML library";
        assert_eq!(clean_line(plain), plain);
    }

    #[test]
    fn lines_are_truncated_and_tails_joined() {
        let long = "x".repeat(500);
        assert_eq!(clean_line(&long).chars().count(), MAX_LINE);
        assert!(clean_line(&long).ends_with("..."));
        assert_eq!(clean_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(clean_lines("one\ttab\u{7}", 5), "one tab");
    }
}
