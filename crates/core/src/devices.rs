//! What the device gates observe, and the pure readings of it: a driver's
//! pools on a node (complete or not, devices, counters, capacity, taints),
//! the node a claim was allocated on, the claims a pod uses, the baseline of
//! a node before the stage touches it.
//!
//! The runtime gathers [`DeviceEvidence`] from its caches (ResourceSlices,
//! ResourceClaims, the workload pods of the nodes the rollout holds, the
//! rollout's probe pods and quarantine rules) and hands it to the decision
//! with every other piece of [`crate::gates::Evidence`]; the test model builds
//! it from its own objects.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use saferollout_api::devices::MAX_RECORDED;
use saferollout_api::{NodeDevices, quantity_count};

/// What the runtime could observe of devices, for one decision.
#[derive(Debug, Clone, Default)]
pub struct DeviceEvidence<'a> {
    /// The SafeRollout's namespace: status names only its pods and claims;
    /// those of other namespaces are counted, or recorded by UID.
    pub namespace: &'a str,
    /// Why the runtime observes no devices at all (e.g. `resource.k8s.io/v1`
    /// not served, or the device gates turned off): the device gates wait
    /// and say so, and fail at the progress deadline.
    pub unavailable: Option<&'a str>,
    /// ResourceSlices of node-local pools, by the node they describe.
    pub slices: BTreeMap<&'a str, Vec<&'a ResourceSlice>>,
    /// Every ResourceClaim the runtime holds, by (namespace, name).
    pub claims: BTreeMap<(&'a str, &'a str), &'a ResourceClaim>,
    /// Allocated claims by the node they were allocated on.
    pub claims_by_node: BTreeMap<&'a str, Vec<&'a ResourceClaim>>,
    /// Pods that use devices (extended resources or ResourceClaims) on the
    /// nodes the rollout holds, by node.
    pub pods: BTreeMap<&'a str, Vec<&'a Pod>>,
    /// Nodes whose pods have been listed: a node missing here is not observed
    /// yet, and gates that read its pods wait.
    pub pods_observed: BTreeSet<&'a str>,
    /// The rollout's claims probe pods, in its namespace.
    pub probes: Vec<&'a Pod>,
    /// Names of the rollout's quarantine DeviceTaintRules; `None` when the
    /// runtime cannot see them (DeviceTaintRule not served).
    pub quarantine_rules: Option<BTreeSet<&'a str>>,
    /// The `EvictionInProgress` message of the rollout's quarantine rules,
    /// by name: what a `None` (preview) rule says `NoExecute` would evict.
    pub quarantine_previews: BTreeMap<&'a str, &'a str>,
}

impl<'a> DeviceEvidence<'a> {
    /// Indexes claims by name and by the node they were allocated on.
    pub fn add_claims(&mut self, claims: impl IntoIterator<Item = &'a ResourceClaim>) {
        for c in claims {
            let ns = c.metadata.namespace.as_deref().unwrap_or_default();
            let name = c.metadata.name.as_deref().unwrap_or_default();
            self.claims.insert((ns, name), c);
            if let Some(node) = claim_node(c) {
                self.claims_by_node.entry(node).or_default().push(c);
            }
        }
    }

    /// Indexes node-local slices by node.
    pub fn add_slices(&mut self, slices: impl IntoIterator<Item = &'a ResourceSlice>) {
        for s in slices {
            if let Some(node) = s.spec.node_name.as_deref() {
                self.slices.entry(node).or_default().push(s);
            }
        }
    }

    /// The slices of `driver` on `node`.
    pub fn node_slices(&self, node: &str, driver: &str) -> Vec<&'a ResourceSlice> {
        self.slices
            .get(node)
            .into_iter()
            .flatten()
            .filter(|s| s.spec.driver == driver)
            .copied()
            .collect()
    }

    /// Pods on `node` that use devices, if the node's pods are observed.
    pub fn node_pods(&self, node: &str) -> Option<&[&'a Pod]> {
        if !self.pods_observed.contains(node) {
            return None;
        }
        Some(self.pods.get(node).map(Vec::as_slice).unwrap_or_default())
    }
}

/// The node a claim was allocated on: the allocation's node selector
/// (`metadata.name In [node]`, what the scheduler writes for node-local
/// devices). `None` for an unallocated claim or devices not bound to a node.
pub fn claim_node(claim: &ResourceClaim) -> Option<&str> {
    let selector = claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?;
    selector.node_selector_terms.iter().find_map(|term| {
        term.match_fields
            .iter()
            .flatten()
            .find(|r| r.key == "metadata.name" && r.operator == "In")
            .and_then(|r| r.values.as_ref()?.first())
            .map(String::as_str)
    })
}

/// Whether the claim is allocated devices of `driver`.
pub fn claim_uses_driver(claim: &ResourceClaim, driver: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .is_some_and(|rs| rs.iter().any(|r| r.driver == driver))
}

/// Whether the claim is allocated (to any node).
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// Whether the claim is reserved for at least one consumer.
pub fn is_reserved(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| !r.is_empty())
}

/// `namespace/name`.
/// How status records a claim: `<namespace>/<name>` in the SafeRollout's
/// namespace `own`; `uid:<uid>` in any other, so status never names another
/// namespace's objects.
pub fn claim_key(claim: &ResourceClaim, own: &str) -> String {
    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    if ns == own {
        format!(
            "{ns}/{}",
            claim.metadata.name.as_deref().unwrap_or_default()
        )
    } else {
        format!(
            "{OTHER_CLAIM_PREFIX}{}",
            claim.metadata.uid.as_deref().unwrap_or_default()
        )
    }
}

/// Prefix of a claim of another namespace in status (see [`claim_key`]).
pub const OTHER_CLAIM_PREFIX: &str = "uid:";

/// Names of the ResourceClaims a pod uses (its own namespace): those it
/// names and those the claim controller made for it from templates.
pub fn pod_claim_names(pod: &Pod) -> BTreeSet<&str> {
    let named = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    let generated = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    named.chain(generated).collect()
}

/// The pod's phase (`""` when none yet).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

pub fn is_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Why a pod failed, as the kubelet wrote it: the pod's message, else the
/// first terminated container's message or reason and exit code.
pub fn failure_message(pod: &Pod) -> String {
    let st = pod.status.as_ref();
    if let Some(m) = st
        .and_then(|s| s.message.as_deref())
        .filter(|m| !m.is_empty())
    {
        return m.to_string();
    }
    st.into_iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            Some(match t.message.as_deref().filter(|m| !m.is_empty()) {
                Some(m) => m.to_string(),
                None => format!(
                    "container {} exited with {} ({})",
                    c.name,
                    t.exit_code,
                    t.reason.as_deref().unwrap_or("no reason")
                ),
            })
        })
        .unwrap_or_else(|| "the pod failed".to_string())
}

/// What a driver publishes for one node, read from its slices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Pool names, sorted.
    pub pools: Vec<String>,
    /// The first incomplete pool, described (`None` when every pool is
    /// complete): not all slices of its newest generation are there.
    pub incomplete: Option<String>,
    /// Devices in the newest generation of every pool.
    pub devices: i64,
    /// Total of each shared counter.
    pub counters: BTreeMap<String, i64>,
    /// Total of each device capacity.
    pub capacity: BTreeMap<String, i64>,
    /// Tainted devices: `<pool>/<device>: <key>=<value>:<effect>`, sorted.
    pub taints: BTreeSet<String>,
    /// Published device ids, `<pool>/<device>`.
    pub device_ids: BTreeSet<String>,
    /// Devices without any taint.
    pub untainted: i64,
}

/// Reads the node's pools of `driver` from its slices: per pool only the
/// newest generation counts, and the pool is complete when as many slices
/// of it are there as `resourceSliceCount` says.
pub fn pool_state(slices: &[&ResourceSlice], driver: &str) -> PoolState {
    let mut by_pool: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == driver) {
        by_pool
            .entry(s.spec.pool.name.as_str())
            .or_default()
            .push(s);
    }
    let mut st = PoolState::default();
    for (pool, slices) in by_pool {
        st.pools.push(pool.to_string());
        let newest = slices
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or_default();
        let current: Vec<&&ResourceSlice> = slices
            .iter()
            .filter(|s| s.spec.pool.generation == newest)
            .collect();
        let want = current
            .iter()
            .map(|s| s.spec.pool.resource_slice_count)
            .max()
            .unwrap_or_default();
        if (current.len() as i64) < want && st.incomplete.is_none() {
            st.incomplete = Some(format!(
                "pool {pool} has {} of {want} slices of generation {newest}",
                current.len()
            ));
        }
        for s in current {
            for set in s.spec.shared_counters.iter().flatten() {
                for (name, c) in &set.counters {
                    *st.counters.entry(name.clone()).or_default() +=
                        quantity_count(&c.value).unwrap_or(0);
                }
            }
            for d in s.spec.devices.iter().flatten() {
                st.devices += 1;
                let id = format!("{pool}/{}", d.name);
                for (name, c) in d.capacity.iter().flatten() {
                    *st.capacity.entry(name.clone()).or_default() +=
                        quantity_count(&c.value).unwrap_or(0);
                }
                let taints = d.taints.as_deref().unwrap_or_default();
                if taints.is_empty() {
                    st.untainted += 1;
                }
                for t in taints {
                    st.taints.insert(format!(
                        "{id}: {}={}:{}",
                        t.key,
                        t.value.as_deref().unwrap_or_default(),
                        t.effect
                    ));
                }
                st.device_ids.insert(id);
            }
        }
    }
    st
}

/// The device of a taint entry (`<pool>/<device>` of `<pool>/<device>: ...`).
pub fn taint_device(entry: &str) -> &str {
    entry.split_once(": ").map_or(entry, |(d, _)| d)
}

/// A node's baseline for the device gates: what `driver` publishes there
/// now and the claims allocated there (with devices of `driver`) and
/// reserved for a pod.
pub fn capture(ev: &DeviceEvidence, node: &str, driver: &str) -> NodeDevices {
    let pool = pool_state(&ev.node_slices(node, driver), driver);
    let mut claims: Vec<String> = ev
        .claims_by_node
        .get(node)
        .into_iter()
        .flatten()
        .filter(|c| claim_uses_driver(c, driver) && is_reserved(c))
        .map(|c| claim_key(c, ev.namespace))
        .collect();
    claims.sort();
    let claims_total = claims.len() as i64;
    claims.truncate(MAX_RECORDED);
    let taints_total = pool.taints.len() as i64;
    NodeDevices {
        pools: pool.pools,
        devices: pool.devices,
        counters: pool.counters,
        capacity: pool.capacity,
        taints: pool.taints.into_iter().take(MAX_RECORDED).collect(),
        taints_total,
        claims,
        claims_total,
    }
}

/// An amount as people read it: `80Gi` when it is a whole number of GiB,
/// `512Mi` of MiB, else the number.
pub fn format_amount(n: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if n != 0 && n % GI == 0 {
        format!("{}Gi", n / GI)
    } else if n != 0 && n % MI == 0 {
        format!("{}Mi", n / MI)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
pub(crate) mod test_objects {
    //! API objects as the tests describe them.

    use serde_json::json;

    use super::*;

    /// When the test slices were published: after the test pods became
    /// Ready, so what they say is the new driver's.
    fn published() -> serde_json::Value {
        json!(crate::gates::test_support::ts(
            crate::gates::test_support::STATUS_WRITTEN_AT
        ))
    }

    /// `slice` as written (created or last changed) at `at` (test seconds).
    pub fn written_at(mut slice: ResourceSlice, at: i64) -> ResourceSlice {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
        slice.metadata.creation_timestamp = Some(Time(crate::gates::test_support::ts(at)));
        slice.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            time: Some(Time(crate::gates::test_support::ts(at))),
            ..Default::default()
        }]);
        slice
    }

    /// A slice of `driver` on `node`, pool `node`, with `devices`
    /// (`(name, tainted)`), each with 80Gi of memory, published after the
    /// test pods became Ready.
    pub fn slice(
        node: &str,
        driver: &str,
        generation: i64,
        count: i64,
        devices: &[(&str, bool)],
    ) -> ResourceSlice {
        let devices: Vec<_> = devices
            .iter()
            .map(|(name, tainted)| {
                let mut d = json!({"name": name, "capacity": {"memory": {"value": "80Gi"}}});
                if *tainted {
                    d["taints"] = json!([{"key": "gpu.example.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]);
                }
                d
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{driver}-{generation}-{}", devices.len()),
                "creationTimestamp": published()},
            "spec": {"driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                "devices": devices}
        }))
        .unwrap()
    }

    /// A counter slice with one counter set of `memory` per entry.
    pub fn counter_slice(
        node: &str,
        driver: &str,
        generation: i64,
        count: i64,
        sets: &[&str],
    ) -> ResourceSlice {
        let sets: Vec<_> = sets
            .iter()
            .enumerate()
            .map(|(i, m)| json!({"name": format!("gpu-{i}"), "counters": {"memory": {"value": m}}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{driver}-counters"),
                "creationTimestamp": published()},
            "spec": {"driver": driver, "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                "sharedCounters": sets}
        }))
        .unwrap()
    }

    /// A claim `ns/name` allocated `device` of `driver` on `node`, reserved
    /// for pod `pod` when given.
    pub fn claim(
        ns: &str,
        name: &str,
        driver: &str,
        node: Option<&str>,
        pod: Option<&str>,
    ) -> ResourceClaim {
        let mut status = json!({});
        if let Some(node) = node {
            status["allocation"] = json!({
                "devices": {"results": [{"request": "gpu", "driver": driver, "pool": node, "device": "gpu-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
            });
        }
        if let Some(pod) = pod {
            status["reservedFor"] =
                json!([{"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}},
            "status": status
        }))
        .unwrap()
    }

    /// A workload pod on `node` using claim `claim` (by name), in `phase`.
    pub fn claim_pod(ns: &str, name: &str, node: &str, claim: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "work", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// A workload pod on `node` whose container reports `(name, id, health)`.
    pub fn health_pod(name: &str, node: &str, entries: &[(&str, &str, &str)]) -> Pod {
        let statuses: Vec<_> = entries
            .iter()
            .map(|(n, id, h)| json!({"name": n, "resources": [{"resourceID": id, "health": h}]}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "work", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": [{"name": "work"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "work", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0, "allocatedResourcesStatus": statuses}]}
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_objects::*;
    use super::*;

    const D: &str = "gpu.example.com";

    #[test]
    fn a_pool_counts_only_its_newest_complete_generation() {
        let old = slice("n1", D, 1, 1, &[("gpu-0", false), ("gpu-1", false)]);
        let new_a = slice("n1", D, 2, 2, &[("gpu-0", false)]);
        let st = pool_state(&[&old, &new_a], D);
        assert_eq!(st.devices, 1, "generation 1 does not count");
        assert_eq!(
            st.incomplete.as_deref(),
            Some("pool n1 has 1 of 2 slices of generation 2")
        );
        let new_b = counter_slice("n1", D, 2, 2, &["80Gi", "80Gi"]);
        let st = pool_state(&[&old, &new_a, &new_b], D);
        assert_eq!(st.incomplete, None);
        assert_eq!(st.counters["memory"], 160 << 30);
        assert_eq!(st.capacity["memory"], 80 << 30);
        // Another driver's slices are not this pool.
        assert_eq!(
            pool_state(&[&old], "other.example.com"),
            PoolState::default()
        );
    }

    #[test]
    fn taints_and_claims_make_the_baseline() {
        let s = slice("n1", D, 1, 1, &[("gpu-0", false), ("gpu-3", true)]);
        let reserved = claim("work", "c1", D, Some("n1"), Some("p1"));
        let idle = claim("work", "c2", D, Some("n1"), None);
        let elsewhere = claim("work", "c3", D, Some("n2"), Some("p3"));
        let tenant = claim("tenant-b", "secret-project", D, Some("n1"), Some("p4"));
        let mut ev = DeviceEvidence {
            namespace: "work",
            ..Default::default()
        };
        ev.add_slices([&s]);
        ev.add_claims([&reserved, &idle, &elsewhere, &tenant]);
        let b = capture(&ev, "n1", D);
        assert_eq!(b.pools, ["n1"]);
        assert_eq!(b.devices, 2);
        assert_eq!(
            b.taints,
            ["n1/gpu-3: gpu.example.com/unhealthy=xid-79:NoSchedule"]
        );
        // Only reserved claims on the node; another namespace's by UID only.
        assert_eq!(b.claims, ["uid:uid-tenant-b-secret-project", "work/c1"]);
        assert_eq!(b.claims_total, 2);
        assert_eq!(claim_node(&elsewhere), Some("n2"));
        assert_eq!(taint_device(&b.taints[0]), "n1/gpu-3");
    }

    #[test]
    fn amounts_read_as_people_write_them() {
        assert_eq!(format_amount(80 << 30), "80Gi");
        assert_eq!(format_amount(512 << 20), "512Mi");
        assert_eq!(format_amount(8), "8");
        assert_eq!(format_amount(0), "0");
    }
}
