//! The `SafeRolloutPolicy` custom resource (`saferollout.dev/v1alpha1`,
//! cluster-scoped): rules shared by every SafeRollout it selects, for a
//! node that runs several agents (driver, container toolkit, device plugin,
//! DRA driver), each with its own SafeRollout. One disruption budget across
//! all of them (`maxDisruptedNodes`, `maxConcurrentRollouts`), an order
//! between them on each node (`ordering`) and the hours they may start
//! stages in (`maintenanceWindows`). Its types, its CEL rules and the
//! messages those rules give, and its client-side validation.
//!
//! The decisions themselves are `saferollout_core::fleet`;
//! docs/design/fleet-policies.md describes the whole.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::schema::{self, add_rules, count_or_percent_rule, int_or_string, rule};
use crate::validate::{Errors, FieldError, Validate, is_count_or_percent};

/// Most ordering rules a policy holds.
pub const MAX_ORDERING_RULES: usize = 16;
/// Most selectors in one ordering rule's `after`.
pub const MAX_AFTER_SELECTORS: usize = 8;
/// Most maintenance windows a policy holds.
pub const MAX_WINDOWS: usize = 16;
/// Longest `timeZone` accepted (the longest IANA name is about 32 bytes).
pub const TIME_ZONE_MAX_LENGTH: usize = 64;

/// `HH:MM`, 00:00 to 23:59, as RE2 without backslashes.
pub const TIME_OF_DAY_REGEX: &str = "^([01][0-9]|2[0-3]):[0-5][0-9]$";
/// The characters of an IANA time zone name (`Europe/Paris`, `UTC`,
/// `Etc/GMT+5`, `America/Argentina/Buenos_Aires`): what CEL can check. The
/// API server cannot tell whether the zone exists; the client-side
/// validator and the operator look it up.
pub const TIME_ZONE_REGEX: &str = "^[A-Za-z][-A-Za-z0-9_+]*(/[-A-Za-z0-9_+]+)*$";

/// Message of the rule on `spec.maxDisruptedNodes`.
pub const MSG_MAX_DISRUPTED_NODES: &str = "maxDisruptedNodes must be a positive node count or a percentage between 1% and 100% of the selected agents' nodes (e.g. 1, \"10%\")";
/// Message of the rule on `spec.maxConcurrentRollouts`.
pub const MSG_MAX_CONCURRENT_ROLLOUTS: &str = "maxConcurrentRollouts must be at least 1";
/// Message of the rule on a window's `start`.
pub const MSG_WINDOW_START: &str =
    "maintenanceWindows[].start must be a time of day HH:MM between 00:00 and 23:59";
/// Message of the rule on a window's `end`.
pub const MSG_WINDOW_END: &str =
    "maintenanceWindows[].end must be a time of day HH:MM between 00:00 and 23:59";
/// Message of the rule that a window's `end` differs from its `start`.
pub const MSG_WINDOW_EMPTY: &str = "maintenanceWindows[].end must differ from start: an end earlier than start crosses midnight, an equal one would be an empty (or ambiguous all-day) window";
/// Message of the rule on a window's `timeZone` (its characters).
pub const MSG_TIME_ZONE: &str = "maintenanceWindows[].timeZone must be an IANA time zone name such as Europe/Paris, America/New_York or UTC";
/// Message of the client-side check that a window's `timeZone` exists.
pub const MSG_TIME_ZONE_UNKNOWN: &str =
    "maintenanceWindows[].timeZone names no time zone in the IANA time zone database";

/// SafeRolloutPolicySpec: rules shared by the SafeRollouts it selects (the
/// agents of one node stack), across namespaces.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "saferollout.dev",
    version = "v1alpha1",
    kind = "SafeRolloutPolicy",
    plural = "saferolloutpolicies",
    singular = "saferolloutpolicy",
    shortname = "srp",
    status = "SafeRolloutPolicyStatus",
    derive = "PartialEq",
    doc = "SafeRolloutPolicy governs several SafeRollouts together: one budget of disrupted nodes across all of them, an order between their agents on each node, and maintenance windows.",
    printcolumn = r#"{"name": "MaxDisrupted", "type": "string", "jsonPath": ".spec.maxDisruptedNodes"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SafeRolloutPolicySpec {
    /// The SafeRollouts this policy governs: those in a namespace matching
    /// `namespaceSelector` whose labels match `rolloutSelector`. `{}`
    /// selects every SafeRollout in the cluster.
    pub selector: PolicySelector,

    /// Across every governed rollout, at most this many nodes have any
    /// agent being replaced, reverted or failing at once: a count (at
    /// least 1) or a percentage of the nodes the governed agents run on
    /// (rounded down, at least 1). A node already disrupted by one rollout
    /// is free for the others, and preferred: a node's agents are replaced
    /// together. Without it each rollout keeps only its own
    /// `maxUnavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_disrupted_nodes_schema")]
    pub max_disrupted_nodes: Option<IntOrString>,

    /// At most this many governed rollouts replace agents at once; the
    /// others wait, with a condition naming the rollouts that hold the
    /// slots. Without it any number may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "max_concurrent_rollouts_schema")]
    pub max_concurrent_rollouts: Option<i32>,

    /// The order of agents on each node: a rollout matching `rollouts`
    /// replaces its agent on a node only once every rollout matching one of
    /// `after` has passed its gates on that node (the driver, then the
    /// container toolkit, then the device plugin). A cycle between rules
    /// stops the rollouts in it with a condition; it is never waited on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ordering: Vec<OrderingRule>,

    /// When governed rollouts may start a stage: inside any of these
    /// windows. A node in progress finishes outside a window, then the
    /// rollout waits; a revert is never held. Without windows, always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub maintenance_windows: Vec<MaintenanceWindow>,
}

/// Which SafeRollouts a policy governs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySelector {
    /// Namespaces whose SafeRollouts are governed; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Labels of the governed SafeRollouts; absent: every SafeRollout in the
    /// selected namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_selector: Option<LabelSelector>,
}

/// One ordering rule: `rollouts` go after `after` on each node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderingRule {
    /// The dependent SafeRollouts (matched by label among the governed
    /// ones), e.g. the device plugin's.
    pub rollouts: LabelSelector,
    /// The SafeRollouts that must have passed their gates on a node before a
    /// dependent one replaces its agent there, e.g. the driver's.
    #[schemars(length(min = 1, max = 8))]
    pub after: Vec<LabelSelector>,
}

/// A day of the week.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    pub const ALL: [Weekday; 7] = [
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
        Weekday::Sunday,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Weekday::Monday => "Monday",
            Weekday::Tuesday => "Tuesday",
            Weekday::Wednesday => "Wednesday",
            Weekday::Thursday => "Thursday",
            Weekday::Friday => "Friday",
            Weekday::Saturday => "Saturday",
            Weekday::Sunday => "Sunday",
        }
    }
}

/// A weekly maintenance window: on each of `days`, from `start` to `end`,
/// local time in `timeZone`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = window_rules)]
pub struct MaintenanceWindow {
    /// The days the window opens on (each at most once). A window crossing
    /// midnight belongs to the day it opens on: `Friday 22:00-02:00` ends
    /// on Saturday.
    #[schemars(length(min = 1, max = 7), transform = schema::list_set)]
    pub days: Vec<Weekday>,
    /// When it opens, `HH:MM` (24-hour clock) local time.
    #[schemars(schema_with = "window_start_schema")]
    pub start: String,
    /// When it closes, `HH:MM` local time. Earlier than `start`: the window
    /// crosses midnight. Equal to `start` is refused.
    #[schemars(schema_with = "window_end_schema")]
    pub end: String,
    /// The IANA time zone of `start` and `end` (`Europe/Paris`,
    /// `America/New_York`, `UTC`). Daylight-saving changes are followed:
    /// a local time a change skips is moved forward by the gap (02:30 on
    /// the spring-forward night is 03:30), one it repeats is its first
    /// occurrence.
    #[schemars(schema_with = "time_zone_schema")]
    pub time_zone: String,
}

impl MaintenanceWindow {
    /// `start` as (hour, minute), if well-formed.
    pub fn start_time(&self) -> Option<(i8, i8)> {
        parse_time_of_day(&self.start)
    }

    /// `end` as (hour, minute), if well-formed.
    pub fn end_time(&self) -> Option<(i8, i8)> {
        parse_time_of_day(&self.end)
    }
}

/// `HH:MM` (00:00..23:59, two digits each) as (hour, minute): the set
/// [`TIME_OF_DAY_REGEX`] accepts.
pub fn parse_time_of_day(s: &str) -> Option<(i8, i8)> {
    let b = s.as_bytes();
    if b.len() != 5 || b[2] != b':' || ![0, 1, 3, 4].iter().all(|&i| b[i].is_ascii_digit()) {
        return None;
    }
    let hour = ((b[0] - b'0') * 10 + (b[1] - b'0')) as i8;
    let minute = ((b[3] - b'0') * 10 + (b[4] - b'0')) as i8;
    (hour < 24 && minute < 60).then_some((hour, minute))
}

/// Whether `s` has the characters of an IANA zone name ([`TIME_ZONE_REGEX`]).
pub fn is_time_zone_name(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'+');
    !s.is_empty()
        && s.as_bytes()[0].is_ascii_alphabetic()
        && s.split('/')
            .all(|part| !part.is_empty() && part.bytes().all(ok))
}

/// What the operator writes on a policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SafeRolloutPolicyStatus {
    /// The generation of the spec the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready (the policy is valid and applied) and, when a rule cannot be
    /// kept, why (an ordering cycle, an unknown time zone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = schema::list_map_by_type)]
    pub conditions: Vec<Condition>,
}

// ---------------------------------------------------------------------------
// Schemas

fn max_disrupted_nodes_schema(_: &mut SchemaGenerator) -> Schema {
    int_or_string(vec![rule(
        &count_or_percent_rule(),
        MSG_MAX_DISRUPTED_NODES,
    )])
}

fn max_concurrent_rollouts_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "int32",
        "x-kubernetes-validations": [rule("self >= 1", MSG_MAX_CONCURRENT_ROLLOUTS)],
    })
}

fn time_of_day(message: &str) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 5,
        "x-kubernetes-validations": [rule(&format!("self.matches('{TIME_OF_DAY_REGEX}')"), message)],
    })
}

fn window_start_schema(_: &mut SchemaGenerator) -> Schema {
    time_of_day(MSG_WINDOW_START)
}

fn window_end_schema(_: &mut SchemaGenerator) -> Schema {
    time_of_day(MSG_WINDOW_END)
}

fn time_zone_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": TIME_ZONE_MAX_LENGTH,
        "x-kubernetes-validations": [rule(&format!("self.matches('{TIME_ZONE_REGEX}')"), MSG_TIME_ZONE)],
    })
}

/// The rule reading a window's `start` and `end` together.
fn window_rules(s: &mut Schema) {
    add_rules(
        s,
        json!([{
            "rule": "self.start != self.end",
            "message": MSG_WINDOW_EMPTY,
            "fieldPath": ".end",
        }]),
    );
}

// ---------------------------------------------------------------------------
// Client-side validation (mirrors the schema; see crate::validate)

impl SafeRolloutPolicy {
    /// Validates the spec as the API server would, plus that each window's
    /// time zone exists (which the server cannot check); empty when valid.
    pub fn validate(&self) -> Vec<FieldError> {
        self.spec.validate()
    }
}

impl SafeRolloutPolicySpec {
    /// Validates the spec (paths start with `spec.`); empty when valid.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Errors::new();
        Validate::validate(self, "spec", &mut errors);
        errors.into_vec()
    }
}

impl Validate for SafeRolloutPolicySpec {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if let Some(max) = &self.max_disrupted_nodes
            && !is_count_or_percent(max)
        {
            errors.push(format!("{path}.maxDisruptedNodes"), MSG_MAX_DISRUPTED_NODES);
        }
        if let Some(n) = self.max_concurrent_rollouts
            && n < 1
        {
            errors.push(
                format!("{path}.maxConcurrentRollouts"),
                MSG_MAX_CONCURRENT_ROLLOUTS,
            );
        }
        let at = format!("{path}.ordering");
        errors.check_max_items(&at, self.ordering.len(), MAX_ORDERING_RULES);
        for (i, r) in self.ordering.iter().enumerate() {
            r.validate(&format!("{at}[{i}]"), errors);
        }
        let at = format!("{path}.maintenanceWindows");
        errors.check_max_items(&at, self.maintenance_windows.len(), MAX_WINDOWS);
        for (i, w) in self.maintenance_windows.iter().enumerate() {
            w.validate(&format!("{at}[{i}]"), errors);
        }
    }
}

impl Validate for OrderingRule {
    fn validate(&self, path: &str, errors: &mut Errors) {
        let at = format!("{path}.after");
        if self.after.is_empty() {
            errors.push(&at, "should have at least 1 items");
        }
        errors.check_max_items(&at, self.after.len(), MAX_AFTER_SELECTORS);
    }
}

impl Validate for MaintenanceWindow {
    fn validate(&self, path: &str, errors: &mut Errors) {
        let at = format!("{path}.days");
        if self.days.is_empty() {
            errors.push(&at, "should have at least 1 items");
        }
        errors.check_max_items(&at, self.days.len(), 7);
        for (i, d) in self.days.iter().enumerate() {
            if self.days[..i].contains(d) {
                errors.push(
                    format!("{at}[{i}]"),
                    format!("Duplicate value: {:?}", d.as_str()),
                );
            }
        }
        let start = self.start_time();
        let end = self.end_time();
        if start.is_none() {
            errors.push(format!("{path}.start"), MSG_WINDOW_START);
        }
        if end.is_none() {
            errors.push(format!("{path}.end"), MSG_WINDOW_END);
        }
        if self.start == self.end {
            errors.push(format!("{path}.end"), MSG_WINDOW_EMPTY);
        }
        let at = format!("{path}.timeZone");
        if self.time_zone.len() > TIME_ZONE_MAX_LENGTH {
            errors.push(
                at,
                format!("Too long: may not be more than {TIME_ZONE_MAX_LENGTH} bytes"),
            );
        } else if !is_time_zone_name(&self.time_zone) {
            errors.push(at, MSG_TIME_ZONE);
        } else if jiff::tz::db().get(&self.time_zone).is_err() {
            // Beyond the schema: the API server cannot look a zone up.
            errors.push(at, MSG_TIME_ZONE_UNKNOWN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[Weekday], start: &str, end: &str, tz: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            end: end.into(),
            time_zone: tz.into(),
        }
    }

    fn selector(key: &str, value: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([(key.to_string(), value.to_string())].into()),
            ..Default::default()
        }
    }

    fn good_spec() -> SafeRolloutPolicySpec {
        SafeRolloutPolicySpec {
            selector: PolicySelector::default(),
            max_disrupted_nodes: Some(IntOrString::String("10%".into())),
            max_concurrent_rollouts: Some(2),
            ordering: vec![OrderingRule {
                rollouts: selector("agent", "plugin"),
                after: vec![selector("agent", "driver")],
            }],
            maintenance_windows: vec![window(
                &[Weekday::Saturday, Weekday::Sunday],
                "22:00",
                "04:00",
                "Europe/Paris",
            )],
        }
    }

    #[test]
    fn a_good_policy_is_valid_and_a_bad_one_names_every_field() {
        let mut spec = good_spec();
        assert_eq!(spec.validate(), vec![]);

        spec.max_disrupted_nodes = Some(IntOrString::String("0%".into()));
        spec.max_concurrent_rollouts = Some(0);
        spec.ordering[0].after.clear();
        spec.maintenance_windows.push(window(
            &[Weekday::Monday, Weekday::Monday],
            "24:00",
            "7:00",
            "Mars/Olympus_Mons",
        ));
        spec.maintenance_windows
            .push(window(&[], "10:00", "10:00", "Europe Paris"));
        let paths: Vec<String> = spec.validate().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "spec.maxDisruptedNodes",
                "spec.maxConcurrentRollouts",
                "spec.ordering[0].after",
                "spec.maintenanceWindows[1].days[1]",
                "spec.maintenanceWindows[1].start",
                "spec.maintenanceWindows[1].end",
                "spec.maintenanceWindows[1].timeZone",
                "spec.maintenanceWindows[2].days",
                "spec.maintenanceWindows[2].end",
                "spec.maintenanceWindows[2].timeZone",
            ]
        );
    }

    #[test]
    fn an_unknown_zone_is_named_as_unknown_and_a_malformed_one_as_malformed() {
        let mut w = window(&[Weekday::Friday], "22:00", "02:00", "Mars/Olympus_Mons");
        let mut errors = Errors::new();
        w.validate("w", &mut errors);
        assert_eq!(errors.into_vec()[0].message, MSG_TIME_ZONE_UNKNOWN);
        w.time_zone = "Europe/../Paris".into();
        let mut errors = Errors::new();
        w.validate("w", &mut errors);
        assert_eq!(errors.into_vec()[0].message, MSG_TIME_ZONE);
        for known in ["UTC", "Europe/Paris", "America/New_York", "Etc/GMT+5"] {
            w.time_zone = known.into();
            let mut errors = Errors::new();
            w.validate("w", &mut errors);
            assert!(errors.is_empty(), "{known}: {errors:?}");
        }
    }

    #[test]
    fn time_of_day_parses_exactly_what_the_regex_accepts() {
        let re = regex::Regex::new(TIME_OF_DAY_REGEX).unwrap();
        for s in [
            "00:00", "23:59", "09:05", "24:00", "23:60", "7:00", "07:0", "0700", "07:00 ", "+7:00",
            "ab:cd", "12-30", "",
        ] {
            assert_eq!(parse_time_of_day(s).is_some(), re.is_match(s), "{s:?}");
        }
        assert_eq!(parse_time_of_day("22:30"), Some((22, 30)));
    }

    #[test]
    fn time_zone_charset_matches_the_regex() {
        let re = regex::Regex::new(TIME_ZONE_REGEX).unwrap();
        for s in [
            "UTC",
            "Europe/Paris",
            "Etc/GMT+5",
            "Etc/GMT-14",
            "America/Argentina/Buenos_Aires",
            "",
            "/UTC",
            "UTC/",
            "Europe//Paris",
            "Europe/Paris ",
            "1UTC",
            "Europe/../Paris",
        ] {
            assert_eq!(is_time_zone_name(s), re.is_match(s), "{s:?}");
        }
    }

    #[test]
    fn a_policy_round_trips_through_yaml() {
        let yaml = r#"
apiVersion: saferollout.dev/v1alpha1
kind: SafeRolloutPolicy
metadata: {name: gpu-node-stack}
spec:
  selector:
    rolloutSelector: {matchLabels: {saferollout.dev/stack: gpu}}
  maxDisruptedNodes: 1
  maxConcurrentRollouts: 3
  ordering:
  - rollouts: {matchLabels: {agent: toolkit}}
    after: [{matchLabels: {agent: driver}}]
  maintenanceWindows:
  - {days: [Saturday, Sunday], start: "22:00", end: "04:00", timeZone: Europe/Paris}
"#;
        let p: SafeRolloutPolicy = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(p.spec.max_disrupted_nodes, Some(IntOrString::Int(1)));
        assert_eq!(p.spec.maintenance_windows[0].start_time(), Some((22, 0)));
        assert_eq!(p.validate(), vec![]);
        let back: SafeRolloutPolicy =
            serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
