//! Client-side validation mirroring the CRD schema: the same checks as the
//! OpenAPI constraints and CEL rules the API server applies, with the same
//! field paths and messages. Used to lint a manifest without a cluster and by
//! the operator as a second line of defence. The API server stays the
//! authority; a test keeps the two in step on `tests/malformed/`.
//!
//! One difference: a duration too large to represent is an error here, while
//! the server's regex accepts it.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::consts::{BASELINE, CAPACITY_LABEL_PREFIX};
use crate::duration::{DURATION_MAX_LENGTH, DurationString, parse_duration};
use crate::intstr::parse_percent;
use crate::schema::{
    MAX_ALLOCATABLE, MAX_STAGES, MSG_MAX, MSG_MAX_UNAVAILABLE, MSG_MIN, MSG_MIN_ABOVE_MAX,
    MSG_RESOURCE, MSG_STAGE_NODES, MSG_TARGET_NAME, duration_message, positive_message,
};
use crate::spec::{SafeRollout, SafeRolloutSpec};

/// One validation failure: the field path as the API server writes it
/// (`spec.stages[0].nodes`) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

impl SafeRollout {
    /// Validates the spec as the API server would; empty when valid.
    pub fn validate(&self) -> Vec<FieldError> {
        self.spec.validate()
    }
}

impl SafeRolloutSpec {
    /// Validates the spec as the API server would (paths start with `spec.`);
    /// empty when valid.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut e = Errors(Vec::new());
        let name = &self.target_ref.name;
        if name.len() > 253 {
            e.push(
                "spec.targetRef.name",
                "Too long: may not be more than 253 bytes",
            );
        } else if !is_dns1123_subdomain(name) {
            e.push("spec.targetRef.name", MSG_TARGET_NAME);
        }

        if let Some(stages) = &self.stages {
            if stages.is_empty() {
                e.push("spec.stages", "should have at least 1 items");
            }
            if let Some(m) = too_many(stages.len(), MAX_STAGES as usize) {
                e.push("spec.stages", m);
            }
            for (i, stage) in stages.iter().enumerate() {
                if !is_count_or_percent(&stage.nodes) {
                    e.push(format!("spec.stages[{i}].nodes"), MSG_STAGE_NODES);
                }
                duration(
                    &mut e,
                    &format!("spec.stages[{i}].soak"),
                    "stages[].soak",
                    &stage.soak,
                    false,
                );
            }
        }

        if !is_count_or_percent(&self.max_unavailable) {
            e.push("spec.maxUnavailable", MSG_MAX_UNAVAILABLE);
        }
        duration(
            &mut e,
            "spec.progressDeadline",
            "progressDeadline",
            &self.progress_deadline,
            true,
        );

        if let Some(gates) = &self.gates {
            if let Some(timeout) = gates.pods_ready.as_ref().and_then(|p| p.timeout.as_ref()) {
                duration(
                    &mut e,
                    "spec.gates.podsReady.timeout",
                    "gates.podsReady.timeout",
                    timeout,
                    true,
                );
            }
            if let Some(m) = too_many(gates.allocatable.len(), MAX_ALLOCATABLE as usize) {
                e.push("spec.gates.allocatable", m);
            }
            let mut seen = BTreeSet::new();
            for (i, gate) in gates.allocatable.iter().enumerate() {
                let path = format!("spec.gates.allocatable[{i}]");
                if !seen.insert(gate.resource.as_str()) {
                    e.push(
                        &path,
                        format!("Duplicate value: resource {:?}", gate.resource),
                    );
                }
                if gate.resource.len() > 317 {
                    e.push(
                        format!("{path}.resource"),
                        "Too long: may not be more than 317 bytes",
                    );
                } else if !is_extended_resource_name(&gate.resource) {
                    e.push(format!("{path}.resource"), MSG_RESOURCE);
                }
                if !is_bound(&gate.min, false) {
                    e.push(format!("{path}.min"), MSG_MIN);
                }
                if !is_bound(&gate.max, true) {
                    e.push(format!("{path}.max"), MSG_MAX);
                }
                if let (IntOrString::Int(min), IntOrString::Int(max)) = (&gate.min, &gate.max)
                    && min > max
                {
                    e.push(format!("{path}.min"), MSG_MIN_ABOVE_MAX);
                }
                duration(
                    &mut e,
                    &format!("{path}.soak"),
                    "gates.allocatable[].soak",
                    &gate.soak,
                    false,
                );
            }
            crate::proof::validate(gates, &mut |path, message| e.push(path, message));
        }
        crate::devices::validate(self, &mut |path, message| e.push(path, message));
        e.0
    }
}

/// [`duration`] for validators outside this module.
/// The API server's complaint about a list longer than `max`, if it is.
pub(crate) fn too_many(len: usize, max: usize) -> Option<String> {
    (len > max).then(|| format!("Too many: {len}: must have at most {max} items"))
}

pub(crate) fn check_duration(
    push: crate::proof::Push,
    path: &str,
    field: &str,
    value: &DurationString,
    positive: bool,
) {
    let mut e = Errors(Vec::new());
    duration(&mut e, path, field, value, positive);
    for f in e.0 {
        push(f.path, f.message);
    }
}

fn duration(e: &mut Errors, path: &str, field: &str, value: &DurationString, positive: bool) {
    if let Some(message) = duration_error(field, value, positive) {
        e.push(path, message);
    }
}

/// The schema's complaint about a duration field, if any.
pub(crate) fn duration_error(
    field: &str,
    value: &DurationString,
    positive: bool,
) -> Option<String> {
    let s = value.as_str();
    if s.len() > DURATION_MAX_LENGTH as usize {
        Some(format!(
            "Too long: may not be more than {DURATION_MAX_LENGTH} bytes"
        ))
    } else if parse_duration(s).is_err() {
        Some(duration_message(field))
    } else if positive && !s.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        Some(positive_message(field))
    } else {
        None
    }
}

/// `stages[].nodes` / `maxUnavailable`: an integer >= 1 or "1%".."100%".
fn is_count_or_percent(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n >= 1,
        IntOrString::String(s) => parse_percent(s).is_some(),
    }
}

/// `min` (and `max` with `allow_label`): "baseline", an integer >= 0, or
/// "capacityLabel:<key>" with a non-empty key of at most 317 characters.
fn is_bound(v: &IntOrString, allow_label: bool) -> bool {
    match v {
        IntOrString::Int(n) => *n >= 0,
        IntOrString::String(s) if s == BASELINE => true,
        IntOrString::String(s) => {
            allow_label
                && s.starts_with(CAPACITY_LABEL_PREFIX)
                && s.len() > CAPACITY_LABEL_PREFIX.len()
                && s.len() <= 331
        }
    }
}

/// One DNS-1123 label as the schema's regex sees it (no length limit).
fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// [`crate::schema::DNS1123_SUBDOMAIN_REGEX`].
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(is_label)
}

/// [`crate::schema::EXTENDED_RESOURCE_REGEX`] plus the rule's exclusions of
/// `kubernetes.io/` names and the `requests.` prefix.
pub fn is_extended_resource_name(s: &str) -> bool {
    let Some((prefix, name)) = s.split_once('/') else {
        return false;
    };
    let nb = name.as_bytes();
    is_dns1123_subdomain(prefix)
        && !nb.is_empty()
        && nb.len() <= 63
        && nb
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && nb[0].is_ascii_alphanumeric()
        && nb[nb.len() - 1].is_ascii_alphanumeric()
        && !s.contains("kubernetes.io/")
        && !s.starts_with("requests.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AllocatableGate, Gates, Stage};

    #[test]
    fn names() {
        for ok in ["a", "nvidia-device-plugin", "a.b-c.d", "0abc"] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "a_b", "-a", "a-", "a..b", ".a", "a."] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        for ok in [
            "nvidia.com/gpu",
            "amd.com/gpu",
            "example/foo",
            "gpu.intel.com/i915",
            "x.io/A_b.c-D",
        ] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "cpu",
            "memory",
            "gpu",
            "nvidia.com/",
            "/gpu",
            "Nvidia.com/gpu",
            "nvidia.com/gpu/x",
            "kubernetes.io/batteries",
            "foo.kubernetes.io/bar",
            "requests.nvidia.com/gpu",
            "nvidia.com/-gpu",
            "nvidia.com/gpu ",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
        assert!(!is_extended_resource_name(&format!(
            "a.io/{}",
            "x".repeat(64)
        )));
        assert!(is_extended_resource_name(&format!(
            "a.io/{}",
            "x".repeat(63)
        )));
    }

    #[test]
    fn a_good_spec_is_valid_and_a_bad_one_names_every_field() {
        let mut spec = SafeRolloutSpec::for_daemonset("plugin");
        spec.stages = Some(vec![
            Stage::new(IntOrString::Int(1)),
            Stage::new(IntOrString::String("100%".into())),
        ]);
        spec.gates = Some(Gates {
            allocatable: vec![AllocatableGate::new("nvidia.com/gpu")],
            ..Default::default()
        });
        assert_eq!(spec.validate(), vec![]);

        spec.target_ref.name = "Bad_Name".into();
        spec.stages.as_mut().unwrap()[1].nodes = IntOrString::String("0%".into());
        spec.stages.as_mut().unwrap()[0].soak = "1 h".into();
        spec.max_unavailable = IntOrString::Int(0);
        spec.progress_deadline = "0m".into();
        let gate = &mut spec.gates.as_mut().unwrap().allocatable[0];
        gate.min = IntOrString::Int(5);
        gate.max = IntOrString::Int(2);
        let paths: Vec<String> = spec.validate().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "spec.targetRef.name",
                "spec.stages[0].soak",
                "spec.stages[1].nodes",
                "spec.maxUnavailable",
                "spec.progressDeadline",
                "spec.gates.allocatable[0].min",
            ]
        );
    }
}
