//! The `SafeRollout` custom resource (`saferollout.dev/v1alpha1`): a staged,
//! gated rollout of one device-plugin or DRA-driver DaemonSet.
//!
//! - [`SafeRollout`] / [`SafeRolloutSpec`] ([`spec`]) / [`SafeRolloutStatus`]
//!   ([`status`]): the resource.
//! - [`gates`]: one file per gate (`gates/pods_ready.rs`, ...,
//!   `gates/prometheus.rs`, named as `saferollout_core::gates` names the
//!   module that judges it), each with the gate's settings, defaults, schema
//!   and CEL rules, validation and name ([`PodsReadyGate::NAME`], ...);
//!   [`Gates`] gathers them.
//! - [`failure`]: `spec.onFailure` ([`OnFailure`]) and `spec.quarantine`.
//! - [`maintenance`]: `spec.nodeMaintenance` (cordon and drain around a
//!   node's replacement) and `status.nodeMaintenance`.
//! - [`status`]: what the operator writes, with the records gates and
//!   failure policies keep ([`ProbeRecord`], [`Measurements`],
//!   [`StoppedRollout`], [`NodeDevices`]) and the wire forms of a stage's
//!   baselines ([`baseline`], [`device_baseline`]).
//! - [`validate`]: [`SafeRolloutSpec::validate`], the schema's checks
//!   client-side (for linting): every part of the spec implements
//!   [`Validate`] and reports into one [`Errors`].
//! - [`schema`]: the hand-written schemas and CEL helpers the parts share.
//! - [`consts`]: labels, annotations, condition types, field manager.
//! - [`parse_duration`], [`DurationString`]: durations such as `1h30m`.
//! - [`resolve_count`], [`parse_bound`]: int-or-string helpers.
//! - [`quantity_count`]: a Kubernetes quantity (`8`, `8k`, `2Ki`) as a whole count.
//! - [`crd_yaml`]: the CRD manifest (also `cargo run -p saferollout-api --bin crdgen`).
//! - [`policy`]: the cluster-scoped [`SafeRolloutPolicy`] (a budget, an
//!   order and maintenance windows shared by several SafeRollouts) and
//!   [`policy_crd_yaml`], its CRD (`crdgen policy`).
//!
//! The CRD schema rejects nonsense with CEL rules whose messages name the
//! field; see `tests/malformed/` at the repository root for examples.
//!
//! No file imports another in a cycle (`tests/tools/import-cycles
//! crates/api`): `consts`, `duration`, `intstr`, `schema` and `validate` know
//! nothing of the spec; the gates import only them; `status` imports no gate;
//! `spec` imports all of it. Everything is re-exported here, and the former
//! modules `devices` and `proof` stay as re-exports.

pub mod consts;
pub mod duration;
pub mod failure;
pub mod gates;
pub mod intstr;
pub mod maintenance;
pub mod owner;
pub mod policy;
pub mod quantity;
pub mod schema;
pub mod spec;
pub mod status;
pub mod strategy;
pub mod validate;

pub use consts::*;
pub use duration::{DurationError, DurationString, format_duration, parse_duration};
pub use failure::{OnFailure, QuarantineEffect, QuarantineSpec, QuarantineTarget};
pub use gates::{
    AllocatableGate, ClaimProbe, ClaimsGate, ClearedTaints, DeviceHealthGate, DeviceTaintsGate,
    GATE_ALLOCATABLE, GATE_CLAIMS, GATE_DEVICE_HEALTH, GATE_DEVICE_TAINTS, GATE_LOGS,
    GATE_NODE_CONDITIONS, GATE_PODS_READY, GATE_PROBE, GATE_PROMETHEUS, GATE_RESOURCE_SLICES,
    Gates, HealthyStatus, InconclusivePolicy, LogsGate, NodeCondition, NodeConditionsGate,
    PROBE_NODE_LABEL, PROBE_REVISION_LABEL, PatternSet, PodsReadyGate, ProbeEnvVar, ProbeGate,
    ProbeResources, PrometheusGate, PrometheusTls, ResourceSlicesGate, STAGE_NODES_PLACEHOLDER,
    SecretKeyRef, UnreadablePolicy,
};
pub use intstr::{Bound, BoundError, CountError, parse_bound, parse_percent, resolve_count};
pub use maintenance::{Drain, MaintenanceStep, NodeMaintenance, NodeMaintenanceStatus};
pub use owner::{OwnerResource, OwnerRevert};
pub use policy::{
    MaintenanceWindow, OrderingRule, PolicySelector, SafeRolloutPolicy, SafeRolloutPolicySpec,
    SafeRolloutPolicyStatus, Weekday,
};
pub use quantity::{count_of, quantity_count};
pub use spec::{
    Canary, CircuitBreaker, Preflight, PreflightPolicy, SafeRollout, SafeRolloutSpec, Stage,
    TargetRef, default_stages,
};
pub use status::{
    AppliedTemplate, BlockedRevision, GateResult, GateStatus, LastGoodTemplate, Measurements,
    NodeDevices, NodeNote, Phase, PreflightFinding, PreflightStatus, ProbeRecord, Progress,
    QuarantineRecord, QuarantinedPool, ResourceCounts, SafeRolloutStatus, StageState, StageStatus,
    StoppedRollout,
};
pub use strategy::{Agent, AgentKind, HandoverOrder, Strategy};
pub use validate::{Errors, FieldError, Validate};

// Former paths, kept so that `saferollout_api::devices::MAX_RECORDED`,
// `saferollout_api::proof::is_http_url` and the like still resolve.

/// The wire forms of a stage's baselines, at their former paths.
pub use status::{baseline, device_baseline};

/// The device gates, `onFailure` and their status records, at their former
/// path: re-exports of [`gates`], [`failure`] and [`status`].
pub mod devices {
    pub use crate::failure::*;
    pub use crate::gates::MSG_ONE_DRIVER;
    pub use crate::gates::claims::*;
    pub use crate::gates::device_health::*;
    pub use crate::gates::device_taints::*;
    pub use crate::gates::resource_slices::*;
    pub use crate::schema::{MSG_DRIVER, MSG_HEALTH_RESOURCE};
    pub use crate::status::{
        MAX_RECORDED, NodeDevices, QuarantineRecord, QuarantinedPool, StoppedRollout,
    };
}

/// The probe, logs and prometheus gates and their status records, at their
/// former path: re-exports of [`gates`] and [`status`].
pub mod proof {
    pub use crate::gates::logs::*;
    pub use crate::gates::probe::*;
    pub use crate::gates::prometheus::*;
    pub use crate::status::{Measurements, ProbeRecord};
}

use kube::CustomResourceExt;

/// First line of `deploy/crd.yaml`.
pub const CRD_HEADER: &str =
    "# generated by `cargo run -p saferollout-api --bin crdgen`; do not edit\n";

/// The CustomResourceDefinition as YAML, with [`CRD_HEADER`] on top: exactly the
/// content of `deploy/crd.yaml`.
pub fn crd_yaml() -> String {
    let body = serde_yaml::to_string(&SafeRollout::crd()).expect("the CRD serialises to YAML");
    format!("{CRD_HEADER}---\n{body}")
}

/// First line of `deploy/crd-policy.yaml`.
pub const POLICY_CRD_HEADER: &str =
    "# generated by `cargo run -p saferollout-api --bin crdgen -- policy`; do not edit\n";

/// The SafeRolloutPolicy CustomResourceDefinition as YAML, with
/// [`POLICY_CRD_HEADER`] on top: exactly the content of
/// `deploy/crd-policy.yaml`.
pub fn policy_crd_yaml() -> String {
    let body = serde_yaml::to_string(&SafeRolloutPolicy::crd())
        .expect("the policy CRD serialises to YAML");
    format!("{POLICY_CRD_HEADER}---\n{body}")
}

#[cfg(test)]
mod tests;
