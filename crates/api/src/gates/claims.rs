//! `gates.claims` (DRA): ResourceClaims allocated on a node before its
//! driver was replaced stay allocated and their pods do not fail;
//! optionally a probe claim the real scheduler must allocate on each node.
//! Its settings, schema (CEL rules with field-named messages) and
//! client-side validation; the judgement is `saferollout_core::gates::claims`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::duration::DurationString;
use crate::schema::{DNS1123_SUBDOMAIN_REGEX, add_rules, driver_name, duration, rule, string_rule};
use crate::validate::{Errors, Validate, is_dns1123_subdomain};

/// `gates.claims`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimsGate {
    /// The DRA driver whose claims are judged.
    #[schemars(schema_with = "driver_name")]
    pub driver: String,

    /// A probe per node: a ResourceClaim that the real scheduler must
    /// allocate on the node's devices, for a short-lived pod pinned to the
    /// node, within `timeout`. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ClaimProbe>,
}

impl ClaimsGate {
    /// The ResourceClaims gate's name, as written in `GateResult.gate`.
    pub const NAME: &'static str = "claims";
}

/// The gate's name, [`ClaimsGate::NAME`].
pub const GATE_CLAIMS: &str = ClaimsGate::NAME;

/// The probe of `gates.claims`. Probe pods and claims are created in the
/// SafeRollout's namespace, owned by the SafeRollout, one per node of a
/// stage once its new driver pod is Ready, and deleted when their node passed
/// or the stage ends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = probe_rule)]
pub struct ClaimProbe {
    /// Ask for one device of this DeviceClass (the operator creates the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "object_name")]
    pub device_class_name: Option<String>,

    /// Or: a ResourceClaimTemplate in the SafeRollout's namespace (the claim
    /// controller creates the claim from it for the probe pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "object_name")]
    pub claim_template_name: Option<String>,

    /// The probe pod's image. It only has to start: the probe passes once the
    /// claim is allocated on the node and the pod is bound there (and fails
    /// if the pod fails).
    #[serde(default = "default_probe_image")]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// Labels for the probe pod (e.g. to let an admission policy or a
    /// simulated kubelet recognise it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// Tolerations for the probe pod (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,

    /// How long the scheduler has to allocate the claim on the node.
    #[serde(default = "default_probe_timeout")]
    #[schemars(schema_with = "probe_timeout")]
    pub timeout: DurationString,
}

impl ClaimProbe {
    /// A probe asking for one device of `class`.
    pub fn for_class(class: impl Into<String>) -> Self {
        Self {
            device_class_name: Some(class.into()),
            claim_template_name: None,
            image: default_probe_image(),
            labels: BTreeMap::new(),
            tolerations: Vec::new(),
            timeout: default_probe_timeout(),
        }
    }
}

fn default_probe_timeout() -> DurationString {
    DurationString::from("2m")
}

fn default_probe_image() -> String {
    DEFAULT_PROBE_IMAGE.to_string()
}

/// The probe pod's image when none is given: it only has to start.
pub const DEFAULT_PROBE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Message of the rule on `claims.probe`.
pub const MSG_PROBE_ONE_OF: &str =
    "gates.claims.probe must set exactly one of deviceClassName or claimTemplateName";
/// Message of the rule on an object name.
pub const MSG_OBJECT_NAME: &str =
    "must be an object name: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')";

fn object_name(_: &mut SchemaGenerator) -> Schema {
    string_rule(
        253,
        &format!("self.matches('{DNS1123_SUBDOMAIN_REGEX}')"),
        MSG_OBJECT_NAME,
    )
}

fn probe_timeout(_: &mut SchemaGenerator) -> Schema {
    duration("gates.claims.probe.timeout", true)
}

fn probe_rule(s: &mut Schema) {
    add_rules(
        s,
        json!([rule(
            "has(self.deviceClassName) != has(self.claimTemplateName)",
            MSG_PROBE_ONE_OF
        )]),
    );
}

impl Validate for ClaimsGate {
    fn validate(&self, path: &str, errors: &mut Errors) {
        errors.check_driver(&format!("{path}.driver"), &self.driver);
        self.probe.validate(&format!("{path}.probe"), errors);
    }
}

impl Validate for ClaimProbe {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if self.device_class_name.is_some() == self.claim_template_name.is_some() {
            errors.push(path, MSG_PROBE_ONE_OF);
        }
        for (field, v) in [
            ("deviceClassName", &self.device_class_name),
            ("claimTemplateName", &self.claim_template_name),
        ] {
            if let Some(v) = v
                && (v.len() > 253 || !is_dns1123_subdomain(v))
            {
                errors.push(format!("{path}.{field}"), MSG_OBJECT_NAME);
            }
        }
        if self.image.is_empty() || self.image.len() > 512 {
            errors.push(
                format!("{path}.image"),
                "should be between 1 and 512 characters",
            );
        }
        errors.check_max_items(&format!("{path}.tolerations"), self.tolerations.len(), 16);
        errors.check_duration(
            &format!("{path}.timeout"),
            "gates.claims.probe.timeout",
            &self.timeout,
            true,
        );
    }
}
