//! count_of (quantities from nodes' allocatable and labels): never panics;
//! a count is whole, >= 0 and below the bound; surrounding spaces change
//! nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saferollout_api::count_of;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let count = count_of(s);
    if let Some(n) = count {
        assert!((0..9_000_000_000_000_000).contains(&n), "{s:?} -> {n}");
    }
    assert_eq!(count_of(&format!(" {s} ")), count_of(s.trim()), "{s:?}");
});
