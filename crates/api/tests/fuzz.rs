//! Property-based fuzzing of the parsers the spec's text goes through
//! (durations, quantities, counts and percentages, the allocatable gate's
//! bounds): random and near-valid inputs (digits, units, signs, huge
//! numbers, unicode, long strings), checked for no panic and for what each
//! parser promises. The coverage-guided targets of the same entry points are
//! in `fuzz/` (`tests/fuzz`).
//!
//! `PROPTEST_CASES` sets the number of cases (default 2,000 each here: the
//! whole file runs in a few seconds).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use saferollout_api::duration::DURATION_REGEX;
use saferollout_api::{
    Bound, BoundError, CountError, DurationError, count_of, format_duration, parse_bound,
    parse_duration, parse_percent, resolve_count,
};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        // A failure is reported with its input; nothing is written to the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings near the duration grammar: terms of digits (sometimes very many),
/// fractions, units right and wrong, signs, spaces and non-ASCII glued in.
fn near_duration() -> impl Strategy<Value = String> {
    let digits = prop_oneof![
        "[0-9]{1,3}",
        "[0-9]{15,45}",
        Just(String::new()),
        Just("18446744073709551615".to_string()),
    ];
    let frac = prop_oneof![
        3 => Just(String::new()),
        1 => "[.][0-9]{0,30}",
        1 => Just(".".to_string()),
    ];
    let unit = prop_oneof![
        Just("ms"),
        Just("s"),
        Just("m"),
        Just("h"),
        Just(""),
        Just("us"),
        Just("µs"),
        Just("ns"),
        Just("d"),
        Just("M"),
        Just("S"),
        Just("mss"),
        Just("é"),
    ];
    let junk = prop_oneof![
        8 => Just(""),
        1 => Just("-"),
        1 => Just("+"),
        1 => Just(" "),
        1 => Just("\u{0}"),
        1 => Just("٣"), // an Arabic-Indic digit: not an ASCII digit
        1 => Just("🦀"),
    ];
    let term = (junk.clone(), digits, frac, unit, junk)
        .prop_map(|(a, d, f, u, b)| format!("{a}{d}{f}{u}{b}"));
    prop::collection::vec(term, 0..6).prop_map(|t| t.concat())
}

fn valid_duration_term() -> impl Strategy<Value = String> {
    (
        "[0-9]{1,6}",
        prop::option::of("[0-9]{1,12}"),
        prop_oneof![Just("ms"), Just("s"), Just("m"), Just("h")],
    )
        .prop_map(|(w, f, u)| match f {
            Some(f) => format!("{w}.{f}{u}"),
            None => format!("{w}{u}"),
        })
}

/// Strings near the quantity grammar.
fn near_quantity() -> impl Strategy<Value = String> {
    let sign = prop_oneof![4 => Just(""), 1 => Just("-"), 1 => Just("+")];
    let number = prop_oneof![
        "[0-9]{1,4}",
        "[0-9]{14,40}",
        "[0-9]{0,5}[.][0-9]{0,30}",
        Just("9223372036854775808".to_string()),
        Just("0.000000000000000000000000000001".to_string()),
    ];
    let suffix = prop_oneof![
        Just(""),
        Just("k"),
        Just("M"),
        Just("G"),
        Just("T"),
        Just("P"),
        Just("E"),
        Just("Ki"),
        Just("Mi"),
        Just("Gi"),
        Just("Ti"),
        Just("Pi"),
        Just("Ei"),
        Just("m"),
        Just("u"),
        Just("n"),
        Just("e3"),
        Just("E3"),
        Just("e-3"),
        Just("e308"),
        Just("e999999999999"),
        Just("e-99999999999"),
        Just("E+18"),
        Just("Zi"),
        Just("K"),
        Just("ki"),
    ];
    let pad = prop_oneof![6 => Just(""), 1 => Just(" "), 1 => Just("\t"), 1 => Just("\u{a0}")];
    (pad.clone(), sign, number, suffix, pad).prop_map(|(a, s, n, u, b)| format!("{a}{s}{n}{u}{b}"))
}

/// Any string: printable, control characters, non-ASCII, and long.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        ".{0,300}",
        "[ -~]{0,64}",
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Never panics, and accepts exactly the strings of the schema's regex
    /// (except values too large, an Overflow error): what the API server
    /// admits always parses, and nothing else does.
    #[test]
    fn duration_parser_agrees_with_the_schema(s in prop_oneof![near_duration(), any_text()]) {
        let grammar = regex::Regex::new(DURATION_REGEX).unwrap();
        match parse_duration(&s) {
            Ok(_) | Err(DurationError::Overflow(_)) => {
                prop_assert!(grammar.is_match(&s), "{s:?} parsed but the schema refuses it");
            }
            Err(DurationError::Empty) => prop_assert!(s.is_empty()),
            Err(DurationError::Malformed { .. }) => {
                prop_assert!(!grammar.is_match(&s), "{s:?} is in the schema's grammar but did not parse");
            }
        }
    }

    /// parse -> format -> parse: the formatted value reads back as the same
    /// duration to the millisecond (format drops what is finer).
    #[test]
    fn duration_round_trips(s in near_duration()) {
        if let Ok(d) = parse_duration(&s) {
            let text = format_duration(d);
            let back = parse_duration(&text);
            let ms = Duration::new(d.as_secs(), d.subsec_millis() * 1_000_000);
            prop_assert_eq!(back, Ok(ms), "{:?} -> {:?} -> {:?}", s, d, text);
        }
    }

    /// format -> parse is exact for whole milliseconds.
    #[test]
    fn formatted_durations_parse_back(ms in prop_oneof![0u64..10_000_000, any::<u64>()]) {
        let d = Duration::from_millis(ms);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }

    /// Terms add up: a valid duration written after another is their sum.
    #[test]
    fn durations_concatenate_as_a_sum(a in valid_duration_term(), b in valid_duration_term()) {
        let (da, db) = (parse_duration(&a).unwrap(), parse_duration(&b).unwrap());
        prop_assert_eq!(parse_duration(&format!("{a}{b}")), Ok(da + db));
    }

    /// Never panics; a count is whole, not negative and below the bound;
    /// padding by spaces changes nothing.
    #[test]
    fn quantity_counts_are_bounded(s in prop_oneof![near_quantity(), any_text()]) {
        let count = count_of(&s);
        if let Some(n) = count {
            prop_assert!((0..9_000_000_000_000_000).contains(&n), "{s:?} -> {n}");
            prop_assert!(!s.trim().starts_with('-') || n == 0, "{s:?} -> {n}");
        }
        prop_assert_eq!(count_of(&format!(" {s} ")), count_of(s.trim()));
    }

    /// Whole numbers read as themselves in every notation.
    #[test]
    fn quantity_counts_read_every_notation(n in 0i64..9_000_000_000) {
        prop_assert_eq!(count_of(&n.to_string()), Some(n));
        prop_assert_eq!(count_of(&format!("{n}k")), Some(n * 1000));
        prop_assert_eq!(count_of(&format!("{n}Ki")), Some(n * 1024));
        prop_assert_eq!(count_of(&format!("{n}000m")), Some(n));
        if n > 0 {
            prop_assert_eq!(count_of(&format!("-{n}")), None);
        }
    }

    /// A percentage is exactly "N%" for N from 1 to 100.
    #[test]
    fn percentages_are_exactly_one_to_a_hundred(s in prop_oneof![
        "[+-]?[0-9]{0,5}%{0,2}",
        "[ 0]?[0-9]{1,3}[.]?[0-9]?%",
        any_text(),
    ]) {
        let want = (1..=100u32).find(|n| format!("{n}%") == s);
        prop_assert_eq!(parse_percent(&s), want);
    }

    /// A resolved count is never above the total, 0 only when the total is,
    /// and a percentage rounds as documented.
    #[test]
    fn resolved_counts_stay_within_the_total(
        value in prop_oneof![
            any::<i32>().prop_map(IntOrString::Int),
            (-5i32..200).prop_map(IntOrString::Int),
            "[0-9]{1,3}%".prop_map(IntOrString::String),
            any_text().prop_map(IntOrString::String),
        ],
        total in prop_oneof![0usize..50, 0usize..100_000, Just(u32::MAX as usize)],
        round_up in any::<bool>(),
    ) {
        match (&value, resolve_count(&value, total, round_up)) {
            (IntOrString::Int(n), Ok(k)) => {
                prop_assert!(*n >= 1);
                prop_assert_eq!(k, (*n as usize).min(total));
            }
            (IntOrString::Int(n), Err(e)) => {
                prop_assert!(*n < 1);
                prop_assert_eq!(e, CountError::NotPositive(*n));
            }
            (IntOrString::String(s), Ok(k)) => {
                let p = parse_percent(s).expect("only a percentage resolves") as usize;
                let exact = total * p;
                let rounded = if round_up { exact.div_ceil(100) } else { exact / 100 };
                prop_assert_eq!(k, rounded.max(1).min(total));
                prop_assert!(k <= total && (k == 0) == (total == 0));
            }
            (IntOrString::String(s), Err(e)) => {
                prop_assert!(parse_percent(s).is_none());
                prop_assert_eq!(e, CountError::NotAPercentage(s.clone()));
            }
        }
    }

    /// `baseline`, `capacityLabel:<key>` (max only, a key without spaces)
    /// or a number >= 0; anything else is an error naming the input.
    #[test]
    fn bounds_parse_only_what_the_gate_takes(
        text in prop_oneof![
            Just("baseline".to_string()),
            "(capacityLabel|capacitylabel|CapacityLabel):.{0,40}",
            "[a-zA-Z: ]{0,20}",
            any_text(),
        ],
        number in any::<i32>(),
        allow_label in any::<bool>(),
    ) {
        let got = parse_bound(&IntOrString::String(text.clone()), allow_label);
        let key = text.strip_prefix("capacityLabel:");
        let want = if text == "baseline" {
            Ok(Bound::Baseline)
        } else if let Some(key) = key.filter(|k| allow_label && !k.is_empty() && !k.contains(char::is_whitespace)) {
            Ok(Bound::CapacityLabel(key.to_string()))
        } else {
            Err(BoundError::Invalid(text.clone()))
        };
        prop_assert_eq!(got, want);
        let got = parse_bound(&IntOrString::Int(number), allow_label);
        if number < 0 {
            prop_assert_eq!(got, Err(BoundError::Negative(number)));
        } else {
            prop_assert_eq!(got, Ok(Bound::Value(i64::from(number))));
        }
    }
}
