//! `policy [NAME] [-o table|json|yaml]`: SafeRolloutPolicies (fleet
//! policies, issue 38) and the SafeRollouts each governs: the policy's
//! `Ready` condition, its limits, whether a maintenance window is open and
//! when the next opens, its ordering rules; per governed rollout its phase,
//! whether (and why) the policy holds it back (its `Waiting` condition) and
//! the nodes it disrupts now; and the distinct nodes disrupted across them
//! against `maxDisruptedNodes`.
//!
//! Which rollouts a policy governs is decided here as the operator decides
//! it: the namespace's labels against `selector.namespaceSelector`, the
//! SafeRollout's labels against `selector.rolloutSelector` (absent: every
//! one), rollouts being deleted left out. Everything else is read from the
//! statuses the operator wrote; the windows are evaluated now with the
//! operator's own code (`saferollout_core::fleet::windows`).

use std::collections::{BTreeMap, BTreeSet};

use jiff::{Timestamp, Zoned};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;
use kube::core::{Selector, SelectorExt};
use saferollout_api::{
    CONDITION_READY, CONDITION_WAITING, MaintenanceWindow, SafeRollout, SafeRolloutPolicy, Weekday,
};
use saferollout_core::fleet::windows;
use serde::Serialize;

use super::{int_or_string, rollout_ref};
use crate::cli::PolicyArgs;
use crate::client::Kube;
use crate::error::CliError;
use crate::output::{age, emit, serialize, short_duration, timestamp};
use crate::table::{Table, list, or_dash, truncate};

/// How many node names a rollout row (and the summary) shows before `(+N more)`.
const NODES_SHOWN: usize = 3;
/// How many rollout names an ordering rule shows per side before `(+N more)`.
const ROLLOUTS_SHOWN: usize = 3;
/// The longest Waiting message a table row shows (JSON/YAML have it whole).
const MESSAGE_WIDTH: usize = 90;
/// The label the API server sets on every namespace: what a
/// `namespaceSelector` is evaluated on when the namespaces cannot be read.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What `policy -o json|yaml` prints (documented in docs/cli.md). Field
/// names are stable; new fields may be added.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoliciesReport {
    /// The named policy, or every policy by name.
    pub policies: Vec<PolicyReport>,
    /// What could not be read, and how the report makes do without it.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    pub name: String,
    pub generation: i64,
    /// The generation the operator last described (`null` before it did).
    pub observed_generation: Option<i64>,
    /// The `Ready` condition (`null` before the operator wrote one).
    pub ready: Option<ConditionReport>,
    /// `selector.namespaceSelector` as a label selector string (`""`
    /// matches every namespace; `null`: absent, every namespace).
    pub namespace_selector: Option<String>,
    /// `selector.rolloutSelector`, the same way.
    pub rollout_selector: Option<String>,
    /// As written (`1`, `10%`); `null`: no fleet-wide limit.
    pub max_disrupted_nodes: Option<String>,
    /// `null`: no limit.
    pub max_concurrent_rollouts: Option<i32>,
    pub maintenance_windows: Vec<WindowReport>,
    /// Whether governed rollouts may start a stage now (always `true`
    /// without windows; `null` when a window cannot be used).
    pub window_open: Option<bool>,
    /// When the next window opens, in its time zone, RFC 9557
    /// (`2026-12-05T22:00:00+01:00[Europe/Paris]`); `null` when one is
    /// open now, there are none, or none opens in the next week.
    pub next_window: Option<String>,
    /// Why the windows cannot be used (an unknown time zone, ...).
    pub window_error: Option<String>,
    pub ordering: Vec<OrderingReport>,
    /// The governed SafeRollouts, by namespace and name.
    pub rollouts: Vec<GovernedReport>,
    /// The distinct nodes the governed rollouts disrupt now, sorted.
    pub disrupted_nodes: Vec<String>,
    /// How many governed rollouts disrupt at least one node now (what
    /// `maxConcurrentRollouts` limits).
    pub disrupting_rollouts: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionReport {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowReport {
    pub days: Vec<String>,
    pub start: String,
    pub end: String,
    pub time_zone: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderingReport {
    /// The dependent rollouts' selector (`""` matches every rollout).
    pub rollouts: String,
    /// The selectors of the rollouts they go after.
    pub after: Vec<String>,
    /// Governed rollouts `rollouts` matches (`namespace/name`).
    pub matched: Vec<String>,
    /// Governed rollouts one of `after` matches.
    pub after_matched: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GovernedReport {
    pub namespace: String,
    pub name: String,
    /// `null` before the operator reconciled the rollout.
    pub phase: Option<String>,
    /// The `Waiting` condition while it is True (`null` when the rollout
    /// is not held back).
    pub waiting: Option<WaitingReport>,
    /// `status.disruptedNodes`: where its agent is being replaced, reverted
    /// or failing now.
    pub disrupted_nodes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingReport {
    /// FleetBudgetFull, FleetConcurrencyFull, FleetOrdering,
    /// MaintenanceWindow or FleetPolicyInvalid.
    pub reason: String,
    pub message: String,
    pub since: String,
}

/// What the API calls returned.
#[derive(Debug, Clone, Default)]
pub struct Raw {
    pub policies: Vec<SafeRolloutPolicy>,
    pub rollouts: Vec<SafeRollout>,
    /// `None` when the namespaces could not be read (or were not needed).
    pub namespaces: Option<Vec<Namespace>>,
    pub notes: Vec<String>,
}

/// Whether `selector` matches `labels`; absent matches everything, one that
/// does not parse nothing (as the operator reads it).
pub fn matches(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    match selector {
        None => true,
        Some(s) => Selector::try_from(s.clone()).is_ok_and(|s| s.matches(labels)),
    }
}

/// A label selector in `kubectl -l` form (`""` matches everything).
pub fn selector_string(selector: &LabelSelector) -> String {
    match Selector::try_from(selector.clone()) {
        Ok(s) => s.to_string(),
        Err(e) => format!("<invalid: {e}>"),
    }
}

/// The labels a rollout's namespace has: from the listed namespaces, else
/// (not listed, or unreadable) only the name label the API server sets.
fn namespace_labels(namespaces: Option<&[Namespace]>, ns: &str) -> BTreeMap<String, String> {
    namespaces
        .and_then(|list| list.iter().find(|n| n.metadata.name.as_deref() == Some(ns)))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_else(|| [(NAMESPACE_NAME_LABEL.to_string(), ns.to_string())].into())
}

/// Whether `policy` governs `sr` (see the module docs).
pub fn governs(
    policy: &SafeRolloutPolicy,
    sr: &SafeRollout,
    namespaces: Option<&[Namespace]>,
) -> bool {
    let selector = &policy.spec.selector;
    let ns = sr.metadata.namespace.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    sr.metadata.deletion_timestamp.is_none()
        && matches(
            selector.namespace_selector.as_ref(),
            &namespace_labels(namespaces, ns),
        )
        && matches(
            selector.rollout_selector.as_ref(),
            sr.metadata.labels.as_ref().unwrap_or(&empty),
        )
}

fn day_abbrev(d: Weekday) -> &'static str {
    &d.as_str()[..3]
}

/// A window's days in short form: `Mon-Fri`, `Sat,Sun`, `daily`.
pub fn days_short(days: &[Weekday]) -> String {
    let set: BTreeSet<Weekday> = days.iter().copied().collect();
    if set.len() == 7 {
        return "daily".into();
    }
    // Runs of consecutive days (indices into Weekday::ALL), Monday first.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, d) in Weekday::ALL.iter().enumerate() {
        if !set.contains(d) {
            continue;
        }
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == i => *last = i,
            _ => runs.push((i, i)),
        }
    }
    let name = |i: usize| day_abbrev(Weekday::ALL[i]);
    let mut parts = Vec::new();
    for (first, last) in runs {
        match last - first {
            0 => parts.push(name(first).to_string()),
            1 => parts.extend([name(first).to_string(), name(last).to_string()]),
            _ => parts.push(format!("{}-{}", name(first), name(last))),
        }
    }
    parts.join(",")
}

/// A window in short form: `Sat,Sun 22:00-04:00 Europe/Paris`.
pub fn window_short(w: &WindowReport) -> String {
    let days: Vec<Weekday> = w
        .days
        .iter()
        .filter_map(|d| Weekday::ALL.into_iter().find(|x| x.as_str() == d))
        .collect();
    format!(
        "{} {}-{} {}",
        days_short(&days),
        w.start,
        w.end,
        w.time_zone
    )
}

/// When a window opens, for people: `Saturday 2026-12-05 22:00 CET (+01:00)`.
pub fn zoned_short(at: &Zoned) -> String {
    at.strftime("%A %Y-%m-%d %H:%M %Z (%:z)").to_string()
}

/// Whether the windows are open at `now`, when the next opens (`None`
/// when open now or never), or why they cannot be used.
fn window_state(
    spec_windows: &[MaintenanceWindow],
    now: Timestamp,
) -> (Option<bool>, Option<Zoned>, Option<String>) {
    match windows::parse(spec_windows) {
        Err(e) => (None, None, Some(e.to_string())),
        Ok(parsed) => {
            let open = windows::is_open(&parsed, now);
            let next = if open {
                None
            } else {
                windows::next_open(&parsed, now)
            };
            (Some(open), next, None)
        }
    }
}

fn governed_report(sr: &SafeRollout) -> GovernedReport {
    let st = sr.status.as_ref();
    let waiting = st
        .and_then(|s| s.condition(CONDITION_WAITING))
        .filter(|c| c.status == "True")
        .map(|c| WaitingReport {
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: timestamp(c.last_transition_time.0),
        });
    let mut disrupted = st.map(|s| s.disrupted_nodes.clone()).unwrap_or_default();
    disrupted.sort();
    disrupted.dedup();
    GovernedReport {
        namespace: sr.metadata.namespace.clone().unwrap_or_default(),
        name: sr.metadata.name.clone().unwrap_or_default(),
        phase: st.and_then(|s| s.phase).map(|p| p.to_string()),
        waiting,
        disrupted_nodes: disrupted,
    }
}

/// The report of one policy over every SafeRollout of the cluster.
pub fn policy_report(
    policy: &SafeRolloutPolicy,
    rollouts: &[SafeRollout],
    namespaces: Option<&[Namespace]>,
    now: Timestamp,
) -> PolicyReport {
    let spec = &policy.spec;
    let mut governed: Vec<&SafeRollout> = rollouts
        .iter()
        .filter(|sr| governs(policy, sr, namespaces))
        .collect();
    governed.sort_by_key(|sr| rollout_ref(sr));
    let empty = BTreeMap::new();
    let labelled: Vec<(String, &BTreeMap<String, String>)> = governed
        .iter()
        .map(|sr| {
            (
                rollout_ref(sr),
                sr.metadata.labels.as_ref().unwrap_or(&empty),
            )
        })
        .collect();
    let matching = |selector: &LabelSelector| -> Vec<String> {
        labelled
            .iter()
            .filter(|(_, labels)| matches(Some(selector), labels))
            .map(|(name, _)| name.clone())
            .collect()
    };
    let ordering = spec
        .ordering
        .iter()
        .map(|rule| {
            let after_matched: BTreeSet<String> = rule.after.iter().flat_map(&matching).collect();
            OrderingReport {
                rollouts: selector_string(&rule.rollouts),
                after: rule.after.iter().map(selector_string).collect(),
                matched: matching(&rule.rollouts),
                after_matched: after_matched.into_iter().collect(),
            }
        })
        .collect();
    let rows: Vec<GovernedReport> = governed.iter().map(|sr| governed_report(sr)).collect();
    let disrupted: BTreeSet<String> = rows
        .iter()
        .flat_map(|r| r.disrupted_nodes.iter().cloned())
        .collect();
    let disrupting = rows
        .iter()
        .filter(|r| !r.disrupted_nodes.is_empty())
        .count();
    let (window_open, next, window_error) = window_state(&spec.maintenance_windows, now);
    let ready = policy
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY))
        .map(|c| ConditionReport {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: timestamp(c.last_transition_time.0),
        });
    PolicyReport {
        name: policy.metadata.name.clone().unwrap_or_default(),
        generation: policy.metadata.generation.unwrap_or(0),
        observed_generation: policy.status.as_ref().and_then(|s| s.observed_generation),
        ready,
        namespace_selector: spec
            .selector
            .namespace_selector
            .as_ref()
            .map(selector_string),
        rollout_selector: spec.selector.rollout_selector.as_ref().map(selector_string),
        max_disrupted_nodes: spec.max_disrupted_nodes.as_ref().map(int_or_string),
        max_concurrent_rollouts: spec.max_concurrent_rollouts,
        maintenance_windows: spec
            .maintenance_windows
            .iter()
            .map(|w| WindowReport {
                days: w.days.iter().map(|d| d.as_str().to_string()).collect(),
                start: w.start.clone(),
                end: w.end.clone(),
                time_zone: w.time_zone.clone(),
            })
            .collect(),
        window_open,
        next_window: next.map(|z| z.to_string()),
        window_error,
        ordering,
        rollouts: rows,
        disrupted_nodes: disrupted.into_iter().collect(),
        disrupting_rollouts: disrupting,
    }
}

/// The report of every policy fetched, by name.
pub fn build(raw: &Raw, now: Timestamp) -> PoliciesReport {
    let mut policies: Vec<PolicyReport> = raw
        .policies
        .iter()
        .map(|p| policy_report(p, &raw.rollouts, raw.namespaces.as_deref(), now))
        .collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    PoliciesReport {
        policies,
        notes: raw.notes.clone(),
    }
}

/// The maintenance-window line: `open now`, `closed; the next opens ...`.
fn window_line(p: &PolicyReport, now: Timestamp) -> String {
    if let Some(e) = &p.window_error {
        return format!("cannot be evaluated: {e}");
    }
    if p.maintenance_windows.is_empty() {
        return "always (no maintenance windows)".into();
    }
    match (p.window_open, &p.next_window) {
        (Some(true), _) => "open now".into(),
        (_, Some(next)) => match next.parse::<Zoned>() {
            Ok(at) => format!(
                "closed; the next opens {} (in {})",
                zoned_short(&at),
                short_duration(at.timestamp().duration_since(now).as_secs())
            ),
            Err(_) => format!("closed; the next opens {next}"),
        },
        _ => "closed; none opens in the next week".into(),
    }
}

/// The summary: distinct nodes disrupted now against `maxDisruptedNodes`,
/// rollouts disrupting against `maxConcurrentRollouts`.
pub fn summary_line(p: &PolicyReport) -> String {
    let n = p.disrupted_nodes.len();
    let nodes = if n == 0 {
        "0 nodes".to_string()
    } else {
        format!(
            "{n} distinct node(s) ({})",
            list(&p.disrupted_nodes, NODES_SHOWN)
        )
    };
    let budget = match p.max_disrupted_nodes.as_deref() {
        None => " (no maxDisruptedNodes)".to_string(),
        Some(max) => {
            let full = match max.parse::<usize>() {
                Ok(m) if n > m => " (over budget)",
                Ok(m) if n == m => " (full)",
                Ok(_) => "",
                // A percentage of the governed agents' nodes, which only
                // the operator counts.
                Err(_) => " of the governed agents' nodes",
            };
            format!(" of maxDisruptedNodes {max}{full}")
        }
    };
    let rollouts = format!(
        "{} of {} rollout(s) disrupting",
        p.disrupting_rollouts,
        p.rollouts.len()
    );
    let concurrency = match p.max_concurrent_rollouts {
        None => String::new(),
        Some(c) => {
            let full = if p.disrupting_rollouts >= c.max(0) as usize {
                ", full"
            } else {
                ""
            };
            format!(" (maxConcurrentRollouts {c}{full})")
        }
    };
    format!("Disrupted now: {nodes}{budget}; {rollouts}{concurrency}")
}

/// One policy as text.
pub fn render_policy(p: &PolicyReport, now: Timestamp) -> String {
    let mut head = Table::new(&["", ""]);
    head.row(["Policy:".to_string(), p.name.clone()]);
    let ready = match &p.ready {
        Some(c) => format!(
            "{} ({}, {} ago): {}",
            c.status,
            c.reason,
            age(c.last_transition_time.parse().ok(), now),
            c.message
        ),
        None => "- (no status: the operator has not described it yet; does it run with --fleet-policies?)"
            .into(),
    };
    head.row(["Ready:".to_string(), ready]);
    let observed = p
        .observed_generation
        .map_or("-".to_string(), |g| g.to_string());
    head.row([
        "Generation:".to_string(),
        format!("{} (observed {observed})", p.generation),
    ]);
    let any = |s: &Option<String>| match s.as_deref() {
        None | Some("") => "(all)".to_string(),
        Some(s) => s.to_string(),
    };
    head.row([
        "Selector:".to_string(),
        format!(
            "namespaces {}; rollouts {}",
            any(&p.namespace_selector),
            any(&p.rollout_selector)
        ),
    ]);
    head.row([
        "Max disrupted nodes:".to_string(),
        p.max_disrupted_nodes
            .clone()
            .unwrap_or_else(|| "- (no fleet-wide limit)".into()),
    ]);
    head.row([
        "Max concurrent rollouts:".to_string(),
        p.max_concurrent_rollouts
            .map_or_else(|| "- (no limit)".into(), |c| c.to_string()),
    ]);
    if p.maintenance_windows.is_empty() {
        head.row(["Maintenance windows:".to_string(), "-".to_string()]);
    }
    for (i, w) in p.maintenance_windows.iter().enumerate() {
        let key = if i == 0 { "Maintenance windows:" } else { "" };
        head.row([key.to_string(), window_short(w)]);
    }
    head.row(["Window:".to_string(), window_line(p, now)]);
    if p.ordering.is_empty() {
        head.row(["Ordering:".to_string(), "-".to_string()]);
    }
    for (i, rule) in p.ordering.iter().enumerate() {
        let side = |selector: &str, matched: &[String]| {
            let selector = if selector.is_empty() {
                "(all)"
            } else {
                selector
            };
            if matched.is_empty() {
                format!("{selector} [none]")
            } else {
                format!("{selector} [{}]", list(matched, ROLLOUTS_SHOWN))
            }
        };
        let text = format!(
            "{} after {}",
            side(&rule.rollouts, &rule.matched),
            side(&rule.after.join(" | "), &rule.after_matched)
        );
        let key = if i == 0 { "Ordering:" } else { "" };
        head.row([key.to_string(), text]);
    }
    let mut out = String::new();
    // The header row of this two-column table is empty: drop that line.
    let rendered = head.render("");
    out.extend(rendered.lines().skip(1).map(|l| format!("{l}\n")));

    out.push_str(&format!(
        "\nGoverned SafeRollouts ({}):\n",
        p.rollouts.len()
    ));
    if p.rollouts.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["ROLLOUT", "PHASE", "WAITING", "DISRUPTED", "MESSAGE"]);
        for r in &p.rollouts {
            let disrupted = if r.disrupted_nodes.is_empty() {
                "0".to_string()
            } else {
                format!(
                    "{}: {}",
                    r.disrupted_nodes.len(),
                    list(&r.disrupted_nodes, NODES_SHOWN)
                )
            };
            t.row([
                format!("{}/{}", r.namespace, r.name),
                or_dash(r.phase.as_deref()),
                r.waiting
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |w| w.reason.clone()),
                disrupted,
                r.waiting
                    .as_ref()
                    .map_or_else(String::new, |w| truncate(&w.message, MESSAGE_WIDTH)),
            ]);
        }
        out.push_str(&t.render("  "));
    }
    out.push('\n');
    out.push_str(&summary_line(p));
    out.push('\n');
    out
}

/// The whole report as text: each policy, a blank line between them, then
/// the notes.
pub fn render_table(report: &PoliciesReport, now: Timestamp) -> String {
    let mut out = if report.policies.is_empty() {
        "No SafeRolloutPolicies found.\n".to_string()
    } else {
        report
            .policies
            .iter()
            .map(|p| render_policy(p, now))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if !report.notes.is_empty() {
        out.push_str("\nNotes:\n");
        for n in &report.notes {
            out.push_str(&format!("  - {n}\n"));
        }
    }
    out
}

/// Whether any policy needs the namespaces' labels.
pub fn needs_namespaces(policies: &[SafeRolloutPolicy]) -> bool {
    policies
        .iter()
        .any(|p| p.spec.selector.namespace_selector.is_some())
}

async fn fetch(kube: &Kube, name: Option<&str>) -> Result<Raw, CliError> {
    let client = &kube.client;
    let api: Api<SafeRolloutPolicy> = Api::all(client.clone());
    let policies = match name {
        Some(name) => vec![
            api.get(name)
                .await
                .map_err(|e| kube.error(e, &format!("SafeRolloutPolicy {name}")))?,
        ],
        None => {
            api.list(&ListParams::default())
                .await
                .map_err(|e| kube.error(e, "SafeRolloutPolicies"))?
                .items
        }
    };
    let mut raw = Raw {
        policies,
        ..Default::default()
    };
    if raw.policies.is_empty() {
        return Ok(raw);
    }
    raw.rollouts = Api::<SafeRollout>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| kube.error(e, "SafeRollouts in all namespaces"))?
        .items;
    if needs_namespaces(&raw.policies) {
        match Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => raw.namespaces = Some(list.items),
            Err(kube::Error::Api(status)) => {
                let reason = if status.message.is_empty() {
                    format!("HTTP {}", status.code)
                } else {
                    status.message.clone()
                };
                raw.notes.push(format!(
                    "namespaces could not be listed ({reason}): namespaceSelector was matched against the {NAMESPACE_NAME_LABEL} label only"
                ));
            }
            Err(e) => return Err(kube.error(e, "namespaces")),
        }
    }
    Ok(raw)
}

/// Runs `policy`.
pub async fn run(kube: &Kube, args: &PolicyArgs) -> Result<u8, CliError> {
    let raw = fetch(kube, args.name.as_deref()).await?;
    let now = Timestamp::now();
    let report = build(&raw, now);
    let text = match serialize(&report, args.output)? {
        Some(text) => text,
        None => render_table(&report, now),
    };
    emit(&text);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        Condition, LabelSelectorRequirement, ObjectMeta, Time,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::{
        OrderingRule, Phase, PolicySelector, SafeRolloutPolicySpec, SafeRolloutPolicyStatus,
        SafeRolloutSpec, SafeRolloutStatus,
    };

    use super::*;
    use crate::output::OutputFormat;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Wednesday, 13:00 in Paris.
    fn now() -> Timestamp {
        ts("2026-12-02T12:00:00Z")
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(key: &str, value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(&[(key, value)])),
            ..Default::default()
        }
    }

    fn namespace(name: &str, l: &[(&str, &str)]) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels(l)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(ts("2026-12-02T11:55:00Z")),
            observed_generation: Some(1),
        }
    }

    fn rollout(
        ns: &str,
        name: &str,
        agent: &str,
        phase: Phase,
        waiting: Option<(&str, &str)>,
        disrupted: &[&str],
    ) -> SafeRollout {
        let mut sr = SafeRollout::new(name, SafeRolloutSpec::for_daemonset(name));
        sr.metadata.namespace = Some(ns.into());
        sr.metadata.labels = Some(labels(&[("stack", "gpu"), ("agent", agent)]));
        let waiting = match waiting {
            Some((reason, message)) => condition(CONDITION_WAITING, "True", reason, message),
            None => condition(CONDITION_WAITING, "False", "NotHeld", ""),
        };
        sr.status = Some(SafeRolloutStatus {
            phase: Some(phase),
            disrupted_nodes: disrupted.iter().map(|n| n.to_string()).collect(),
            conditions: vec![waiting],
            ..Default::default()
        });
        sr
    }

    fn policy() -> SafeRolloutPolicy {
        let mut p = SafeRolloutPolicy::new(
            "gpu-node-stack",
            SafeRolloutPolicySpec {
                selector: PolicySelector {
                    namespace_selector: Some(selector("team", "ml")),
                    rollout_selector: Some(selector("stack", "gpu")),
                },
                max_disrupted_nodes: Some(IntOrString::Int(1)),
                max_concurrent_rollouts: Some(2),
                ordering: vec![
                    OrderingRule {
                        rollouts: selector("agent", "toolkit"),
                        after: vec![selector("agent", "driver")],
                    },
                    OrderingRule {
                        rollouts: selector("agent", "plugin"),
                        after: vec![selector("agent", "toolkit"), selector("agent", "driver")],
                    },
                ],
                maintenance_windows: vec![MaintenanceWindow {
                    days: vec![Weekday::Saturday, Weekday::Sunday],
                    start: "22:00".into(),
                    end: "04:00".into(),
                    time_zone: "Europe/Paris".into(),
                }],
            },
        );
        p.metadata.generation = Some(3);
        p.status = Some(SafeRolloutPolicyStatus {
            observed_generation: Some(3),
            conditions: vec![condition(
                CONDITION_READY,
                "True",
                "Applied",
                "governs 3 SafeRollout(s): gpu/driver, gpu/plugin, gpu/toolkit",
            )],
        });
        p
    }

    const BUDGET_MESSAGE: &str = "waiting for SafeRolloutPolicy gpu-node-stack: its maxDisruptedNodes (1) are all disrupted, by gpu/driver";

    /// Three governed rollouts in `gpu` (team=ml), one in `other` (not
    /// selected by namespace), one in `gpu` without the stack label, one
    /// being deleted.
    fn raw() -> Raw {
        let mut deleting = rollout("gpu", "old", "driver", Phase::Progressing, None, &["gpu-9"]);
        deleting.metadata.deletion_timestamp = Some(Time(ts("2026-12-02T11:00:00Z")));
        let mut unlabelled = rollout("gpu", "unrelated", "x", Phase::Succeeded, None, &[]);
        unlabelled.metadata.labels = None;
        Raw {
            policies: vec![policy()],
            rollouts: vec![
                rollout(
                    "gpu",
                    "plugin",
                    "plugin",
                    Phase::Progressing,
                    Some((
                        "FleetOrdering",
                        "waiting for SafeRolloutPolicy gpu-node-stack: on node gpu-1, gpu/toolkit has not passed its gates",
                    )),
                    &[],
                ),
                rollout(
                    "gpu",
                    "driver",
                    "driver",
                    Phase::Progressing,
                    None,
                    &["gpu-1"],
                ),
                rollout(
                    "gpu",
                    "toolkit",
                    "toolkit",
                    Phase::Progressing,
                    Some(("FleetBudgetFull", BUDGET_MESSAGE)),
                    &[],
                ),
                rollout(
                    "other",
                    "driver",
                    "driver",
                    Phase::Progressing,
                    None,
                    &["cpu-1"],
                ),
                unlabelled,
                deleting,
            ],
            namespaces: Some(vec![
                namespace("gpu", &[("team", "ml")]),
                namespace("other", &[("team", "web")]),
            ]),
            notes: Vec::new(),
        }
    }

    #[test]
    fn a_policy_governs_what_its_selectors_match() {
        let raw = raw();
        let r = build(&raw, now());
        let p = &r.policies[0];
        let names: Vec<String> = p
            .rollouts
            .iter()
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect();
        assert_eq!(names, ["gpu/driver", "gpu/plugin", "gpu/toolkit"]);
        assert_eq!(p.disrupted_nodes, ["gpu-1"]);
        assert_eq!(p.disrupting_rollouts, 1);
        assert_eq!(p.namespace_selector.as_deref(), Some("team=ml"));
        assert_eq!(p.rollouts[0].waiting, None);
        assert_eq!(
            p.rollouts[2].waiting.as_ref().map(|w| w.reason.as_str()),
            Some("FleetBudgetFull")
        );
        // Ordering: selectors and the governed rollouts they match.
        assert_eq!(p.ordering[1].rollouts, "agent=plugin");
        assert_eq!(p.ordering[1].after, ["agent=toolkit", "agent=driver"]);
        assert_eq!(p.ordering[1].matched, ["gpu/plugin"]);
        assert_eq!(p.ordering[1].after_matched, ["gpu/driver", "gpu/toolkit"]);

        // Without selectors, every rollout not being deleted.
        let mut all = policy();
        all.spec.selector = PolicySelector::default();
        assert_eq!(
            policy_report(&all, &raw.rollouts, None, now())
                .rollouts
                .len(),
            5
        );
        // An expression that does not parse selects nothing.
        all.spec.selector.rollout_selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "agent".into(),
                operator: "Bogus".into(),
                values: None,
            }]),
            ..Default::default()
        });
        let p = policy_report(&all, &raw.rollouts, None, now());
        assert!(p.rollouts.is_empty());
        assert!(p.rollout_selector.unwrap().starts_with("<invalid"));
    }

    #[test]
    fn unreadable_namespaces_fall_back_to_the_name_label() {
        let mut raw = raw();
        raw.namespaces = None;
        let mut p = policy();
        p.spec.selector.namespace_selector = Some(selector(NAMESPACE_NAME_LABEL, "other"));
        let r = policy_report(&p, &raw.rollouts, None, now());
        assert_eq!(r.rollouts.len(), 1);
        assert_eq!(r.rollouts[0].namespace, "other");
        assert!(needs_namespaces(&[p]));
        assert!(!needs_namespaces(&[SafeRolloutPolicy::new(
            "x",
            SafeRolloutPolicySpec {
                selector: PolicySelector::default(),
                max_disrupted_nodes: None,
                max_concurrent_rollouts: None,
                ordering: vec![],
                maintenance_windows: vec![],
            }
        )]));
    }

    #[test]
    fn the_table_shows_limits_windows_ordering_rollouts_and_the_budget() {
        let text = render_table(&build(&raw(), now()), now());
        let want = "\
Policy:                    gpu-node-stack
Ready:                     True (Applied, 5m ago): governs 3 SafeRollout(s): gpu/driver, gpu/plugin, gpu/toolkit
Generation:                3 (observed 3)
Selector:                  namespaces team=ml; rollouts stack=gpu
Max disrupted nodes:       1
Max concurrent rollouts:   2
Maintenance windows:       Sat,Sun 22:00-04:00 Europe/Paris
Window:                    closed; the next opens Saturday 2026-12-05 22:00 CET (+01:00) (in 3d9h)
Ordering:                  agent=toolkit [gpu/toolkit] after agent=driver [gpu/driver]
                           agent=plugin [gpu/plugin] after agent=toolkit | agent=driver [gpu/driver, gpu/toolkit]

Governed SafeRollouts (3):
  ROLLOUT       PHASE         WAITING           DISRUPTED   MESSAGE
  gpu/driver    Progressing   -                 1: gpu-1
  gpu/plugin    Progressing   FleetOrdering     0           waiting for SafeRolloutPolicy gpu-node-stack: on node gpu-1, gpu/toolkit has not passed...
  gpu/toolkit   Progressing   FleetBudgetFull   0           waiting for SafeRolloutPolicy gpu-node-stack: its maxDisruptedNodes (1) are all disrupt...

Disrupted now: 1 distinct node(s) (gpu-1) of maxDisruptedNodes 1 (full); 1 of 3 rollout(s) disrupting (maxConcurrentRollouts 2)
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn json_has_the_documented_shape_and_full_messages() {
        let text = serialize(&build(&raw(), now()), OutputFormat::Json)
            .unwrap()
            .unwrap();
        let got: serde_json::Value = serde_json::from_str(&text).unwrap();
        let p = &got["policies"][0];
        assert_eq!(p["name"], "gpu-node-stack");
        assert_eq!(p["ready"]["status"], "True");
        assert_eq!(p["ready"]["reason"], "Applied");
        assert_eq!(p["ready"]["lastTransitionTime"], "2026-12-02T11:55:00Z");
        assert_eq!(p["maxDisruptedNodes"], "1");
        assert_eq!(p["maxConcurrentRollouts"], 2);
        assert_eq!(p["windowOpen"], false);
        assert_eq!(p["nextWindow"], "2026-12-05T22:00:00+01:00[Europe/Paris]");
        assert_eq!(p["windowError"], serde_json::Value::Null);
        assert_eq!(
            p["maintenanceWindows"][0],
            serde_json::json!({"days": ["Saturday", "Sunday"], "start": "22:00", "end": "04:00",
                "timeZone": "Europe/Paris"})
        );
        assert_eq!(p["disruptedNodes"], serde_json::json!(["gpu-1"]));
        assert_eq!(p["disruptingRollouts"], 1);
        assert_eq!(
            p["rollouts"][0],
            serde_json::json!({"namespace": "gpu", "name": "driver", "phase": "Progressing",
                "waiting": null, "disruptedNodes": ["gpu-1"]})
        );
        assert_eq!(
            p["rollouts"][2]["waiting"],
            serde_json::json!({"reason": "FleetBudgetFull", "message": BUDGET_MESSAGE,
                "since": "2026-12-02T11:55:00Z"})
        );
        assert_eq!(got["notes"], serde_json::json!([]));
        // YAML: the same fields.
        let yaml = serialize(&build(&raw(), now()), OutputFormat::Yaml)
            .unwrap()
            .unwrap();
        let parsed: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(parsed, got);
    }

    #[test]
    fn an_open_window_no_limits_and_no_status() {
        let mut p = policy();
        p.status = None;
        p.spec.max_disrupted_nodes = Some(IntOrString::String("10%".into()));
        p.spec.max_concurrent_rollouts = None;
        p.spec.ordering.clear();
        // Saturday 23:00 in Paris.
        let sat = ts("2026-12-05T22:00:00Z");
        let r = policy_report(&p, &raw().rollouts, raw().namespaces.as_deref(), sat);
        assert_eq!(r.window_open, Some(true));
        assert_eq!(r.next_window, None);
        let text = render_policy(&r, sat);
        for want in [
            "Ready:                     - (no status: the operator has not described it yet",
            "Generation:                3 (observed -)",
            "Max concurrent rollouts:   - (no limit)",
            "Window:                    open now",
            "Ordering:                  -",
            "of maxDisruptedNodes 10% of the governed agents' nodes; 1 of 3 rollout(s) disrupting\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }

        p.spec.maintenance_windows.clear();
        p.spec.max_disrupted_nodes = None;
        let r = policy_report(&p, &[], None, sat);
        assert_eq!(r.window_open, Some(true));
        let text = render_policy(&r, sat);
        for want in [
            "Maintenance windows:       -",
            "Window:                    always (no maintenance windows)",
            "Governed SafeRollouts (0):\n  <none>\n",
            "Disrupted now: 0 nodes (no maxDisruptedNodes); 0 of 0 rollout(s) disrupting\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn an_invalid_policy_says_why() {
        let mut p = policy();
        p.spec.maintenance_windows[0].time_zone = "Mars/Olympus_Mons".into();
        p.status = Some(SafeRolloutPolicyStatus {
            observed_generation: Some(3),
            conditions: vec![condition(
                CONDITION_READY,
                "False",
                "InvalidPolicy",
                "maintenanceWindows[0].timeZone: \"Mars/Olympus_Mons\" is not a time zone the operator knows; the rollouts it governs replace nothing until it is fixed",
            )],
        });
        let mut raw = raw();
        raw.policies = vec![p];
        raw.notes
            .push("namespaces could not be listed (forbidden)".into());
        let report = build(&raw, now());
        assert_eq!(report.policies[0].window_open, None);
        let text = render_table(&report, now());
        for want in [
            "Ready:                     False (InvalidPolicy, 5m ago): maintenanceWindows[0].timeZone",
            "Window:                    cannot be evaluated: maintenanceWindows[0].timeZone: \"Mars/Olympus_Mons\"",
            "\nNotes:\n  - namespaces could not be listed (forbidden)\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn several_policies_sort_by_name_and_none_is_said() {
        let mut b = policy();
        b.metadata.name = Some("b".into());
        let mut a = policy();
        a.metadata.name = Some("a".into());
        let raw = Raw {
            policies: vec![b, a],
            ..Default::default()
        };
        let r = build(&raw, now());
        let names: Vec<&str> = r.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let text = render_table(&r, now());
        assert!(
            text.contains("rollout(s) disrupting (maxConcurrentRollouts 2)\n\nPolicy:"),
            "{text}"
        );
        assert_eq!(
            render_table(&build(&Raw::default(), now()), now()),
            "No SafeRolloutPolicies found.\n"
        );
    }

    #[test]
    fn budget_summary_says_full_and_over() {
        let mut r = policy_report(
            &policy(),
            &raw().rollouts,
            raw().namespaces.as_deref(),
            now(),
        );
        r.disrupted_nodes = (1..=5).map(|i| format!("n{i}")).collect();
        r.disrupting_rollouts = 2;
        assert_eq!(
            summary_line(&r),
            "Disrupted now: 5 distinct node(s) (n1, n2, n3 (+2 more)) of maxDisruptedNodes 1 (over budget); 2 of 3 rollout(s) disrupting (maxConcurrentRollouts 2, full)"
        );
    }

    #[test]
    fn days_in_short_form() {
        use Weekday::*;
        assert_eq!(days_short(&[Saturday, Sunday]), "Sat,Sun");
        assert_eq!(
            days_short(&[Friday, Monday, Tuesday, Wednesday, Thursday]),
            "Mon-Fri"
        );
        assert_eq!(days_short(&Weekday::ALL), "daily");
        assert_eq!(
            days_short(&[Monday, Wednesday, Thursday, Friday, Sunday]),
            "Mon,Wed-Fri,Sun"
        );
        assert_eq!(
            window_short(&WindowReport {
                days: vec!["Friday".into()],
                start: "22:00".into(),
                end: "02:00".into(),
                time_zone: "UTC".into(),
            }),
            "Fri 22:00-02:00 UTC"
        );
        let at: Zoned = "2026-12-05T22:00:00+01:00[Europe/Paris]".parse().unwrap();
        assert_eq!(zoned_short(&at), "Saturday 2026-12-05 22:00 CET (+01:00)");
    }
}
