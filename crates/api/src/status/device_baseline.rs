//! How a stage's device baseline is written to status: as groups of nodes
//! whose gated DRA driver had the same shape (`deviceBaselineGroups`), not
//! as a map with an entry per node (`deviceBaseline`, what operators before
//! this one wrote).
//!
//! In memory the baseline stays a map from node to its record
//! ([`crate::StageStatus::device_baseline`]); only the wire form changes.
//! Why: a SafeRollout's status must stay well under etcd's 1.5 MiB object
//! limit at any fleet size, and the map wrote every node's pools, devices,
//! counters, capacity and claims: about 2 MB at 5,000 nodes with 8 claims
//! each. A fleet's nodes nearly always share one shape (the same GPUs, a
//! pool named after the node, the usual DRA naming), so the groups are a few
//! lists of node names; claim names are written per node only while the
//! status's budget of them lasts (`MAX_CLAIM_NAMES`, enforced where the
//! baseline is captured); beyond it a node's claims are counted
//! (`claimsTotal`) and the claims gate judges the claims allocated there
//! now (`saferollout_core::gates::claims`).
//!
//! Reading accepts both forms; the schema keeps `deviceBaseline` so the API
//! server does not prune a stored status before the operator has read it.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a node had of the gated DRA driver before the stage touched it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevices {
    /// The pools the driver published for the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// Devices published in those pools.
    #[serde(default)]
    pub devices: i64,
    /// Total of each shared counter (e.g. memory) over the pools.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, i64>,
    /// Total of each device capacity (e.g. memory) over the devices.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, i64>,
    /// Tainted devices, `<device>: <key>=<value>:<effect>`, sorted; at most
    /// 64 (`taintsTotal` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    #[serde(default)]
    pub taints_total: i64,
    /// ResourceClaims allocated on the node and reserved for a pod,
    /// `<namespace>/<name>`, sorted; at most 64 (`claimsTotal` counts them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
    #[serde(default)]
    pub claims_total: i64,
}

/// Most taints and claims recorded per node (the rest are counted).
pub const MAX_RECORDED: usize = 64;

/// Most claim names one status records across its stages' device
/// baselines; beyond them, nodes' claims are counted only.
pub const MAX_CLAIM_NAMES: usize = 2048;

/// Records `node`'s baseline in `baseline`, its claim names only while
/// `claim_names` (the names the status records so far, all stages) stays
/// within [`MAX_CLAIM_NAMES`]; past it, its claims are counted only.
pub fn record(
    baseline: &mut BTreeMap<String, NodeDevices>,
    node: &str,
    mut devices: NodeDevices,
    claim_names: &mut usize,
) {
    if *claim_names + devices.claims.len() > MAX_CLAIM_NAMES {
        devices.claims.clear();
    }
    *claim_names += devices.claims.len();
    baseline.insert(node.to_string(), devices);
}

/// Nodes of a stage whose gated DRA driver had the same shape before the
/// stage touched them.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceBaselineGroup {
    /// The pools each node had, when not only the pool named after the node
    /// (absent: each node had its own pool, named after it).
    #[serde(default)]
    pools: Option<Vec<String>>,
    /// Devices published in those pools.
    #[serde(default)]
    devices: i64,
    /// Total of each shared counter (e.g. memory) over the pools.
    #[serde(default)]
    counters: BTreeMap<String, i64>,
    /// Total of each device capacity (e.g. memory) over the devices.
    #[serde(default)]
    capacity: BTreeMap<String, i64>,
    /// Tainted devices, `<device>: <key>=<value>:<effect>`, sorted; at most
    /// 64 (`taintsTotal` counts them all).
    #[serde(default)]
    taints: Vec<String>,
    #[serde(default)]
    taints_total: i64,
    /// ResourceClaims allocated on each node and reserved for a pod.
    #[serde(default)]
    claims_total: i64,
    /// The nodes, sorted.
    nodes: Vec<String>,
    /// Per node, its claims by name (`<namespace>/<name>`, or `uid:<uid>`
    /// for another namespace's), sorted, when recorded; a node absent here
    /// with a `claimsTotal` had its claims counted only.
    #[serde(default)]
    claims: BTreeMap<String, Vec<String>>,
}

/// What nodes of one group share, as written.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
struct Shape<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pools: Option<&'a [String]>,
    devices: i64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    counters: &'a BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    capacity: &'a BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    taints: &'a [String],
    #[serde(skip_serializing_if = "is_zero")]
    taints_total: i64,
    #[serde(skip_serializing_if = "is_zero")]
    claims_total: i64,
}

fn shape<'a>(node: &str, d: &'a NodeDevices) -> Shape<'a> {
    let own_pool = d.pools.len() == 1 && d.pools[0] == node;
    Shape {
        pools: (!own_pool).then_some(d.pools.as_slice()),
        devices: d.devices,
        counters: &d.counters,
        capacity: &d.capacity,
        taints: &d.taints,
        taints_total: d.taints_total,
        claims_total: d.claims_total,
    }
}

#[derive(Serialize)]
struct GroupOut<'a> {
    #[serde(flatten)]
    shape: Shape<'a>,
    nodes: Vec<&'a str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    claims: BTreeMap<&'a str, &'a [String]>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Writes `per_node` as groups, one per shape, ordered by shape, each with
/// its nodes in name order. Deterministic: equal baselines write the same
/// bytes.
pub fn serialize<S: Serializer>(
    per_node: &BTreeMap<String, NodeDevices>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut groups: BTreeMap<Shape, GroupOut> = BTreeMap::new();
    for (node, d) in per_node {
        let s = shape(node, d);
        let g = groups.entry(s).or_insert_with(|| GroupOut {
            shape: s,
            nodes: Vec::new(),
            claims: BTreeMap::new(),
        });
        g.nodes.push(node);
        if !d.claims.is_empty() {
            g.claims.insert(node, &d.claims);
        }
    }
    serializer.collect_seq(groups.values())
}

/// Reads either form: a list of groups (`deviceBaselineGroups`) or the map
/// with an entry per node (`deviceBaseline`, older operators). A node in two
/// groups, or claims named for a node not in the group, is an error rather
/// than a silent pick.
pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, NodeDevices>, D::Error> {
    deserializer.deserialize_any(EitherForm)
}

struct EitherForm;

impl<'de> Visitor<'de> for EitherForm {
    type Value = BTreeMap<String, NodeDevices>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of device baseline groups or a map of node to its devices")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut per_node = BTreeMap::new();
        while let Some(mut g) = seq.next_element::<DeviceBaselineGroup>()? {
            if let Some(node) = g.claims.keys().find(|n| !g.nodes.contains(n)) {
                return Err(de::Error::custom(format!(
                    "device baseline claims name node {node}, which is not in their group"
                )));
            }
            for node in g.nodes {
                let d = NodeDevices {
                    pools: g.pools.clone().unwrap_or_else(|| vec![node.clone()]),
                    devices: g.devices,
                    counters: g.counters.clone(),
                    capacity: g.capacity.clone(),
                    taints: g.taints.clone(),
                    taints_total: g.taints_total,
                    claims: g.claims.remove(&node).unwrap_or_default(),
                    claims_total: g.claims_total,
                };
                if per_node.insert(node, d).is_some() {
                    return Err(de::Error::custom(
                        "a node is in two device baseline groups of one stage",
                    ));
                }
            }
        }
        Ok(per_node)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut per_node = BTreeMap::new();
        while let Some((node, d)) = map.next_entry::<String, NodeDevices>()? {
            per_node.insert(node, d);
        }
        Ok(per_node)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::StageStatus;

    fn devices(pools: &[&str], n: i64, claims: &[&str], claims_total: i64) -> NodeDevices {
        NodeDevices {
            pools: pools.iter().map(|s| s.to_string()).collect(),
            devices: n,
            counters: BTreeMap::from([("memory".into(), n << 30)]),
            claims: claims.iter().map(|s| s.to_string()).collect(),
            claims_total,
            ..Default::default()
        }
    }

    fn stage(baseline: Vec<(&str, NodeDevices)>) -> StageStatus {
        StageStatus {
            device_baseline: baseline
                .into_iter()
                .map(|(n, d)| (n.to_string(), d))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn nodes_of_one_shape_are_one_group_with_their_claims_named_per_node() {
        let s = stage(vec![
            ("node-b", devices(&["node-b"], 8, &["work/b1"], 1)),
            ("node-a", devices(&["node-a"], 8, &["work/a1"], 1)),
            ("node-c", devices(&["node-c"], 8, &[], 1)),
            ("node-d", devices(&["shared"], 4, &[], 0)),
        ]);
        let written = serde_json::to_value(&s).unwrap();
        assert_eq!(
            written["deviceBaselineGroups"],
            json!([
                {"devices": 8, "counters": {"memory": 8i64 << 30}, "claimsTotal": 1,
                 "nodes": ["node-a", "node-b", "node-c"],
                 "claims": {"node-a": ["work/a1"], "node-b": ["work/b1"]}},
                {"devices": 4, "pools": ["shared"], "counters": {"memory": 4i64 << 30}, "nodes": ["node-d"]},
            ])
        );
        assert!(written.get("deviceBaseline").is_none(), "{written}");
        let read: StageStatus = serde_json::from_value(written).unwrap();
        assert_eq!(read, s);
    }

    /// The status of a 5,000-node DRA rollout at its last stage (1, 10 %,
    /// 50 %, 100 %), every node with 8 GPUs, memory counters and capacity,
    /// and 8 claims allocated, recorded as the core records it: under
    /// 512 KiB, where the per-node map came to over 1.5 MiB, etcd's limit.
    #[test]
    fn a_5000_node_dra_status_with_claims_stays_under_512_kib() {
        let nodes: Vec<String> = (0..5000).map(|i| format!("gpu-node-{i:05}")).collect();
        let bounds = [0, 1, 500, 2500, 5000];
        let mut claim_names = 0;
        let mut status = crate::SafeRolloutStatus::default();
        for (index, w) in bounds.windows(2).enumerate() {
            let mut stage = StageStatus {
                index: index as i32,
                nodes: nodes[w[0]..w[1]].to_vec(),
                ..Default::default()
            };
            for node in &stage.nodes {
                let claims: Vec<String> = (0..8)
                    .map(|c| format!("training-team-a/{node}-job-{c}-gpu-claim"))
                    .collect();
                let d = NodeDevices {
                    pools: vec![node.clone()],
                    devices: 8,
                    counters: BTreeMap::from([("memory".into(), 640i64 << 30)]),
                    capacity: BTreeMap::from([("memory".into(), 640i64 << 30)]),
                    claims_total: claims.len() as i64,
                    claims,
                    ..Default::default()
                };
                record(&mut stage.device_baseline, node, d, &mut claim_names);
            }
            status.stages.push(stage);
        }
        assert_eq!(
            claim_names, MAX_CLAIM_NAMES,
            "the budget of names is used up"
        );
        let written = serde_json::to_vec(&status).unwrap();
        eprintln!("a 5,000-node DRA status: {} bytes", written.len());
        assert!(
            written.len() < 512 * 1024,
            "the status is {} bytes",
            written.len()
        );
        // What the per-node map wrote for the same baselines.
        let per_node: usize = status
            .stages
            .iter()
            .flat_map(|s| s.device_baseline.iter())
            .map(|(n, d)| {
                let mut full = d.clone();
                full.claims = (0..8)
                    .map(|c| format!("training-team-a/{n}-job-{c}-gpu-claim"))
                    .collect();
                serde_json::to_vec(&(n, full)).unwrap().len()
            })
            .sum();
        eprintln!("the same baselines as the per-node map: {per_node} bytes");
        assert!(
            per_node > 3 * 512 * 1024,
            "the per-node map: {per_node} bytes"
        );
        // Read back: every node's baseline, its claims named or counted.
        let read: crate::SafeRolloutStatus = serde_json::from_slice(&written).unwrap();
        assert_eq!(read, status);
        let named = read
            .stages
            .iter()
            .flat_map(|s| s.device_baseline.values())
            .filter(|d| !d.claims.is_empty())
            .count();
        assert_eq!(named, MAX_CLAIM_NAMES / 8);
        assert!(
            read.stages
                .iter()
                .flat_map(|s| s.device_baseline.values())
                .all(|d| d.claims_total == 8)
        );
    }

    #[test]
    fn a_status_written_by_an_older_operator_is_read() {
        let read: StageStatus = serde_json::from_value(json!({
            "index": 0,
            "deviceBaseline": {"node-a": {"pools": ["node-a"], "devices": 8, "claims": ["work/a1"], "claimsTotal": 1}},
        }))
        .unwrap();
        assert_eq!(
            read.device_baseline["node-a"],
            NodeDevices {
                pools: vec!["node-a".into()],
                devices: 8,
                claims: vec!["work/a1".into()],
                claims_total: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_node_in_two_groups_or_claims_outside_their_group_are_refused() {
        let err = serde_json::from_value::<StageStatus>(json!({
            "index": 0,
            "deviceBaselineGroups": [
                {"devices": 8, "nodes": ["node-a"]},
                {"devices": 4, "nodes": ["node-a"]},
            ],
        }))
        .unwrap_err();
        assert!(
            err.to_string().contains("two device baseline groups"),
            "{err}"
        );
        let err = serde_json::from_value::<StageStatus>(json!({
            "index": 0,
            "deviceBaselineGroups": [{"devices": 8, "nodes": ["node-a"], "claims": {"node-z": ["x/y"]}}],
        }))
        .unwrap_err();
        assert!(err.to_string().contains("not in their group"), "{err}");
    }
}
