//! `plan NAME`: which nodes each stage would take now, computed with the
//! operator's own planner and eligibility rules (`saferollout_core`), without
//! writing anything.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;
use saferollout_api::{SafeRollout, SafeRolloutStatus, Stage, StageState, resolve_count};
use saferollout_core::objects::{SlimNode, SlimPod};
use saferollout_core::plan::{
    Candidate, canary_selector, candidates, cumulative_target, plan_stage,
};
use saferollout_core::revision::{RevisionTemplate, current_revision, revision_template};
use saferollout_core::views::{AgentPod, NodeView, NodesByName, Placement, pods_by_node};
use serde::Serialize;

use super::{get_rollout, int_or_string, owned_by, revision_hash, rollout_ref};
use crate::cli::PlanArgs;
use crate::client::Kube;
use crate::error::CliError;
use crate::output::{emit, serialize};
use crate::table::{Table, or_dash};

/// Where a stage's nodes come from (`status` or `planned` in JSON/YAML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// Recorded by the operator in `status.stages` (the rollout in progress).
    Status,
    /// Computed now, as the operator would when the stage starts.
    Planned,
}

/// One row of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StagePlan {
    /// 0-based index in the effective stages.
    pub index: usize,
    /// `stages[].nodes` as written (`1`, `10%`).
    pub size: String,
    /// Cumulative node count the stage asks for now.
    pub cumulative: usize,
    pub source: Source,
    /// The stage's state in status (recorded stages only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<StageState>,
    /// Nodes this stage takes (not those of earlier stages), sorted.
    pub nodes: Vec<String>,
    /// Why the stage cannot be planned (later stages are not planned either).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `plan -o json|yaml` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub namespace: String,
    pub name: String,
    pub daemon_set: String,
    /// The DaemonSet's newest revision (`controller-revision-hash`), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Nodes running the agent (the candidates).
    pub candidates: usize,
    /// Candidates already on `revision`.
    pub on_target: usize,
    /// Candidates matching `spec.canary.nodeSelector`.
    pub canary_eligible: usize,
    /// A remark on how the plan was made, e.g. nothing to roll out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub stages: Vec<StagePlan>,
}

/// The revision (`controller-revision-hash`) of the DaemonSet's template: the
/// ControllerRevision with the same template, as the operator finds it.
pub fn daemonset_revision(ds: &DaemonSet, revisions: &[ControllerRevision]) -> Option<String> {
    let uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let parsed: Vec<(String, i64, PodTemplateSpec)> = revisions
        .iter()
        .filter(|cr| owned_by(&cr.metadata, uid))
        .filter_map(|cr| {
            Some((
                revision_hash(&cr.metadata)?,
                cr.revision.unwrap_or(0),
                revision_template(cr)?,
            ))
        })
        .collect();
    let views: Vec<RevisionTemplate> = parsed
        .iter()
        .map(|(hash, number, template)| RevisionTemplate {
            hash,
            number: *number,
            template,
        })
        .collect();
    current_revision(&ds.spec.template, &views).map(str::to_string)
}

/// The candidates, as the operator builds them: every node whose agent may be
/// replaced now (Ready, taints tolerated, selected by the DaemonSet) and that
/// runs a live agent pod, with its zone, canary eligibility, and whether a
/// live pod there runs `target`.
pub fn build_candidates(
    nodes: &[SlimNode],
    pods: &[SlimPod],
    ds: &DaemonSet,
    canary: Option<&LabelSelector>,
    target: Option<&str>,
) -> Vec<Candidate> {
    let uid = ds.metadata.uid.as_deref().unwrap_or_default();
    let node_views: NodesByName = nodes
        .iter()
        .map(NodeView::of)
        .map(|v| (v.name, v))
        .collect();
    let agent_pods = pods_by_node(
        pods.iter()
            .filter(|p| owned_by(&p.metadata, uid))
            .filter_map(AgentPod::of),
    );
    let placement = Placement::of(ds.spec.template.spec.as_ref());
    // No target: no pod is on it (a revision hash is never empty).
    candidates(
        &node_views,
        &agent_pods,
        &placement,
        &canary_selector(canary),
        target.unwrap_or_default(),
    )
}

/// Whether the stages recorded in status belong to the rollout of `revision`
/// (in progress, not failed): then they are shown as recorded.
pub fn status_applies(st: &SafeRolloutStatus, revision: Option<&str>) -> bool {
    revision.is_some()
        && st.target_revision.as_deref() == revision
        && st.stable_revision.as_deref() != revision
        && !st.stages.iter().any(|s| s.state == StageState::Failed)
}

/// Plans every stage: recorded ones as in `recorded` (their nodes count as
/// taken when they still exist), the rest with [`plan_stage`], accumulating
/// the nodes taken so far. Stops at the first stage that cannot be planned.
pub fn plan_rollout(
    stages: &[Stage],
    candidates: &[Candidate],
    recorded: Option<&SafeRolloutStatus>,
    existing_nodes: &BTreeSet<String>,
) -> Vec<StagePlan> {
    let total = candidates.len();
    let mut already: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    let mut blocked = false;
    for (index, stage) in stages.iter().enumerate() {
        // As the operator: an invalid size (rejected by the schema) counts as 1.
        let wanted = resolve_count(&stage.nodes, total, true).unwrap_or(1);
        let cumulative = cumulative_target(wanted, total);
        let mut row = StagePlan {
            index,
            size: int_or_string(&stage.nodes),
            cumulative,
            source: Source::Planned,
            state: None,
            nodes: Vec::new(),
            error: None,
        };
        if let Some(rec) = recorded.and_then(|st| st.stage(index as i32)) {
            row.source = Source::Status;
            row.state = Some(rec.state);
            row.nodes = rec.nodes.clone();
            row.nodes.sort();
            already.extend(
                rec.nodes
                    .iter()
                    .filter(|n| existing_nodes.contains(*n))
                    .cloned(),
            );
        } else if blocked {
            row.error = Some("not planned: an earlier stage cannot be planned".into());
        } else {
            match plan_stage(candidates, &already, cumulative, index == 0) {
                Ok(nodes) => {
                    already.extend(nodes.iter().cloned());
                    row.nodes = nodes;
                }
                Err(e) => {
                    row.error = Some(e.to_string());
                    blocked = true;
                }
            }
        }
        out.push(row);
    }
    out
}

/// Everything `plan` needs, fetched.
pub struct PlanInputs {
    pub rollout: SafeRollout,
    pub daemonset: DaemonSet,
    pub revisions: Vec<ControllerRevision>,
    /// Agent pods, projected as the operator caches them.
    pub pods: Vec<SlimPod>,
    pub nodes: Vec<SlimNode>,
}

/// The report from fetched objects (pure).
pub fn build_report(inputs: &PlanInputs) -> PlanReport {
    let sr = &inputs.rollout;
    let empty = SafeRolloutStatus::default();
    let st = sr.status.as_ref().unwrap_or(&empty);
    let revision = daemonset_revision(&inputs.daemonset, &inputs.revisions);
    // Nothing to roll out (the newest revision is the stable one): show what a
    // new revision would get, i.e. no node counts as already on it.
    let idle = revision.is_some() && st.stable_revision == revision;
    let target = if idle { None } else { revision.as_deref() };
    let canary = sr
        .spec
        .canary
        .as_ref()
        .and_then(|c| c.node_selector.as_ref());
    let candidates = build_candidates(
        &inputs.nodes,
        &inputs.pods,
        &inputs.daemonset,
        canary,
        target,
    );
    let existing: BTreeSet<String> = inputs
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let use_status = status_applies(st, revision.as_deref());
    let stages = plan_rollout(
        &sr.spec.effective_stages(),
        &candidates,
        use_status.then_some(st),
        &existing,
    );
    let note = if idle {
        Some(format!(
            "revision {} is already the stable one: this is the plan a new revision would get",
            revision.as_deref().unwrap_or_default()
        ))
    } else if revision.is_none() {
        Some("the DaemonSet's current revision is not recorded yet: no node counts as already updated".into())
    } else {
        None
    };
    PlanReport {
        namespace: sr.metadata.namespace.clone().unwrap_or_default(),
        name: sr.metadata.name.clone().unwrap_or_default(),
        daemon_set: sr.spec.target_ref.name.clone(),
        revision,
        candidates: candidates.len(),
        on_target: candidates.iter().filter(|c| c.on_target).count(),
        canary_eligible: candidates.iter().filter(|c| c.canary_eligible).count(),
        note,
        stages,
    }
}

/// The plan as text: a summary line, then one row per stage.
pub fn render_table(r: &PlanReport) -> String {
    let mut out = format!(
        "SafeRollout {}/{}: DaemonSet {}, revision {}; {} node(s) run the agent, {} already on that revision, {} canary-eligible\n",
        r.namespace,
        r.name,
        r.daemon_set,
        or_dash(r.revision.as_deref()),
        r.candidates,
        r.on_target,
        r.canary_eligible,
    );
    if let Some(note) = &r.note {
        out.push_str(&format!("Note: {note}\n"));
    }
    out.push('\n');
    let total = r.stages.len();
    let mut t = Table::new(&["STAGE", "SIZE", "TOTAL", "SOURCE", "STATE", "NEW", "NODES"]);
    for s in &r.stages {
        let nodes = match &s.error {
            Some(e) => format!("({e})"),
            None if s.nodes.is_empty() => "-".into(),
            None => s.nodes.join(", "),
        };
        t.row([
            format!("{}/{total}", s.index + 1),
            s.size.clone(),
            s.cumulative.to_string(),
            match s.source {
                Source::Status => "status".to_string(),
                Source::Planned => "planned".to_string(),
            },
            s.state.map_or("-".to_string(), |st| st.to_string()),
            s.nodes.len().to_string(),
            nodes,
        ]);
    }
    out.push_str(&t.render(""));
    out
}

async fn fetch(kube: &Kube, name: &str) -> Result<PlanInputs, CliError> {
    let ns = &kube.namespace;
    let rollout = get_rollout(kube, name).await?;
    let ds_name = rollout.spec.target_ref.name.clone();
    let what = format!("DaemonSet {ns}/{ds_name}");
    let ds = Api::<DaemonSet>::namespaced(kube.client.clone(), ns)
        .get(&ds_name)
        .await
        .map_err(|e| kube.error(e, &what))?;
    // All of the namespace's, filtered by owner uid: no selector conversion needed.
    let lp = ListParams::default();
    let revisions = Api::<ControllerRevision>::namespaced(kube.client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| kube.error(e, &format!("ControllerRevisions in {ns}")))?
        .items;
    let pods = Api::<SlimPod>::namespaced(kube.client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| kube.error(e, &format!("Pods in {ns}")))?
        .items;
    let nodes = Api::<SlimNode>::all(kube.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| kube.error(e, "Nodes"))?
        .items;
    Ok(PlanInputs {
        rollout,
        daemonset: ds,
        revisions,
        pods,
        nodes,
    })
}

/// Runs `plan`: exit 0, or 1 when a stage cannot be planned.
pub async fn run(kube: &Kube, args: &PlanArgs) -> Result<u8, CliError> {
    let inputs = fetch(kube, &args.name).await?;
    let report = build_report(&inputs);
    let text = match serialize(&report, args.output)? {
        Some(text) => text,
        None => render_table(&report),
    };
    emit(&text);
    if let Some(s) = report
        .stages
        .iter()
        .find(|s| s.error.is_some() && s.source == Source::Planned)
    {
        let e = s.error.as_deref().unwrap_or_default();
        return Err(CliError::failed(format!(
            "SafeRollout {}: stage {}/{} cannot be planned: {e}",
            rollout_ref(&inputs.rollout),
            s.index + 1,
            report.stages.len()
        )));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use saferollout_api::{Canary, SafeRolloutSpec, StageStatus, ZONE_LABEL, default_stages};
    use saferollout_core::objects::SlimPodSpec;

    use super::*;

    fn cand(name: &str, zone: &str) -> Candidate {
        Candidate {
            name: name.into(),
            zone: Some(zone.into()),
            canary_eligible: true,
            on_target: false,
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn stages(sizes: &[IntOrString]) -> Vec<Stage> {
        let mut spec = SafeRolloutSpec::for_daemonset("ds");
        spec.stages = Some(sizes.iter().cloned().map(Stage::new).collect());
        spec.effective_stages()
    }

    #[test]
    fn stages_accumulate_and_spread_across_zones() {
        let cands: Vec<_> = ["a-1", "a-2", "a-3", "b-1", "b-2", "b-3"]
            .iter()
            .map(|n| cand(n, &n[..1]))
            .collect();
        let plan = plan_rollout(&default_stages(), &cands, None, &BTreeSet::new());
        let got: Vec<(usize, Vec<String>)> = plan
            .iter()
            .map(|s| (s.cumulative, s.nodes.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, names(&["a-1"])),
                (1, vec![]), // 10% of 6 rounds up to 1: already there
                (3, names(&["a-2", "b-1"])),
                (6, names(&["a-3", "b-2", "b-3"])),
            ]
        );
        assert!(
            plan.iter()
                .all(|s| s.source == Source::Planned && s.error.is_none())
        );
        // Every node once, no more.
        let all: BTreeSet<_> = plan.iter().flat_map(|s| s.nodes.clone()).collect();
        assert_eq!(all.len(), 6);
    }

    #[test]
    fn recorded_stages_are_shown_and_count_as_taken() {
        let cands: Vec<_> = ["a-1", "a-2", "b-1", "b-2"]
            .iter()
            .map(|n| cand(n, &n[..1]))
            .collect();
        let st = SafeRolloutStatus {
            stages: vec![StageStatus {
                index: 0,
                // The operator took b-2 (e.g. the canary selector said so),
                // and a node that has since left the cluster.
                nodes: names(&["b-2", "gone"]),
                state: StageState::Passed,
                ..Default::default()
            }],
            ..Default::default()
        };
        let existing: BTreeSet<String> = ["a-1", "a-2", "b-1", "b-2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let plan = plan_rollout(
            &stages(&[IntOrString::Int(1), IntOrString::Int(2)]),
            &cands,
            Some(&st),
            &existing,
        );
        assert_eq!(plan.len(), 3); // + the implicit 100% stage
        assert_eq!(plan[0].source, Source::Status);
        assert_eq!(plan[0].state, Some(StageState::Passed));
        assert_eq!(plan[0].nodes, names(&["b-2", "gone"]));
        // Stage 2 wants 2 in total; b-2 counts, so one more, from zone a.
        assert_eq!(plan[1].source, Source::Planned);
        assert_eq!(plan[1].nodes, names(&["a-1"]));
        assert_eq!(plan[2].nodes, names(&["a-2", "b-1"]));
    }

    #[test]
    fn a_stage_that_cannot_be_planned_stops_the_plan() {
        let mut cands = vec![cand("a-1", "a"), cand("b-1", "b")];
        for c in &mut cands {
            c.canary_eligible = false;
        }
        let plan = plan_rollout(&default_stages(), &cands, None, &BTreeSet::new());
        assert!(plan[0].error.as_deref().unwrap().contains("canary"));
        assert!(
            plan[1..]
                .iter()
                .all(|s| s.error.is_some() && s.nodes.is_empty())
        );
        let none = plan_rollout(&default_stages(), &[], None, &BTreeSet::new());
        assert!(none[0].error.as_deref().unwrap().contains("no node"));
        let text = render_table(&PlanReport {
            namespace: "gpu".into(),
            name: "sr".into(),
            daemon_set: "ds".into(),
            revision: None,
            candidates: 0,
            on_target: 0,
            canary_eligible: 0,
            note: None,
            stages: none,
        });
        assert!(
            text.contains("(no node runs the DaemonSet's agent"),
            "{text}"
        );
    }

    const UID: &str = "ds-uid";

    fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn owner(uid: &str) -> Option<Vec<OwnerReference>> {
        Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ds".into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }])
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> SlimNode {
        SlimNode {
            metadata: meta(name, labels),
            status: Some(
                serde_json::from_value(
                    serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]}),
                )
                .unwrap(),
            ),
            ..Default::default()
        }
    }

    fn template(image: &str) -> serde_json::Value {
        serde_json::json!({"spec": {"containers": [{"name": "c", "image": image}]}})
    }

    fn daemonset(image: &str) -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ds", "uid": UID},
            "spec": {"selector": {}, "template": template(image)}
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str, hash: &str, uid: &str) -> SlimPod {
        let mut metadata = meta(name, &[("controller-revision-hash", hash)]);
        metadata.owner_references = owner(uid);
        SlimPod {
            metadata,
            spec: Some(SlimPodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A revision whose template's image is `x:<hash>`.
    fn revision(hash: &str, number: i64, uid: &str) -> ControllerRevision {
        let mut metadata = meta(&format!("ds-{hash}"), &[("controller-revision-hash", hash)]);
        metadata.owner_references = owner(uid);
        ControllerRevision {
            metadata,
            revision: Some(number),
            data: k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                serde_json::json!({"spec": {"template": template(&format!("x:{hash}"))}}),
            ),
        }
    }

    #[test]
    fn the_daemonset_revision_is_found_by_content_not_by_number() {
        let revs = [
            revision("old", 4, UID),
            revision("new", 3, UID),
            revision("other", 9, "someone-else"),
        ];
        // After a restore the old template has the highest number while the
        // DaemonSet carries "new": content decides.
        assert_eq!(
            daemonset_revision(&daemonset("x:new"), &revs).as_deref(),
            Some("new")
        );
        assert_eq!(
            daemonset_revision(&daemonset("x:old"), &revs).as_deref(),
            Some("old")
        );
        assert_eq!(
            daemonset_revision(&daemonset("x:other"), &revs),
            None,
            "not the DaemonSet's"
        );
    }

    #[test]
    fn candidates_from_nodes_and_pods() {
        let nodes = [
            node("n1", &[(ZONE_LABEL, "z1"), ("gpu", "true")]),
            node("n2", &[(ZONE_LABEL, "z2")]),
            node("n3", &[("gpu", "true")]),
            node("n4", &[]), // no agent pod
        ];
        let mut terminating = pod("p3", "n3", "new", UID);
        terminating.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let pods = [
            pod("p1", "n1", "new", UID),
            pod("p2", "n2", "old", UID),
            terminating,
            pod("p3b", "n3", "old", UID),
            pod("x", "n4", "new", "someone-else"),
        ];
        let sel = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "gpu".into(),
                operator: "In".into(),
                values: Some(vec!["true".into()]),
            }]),
            ..Default::default()
        };
        let ds = daemonset("x:new");
        let c = build_candidates(&nodes, &pods, &ds, Some(&sel), Some("new"));
        assert_eq!(
            c,
            vec![
                Candidate {
                    name: "n1".into(),
                    zone: Some("z1".into()),
                    canary_eligible: true,
                    on_target: true
                },
                Candidate {
                    name: "n2".into(),
                    zone: Some("z2".into()),
                    canary_eligible: false,
                    on_target: false
                },
                Candidate {
                    name: "n3".into(),
                    zone: None,
                    canary_eligible: true,
                    on_target: false // only the terminating pod had it
                },
            ]
        );
        // Unknown revision: nothing is on target; no selector: all eligible.
        let c = build_candidates(&nodes, &pods, &ds, None, None);
        assert!(c.iter().all(|c| !c.on_target && c.canary_eligible));
    }

    #[test]
    fn report_uses_status_only_for_the_rollout_in_progress() {
        let mut sr = SafeRollout::new("sr", SafeRolloutSpec::for_daemonset("ds"));
        sr.metadata.namespace = Some("gpu".into());
        sr.spec.canary = Some(Canary::default());
        let recorded = StageStatus {
            index: 0,
            nodes: names(&["n2"]),
            state: StageState::Verifying,
            ..Default::default()
        };
        sr.status = Some(SafeRolloutStatus {
            target_revision: Some("new".into()),
            stable_revision: Some("old".into()),
            stages: vec![recorded],
            ..Default::default()
        });
        let inputs = PlanInputs {
            rollout: sr,
            daemonset: daemonset("x:new"),
            revisions: vec![revision("old", 1, UID), revision("new", 2, UID)],
            pods: vec![
                pod("p1", "n1", "old", UID),
                pod("p2", "n2", "new", UID),
                pod("p3", "n3", "old", UID),
            ],
            nodes: vec![node("n1", &[]), node("n2", &[]), node("n3", &[])],
        };
        let r = build_report(&inputs);
        assert_eq!(r.revision.as_deref(), Some("new"));
        assert_eq!((r.candidates, r.on_target, r.canary_eligible), (3, 1, 3));
        assert_eq!(r.stages[0].source, Source::Status);
        assert_eq!(r.stages[0].nodes, names(&["n2"]));
        assert_eq!(r.note, None);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["stages"][0]["source"], "status");
        assert_eq!(json["stages"][1]["source"], "planned");
        assert_eq!(json["stages"][0]["state"], "Verifying");
        let text = render_table(&r);
        assert!(
            text.contains("revision new; 3 node(s) run the agent, 1 already"),
            "{text}"
        );
        assert!(
            text.contains("1/4     1      1       status    Verifying   1     n2"),
            "{text}"
        );

        // Once the revision is stable: a fresh plan, nothing counted as updated.
        let mut idle = inputs;
        let st = idle.rollout.status.as_mut().unwrap();
        st.stable_revision = Some("new".into());
        let r = build_report(&idle);
        assert!(
            r.note
                .as_deref()
                .unwrap()
                .contains("already the stable one")
        );
        assert_eq!(r.on_target, 0);
        assert!(r.stages.iter().all(|s| s.source == Source::Planned));
        assert_eq!(r.stages[0].nodes, names(&["n1"]));
    }

    #[test]
    fn status_applies_to_its_own_revision_unless_failed() {
        let mut st = SafeRolloutStatus {
            target_revision: Some("new".into()),
            stable_revision: Some("old".into()),
            ..Default::default()
        };
        assert!(status_applies(&st, Some("new")));
        assert!(!status_applies(&st, Some("newer")));
        assert!(!status_applies(&st, None));
        st.stages.push(StageStatus {
            index: 0,
            state: StageState::Failed,
            ..Default::default()
        });
        assert!(!status_applies(&st, Some("new")));
    }
}
