//! Image drift: pods of one DaemonSet revision (one `controller-revision-hash`)
//! whose containers run different images on different nodes. A revision names
//! its image by reference; when the reference moves (a tag pushed again, with
//! `imagePullPolicy: Always` or on a node that had not pulled it yet), nodes
//! that pulled at different times run different code under the same
//! revision, which the rollout's gates never judged (lint's SR110 is the
//! same problem seen in the manifest). The kubelet reports what each
//! container actually runs in `status.containerStatuses[].imageID`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use serde::Serialize;

use super::revision_hash;

/// The node label with the node's CPU architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// Nodes listed per image ID (every node is counted).
pub const NODES_SHOWN: usize = 5;
/// Image IDs listed per container of a revision (every one is counted).
pub const IMAGE_IDS_SHOWN: usize = 5;
/// Drifting containers listed (every one is counted).
pub const ENTRIES_SHOWN: usize = 20;

/// One container of one DaemonSet revision running more than one image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageDrift {
    pub daemon_set: String,
    /// The pods' `controller-revision-hash`.
    pub revision: String,
    pub container: String,
    /// An init container rather than a regular one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    /// The nodes' architecture (`kubernetes.io/arch`): image IDs are compared
    /// among nodes of one architecture only, since a runtime may report the
    /// digest of the platform's manifest rather than of the multi-platform
    /// index the tag names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The images, most nodes first; at most [`IMAGE_IDS_SHOWN`].
    pub image_ids: Vec<ImageIdNodes>,
    /// How many different images in all.
    pub image_id_count: usize,
}

/// One image ID and the nodes whose pod runs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIdNodes {
    /// As the kubelet reports it (of the first such pod by node name).
    pub image_id: String,
    /// Sorted; at most [`NODES_SHOWN`].
    pub nodes: Vec<String>,
    pub node_count: usize,
}

/// What identifies an image's content in an `imageID`: the digest after the
/// last `@`, so that runtimes that spell the same image differently
/// (`docker-pullable://nvcr.io/x@sha256:..` and `nvcr.io/x@sha256:..`) agree;
/// without a digest, the ID less any `scheme://`.
fn content_of(image_id: &str) -> &str {
    match image_id.rsplit_once('@') {
        Some((_, digest)) => digest,
        None => image_id
            .rsplit_once("://")
            .map_or(image_id, |(_, rest)| rest),
    }
}

/// (DaemonSet, revision, init, container, arch).
type Key = (String, String, bool, String, Option<String>);
/// Content -> (the image ID shown, the nodes).
type Seen = BTreeMap<String, (String, BTreeSet<String>)>;

/// The drifting containers of `pods`, sorted by DaemonSet, revision and
/// container; at most [`ENTRIES_SHOWN`], with how many there are in all.
///
/// `daemon_set_of` names the agent DaemonSet owning a pod (`None`: not an
/// agent, skipped); `arch_of` a node's architecture. Pods without a node, a
/// revision hash or an image ID (a container not started yet) are skipped.
pub fn image_drift<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    daemon_set_of: impl Fn(&Pod) -> Option<String>,
    arch_of: impl Fn(&str) -> Option<String>,
) -> (Vec<ImageDrift>, usize) {
    let mut seen: BTreeMap<Key, Seen> = BTreeMap::new();
    for pod in pods {
        let (Some(ds), Some(revision), Some(node)) = (
            daemon_set_of(pod),
            revision_hash(&pod.metadata),
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ) else {
            continue;
        };
        let status = pod.status.as_ref();
        let statuses = [
            (false, status.and_then(|s| s.container_statuses.as_ref())),
            (
                true,
                status.and_then(|s| s.init_container_statuses.as_ref()),
            ),
        ];
        for (init, list) in statuses {
            for cs in list.into_iter().flatten() {
                record(&mut seen, (&ds, &revision, &node, init, arch_of(&node)), cs);
            }
        }
    }
    let mut drift: Vec<ImageDrift> = seen
        .into_iter()
        .filter(|(_, images)| images.len() > 1)
        .map(|((daemon_set, revision, init, container, arch), images)| {
            let image_id_count = images.len();
            let mut image_ids: Vec<ImageIdNodes> = images
                .into_values()
                .map(|(image_id, nodes)| ImageIdNodes {
                    image_id,
                    node_count: nodes.len(),
                    nodes: nodes.into_iter().take(NODES_SHOWN).collect(),
                })
                .collect();
            image_ids.sort_by(|a, b| {
                b.node_count
                    .cmp(&a.node_count)
                    .then_with(|| a.image_id.cmp(&b.image_id))
            });
            image_ids.truncate(IMAGE_IDS_SHOWN);
            ImageDrift {
                daemon_set,
                revision,
                container,
                init,
                arch,
                image_ids,
                image_id_count,
            }
        })
        .collect();
    let count = drift.len();
    drift.truncate(ENTRIES_SHOWN);
    (drift, count)
}

fn record(
    seen: &mut BTreeMap<Key, Seen>,
    (ds, revision, node, init, arch): (&str, &str, &str, bool, Option<String>),
    cs: &ContainerStatus,
) {
    if cs.image_id.is_empty() {
        return;
    }
    let key = (
        ds.to_string(),
        revision.to_string(),
        init,
        cs.name.clone(),
        arch,
    );
    let (shown, nodes) = seen
        .entry(key)
        .or_default()
        .entry(content_of(&cs.image_id).to_string())
        .or_insert_with(|| (cs.image_id.clone(), BTreeSet::new()));
    // Pods are not sorted: show the ID as the first node by name reports it.
    if nodes.first().is_none_or(|first| node < first.as_str()) {
        *shown = cs.image_id.clone();
    }
    nodes.insert(node.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_spell_one_image_alike() {
        let digest = "sha256:1111";
        for id in [
            "docker-pullable://nvcr.io/nvidia/k8s-device-plugin@sha256:1111",
            "nvcr.io/nvidia/k8s-device-plugin@sha256:1111",
            "docker.io/library/x:1@sha256:1111",
        ] {
            assert_eq!(content_of(id), digest, "{id}");
        }
        assert_eq!(content_of("docker://sha256:2222"), "sha256:2222");
        assert_eq!(content_of("sha256:2222"), "sha256:2222");
    }
}
