//! parse_duration: never panics; accepts exactly the schema's grammar
//! (too large values aside); what it parses formats and parses back.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use saferollout_api::duration::DURATION_REGEX;
use saferollout_api::{DurationError, format_duration, parse_duration};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    static GRAMMAR: OnceLock<regex::Regex> = OnceLock::new();
    let grammar = GRAMMAR.get_or_init(|| regex::Regex::new(DURATION_REGEX).unwrap());
    match parse_duration(s) {
        Ok(d) => {
            assert!(grammar.is_match(s), "{s:?} parsed outside the grammar");
            let ms = Duration::new(d.as_secs(), d.subsec_millis() * 1_000_000);
            assert_eq!(parse_duration(&format_duration(d)), Ok(ms), "{s:?}");
        }
        Err(DurationError::Overflow(_)) => assert!(grammar.is_match(s), "{s:?}"),
        Err(DurationError::Empty) => assert!(s.is_empty()),
        Err(DurationError::Malformed { .. }) => assert!(!grammar.is_match(s), "{s:?}"),
    }
});
