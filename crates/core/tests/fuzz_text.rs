//! Property-based fuzzing of the text the cluster and users hand the gates:
//! secret masking (`mask_secrets`, `clean_line`, `clean_lines`), the logs
//! gate's user patterns (`compile_user_pattern`) and its `scan`. Random and
//! adversarial inputs (control characters, non-ASCII, long lines, regex
//! syntax), checked for no panic and for what each promises: a planted
//! secret never survives masking whatever surrounds it, a cleaned line is
//! bounded and printable, a fatal line is found wherever it stands.
//! Coverage-guided targets of the same entry points are in `fuzz/`.
//!
//! `PROPTEST_CASES` sets the number of cases (default 500 each).

use proptest::prelude::*;
use saferollout_api::{LogsGate, PatternSet};
use saferollout_core::gates::logs::{Patterns, compile_user_pattern, scan};
use saferollout_core::gates::proof::{
    MAX_LINE, PLANTED_SECRETS, clean_line, clean_lines, mask_secrets, truncate,
};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(500);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A line of log: printable ASCII, any Unicode, control characters, long.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,60}",
        "[^\n]{0,60}",
        "[ -~\t\r\u{0}\u{1b}\u{7f}é€🦀]{0,40}",
        "[ -~]{250,400}",
    ]
}

/// Text of several lines, sometimes with CRLF and empty lines.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(line(), 0..8).prop_map(|l| l.join("\n")),
        prop::collection::vec(line(), 0..8).prop_map(|l| l.join("\r\n")),
        any::<String>(),
        prop::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// A word that stands apart from its neighbours: no quote, no separator a
/// secret pattern ends on, so it neither opens nor closes a value; some are
/// secret keys waiting for a value (`password:`), as the fuzz target found
/// one before another secret's key.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9_.:/@-]{0,12}",
        1 => prop::sample::select(vec!["password:", "token=", "LICENSE_KEY:", "api_key:", "sig="])
            .prop_map(str::to_string),
    ]
}

/// The first run of 8 characters of `secret` found in `masked` that the
/// text around the planted line (`around`) does not hold itself (random
/// text may, rarely, hold a piece of a planted secret: not a leak).
/// (Nor once cleaning made its control characters spaces.)
fn leaks(secret: &str, masked: &str, around: &str) -> Option<String> {
    let cleaned: String = around
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let chars: Vec<char> = secret.chars().collect();
    chars
        .windows(8.min(chars.len()))
        .map(|w| w.iter().collect::<String>())
        .find(|w| {
            masked.contains(w.as_str())
                && !around.contains(w.as_str())
                && !cleaned.contains(w.as_str())
        })
}

/// One line of each built-in pattern set's fatal messages, as the agents
/// print them.
const FATAL: &[(PatternSet, &str)] = &[
    (PatternSet::Generic, "unknown service v1beta1.Registration"),
    (PatternSet::Generic, "failed to register"),
    (PatternSet::Generic, "no devices found"),
    (
        PatternSet::NvidiaDevicePlugin,
        "Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND.",
    ),
    (
        PatternSet::NvidiaDevicePlugin,
        "could not load NVML library",
    ),
    (
        PatternSet::NvidiaDevicePlugin,
        "Incompatible strategy detected auto",
    ),
    (
        PatternSet::NvidiaDevicePlugin,
        "Could not start device plugin for 'nvidia.com/gpu'",
    ),
    (PatternSet::NvidiaDevicePlugin, "error starting plugins: x"),
    (
        PatternSet::NvidiaDraDriver,
        "failed registration process: x",
    ),
    (PatternSet::NvidiaDraDriver, "start registrar: x"),
    (PatternSet::NvidiaDraDriver, "error creating driver: x"),
    (PatternSet::NvidiaDraDriver, "prepare devices failed: x"),
    (
        PatternSet::NvidiaDraDriver,
        "failed to call NodePrepareResources",
    ),
    (PatternSet::AmdDevicePlugin, "amdgpu driver unavailable"),
    (
        PatternSet::AmdDevicePlugin,
        "No GPU nodes found via properties",
    ),
    (
        PatternSet::AmdDevicePlugin,
        "amd.com/gpu: Registration failed: x",
    ),
    (PatternSet::AmdDevicePlugin, "Failed to start plugin"),
    (
        PatternSet::IntelDevicePlugin,
        "Cannot register to kubelet service",
    ),
    (PatternSet::IntelDevicePlugin, "Device scan failed: x"),
    (
        PatternSet::IntelDevicePlugin,
        "Failed to serve gpu.intel.com/i915: x",
    ),
    (
        PatternSet::IntelDevicePlugin,
        "Failed to listen to plugin socket",
    ),
];

fn gate(builtin: Option<Vec<PatternSet>>, patterns: Vec<String>) -> LogsGate {
    let mut gate: LogsGate = serde_json::from_str("{}").expect("a logs gate of defaults");
    gate.builtin = builtin;
    gate.patterns = patterns;
    gate
}

/// Regex-like user patterns: syntax pieces glued at random, nested
/// repetitions whose compiled form would be huge, plain text.
fn pattern() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("a"),
        Just("."),
        Just("*"),
        Just("+"),
        Just("?"),
        Just("("),
        Just(")"),
        Just("["),
        Just("]"),
        Just("{"),
        Just("}"),
        Just("{1000}"),
        Just("{0,}"),
        Just("\\"),
        Just("\\d"),
        Just("\\p{L}"),
        Just("\\Q"),
        Just("\\E"),
        Just("|"),
        Just("^"),
        Just("$"),
        Just("(?i)"),
        Just("(?P<n>"),
        Just("\\b"),
        Just("é"),
        Just("NVML"),
        Just("(a{100}){100}"),
        Just("[^\\n]"),
        Just("\\x{10FFFF}"),
    ];
    prop_oneof![
        prop::collection::vec(piece, 0..12).prop_map(|p| p.concat()),
        "[ -~]{0,40}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// A cleaned line is at most MAX_LINE characters, has no control
    /// character, and masking never panics.
    #[test]
    fn cleaned_lines_are_bounded_and_printable(t in text(), n in 0usize..6) {
        let _ = mask_secrets(&t);
        let line = clean_line(&t);
        prop_assert!(line.chars().count() <= MAX_LINE, "{} chars", line.chars().count());
        prop_assert!(!line.chars().any(char::is_control), "{line:?}");
        let lines = clean_lines(&t, n);
        prop_assert!(!lines.chars().any(char::is_control), "{lines:?}");
        prop_assert!(lines.chars().count() <= n * (MAX_LINE + 3), "{lines:?}");
    }

    /// `truncate` keeps at most `max` characters (3 or more: room for "...")
    /// and leaves a short enough text as it is.
    #[test]
    fn truncation_is_bounded(t in text(), max in 3usize..300) {
        let cut = truncate(&t, max);
        prop_assert!(cut.chars().count() <= max);
        if t.chars().count() <= max {
            prop_assert_eq!(cut, t);
        }
    }

    /// No planted secret survives, whatever lines stand around its line.
    #[test]
    fn planted_secrets_never_leak_among_other_lines(
        i in 0..PLANTED_SECRETS.len(),
        before in prop::collection::vec(line(), 0..4),
        after in prop::collection::vec(line(), 0..4),
        crlf in any::<bool>(),
    ) {
        let (planted, secret) = PLANTED_SECRETS[i];
        let eol = if crlf { "\r\n" } else { "\n" };
        let text = [before.join(eol), planted.to_string(), after.join(eol)].join(eol);
        let around = [before.join(eol), after.join(eol)].join(eol);
        for masked in [mask_secrets(&text), clean_lines(&text, 20)] {
            prop_assert!(leaks(secret, &masked, &around).is_none(), "{text:?} -> {masked:?}");
        }
    }

    /// Nor when other words stand on the same line, before and after it.
    #[test]
    fn planted_secrets_never_leak_within_a_line(
        i in 0..PLANTED_SECRETS.len(),
        before in prop::collection::vec(word(), 0..4),
        after in prop::collection::vec(word(), 0..4),
    ) {
        let (planted, secret) = PLANTED_SECRETS[i];
        // A bare key (the line is the secret) is recognised only alone on
        // its line, as a PEM body line prints (`is_key_material`): words
        // around it make it another line, not masked by design.
        prop_assume!(planted != secret);
        let line = format!("{} {planted} {}", before.join(" "), after.join(" "));
        let masked = clean_line(&line);
        let around = format!("{} {}", before.join(" "), after.join(" "));
        prop_assert!(leaks(secret, &masked, &around).is_none(), "{line:?} -> {masked:?}");
    }

    /// A user pattern either compiles (within its size limit) or is refused
    /// with a message; it never panics, and one that compiles finds exactly
    /// the lines it matches.
    #[test]
    fn user_patterns_compile_or_are_refused(p in pattern(), t in text()) {
        match compile_user_pattern(&p) {
            Ok(re) => {
                let got = scan(&gate(Some(vec![]), vec![p.clone()]), &t).expect("it compiled");
                let first = t.lines().find(|l| re.is_match(l));
                prop_assert_eq!(got.is_some(), first.is_some());
                if let (Some(m), Some(first)) = (got, first) {
                    prop_assert_eq!(m.line, clean_line(first));
                    prop_assert_eq!(m.origin, "spec.gates.logs.patterns[0]");
                }
            }
            Err(message) => {
                prop_assert!(!message.is_empty());
                prop_assert!(scan(&gate(None, vec![p.clone()]), &t).is_err());
            }
        }
    }

    /// A fatal line is found wherever it stands in the log, whatever else
    /// the line and the log hold; the match's line is cleaned.
    #[test]
    fn fatal_lines_are_found_anywhere(
        i in 0..FATAL.len(),
        before in prop::collection::vec(line(), 0..5),
        after in prop::collection::vec(line(), 0..5),
        prefix in "[^\n]{0,30}",
        suffix in "[^\n]{0,30}",
        only_its_set in any::<bool>(),
    ) {
        let (set, message) = FATAL[i];
        let fatal = format!("{prefix} {message} {suffix}");
        let text = [before.join("\n"), fatal, after.join("\n")].join("\n");
        let builtin = only_its_set.then(|| vec![set]);
        let patterns = Patterns::of(&gate(builtin, vec![])).expect("built-ins compile");
        let found = patterns.scan(&text);
        prop_assert!(found.is_some(), "{text:?}");
        let found = found.unwrap();
        prop_assert!(found.origin.starts_with("builtin:"));
        prop_assert!(found.line.chars().count() <= MAX_LINE);
    }
}
