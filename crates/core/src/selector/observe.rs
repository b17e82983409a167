//! What the operator reads of the two DaemonSets under `Selector`, turned
//! into what the engine and the translation read: revisions named by the
//! content of their stripped templates (so the target with its handover
//! expression, the canary with its own and a pod of either are named by what
//! the agent runs), the pair, the engine's one-DaemonSet view, and the
//! promotion's facts about the DaemonSets. The model builds the same from
//! its own objects (`rollout/model/selector.rs`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use super::{Canary, Owner, Pair, RETIRING_ANNOTATION, revision_name, template};
use crate::revision::{RevisionTemplate, content_hash, current_revision};
use crate::views::{DaemonSetView, Placement};

/// One ControllerRevision of either DaemonSet.
#[derive(Debug, Clone, Copy)]
pub struct OwnedRevision<'a> {
    pub owner: Owner,
    /// Its `controller-revision-hash`.
    pub hash: &'a str,
    pub number: i64,
    pub template: &'a PodTemplateSpec,
}

/// The two DaemonSets as found in the caches.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    /// The rollout's handover label key.
    pub key: &'a str,
    pub target: &'a DaemonSet,
    pub canary: Option<&'a DaemonSet>,
    /// Every ControllerRevision either owns.
    pub revisions: &'a [OwnedRevision<'a>],
}

/// One DaemonSet's current revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// By content ([`revision_name`] of the stripped template).
    pub revision: String,
    /// Its controller has observed its latest spec and recorded the
    /// template as a ControllerRevision (its own hash of it).
    pub hash: Option<String>,
    pub observed: bool,
}

impl Current {
    /// The revision, once its controller observed it and recorded it.
    fn settled(&self) -> Option<&str> {
        (self.observed && self.hash.is_some()).then_some(self.revision.as_str())
    }
}

/// The pair as one pass reads it (owned: built once per pass).
#[derive(Debug, Clone)]
pub struct PairView {
    /// The target's template without the strategy's additions: the engine
    /// places the agent by it.
    pub target_template: PodTemplateSpec,
    pub target: Current,
    /// The target's template carries the handover expression.
    pub target_expression: bool,
    pub canary: Option<CanaryFound>,
    /// Each DaemonSet's `controller-revision-hash` → revision by content.
    names: BTreeMap<(Owner, String), String>,
    /// Revision by content → its content hash (what `spec.template` and
    /// the last-good backup are compared with).
    pub contents: BTreeMap<String, String>,
    generations: Generations,
}

/// What the engine's view of generations reads.
#[derive(Debug, Clone, Copy)]
struct Generations {
    target: (i64, i64),
    canary: Option<(i64, i64)>,
}

/// The canary DaemonSet as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanaryFound {
    pub current: Current,
    pub retiring: bool,
    /// Its controller observed its latest spec and desires no pod (it has
    /// seen every promotion taint).
    pub held: bool,
}

fn generations(ds: &DaemonSet) -> (i64, i64) {
    let generation = ds.metadata.generation.unwrap_or(0);
    let observed = ds
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    (generation, observed)
}

fn stripped(t: &PodTemplateSpec, key: &str) -> Value {
    template::strip(&serde_json::to_value(t).unwrap_or_default(), key)
}

impl PairView {
    pub fn of(found: &Found) -> PairView {
        let mut names = BTreeMap::new();
        let mut contents = BTreeMap::new();
        for r in found.revisions {
            let s = stripped(r.template, found.key);
            let name = revision_name(&s);
            contents.insert(name.clone(), content_hash(&s));
            names.insert((r.owner, r.hash.to_string()), name);
        }
        let current = |ds: &DaemonSet, owner: Owner| {
            let views: Vec<RevisionTemplate> = found
                .revisions
                .iter()
                .filter(|r| r.owner == owner)
                .map(|r| RevisionTemplate {
                    hash: r.hash,
                    number: r.number,
                    template: r.template,
                })
                .collect();
            let (generation, observed) = generations(ds);
            Current {
                revision: revision_name(&stripped(&ds.spec.template, found.key)),
                hash: current_revision(&ds.spec.template, &views).map(str::to_string),
                observed: observed >= generation,
            }
        };
        let raw = serde_json::to_value(&found.target.spec.template).unwrap_or_default();
        let target_stripped = template::strip(&raw, found.key);
        let canary = found.canary.map(|c| {
            let (generation, observed) = generations(c);
            CanaryFound {
                current: current(c, Owner::Canary),
                retiring: c
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(RETIRING_ANNOTATION)),
                held: observed >= generation
                    && c.status
                        .as_ref()
                        .is_some_and(|s| s.desired_number_scheduled == 0),
            }
        });
        PairView {
            target_template: serde_json::from_value(target_stripped.clone()).unwrap_or_default(),
            target: current(found.target, Owner::Target),
            target_expression: target_stripped != raw,
            canary,
            names,
            contents,
            generations: Generations {
                target: generations(found.target),
                canary: found.canary.map(generations),
            },
        }
    }

    /// The pair as the translation reads it.
    pub fn pair(&self) -> Pair<'_> {
        Pair {
            target: self.target.settled(),
            canary: self.canary.as_ref().map(|c| Canary {
                revision: c.current.settled(),
                retiring: c.retiring,
            }),
        }
    }

    /// The revision by content of a pod of `owner` with hash label `hash`;
    /// `None` while no ControllerRevision of that hash is known.
    pub fn revision_of(&self, owner: Owner, hash: &str) -> Option<&str> {
        self.names
            .get(&(owner, hash.to_string()))
            .map(String::as_str)
    }

    /// The revision by content of an agent pod whose controller is `owner`
    /// (`None`: no controller) with hash label `hash`. A pod the promotion
    /// released carries the target's hash while the canary still controls
    /// it, then none, until the canary's controller has let it go and the
    /// target's adopted it: its hash names the target's revision. Read by
    /// the canary's revisions alone it would be of no known revision, and
    /// the engine would replace it (the second restart the promotion
    /// exists to avoid).
    pub fn pod_revision(&self, owner: Option<Owner>, hash: &str) -> Option<&str> {
        match owner {
            Some(Owner::Target) => self.revision_of(Owner::Target, hash),
            Some(Owner::Canary) => self
                .revision_of(Owner::Canary, hash)
                .or_else(|| self.revision_of(Owner::Target, hash)),
            None => self.revision_of(Owner::Target, hash),
        }
    }

    /// The target's template is the canary's (without what the strategy
    /// adds), without its expression, and its controller observed it.
    pub fn target_on_canary(&self) -> bool {
        self.target_written() && self.target.observed
    }

    /// The target's template is the canary's, without its expression,
    /// observed or not.
    pub fn target_written(&self) -> bool {
        self.canary
            .as_ref()
            .is_some_and(|c| c.current.revision == self.target.revision && !self.target_expression)
    }

    /// The one DaemonSet the engine sees: the carrier's generation and
    /// revision (the active canary's, else the target's), observed only
    /// when both are, the target's update strategy and placement.
    pub fn engine_view<'a>(&'a self, target: &'a DaemonSet) -> DaemonSetView<'a> {
        let active = self.canary.as_ref().filter(|c| !c.retiring);
        let (carrier, (generation, observed)) = match (active, self.generations.canary) {
            (Some(c), Some(g)) => (&c.current, g),
            _ => (&self.target, self.generations.target),
        };
        let both = self.target.observed && observed >= generation;
        let known: BTreeSet<&str> = self.names.values().map(String::as_str).collect();
        DaemonSetView {
            generation,
            observed_generation: if both { generation } else { generation - 1 },
            update_strategy: target.spec.update_strategy.as_ref(),
            current_revision: carrier.settled(),
            known_revisions: known.into_iter().collect(),
            placement: Placement::of(self.target_template.spec.as_ref()),
            owner: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    const KEY: &str = "handover.saferollout.dev/ns.plugin";

    fn template_of(image: &str) -> Value {
        json!({
            "metadata": {"labels": {"app": "plugin"}},
            "spec": {
                "nodeSelector": {"gpu": "true"},
                "containers": [{"name": "plugin", "image": image}]
            }
        })
    }

    fn pod_template(v: Value) -> PodTemplateSpec {
        serde_json::from_value(v).unwrap()
    }

    fn ds(template: Value, generation: i64, observed: i64, desired: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            spec: DaemonSetSpec {
                template: pod_template(template),
                ..Default::default()
            },
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed),
                desired_number_scheduled: desired,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn both_daemonsets_name_one_content_alike() {
        let old = template_of("plugin:v1");
        let new = template_of("plugin:v2");
        let target_t = template::target_template(&old, KEY);
        let canary_t = template::canary_template(&new, KEY, "ns.plugin");
        let target = ds(target_t.clone(), 2, 2, 3);
        let canary = ds(canary_t.clone(), 1, 1, 1);
        let (t_old, t_expr, c_new) = (
            pod_template(old.clone()),
            pod_template(target_t),
            pod_template(canary_t),
        );
        let revisions = [
            OwnedRevision {
                owner: Owner::Target,
                hash: "aaa",
                number: 1,
                template: &t_old,
            },
            OwnedRevision {
                owner: Owner::Target,
                hash: "bbb",
                number: 2,
                template: &t_expr,
            },
            OwnedRevision {
                owner: Owner::Canary,
                hash: "ccc",
                number: 1,
                template: &c_new,
            },
        ];
        let view = PairView::of(&Found {
            key: KEY,
            target: &target,
            canary: Some(&canary),
            revisions: &revisions,
        });
        let old_name = revision_name(&old);
        let new_name = revision_name(&new);
        // The target's pods from before its expression and after are one revision.
        assert_eq!(
            view.revision_of(Owner::Target, "aaa"),
            Some(old_name.as_str())
        );
        assert_eq!(
            view.revision_of(Owner::Target, "bbb"),
            Some(old_name.as_str())
        );
        assert_eq!(
            view.revision_of(Owner::Canary, "ccc"),
            Some(new_name.as_str())
        );
        assert_eq!(view.revision_of(Owner::Canary, "aaa"), None);
        // A pod released to the target, not adopted yet: the target's hash.
        assert_eq!(
            view.pod_revision(Some(Owner::Canary), "bbb"),
            Some(old_name.as_str())
        );
        assert_eq!(view.pod_revision(None, "bbb"), Some(old_name.as_str()));
        assert_eq!(view.pod_revision(None, "ccc"), None);
        assert_eq!(view.pod_revision(Some(Owner::Target), "ccc"), None);
        assert!(view.target_expression);
        assert_eq!(view.target.hash.as_deref(), Some("bbb"));
        let pair = view.pair();
        assert_eq!(pair.target, Some(old_name.as_str()));
        assert_eq!(pair.current(), Some(new_name.as_str()));
        assert!(!view.target_on_canary());
        assert_eq!(view.contents[&new_name], content_hash(&new));
        let engine = view.engine_view(&target);
        assert_eq!(engine.current_revision, Some(new_name.as_str()));
        assert!(engine.is_observed());
        assert_eq!(engine.known_revisions.len(), 2);
        // The engine places by the target's own template, not its expression.
        assert!(engine.placement.affinity.is_none());
        assert!(engine.placement.node_selector.is_some());
        assert!(!view.canary.as_ref().unwrap().held);
    }

    #[test]
    fn an_unobserved_canary_has_no_revision_yet() {
        let old = template_of("plugin:v1");
        let target = ds(old.clone(), 1, 1, 3);
        let canary = ds(
            template::canary_template(&template_of("plugin:v2"), KEY, "ns.plugin"),
            2,
            1,
            0,
        );
        let t = pod_template(old);
        let revisions = [OwnedRevision {
            owner: Owner::Target,
            hash: "aaa",
            number: 1,
            template: &t,
        }];
        let view = PairView::of(&Found {
            key: KEY,
            target: &target,
            canary: Some(&canary),
            revisions: &revisions,
        });
        assert!(!view.target_expression);
        let pair = view.pair();
        assert_eq!(pair.canary.unwrap().revision, None);
        assert!(!view.engine_view(&target).is_observed());
        assert!(!view.canary.unwrap().held, "not observed: not held");
    }
}
