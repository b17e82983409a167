//! Property-based fuzzing of the state machine's entry point
//! ([`saferollout_core::decide`]) on statuses it did not write: a status is
//! whatever the API server holds, and anyone with write access to the
//! status subresource (or an older operator, or a restore from backup) may
//! have put there any JSON the schema lets through. Seeds are real
//! statuses, recorded pass by pass on a small cluster (`support/world.rs`);
//! each case mutates one (values replaced by near-valid and absurd ones,
//! keys removed, subtrees moved, bytes spliced), deserialises it as the
//! operator would, and decides on it, then runs the rollout on for a few
//! passes. It must never panic, and each status it writes must read back.
//! The coverage-guided target is `fuzz/fuzz_targets/decide.rs`.
//!
//! `PROPTEST_CASES` sets the number of cases (default 1,000 each).

mod support;

use std::sync::OnceLock;

use proptest::prelude::*;
use saferollout_api::{Phase, SafeRolloutSpec, SafeRolloutStatus};
use serde_json::Value;
use support::world::{World, seeds};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn seeded() -> &'static [World] {
    static SEEDS: OnceLock<Vec<World>> = OnceLock::new();
    SEEDS.get_or_init(seeds)
}

/// The seeds walk the rollout through what the fuzzing should start from:
/// adopted, a revision rolled through its stages, a broken one reverted.
#[test]
fn the_seeds_cover_a_whole_rollout() {
    let seeds = seeded();
    let phases: Vec<Option<Phase>> = seeds.iter().map(|w| w.status.phase).collect();
    for phase in [Phase::Progressing, Phase::Succeeded, Phase::RollingBack] {
        assert!(
            phases.contains(&Some(phase)),
            "no {phase:?} among {phases:?}"
        );
    }
    let last = &seeds.last().unwrap().status;
    assert_eq!(last.stable_revision.as_deref(), Some("v2"), "{last:#?}");
    assert!(
        last.blocked_revisions.iter().any(|b| b.revision == "v3"),
        "{last:#?}"
    );
    assert!(seeds.iter().any(|w| w.status.stages.len() == 3));
}

/// Every place in a JSON value (JSON pointers), the root excluded.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

/// Values near what a status holds, and absurd ones.
fn leaf() -> impl Strategy<Value = Value> {
    use serde_json::json;
    prop_oneof![
        prop::sample::select(vec![
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(1),
            json!(-1),
            json!(2),
            json!(3),
            json!(i32::MAX),
            json!(i32::MIN),
            json!(i64::MAX),
            json!(i64::MIN),
            json!(u64::MAX),
            json!(0.5),
            json!(1e308),
            json!(""),
            json!("v1"),
            json!("v2"),
            json!("v3"),
            json!("node-0"),
            json!("node-5"),
            json!("node-99"),
            json!("Pending"),
            json!("Progressing"),
            json!("Paused"),
            json!("Succeeded"),
            json!("RollingBack"),
            json!("Degraded"),
            json!("Failed"),
            json!("Replacing"),
            json!("Verifying"),
            json!("Soaking"),
            json!("Passed"),
            json!("allocatable"),
            json!("podsReady"),
            json!("example.com/gpu"),
            json!("baseline"),
            json!("capacityLabel:gpu.count"),
            json!("1970-01-01T00:00:00Z"),
            json!("2027-01-15T08:00:00Z"),
            json!("0001-01-01T00:00:00Z"),
            json!("9999-12-31T23:59:59Z"),
            json!("2027-01-15T08:00:00.123456789+14:00"),
            json!("not a time"),
            json!("10m"),
            json!("100%"),
            json!("0%"),
            json!([]),
            json!({}),
            json!(["node-0", "node-0"]),
            json!({"example.com/gpu": -8}),
            json!([{"nodes": ["node-0"], "counts": {"example.com/gpu": 8}}]),
            json!({"index": 7, "state": "Soaking"}),
            json!({"index": -1}),
        ]),
        any::<i64>().prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ]
}

/// A replacement of each JSON type: kept when the place holds that type
/// (most such statuses still deserialise, so the machine gets to run on
/// them), or the other value (a type the schema refuses, which the
/// deserialiser must refuse without panicking).
#[derive(Debug, Clone)]
struct Replacement {
    any: Value,
    string: String,
    number: i64,
}

fn replacement() -> impl Strategy<Value = Replacement> {
    let string = prop_oneof![
        prop::sample::select(vec![
            "",
            "v1",
            "v2",
            "v3",
            "node-0",
            "node-5",
            "node-99",
            "Pending",
            "Progressing",
            "Paused",
            "Succeeded",
            "RollingBack",
            "Degraded",
            "Failed",
            "Replacing",
            "Verifying",
            "Soaking",
            "Passed",
            "allocatable",
            "podsReady",
            "example.com/gpu",
            "1970-01-01T00:00:00Z",
            "2027-01-15T08:00:00Z",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "2027-01-15T08:00:00.123456789+14:00",
            "not a time",
            "10m",
            "100%",
            "0%",
            "True",
            "False",
            "Unknown",
            "baseline",
            "capacityLabel:gpu.count",
            "capacityLabel:",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,12}",
        any::<String>(),
    ];
    let number = prop_oneof![
        prop::sample::select(vec![
            0i64,
            1,
            -1,
            2,
            3,
            7,
            i32::MAX as i64,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN
        ]),
        any::<i64>(),
    ];
    (leaf(), string, number).prop_map(|(any, string, number)| Replacement {
        any,
        string,
        number,
    })
}

impl Replacement {
    fn for_place(&self, old: &Value, keep_type: bool) -> Value {
        match old {
            Value::String(_) if keep_type => Value::from(self.string.clone()),
            Value::Number(_) if keep_type => Value::from(self.number),
            Value::Bool(b) if keep_type => Value::from(!b),
            _ => self.any.clone(),
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Replace the value at a place (by index among the places), with one
    /// of the same type or not.
    Set(usize, Replacement, bool),
    /// Remove it (a key of an object, an item of an array).
    Remove(usize),
    /// Copy the value of one place over another.
    Move(usize, usize),
    /// Replace a run of the serialised text by other text.
    Splice(usize, usize, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        5 => (any::<usize>(), replacement(), prop::bool::weighted(0.8))
            .prop_map(|(i, r, keep)| Mutation::Set(i, r, keep)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Move(a, b)),
        1 => (any::<usize>(), 0usize..8, "[ -~]{0,6}").prop_map(|(a, n, t)| Mutation::Splice(a, n, t)),
    ]
}

/// Applies the mutations; `None` when the result is no longer JSON.
fn mutate(mut v: Value, mutations: &[Mutation]) -> Option<Value> {
    for m in mutations {
        let mut places = Vec::new();
        pointers(&v, String::new(), &mut places);
        let pick = |i: &usize| (!places.is_empty()).then(|| places[i % places.len()].clone());
        match m {
            Mutation::Set(i, replacement, keep_type) => {
                if let Some(p) = pick(i) {
                    let place = v.pointer_mut(&p)?;
                    *place = replacement.for_place(place, *keep_type);
                }
            }
            Mutation::Remove(i) => {
                if let Some(p) = pick(i) {
                    let (parent, last) = p.rsplit_once('/')?;
                    let key = last.replace("~1", "/").replace("~0", "~");
                    match v.pointer_mut(parent)? {
                        Value::Object(o) => {
                            o.remove(&key);
                        }
                        Value::Array(a) => {
                            a.remove(key.parse::<usize>().ok()?);
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Move(a, b) => {
                if let (Some(from), Some(to)) = (pick(a), pick(b)) {
                    let value = v.pointer(&from)?.clone();
                    *v.pointer_mut(&to)? = value;
                }
            }
            Mutation::Splice(at, n, text) => {
                let mut s = v.to_string();
                let mut start = at % (s.len() + 1);
                while !s.is_char_boundary(start) {
                    start -= 1;
                }
                let mut end = (start + n).min(s.len());
                while !s.is_char_boundary(end) {
                    end += 1;
                }
                s.replace_range(start..end, text);
                v = serde_json::from_str(&s).ok()?;
            }
        }
    }
    Some(v)
}

/// Changes to the cluster around a seed: nodes NotReady or gone, pods not
/// Ready or gone, our labels with other values, requests made.
#[derive(Debug, Clone)]
enum Change {
    NodeNotReady(usize),
    RemoveNode(usize),
    PodNotReady(usize),
    RemovePod(usize),
    Label(usize, String, String),
    Allocatable(usize, String),
    Template(String),
    Request(u8, String),
}

fn change() -> impl Strategy<Value = Change> {
    let text = prop_oneof![
        prop::sample::select(vec![
            "v1",
            "v2",
            "v3",
            "",
            "0",
            "1",
            "2",
            "99999999999999999999",
            "-1",
            "ns.plugin",
            "v2:0",
            "v3:1",
            "v2:99999999999",
            ":"
        ])
        .prop_map(str::to_string),
        "[ -~]{0,10}",
    ];
    prop_oneof![
        any::<usize>().prop_map(Change::NodeNotReady),
        any::<usize>().prop_map(Change::RemoveNode),
        any::<usize>().prop_map(Change::PodNotReady),
        any::<usize>().prop_map(Change::RemovePod),
        (
            any::<usize>(),
            prop::sample::select(vec![
                "saferollout.dev/stage",
                "saferollout.dev/rollout",
                "gpu.count",
            ]),
            text.clone()
        )
            .prop_map(|(i, k, v)| Change::Label(i, k.to_string(), v)),
        (
            any::<usize>(),
            prop_oneof![
                Just("0".to_string()),
                Just("16".to_string()),
                Just("-8".to_string()),
                Just("500m".to_string()),
                Just("8Ei".to_string()),
                "[ -~]{0,6}"
            ]
        )
            .prop_map(|(i, q)| Change::Allocatable(i, q)),
        text.clone().prop_map(Change::Template),
        (0u8..3, text).prop_map(|(k, v)| Change::Request(k, v)),
    ]
}

fn apply(w: &mut World, c: &Change) {
    let nodes = w.nodes.len().max(1);
    let pods = w.pods.len().max(1);
    match c {
        Change::NodeNotReady(i) => {
            if let Some(n) = w.nodes.get_mut(i % nodes) {
                n.ready = false;
            }
        }
        Change::RemoveNode(i) => {
            if i % nodes < w.nodes.len() {
                let n = w.nodes.remove(i % nodes);
                w.pods.retain(|p| p.node != n.name);
            }
        }
        Change::PodNotReady(i) => {
            if let Some(p) = w.pods.get_mut(i % pods) {
                p.ready = false;
            }
        }
        Change::RemovePod(i) => {
            if i % pods < w.pods.len() {
                w.pods.remove(i % pods);
            }
        }
        Change::Label(i, k, v) => {
            if let Some(n) = w.nodes.get_mut(i % nodes) {
                n.labels.insert(k.clone(), v.clone());
            }
        }
        Change::Allocatable(i, q) => {
            if let Some(n) = w.nodes.get_mut(i % nodes) {
                n.allocatable.insert(
                    support::world::RESOURCE.to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.clone()),
                );
            }
        }
        Change::Template(r) => w.write_template(r),
        Change::Request(k, v) => match k {
            0 => w.requests.0 = Some(v.clone()),
            1 => w.requests.1 = Some(v.clone()),
            _ => w.requests.2 = Some(v.clone()),
        },
    }
}

/// Decides on `w` and a few passes more; each status written reads back
/// as it was written. (Compared as JSON: a time read from a mutated status
/// may carry nanoseconds, which the API's time format drops, as the API
/// server does.)
fn run_on(mut w: World, passes: usize) -> Result<(), TestCaseError> {
    for _ in 0..passes {
        let d = w.pass();
        let json = serde_json::to_string(&d.status).expect("a status serialises");
        let back: SafeRolloutStatus =
            serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{e}: {json}")))?;
        prop_assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// A mutated status (and a changed cluster) never makes the machine panic.
    #[test]
    fn decide_survives_mutated_statuses(
        seed in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..5),
        changes in prop::collection::vec(change(), 0..4),
    ) {
        let seeds = seeded();
        let mut w = seeds[seed.index(seeds.len())].clone();
        let json = serde_json::to_value(&w.status).unwrap();
        let Some(mutated) = mutate(json, &mutations) else { return Ok(()) };
        let Ok(status) = serde_json::from_value::<SafeRolloutStatus>(mutated) else {
            return Ok(());
        };
        w.status = status;
        for c in &changes {
            apply(&mut w, c);
        }
        run_on(w, 6)?;
    }

    /// The same for a mutated spec, as long as the API server would have
    /// admitted it (the client-side validator says so).
    #[test]
    fn decide_survives_mutated_specs(
        seed in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let seeds = seeded();
        let mut w = seeds[seed.index(seeds.len())].clone();
        let json = serde_json::to_value(&w.spec).unwrap();
        let Some(mutated) = mutate(json, &mutations) else { return Ok(()) };
        let Ok(spec) = serde_json::from_value::<SafeRolloutSpec>(mutated) else {
            return Ok(());
        };
        if !spec.validate().is_empty() {
            return Ok(()); // the API server refuses it
        }
        w.spec = spec;
        run_on(w, 6)?;
    }

    /// Raw bytes as a status: rarely JSON, never a panic in the parser; a
    /// status that deserialises is decided on.
    #[test]
    fn decide_survives_raw_status_bytes(
        seed in any::<prop::sample::Index>(),
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let seeds = seeded();
        let mut w = seeds[seed.index(seeds.len())].clone();
        if let Ok(status) = serde_json::from_slice::<SafeRolloutStatus>(&bytes) {
            w.status = status;
            run_on(w, 2)?;
        }
    }
}

/// The mutations leave enough statuses and specs readable (and specs
/// valid) for the properties above to decide on many of them: without
/// this, a change that made every mutant unreadable would pass unnoticed.
#[test]
fn mutants_are_often_readable() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let seeds = seeded();
    let mut runner = TestRunner::deterministic();
    let (mut statuses, mut specs) = (0, 0);
    for i in 0..1000 {
        let mutations = prop::collection::vec(mutation(), 1..5)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let w = &seeds[i % seeds.len()];
        let status = mutate(serde_json::to_value(&w.status).unwrap(), &mutations);
        if status.is_some_and(|v| serde_json::from_value::<SafeRolloutStatus>(v).is_ok()) {
            statuses += 1;
        }
        let spec = mutate(serde_json::to_value(&w.spec).unwrap(), &mutations);
        if spec
            .and_then(|v| serde_json::from_value::<SafeRolloutSpec>(v).ok())
            .is_some_and(|s| s.validate().is_empty())
        {
            specs += 1;
        }
    }
    assert!(statuses >= 150, "{statuses}/1000 mutated statuses readable");
    assert!(specs >= 50, "{specs}/1000 mutated specs readable and valid");
}
