//! `spec.strategy` and `spec.agent`: how the operator moves a node from the
//! old agent to the new one. `InPlace` (the default) deletes the agent pod
//! of a DaemonSet set to OnDelete; `Selector` runs the new template in a
//! canary DaemonSet and moves nodes between the two with a node label, as
//! the source guides do by hand (docs/design/selector-strategy.md). Their
//! types, their CEL rules and the messages those rules give.

use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::schema::add_rules;

/// How a node's agent is replaced.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum Strategy {
    /// The target DaemonSet is set to OnDelete and the operator deletes its
    /// agent pods node by node; the DaemonSet controller recreates them from
    /// the new template.
    #[default]
    InPlace,
    /// The new template runs in a canary DaemonSet owned by the SafeRollout;
    /// a node label moves each stage's nodes from the target to the canary
    /// (and back on a revert, the target's template untouched). After the
    /// last stage the target takes the new template and adopts the canary's
    /// pods without restarting them. Needs `spec.template`; lets a DRA
    /// driver hand over make-before-break (`agent.handover`).
    Selector,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::InPlace => "InPlace",
            Strategy::Selector => "Selector",
        }
    }
}

/// What kind of agent the DaemonSet runs (it decides the handover order).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum AgentKind {
    /// A kubelet device plugin: two instances registering one resource
    /// confuse the kubelet, so the old one always goes before the new one
    /// starts.
    DevicePlugin,
    /// A DRA kubelet plugin.
    #[serde(rename = "DRADriver")]
    DraDriver,
}

/// The order of the old and the new agent on a node (`Selector` only).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum HandoverOrder {
    /// The old agent goes, then the new one starts: the node is without an
    /// agent in between, which `maxUnavailable` pays for.
    #[default]
    BreakBeforeMake,
    /// The new agent starts beside the old one, which goes only once the
    /// new one is Ready and has published the node's ResourceSlices since.
    /// DRA drivers built with the kubelet plugin's rolling-update support
    /// only (Kubernetes 1.33 and later: two instances per node, the kubelet
    /// serving from the newer registered one and falling back to the older).
    MakeBeforeBreak,
}

impl HandoverOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            HandoverOrder::BreakBeforeMake => "BreakBeforeMake",
            HandoverOrder::MakeBeforeBreak => "MakeBeforeBreak",
        }
    }
}

/// `spec.agent`: what the DaemonSet runs and how a node hands over.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    /// DevicePlugin or DRADriver; when absent, detected from the template's
    /// mounts as preflight does (`/var/lib/kubelet/device-plugins`: a device
    /// plugin; `plugins_registry` and `plugins`: a DRA driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<AgentKind>,
    /// BreakBeforeMake (default) or MakeBeforeBreak (`kind: DRADriver` and
    /// `strategy: Selector` only).
    #[serde(default)]
    pub handover: HandoverOrder,
}

pub const MSG_SELECTOR_NEEDS_TEMPLATE: &str = "strategy: Selector needs spec.template: the canary DaemonSet runs spec.template, and a template written to the target DaemonSet by another tool would drop the term that keeps it off the canary's nodes";
pub const MSG_MAKE_BEFORE_BREAK_KIND: &str = "agent.handover: MakeBeforeBreak needs agent.kind: DRADriver (two device plugins registering one resource confuse the kubelet) and strategy: Selector (InPlace cannot run two agents on a node)";
pub const MSG_STRATEGY_IMMUTABLE: &str = "spec.strategy cannot change while the SafeRollout exists: delete it (its deletion hands the DaemonSet back) and create it again with the other strategy";

/// The rules on spec that read `strategy`, `agent` and `template` together.
pub(crate) fn spec_rules(s: &mut Schema) {
    add_rules(
        s,
        json!([
            {
                "rule": "!has(self.strategy) || self.strategy != 'Selector' || has(self.template)",
                "message": MSG_SELECTOR_NEEDS_TEMPLATE,
                "fieldPath": ".strategy",
            },
            {
                "rule": "!has(self.agent) || !has(self.agent.handover) \
                    || self.agent.handover != 'MakeBeforeBreak' \
                    || (has(self.agent.kind) && self.agent.kind == 'DRADriver' \
                        && has(self.strategy) && self.strategy == 'Selector')",
                "message": MSG_MAKE_BEFORE_BREAK_KIND,
                "fieldPath": ".agent.handover",
            },
        ]),
    );
}

/// The strategy field's schema: an enum that keeps its value for the
/// object's life (a transition rule), since a rollout in flight under one
/// strategy cannot be finished by the other.
pub(crate) fn strategy_schema(generator: &mut schemars::SchemaGenerator) -> Schema {
    let mut s = Strategy::json_schema(generator);
    if let Some(obj) = s.as_object_mut() {
        obj.insert("default".into(), json!("InPlace"));
        // Bounds the CEL rule's cost estimate (an enum alone does not).
        obj.insert("maxLength".into(), json!(16));
    }
    add_rules(
        &mut s,
        json!([{ "rule": "self == oldSelf", "message": MSG_STRATEGY_IMMUTABLE }]),
    );
    s
}
