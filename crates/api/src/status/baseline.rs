//! How a stage's allocatable baseline is written to status: as groups of
//! nodes that share one baseline (`baselineGroups`), not as a map with an
//! entry per node (`baseline`, what operators before this one wrote).
//!
//! In memory the baseline stays a map from node to its counts
//! ([`crate::StageStatus::baseline`]); only the wire form changes. Why: the
//! API server walks every value of a custom resource on each write (schema
//! validation, pruning, server-side apply's typed conversion and compare),
//! and the map of a 1,000-node stage holds 2,000 of them (each node's object
//! and its count). Measured on the local cluster at 1,000 nodes, 30
//! server-side applies of a status each (`bench/results/2026-12-05-baseline-groups.md`):
//! 66-88 ms of API-server CPU a write with the map, 26-27 ms with the groups
//! (the object 52 KB against 33 KB). A fleet's nodes of one stage nearly
//! always share one baseline (the same GPU model and count), so the groups
//! are one or a few lists of names: about what the stage's `nodes` costs.
//!
//! Reading accepts both forms, so a status written by an older operator (the
//! map, under `baseline`) is read as before; the schema keeps `baseline` for
//! that reason (the API server would otherwise prune it on read). The first
//! server-side apply of the new form drops the old field: the operator owned
//! it and no longer sends it.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A node's count per extended resource (e.g. `nvidia.com/gpu: 8`), sorted by
/// resource. A stage's baseline holds one per node: with a BTreeMap each was
/// a tree node of eleven slots (368 bytes for one or two resources), 1.8 MB
/// per copy of a 5,000-node stage's status, of which a pass holds several at
/// once (the cached object, the one a watch event brings, the decision's, the
/// write's). Written to status through this module.
pub type ResourceCounts = litemap::LiteMap<String, i64>;

/// Nodes of the stage that had the same allocatable counts before the stage
/// touched them.
#[derive(JsonSchema)]
#[allow(dead_code)]
pub struct BaselineGroup {
    /// Per extended resource: the allocatable count each of `nodes` had
    /// (empty: the gates read no extended resource there).
    counts: BTreeMap<String, i64>,
    /// The nodes, sorted.
    nodes: Vec<String>,
}

/// Writes `per_node` as groups: one per distinct counts, ordered by the
/// counts (resources and values), each with its nodes in name order.
/// Deterministic: equal baselines always write the same bytes.
pub fn serialize<S: Serializer>(
    per_node: &BTreeMap<String, ResourceCounts>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut groups: BTreeMap<Vec<(&str, i64)>, Vec<&str>> = BTreeMap::new();
    for (node, counts) in per_node {
        let key = counts.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        groups.entry(key).or_default().push(node);
    }
    serializer.collect_seq(groups.iter().map(|(counts, nodes)| Group { counts, nodes }))
}

/// One group as written: `counts` always an object (litemap would write an
/// empty map as `[]`, which the schema refuses).
struct Group<'a> {
    counts: &'a [(&'a str, i64)],
    nodes: &'a [&'a str],
}

impl Serialize for Group<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Counts<'a>(&'a [(&'a str, i64)]);
        impl Serialize for Counts<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(self.0.iter().map(|(r, n)| (r, n)))
            }
        }
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("counts", &Counts(self.counts))?;
        map.serialize_entry("nodes", self.nodes)?;
        map.end()
    }
}

/// Reads either form: a list of groups (`baselineGroups`) or the map with an
/// entry per node (`baseline`, older operators). A node in two groups is an
/// error rather than a silent pick of one baseline.
pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, ResourceCounts>, D::Error> {
    deserializer.deserialize_any(EitherForm)
}

struct EitherForm;

impl<'de> Visitor<'de> for EitherForm {
    type Value = BTreeMap<String, ResourceCounts>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of baseline groups or a map of node to counts")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        #[derive(Deserialize)]
        struct GroupIn {
            #[serde(default)]
            counts: ResourceCounts,
            #[serde(default)]
            nodes: Vec<String>,
        }
        let mut per_node = BTreeMap::new();
        while let Some(group) = seq.next_element::<GroupIn>()? {
            for node in group.nodes {
                if per_node.insert(node, group.counts.clone()).is_some() {
                    return Err(de::Error::custom(
                        "a node is in two baseline groups of one stage",
                    ));
                }
            }
        }
        Ok(per_node)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut per_node = BTreeMap::new();
        while let Some((node, counts)) = map.next_entry::<String, ResourceCounts>()? {
            per_node.insert(node, counts);
        }
        Ok(per_node)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new()) // null: no baseline
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::StageStatus;

    fn counts(pairs: &[(&str, i64)]) -> crate::ResourceCounts {
        pairs.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    fn stage_with(baseline: &[(&str, &[(&str, i64)])]) -> StageStatus {
        StageStatus {
            baseline: baseline
                .iter()
                .map(|(node, c)| (node.to_string(), counts(c)))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn nodes_that_share_a_baseline_are_written_as_one_group() {
        let gpu8: &[(&str, i64)] = &[("nvidia.com/gpu", 8)];
        let gpu4: &[(&str, i64)] = &[("nvidia.com/gpu", 4)];
        let stage = stage_with(&[
            ("node-c", gpu8),
            ("node-a", gpu8),
            ("node-b", gpu4),
            ("node-d", &[]),
        ]);
        let written = serde_json::to_value(&stage).unwrap();
        assert_eq!(
            written["baselineGroups"],
            json!([
                {"counts": {}, "nodes": ["node-d"]},
                {"counts": {"nvidia.com/gpu": 4}, "nodes": ["node-b"]},
                {"counts": {"nvidia.com/gpu": 8}, "nodes": ["node-a", "node-c"]},
            ])
        );
        assert!(written.get("baseline").is_none(), "{written}");
        let read: StageStatus = serde_json::from_value(written).unwrap();
        assert_eq!(read, stage);
    }

    #[test]
    fn groups_of_several_resources_round_trip() {
        let both: &[(&str, i64)] = &[("amd.com/gpu", 2), ("nvidia.com/gpu", 8)];
        let one: &[(&str, i64)] = &[("amd.com/gpu", 2)];
        let stage = stage_with(&[("n1", both), ("n2", one), ("n3", both)]);
        let written = serde_json::to_value(&stage).unwrap();
        assert_eq!(written["baselineGroups"].as_array().unwrap().len(), 2);
        let read: StageStatus = serde_json::from_value(written).unwrap();
        assert_eq!(read, stage);
    }

    #[test]
    fn a_status_written_by_an_older_operator_is_read() {
        let stage: StageStatus = serde_json::from_value(json!({
            "index": 0,
            "nodes": ["node-a", "node-b"],
            "baseline": {"node-a": {"nvidia.com/gpu": 8}, "node-b": {}},
        }))
        .unwrap();
        assert_eq!(
            stage,
            stage_with(&[("node-a", &[("nvidia.com/gpu", 8)]), ("node-b", &[])])
                .with_nodes(&["node-a", "node-b"])
        );
    }

    #[test]
    fn a_node_in_two_groups_is_refused() {
        let err = serde_json::from_value::<StageStatus>(json!({
            "index": 0,
            "baselineGroups": [
                {"counts": {"nvidia.com/gpu": 8}, "nodes": ["node-a"]},
                {"counts": {"nvidia.com/gpu": 4}, "nodes": ["node-a"]},
            ],
        }))
        .unwrap_err();
        assert!(err.to_string().contains("two baseline groups"), "{err}");
    }

    #[test]
    fn no_baseline_writes_nothing() {
        let written = serde_json::to_value(StageStatus::default()).unwrap();
        assert!(written.get("baselineGroups").is_none(), "{written}");
        let read: StageStatus =
            serde_json::from_value(json!({"index": 0, "baselineGroups": null})).unwrap();
        assert!(read.baseline.is_empty());
    }

    impl StageStatus {
        fn with_nodes(mut self, nodes: &[&str]) -> Self {
            self.nodes = nodes.iter().map(|n| n.to_string()).collect();
            self
        }
    }
}
