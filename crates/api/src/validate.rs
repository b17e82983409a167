//! Client-side validation mirroring the CRD schema: the same checks as the
//! OpenAPI constraints and CEL rules the API server applies, with the same
//! field paths and messages. Used to lint a manifest without a cluster and by
//! the operator as a second line of defence. The API server stays the
//! authority; a test keeps the two in step on `tests/malformed/`.
//!
//! Each part of the spec checks itself through one trait, [`Validate`] (as
//! each resource linkerd2's policy controller admits is one `Validate`
//! impl): every gate in its own file beside its schema, the failure policy
//! in `failure`, the spec's own fields in `spec`. All report into one
//! collector, [`Errors`], each error at the field path the API server would
//! name. This module is a leaf: the collector, the trait and the checks
//! several parts share (DNS names, extended resources, durations, list
//! sizes); it knows no part of the spec.
//!
//! One difference: a duration too large to represent is an error here, while
//! the server's regex accepts it.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::duration::{DURATION_MAX_LENGTH, DurationString, parse_duration};
use crate::intstr::parse_percent;
use crate::schema::{MSG_DRIVER, MSG_HEALTH_RESOURCE, duration_message, positive_message};

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

/// The field errors found so far, in the order found: the one collector
/// every [`Validate`] impl reports into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Errors(Vec<FieldError>);

impl Errors {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an error on the field at `path` (`spec.gates.probe.image`).
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The errors, in the order found.
    pub fn into_vec(self) -> Vec<FieldError> {
        self.0
    }

    /// A duration field at `path`: its length, its grammar and, when
    /// `positive`, that it is longer than zero. `field` names it in the
    /// message as the schema's rule does (`gates.probe.delay`).
    pub fn check_duration(
        &mut self,
        path: &str,
        field: &str,
        value: &DurationString,
        positive: bool,
    ) {
        if let Some(message) = duration_error(field, value, positive) {
            self.push(path, message);
        }
    }

    /// A list of at most `max` items (the schema's `maxItems`).
    pub fn check_max_items(&mut self, path: &str, len: usize, max: usize) {
        if len > max {
            self.push(
                path,
                format!("Too many: {len}: must have at most {max} items"),
            );
        }
    }

    /// A DRA driver name (the schema's `driver_name`): a DNS subdomain of
    /// at most 63 characters.
    pub fn check_driver(&mut self, path: &str, driver: &str) {
        if driver.len() > 63 || !is_dns1123_subdomain(driver) {
            self.push(path, format!("driver {MSG_DRIVER}"));
        }
    }

    /// A device plugin's extended resource (the schema's `health_resource`).
    pub fn check_extended_resource(&mut self, path: &str, resource: &str) {
        if resource.len() > 317 || !is_extended_resource_name(resource) {
            self.push(path, format!("resource {MSG_HEALTH_RESOURCE}"));
        }
    }
}

/// A part of the spec that checks itself as the API server would check it.
pub trait Validate {
    /// Records in `errors` every field error of `self`, found at `path`
    /// (`spec.gates.probe`, `spec.gates.allocatable[0]`): the errors of its
    /// fields are at paths below it.
    fn validate(&self, path: &str, errors: &mut Errors);
}

/// An optional field is checked when set.
impl<T: Validate> Validate for Option<T> {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if let Some(v) = self {
            v.validate(path, errors);
        }
    }
}

/// A list-map field (`x-kubernetes-list-type: map`, keyed by `key_name`):
/// at most `max` items, no key twice, and each item valid at `path[i]`.
pub fn validate_list_map<T: Validate>(
    errors: &mut Errors,
    path: &str,
    items: &[T],
    max: usize,
    key_name: &str,
    key: impl Fn(&T) -> &str,
) {
    errors.check_max_items(path, items.len(), max);
    let mut seen = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let k = key(item);
        if !seen.insert(k) {
            errors.push(&at, format!("Duplicate value: {key_name} {k:?}"));
        }
        item.validate(&at, errors);
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

/// A count or percentage (`stages[].nodes`, `maxUnavailable`,
/// `gates.probe.sample`): an integer >= 1 or "1%".."100%".
pub fn is_count_or_percent(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n >= 1,
        IntOrString::String(s) => parse_percent(s).is_some(),
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

/// A DNS-1123 label: at most 63 characters, no dot.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns1123_subdomain(s)
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
}
