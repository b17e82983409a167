//! The `Selector` strategy (`docs/design/selector-strategy.md`): the engine
//! ([`crate::rollout::decide`]) decides on one DaemonSet; here the target
//! DaemonSet `T` and the canary DaemonSet `C` are shown to it as one, and
//! its actions are translated into what moves nodes between the two.
//!
//! - **What the engine sees:** revisions named by content
//!   ([`revision_name`] of the template [`template::strip`]ped of what the
//!   strategy adds), so `T` with its handover expression is still the stable
//!   revision and `C`'s pods are the new one; the current revision is `C`'s
//!   while `C` is active, `T`'s otherwise ([`Pair::current`]); agent pods
//!   are both DaemonSets', those leaving a node shown as being deleted
//!   ([`engine_pods`]), so a handover looks to the engine exactly like an
//!   `InPlace` replacement.
//! - **What its actions mean** ([`translate`]): deleting a pod of the side a
//!   node leaves is that node's next handover state ([`crate::handover`];
//!   the first move is the one the engine's budget paid for); writing
//!   `spec.template` writes `C` (or retires it when `spec.template` is `T`'s
//!   again); restoring the last good template retires `C`.
//! - **What goes on by itself** ([`follow_ups`]): the later handover states
//!   of nodes mid-way (none costs a slot), `C` deleted once retired and
//!   empty, the promotion once the last stage passed
//!   ([`promotion`]), and the target's pods' hash labels kept on its
//!   current revision.
//!
//! Pure: the operator and the model build a [`Context`] from what they
//! observe and execute the [`Step`]s.

pub mod deletion;
pub mod objects;
pub mod observe;
pub mod promotion;
pub mod template;

use std::collections::BTreeMap;

use crate::handover::{HandoverOrder, HandoverState, HandoverStep, NodeAgents, Toward, next_step};
use crate::rollout::{Action, PodRef};
use crate::views::{AgentPod, PodsByNode};

pub use promotion::{PromotionFacts, PromotionStep};

/// Label on the canary DaemonSet's pod template (and so its pods and its
/// selector): the rollout whose canary they are.
pub const CANARY_OF_LABEL: &str = "saferollout.dev/canary-of";
/// Prefix of a rollout's handover label key on nodes.
pub const HANDOVER_LABEL_PREFIX: &str = "handover.saferollout.dev/";
/// Annotation on the canary DaemonSet: it is retiring (a revert, or
/// `spec.template` back to the target's): nodes go back to the target.
pub const RETIRING_ANNOTATION: &str = "saferollout.dev/retiring";

/// The handover label key of a rollout: the prefix and its id, hashed to fit
/// a label name (63 characters) when longer.
pub fn handover_label_key(rollout_id: &str) -> String {
    format!("{HANDOVER_LABEL_PREFIX}{}", fit(rollout_id, 63))
}

/// The canary DaemonSet's name for target `target`: fits a DaemonSet name
/// whose pods' names (name + 5) still fit 63 characters.
pub fn canary_name(target: &str) -> String {
    fit(&format!("{target}-saferollout-canary"), 58)
}

/// `name` when it is at most `max` long, else its head and a hash of it.
fn fit(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let hash = crate::revision::template_hash(&serde_json::Value::String(name.into()));
    let head: String = name.chars().take(max - hash.len() - 1).collect();
    format!("{}-{hash}", head.trim_end_matches(['-', '.']))
}

/// The engine's name of a revision: by the content of its template, stripped
/// of what the strategy adds ([`template::strip`]).
pub fn revision_name(stripped: &serde_json::Value) -> String {
    format!("s{}", crate::revision::template_hash(stripped))
}

/// Which DaemonSet owns a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    Target,
    Canary,
}

/// The canary DaemonSet as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canary<'a> {
    /// Its current revision, by content; `None` until its controller has
    /// observed its latest spec.
    pub revision: Option<&'a str>,
    pub retiring: bool,
}

/// The two DaemonSets as the engine sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair<'a> {
    /// The target's current revision by content; `None` until observed.
    pub target: Option<&'a str>,
    pub canary: Option<Canary<'a>>,
}

impl<'a> Pair<'a> {
    /// The canary exists and is not retiring: nodes go to it.
    pub fn canary_active(&self) -> bool {
        self.canary.is_some_and(|c| !c.retiring)
    }

    /// The revision a replaced node ends on.
    pub fn current(&self) -> Option<&'a str> {
        match self.canary {
            Some(c) if !c.retiring => c.revision,
            _ => self.target,
        }
    }

    /// Where nodes move now.
    pub fn toward(&self) -> Toward {
        if self.canary_active() {
            Toward::New
        } else {
            Toward::Old
        }
    }
}

/// One agent pod with its owner and its own `controller-revision-hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedPod<'a> {
    pub owner: Owner,
    /// The pod as the engine sees it, its revision already by content.
    pub pod: AgentPod<'a>,
    /// Its `controller-revision-hash` label as its owner wrote it.
    pub hash: &'a str,
}

/// The pod leaves its node: its owner does not run there in the node's
/// state, or both do and the node moves away from it. `target_expression`:
/// the target's template carries the handover expression (without it, as
/// after a promotion, the target runs whatever the label says).
pub fn leaving(
    owner: Owner,
    state: HandoverState,
    toward: Toward,
    target_expression: bool,
) -> bool {
    match owner {
        Owner::Target => {
            target_expression
                && (!state.target_runs()
                    || (state == HandoverState::Surge && toward == Toward::New))
        }
        Owner::Canary => {
            !state.canary_runs() || (state == HandoverState::Surge && toward == Toward::Old)
        }
    }
}

/// The engine's pods: both DaemonSets' by node, each pod leaving its node
/// shown as being deleted.
pub fn engine_pods<'a>(pods: &[OwnedPod<'a>], ctx: &Context) -> PodsByNode<'a> {
    let toward = ctx.pair.toward();
    let expression = ctx.promotion.target_has_expression;
    crate::views::pods_by_node(pods.iter().map(|p| {
        let mut pod = p.pod;
        pod.deleting |= leaving(p.owner, ctx.state(p.pod.node), toward, expression);
        pod
    }))
}

/// Lays the operator's memory of its own deletions over `pods` (a pod it
/// took away moments ago shows as being deleted). Once per pass, before
/// [`engine_pods`]: laid again over the engine's view, which shows leaving
/// pods as being deleted, the memory would read them as the cache
/// confirming the deletions and forget them (two Ready agents were deleted
/// at `maxUnavailable: 1` that way, found by the property tests).
pub fn lay_deletions(
    pods: &mut [OwnedPod],
    expectations: &mut crate::expectations::Expectations,
    now: jiff::Timestamp,
) {
    let mut views = crate::views::pods_by_node(pods.iter().map(|p| p.pod));
    expectations.apply(&mut views, now);
    for p in pods.iter_mut() {
        if let Some(v) = views
            .get(p.pod.node)
            .and_then(|vs| vs.iter().find(|v| v.uid == p.pod.uid))
        {
            p.pod.deleting = v.deleting;
        }
    }
}

/// What [`crate::handover::next_step`] reads of one node's pods; `serves`
/// says whether a Ready pod serves (for make-before-break: the node's pool
/// published since it got Ready).
pub fn node_agents<'p>(
    pods: impl IntoIterator<Item = &'p OwnedPod<'p>>,
    serves: impl Fn(&AgentPod) -> bool,
) -> NodeAgents {
    let mut agents = NodeAgents::default();
    for p in pods {
        let serving = !p.pod.deleting && p.pod.running && p.pod.ready && serves(&p.pod);
        match p.owner {
            Owner::Target => {
                agents.old_present = true;
                agents.old_serving |= serving;
            }
            Owner::Canary => {
                agents.new_present = true;
                agents.new_serving |= serving;
            }
        }
    }
    agents
}

/// The nodes of the current rollout's stages that passed.
pub fn judged_nodes(
    status: &saferollout_api::SafeRolloutStatus,
) -> std::collections::BTreeSet<&str> {
    status
        .stages
        .iter()
        .filter(|s| s.state == saferollout_api::StageState::Passed)
        .flat_map(|s| s.nodes.iter().map(String::as_str))
        .collect()
}

/// Everything the translation reads.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub pair: Pair<'a>,
    pub order: HandoverOrder,
    /// Every node's handover state (absent: [`HandoverState::Old`]).
    pub states: BTreeMap<&'a str, HandoverState>,
    /// Both DaemonSets' pods by node (as found, not as the engine sees them).
    pub pods: BTreeMap<&'a str, Vec<OwnedPod<'a>>>,
    /// Per node: whether each agent serves ([`node_agents`]).
    pub agents: BTreeMap<&'a str, NodeAgents>,
    /// `spec.template`'s content is the target's current revision.
    pub spec_is_target: bool,
    /// The target's current `controller-revision-hash` (its own name of
    /// its current revision), once observed.
    pub target_hash: Option<String>,
    /// The stable revision as status records it.
    pub stable: Option<&'a str>,
    /// Nodes of the stages of the current rollout that passed: under
    /// make-before-break a node keeps its old agent (the kubelet's fallback)
    /// until its stage's gates have judged the new one, or the whole
    /// revision passed (a node a stage let go, NotReady for a while, is not
    /// judged again by a stage).
    pub judged: std::collections::BTreeSet<&'a str>,
    /// What the promotion reads.
    pub promotion: PromotionFacts<'a>,
}

impl Context<'_> {
    pub fn state(&self, node: &str) -> HandoverState {
        self.states.get(node).copied().unwrap_or(HandoverState::Old)
    }

    fn step_of(&self, node: &str) -> HandoverStep {
        let state = self.state(node);
        if self.order == HandoverOrder::MakeBeforeBreak
            && state == HandoverState::Surge
            && self.pair.toward() == Toward::New
            && !self.judged.contains(node)
            && (self.stable.is_none() || self.stable != self.pair.current())
        {
            return HandoverStep::Wait(crate::handover::HandoverWait::Arriving);
        }
        next_step(
            self.state(node),
            self.pair.toward(),
            self.order,
            self.agents.get(node).copied().unwrap_or_default(),
        )
    }
}

/// What the executor does, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An engine action, unchanged.
    Engine(Action),
    /// Give the target its handover expression, then create the canary (or
    /// write its template) from `spec.template`, no longer retiring.
    WriteCanary,
    /// Mark the canary retiring: nodes go back to the target.
    RetireCanary,
    /// Write the last-good backup's template to the canary (only if it
    /// still hashes to `content`), no longer retiring.
    RestoreCanary {
        content: String,
    },
    /// Delete the (retired, empty) canary, then take the handover
    /// expression off the target's template.
    DeleteCanary,
    /// Take the handover expression off the target's template (nothing is
    /// handed over and no canary exists).
    ClearTarget,
    /// Write a node's handover label (`Old`: remove it), unless one of
    /// `unless_changed` changed since the pass read it.
    Handover {
        node: String,
        to: HandoverState,
        /// The pods whose deletion the engine did not pay for from the
        /// budget because they were not Ready (`PodRef::unchanged_since`).
        /// A pod deletion carries that as its precondition; a label write
        /// cannot, so the executor reads each pod first and writes nothing
        /// if one changed (it may have become Ready while the cache lagged:
        /// its controller would delete a serving agent unpaid). Empty for
        /// a move the budget paid for, or one that costs nothing.
        unless_changed: Vec<PodRef>,
    },
    /// Relabel target pods to the target's current hash (same content, a
    /// hash of a template that differed only by the handover expression),
    /// so a later RollingUpdate restarts none of them.
    AlignHashes {
        pods: Vec<PodRef>,
        hash: String,
    },
    Promote(PromotionStep),
}

/// The steps that perform one engine action under `Selector`.
pub fn translate(action: Action, ctx: &Context) -> Vec<Step> {
    let template_write = matches!(
        action,
        Action::ApplySpecTemplate | Action::RestoreLastGood { .. }
    );
    if template_write && !ctx.promotion.tainted.is_empty() {
        // A promotion under way finishes first (it holds the canary's nodes
        // still); the engine asks again on a later pass.
        return Vec::new();
    }
    match action {
        Action::ApplySpecTemplate if ctx.spec_is_target => {
            if ctx.pair.canary_active() {
                vec![Step::RetireCanary]
            } else {
                Vec::new()
            }
        }
        Action::ApplySpecTemplate => vec![Step::WriteCanary],
        // The stable revision is the target's (its template was never
        // changed): the revert retires the canary and the nodes walk back.
        Action::RestoreLastGood { .. } if ctx.stable.is_some() && ctx.stable == ctx.pair.target => {
            if ctx.pair.canary_active() {
                vec![Step::RetireCanary]
            } else {
                Vec::new()
            }
        }
        // The stable revision lives in the canary's pods (it passed there
        // and was not promoted yet, a later template written over it): the
        // revert writes it back to the canary, whose pods of the failed
        // revision are then replaced in place.
        Action::RestoreLastGood { content } => vec![Step::RestoreCanary { content }],
        Action::DeletePods { pods } => delete_pods(pods, ctx),
        other => vec![Step::Engine(other)],
    }
}

/// A deletion of a pod of the side its node leaves is the node's next
/// handover state; of a pod of the side nodes go to (a stale template of
/// the same DaemonSet), a deletion its OnDelete controller answers.
fn delete_pods(pods: Vec<PodRef>, ctx: &Context) -> Vec<Step> {
    let mut deletions = Vec::new();
    let mut steps = Vec::new();
    for r in pods {
        // A node the promotion has tainted is the promotion's until it
        // ends: neither DaemonSet creates a pod there, so a pod deleted or
        // a node moved now would be left without an agent, and the
        // promotion waits for no node mid-handover (found by the property
        // tests: a stale canary pod deleted on a tainted node, the node
        // then moved to `surge`, and neither went on). The engine asks
        // again once the promotion is over, as for a template write.
        if ctx.promotion.tainted.contains(r.node.as_str()) {
            continue;
        }
        let owner = ctx
            .pods
            .get(r.node.as_str())
            .and_then(|ps| ps.iter().find(|p| p.pod.uid == r.uid))
            .map(|p| p.owner);
        // A target without its handover expression (the promotion wrote
        // the promoted template to it) no longer follows the labels: its
        // pod is deleted and it recreates it from that template.
        let expression = ctx.promotion.target_has_expression;
        let moves_node = match (owner, ctx.pair.toward()) {
            (Some(Owner::Target), Toward::New) => expression,
            (Some(Owner::Canary), Toward::Old) => true,
            (Some(_), _) => false,
            (None, _) => continue, // gone already
        };
        if !moves_node {
            deletions.push(r);
            continue;
        }
        if let HandoverStep::Move { to, .. } = ctx.step_of(&r.node) {
            let unpaid = r.unchanged_since.is_some().then(|| r.clone());
            let same_move = steps.iter_mut().find_map(|s| match s {
                Step::Handover {
                    node,
                    to: t,
                    unless_changed,
                } if *node == r.node && *t == to => Some(unless_changed),
                _ => None,
            });
            match same_move {
                Some(unless_changed) => unless_changed.extend(unpaid),
                None => steps.push(Step::Handover {
                    node: r.node,
                    to,
                    unless_changed: unpaid.into_iter().collect(),
                }),
            }
        }
    }
    if !deletions.is_empty() {
        steps.push(Step::Engine(Action::DeletePods { pods: deletions }));
    }
    steps
}

/// The canary's revision passed (it is the stable one): its promotion is
/// due.
fn promotes(ctx: &Context, c: Canary) -> bool {
    c.revision.is_some() && c.revision == ctx.stable
}

/// What goes on without the engine asking, given the steps its actions
/// became this pass (`translated`).
pub fn follow_ups(ctx: &Context, translated: &[Step]) -> Vec<Step> {
    let mut steps = Vec::new();
    // Nodes mid-way go on: none of these moves costs a slot (the node's
    // serving agent is the one it keeps, or it has none).
    for (node, state) in &ctx.states {
        if !matches!(state, HandoverState::Drain | HandoverState::Surge) {
            continue;
        }
        let canary_here = ctx
            .pods
            .get(node)
            .is_some_and(|ps| ps.iter().any(|p| p.owner == Owner::Canary));
        if !ctx.promotion.target_has_expression && !canary_here {
            // The target (promoted meanwhile) no longer reads the label and
            // runs here; nothing of the canary is left to hand over.
            steps.push(Step::Handover {
                node: node.to_string(),
                to: HandoverState::Old,
                unless_changed: Vec::new(),
            });
        } else if let HandoverStep::Move { to, costs: false } = ctx.step_of(node) {
            steps.push(Step::Handover {
                node: node.to_string(),
                to,
                unless_changed: Vec::new(),
            });
        }
    }
    let labelled = ctx.states.values().any(|s| *s != HandoverState::Old);
    let writes_canary = translated.contains(&Step::WriteCanary);
    match ctx.pair.canary {
        // A promotion given up before the target's template was written
        // (the canary retiring, or given another template): the target
        // still reads the labels, so the taints only keep the agents off
        // their nodes.
        Some(c)
            if (c.retiring || !promotes(ctx, c))
                && ctx.promotion.target_has_expression
                && !ctx.promotion.tainted.is_empty() =>
        {
            steps.push(Step::Promote(promotion::untaint_all(ctx)));
        }
        Some(c) if c.retiring => {
            let canary_pods = ctx
                .pods
                .values()
                .flatten()
                .any(|p| p.owner == Owner::Canary);
            if !labelled && !canary_pods && !writes_canary {
                steps.push(Step::DeleteCanary);
            }
        }
        Some(c) => {
            // Not in a pass that moves nodes: the promotion reads every
            // node's state as this pass found it.
            let moves = translated.iter().any(|s| !matches!(s, Step::Engine(_)));
            if promotes(ctx, c) && !moves {
                steps.extend(promotion::next(ctx).map(Step::Promote));
            }
        }
        None => {
            if let Some(step) = promotion::finish(ctx) {
                steps.push(Step::Promote(step));
            } else if !labelled && !writes_canary && ctx.promotion.target_has_expression {
                steps.push(Step::ClearTarget);
            }
        }
    }
    if ctx.pair.canary.is_none()
        && let Some(hash) = ctx.target_hash.as_deref()
    {
        let pods: Vec<PodRef> = ctx
            .pods
            .values()
            .flatten()
            .filter(|p| p.owner == Owner::Target && !p.pod.deleting && p.hash != hash)
            .filter(|p| Some(p.pod.revision) == ctx.pair.target)
            .map(|p| PodRef {
                name: p.pod.name.to_string(),
                uid: p.pod.uid.to_string(),
                node: p.pod.node.to_string(),
                unchanged_since: None,
            })
            .collect();
        if !pods.is_empty() {
            steps.push(Step::AlignHashes {
                pods,
                hash: hash.to_string(),
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests;
