//! The test control plane itself: real components, simulated GPU nodes, and a
//! device-plugin / DRA-driver fixture that behaves like the real agents.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use saferollout_testkit::{ClusterOptions, ClusterProcess, cluster, wait_for_all, wait_for_object};
use serde_json::json;

const NODES: usize = 4;
const GPUS: i64 = 8;
const TIMEOUT: Duration = Duration::from_secs(90);

/// The fixture's plugin and the DRA tests share the nodes: run them one at a time.
static NODE_AGENTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn agent_daemonset(name: &str, kind: &str, image: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": {"app": name, "sim.saferollout.dev/agent": kind}},
                "spec": {"containers": [{"name": "agent", "image": image}]}
            }
        }
    }))
    .unwrap()
}

fn allocatable(node: &Node, resource: &str) -> Option<i64> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get(resource)?;
    q.0.parse().ok()
}

fn pod_ready(p: &Pod) -> bool {
    let status = p.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_image(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .unwrap_or("")
}

async fn set_image(api: &Api<DaemonSet>, name: &str, image: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": image}]}}}});
    api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(())
}

/// Waits until every node runs exactly one Ready agent pod of `image`.
async fn wait_agents_ready(pods: &Api<Pod>, app: &str, image: &str) -> anyhow::Result<()> {
    wait_for_all(
        pods,
        watcher::Config::default().labels(&format!("app={app}")),
        TIMEOUT,
        |ps| {
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for p in ps.iter().filter(|p| pod_ready(p) && pod_image(p) == image) {
                *per_node
                    .entry(
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .unwrap_or(""),
                    )
                    .or_default() += 1;
            }
            ps.len() == NODES && per_node.len() == NODES && per_node.values().all(|&n| n == 1)
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn control_plane_is_real_and_nodes_are_ready() -> anyhow::Result<()> {
    let c = cluster();
    let version: serde_json::Value = serde_json::from_str(&c.kubectl(&["version", "-o", "json"])?)?;
    assert_eq!(
        version["serverVersion"]["gitVersion"], "v1.37.2",
        "{version}"
    );
    assert_eq!(
        version["clientVersion"]["gitVersion"], "v1.37.2",
        "{version}"
    );

    let groups = c.kubectl(&["api-versions"])?;
    let groups: Vec<&str> = groups.lines().collect();
    for want in ["apps/v1", "resource.k8s.io/v1"] {
        assert!(groups.contains(&want), "{want} not served: {groups:?}");
    }

    let nodes: Api<Node> = Api::all(c.client().await?);
    let list = nodes.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), NODES);
    for n in &list.items {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten();
        assert!(
            ready
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"),
            "node {:?} not Ready",
            n.metadata.name
        );
    }
    let zones: std::collections::BTreeSet<_> = list
        .items
        .iter()
        .filter_map(|n| {
            n.metadata
                .labels
                .as_ref()?
                .get("topology.kubernetes.io/zone")
                .cloned()
        })
        .collect();
    assert_eq!(zones.len(), 2, "nodes should span two zones: {zones:?}");
    Ok(())
}

#[tokio::test]
async fn device_plugin_daemonset_advertises_and_bad_releases_show() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("device-plugin").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let nodes: Api<Node> = Api::all(client.clone());

    // A healthy release: one Ready pod per node, every node advertises its GPUs.
    let good = "registry.example/sim-device-plugin:v1.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("plugin", "device-plugin", good),
    )
    .await?;
    wait_agents_ready(&pods, "plugin", good).await?;
    wait_for_all(&nodes, watcher::Config::default(), TIMEOUT, |ns| {
        ns.len() == NODES
            && ns
                .iter()
                .all(|n| allocatable(n, "example.com/gpu") == Some(GPUS))
    })
    .await?;

    // The real scheduler places a pod that asks for one GPU ...
    let gpu_pod = |name: &str, gpus: i64| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "work", "image": "registry.example/cuda-job:1",
                "resources": {"limits": {"example.com/gpu": gpus.to_string()}}}]}
        }))
        .unwrap()
    };
    pods.create(&PostParams::default(), &gpu_pod("one-gpu", 1))
        .await?;
    let scheduled = wait_for_object(&pods, "one-gpu", TIMEOUT, |p| {
        p.and_then(|p| p.spec.as_ref()?.node_name.as_ref())
            .is_some()
    })
    .await?;
    assert!(scheduled.is_some());

    // ... and leaves one asking for more than any node has Pending, saying why.
    pods.create(&PostParams::default(), &gpu_pod("too-many-gpus", GPUS + 1))
        .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    wait_for_all(
        &events,
        watcher::Config::default().fields("involvedObject.name=too-many-gpus"),
        TIMEOUT,
        |es| {
            es.iter().any(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.message
                        .as_deref()
                        .unwrap_or("")
                        .contains("Insufficient example.com/gpu")
            })
        },
    )
    .await?;
    let pending = pods.get("too-many-gpus").await?;
    assert_eq!(
        pending.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    assert!(pending.spec.and_then(|s| s.node_name).is_none());
    pods.delete("one-gpu", &Default::default()).await?;
    pods.delete("too-many-gpus", &Default::default()).await?;

    // A broken release rolled out by the DaemonSet controller: GPUs vanish.
    let broken = "registry.example/sim-device-plugin:v1.1.0-broken";
    set_image(&dss, "plugin", broken).await?;
    wait_agents_ready(&pods, "plugin", broken).await?;
    wait_for_all(&nodes, watcher::Config::default(), TIMEOUT, |ns| {
        ns.len() == NODES
            && ns
                .iter()
                .all(|n| allocatable(n, "example.com/gpu") == Some(0))
    })
    .await?;

    // A crash-looping release shows CrashLoopBackOff in the container status.
    let crashloop = "registry.example/sim-device-plugin:v1.2.0-crashloop";
    set_image(&dss, "plugin", crashloop).await?;
    let seen = wait_for_all(
        &pods,
        watcher::Config::default().labels("app=plugin"),
        TIMEOUT,
        |ps| {
            ps.iter().any(|p| {
                pod_image(p) == crashloop
                    && p.status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c.state
                                    .as_ref()
                                    .and_then(|s| s.waiting.as_ref())
                                    .and_then(|w| w.reason.as_deref())
                                    == Some("CrashLoopBackOff")
                            })
                        })
            })
        },
    )
    .await?;
    assert!(
        seen.iter().any(|p| !pod_ready(p)),
        "a crash-looping pod must not be Ready"
    );
    dss.delete("plugin", &Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn dra_driver_publishes_slices_and_the_scheduler_allocates_claims() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("dra-driver").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let driver = "gpu.sim.saferollout.dev";
    let ours = move |s: &ResourceSlice| s.spec.driver == driver;

    let good = "registry.example/sim-dra-driver:v0.5.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("driver", "dra-driver", good),
    )
    .await?;
    wait_agents_ready(&pods, "driver", good).await?;
    let published = wait_for_all(&slices, watcher::Config::default(), TIMEOUT, |ss| {
        let nodes: std::collections::BTreeSet<_> = ss
            .iter()
            .filter(|s| ours(s))
            .filter_map(|s| s.spec.node_name.clone())
            .collect();
        nodes.len() == NODES
    })
    .await?;
    for s in published.iter().filter(|s| ours(s)) {
        assert_eq!(
            s.spec.devices.as_ref().map(Vec::len),
            Some(GPUS as usize),
            "{s:?}"
        );
    }

    // A claim for one device of the class, used by a pod: the real scheduler allocates it.
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "one-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}}
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "uses-claim"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [{"name": "work", "image": "registry.example/cuda-job:1",
                "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let allocated = wait_for_object(&claims, "one-gpu", TIMEOUT, |c| {
        c.and_then(|c| c.status.as_ref()?.allocation.as_ref())
            .is_some()
    })
    .await?
    .expect("claim");
    let results = allocated
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap_or_default();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].driver, driver);
    wait_for_object(&pods, "uses-claim", TIMEOUT, |p| {
        p.and_then(|p| p.spec.as_ref()?.node_name.as_ref())
            .is_some()
    })
    .await?;

    // A broken driver release withdraws the slices.
    let broken = "registry.example/sim-dra-driver:v0.6.0-broken";
    set_image(&dss, "driver", broken).await?;
    wait_agents_ready(&pods, "driver", broken).await?;
    wait_for_all(&slices, watcher::Config::default(), TIMEOUT, |ss| {
        !ss.iter().any(|s| ours(s))
    })
    .await?;
    pods.delete("uses-claim", &Default::default()).await?;
    dss.delete("driver", &Default::default()).await?;
    Ok(())
}

/// Listening TCP ports on loopback (from /proc, so no extra tools are needed).
fn listening_ports() -> anyhow::Result<std::collections::BTreeSet<u16>> {
    let mut ports = std::collections::BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // st 0A = LISTEN
            if cols.get(3) == Some(&"0A")
                && let Some(port) = cols.get(1).and_then(|a| a.rsplit(':').next())
            {
                ports.insert(u16::from_str_radix(port, 16)?);
            }
        }
    }
    Ok(ports)
}

#[test]
fn up_then_down_leaves_no_process_and_no_port() -> anyhow::Result<()> {
    let state_dir = std::env::temp_dir().join(format!("saferollout-updown-{}", std::process::id()));
    let proc = ClusterProcess::start(&ClusterOptions {
        nodes: 1,
        gpus_per_node: 2,
        state_dir: state_dir.clone(),
    })?;
    let pids = proc.pids()?;
    let ports = proc.ports()?;
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "saferollout-sim",
    ] {
        assert!(names.contains(&want), "{want} not started: {names:?}");
    }
    let listening = listening_ports()?;
    for (name, port) in &ports {
        assert!(listening.contains(port), "{name} should listen on {port}");
    }
    // Idempotent: a second `up` on the same state dir reuses the running cluster.
    let again = ClusterProcess::start(&ClusterOptions {
        nodes: 1,
        gpus_per_node: 2,
        state_dir: state_dir.clone(),
    })?;
    assert_eq!(again.pids()?, pids, "a second up must not restart anything");

    proc.stop()?;
    for (name, pid) in &pids {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z ");
        assert!(!alive, "{name} (pid {pid}) still running after down");
    }
    let listening = listening_ports()?;
    for (name, port) in &ports {
        assert!(
            !listening.contains(port),
            "{name}'s port {port} still listening after down"
        );
    }
    assert!(!state_dir.exists(), "down must remove the state dir");
    Ok(())
}
