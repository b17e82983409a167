//! The logs gate: a user's pattern (the input's first line) compiles or is
//! refused, never panics nor blows up; scanning the rest of the input with
//! it, and with the built-in patterns, never panics, and a match is the
//! first line the pattern matches, cleaned.
//! (The built-ins are compiled once: compiling them for every input would
//! take most of the time, for code that never sees the input.)
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use saferollout_api::LogsGate;
use saferollout_core::gates::logs::{Patterns, compile_user_pattern};
use saferollout_core::gates::proof::{MAX_LINE, clean_line};

fn gate(builtin: Option<Vec<saferollout_api::PatternSet>>, patterns: Vec<String>) -> LogsGate {
    let mut gate: LogsGate = serde_json::from_str("{}").unwrap();
    gate.builtin = builtin;
    gate.patterns = patterns;
    gate
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, log) = text.split_once('\n').unwrap_or((text, ""));
    // The schema admits patterns of up to MAX_PATTERN_LENGTH bytes.
    if pattern.len() > saferollout_api::proof::MAX_PATTERN_LENGTH as usize {
        return;
    }
    static BUILTIN: OnceLock<Patterns> = OnceLock::new();
    let builtin = BUILTIN.get_or_init(|| Patterns::of(&gate(None, vec![])).unwrap());
    if let Some(m) = builtin.scan(log) {
        assert!(m.line.chars().count() <= MAX_LINE);
        assert!(m.origin.starts_with("builtin:"));
    }
    let user = gate(Some(vec![]), vec![pattern.to_string()]);
    match compile_user_pattern(pattern) {
        Ok(re) => {
            let found = Patterns::of(&user).expect("the pattern compiled").scan(log);
            let first = log.lines().find(|l| re.is_match(l));
            assert_eq!(found.map(|m| m.line), first.map(clean_line), "{pattern:?}");
        }
        Err(e) => {
            assert!(!e.is_empty());
            assert!(Patterns::of(&user).is_err());
        }
    }
});
