//! Counts, percentages and the allocatable gate's bounds: parse_percent,
//! resolve_count and parse_bound never panic and answer as documented.
#![no_main]

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use libfuzzer_sys::fuzz_target;
use saferollout_api::{Bound, parse_bound, parse_percent, resolve_count};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let number = i32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let total = usize::from(u16::from_le_bytes([data[4], data[5]]));
    let Ok(s) = std::str::from_utf8(&data[6..]) else {
        return;
    };
    let want = (1..=100u32).find(|n| format!("{n}%") == s);
    assert_eq!(parse_percent(s), want, "{s:?}");
    for round_up in [false, true] {
        for value in [IntOrString::Int(number), IntOrString::String(s.to_string())] {
            if let Ok(k) = resolve_count(&value, total, round_up) {
                assert!(k <= total && (k == 0) == (total == 0), "{value:?} {total}");
            }
        }
    }
    for allow_label in [false, true] {
        match parse_bound(&IntOrString::String(s.to_string()), allow_label) {
            Ok(Bound::Baseline) => assert_eq!(s, "baseline"),
            Ok(Bound::CapacityLabel(key)) => {
                assert!(allow_label);
                assert_eq!(format!("capacityLabel:{key}"), s);
            }
            Ok(Bound::Value(_)) => panic!("{s:?} read as a number"),
            Err(_) => {}
        }
        let bound = parse_bound(&IntOrString::Int(number), allow_label);
        assert_eq!(bound.is_ok(), number >= 0);
    }
});
