//! The SafeRollout spec. Doc comments on the types become the CRD's field
//! descriptions (`kubectl explain saferollout.spec`).

use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::{DurationError, DurationString};
use crate::failure::{self, OnFailure, QuarantineEffect, QuarantineSpec, QuarantineTarget};
use crate::gates::{AllocatableGate, Gates, LogsGate, ProbeGate, PrometheusGate};
use crate::schema::{self, MAX_STAGES, MSG_MAX_UNAVAILABLE, MSG_STAGE_NODES, MSG_TARGET_NAME};
use crate::status::SafeRolloutStatus;
use crate::strategy::{self, Agent, AgentKind, HandoverOrder, Strategy};
use crate::validate::{Errors, FieldError, Validate, is_count_or_percent, is_dns1123_subdomain};

/// SafeRolloutSpec is the desired state of a staged, gated rollout of one
/// DaemonSet (a device plugin or DRA driver) in the SafeRollout's namespace.
///
/// The operator takes control of the DaemonSet's updates (it sets
/// `updateStrategy: OnDelete` and records the original), replaces agent pods
/// node by node, stage by stage, checks health gates after each stage, and
/// reverts to the last good template when a gate fails.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "saferollout.dev",
    version = "v1alpha1",
    kind = "SafeRollout",
    plural = "saferollouts",
    singular = "saferollout",
    shortname = "sr",
    namespaced,
    status = "SafeRolloutStatus",
    derive = "PartialEq",
    doc = "SafeRollout rolls out a new version or configuration of a device-plugin or DRA-driver DaemonSet in stages, with health gates and automatic revert.",
    printcolumn = r#"{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "Stage", "type": "integer", "description": "Index (0-based) of the current stage", "jsonPath": ".status.currentStage"}"#,
    printcolumn = r#"{"name": "Target", "type": "string", "description": "Revision (controller-revision-hash) being rolled out", "jsonPath": ".status.targetRevision"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct SafeRolloutSpec {
    /// The DaemonSet to roll out. It must be in the SafeRollout's namespace.
    pub target_ref: TargetRef,

    /// The pod template to roll out (a PodTemplateSpec). When set, the
    /// SafeRollout is the source of the template (the GitOps path): Git owns
    /// the SafeRollout and the operator writes the template to the DaemonSet,
    /// stage by stage. When absent, the operator gates the templates written to
    /// the DaemonSet itself (e.g. by Helm): each new ControllerRevision is
    /// rolled out in stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::pod_template")]
    pub template: Option<serde_json::Value>,

    /// Where the first stage (the canary) may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,

    /// How a node's agent is replaced: InPlace (default: the target
    /// DaemonSet is set to OnDelete and its pods deleted node by node) or
    /// Selector (the new template runs in a canary DaemonSet and a node label
    /// moves nodes to it, stage by stage; needs `template`). Fixed for the
    /// SafeRollout's life.
    #[serde(default, skip_serializing_if = "is_in_place")]
    #[schemars(schema_with = "strategy::strategy_schema")]
    pub strategy: Strategy,

    /// What the DaemonSet runs and, for `strategy: Selector`, the order in
    /// which a node's old and new agents hand over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,

    /// The stages of a rollout, in order. Each stage's `nodes` is cumulative:
    /// how many nodes run the new revision once the stage is done. When absent:
    /// 1 node, then 10%, 50% and 100% of the nodes, without soak. When the last
    /// stage covers fewer than all nodes, a final stage of 100% follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // At most 10: the API server's CEL cost estimate multiplies the per-stage
    // rules by this bound, and more than 10 stages is not a rollout plan.
    #[schemars(length(min = 1, max = 10))]
    pub stages: Option<Vec<Stage>>,

    /// The disruption budget: at most this many of the rollout's agent pods
    /// are missing or not Ready because of the operator at any moment (while
    /// rolling out, reverting or abandoning a rollout): a count (at least 1)
    /// or a percentage of the nodes the DaemonSet covers (rounded down, at
    /// least 1), as the DaemonSet controller reads its own maxUnavailable.
    /// The one exception: nodes whose agent itself failed a gate are reverted
    /// at once.
    #[serde(default = "default_max_unavailable")]
    #[schemars(schema_with = "schema::max_unavailable")]
    pub max_unavailable: IntOrString,

    /// How long a stage (or a revert) may go without progress: it counts from
    /// the stage's start and starts again each time one more node is
    /// replaced and judged. When it passes, every gate still pending fails
    /// and the rollout reverts; a revert that stops converging names the
    /// stuck nodes in its conditions.
    #[serde(default = "default_progress_deadline")]
    #[schemars(schema_with = "schema::progress_deadline")]
    pub progress_deadline: DurationString,

    /// The circuit breaker on nodes going NotReady during a rollout. Absent:
    /// `maxNotReadyNodes: 10%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreaker>,

    /// What happens to a node around its agent's replacement (driver-class
    /// agents): cordon it, evict its workload pods (PodDisruptionBudgets
    /// respected, never forced), uncordon it once its new agent serves or a
    /// revert brought the last good one back. Absent: nodes are not touched
    /// beyond their agent's pod. `strategy: InPlace` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_maintenance: Option<crate::maintenance::NodeMaintenance>,

    /// A DaemonSet a vendor's GPU operator owns is reverted through that
    /// owner: after a failed gate (`onFailure: Revert`) or an abort, the
    /// owner's version fields are put back to what made the last good
    /// template, and the owner writes it. Names the owner (the DaemonSet's
    /// controller ownerReference); the operator needs
    /// `--owner-revert` (chart value `ownerRevert.enabled`), and the
    /// SafeRollout's author the right to patch that owner. Absent: such a
    /// failure halts, naming the fields to put back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_revert: Option<crate::owner::OwnerRevert>,

    /// Health gates judged after each stage. podsReady is always judged, even
    /// when this field is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<Gates>,

    /// Stops the rollout where it is: no further pod is replaced until this is
    /// false again. A revert in progress still completes.
    #[serde(default)]
    pub paused: bool,

    /// The guides' checklists run before the first stage of each new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Preflight>,

    /// What to do when a gate fails: Revert (default: back to the last good
    /// template), Quarantine (for drivers that cannot be downgraded: keep the
    /// new release where it runs, stop, and take the failed nodes' devices out
    /// of service) or Halt (stop and change nothing more). Either way the
    /// revision is blocked until a retry.
    #[serde(default, skip_serializing_if = "is_revert")]
    pub on_failure: OnFailure,

    /// How `onFailure: Quarantine` takes devices out of service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = failure::quarantine_rules)]
    pub quarantine: Option<QuarantineSpec>,
}

fn is_in_place(s: &Strategy) -> bool {
    *s == Strategy::InPlace
}

/// The CEL rules on the whole spec, from the modules that own them.
fn spec_rules(s: &mut schemars::Schema) {
    failure::spec_rules(s);
    strategy::spec_rules(s);
    crate::maintenance::spec_rules(s);
}

fn is_revert(p: &OnFailure) -> bool {
    *p == OnFailure::Revert
}

/// Nodes going NotReady during a rollout: more than `maxNotReadyNodes` of
/// them stop it. Among the nodes whose agent the rollout replaced, that is a
/// failure of the release (reverted, or as `onFailure` says); among the
/// others, the rollout holds (nothing more is replaced) until enough of
/// them are Ready again, since a zone or a rack going down is not the
/// release's doing but is no time to go on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// A count (at least 1) or a percentage of the nodes the DaemonSet
    /// selects (rounded down, at least 1); the breaker opens when more than
    /// this many are NotReady.
    #[serde(default = "default_max_not_ready_nodes")]
    #[schemars(schema_with = "schema::max_not_ready_nodes")]
    pub max_not_ready_nodes: IntOrString,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            max_not_ready_nodes: default_max_not_ready_nodes(),
        }
    }
}

fn default_max_not_ready_nodes() -> IntOrString {
    IntOrString::String("10%".into())
}

/// Preflight checks before stage 1.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preflight {
    /// `Enforce`: an error finding blocks the rollout (no pod is touched).
    /// `Warn` (default): findings are reported, the rollout goes on.
    /// `Skip`: no checks.
    #[serde(default)]
    pub policy: PreflightPolicy,
}

/// Whether preflight errors block a rollout.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PreflightPolicy {
    Enforce,
    #[default]
    Warn,
    Skip,
}

/// A reference to the DaemonSet to roll out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Name of the DaemonSet in the SafeRollout's namespace. Immutable.
    #[schemars(schema_with = "schema::target_ref_name")]
    pub name: String,
}

/// Where the canary (the first stage) may run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// Only nodes matching this selector are taken by the first stage, e.g. a
    /// node labelled for testing. Without it any node running the agent may be
    /// taken. Later stages take any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// One stage of a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    /// How many nodes run the new revision once this stage is done, counting
    /// earlier stages: a count (at least 1) or a percentage between 1% and
    /// 100% of the nodes running the agent (rounded up).
    #[schemars(schema_with = "schema::stage_nodes")]
    pub nodes: IntOrString,

    /// How long the stage's gates must keep passing before the next stage
    /// starts.
    #[serde(default = "default_stage_soak")]
    #[schemars(schema_with = "schema::stage_soak")]
    pub soak: DurationString,

    /// Pause before this stage starts, until a person approves it.
    #[serde(default)]
    pub pause: bool,
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_progress_deadline() -> DurationString {
    DurationString::from("10m")
}

fn default_stage_soak() -> DurationString {
    DurationString::from("0s")
}

/// The stages used when `spec.stages` is absent: 1 node, 10%, 50%, 100%.
pub fn default_stages() -> Vec<Stage> {
    vec![
        Stage::new(IntOrString::Int(1)),
        Stage::new(IntOrString::String("10%".into())),
        Stage::new(IntOrString::String("50%".into())),
        Stage::new(IntOrString::String("100%".into())),
    ]
}

impl Stage {
    /// A stage without soak or pause.
    pub fn new(nodes: IntOrString) -> Self {
        Self {
            nodes,
            soak: default_stage_soak(),
            pause: false,
        }
    }

    /// Whether the stage explicitly covers every node (`"100%"`).
    pub fn is_full(&self) -> bool {
        matches!(&self.nodes, IntOrString::String(s) if s == "100%")
    }
}

impl SafeRolloutSpec {
    /// A spec for `daemonset` with every default.
    pub fn for_daemonset(daemonset: impl Into<String>) -> Self {
        Self {
            target_ref: TargetRef {
                name: daemonset.into(),
            },
            template: None,
            canary: None,
            strategy: Strategy::InPlace,
            agent: None,
            stages: None,
            max_unavailable: default_max_unavailable(),
            progress_deadline: default_progress_deadline(),
            circuit_breaker: None,
            node_maintenance: None,
            owner_revert: None,
            gates: None,
            paused: false,
            preflight: None,
            on_failure: OnFailure::Revert,
            quarantine: None,
        }
    }

    /// The stages to run: `spec.stages`, or [`default_stages`] when absent,
    /// followed by a `"100%"` stage when the last one does not say `"100%"`
    /// (with a count as last stage, that final stage may find no node left,
    /// and then completes at once).
    pub fn effective_stages(&self) -> Vec<Stage> {
        let mut stages = match &self.stages {
            Some(s) if !s.is_empty() => s.clone(),
            _ => default_stages(),
        };
        if !stages.last().is_some_and(Stage::is_full) {
            stages.push(Stage::new(IntOrString::String("100%".into())));
        }
        stages
    }

    /// The handover order a `Selector` rollout keeps on each node.
    pub fn handover_order(&self) -> HandoverOrder {
        self.agent.map(|a| a.handover).unwrap_or_default()
    }

    /// `spec.template` as a typed PodTemplateSpec (`None` when absent).
    pub fn typed_template(&self) -> Result<Option<PodTemplateSpec>, serde_json::Error> {
        self.template
            .clone()
            .map(serde_json::from_value)
            .transpose()
    }

    /// Sets `spec.template` from a typed PodTemplateSpec.
    pub fn set_template(&mut self, template: &PodTemplateSpec) -> Result<(), serde_json::Error> {
        self.template = Some(serde_json::to_value(template)?);
        Ok(())
    }

    /// `spec.progressDeadline`, parsed.
    pub fn progress_deadline_duration(&self) -> Result<Duration, DurationError> {
        self.progress_deadline.to_std()
    }

    /// The podsReady timeout: `gates.podsReady.timeout`, else `progressDeadline`.
    pub fn pods_ready_timeout(&self) -> Result<Duration, DurationError> {
        match self
            .gates
            .as_ref()
            .and_then(|g| g.pods_ready.as_ref())
            .and_then(|p| p.timeout.as_ref())
        {
            Some(t) => t.to_std(),
            None => self.progress_deadline_duration(),
        }
    }

    /// The probe gate, when configured.
    pub fn probe_gate(&self) -> Option<&ProbeGate> {
        self.gates.as_ref().and_then(|g| g.probe.as_ref())
    }

    /// The logs gate, when configured.
    pub fn logs_gate(&self) -> Option<&LogsGate> {
        self.gates.as_ref().and_then(|g| g.logs.as_ref())
    }

    /// The prometheus gates (empty when none).
    pub fn prometheus_gates(&self) -> &[PrometheusGate] {
        self.gates
            .as_ref()
            .map(|g| g.prometheus.as_slice())
            .unwrap_or(&[])
    }

    /// The allocatable gates (empty when none).
    pub fn allocatable_gates(&self) -> &[AllocatableGate] {
        self.gates
            .as_ref()
            .map(|g| g.allocatable.as_slice())
            .unwrap_or(&[])
    }
}

impl SafeRolloutSpec {
    /// The one DRA driver the device gates name (the schema makes them agree).
    pub fn device_driver(&self) -> Option<&str> {
        self.gates.as_ref()?.drivers().next()
    }

    /// What a quarantine takes out of service: `spec.quarantine`'s driver or
    /// resource, else the driver of the device gates, else the device
    /// plugin's resource of `gates.deviceHealth` or `gates.allocatable[0]`.
    pub fn quarantine_target(&self) -> Option<QuarantineTarget> {
        let q = self.quarantine.as_ref();
        if let Some(d) = q.and_then(|q| q.driver.as_ref()) {
            return Some(QuarantineTarget::Driver(d.clone()));
        }
        if let Some(r) = q.and_then(|q| q.resource.as_ref()) {
            return Some(QuarantineTarget::Resource(r.clone()));
        }
        if let Some(d) = self.device_driver() {
            return Some(QuarantineTarget::Driver(d.to_string()));
        }
        let g = self.gates.as_ref()?;
        g.device_health
            .as_ref()
            .and_then(|h| h.resource.clone())
            .or_else(|| g.allocatable.first().map(|a| a.resource.clone()))
            .map(QuarantineTarget::Resource)
    }

    /// The device plugins' resources the gates judge (`gates.allocatable`,
    /// `gates.deviceHealth.resource`).
    pub fn gated_resources(&self) -> Vec<&str> {
        let Some(g) = self.gates.as_ref() else {
            return Vec::new();
        };
        g.allocatable
            .iter()
            .map(|a| a.resource.as_str())
            .chain(g.device_health.as_ref().and_then(|h| h.resource.as_deref()))
            .collect()
    }

    /// Where `spec.quarantine` names something this rollout does not judge
    /// (another driver than the device gates', a resource the gates do not
    /// name), as (field, why): the schema's rules, which the operator
    /// checks again.
    pub fn quarantine_out_of_scope(&self) -> Vec<(&'static str, &'static str)> {
        let Some(q) = self.quarantine.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let (Some(d), Some(gated)) = (&q.driver, self.device_driver())
            && d != gated
        {
            out.push((
                "spec.quarantine.driver",
                failure::MSG_QUARANTINE_DRIVER_SCOPE,
            ));
        }
        let gated = self.gated_resources();
        if let Some(r) = &q.resource
            && !gated.is_empty()
            && !gated.contains(&r.as_str())
        {
            out.push((
                "spec.quarantine.resource",
                failure::MSG_QUARANTINE_RESOURCE_SCOPE,
            ));
        }
        out
    }

    /// The quarantine's effect.
    pub fn quarantine_effect(&self) -> QuarantineEffect {
        self.quarantine
            .as_ref()
            .map(|q| q.effect)
            .unwrap_or_default()
    }
}

impl SafeRollout {
    /// `spec.template` as a typed PodTemplateSpec; see [`SafeRolloutSpec::typed_template`].
    pub fn typed_template(&self) -> Result<Option<PodTemplateSpec>, serde_json::Error> {
        self.spec.typed_template()
    }
}

// ---------------------------------------------------------------------------
// Client-side validation (mirrors the schema; see crate::validate)

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
        let mut errors = Errors::new();
        Validate::validate(self, "spec", &mut errors);
        errors.into_vec()
    }
}

impl Validate for SafeRolloutSpec {
    fn validate(&self, path: &str, errors: &mut Errors) {
        self.target_ref
            .validate(&format!("{path}.targetRef"), errors);
        if let Some(stages) = &self.stages {
            let at = format!("{path}.stages");
            if stages.is_empty() {
                errors.push(&at, "should have at least 1 items");
            }
            errors.check_max_items(&at, stages.len(), MAX_STAGES as usize);
            for (i, stage) in stages.iter().enumerate() {
                stage.validate(&format!("{at}[{i}]"), errors);
            }
        }
        if !is_count_or_percent(&self.max_unavailable) {
            errors.push(format!("{path}.maxUnavailable"), MSG_MAX_UNAVAILABLE);
        }
        if let Some(cb) = &self.circuit_breaker
            && !is_count_or_percent(&cb.max_not_ready_nodes)
        {
            errors.push(
                format!("{path}.circuitBreaker.maxNotReadyNodes"),
                schema::MSG_MAX_NOT_READY_NODES,
            );
        }
        errors.check_duration(
            &format!("{path}.progressDeadline"),
            "progressDeadline",
            &self.progress_deadline,
            true,
        );
        self.gates.validate(&format!("{path}.gates"), errors);
        self.node_maintenance
            .validate(&format!("{path}.nodeMaintenance"), errors);
        self.owner_revert
            .validate(&format!("{path}.ownerRevert"), errors);
        if self.node_maintenance.is_some() && self.strategy == Strategy::Selector {
            errors.push(
                format!("{path}.nodeMaintenance"),
                crate::maintenance::MSG_MAINTENANCE_IN_PLACE,
            );
        }
        self.quarantine
            .validate(&format!("{path}.quarantine"), errors);
        // The rules on spec that read the gates and the failure policy
        // together (`failure::spec_rules`).
        for (field, why) in self.quarantine_out_of_scope() {
            errors.push(field, why);
        }
        if self.on_failure == OnFailure::Quarantine && self.quarantine_target().is_none() {
            errors.push(format!("{path}.onFailure"), failure::MSG_QUARANTINE_TARGET);
        }
        // The rules on spec that read strategy, agent and template together
        // (`strategy::spec_rules`).
        if self.strategy == Strategy::Selector && self.template.is_none() {
            errors.push(
                format!("{path}.strategy"),
                strategy::MSG_SELECTOR_NEEDS_TEMPLATE,
            );
        }
        if let Some(agent) = &self.agent
            && agent.handover == HandoverOrder::MakeBeforeBreak
            && (agent.kind != Some(AgentKind::DraDriver) || self.strategy != Strategy::Selector)
        {
            errors.push(
                format!("{path}.agent.handover"),
                strategy::MSG_MAKE_BEFORE_BREAK_KIND,
            );
        }
    }
}

impl Validate for TargetRef {
    fn validate(&self, path: &str, errors: &mut Errors) {
        let at = format!("{path}.name");
        if self.name.len() > 253 {
            errors.push(at, "Too long: may not be more than 253 bytes");
        } else if !is_dns1123_subdomain(&self.name) {
            errors.push(at, MSG_TARGET_NAME);
        }
    }
}

impl Validate for Stage {
    fn validate(&self, path: &str, errors: &mut Errors) {
        if !is_count_or_percent(&self.nodes) {
            errors.push(format!("{path}.nodes"), MSG_STAGE_NODES);
        }
        errors.check_duration(&format!("{path}.soak"), "stages[].soak", &self.soak, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
