//! The logs gate: a user's pattern (the input's first line) compiles or is
//! refused, never panics nor blows up; scanning the rest of the input with
//! it and the built-ins never panics, and a match names a line of the log.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saferollout_api::LogsGate;
use saferollout_core::gates::logs::{compile_user_pattern, scan};
use saferollout_core::gates::proof::{MAX_LINE, clean_line};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, log) = text.split_once('\n').unwrap_or((text, ""));
    let mut gate: LogsGate = serde_json::from_str("{}").unwrap();
    gate.patterns = vec![pattern.to_string()];
    match compile_user_pattern(pattern) {
        Ok(re) => {
            let found = scan(&gate, log).expect("the pattern compiled");
            if let Some(m) = found {
                assert!(m.line.chars().count() <= MAX_LINE);
                assert!(log.lines().any(|l| clean_line(l) == m.line), "{m:?}");
            }
            gate.builtin = Some(vec![]);
            let only_user = scan(&gate, log).unwrap();
            assert_eq!(only_user.is_some(), log.lines().any(|l| re.is_match(l)));
        }
        Err(e) => {
            assert!(!e.is_empty());
            assert!(scan(&gate, log).is_err());
        }
    }
});
