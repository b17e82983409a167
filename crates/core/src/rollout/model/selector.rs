//! The model under the `Selector` strategy: a second DaemonSet (the canary),
//! the two DaemonSet controllers' rules on the handover label and the
//! promotion taint, and the operator's side: the engine's view of the pair
//! and the execution of [`crate::selector`]'s steps.
//!
//! The DaemonSet controller's rules (`pkg/controller/daemon`,
//! `nodeShouldRunDaemonPod`), per DaemonSet and node: where its node
//! affinity matches and no untolerated NoSchedule taint is set, it creates a
//! pod if it owns none there; where its affinity does not match, it deletes
//! the pods it owns there; under an untolerated NoSchedule taint (the
//! promotion's) it does neither. The target's affinity matches where the
//! handover label is absent or `surge` (once it carries the expression);
//! the canary's where it is `surge` or `new`.
//!
//! Revisions: the target's pods carry the hash `<revision>+x` while the
//! target's template carries the handover expression (a different template
//! to its controller, the same content to the engine), the canary's
//! `c-<revision>`; a pod's `revision` is the content either way. A pod the
//! promotion released keeps the canary as its owner, with the target's
//! hash, until the next tick of the controllers.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;

use super::Model;
use super::cluster::{Cluster, MCanary, MDaemonSet, MPod, SelectorCluster};
use super::executor::Seen;
use crate::handover::{HandoverOrder, HandoverState};
use crate::rollout::Action;
use crate::selector::promotion::{PROMOTING_TAINT, PromotionFacts, PromotionStep};
use crate::selector::{Canary, Context, OwnedPod, Owner, Pair, Step};

/// The hash the target's controller gives its pods of `revision`.
/// The prefix of the canary's hashes.
const CANARY_HASH_PREFIX: &str = "c-";

fn target_hash(revision: &str, expression: bool) -> String {
    if expression {
        format!("{revision}+x")
    } else {
        revision.to_string()
    }
}

fn is_promoting(t: &Taint) -> bool {
    t.key == PROMOTING_TAINT && t.effect == "NoSchedule"
}

impl Cluster {
    /// The template the engine sees as the DaemonSet's: the active
    /// canary's under `Selector`, else the target's.
    pub fn carrier_template(&self) -> &str {
        self.selector
            .as_ref()
            .and_then(|s| s.canary.as_ref())
            .filter(|c| !c.retiring)
            .map_or(&self.ds.template, |c| &c.ds.template)
    }

    fn sel(&self) -> &SelectorCluster {
        self.selector.as_ref().expect("Selector mode")
    }

    fn sel_mut(&mut self) -> &mut SelectorCluster {
        self.selector.as_mut().expect("Selector mode")
    }

    /// A node's handover state (an unknown value reads as absent).
    pub fn handover_state(&self, node: &str) -> HandoverState {
        let key = &self.sel().key;
        let value = self
            .nodes
            .get(node)
            .and_then(|n| n.labels.get(key))
            .map(String::as_str);
        HandoverState::of_label(value).unwrap_or(HandoverState::Old)
    }

    /// Both DaemonSet controllers, one second. Returns the pods created, as
    /// (node, revision).
    pub(super) fn selector_controllers(&mut self, now: Timestamp) -> Vec<(String, String)> {
        // Controllers observe their DaemonSets' specs (and the canary's
        // status follows a sync).
        let ds = &mut self.ds;
        if ds.observed_generation < ds.generation {
            ds.observed_generation = ds.generation;
            let next = ds.revisions.values().max().copied().unwrap_or(0) + 1;
            ds.revisions.insert(ds.template.clone(), next);
        }
        let canary_nodes: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.owner == Owner::Canary)
            .map(|p| p.node.clone())
            .collect();
        let all_tainted = canary_nodes.iter().all(|n| {
            self.nodes
                .get(n)
                .is_some_and(|n| n.taints.iter().any(is_promoting))
        });
        if let Some(c) = self.sel_mut().canary.as_mut()
            && (c.ds.observed_generation < c.ds.generation || c.sync_pending)
        {
            c.ds.observed_generation = c.ds.generation;
            let next = c.ds.revisions.values().max().copied().unwrap_or(0) + 1;
            c.ds.revisions.insert(c.ds.template.clone(), next);
            c.held = all_tainted;
            c.sync_pending = false;
        }
        // A released pod (the target's hash, no canary label) no longer
        // matches the canary's selector: its controller lets it go and the
        // target's adopts it.
        for p in self.pods.values_mut() {
            if p.owner == Owner::Canary && !p.hash.starts_with(CANARY_HASH_PREFIX) {
                p.owner = Owner::Target;
            }
        }
        let mut created = Vec::new();
        let covered = self.covered_nodes();
        let expression = self.sel().target_expression;
        let target_template = self.ds.template.clone();
        let canary_template = self.sel().canary.as_ref().map(|c| c.ds.template.clone());
        for node in covered {
            let state = self.handover_state(&node);
            let promoting = self.nodes[&node].taints.iter().any(is_promoting);
            let target_matches = !expression || state.target_runs();
            let canary_matches = canary_template.is_some() && state.canary_runs();
            for (owner, matches) in [
                (Owner::Target, target_matches),
                (Owner::Canary, canary_matches),
            ] {
                let owns = self
                    .pods
                    .values()
                    .any(|p| p.node == node && p.owner == owner);
                if matches && !promoting && !owns {
                    let (revision, hash) = match owner {
                        Owner::Target => (
                            target_template.clone(),
                            target_hash(&target_template, expression),
                        ),
                        Owner::Canary => {
                            let t = canary_template.clone().expect("canary matches");
                            let hash = format!("{CANARY_HASH_PREFIX}{t}");
                            (t, hash)
                        }
                    };
                    self.create_owned_pod(&node, &revision, owner, &hash, now);
                    created.push((node.clone(), revision));
                }
                if !matches {
                    for p in self
                        .pods
                        .values_mut()
                        .filter(|p| p.node == node && p.owner == owner)
                    {
                        start_terminating(p, now);
                    }
                }
            }
        }
        created
    }

    fn selector_write_canary(&mut self, template: &str) {
        let sel = self.sel_mut();
        if !sel.target_expression {
            sel.target_expression = true;
            self.ds.generation += 1;
        }
        let sel = self.sel_mut();
        match sel.canary.as_mut() {
            Some(c) => {
                if c.ds.template != template {
                    c.ds.template = template.to_string();
                    c.ds.generation += 1;
                }
                c.retiring = false;
            }
            None => {
                sel.canary = Some(MCanary {
                    ds: MDaemonSet {
                        generation: 1,
                        observed_generation: 0,
                        strategy: "OnDelete".into(),
                        template: template.to_string(),
                        revisions: BTreeMap::new(),
                    },
                    retiring: false,
                    held: false,
                    sync_pending: false,
                });
            }
        }
    }

    /// Deletes the canary; `orphan`: its pods go to the target (which
    /// adopts them: they match its selector), else with it.
    fn selector_delete_canary(&mut self, orphan: bool, now: Timestamp) {
        self.sel_mut().canary = None;
        for p in self.pods.values_mut().filter(|p| p.owner == Owner::Canary) {
            if orphan {
                p.owner = Owner::Target;
            } else {
                start_terminating(p, now);
            }
        }
    }

    fn selector_clear_target(&mut self) {
        let sel = self.sel_mut();
        if sel.target_expression {
            sel.target_expression = false;
            self.ds.generation += 1;
        }
    }

    fn set_handover(&mut self, node: &str, to: HandoverState) {
        let key = self.sel().key.clone();
        if let Some(n) = self.nodes.get_mut(node) {
            match to.label_value() {
                Some(v) => n.labels.insert(key, v.to_string()),
                None => n.labels.remove(&key),
            };
        }
    }
}

fn start_terminating(p: &mut MPod, now: Timestamp) {
    if p.terminating.is_none() {
        p.terminating = Some(1);
        p.deleted = Some(now);
        p.ready = false;
        p.ready_since = None;
    }
}

impl Model {
    /// A model whose SafeRollout uses `strategy: Selector` in GitOps mode,
    /// settled on `spec-g1`.
    pub fn new_selector(nodes: usize, order: HandoverOrder) -> Self {
        let mut m = Model::new(nodes);
        m.spec.strategy = saferollout_api::Strategy::Selector;
        m.cluster.selector = Some(SelectorCluster::new(order));
        m.spec_hash = Some("g1".into());
        m.cluster.ds.template = "spec-g1".into();
        m.cluster.ds.revisions = BTreeMap::from([("spec-g1".to_string(), 1)]);
        for p in m.cluster.pods.values_mut() {
            p.revision = "spec-g1".into();
            p.hash = "spec-g1".into();
        }
        m.caches = super::executor::Caches::new(&m.cluster);
        m
    }

    /// The revision the engine sees as the DaemonSet's template: the active
    /// canary's under `Selector`, else the target's.
    pub fn carrier_template(&self) -> &str {
        self.cluster.carrier_template()
    }

    /// Nothing of the strategy is left: no canary, handover label or
    /// promotion taint, the target's template without the expression, every
    /// pod the target's with its current hash. Else what is left. A node in
    /// `quarantined` keeping a canary pod keeps the canary too (its pod
    /// would go with it), and so the handover of every node: the promotion
    /// waits for the quarantine to be lifted.
    pub fn selector_cleared(&self, quarantined: &[String]) -> Result<(), String> {
        let sel = self.cluster.sel();
        let held = self
            .cluster
            .pods
            .values()
            .any(|p| p.owner == Owner::Canary && quarantined.contains(&p.node));
        if held {
            return Ok(());
        }
        if let Some(c) = &sel.canary {
            return Err(format!("the canary: {c:?}"));
        }
        if sel.target_expression {
            return Err("the target's handover expression".into());
        }
        for n in self.cluster.nodes.values() {
            if n.labels.contains_key(&sel.key) {
                return Err(format!("{}'s handover label", n.name));
            }
            if n.taints.iter().any(is_promoting) {
                return Err(format!("{}'s promotion taint", n.name));
            }
        }
        for p in self.cluster.pods.values() {
            if quarantined.contains(&p.node) {
                continue;
            }
            let hash = target_hash(&self.cluster.ds.template, sel.target_expression);
            if p.owner != Owner::Target || p.hash != hash {
                return Err(format!("pod {p:?}"));
            }
        }
        Ok(())
    }

    /// The pods a pass sees, with their owners and the operator's memory
    /// of its deletions (a pod it took away moments ago shows as leaving).
    pub(super) fn selector_pods<'s>(&mut self, seen: &'s Seen) -> Vec<OwnedPod<'s>> {
        let mut pods: Vec<OwnedPod> = seen
            .pods
            .pods
            .values()
            .map(|p| OwnedPod {
                owner: p.owner,
                pod: p.view(),
                hash: &p.hash,
            })
            .collect();
        crate::selector::lay_deletions(&mut pods, &mut self.expectations, self.now);
        pods
    }

    /// The translation's context on what a pass saw (its pods already with
    /// the operator's memory of its deletions).
    pub(super) fn selector_context<'s>(
        &'s self,
        seen: &'s Seen,
        pods: &[OwnedPod<'s>],
    ) -> Context<'s> {
        let ds_seen = &seen.daemonset;
        let sel = ds_seen.selector.as_ref().expect("Selector mode");
        let target = &ds_seen.ds;
        let pair = Pair {
            target: (target.observed_generation >= target.generation)
                .then_some(target.template.as_str()),
            canary: sel.canary.as_ref().map(|c| Canary {
                revision: (c.ds.observed_generation >= c.ds.generation)
                    .then_some(c.ds.template.as_str()),
                retiring: c.retiring,
            }),
        };
        let states: BTreeMap<&str, HandoverState> = seen
            .nodes
            .nodes
            .values()
            .filter_map(|n| {
                let v = n.labels.get(&sel.key)?;
                Some((n.name.as_str(), HandoverState::of_label(Some(v)).ok()?))
            })
            .collect();
        let mut by_node: BTreeMap<&str, Vec<OwnedPod>> = BTreeMap::new();
        for p in pods {
            by_node.entry(p.pod.node).or_default().push(*p);
        }
        let agents = by_node
            .iter()
            .map(|(n, ps)| (*n, crate::selector::node_agents(ps, |_| true)))
            .collect();
        let spec_revision = self.spec_hash.as_ref().map(|h| format!("spec-{h}"));
        let mut tainted: std::collections::BTreeSet<&str> = seen
            .nodes
            .nodes
            .values()
            .filter(|n| n.taints.iter().any(is_promoting))
            .map(|n| n.name.as_str())
            .collect();
        // Its own taint writes the node cache does not show yet (removals
        // it does show are forgotten as they are made).
        tainted.extend(
            self.taints_written
                .iter()
                .filter(|n| seen.nodes.nodes.contains_key(n.as_str()))
                .map(String::as_str),
        );
        Context {
            pair,
            order: sel.order,
            states,
            pods: by_node,
            agents,
            spec_is_target: spec_revision.as_deref() == Some(target.template.as_str()),
            target_hash: pair
                .target
                .map(|_| target_hash(&target.template, sel.target_expression)),
            stable: self.status.stable_revision.as_deref(),
            judged: crate::selector::judged_nodes(&self.status),
            promotion: PromotionFacts {
                tainted,
                canary_held: sel.canary.as_ref().is_some_and(|c| c.held),
                target_on_canary: sel.canary.as_ref().is_some_and(|c| {
                    c.ds.template == target.template
                        && !sel.target_expression
                        && target.observed_generation >= target.generation
                }),
                target_written: sel
                    .canary
                    .as_ref()
                    .is_some_and(|c| c.ds.template == target.template && !sel.target_expression),
                target_has_expression: sel.target_expression,
            },
        }
    }

    /// Performs one step of the translation.
    pub(super) fn perform_step(&mut self, step: &Step, decided_generation: i64) {
        let target_generation = self.cluster.ds.generation;
        self.perform_step_writes(step, decided_generation);
        // A write of the target (its handover expression, the promoted
        // template) is remembered as the operator remembers the generation
        // its update returned: no pass decides on a cache older than it (a
        // handover label written on a lagging cache's word that the target
        // still reads labels left a joined node with two agents, found by
        // the property tests).
        if self.cluster.ds.generation != target_generation {
            self.expectations
                .daemonset_written(self.cluster.ds.generation);
        }
    }

    fn perform_step_writes(&mut self, step: &Step, decided_generation: i64) {
        let now = self.now;
        match step {
            Step::Engine(a) => self.perform(a, decided_generation),
            Step::WriteCanary => {
                let template = format!("spec-{}", self.spec_hash.clone().expect("GitOps mode"));
                self.cluster.selector_write_canary(&template);
                let generation = self.cluster.sel().canary.as_ref().map(|c| c.ds.generation);
                if let (Some(a), Some(g)) = (self.status.applied_template.as_mut(), generation) {
                    a.generation = Some(g);
                }
            }
            Step::RestoreCanary { content } => {
                // As the operator does: only a backup holding that content.
                let Some(backup) = self.cluster.backup.clone() else {
                    return;
                };
                if self.cluster.backup_content.as_deref() == Some(content.as_str()) {
                    self.cluster.selector_write_canary(&backup);
                }
            }
            Step::RetireCanary => {
                if let Some(c) = self.cluster.sel_mut().canary.as_mut() {
                    c.retiring = true;
                }
            }
            Step::DeleteCanary => {
                self.cluster.selector_delete_canary(false, now);
                self.cluster.selector_clear_target();
            }
            Step::ClearTarget => self.cluster.selector_clear_target(),
            Step::Handover {
                node,
                to,
                unless_changed,
            } => {
                // As the operator does: each unpaid pod read first, the
                // label written only if none changed.
                let changed = unless_changed.iter().any(|r| {
                    self.cluster
                        .pod_changed_since(&r.uid, r.unchanged_since.as_deref())
                });
                if !changed {
                    self.hand_over(node, *to);
                }
            }
            Step::AlignHashes { pods, hash } => {
                for r in pods {
                    if let Some(p) = self.cluster.pods.get_mut(&r.uid)
                        && p.owner == Owner::Target
                    {
                        p.hash = hash.clone();
                    }
                }
            }
            Step::Promote(p) => self.promote(p),
        }
    }

    /// Writes a node's handover label, remembering (as the operator does,
    /// before the call) the serving agents the write takes away, whose
    /// controller deletes them: the budget paid for them.
    fn hand_over(&mut self, node: &str, to: HandoverState) {
        // Only the pods whose controller deletes them in the new state: at
        // `surge` the leaving agent stays until the node moves on (the
        // engine sees it leaving through the label), and remembered as
        // deleted it would read as no longer serving to the handover itself.
        let expression = self.cluster.sel().target_expression;
        let leaving: Vec<(String, bool)> = self
            .cluster
            .pods
            .values()
            .filter(|p| p.node == node && p.terminating.is_none())
            .filter(|p| match p.owner {
                Owner::Target => expression && !to.target_runs(),
                Owner::Canary => !to.canary_runs(),
            })
            .map(|p| (p.uid.clone(), p.serves()))
            .collect();
        for (uid, serves) in &leaving {
            self.expectations.pod_deleted(uid, self.now);
            // Make-before-break: the other agent serves the node on.
            let served_on = self
                .cluster
                .pods
                .values()
                .any(|p| p.node == node && p.uid != *uid && p.serves());
            if *serves && !served_on {
                self.agent_deleted(node);
            }
        }
        self.cluster.set_handover(node, to);
    }

    fn promote(&mut self, step: &PromotionStep) {
        let now = self.now;
        match step {
            PromotionStep::Taint { nodes } => {
                self.taints_written.extend(nodes.iter().cloned());
                for n in nodes {
                    let taint = Taint {
                        key: PROMOTING_TAINT.into(),
                        value: Some(super::ROLLOUT_ID.into()),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    };
                    self.cluster.taint(n, taint);
                }
            }
            PromotionStep::NudgeCanary => {
                if let Some(c) = self.cluster.sel_mut().canary.as_mut() {
                    c.sync_pending = true;
                }
            }
            PromotionStep::WriteTarget => {
                let Some(template) = self
                    .cluster
                    .sel()
                    .canary
                    .as_ref()
                    .map(|c| c.ds.template.clone())
                else {
                    return;
                };
                self.cluster.ds.template = template;
                self.cluster.sel_mut().target_expression = false;
                self.cluster.ds.generation += 1;
            }
            // The pod stays the canary's until its controller lets it go
            // and the target's adopts it (`selector_controllers`): a pass
            // in between sees a canary pod with the target's hash.
            PromotionStep::Release { pods, hash } => {
                for r in pods {
                    if let Some(p) = self.cluster.pods.get_mut(&r.uid)
                        && p.owner == Owner::Canary
                    {
                        p.hash = hash.clone();
                    }
                }
            }
            PromotionStep::DeleteCanary => self.cluster.selector_delete_canary(true, now),
            PromotionStep::Untaint { nodes } => {
                for n in nodes {
                    self.taints_written.remove(n);
                    self.cluster.untaint(n, PROMOTING_TAINT);
                }
            }
            PromotionStep::RemoveLabels { nodes } => {
                for n in nodes {
                    self.cluster.set_handover(n, HandoverState::Old);
                }
            }
        }
    }

    /// The steps of a pass under `Selector`: its actions translated, then
    /// what goes on by itself.
    pub(super) fn selector_steps(
        &self,
        seen: &Seen,
        pods: &[OwnedPod],
        actions: &[Action],
    ) -> Vec<Step> {
        let ctx = self.selector_context(seen, pods);
        let mut steps: Vec<Step> = actions
            .iter()
            .flat_map(|a| crate::selector::translate(a.clone(), &ctx))
            .collect();
        let more = crate::selector::follow_ups(&ctx, &steps);
        steps.extend(more);
        steps
    }
}
