//! The invariant checker: the safety rules, judged on each decision (on the
//! snapshot the pass made it from), on each action the executor performs
//! and on the cluster after each pass; every breach is recorded in
//! [`Checker::violations`]. Also what the rules and the tests count on: the
//! nodes down because of the operator, the nodes each revision reached, the
//! most nodes on a stage's target at once.

use std::collections::{BTreeMap, BTreeSet};

use saferollout_api::{ROLLOUT_LABEL, STAGE_LABEL, StageState};

use super::cluster::{Cluster, MNode, RESOURCE, content_of};
use super::executor::Seen;
use super::{Model, ROLLOUT_ID};
use crate::rollout::{Action, Decision};

/// What the checker found and keeps count of.
#[derive(Debug, Default)]
pub struct Checker {
    /// Violations of the safety rules seen so far.
    pub violations: Vec<String>,
    /// Nodes whose Ready agent the operator deleted and that have not served
    /// since (the disruption the budget limits).
    pub disrupted: BTreeSet<String>,
    /// Nodes whose agent failed a gate of a revert and has not served since.
    /// They stay outside the budget until their agent is Ready again, even
    /// when a new revision resets the stages that recorded the failure: the
    /// node is down because of its agent, not of the operator.
    failed_agents: BTreeSet<String>,
    /// Per revision: the nodes that ever got a pod of it.
    pub touched: BTreeMap<String, BTreeSet<String>>,
    /// Per node: agent pods created on it so far.
    pub created: BTreeMap<String, usize>,
    /// Per stage index: most nodes seen on the target at once.
    pub max_on_target: BTreeMap<usize, usize>,
    /// The budget (`maxUnavailable` resolved against the covered nodes) the
    /// last pass decided with.
    pass_budget: usize,
    /// The budget the last pass that deleted pods decided with: a
    /// percentage shrinks when nodes go NotReady, which the operator cannot
    /// undo.
    budget_at_last_delete: usize,
    /// Per probe pod: passes in a row it existed while its probe was not
    /// pending in the current stage (it should be deleted).
    probe_orphaned: BTreeMap<String, usize>,
}

impl Checker {
    /// An agent pod of `revision` was created on `node`.
    pub fn record_pod(&mut self, node: &str, revision: &str) {
        *self.created.entry(node.to_string()).or_default() += 1;
        self.touched
            .entry(revision.to_string())
            .or_default()
            .insert(node.to_string());
    }

    /// After a second of the cluster: a node that stops being covered
    /// (NotReady, tainted, gone) leaves the budget: the DaemonSet controller
    /// does not count it either, and its agent comes back when the node
    /// does, outside the operator's hands. A node whose agent serves again
    /// is no longer disrupted.
    pub fn after_second(&mut self, cluster: &Cluster) {
        let covered = cluster.covered_nodes();
        self.disrupted.retain(|n| covered.contains(n));
        let serving: BTreeSet<String> = cluster
            .pods
            .values()
            .filter(|p| p.serves())
            .map(|p| p.node.clone())
            .collect();
        self.disrupted.retain(|n| !serving.contains(n));
        self.failed_agents
            .retain(|n| covered.contains(n) && !serving.contains(n));
    }

    /// `node` is gone, and with it what it counted for.
    pub fn node_deleted(&mut self, node: &str) {
        self.disrupted.remove(node);
    }
}

impl Model {
    /// Rules on an action as it is performed.
    pub(super) fn check_action(&mut self, action: &Action) {
        // Owner-aware mode: nothing the owner reconciles is ever written.
        let owner = self
            .owner
            .as_ref()
            .map(|(api_version, kind)| crate::owner::OwnerView {
                api_version,
                kind,
                name: "vendor",
            });
        let reconciled = match action {
            Action::TakeOverUpdates => owner.is_some_and(|o| o.reconciles_strategy()),
            Action::ApplySpecTemplate | Action::RestoreLastGood { .. } => owner.is_some(),
            _ => false,
        };
        if reconciled {
            self.checker.violations.push(format!(
                "a write to a DaemonSet its owner reconciles: {action:?}"
            ));
        }
        match action {
            Action::RestoreLastGood { content } => match &self.cluster.backup {
                None => self
                    .checker
                    .violations
                    .push("restore without a backup".into()),
                Some(backup) if *content != content_of(backup) => {
                    self.checker.violations.push(format!(
                        "a revert asked to write {content}, not what the operator backed up of {backup}"
                    ));
                }
                Some(_) => {}
            },
            // The model has no device evidence: no probe is asked for.
            Action::CreateProbe { .. } | Action::DeleteProbes { .. } => {
                self.checker
                    .violations
                    .push(format!("a probe action without a probe gate: {action:?}"));
            }
            _ => {}
        }
    }

    /// The pass deleted the serving agent of `node`: down because of the
    /// operator, unless its agent failed a gate (see `exempt_nodes`).
    pub(super) fn agent_deleted(&mut self, node: &str) {
        if !self.exempt_nodes().contains(node) {
            self.checker.disrupted.insert(node.to_string());
            self.checker.budget_at_last_delete = self.checker.pass_budget;
        }
    }

    /// The nodes whose agent failed a gate, when the operator reverts them
    /// itself (outside the budget): not under Quarantine or Halt, which keep
    /// the budget. A node stays exempt until its agent serves again.
    fn exempt_nodes(&self) -> BTreeSet<String> {
        let mut exempt = self.checker.failed_agents.clone();
        exempt.extend(self.failed_in_status());
        exempt
    }

    /// The nodes the status records as failing a gate of the target, when
    /// the operator reverts them itself.
    fn failed_in_status(&self) -> BTreeSet<String> {
        let stopped =
            self.status.stopped.as_ref().is_some_and(|s| {
                self.status.target_revision.as_deref() == Some(s.revision.as_str())
            });
        if stopped {
            return BTreeSet::new();
        }
        self.status
            .stages
            .iter()
            .flat_map(|s| s.failed_nodes.iter().cloned())
            .collect()
    }

    /// Rules on what a decision may do, judged on the snapshot it was made from.
    pub(super) fn check_decision(&mut self, d: &Decision, seen: &Seen) {
        // The budget the pass decides with: `maxUnavailable` resolved
        // against the nodes its cache shows covered.
        let covered = seen.nodes.nodes.values().filter(|n| n.is_covered()).count();
        self.checker.pass_budget = self.budget(covered);
        let old = &self.status;
        let new = &d.status;
        // A blocked revision never progresses (one a retry unblocks in this
        // very pass is free again).
        for b in old.blocked_revisions.iter().filter(|b| {
            new.blocked_revisions
                .iter()
                .any(|n| n.revision == b.revision)
        }) {
            if new.stable_revision.as_deref() == Some(b.revision.as_str())
                && old.stable_revision != new.stable_revision
            {
                self.checker
                    .violations
                    .push(format!("blocked revision {} became stable", b.revision));
            }
            if seen.daemonset.carrier_template() == b.revision
                && d.actions
                    .iter()
                    .any(|a| matches!(a, Action::DeletePods { .. }))
            {
                self.checker.violations.push(format!(
                    "pods deleted while the DaemonSet carries blocked revision {}",
                    b.revision
                ));
            }
            if let (Some(h), Some(bh)) = (&self.spec_hash, &b.template_hash)
                && h == bh
                && d.actions.contains(&Action::ApplySpecTemplate)
            {
                self.checker
                    .violations
                    .push(format!("blocked spec.template {h} written again"));
            }
        }
        // A revision stopped by Quarantine or Halt never progresses: while
        // the DaemonSet carries it nothing is replaced, restored or
        // relabelled. (A retry of it in this very pass unblocks it; a new
        // spec.template from Git is written over it, and the check above
        // holds that the stopped one is never written again.)
        if let Some(stopped) = old.stopped.as_ref().filter(|s| {
            s.revision == seen.daemonset.carrier_template() && new.stopped.as_ref() == Some(*s)
        }) {
            for a in &d.actions {
                if matches!(
                    a,
                    Action::DeletePods { .. }
                        | Action::RestoreLastGood { .. }
                        | Action::LabelNodes { .. }
                        | Action::UnlabelNodes { .. }
                ) {
                    self.checker.violations.push(format!(
                        "revision {} stopped by {:?}, yet {a:?}",
                        stopped.revision, stopped.policy
                    ));
                }
            }
        }
        // Every pod a pass deletes:
        // - only where the DaemonSet controller will refill it;
        // - while a stage rolls, only once the node carries its stage's
        //   label (the node itself, not the cache the pass read: the
        //   writer's answer may come before the watch shows the label).
        //   Rolling: the pass saw the DaemonSet on a target not yet stable.
        //   (Returning nodes to the stable revision labels nothing.)
        let rolling = new.phase == Some(saferollout_api::Phase::Progressing)
            && new.target_revision.as_deref() == Some(seen.daemonset.carrier_template())
            && new.target_revision != new.stable_revision;
        for a in &d.actions {
            let Action::DeletePods { pods } = a else {
                continue;
            };
            for p in pods {
                let eligible = seen.nodes.nodes.get(&p.node).is_some_and(MNode::is_covered);
                if !eligible {
                    self.checker
                        .violations
                        .push(format!("deleted the agent of ineligible node {}", p.node));
                }
                // (A node gone meanwhile takes its pods with it.)
                let Some(node) = self.cluster.nodes.get(&p.node).filter(|_| rolling) else {
                    continue;
                };
                // A node listed by two stages belongs to the later one.
                let stage = new
                    .stages
                    .iter()
                    .filter(|s| s.nodes.contains(&p.node))
                    .map(|s| s.index.to_string())
                    .next_back();
                let carries = node.labels.get(ROLLOUT_LABEL).map(String::as_str)
                    == Some(ROLLOUT_ID)
                    && stage.is_some()
                    && node.labels.get(STAGE_LABEL) == stage.as_ref();
                if !carries {
                    self.checker.violations.push(format!(
                        "deleted the agent of node {} before it carried the label of stage {}",
                        p.node,
                        stage.as_deref().unwrap_or("(none)")
                    ));
                }
            }
        }
        // A baseline is taken only from a status written after the node's
        // (stable) agent became Ready: right after a revert the node may
        // still show what the reverted release left.
        for s in &new.stages {
            for n in s.baseline.keys() {
                let recorded_before = old
                    .stage(s.index)
                    .is_some_and(|o| o.baseline.contains_key(n))
                    && old.target_revision == new.target_revision;
                if recorded_before {
                    continue;
                }
                let ready_since = seen
                    .pods
                    .pods
                    .values()
                    .filter(|p| &p.node == n && p.terminating.is_none())
                    .filter_map(|p| p.ready_since)
                    .max();
                let written = seen.nodes.nodes.get(n).map(|node| node.status_written);
                if !crate::gates::freshness::written_after(written, ready_since) {
                    self.checker.violations.push(format!(
                        "baseline of node {n} taken from its status written at {written:?}, not after its agent became Ready at {ready_since:?}"
                    ));
                }
            }
        }
        // No stage passes without judging every node it holds, on the target.
        let target = new.target_revision.clone().unwrap_or_default();
        for s in &new.stages {
            let was = old
                .stage(s.index)
                .is_some_and(|o| o.state == StageState::Passed);
            if s.state != StageState::Passed || was || old.target_revision != new.target_revision {
                continue;
            }
            let held: Vec<&String> = new
                .stages
                .iter()
                .filter(|x| x.index <= s.index)
                .flat_map(|x| x.nodes.iter())
                .collect();
            if held.is_empty() {
                self.checker
                    .violations
                    .push(format!("stage {} passed holding no node", s.index));
            }
            for n in held {
                let ok = seen.pods.pods.values().any(|p| {
                    &p.node == n && p.revision == target && p.terminating.is_none() && p.ready
                });
                let alloc = seen
                    .nodes
                    .nodes
                    .get(n)
                    .and_then(|node| node.allocatable.get(RESOURCE))
                    .map(|q| q.0.clone());
                let baseline = new
                    .stages
                    .iter()
                    .find_map(|x| x.baseline.get(n))
                    .and_then(|b| b.get(RESOURCE).copied());
                let count = alloc
                    .as_deref()
                    .and_then(saferollout_api::count_of)
                    .unwrap_or(0);
                // A node with a baseline must advertise it (a baseline of 0 sets no
                // bound: the node had no device); one without, at least one device.
                let in_bounds = match baseline {
                    Some(0) => true,
                    Some(b) => count == b,
                    None => count >= 1,
                };
                if !ok || !in_bounds {
                    self.checker.violations.push(format!(
                        "stage {} passed with node {n} not proven (ready on target: {ok}, allocatable {alloc:?})",
                        s.index
                    ));
                }
                // ... on what the node's kubelet wrote after the new agent
                // became Ready (a later whole second), never on what the old
                // agent left, whatever the soak; so a release that never
                // advertises within bounds there never passes.
                if self.spec.allocatable_gates().is_empty() {
                    continue;
                }
                let ready_since = seen
                    .pods
                    .pods
                    .values()
                    .find(|p| {
                        &p.node == n && p.revision == target && p.terminating.is_none() && p.ready
                    })
                    .and_then(|p| p.ready_since);
                let written = seen.nodes.nodes.get(n).map(|node| node.status_written);
                if !crate::gates::freshness::written_after(written, ready_since) {
                    self.checker.violations.push(format!(
                        "stage {} passed on node {n}'s status written at {written:?}, not after its agent became Ready at {ready_since:?}",
                        s.index
                    ));
                }
                let zone = seen
                    .nodes
                    .nodes
                    .get(n)
                    .map(|node| node.zone())
                    .unwrap_or("");
                let steady = self
                    .releases
                    .get(&target)
                    .and_then(|r| r.steady_count(zone));
                if let Some(c) = steady {
                    let steady_in_bounds = match baseline {
                        Some(0) => true,
                        Some(b) => c == b,
                        None => c >= 1,
                    };
                    if !steady_in_bounds {
                        self.checker.violations.push(format!(
                            "stage {} passed with node {n}, where release {target} never advertises within bounds ({c} devices, baseline {baseline:?})",
                            s.index
                        ));
                    }
                }
            }
            // With a probe gate: every probe of the stages passed, and every
            // canary node was probed.
            if self.spec.probe_gate().is_some() {
                for x in new.stages.iter().filter(|x| x.index <= s.index) {
                    for r in &x.probes {
                        if r.status != saferollout_api::GateStatus::Passed {
                            self.checker.violations.push(format!(
                                "stage {} passed with the probe of node {} {:?}",
                                s.index, r.node, r.status
                            ));
                        }
                    }
                }
                if let Some(canary) = new.stages.iter().find(|x| x.index == 0) {
                    for n in &canary.nodes {
                        if !canary.probes.iter().any(|r| &r.node == n) {
                            self.checker.violations.push(format!(
                                "stage {} passed with canary {n} not probed",
                                s.index
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Rules on the cluster after each pass.
    pub(super) fn check_cluster(&mut self) {
        // A probe pod outlives its stage only until the caches show it.
        let alive = crate::gates::probe::alive(&self.status);
        let mut orphaned = BTreeMap::new();
        for name in self.cluster.probes.keys() {
            if !alive.contains(name) {
                let passes = self.checker.probe_orphaned.get(name).copied().unwrap_or(0) + 1;
                if passes > 15 {
                    self.checker.violations.push(format!(
                        "probe pod {name} outlived its stage for {passes} passes"
                    ));
                }
                orphaned.insert(name.clone(), passes);
            }
        }
        self.checker.probe_orphaned = orphaned;
        // Remembered from now on: with them, the failed agents are every
        // exempt node (`exempt_nodes`).
        let failed = self.failed_in_status();
        self.checker.failed_agents.extend(failed);
        let counted: Vec<&String> = self
            .checker
            .disrupted
            .iter()
            .filter(|n| !self.checker.failed_agents.contains(*n))
            .filter(|n| self.cluster.nodes.get(*n).is_some_and(MNode::is_covered))
            .collect();
        let budget = self
            .budget(self.cluster.covered_nodes().len())
            .max(self.checker.budget_at_last_delete);
        if counted.len() > budget {
            self.checker.violations.push(format!(
                "{} agents down because of the operator ({counted:?}), maxUnavailable {budget}",
                counted.len()
            ));
        }
        if let (Some(target), Some(stage)) =
            (&self.status.target_revision, self.status.current_stage)
        {
            let on_target = self
                .cluster
                .pods
                .values()
                .filter(|p| &p.revision == target && p.terminating.is_none())
                .count();
            let e = self
                .checker
                .max_on_target
                .entry(stage as usize)
                .or_default();
            *e = (*e).max(on_target);
        }
    }

    fn budget(&self, covered: usize) -> usize {
        saferollout_api::resolve_count(&self.spec.max_unavailable, covered.max(1), false)
            .unwrap_or(1)
            .max(1)
    }
}

/// The budget check itself: it must see an over-budget deletion, and a node
/// whose agent failed a gate stays outside the count only until it serves.
#[cfg(test)]
mod tests {
    use saferollout_api::StageStatus;

    use super::*;

    fn delete_agent_on(m: &mut Model, node: &str) {
        let pod = m.cluster.pods.values().find(|p| p.node == node).unwrap();
        let pods = vec![crate::rollout::PodRef {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            node: node.to_string(),
            unchanged_since: None,
        }];
        m.perform(&Action::DeletePods { pods }, 1);
    }

    /// Judges the cluster; the budget violations found so far must be `n`.
    fn check_over_budget(m: &mut Model, n: usize) {
        m.check_cluster();
        let found = m
            .checker
            .violations
            .iter()
            .filter(|v| v.contains("because of the operator"))
            .count();
        assert_eq!(found, n, "{:?}", m.checker.violations);
    }

    #[test]
    fn two_ready_agents_deleted_at_max_unavailable_one_is_a_violation() {
        let mut m = Model::new(3);
        delete_agent_on(&mut m, "node-00");
        check_over_budget(&mut m, 0);
        delete_agent_on(&mut m, "node-01");
        check_over_budget(&mut m, 1);
    }

    #[test]
    fn a_failed_agent_stays_outside_the_budget_until_it_serves_again() {
        let mut m = Model::new(3);
        // The operator replaces node-00's agent; the new one fails a gate and
        // the revert (outside the budget for node-00) replaces node-01's.
        delete_agent_on(&mut m, "node-00");
        m.status.target_revision = Some("v2".into());
        m.status.stages = vec![StageStatus {
            failed_nodes: vec!["node-00".into()],
            ..Default::default()
        }];
        delete_agent_on(&mut m, "node-01");
        check_over_budget(&mut m, 0);
        // A new revision resets the stages: node-00 is still down because of
        // its agent, not of the operator.
        m.status.target_revision = Some("v3".into());
        m.status.stages.clear();
        check_over_budget(&mut m, 0);
        // The exemption covers node-00 only: one more Ready agent deleted
        // is over the budget.
        delete_agent_on(&mut m, "node-02");
        check_over_budget(&mut m, 1);
    }
}
