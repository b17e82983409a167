//! The state machine on any status: the input (after its first byte) is a
//! SafeRolloutStatus as JSON; the first byte picks the cluster it is
//! decided on, among the worlds a recorded rollout went through
//! (crates/core/tests/support/world.rs). A status that deserialises must be
//! decided on without a panic, for a few passes, and each status written
//! must read back as written.
#![no_main]

#[path = "../../crates/core/tests/support/world.rs"]
#[allow(dead_code)]
mod world;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use saferollout_api::SafeRolloutStatus;

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<Vec<world::World>> = OnceLock::new();
    let seeds = SEEDS.get_or_init(world::seeds);
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    let Ok(status) = serde_json::from_slice::<SafeRolloutStatus>(json) else {
        return;
    };
    let mut w = seeds[usize::from(pick) % seeds.len()].clone();
    w.status = status;
    for _ in 0..3 {
        let d = w.pass();
        let written = serde_json::to_string(&d.status).unwrap();
        let back: SafeRolloutStatus = serde_json::from_str(&written).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), written);
    }
});
