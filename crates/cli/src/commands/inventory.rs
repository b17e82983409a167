//! `inventory`: a read-only report of what a rollout depends on: server
//! version, served APIs (DRA's `resource.k8s.io` in particular), nodes with
//! their extended resources and agent pods, the namespace's DaemonSets, image
//! drift (pods of one revision running different images, [`drift`]), DRA
//! device classes and resource slices, and recent Warning events.
//!
//! Sections the caller may not read (403) or that the server does not serve
//! are skipped with a note; only an unreachable server fails the command.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup;
use k8s_openapi::apimachinery::pkg::version::Info;
use kube::api::ListParams;
use kube::{Api, Resource};
use serde::Serialize;

use super::drift::{self, ImageDrift};
use super::{ZONE_LABEL, int_or_string, owned_by, revision_hash};
use crate::cli::InventoryArgs;
use crate::client::Kube;
use crate::error::CliError;
use crate::output::{age, emit, serialize, timestamp};
use crate::table::{Table, or_dash};

/// The DRA API group.
pub const DRA_GROUP: &str = "resource.k8s.io";
/// How many Warning events the report keeps (the most recent).
pub const EVENTS_KEPT: usize = 20;

/// What `inventory -o json|yaml` prints. Field names are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub namespace: String,
    /// `--target`, when given: agent pods are those of this DaemonSet only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub server: ServerVersion,
    /// Served API groups and versions (`core` for the legacy group).
    pub api_groups: Vec<ApiGroupInfo>,
    pub dra: Dra,
    pub nodes: Vec<NodeInfo>,
    pub daemon_sets: Vec<DaemonSetInfo>,
    /// Agent containers of one revision running different image IDs on
    /// different nodes; at most [`drift::ENTRIES_SHOWN`].
    pub image_drift: Vec<ImageDrift>,
    /// Drifting containers beyond those listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub image_drift_omitted: usize,
    /// Most recent last.
    pub warning_events: Vec<EventInfo>,
    /// Sections that could not be read, and why.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerVersion {
    pub git_version: String,
    pub major: String,
    pub minor: String,
    pub platform: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiGroupInfo {
    pub name: String,
    pub versions: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferred: Option<String>,
}

/// Dynamic Resource Allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Dra {
    /// Served versions of `resource.k8s.io`.
    pub served_versions: Vec<String>,
    /// Whether `resource.k8s.io/v1` is served (the classes and slices are read only then).
    pub v1_served: bool,
    pub device_classes: Vec<DeviceClassInfo>,
    /// Per node, driver and pool.
    pub resource_slices: Vec<SlicePool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassInfo {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
    /// CEL expressions of the class's selectors.
    pub selectors: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlicePool {
    /// `None` for slices not tied to one node (allNodes / nodeSelector).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub driver: String,
    pub pool: String,
    pub slices: usize,
    pub devices: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub ready: bool,
    /// Allocatable extended resources (names with a `/`), as quantities.
    pub extended_resources: BTreeMap<String, String>,
    pub agent_pods: Vec<AgentPodInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentPodInfo {
    pub name: String,
    pub daemon_set: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub ready: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetInfo {
    pub name: String,
    pub desired: i32,
    pub current: i32,
    pub ready: i32,
    pub available: i32,
    pub updated: i32,
    /// `RollingUpdate (maxUnavailable 1)`, `OnDelete`, ...
    pub update_strategy: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventInfo {
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// `Kind/name` of the object the event is about.
    pub object: String,
    pub reason: String,
    pub count: i32,
    pub message: String,
}

/// What the API calls returned (lists that could not be read are empty, with a note).
#[derive(Debug, Clone, Default)]
pub struct Raw {
    pub namespace: String,
    pub target: Option<String>,
    pub version: Info,
    pub groups: Vec<APIGroup>,
    pub core_versions: Vec<String>,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub daemon_sets: Vec<DaemonSet>,
    pub device_classes: Vec<DeviceClass>,
    pub resource_slices: Vec<ResourceSlice>,
    pub events: Vec<Event>,
    pub notes: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The served versions of `group` (empty when not served).
pub fn served_versions(groups: &[APIGroup], group: &str) -> Vec<String> {
    groups
        .iter()
        .find(|g| g.name == group)
        .map(|g| g.versions.iter().map(|v| v.version.clone()).collect())
        .unwrap_or_default()
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| {
            e.series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref())
                .map(|t| t.0)
        })
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn update_strategy(ds: &DaemonSet) -> String {
    let Some(s) = ds.spec.update_strategy.as_ref() else {
        return "RollingUpdate".into();
    };
    let kind = s.type_.clone().unwrap_or_else(|| "RollingUpdate".into());
    match s.rolling_update.as_ref() {
        Some(r) if kind == "RollingUpdate" => {
            let mut parts = Vec::new();
            if let Some(m) = &r.max_unavailable {
                parts.push(format!("maxUnavailable {}", int_or_string(m)));
            }
            if let Some(m) = &r.max_surge {
                parts.push(format!("maxSurge {}", int_or_string(m)));
            }
            if parts.is_empty() {
                kind
            } else {
                format!("{kind} ({})", parts.join(", "))
            }
        }
        _ => kind,
    }
}

/// The report from what was fetched (pure).
pub fn build(raw: &Raw) -> Inventory {
    let mut api_groups = vec![ApiGroupInfo {
        name: "core".into(),
        versions: raw.core_versions.clone(),
        preferred: raw.core_versions.first().cloned(),
    }];
    api_groups.extend(raw.groups.iter().map(|g| ApiGroupInfo {
        name: g.name.clone(),
        versions: g.versions.iter().map(|v| v.version.clone()).collect(),
        preferred: g.preferred_version.as_ref().map(|v| v.version.clone()),
    }));
    api_groups[1..].sort_by(|a, b| a.name.cmp(&b.name));

    let served = served_versions(&raw.groups, DRA_GROUP);
    let v1_served = served.iter().any(|v| v == "v1");
    let mut classes: Vec<DeviceClassInfo> = raw
        .device_classes
        .iter()
        .map(|c| DeviceClassInfo {
            name: c.metadata.name.clone().unwrap_or_default(),
            extended_resource_name: c
                .spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.clone()),
            selectors: c
                .spec
                .iter()
                .flat_map(|s| s.selectors.iter().flatten())
                .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
                .collect(),
        })
        .collect();
    classes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut pools: BTreeMap<(Option<String>, String, String), (usize, usize)> = BTreeMap::new();
    for s in &raw.resource_slices {
        let key = (
            s.spec.node_name.clone(),
            s.spec.driver.clone(),
            s.spec.pool.name.clone(),
        );
        let entry = pools.entry(key).or_default();
        entry.0 += 1;
        entry.1 += s.spec.devices.as_ref().map_or(0, Vec::len);
    }
    let resource_slices = pools
        .into_iter()
        .map(|((node, driver, pool), (slices, devices))| SlicePool {
            node,
            driver,
            pool,
            slices,
            devices,
        })
        .collect();

    // Agent pods: of the target DaemonSet, or of every DaemonSet in the namespace.
    let agents: BTreeMap<String, String> = raw
        .daemon_sets
        .iter()
        .filter(|ds| raw.target.is_none() || ds.metadata.name.as_deref() == raw.target.as_deref())
        .filter_map(|ds| Some((ds.metadata.uid.clone()?, ds.metadata.name.clone()?)))
        .collect();
    let daemon_set_of = |p: &Pod| {
        agents
            .iter()
            .find(|(uid, _)| owned_by(&p.metadata, uid))
            .map(|(_, name)| name.clone())
    };
    let arches: BTreeMap<&str, &str> = raw
        .nodes
        .iter()
        .filter_map(|n| {
            let arch = n.metadata.labels.as_ref()?.get(drift::ARCH_LABEL)?;
            Some((n.metadata.name.as_deref()?, arch.as_str()))
        })
        .collect();
    let (image_drift, drifting) = drift::image_drift(&raw.pods, daemon_set_of, |node| {
        arches.get(node).map(|a| a.to_string())
    });
    let mut pods_by_node: BTreeMap<String, Vec<AgentPodInfo>> = BTreeMap::new();
    for p in &raw.pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Some(ds) = daemon_set_of(p) else {
            continue;
        };
        let status = p.status.as_ref();
        pods_by_node.entry(node).or_default().push(AgentPodInfo {
            name: p.metadata.name.clone().unwrap_or_default(),
            daemon_set: ds,
            revision: revision_hash(&p.metadata),
            phase: status.and_then(|s| s.phase.clone()),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        });
    }
    let mut nodes: Vec<NodeInfo> = raw
        .nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            let status = n.status.as_ref();
            let mut agent_pods = pods_by_node.remove(&name).unwrap_or_default();
            agent_pods.sort_by(|a, b| a.name.cmp(&b.name));
            NodeInfo {
                zone: n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL).cloned()),
                ready: status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
                extended_resources: status
                    .and_then(|s| s.allocatable.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.contains('/'))
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
                agent_pods,
                name,
            }
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));

    let mut daemon_sets: Vec<DaemonSetInfo> = raw
        .daemon_sets
        .iter()
        .map(|ds| {
            let s = ds.status.clone().unwrap_or_default();
            DaemonSetInfo {
                name: ds.metadata.name.clone().unwrap_or_default(),
                desired: s.desired_number_scheduled,
                current: s.current_number_scheduled,
                ready: s.number_ready,
                available: s.number_available.unwrap_or(0),
                updated: s.updated_number_scheduled.unwrap_or(0),
                update_strategy: update_strategy(ds),
            }
        })
        .collect();
    daemon_sets.sort_by(|a, b| a.name.cmp(&b.name));

    let mut events: Vec<(Option<Timestamp>, EventInfo)> = raw
        .events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            let t = event_time(e);
            let o = &e.involved_object;
            (
                t,
                EventInfo {
                    last_seen: t.map(timestamp),
                    object: format!(
                        "{}/{}",
                        o.kind.as_deref().unwrap_or("?"),
                        o.name.as_deref().unwrap_or("?")
                    ),
                    reason: e.reason.clone().unwrap_or_default(),
                    count: e.count.unwrap_or(1),
                    message: e.message.clone().unwrap_or_default(),
                },
            )
        })
        .collect();
    events.sort_by_key(|a| a.0);
    let skip = events.len().saturating_sub(EVENTS_KEPT);
    let warning_events = events.into_iter().skip(skip).map(|(_, e)| e).collect();

    Inventory {
        namespace: raw.namespace.clone(),
        target: raw.target.clone(),
        server: ServerVersion {
            git_version: raw.version.git_version.clone(),
            major: raw.version.major.clone(),
            minor: raw.version.minor.clone(),
            platform: raw.version.platform.clone(),
        },
        api_groups,
        dra: Dra {
            served_versions: served,
            v1_served,
            device_classes: classes,
            resource_slices,
        },
        nodes,
        daemon_sets,
        image_drift_omitted: drifting - image_drift.len(),
        image_drift,
        warning_events,
        notes: raw.notes.clone(),
    }
}

/// The image drift section: one row per image ID, the container's columns
/// on its first row only.
fn render_drift(inv: &Inventory) -> String {
    let mut out = String::from("\nImage drift (pods of one revision running different images):\n");
    if inv.image_drift.is_empty() {
        out.push_str("  <none>\n");
        return out;
    }
    let mut t = Table::new(&[
        "DAEMONSET",
        "REVISION",
        "CONTAINER",
        "ARCH",
        "IMAGE ID",
        "NODES",
    ]);
    for d in &inv.image_drift {
        let container = if d.init {
            format!("{} (init)", d.container)
        } else {
            d.container.clone()
        };
        let more_ids = d.image_id_count - d.image_ids.len();
        for (i, id) in d.image_ids.iter().enumerate() {
            let mut nodes = format!("{}: {}", id.node_count, id.nodes.join(", "));
            if id.node_count > id.nodes.len() {
                nodes.push_str(&format!(", +{} more", id.node_count - id.nodes.len()));
            }
            let first = |s: &str| if i == 0 { s.to_string() } else { String::new() };
            t.row([
                first(&d.daemon_set),
                first(&d.revision),
                first(&container),
                first(&or_dash(d.arch.as_deref())),
                id.image_id.clone(),
                nodes,
            ]);
        }
        if more_ids > 0 {
            t.row([
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                format!("+{more_ids} more image IDs"),
                String::new(),
            ]);
        }
    }
    out.push_str(&t.render("  "));
    if inv.image_drift_omitted > 0 {
        out.push_str(&format!(
            "  and {} more drifting containers, not shown\n",
            inv.image_drift_omitted
        ));
    }
    out
}

fn agent_cell(p: &AgentPodInfo) -> String {
    let mut s = format!(
        "{} ({}, {}",
        p.name,
        p.phase.as_deref().unwrap_or("Unknown"),
        if p.ready { "Ready" } else { "not Ready" }
    );
    if let Some(r) = &p.revision {
        s.push_str(&format!(", rev {r}"));
    }
    s.push(')');
    s
}

/// The report as text sections.
pub fn render_table(inv: &Inventory, now: Timestamp) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "Server:      {} ({})\n",
        or_dash(Some(&inv.server.git_version)),
        or_dash(Some(&inv.server.platform))
    ));
    let dra = if inv.dra.served_versions.is_empty() {
        "not served".to_string()
    } else {
        let preferred = inv
            .api_groups
            .iter()
            .find(|g| g.name == DRA_GROUP)
            .and_then(|g| g.preferred.clone());
        format!(
            "{}{}",
            inv.dra.served_versions.join(", "),
            preferred.map_or(String::new(), |p| format!(" (preferred {p})"))
        )
    };
    out.push_str(&format!("DRA:         {DRA_GROUP} {dra}\n"));
    out.push_str(&format!("Namespace:   {}\n", inv.namespace));
    if let Some(t) = &inv.target {
        out.push_str(&format!("Target:      DaemonSet {t}\n"));
    }

    out.push_str("\nAPI groups:\n");
    let mut t = Table::new(&["GROUP", "VERSIONS", "PREFERRED", ""]);
    for g in &inv.api_groups {
        t.row([
            g.name.clone(),
            g.versions.join(","),
            or_dash(g.preferred.as_deref()),
            if g.name == DRA_GROUP {
                "<- DRA".to_string()
            } else {
                String::new()
            },
        ]);
    }
    out.push_str(&t.render("  "));

    let agents_of = match &inv.target {
        Some(t) => format!("AGENT PODS ({t})"),
        None => "AGENT PODS".to_string(),
    };
    out.push_str(&format!("\nNodes ({}):\n", inv.nodes.len()));
    if inv.nodes.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["NAME", "ZONE", "READY", "EXTENDED RESOURCES", &agents_of]);
        for n in &inv.nodes {
            let res: Vec<String> = n
                .extended_resources
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let pods: Vec<String> = n.agent_pods.iter().map(agent_cell).collect();
            t.row([
                n.name.clone(),
                or_dash(n.zone.as_deref()),
                if n.ready { "True" } else { "False" }.to_string(),
                if res.is_empty() {
                    "-".into()
                } else {
                    res.join(", ")
                },
                if pods.is_empty() {
                    "-".into()
                } else {
                    pods.join(", ")
                },
            ]);
        }
        out.push_str(&t.render("  "));
    }

    out.push_str(&format!("\nDaemonSets in {}:\n", inv.namespace));
    if inv.daemon_sets.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&[
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "AVAILABLE",
            "UP-TO-DATE",
            "STRATEGY",
        ]);
        for d in &inv.daemon_sets {
            let marked = if inv.target.as_deref() == Some(d.name.as_str()) {
                format!("{} (target)", d.name)
            } else {
                d.name.clone()
            };
            t.row([
                marked,
                d.desired.to_string(),
                d.current.to_string(),
                d.ready.to_string(),
                d.available.to_string(),
                d.updated.to_string(),
                d.update_strategy.clone(),
            ]);
        }
        out.push_str(&t.render("  "));
    }

    out.push_str(&render_drift(inv));

    if inv.dra.v1_served {
        out.push_str("\nDRA device classes:\n");
        if inv.dra.device_classes.is_empty() {
            out.push_str("  <none>\n");
        } else {
            let mut t = Table::new(&["NAME", "EXTENDED RESOURCE", "SELECTORS"]);
            for c in &inv.dra.device_classes {
                t.row([
                    c.name.clone(),
                    or_dash(c.extended_resource_name.as_deref()),
                    if c.selectors.is_empty() {
                        "-".into()
                    } else {
                        c.selectors.join(" && ")
                    },
                ]);
            }
            out.push_str(&t.render("  "));
        }
        out.push_str("\nDRA resource slices:\n");
        if inv.dra.resource_slices.is_empty() {
            out.push_str("  <none>\n");
        } else {
            let mut t = Table::new(&["NODE", "DRIVER", "POOL", "SLICES", "DEVICES"]);
            for s in &inv.dra.resource_slices {
                t.row([
                    s.node.clone().unwrap_or_else(|| "(not node-local)".into()),
                    s.driver.clone(),
                    s.pool.clone(),
                    s.slices.to_string(),
                    s.devices.to_string(),
                ]);
            }
            out.push_str(&t.render("  "));
        }
    }

    out.push_str(&format!(
        "\nWarning events in {} (last {EVENTS_KEPT}):\n",
        inv.namespace
    ));
    if inv.warning_events.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let mut t = Table::new(&["LAST SEEN", "OBJECT", "REASON", "COUNT", "MESSAGE"]);
        for e in &inv.warning_events {
            let seen = e
                .last_seen
                .as_deref()
                .and_then(|s| s.parse::<Timestamp>().ok());
            t.row([
                age(seen, now),
                e.object.clone(),
                e.reason.clone(),
                e.count.to_string(),
                e.message.clone(),
            ]);
        }
        out.push_str(&t.render("  "));
    }

    if !inv.notes.is_empty() {
        out.push_str("\nNotes:\n");
        for n in &inv.notes {
            out.push_str(&format!("  - {n}\n"));
        }
    }
    out
}

/// A list, or nothing and a note when the caller may not read it.
async fn lenient<K>(
    kube: &Kube,
    api: Api<K>,
    what: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<K>, CliError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) => {
            let reason = if status.message.is_empty() {
                format!("HTTP {}", status.code)
            } else {
                status.message.clone()
            };
            notes.push(format!("{what} skipped: {reason}"));
            Ok(Vec::new())
        }
        Err(e) => Err(kube.error(e, what)),
    }
}

async fn fetch(kube: &Kube, target: Option<&str>) -> Result<Raw, CliError> {
    let client = &kube.client;
    let ns = &kube.namespace;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| kube.error(e, "/version"))?;
    let groups = client
        .list_api_groups()
        .await
        .map_err(|e| kube.error(e, "/apis"))?
        .groups;
    let core_versions = client
        .list_core_api_versions()
        .await
        .map_err(|e| kube.error(e, "/api"))?
        .versions;
    let mut notes = Vec::new();
    let nodes = lenient(kube, Api::<Node>::all(client.clone()), "nodes", &mut notes).await?;
    let daemon_sets = lenient(
        kube,
        Api::<DaemonSet>::namespaced(client.clone(), ns),
        &format!("DaemonSets in {ns}"),
        &mut notes,
    )
    .await?;
    let pods = lenient(
        kube,
        Api::<Pod>::namespaced(client.clone(), ns),
        &format!("pods in {ns}"),
        &mut notes,
    )
    .await?;
    let events = lenient(
        kube,
        Api::<Event>::namespaced(client.clone(), ns),
        &format!("events in {ns}"),
        &mut notes,
    )
    .await?;
    let (device_classes, resource_slices) = if served_versions(&groups, DRA_GROUP)
        .iter()
        .any(|v| v == "v1")
    {
        (
            lenient(
                kube,
                Api::<DeviceClass>::all(client.clone()),
                "DRA device classes",
                &mut notes,
            )
            .await?,
            lenient(
                kube,
                Api::<ResourceSlice>::all(client.clone()),
                "DRA resource slices",
                &mut notes,
            )
            .await?,
        )
    } else {
        notes.push(format!(
            "DRA device classes and resource slices skipped: {DRA_GROUP}/v1 is not served"
        ));
        (Vec::new(), Vec::new())
    };
    let raw = Raw {
        namespace: ns.clone(),
        target: target.map(Into::into),
        version,
        groups,
        core_versions,
        nodes,
        pods,
        daemon_sets,
        device_classes,
        resource_slices,
        events,
        notes,
    };
    Ok(raw)
}

/// Whether `--target` names a DaemonSet of the namespace (unknowable when the
/// DaemonSets could not be listed: then it is taken on trust).
pub fn check_target(raw: &Raw) -> Result<(), CliError> {
    let Some(target) = &raw.target else {
        return Ok(());
    };
    let listed = !raw.notes.iter().any(|n| n.starts_with("DaemonSets in"));
    let names: BTreeSet<&str> = raw
        .daemon_sets
        .iter()
        .filter_map(|d| d.metadata.name.as_deref())
        .collect();
    if listed && !names.contains(target.as_str()) {
        return Err(CliError::failed(format!(
            "DaemonSet {}/{target} not found",
            raw.namespace
        )));
    }
    Ok(())
}

/// Runs `inventory`.
pub async fn run(kube: &Kube, args: &InventoryArgs) -> Result<u8, CliError> {
    let raw = fetch(kube, args.target.as_deref()).await?;
    check_target(&raw)?;
    let inv = build(&raw);
    let text = match serialize(&inv, args.output)? {
        Some(text) => text,
        None => render_table(&inv, Timestamp::now()),
    };
    emit(&text);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{
        DaemonSetSpec, DaemonSetStatus, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
    };
    use k8s_openapi::api::core::v1::{
        ContainerStatus, NodeCondition, NodeStatus, ObjectReference, PodCondition, PodSpec,
        PodStatus,
    };
    use k8s_openapi::api::resource::v1::{
        CELDeviceSelector, Device, DeviceClassSpec, DeviceSelector, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        GroupVersionForDiscovery, ObjectMeta, OwnerReference, Time,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn group(name: &str, versions: &[&str]) -> APIGroup {
        let v: Vec<GroupVersionForDiscovery> = versions
            .iter()
            .map(|v| GroupVersionForDiscovery {
                group_version: format!("{name}/{v}"),
                version: v.to_string(),
            })
            .collect();
        APIGroup {
            name: name.into(),
            preferred_version: v.first().cloned(),
            versions: v,
            ..Default::default()
        }
    }

    fn ds(name: &str, uid: &str) -> DaemonSet {
        let mut metadata = meta(name);
        metadata.uid = Some(uid.into());
        DaemonSet {
            metadata,
            spec: DaemonSetSpec {
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDaemonSet {
                        max_unavailable: Some(IntOrString::Int(1)),
                        max_surge: None,
                    }),
                }),
                ..Default::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: 2,
                current_number_scheduled: 2,
                number_ready: 1,
                number_available: Some(1),
                updated_number_scheduled: Some(2),
                ..Default::default()
            }),
        }
    }

    fn agent(name: &str, node: &str, owner_uid: &str, ready: bool) -> Pod {
        let mut metadata = meta(name);
        metadata.owner_references = Some(vec![OwnerReference {
            uid: owner_uid.into(),
            ..Default::default()
        }]);
        metadata.labels =
            Some([("controller-revision-hash".to_string(), "abc".to_string())].into());
        Pod {
            metadata,
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn node(name: &str, zone: &str, gpus: &str) -> Node {
        let mut metadata = meta(name);
        metadata.labels = Some([(ZONE_LABEL.to_string(), zone.to_string())].into());
        Node {
            metadata,
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_string(), Quantity("4".into())),
                        ("example.com/gpu".to_string(), Quantity(gpus.into())),
                    ]
                    .into(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn event(reason: &str, at: &str, type_: &str) -> Event {
        Event {
            metadata: meta(reason),
            type_: Some(type_.into()),
            reason: Some(reason.into()),
            message: Some(format!("{reason} happened")),
            involved_object: ObjectReference {
                kind: Some("SafeRollout".into()),
                name: Some("sr".into()),
                ..Default::default()
            },
            last_timestamp: Some(Time(at.parse().unwrap())),
            count: Some(2),
            ..Default::default()
        }
    }

    fn slice(name: &str, node: Option<&str>, devices: usize) -> ResourceSlice {
        ResourceSlice {
            metadata: meta(name),
            spec: ResourceSliceSpec {
                driver: "gpu.sim.saferollout.dev".into(),
                node_name: node.map(Into::into),
                pool: ResourcePool {
                    name: node.unwrap_or("shared").into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(
                    (0..devices)
                        .map(|i| Device {
                            name: format!("gpu-{i}"),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    fn raw() -> Raw {
        Raw {
            namespace: "gpu".into(),
            target: None,
            version: Info {
                git_version: "v1.37.2".into(),
                major: "1".into(),
                minor: "37".into(),
                platform: "linux/amd64".into(),
                ..Default::default()
            },
            groups: vec![
                group("resource.k8s.io", &["v1", "v1beta2"]),
                group("apps", &["v1"]),
            ],
            core_versions: vec!["v1".into()],
            nodes: vec![node("n2", "zone-b", "4"), node("n1", "zone-a", "0")],
            pods: vec![
                agent("plugin-x", "n1", "uid-plugin", true),
                agent("other-y", "n1", "uid-other", false),
                agent("stray", "n2", "uid-unknown", true),
            ],
            daemon_sets: vec![ds("plugin", "uid-plugin"), ds("other", "uid-other")],
            device_classes: vec![DeviceClass {
                metadata: meta("gpu.sim.saferollout.dev"),
                spec: Some(DeviceClassSpec {
                    selectors: Some(vec![DeviceSelector {
                        cel: Some(CELDeviceSelector {
                            expression: "device.driver == \"gpu.sim.saferollout.dev\"".into(),
                        }),
                    }]),
                    ..Default::default()
                }),
            }],
            resource_slices: vec![
                slice("s1", Some("n2"), 4),
                slice("s2", Some("n2"), 2),
                slice("s3", None, 1),
            ],
            events: (0..25)
                .map(|i| {
                    event(
                        &format!("R{i:02}"),
                        &format!("2025-01-01T00:{i:02}:00Z"),
                        "Warning",
                    )
                })
                .chain([event("Normal", "2025-01-01T00:59:00Z", "Normal")])
                .collect(),
            notes: vec![],
        }
    }

    #[test]
    fn builds_a_stable_report() {
        let inv = build(&raw());
        assert_eq!(inv.server.git_version, "v1.37.2");
        let names: Vec<_> = inv.api_groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["core", "apps", "resource.k8s.io"]);
        assert_eq!(inv.dra.served_versions, ["v1", "v1beta2"]);
        assert!(inv.dra.v1_served);
        // Nodes sorted; only extended resources; agent pods of every DaemonSet.
        assert_eq!(inv.nodes[0].name, "n1");
        assert_eq!(
            inv.nodes[0].extended_resources,
            BTreeMap::from([("example.com/gpu".to_string(), "0".to_string())])
        );
        let pods: Vec<_> = inv.nodes[0]
            .agent_pods
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(pods, ["other-y", "plugin-x"]);
        assert!(
            inv.nodes[1].agent_pods.is_empty(),
            "pods of unknown owners are not agents"
        );
        // Slices grouped per node, driver, pool.
        assert_eq!(
            inv.dra.resource_slices,
            vec![
                SlicePool {
                    node: None,
                    driver: "gpu.sim.saferollout.dev".into(),
                    pool: "shared".into(),
                    slices: 1,
                    devices: 1
                },
                SlicePool {
                    node: Some("n2".into()),
                    driver: "gpu.sim.saferollout.dev".into(),
                    pool: "n2".into(),
                    slices: 2,
                    devices: 6
                },
            ]
        );
        // The 20 most recent warnings, oldest first, no Normal events.
        assert_eq!(inv.warning_events.len(), EVENTS_KEPT);
        assert_eq!(inv.warning_events[0].reason, "R05");
        assert_eq!(inv.warning_events[19].reason, "R24");
        assert_eq!(
            inv.warning_events[19].last_seen.as_deref(),
            Some("2025-01-01T00:24:00Z")
        );
        assert_eq!(
            inv.daemon_sets[1].update_strategy,
            "RollingUpdate (maxUnavailable 1)"
        );
        let json = serde_json::to_value(&inv).unwrap();
        for key in [
            "namespace",
            "server",
            "apiGroups",
            "dra",
            "nodes",
            "daemonSets",
            "warningEvents",
            "notes",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        assert_eq!(json["nodes"][0]["agentPods"][1]["daemonSet"], "plugin");
    }

    #[test]
    fn target_limits_agent_pods_and_must_exist() {
        let mut r = raw();
        r.target = Some("plugin".into());
        assert!(check_target(&r).is_ok());
        let inv = build(&r);
        let pods: Vec<_> = inv.nodes[0]
            .agent_pods
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(pods, ["plugin-x"]);
        let text = render_table(&inv, "2025-01-01T01:00:00Z".parse().unwrap());
        assert!(text.contains("plugin (target)"), "{text}");
        assert!(text.contains("AGENT PODS (plugin)"), "{text}");
        r.target = Some("nope".into());
        let e = check_target(&r).unwrap_err();
        assert_eq!(e, CliError::failed("DaemonSet gpu/nope not found"));
    }

    #[test]
    fn table_has_every_section() {
        let text = render_table(&build(&raw()), "2025-01-01T01:00:00Z".parse().unwrap());
        for want in [
            "Server:      v1.37.2 (linux/amd64)",
            "DRA:         resource.k8s.io v1, v1beta2 (preferred v1)",
            "<- DRA",
            "Nodes (2):",
            "example.com/gpu=0",
            "plugin-x (Running, Ready, rev abc)",
            "other-y (Running, not Ready, rev abc)",
            "DaemonSets in gpu:",
            "DRA device classes:",
            "device.driver == \"gpu.sim.saferollout.dev\"",
            "DRA resource slices:",
            "(not node-local)",
            "Warning events in gpu (last 20):",
            "36m",
            "R24 happened",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("Notes:"));
    }

    /// `pod` as the kubelet reports it running `image_id` in each container
    /// (`init:` before a name: an init container).
    fn running(mut pod: Pod, containers: &[(&str, &str)]) -> Pod {
        let status = pod.status.get_or_insert_with(Default::default);
        for (name, image_id) in containers {
            let (list, name) = match name.strip_prefix("init:") {
                Some(name) => (&mut status.init_container_statuses, name),
                None => (&mut status.container_statuses, *name),
            };
            list.get_or_insert_with(Vec::new).push(ContainerStatus {
                name: name.into(),
                image_id: image_id.to_string(),
                ..Default::default()
            });
        }
        pod
    }

    fn with_revision(mut pod: Pod, revision: &str) -> Pod {
        pod.metadata.labels =
            Some([("controller-revision-hash".to_string(), revision.into())].into());
        pod
    }

    const A: &str = "nvcr.io/nvidia/k8s-device-plugin@sha256:aaaa";
    const B: &str = "nvcr.io/nvidia/k8s-device-plugin@sha256:bbbb";

    #[test]
    fn image_drift_is_one_revision_on_different_images() {
        let mut r = raw();
        r.pods = vec![
            // The plugin's revision abc runs A on n1 and B on n2: drift.
            running(
                agent("plugin-1", "n1", "uid-plugin", true),
                &[("plugin", A)],
            ),
            running(
                agent("plugin-2", "n2", "uid-plugin", true),
                &[("plugin", B)],
            ),
            // Its sidecar runs one image, spelled two ways by two runtimes.
            running(
                agent("plugin-3", "n3", "uid-plugin", true),
                &[("sidecar", A)],
            ),
            running(
                agent("plugin-4", "n4", "uid-plugin", true),
                &[("sidecar", &format!("docker-pullable://{A}"))],
            ),
            // A container not started yet has no image ID.
            running(
                agent("plugin-5", "n5", "uid-plugin", false),
                &[("plugin", "")],
            ),
            // Two revisions of `other` on two images: a rollout, not drift.
            running(agent("other-1", "n1", "uid-other", true), &[("other", A)]),
            running(
                with_revision(agent("other-2", "n2", "uid-other", true), "def"),
                &[("other", B)],
            ),
            // A pod of no agent DaemonSet, and an agent pod without a revision.
            running(
                agent("stray", "n3", "uid-unknown", true),
                &[("plugin", "x@sha256:cccc")],
            ),
            running(
                {
                    let mut p = agent("plugin-6", "n6", "uid-plugin", true);
                    p.metadata.labels = None;
                    p
                },
                &[("plugin", "x@sha256:dddd")],
            ),
        ];
        let inv = build(&r);
        assert_eq!(
            inv.image_drift,
            [ImageDrift {
                daemon_set: "plugin".into(),
                revision: "abc".into(),
                container: "plugin".into(),
                init: false,
                arch: None,
                image_ids: vec![
                    drift::ImageIdNodes {
                        image_id: A.into(),
                        nodes: vec!["n1".into()],
                        node_count: 1
                    },
                    drift::ImageIdNodes {
                        image_id: B.into(),
                        nodes: vec!["n2".into()],
                        node_count: 1
                    },
                ],
                image_id_count: 2,
            }]
        );
        assert_eq!(inv.image_drift_omitted, 0);
        let text = render_table(&inv, Timestamp::UNIX_EPOCH);
        assert!(
            text.contains("Image drift (pods of one revision running different images):"),
            "{text}"
        );
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Image drift"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        for (row, want) in rows.iter().zip([
            vec![
                "DAEMONSET",
                "REVISION",
                "CONTAINER",
                "ARCH",
                "IMAGE ID",
                "NODES",
            ],
            vec!["plugin", "abc", "plugin", "-", A, "1: n1"],
            vec![B, "1: n2"],
        ]) {
            assert_eq!(
                row.split_whitespace().collect::<Vec<_>>(),
                want.join(" ").split(' ').collect::<Vec<_>>(),
                "{text}"
            );
        }
        let json = serde_json::to_value(&inv).unwrap();
        assert_eq!(json["imageDrift"][0]["imageIds"][1]["imageId"], B);
        assert!(json["imageDrift"][0].get("init").is_none());
        assert!(json.get("imageDriftOmitted").is_none());

        // --target other: the plugin's pods are not looked at.
        r.target = Some("other".into());
        assert!(build(&r).image_drift.is_empty());
        // Without drift the section says so.
        let text = render_table(&build(&raw()), Timestamp::UNIX_EPOCH);
        assert!(text.contains("different images):\n  <none>\n"), "{text}");
    }

    #[test]
    fn image_drift_compares_nodes_of_one_architecture() {
        let mut r = raw();
        let arch = |mut n: Node, arch: &str| {
            n.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(drift::ARCH_LABEL.into(), arch.into());
            n
        };
        r.nodes = vec![
            arch(node("x1", "a", "8"), "amd64"),
            arch(node("x2", "a", "8"), "arm64"),
            arch(node("x3", "a", "8"), "amd64"),
        ];
        // A multi-platform image: each architecture's digest differs.
        r.pods = vec![
            running(agent("p1", "x1", "uid-plugin", true), &[("plugin", A)]),
            running(agent("p2", "x2", "uid-plugin", true), &[("plugin", B)]),
        ];
        assert!(build(&r).image_drift.is_empty());
        // A second amd64 node on B, and an init container drifting too.
        r.pods.push(running(
            agent("p3", "x3", "uid-plugin", true),
            &[("plugin", B), ("init:setup", A)],
        ));
        r.pods[0] = running(r.pods[0].clone(), &[("init:setup", B)]);
        let inv = build(&r);
        let found: Vec<(&str, bool, Option<&str>, usize)> = inv
            .image_drift
            .iter()
            .map(|d| {
                (
                    d.container.as_str(),
                    d.init,
                    d.arch.as_deref(),
                    d.image_id_count,
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                ("plugin", false, Some("amd64"), 2),
                ("setup", true, Some("amd64"), 2)
            ]
        );
        let text = render_table(&inv, Timestamp::UNIX_EPOCH);
        assert!(text.contains("setup (init)"), "{text}");
        assert!(text.contains("amd64"), "{text}");
    }

    #[test]
    fn image_drift_output_is_bounded_and_counted() {
        let mut r = raw();
        let nodes = drift::NODES_SHOWN + 3;
        let ids = drift::IMAGE_IDS_SHOWN + 2;
        // `other`: `nodes` nodes on A, then one node on each other image.
        let mut pods: Vec<Pod> = (0..nodes)
            .map(|i| {
                let pod = agent(&format!("a{i}"), &format!("n{i:02}"), "uid-other", true);
                running(pod, &[("other", A)])
            })
            .collect();
        pods.extend((1..ids).map(|i| {
            let pod = agent(&format!("b{i}"), &format!("m{i:02}"), "uid-other", true);
            running(pod, &[("other", &format!("x@sha256:{i:04}"))])
        }));
        // The plugin: more drifting revisions than are listed, each on A and B.
        let extra = drift::ENTRIES_SHOWN + 3;
        for c in 0..extra {
            let revision = format!("r{c:02}");
            for (n, id) in [("n00", A), ("n01", B)] {
                let pod = agent(&format!("{revision}-{n}"), n, "uid-plugin", true);
                pods.push(running(with_revision(pod, &revision), &[("plugin", id)]));
            }
        }
        r.pods = pods;
        let inv = build(&r);
        // `other` and `extra` plugin revisions drift; the first 20 are listed.
        assert_eq!(inv.image_drift.len(), drift::ENTRIES_SHOWN);
        assert_eq!(inv.image_drift_omitted, extra + 1 - drift::ENTRIES_SHOWN);
        let other = &inv.image_drift[0];
        assert_eq!(other.daemon_set, "other");
        assert_eq!(other.image_id_count, ids);
        assert_eq!(other.image_ids.len(), drift::IMAGE_IDS_SHOWN);
        // Most nodes first, every node counted, the first ones named.
        assert_eq!(other.image_ids[0].image_id, A);
        assert_eq!(other.image_ids[0].node_count, nodes);
        assert_eq!(
            other.image_ids[0].nodes,
            ["n00", "n01", "n02", "n03", "n04"]
        );
        assert_eq!(inv.image_drift[1].revision, "r00");
        let text = render_table(&inv, Timestamp::UNIX_EPOCH);
        assert!(
            text.contains(&format!("{nodes}: n00, n01, n02, n03, n04, +3 more")),
            "{text}"
        );
        assert!(text.contains("+2 more image IDs"), "{text}");
        assert!(
            text.contains("and 4 more drifting containers, not shown"),
            "{text}"
        );
        assert_eq!(serde_json::to_value(&inv).unwrap()["imageDriftOmitted"], 4);
    }

    #[test]
    fn without_dra_v1_the_sections_are_skipped() {
        let mut r = raw();
        r.groups = vec![group("resource.k8s.io", &["v1beta1"])];
        r.device_classes.clear();
        r.resource_slices.clear();
        r.notes.push(
            "DRA device classes and resource slices skipped: resource.k8s.io/v1 is not served"
                .into(),
        );
        let inv = build(&r);
        assert!(!inv.dra.v1_served);
        let text = render_table(&inv, Timestamp::UNIX_EPOCH);
        assert!(!text.contains("DRA device classes:"), "{text}");
        assert!(text.contains("Notes:\n  - DRA device classes"), "{text}");
        r.groups.clear();
        let text = render_table(&build(&r), Timestamp::UNIX_EPOCH);
        assert!(
            text.contains("DRA:         resource.k8s.io not served"),
            "{text}"
        );
    }
}
