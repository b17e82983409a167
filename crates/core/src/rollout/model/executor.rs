//! The operator's runtime around [`decide`], as the model runs it: caches
//! that lag behind the cluster (each resource on its own, never going
//! backwards), its memory of its own writes ([`Expectations`]), the views a
//! pass decides on, the operator's own plan of the pass
//! ([`crate::pass::plan`]: the status write before, behind or after the
//! actions) executed against the simulated cluster, with the writes the API
//! server loses, and the label writer that makes queued label writes a
//! second later.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSetUpdateStrategy;
use k8s_openapi::api::core::v1::Taint;
use saferollout_api::SafeRolloutStatus;

use super::Model;
use super::cluster::{Cluster, Deletion, GPU_NODE_LABEL, Losses, RESOURCE, content_of};
use crate::expectations::Expectations;
use crate::pass::StatusWrite;
use crate::rollout::{Action, BackupView, Decision, Observed, Requests, SpecTemplate, decide};
use crate::views::{DaemonSetView, NodesByName, Placement, PodsByNode};

/// How many seconds behind the cluster each cache is for the next pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lag {
    pub pods: usize,
    pub nodes: usize,
    pub daemonset: usize,
}

/// The operator's caches: each shows a state of the cluster of the last
/// seconds, never one older than it showed before.
pub struct Caches {
    /// Cluster states of the last seconds, newest last.
    history: Vec<Cluster>,
    /// What each cache showed last, by [`Cache`].
    shown: [usize; 3],
}

#[derive(Clone, Copy)]
enum Cache {
    Pods,
    Nodes,
    DaemonSet,
}

impl Caches {
    /// Caches that show `cluster`.
    pub fn new(cluster: &Cluster) -> Self {
        Caches {
            history: vec![cluster.clone()],
            shown: [0; 3],
        }
    }

    /// The cluster after one more second.
    pub fn record(&mut self, cluster: &Cluster) {
        self.history.push(cluster.clone());
        if self.history.len() > 8 {
            self.history.remove(0);
            for s in &mut self.shown {
                *s = s.saturating_sub(1);
            }
        }
    }

    fn show(&mut self, which: Cache, lag: usize) -> Cluster {
        let newest = self.history.len() - 1;
        let pick = newest
            .saturating_sub(lag)
            .max(self.shown[which as usize])
            .min(newest);
        self.shown[which as usize] = pick;
        self.history[pick].clone()
    }

    /// Every cache shows the cluster as it is (a restarted operator lists
    /// everything anew).
    fn catch_up(&mut self) {
        let newest = self.history.len() - 1;
        self.shown = [newest; 3];
    }
}

/// What each cache showed a pass.
pub struct Seen {
    pub pods: Cluster,
    pub nodes: Cluster,
    pub daemonset: Cluster,
}

/// The operator's label writer: a pass queues label writes (remembered at
/// once, `labels::queue` in the operator); the writer makes them at the
/// next second.
#[derive(Default)]
pub struct LabelWriter {
    /// Node label writes made (labelled or unlabelled), one per node and action.
    pub writes: usize,
    /// The API server's answers to label writes arrive a second after the
    /// watch shows them (the operator's writer records a write only once its
    /// response is in; the node watch may deliver the label first).
    pub responses_lag: bool,
    /// Label writes queued (nodes, stage; `None`: removal).
    queue: Vec<(Vec<String>, Option<usize>)>,
    /// Label writes made whose answers the writer records next second
    /// (`Some` once a job's writes are made, with `responses_lag`).
    responses: Option<Vec<(String, Option<usize>)>>,
    /// The writer recorded the answers of a queued job: as the operator's
    /// writer does, it wakes the rollout for a pass.
    pub(super) woke: bool,
}

impl Model {
    /// One reconcile with caches `lag` seconds behind and `losses`: decide,
    /// write status, act. `None` when the pass waited for the DaemonSet cache.
    pub fn reconcile(&mut self, lag: Lag, losses: Losses) -> Option<Decision> {
        let seen = Seen {
            pods: self.caches.show(Cache::Pods, lag.pods),
            nodes: self.caches.show(Cache::Nodes, lag.nodes),
            daemonset: self.caches.show(Cache::DaemonSet, lag.daemonset),
        };
        if !self
            .expectations
            .daemonset_caught_up(seen.daemonset.ds.generation)
        {
            return None;
        }
        let decision = self.decide_on(&seen);
        self.check_decision(&decision, &seen);
        self.trace_pass(&decision, &seen, lag, losses);
        // The operator's own plan of the pass, executed here as there.
        let since_last_write = self
            .status_written_at
            .map(|t| crate::gates::elapsed(t, self.now));
        let plan = crate::pass::plan(
            &self.spec,
            Some(&self.status),
            decision.clone(),
            since_last_write,
        );
        if plan.write == StatusWrite::Before {
            if losses.status {
                return Some(decision);
            }
            self.write_status(&plan.status);
        }
        let decided_generation = seen.daemonset.ds.generation;
        let mut lose = losses.first_action;
        if self.cluster.selector.is_some() {
            // Under Selector the pass's actions become steps, and what goes
            // on by itself follows them.
            let pods = self.selector_pods(&seen);
            for step in self.selector_steps(&seen, &pods, &plan.actions) {
                if lose {
                    lose = false;
                    continue;
                }
                self.perform_step(&step, decided_generation);
            }
        } else {
            for a in &plan.actions {
                if lose {
                    lose = false;
                    continue;
                }
                self.perform(a, decided_generation);
            }
        }
        for e in &plan.events {
            self.perform(e, decided_generation);
        }
        if plan.write == StatusWrite::Behind && !losses.status {
            self.write_status(&plan.status);
        }
        self.check_cluster();
        Some(decision)
    }

    /// Records the pass in the trace, for a failing test's message.
    fn trace_pass(&mut self, decision: &Decision, seen: &Seen, lag: Lag, losses: Losses) {
        let pods: Vec<String> = self
            .cluster
            .pods
            .values()
            .map(|p| {
                let state = if p.terminating.is_some() {
                    "T"
                } else if p.ready {
                    "R"
                } else {
                    "-"
                };
                format!("{}:{}{}v{}", &p.node[5..], p.revision, state, p.version)
            })
            .collect();
        self.trace.push(format!(
            "t={} lag={lag:?} loss={losses:?} ds={} target={:?} phase={:?} stage={:?} held={:?} actions={:?} pods=[{}] disrupted={:?}",
            self.now.as_second() % 10_000,
            seen.daemonset.ds.template,
            decision.status.target_revision,
            decision.status.phase,
            decision.status.current_stage,
            decision.status.stages.iter().map(|s| s.nodes.clone()).collect::<Vec<_>>(),
            decision
                .actions
                .iter()
                .filter(|a| !matches!(a, Action::Event { .. }))
                .collect::<Vec<_>>(),
            pods.join(" "),
            self.checker.disrupted,
        ));
        if self.checker.violations.is_empty() && self.trace.len() > 60 {
            self.trace.remove(0);
        }
    }

    fn write_status(&mut self, status: &SafeRolloutStatus) {
        self.status = status.clone();
        self.status_written_at = Some(self.now);
    }

    /// Drops the caches' lag and the operator's memory: a restarted operator.
    pub fn restart_operator(&mut self) {
        self.expectations = Expectations::default();
        self.taints_written.clear();
        self.status_written_at = None;
        // Label writes still queued die with the process.
        self.label_writer.queue.clear();
        self.label_writer.responses = None;
        self.caches.catch_up();
    }

    /// The decision of a pass on what the caches showed it, with the
    /// operator's memory of its writes laid over them.
    fn decide_on(&mut self, seen: &Seen) -> Decision {
        let mut node_views: NodesByName = seen
            .nodes
            .nodes
            .values()
            .map(|n| (n.name.as_str(), n.view()))
            .collect();
        self.expectations
            .apply_labels(&mut node_views, super::ROLLOUT_ID, self.now);
        let selector_pods;
        let pods = if self.cluster.selector.is_some() {
            selector_pods = self.selector_pods(seen);
            let ctx = self.selector_context(seen, &selector_pods);
            // The operator's memory of its deletions is already laid over
            // `selector_pods`; applied again here, it would read the pods
            // this view shows leaving as the cache confirming them, and
            // forget them (the property tests found two Ready agents
            // deleted at maxUnavailable 1 that way).
            crate::selector::engine_pods(&selector_pods, &ctx)
        } else {
            let mut pods = PodsByNode::default();
            for p in seen.pods.pods.values() {
                pods.entry(p.node.as_str()).or_default().push(p.view());
            }
            self.expectations.apply(&mut pods, self.now);
            pods
        };
        let sel = BTreeMap::from([(GPU_NODE_LABEL.to_string(), "true".to_string())]);
        let ds_c = &seen.daemonset;
        let strategy = DaemonSetUpdateStrategy {
            type_: Some(ds_c.ds.strategy.clone()),
            ..Default::default()
        };
        let (carrier, known) = self.template_carrier(ds_c);
        let current = Some(carrier.template.as_str())
            .filter(|t| carrier.revisions.contains_key(*t))
            .filter(|_| carrier.observed_generation >= carrier.generation);
        let both_observed = ds_c.ds.observed_generation >= ds_c.ds.generation
            && carrier.observed_generation >= carrier.generation;
        let ds = DaemonSetView {
            generation: carrier.generation,
            observed_generation: if both_observed {
                carrier.generation
            } else {
                carrier.generation - 1
            },
            update_strategy: Some(&strategy),
            current_revision: current,
            known_revisions: known,
            placement: Placement {
                node_selector: Some(&sel),
                ..Default::default()
            },
            owner: self
                .owner
                .as_ref()
                .map(|(api_version, kind)| crate::owner::OwnerView {
                    api_version,
                    kind,
                    name: "vendor",
                }),
        };
        let spec_revision = self.spec_hash.as_ref().map(|h| format!("spec-{h}"));
        let spec_template = self.spec_hash.as_deref().map(|hash| SpecTemplate {
            hash,
            in_place: spec_revision.as_deref() == Some(carrier.template.as_str()),
        });
        let proof = crate::gates::proof::ProofEvidence {
            probe_pods: seen
                .pods
                .probes
                .iter()
                .map(|(name, p)| crate::gates::proof::ProbePod {
                    name: name.clone(),
                    uid: p.uid.clone(),
                    node: p.node.clone(),
                    phase: p.phase.clone(),
                    unschedulable: p.unschedulable.then(|| {
                        (
                            "Unschedulable".to_string(),
                            format!("0/1 nodes are available: 1 Insufficient {RESOURCE}"),
                        )
                    }),
                    exit_code: match p.phase.as_str() {
                        "Succeeded" => Some(0),
                        "Failed" => Some(1),
                        _ => None,
                    },
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let drain = crate::drain::DrainEvidence {
            nodes: seen
                .nodes
                .nodes
                .values()
                .filter(|n| {
                    n.labels
                        .get(saferollout_api::MAINTENANCE_LABEL)
                        .map(String::as_str)
                        == Some(super::ROLLOUT_ID)
                })
                .map(|n| {
                    let pods = self.workloads.get(&n.name).cloned().unwrap_or_default();
                    (n.name.clone(), pods)
                })
                .collect(),
        };
        let evidence = crate::gates::Evidence::default()
            .with_proof(&proof)
            .with_drain(&drain);
        let contents: BTreeMap<String, String> = ds
            .known_revisions
            .iter()
            .map(|r| (r.to_string(), content_of(r)))
            .collect();
        let backup_name =
            crate::rollout::backup_name("plugin", ds_c.backup.as_deref().unwrap_or_default());
        let fleet = self.fleet.as_ref().map(|f| f.view());
        // As the operator plans it: from the template the DaemonSet carries
        // back to the stable one, through the owner's one version field.
        let owner_revert = self
            .owner_revert
            .then_some(())
            .and(self.owner.as_ref())
            .and_then(|(api_version, kind)| {
                let stable = self.status.stable_revision.clone()?;
                Some(Ok(crate::owner::OwnerRevertPlan {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    plural: "vendors".into(),
                    name: "vendor".into(),
                    namespace: None,
                    fields: vec![crate::owner::FieldRevert {
                        path: "/spec/version".into(),
                        from: ds_c.ds.template.clone(),
                        to: stable,
                    }],
                }))
            });
        let o = Observed {
            spec: &self.spec,
            generation: Some(1),
            status: &self.status,
            requests: Requests {
                retry: self.retry.as_deref(),
                approve: self.approve.as_deref(),
                abort: self.abort.as_deref(),
            },
            owned_by_other: None,
            preflight: None,
            daemonset: Some(&ds),
            spec_template,
            name: "plugin",
            // As the operator finds it: by the name of status's stable revision.
            backup: ds_c
                .backup
                .as_deref()
                .filter(|b| self.status.stable_revision.as_deref() == Some(*b))
                .map(|revision| BackupView {
                    name: &backup_name,
                    revision,
                    content: ds_c.backup_content.as_deref(),
                }),
            revision_contents: &contents,
            pods: &pods,
            nodes: &node_views,
            rollout_id: super::ROLLOUT_ID,
            evidence: &evidence,
            limits: &self.limits,
            now: self.now,
            caches_heard_at: self.caches_heard_at,
            fleet: fleet.as_ref(),
            owner_revert: owner_revert.as_ref(),
            owner_gitops: self.owner_gitops.as_deref(),
        };
        decide(&o)
    }

    /// The DaemonSet whose template the engine sees as the DaemonSet's (the
    /// canary while it is active under `Selector`, else the target) and
    /// every revision either has.
    fn template_carrier<'c>(
        &self,
        c: &'c Cluster,
    ) -> (&'c super::cluster::MDaemonSet, Vec<&'c str>) {
        let mut known: Vec<&str> = c.ds.revisions.keys().map(String::as_str).collect();
        let canary = c
            .selector
            .as_ref()
            .and_then(|s| s.canary.as_ref())
            .filter(|c| !c.retiring);
        if let Some(sel) = c.selector.as_ref().and_then(|s| s.canary.as_ref()) {
            known.extend(sel.ds.revisions.keys().map(String::as_str));
            known.sort_unstable();
            known.dedup();
        }
        (canary.map_or(&c.ds, |c| &c.ds), known)
    }

    /// Sends one action of a pass decided on DaemonSet generation
    /// `decided_generation` to the API server, remembering the operator's
    /// own writes as the operator does.
    pub(super) fn perform(&mut self, action: &Action, decided_generation: i64) {
        self.actions_log.push(action.clone());
        self.check_action(action);
        match action {
            Action::TakeOverUpdates => {
                let written = self
                    .cluster
                    .patch_daemonset(decided_generation, |ds| ds.strategy = "OnDelete".into());
                if let Some(generation) = written {
                    self.expectations.daemonset_written(generation);
                }
            }
            Action::ApplySpecTemplate => {
                let spec_hash = &self.spec_hash;
                let written = self.cluster.patch_daemonset(decided_generation, |ds| {
                    ds.template = format!("spec-{}", spec_hash.clone().expect("GitOps mode"));
                });
                if let Some(generation) = written {
                    self.expectations.daemonset_written(generation);
                    // The runtime records the generation the write returned.
                    if let Some(a) = self.status.applied_template.as_mut() {
                        a.generation = Some(generation);
                    }
                }
            }
            Action::RestoreLastGood { content } => {
                let Some(backup) = self.cluster.backup.clone() else {
                    return;
                };
                // As the operator does: only a backup holding that content is written.
                if self.cluster.backup_content.as_deref() != Some(content.as_str())
                    || self.cluster.ds.template == backup
                {
                    return;
                }
                let written = self
                    .cluster
                    .patch_daemonset(decided_generation, |ds| ds.template = backup);
                if let Some(generation) = written {
                    self.expectations.daemonset_written(generation);
                }
            }
            // The owner's field put back (only while it still holds the
            // failed value): the owner writes that revision's template.
            Action::RevertOwner { plan } => {
                let [field] = plan.fields.as_slice() else {
                    return;
                };
                if self.cluster.ds.template == field.from {
                    self.cluster.ds.template = field.to.clone();
                    self.cluster.ds.generation += 1;
                }
            }
            Action::BackupTemplate { revision } => self.cluster.create_backup(revision),
            // As the operator does: queued (and remembered) now, written by
            // the label writer later (at the next tick).
            Action::LabelNodes { nodes, stage } => self.queue_labels(nodes, Some(*stage)),
            Action::UnlabelNodes { nodes } => self.queue_labels(nodes, None),
            Action::DeletePods { pods } => {
                for r in pods {
                    // As the operator does: remembered before the call.
                    self.expectations.pod_deleted(&r.uid, self.now);
                    let unchanged_since = r.unchanged_since.as_deref();
                    match self.cluster.delete_pod(&r.uid, unchanged_since, self.now) {
                        Deletion::Changed => self.expectations.delete_refused(&r.uid),
                        Deletion::Started { node, served } => {
                            if served {
                                self.agent_deleted(&node);
                            }
                        }
                        Deletion::Gone | Deletion::Terminating => {}
                    }
                }
            }
            Action::Quarantine { taints, .. } => {
                for t in taints {
                    let taint = Taint {
                        key: t.key.clone(),
                        value: Some(t.value.clone()),
                        effect: t.effect.clone(),
                        ..Default::default()
                    };
                    self.cluster.taint(&t.node, taint);
                }
            }
            Action::LiftQuarantine { taints, .. } => {
                for t in taints {
                    self.cluster.untaint(&t.node, &t.key);
                }
            }
            Action::CordonNodes { nodes } => {
                for n in nodes {
                    self.cluster.cordon(n);
                }
            }
            Action::UncordonNodes { nodes } => {
                for n in nodes {
                    self.cluster.uncordon(n);
                }
            }
            Action::EvictPods { pods } => {
                for e in pods {
                    if let Some(list) = self.workloads.get_mut(&e.node) {
                        list.retain(|p| p.uid != e.uid || p.refused.is_some());
                    }
                }
            }
            // The model has no device evidence: no probe is asked for (the
            // checker says so).
            Action::CreateProbe { .. } | Action::DeleteProbes { .. } => {}
            Action::Event { .. } => {}
            Action::CreateProbePods { probes } => {
                for p in probes {
                    self.cluster.create_probe(&p.name, &p.node);
                }
            }
            Action::DeleteProbePods { pods } => {
                for (name, uid) in pods {
                    self.cluster.delete_probe(name, uid);
                }
            }
        }
    }

    /// Queues label writes, remembered at once, as the operator's pass does
    /// (`labels::queue`); the writer makes them at the next second.
    fn queue_labels(&mut self, nodes: &[String], stage: Option<usize>) {
        for n in nodes {
            self.expectations.label_queued(n, stage, self.now);
        }
        self.label_writer.queue.push((nodes.to_vec(), stage));
    }

    /// The label writer's work: every queued write, in order.
    pub(super) fn write_labels(&mut self) {
        let writer = &mut self.label_writer;
        // Answers of last second's writes (when they lag behind the watch):
        // the writer wakes the rollout once it has recorded them.
        if let Some(answers) = writer.responses.take() {
            for (n, stage) in answers {
                self.expectations.label_written(&n, stage, self.now);
            }
            writer.woke = true;
        }
        for (nodes, stage) in std::mem::take(&mut writer.queue) {
            for n in &nodes {
                if self.expectations.label_superseded(n, stage) {
                    continue; // as the operator's writer: a later write is queued
                }
                writer.writes += 1;
                if !self.cluster.label_node(n, stage) {
                    self.expectations.label_failed(n, stage); // 404
                    continue;
                }
                if writer.responses_lag {
                    let answers = writer.responses.get_or_insert_default();
                    answers.push((n.clone(), stage));
                } else {
                    self.expectations.label_written(n, stage, self.now);
                }
            }
            if writer.responses_lag {
                writer.responses.get_or_insert_default();
            } else {
                writer.woke = true;
            }
        }
    }
}
