//! prometheus: a PromQL query over the stage's nodes, run every `interval`
//! once every node the rollout holds runs a Ready agent of the target
//! revision; every sample of the result must meet `condition`. The gate
//! passes after `count` good measurements and fails when more than
//! `failureLimit` were bad (a failing sample's `node` label names the
//! node). No data, an error or a timeout is inconclusive: it counts as a
//! failure (`inconclusive: Fail`, the default), as a success (`Pass`), or
//! holds the stage until a conclusive measurement (`Pause`, failing at the
//! progress deadline).
//!
//! The runtime runs the query (with `$STAGE_NODES` replaced by
//! [`stage_nodes_regex`] of the nodes status records) when one is due
//! ([`due`]) and hands the measurement in; the tally lives in the gate's
//! result in status (`measurements`), so a measurement is counted once and
//! a restart loses nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use saferollout_api::proof::Condition;
use saferollout_api::{
    GATE_PROMETHEUS, GateResult, GateStatus, InconclusivePolicy, Measurements, PrometheusGate,
    STAGE_NODES_PLACEHOLDER,
};

use super::proof::{Measurement, MeasurementOutcome, clean_line};
use super::{Snapshot, Verdict, elapsed, list_some, result};

pub fn gate_name(name: &str) -> String {
    format!("{GATE_PROMETHEUS}/{name}")
}

/// A regular expression (PromQL string-literal text, RE2, fully anchored by
/// Prometheus) that matches exactly `nodes`.
pub fn stage_nodes_regex<S: AsRef<str>>(nodes: &[S]) -> String {
    nodes
        .iter()
        .map(|n| {
            n.as_ref()
                .chars()
                .map(|c| match c {
                    // `\\.` in a PromQL double-quoted string is the regex `\.`.
                    '.' => "\\\\.".to_string(),
                    c if c.is_ascii_alphanumeric() || c == '-' => c.to_string(),
                    // Not in a node name; never let it reach the query unescaped.
                    _ => String::new(),
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The query with `$STAGE_NODES` replaced by `stage_nodes` (the
/// [`stage_nodes_regex`] of the nodes, which the measurement also records).
pub fn render_query(gate: &PrometheusGate, stage_nodes: &str) -> String {
    gate.query.replace(STAGE_NODES_PLACEHOLDER, stage_nodes)
}

fn interval(gate: &PrometheusGate) -> Duration {
    gate.interval
        .to_std()
        .unwrap_or(Duration::from_secs(30))
        .max(Duration::from_secs(1))
}

/// Whether the runtime should measure now, given the gate's result so far
/// on this stage: not after a verdict, and not before an interval passed
/// since the last measurement.
pub fn due(gate: &PrometheusGate, previous: Option<&GateResult>, now: Timestamp) -> bool {
    let Some(prev) = previous else { return true };
    if prev.status != GateStatus::Pending {
        return false;
    }
    match prev.measurements.as_ref().and_then(|m| m.last.as_ref()) {
        Some(last) => elapsed(last.0, now) >= interval(gate),
        None => true,
    }
}

enum Classified {
    Good,
    Bad {
        nodes: BTreeSet<String>,
        observed: String,
    },
    Inconclusive(String),
}

fn classify(cond: &Condition, m: &Measurement) -> Classified {
    match &m.outcome {
        MeasurementOutcome::Error(e) => Classified::Inconclusive(clean_line(e)),
        MeasurementOutcome::Samples(s) if s.is_empty() => {
            Classified::Inconclusive("the query returned no data".into())
        }
        MeasurementOutcome::Samples(samples) => {
            let bad: Vec<_> = samples.iter().filter(|s| !cond.holds(s.value)).collect();
            if bad.is_empty() {
                return Classified::Good;
            }
            let nodes = bad
                .iter()
                .filter_map(|s| {
                    s.labels
                        .get("node")
                        .or_else(|| s.labels.get("Hostname"))
                        .cloned()
                })
                .collect();
            Classified::Bad {
                nodes,
                observed: format_value(bad[0].value),
            }
        }
    }
}

fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

pub fn evaluate(gate: &PrometheusGate, snap: &Snapshot, previous: Option<&GateResult>) -> Verdict {
    let name = gate_name(&gate.name);
    let Some(cond) = Condition::parse(&gate.condition) else {
        // The CRD's schema refuses such a condition; fail closed if one slips through.
        return Verdict::new(result(
            &name,
            GateStatus::Failed,
            "InvalidCondition",
            format!("condition {:?} is not a comparison", gate.condition),
        ));
    };
    let every = interval(gate);
    let mut tally: Measurements = previous
        .and_then(|p| p.measurements.clone())
        .unwrap_or_default();
    let keep = |status, reason: &str, message: String, tally: Measurements| {
        let mut r = result(&name, status, reason, message);
        r.measurements = Some(tally);
        r
    };
    // A verdict stands for the stage.
    if let Some(p) = previous.filter(|p| p.status != GateStatus::Pending) {
        return Verdict::new(p.clone());
    }
    if snap.nodes.is_empty() {
        return Verdict::new(keep(
            GateStatus::Pending,
            "NoNodes",
            "no node of the rollout to judge yet".into(),
            tally,
        ));
    }
    let awaiting: Vec<&str> = snap
        .nodes
        .iter()
        .copied()
        .filter(|n| !snap.target_pod(n).is_some_and(|p| p.running && p.ready))
        .collect();
    let expected_nodes = stage_nodes_regex(snap.nodes);
    let deadline = snap.deadline_passed();
    let desc = format!("{} {}", gate.query.trim(), cond);
    if !awaiting.is_empty() {
        let message = format!(
            "waiting for the new agent on {} before measuring",
            list_some(&awaiting)
        );
        if deadline {
            return Verdict::new(keep(
                GateStatus::Failed,
                "ProgressDeadlineExceeded",
                format!("no progress before the deadline: {message}"),
                tally,
            ));
        }
        return Verdict::new(keep(GateStatus::Pending, "AwaitingPods", message, tally));
    }
    let fresh = snap
        .evidence
        .proof
        .and_then(|p| p.measurements.get(&name))
        .filter(|m| m.stage_nodes == expected_nodes)
        .filter(|m| tally.last.as_ref().is_none_or(|last| m.at > last.0));
    let mut latest = None;
    if let Some(m) = fresh {
        let c = classify(&cond, m);
        match &c {
            Classified::Good => tally.passed += 1,
            Classified::Bad { .. } => tally.failed += 1,
            Classified::Inconclusive(_) => match gate.inconclusive {
                InconclusivePolicy::Fail => tally.failed += 1,
                InconclusivePolicy::Pass => tally.passed += 1,
                InconclusivePolicy::Pause => tally.inconclusive += 1,
            },
        }
        tally.last = Some(Time(m.at));
        latest = Some(c);
    }
    let next = tally
        .last
        .as_ref()
        .map(|l| every.saturating_sub(elapsed(l.0, snap.now)))
        .unwrap_or(Duration::from_millis(500))
        .max(Duration::from_millis(200));
    let counts = format!(
        "{} good, {} bad, {} inconclusive of {} needed (failureLimit {})",
        tally.passed, tally.failed, tally.inconclusive, gate.count, gate.failure_limit
    );
    if tally.failed > gate.failure_limit {
        let (nodes, observed, why) = match latest {
            Some(Classified::Bad { nodes, observed }) => {
                let why = format!("observed {observed}");
                (nodes, observed, why)
            }
            Some(Classified::Inconclusive(why)) => (
                BTreeSet::new(),
                "inconclusive".to_string(),
                format!("{why} (inconclusive: Fail)"),
            ),
            _ => (BTreeSet::new(), "bad".to_string(), "bad".to_string()),
        };
        let held: BTreeSet<String> = snap.nodes.iter().map(|n| n.to_string()).collect();
        let named: BTreeSet<String> = nodes.intersection(&held).cloned().collect();
        let reason = if observed == "inconclusive" {
            "Inconclusive"
        } else {
            "ConditionNotMet"
        };
        let on = named
            .iter()
            .next()
            .map(|n| format!(" on node {n}"))
            .unwrap_or_default();
        let mut r = keep(
            GateStatus::Failed,
            reason,
            format!("{desc}: {why}{on}; {counts}"),
            tally,
        );
        r.node = named.iter().next().cloned();
        r.observed = Some(observed);
        r.expected = Some(cond.to_string());
        r.since = Some(Time(snap.now));
        return Verdict {
            // Unknown which node: every node the rollout holds is suspect.
            violating: if named.is_empty() { held } else { named },
            ..Verdict::new(r)
        };
    }
    if tally.passed >= gate.count {
        return Verdict::new(keep(
            GateStatus::Passed,
            "ConditionMet",
            format!("{desc} on {} nodes; {counts}", snap.nodes.len()),
            tally,
        ));
    }
    let paused = matches!(latest, Some(Classified::Inconclusive(_)))
        && gate.inconclusive == InconclusivePolicy::Pause;
    if deadline {
        return Verdict::new(keep(
            GateStatus::Failed,
            if paused {
                "Inconclusive"
            } else {
                "ProgressDeadlineExceeded"
            },
            format!("no verdict before the progress deadline: {desc}; {counts}"),
            tally,
        ));
    }
    if paused {
        let why = match latest {
            Some(Classified::Inconclusive(w)) => w,
            _ => String::new(),
        };
        return Verdict {
            violating: snap.nodes.iter().map(|n| n.to_string()).collect(),
            recheck_after: Some(next),
            ..Verdict::new(keep(
                GateStatus::Pending,
                "Inconclusive",
                format!("{desc}: {why} (inconclusive: Pause holds the stage); {counts}"),
                tally,
            ))
        };
    }
    Verdict {
        recheck_after: Some(next),
        ..Verdict::new(keep(
            GateStatus::Pending,
            "Measuring",
            format!("{desc}; {counts}"),
            tally,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::proof::{ProofEvidence, Sample};
    use super::super::test_support::*;
    use super::*;

    fn gate(inconclusive: InconclusivePolicy) -> PrometheusGate {
        PrometheusGate {
            name: "healthy".into(),
            address: "http://127.0.0.1:9090".into(),
            query: "saferollout_sim_gpu_healthy{node=~\"$STAGE_NODES\"}".into(),
            condition: "== 1".into(),
            interval: "2s".into(),
            count: 2,
            failure_limit: 0,
            inconclusive,
            timeout: "5s".into(),
            tls: None,
            bearer_token_secret: None,
        }
    }

    fn samples(w: &World, values: &[(&str, f64)]) -> MeasurementOutcome {
        let _ = w;
        MeasurementOutcome::Samples(
            values
                .iter()
                .map(|(n, v)| Sample {
                    labels: BTreeMap::from([("node".to_string(), n.to_string())]),
                    value: *v,
                })
                .collect(),
        )
    }

    fn measure(
        g: &PrometheusGate,
        w: &World,
        at: i64,
        outcome: MeasurementOutcome,
        prev: Option<&GateResult>,
    ) -> Verdict {
        let nodes: Vec<&str> = w.nodes.iter().map(String::as_str).collect();
        let ev = ProofEvidence {
            measurements: BTreeMap::from([(
                gate_name(&g.name),
                Measurement {
                    at: ts(at),
                    stage_nodes: stage_nodes_regex(&nodes),
                    outcome,
                },
            )]),
            ..Default::default()
        };
        w.with_proof(&ev, |s| evaluate(g, s, prev))
    }

    #[test]
    fn stage_nodes_become_an_exact_alternation() {
        assert_eq!(
            stage_nodes_regex(&["sim-gpu-0", "sim-gpu-1"]),
            "sim-gpu-0|sim-gpu-1"
        );
        assert_eq!(stage_nodes_regex(&["a.b"]), "a\\\\.b");
        let g = gate(InconclusivePolicy::Fail);
        assert_eq!(
            render_query(&g, &stage_nodes_regex(&["n1"])),
            "saferollout_sim_gpu_healthy{node=~\"n1\"}"
        );
    }

    #[test]
    fn passes_after_count_good_measurements_each_counted_once() {
        let mut w = World::healthy(2, 8);
        let g = gate(InconclusivePolicy::Fail);
        let good = samples(&w, &[("node-0", 1.0), ("node-1", 1.0)]);
        let v1 = measure(&g, &w, 100, good.clone(), None);
        assert_eq!(v1.result.status, GateStatus::Pending);
        assert_eq!(v1.result.measurements.as_ref().unwrap().passed, 1);
        // The same measurement again counts nothing.
        let again = measure(&g, &w, 100, good.clone(), Some(&v1.result));
        assert_eq!(again.result.measurements.as_ref().unwrap().passed, 1);
        assert!(!due(&g, Some(&v1.result), ts(101)));
        w.now = ts(102);
        assert!(due(&g, Some(&v1.result), ts(102)));
        let v2 = measure(&g, &w, 102, good, Some(&v1.result));
        assert_eq!(v2.result.status, GateStatus::Passed, "{:?}", v2.result);
        assert!(
            !due(&g, Some(&v2.result), ts(200)),
            "no query after a verdict"
        );
    }

    #[test]
    fn a_bad_sample_fails_naming_its_node() {
        let w = World::healthy(2, 8);
        let g = gate(InconclusivePolicy::Fail);
        let v = measure(
            &g,
            &w,
            100,
            samples(&w, &[("node-0", 1.0), ("node-1", 0.0)]),
            None,
        );
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.reason, "ConditionNotMet");
        assert_eq!(v.result.node.as_deref(), Some("node-1"));
        assert_eq!(v.result.observed.as_deref(), Some("0"));
        assert_eq!(v.result.expected.as_deref(), Some("== 1"));
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-1"]);
        // With a failure limit, one bad measurement is tolerated.
        let lenient = PrometheusGate {
            failure_limit: 1,
            ..g
        };
        let v = measure(&lenient, &w, 100, samples(&w, &[("node-1", 0.0)]), None);
        assert_eq!(v.result.status, GateStatus::Pending);
    }

    #[test]
    fn no_data_is_handled_as_configured() {
        let w = World::healthy(1, 8);
        let empty = MeasurementOutcome::Samples(vec![]);
        let v = measure(
            &gate(InconclusivePolicy::Fail),
            &w,
            100,
            empty.clone(),
            None,
        );
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "Inconclusive")
        );
        assert!(v.result.message.contains("no data"), "{}", v.result.message);
        let v = measure(
            &gate(InconclusivePolicy::Pass),
            &w,
            100,
            empty.clone(),
            None,
        );
        assert_eq!(v.result.measurements.as_ref().unwrap().passed, 1);
        let v = measure(
            &gate(InconclusivePolicy::Pause),
            &w,
            100,
            empty.clone(),
            None,
        );
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Pending, "Inconclusive")
        );
        assert!(!v.violating.is_empty(), "a pause holds the stage");
        let err = MeasurementOutcome::Error("context deadline exceeded".into());
        let v = measure(&gate(InconclusivePolicy::Fail), &w, 100, err, None);
        assert_eq!(v.result.status, GateStatus::Failed);
    }

    #[test]
    fn measurements_over_other_nodes_or_before_the_agents_are_ready_do_not_count() {
        let mut w = World::healthy(2, 8);
        let g = gate(InconclusivePolicy::Fail);
        let ev = ProofEvidence {
            measurements: BTreeMap::from([(
                gate_name(&g.name),
                Measurement {
                    at: ts(100),
                    stage_nodes: "node-0".into(),
                    outcome: samples(&w, &[("node-0", 0.0)]),
                },
            )]),
            ..Default::default()
        };
        let v = w.with_proof(&ev, |s| evaluate(&g, s, None));
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.result.measurements.unwrap().failed, 0);
        w.pod("node-1").ready = false;
        let v = measure(&g, &w, 100, samples(&w, &[("node-0", 0.0)]), None);
        assert_eq!(v.result.reason, "AwaitingPods");
    }
}
