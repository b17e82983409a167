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
        audit_policy: None,
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
        audit_policy: None,
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

// ---------------------------------------------------------------------------
// The fixture's new faults, the kubelet it plays for workload pods, logs and
// metrics (issues 8 and 10).

const DRIVER: &str = "gpu.sim.saferollout.dev";
const WORKLOAD_LABEL: &str = "sim.saferollout.dev/workload";
const FAULTY_LABEL: &str = "sim.saferollout.dev/faulty-devices";

fn agent_daemonset_annotated(
    name: &str,
    kind: &str,
    image: &str,
    annotations: serde_json::Value,
) -> DaemonSet {
    let mut ds = agent_daemonset(name, kind, image);
    let template = ds.spec.template.metadata.as_mut().unwrap();
    template.annotations = serde_json::from_value(annotations).unwrap();
    ds
}

/// A workload pod the fixture plays the kubelet for: `restart` Never makes
/// it a probe; `gpus` asks the device plugin, `claim` a ResourceClaim.
fn workload_pod(
    name: &str,
    node: Option<&str>,
    restart: &str,
    gpus: Option<i64>,
    claim: Option<&str>,
) -> Pod {
    let mut resources = json!({});
    if let Some(gpus) = gpus {
        resources["limits"] = json!({"example.com/gpu": gpus.to_string()});
    }
    if claim.is_some() {
        resources["claims"] = json!([{"name": "gpu"}]);
    }
    let mut spec = json!({
        "restartPolicy": restart,
        "containers": [{"name": "work", "image": "registry.example/cuda-vector-add:1", "resources": resources}]
    });
    if let Some(node) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    if let Some(claim) = claim {
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {WORKLOAD_LABEL: "probe"}},
        "spec": spec
    }))
    .unwrap()
}

fn gpu_claim(name: &str, selector: Option<&str>) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": DRIVER});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .unwrap()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// `(name, resourceID, health)` of every allocatedResourcesStatus entry.
fn resource_health(p: &Pod) -> Vec<(String, String, String)> {
    p.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .flat_map(|c| c.allocated_resources_status.iter().flatten())
        .flat_map(|r| {
            r.resources.iter().flatten().map(move |h| {
                (
                    r.name.clone(),
                    h.resource_id.clone(),
                    h.health.clone().unwrap_or_default(),
                )
            })
        })
        .collect()
}

fn terminated(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

async fn wait_pod(pods: &Api<Pod>, name: &str, done: impl Fn(&Pod) -> bool) -> anyhow::Result<Pod> {
    Ok(
        wait_for_object(pods, name, TIMEOUT, |p| p.is_some_and(&done))
            .await?
            .expect("pod"),
    )
}

async fn wait_scheduling_failure(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    needle: &str,
) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let seen = wait_for_all(
        &events,
        watcher::Config::default().fields(&format!("involvedObject.name={pod}")),
        TIMEOUT,
        |es| {
            es.iter().any(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.message.as_deref().unwrap_or("").contains(needle)
            })
        },
    )
    .await?;
    Ok(seen
        .iter()
        .filter_map(|e| e.message.clone())
        .find(|m| m.contains(needle))
        .unwrap_or_default())
}

/// Sets (or with `None` removes) a node label; removed again on drop.
struct NodeLabel {
    kubeconfig: std::path::PathBuf,
    node: String,
    key: String,
}

impl NodeLabel {
    fn set(node: &str, key: &str, value: &str) -> anyhow::Result<Self> {
        let c = cluster();
        c.kubectl(&[
            "label",
            "node",
            node,
            &format!("{key}={value}"),
            "--overwrite",
        ])?;
        Ok(Self {
            kubeconfig: c.kubeconfig().to_path_buf(),
            node: node.into(),
            key: key.into(),
        })
    }
}

impl Drop for NodeLabel {
    fn drop(&mut self) {
        let _ = saferollout_testkit::kubectl(
            &self.kubeconfig,
            &["label", "node", &self.node, &format!("{}-", self.key)],
        );
    }
}

fn slice_devices<'a>(
    ss: &'a [std::sync::Arc<ResourceSlice>],
    node: &str,
) -> Vec<&'a ResourceSliceDevice> {
    ss.iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node))
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

type ResourceSliceDevice = k8s_openapi::api::resource::v1::Device;

fn pool_slices<'a>(ss: &'a [std::sync::Arc<ResourceSlice>], node: &str) -> Vec<&'a ResourceSlice> {
    ss.iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node))
        .map(AsRef::as_ref)
        .collect()
}

/// Whether the node's pool is complete (all slices of one generation, as
/// many as `resourceSliceCount` says) and `check` holds for its devices.
fn pool_is(
    ss: &[std::sync::Arc<ResourceSlice>],
    node: &str,
    check: impl Fn(&[&ResourceSliceDevice]) -> bool,
) -> bool {
    let slices = pool_slices(ss, node);
    let Some(first) = slices.first() else {
        return false;
    };
    let complete = slices.iter().all(|s| s.spec.pool == first.spec.pool)
        && slices.len() as i64 == first.spec.pool.resource_slice_count;
    complete && check(&slice_devices(ss, node))
}

fn capacity(n: &Node, resource: &str) -> Option<i64> {
    n.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get(resource)?
        .0
        .parse()
        .ok()
}

fn node_names() -> Vec<String> {
    (0..NODES).map(|i| format!("sim-gpu-{i}")).collect()
}

fn tainted(d: &ResourceSliceDevice) -> bool {
    d.taints
        .iter()
        .flatten()
        .any(|t| t.key == "gpu.sim.saferollout.dev/unhealthy" && t.effect == "NoSchedule")
}

#[tokio::test]
async fn device_plugin_faults_health_and_probe_pods() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("plugin-health").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let nodes: Api<Node> = Api::all(client.clone());
    let all_nodes = |f: fn(&Node) -> bool| {
        let nodes = nodes.clone();
        async move {
            wait_for_all(&nodes, watcher::Config::default(), TIMEOUT, |ns| {
                ns.len() == NODES && ns.iter().all(|n| f(n))
            })
            .await
        }
    };

    let good = "registry.example/sim-device-plugin:v2.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("plugin", "device-plugin", good),
    )
    .await?;
    wait_agents_ready(&pods, "plugin", good).await?;
    all_nodes(|n| allocatable(n, "example.com/gpu") == Some(GPUS)).await?;

    // A probe on a healthy node succeeds, its log says so through the API.
    pods.create(
        &PostParams::default(),
        &workload_pod("probe-ok", Some("sim-gpu-0"), "Never", Some(1), None),
    )
    .await?;
    let done = wait_pod(&pods, "probe-ok", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    assert_eq!(terminated(&done).map(|t| t.exit_code), Some(0));
    assert_eq!(
        resource_health(&done),
        [("example.com/gpu".into(), "gpu-0".into(), "Healthy".into())]
    );
    let log = pods.logs("probe-ok", &Default::default()).await?;
    assert!(log.contains("Test PASSED"), "{log}");

    // A long-running workload reports its device's health.
    pods.create(
        &PostParams::default(),
        &workload_pod("trainer", Some("sim-gpu-1"), "Always", Some(2), None),
    )
    .await?;
    let running = wait_pod(&pods, "trainer", |p| phase(p) == "Running" && pod_ready(p)).await?;
    assert_eq!(
        resource_health(&running),
        [
            ("example.com/gpu".into(), "gpu-0".into(), "Healthy".into()),
            ("example.com/gpu".into(), "gpu-1".into(), "Healthy".into())
        ]
    );

    // -unhealthy: the devices read Unhealthy, capacity stays, allocatable goes.
    set_image(
        &dss,
        "plugin",
        "registry.example/sim-device-plugin:v2.1.0-unhealthy",
    )
    .await?;
    wait_pod(&pods, "trainer", |p| {
        let h = resource_health(p);
        !h.is_empty() && h.iter().all(|(_, _, health)| health == "Unhealthy")
    })
    .await?;
    all_nodes(|n| {
        allocatable(n, "example.com/gpu") == Some(0) && capacity(n, "example.com/gpu") == Some(GPUS)
    })
    .await?;
    // ... so the real scheduler has nothing to give a probe.
    pods.create(
        &PostParams::default(),
        &workload_pod("probe-none", Some("sim-gpu-0"), "Never", Some(1), None),
    )
    .await?;
    wait_scheduling_failure(
        &client,
        &ns.name,
        "probe-none",
        "Insufficient example.com/gpu",
    )
    .await?;
    pods.delete("probe-none", &Default::default()).await?;

    // -broken: nothing to schedule on either (capacity 0 tells this state
    // from the -unhealthy one, whose allocatable was 0 too).
    let broken = "registry.example/sim-device-plugin:v2.1.1-broken";
    set_image(&dss, "plugin", broken).await?;
    wait_agents_ready(&pods, "plugin", broken).await?;
    all_nodes(|n| {
        allocatable(n, "example.com/gpu") == Some(0) && capacity(n, "example.com/gpu") == Some(0)
    })
    .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("probe-broken", None, "Never", Some(1), None),
    )
    .await?;
    wait_scheduling_failure(
        &client,
        &ns.name,
        "probe-broken",
        "Insufficient example.com/gpu",
    )
    .await?;
    pods.delete("probe-broken", &Default::default()).await?;

    // -fewer: half the devices.
    set_image(
        &dss,
        "plugin",
        "registry.example/sim-device-plugin:v2.2.0-fewer",
    )
    .await?;
    all_nodes(|n| allocatable(n, "example.com/gpu") == Some(GPUS / 2)).await?;

    // A laundering plugin on a node with faulty hardware: allocatable looks
    // complete, but a probe that lands on a faulty GPU fails.
    let _faulty = NodeLabel::set(
        "sim-gpu-3",
        FAULTY_LABEL,
        "gpu-0_gpu-1_gpu-2_gpu-3_gpu-4_gpu-5_gpu-6_gpu-7",
    )?;
    set_image(
        &dss,
        "plugin",
        "registry.example/sim-device-plugin:v2.3.0-cleartaints",
    )
    .await?;
    all_nodes(|n| allocatable(n, "example.com/gpu") == Some(GPUS)).await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("probe-bad", Some("sim-gpu-3"), "Never", Some(1), None),
    )
    .await?;
    let failed = wait_pod(&pods, "probe-bad", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&failed), "Failed", "{:#?}", failed.status);
    let t = terminated(&failed).expect("terminated");
    assert_eq!(t.exit_code, 1);
    assert!(
        t.message
            .as_deref()
            .unwrap_or("")
            .contains("hardware fault"),
        "{t:?}"
    );
    let log = pods.logs("probe-bad", &Default::default()).await?;
    assert!(log.contains("Test FAILED"), "{log}");
    // A healthy plugin reports the faulty devices Unhealthy and does not count them.
    set_image(&dss, "plugin", "registry.example/sim-device-plugin:v2.4.0").await?;
    wait_for_object(&nodes, "sim-gpu-3", TIMEOUT, |n| {
        n.is_some_and(|n| allocatable(n, "example.com/gpu") == Some(0))
    })
    .await?;

    // The agent goes away: Unknown for the handover window, then Unhealthy.
    dss.delete("plugin", &Default::default()).await?;
    wait_pod(&pods, "trainer", |p| {
        resource_health(p).iter().all(|(_, _, h)| h == "Unknown")
    })
    .await?;
    wait_pod(&pods, "trainer", |p| {
        resource_health(p).iter().all(|(_, _, h)| h == "Unhealthy")
    })
    .await?;
    assert_eq!(
        phase(&pods.get("trainer").await?),
        "Running",
        "health does not kill a pod"
    );
    Ok(())
}

#[tokio::test]
async fn dra_driver_taints_partitions_and_device_taint_rules() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("dra-taints").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let every_pool = |check: fn(&str, &[&ResourceSliceDevice]) -> bool| {
        let slices = slices.clone();
        async move {
            wait_for_all(&slices, watcher::Config::default(), TIMEOUT, |ss| {
                node_names().iter().all(|n| pool_is(ss, n, |d| check(n, d)))
            })
            .await
        }
    };
    let _faulty = NodeLabel::set("sim-gpu-1", FAULTY_LABEL, "gpu-3_gpu-5")?;

    // Partitionable devices: counters in their own slice, every device with
    // memory capacity; the healthy driver taints the faulty GPUs' devices.
    let good = "registry.example/sim-dra-driver:v1.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset_annotated(
            "driver",
            "dra-driver",
            good,
            json!({"sim.saferollout.dev/partitions": "2"}),
        ),
    )
    .await?;
    wait_agents_ready(&pods, "driver", good).await?;
    let seen = every_pool(|node, devices| {
        devices.len() == (GPUS * 3) as usize
            && devices.iter().all(|d| {
                tainted(d)
                    == (node == "sim-gpu-1"
                        && (d.name.starts_with("gpu-3") || d.name.starts_with("gpu-5")))
            })
    })
    .await?;
    let pool = pool_slices(&seen, "sim-gpu-0");
    assert_eq!(pool.len(), 2, "one device slice and one counter slice");
    let counters = pool
        .iter()
        .find_map(|s| s.spec.shared_counters.as_ref())
        .expect("a counter slice");
    assert_eq!(counters.len(), GPUS as usize);
    assert_eq!(counters[0].counters["memory"].value.0, "80Gi");
    let devices = slice_devices(&seen, "sim-gpu-0");
    let part = devices
        .iter()
        .find(|d| d.name == "gpu-0-part-1")
        .expect("a partition");
    assert_eq!(part.capacity.as_ref().unwrap()["memory"].value.0, "40Gi");
    let consumed = &part.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(
        (
            consumed.counter_set.as_str(),
            consumed.counters["memory"].value.0.as_str()
        ),
        ("gpu-0", "40Gi")
    );

    // The real scheduler allocates a partition.
    claims
        .create(
            &PostParams::default(),
            &gpu_claim(
                "half-gpu",
                Some(&format!("has(device.attributes[\"{DRIVER}\"].partition)")),
            ),
        )
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("half", Some("sim-gpu-2"), "Always", None, Some("half-gpu")),
    )
    .await?;
    let allocated = wait_for_object(&claims, "half-gpu", TIMEOUT, |c| {
        c.and_then(|c| c.status.as_ref()?.allocation.as_ref())
            .is_some()
    })
    .await?
    .unwrap();
    let result = &allocated
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0];
    assert!(result.device.contains("-part-"), "{result:?}");
    assert_eq!(result.pool, "sim-gpu-2");

    // -overcount shows in counters and capacity, not only in device counts.
    set_image(
        &dss,
        "driver",
        "registry.example/sim-dra-driver:v1.1.0-overcount",
    )
    .await?;
    let seen = every_pool(|_, devices| devices.len() == (GPUS * 2 * 3) as usize).await?;
    let pool = pool_slices(&seen, "sim-gpu-0");
    assert_eq!(
        pool.len(),
        3,
        "16 counter sets need two counter slices: {pool:#?}"
    );
    let whole = slice_devices(&seen, "sim-gpu-0")
        .into_iter()
        .find(|d| d.name == "gpu-0")
        .unwrap();
    assert_eq!(whole.capacity.as_ref().unwrap()["memory"].value.0, "160Gi");

    // -cleartaints: no taint, not even on the faulty GPUs; -taint: taints all.
    set_image(
        &dss,
        "driver",
        "registry.example/sim-dra-driver:v1.2.0-cleartaints",
    )
    .await?;
    every_pool(|_, devices| {
        devices.len() == (GPUS * 3) as usize && devices.iter().all(|d| !tainted(d))
    })
    .await?;
    set_image(
        &dss,
        "driver",
        "registry.example/sim-dra-driver:v1.3.0-taint",
    )
    .await?;
    every_pool(|_, devices| {
        devices.len() == (GPUS * 3) as usize && devices.iter().all(|d| tainted(d))
    })
    .await?;
    // Nothing untainted is left: a new claim is not allocated.
    claims
        .create(&PostParams::default(), &gpu_claim("blocked", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("blocked", None, "Never", None, Some("blocked")),
    )
    .await?;
    wait_scheduling_failure(&client, &ns.name, "blocked", "cannot allocate all claims").await?;
    pods.delete("blocked", &Default::default()).await?;

    // -fewer: half the GPUs.
    set_image(
        &dss,
        "driver",
        "registry.example/sim-dra-driver:v1.4.0-fewer",
    )
    .await?;
    every_pool(|_, devices| devices.len() == (GPUS / 2 * 3) as usize).await?;
    pods.delete("half", &Default::default()).await?;
    dss.delete("driver", &Default::default()).await?;
    Ok(())
}

/// Deletes a cluster-scoped object when dropped (also when a test fails
/// half-way), so it cannot leak into the other tests.
struct DeleteOnDrop {
    kubeconfig: std::path::PathBuf,
    kind: String,
    name: String,
}

impl DeleteOnDrop {
    fn new(kind: &str, name: &str) -> Self {
        Self {
            kubeconfig: cluster().kubeconfig().to_path_buf(),
            kind: kind.into(),
            name: name.into(),
        }
    }
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let _ = saferollout_testkit::kubectl(
            &self.kubeconfig,
            &[
                "delete",
                &self.kind,
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
        );
    }
}

/// Waits until the device-taint eviction controller has reported on the
/// rule's current generation (condition `EvictionInProgress`).
async fn wait_rule_seen(
    rules: &Api<k8s_openapi::api::resource::v1::DeviceTaintRule>,
    name: &str,
) -> anyhow::Result<()> {
    wait_for_object(rules, name, TIMEOUT, |rule| {
        rule.is_some_and(|rule| {
            rule.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "EvictionInProgress"
                        && c.observed_generation == rule.metadata.generation
                })
        })
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn device_taint_rule_makes_the_scheduler_refuse_a_nodes_devices() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("dra-rule").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    // Discovery: DeviceTaintRule is served GA.
    let resources = c.kubectl(&["api-resources", "--api-group=resource.k8s.io", "-o", "wide"])?;
    let rule_line = resources
        .lines()
        .find(|l| l.starts_with("devicetaintrules "))
        .unwrap_or_else(|| panic!("devicetaintrules not served: {resources}"));
    assert!(rule_line.contains("resource.k8s.io/v1 "), "{rule_line}");

    let good = "registry.example/sim-dra-driver:v2.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("driver", "dra-driver", good),
    )
    .await?;
    wait_agents_ready(&pods, "driver", good).await?;
    wait_for_all(&slices, watcher::Config::default(), TIMEOUT, |ss| {
        node_names()
            .iter()
            .all(|n| pool_is(ss, n, |d| d.len() == GPUS as usize))
    })
    .await?;

    let rule_name = format!("{}-quarantine", ns.name);
    let rules: Api<k8s_openapi::api::resource::v1::DeviceTaintRule> = Api::all(client.clone());
    rules
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": rule_name},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": "sim-gpu-0"},
                    "taint": {"key": "saferollout.dev/quarantine", "value": "test", "effect": "NoSchedule"}
                }
            }))?,
        )
        .await?;
    let _rule_cleanup = DeleteOnDrop::new("devicetaintrule", &rule_name);
    // The rule reaches the scheduler through its informer, with nothing to
    // show when: wait for the controller manager's condition on it (the
    // cluster's own sign that the rule is seen) before asking for a device.
    wait_rule_seen(&rules, &rule_name).await?;
    // The node's devices are refused ...
    claims
        .create(&PostParams::default(), &gpu_claim("on-quarantined", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod(
            "on-quarantined",
            Some("sim-gpu-0"),
            "Never",
            None,
            Some("on-quarantined"),
        ),
    )
    .await?;
    let message = wait_scheduling_failure(
        &client,
        &ns.name,
        "on-quarantined",
        "cannot allocate all claims",
    )
    .await?;
    // ... while another node still allocates, and the probe there succeeds.
    claims
        .create(&PostParams::default(), &gpu_claim("elsewhere", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod(
            "elsewhere",
            Some("sim-gpu-2"),
            "Never",
            None,
            Some("elsewhere"),
        ),
    )
    .await?;
    let done = wait_pod(&pods, "elsewhere", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    let health = resource_health(&done);
    assert_eq!(health.len(), 1, "{health:?}");
    assert_eq!(health[0].0, "claim:gpu");
    assert!(
        health[0].1.starts_with(&format!("{DRIVER}/sim-gpu-2/gpu-")),
        "{health:?}"
    );
    assert!(
        pods.get("on-quarantined")
            .await?
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "scheduled despite the rule: {message}"
    );

    // Without the rule the first pod is placed and runs.
    rules.delete(&rule_name, &Default::default()).await?;
    let done = wait_pod(&pods, "on-quarantined", |p| phase(p) == "Succeeded").await?;
    assert_eq!(done.spec.unwrap().node_name.as_deref(), Some("sim-gpu-0"));

    // NoExecute: the real eviction controller removes a running pod that
    // uses the node's devices, and the fixture does not bring it back.
    claims
        .create(&PostParams::default(), &gpu_claim("long", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("long", Some("sim-gpu-3"), "Always", None, Some("long")),
    )
    .await?;
    let running = wait_pod(&pods, "long", |p| phase(p) == "Running").await?;
    let uid = running.metadata.uid.clone();
    let evict_name = format!("{}-evict", ns.name);
    rules
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": evict_name},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": "sim-gpu-3"},
                    "taint": {"key": "saferollout.dev/quarantine", "effect": "NoExecute"}
                }
            }))?,
        )
        .await?;
    let _evict_cleanup = DeleteOnDrop::new("devicetaintrule", &evict_name);
    wait_for_object(&pods, "long", TIMEOUT, |p| {
        p.is_none_or(|p| p.metadata.uid != uid)
    })
    .await?;
    rules.delete(&evict_name, &Default::default()).await?;
    dss.delete("driver", &Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn dra_health_dropped_claims_and_probe_pods() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("dra-health").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    let good = "registry.example/sim-dra-driver:v3.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("driver", "dra-driver", good),
    )
    .await?;
    wait_agents_ready(&pods, "driver", good).await?;

    // A long-running pod with an allocated claim: Healthy in its status.
    claims
        .create(&PostParams::default(), &gpu_claim("trainer", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod(
            "trainer",
            Some("sim-gpu-1"),
            "Always",
            None,
            Some("trainer"),
        ),
    )
    .await?;
    let running = wait_pod(&pods, "trainer", |p| {
        phase(p) == "Running" && resource_health(p).iter().any(|(_, _, h)| h == "Healthy")
    })
    .await?;
    let (_, device_id, _) = resource_health(&running).remove(0);
    let device = device_id.rsplit('/').next().unwrap().to_owned();

    // A probe whose claim comes from a template (as a probe gate would
    // make it): the claim controller creates the claim, the real scheduler
    // allocates it, the probe succeeds and reports the device.
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), &ns.name);
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
                ]}}}
            }))?,
        )
        .await?;
    let mut templated = workload_pod("templated", Some("sim-gpu-2"), "Never", None, None);
    let spec = templated.spec.as_mut().unwrap();
    spec.resource_claims = Some(vec![serde_json::from_value(
        json!({"name": "gpu", "resourceClaimTemplateName": "one-gpu"}),
    )?]);
    spec.containers[0].resources = Some(serde_json::from_value(
        json!({"claims": [{"name": "gpu"}]}),
    )?);
    pods.create(&PostParams::default(), &templated).await?;
    let done = wait_pod(&pods, "templated", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    let health = resource_health(&done);
    assert_eq!(health.len(), 1, "{health:?}");
    assert_eq!(health[0].0, "claim:gpu");
    assert!(
        health[0].1.starts_with(&format!("{DRIVER}/sim-gpu-2/gpu-")),
        "{health:?}"
    );
    assert_eq!(health[0].2, "Healthy");

    // -unhealthy: Unhealthy in the status; a probe there fails.
    set_image(
        &dss,
        "driver",
        "registry.example/sim-dra-driver:v3.1.0-unhealthy",
    )
    .await?;
    let unhealthy = wait_pod(&pods, "trainer", |p| {
        resource_health(p).iter().all(|(_, _, h)| h == "Unhealthy")
    })
    .await?;
    // The driver's word on it comes through (ResourceHealthStatusMessage).
    let message = unhealthy
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .flat_map(|c| c.allocated_resources_status.iter().flatten())
        .flat_map(|r| r.resources.iter().flatten())
        .find_map(|h| h.message.clone());
    assert_eq!(
        message.as_deref(),
        Some("XID 79: GPU has fallen off the bus")
    );
    claims
        .create(&PostParams::default(), &gpu_claim("probe", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("probe", Some("sim-gpu-1"), "Never", None, Some("probe")),
    )
    .await?;
    let failed = wait_pod(&pods, "probe", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await?;
    assert_eq!(phase(&failed), "Failed", "{:#?}", failed.status);
    let t = terminated(&failed).unwrap();
    assert_eq!(t.exit_code, 1);
    assert!(
        t.message.as_deref().unwrap_or("").contains("is Unhealthy"),
        "{t:?}"
    );

    // -dropclaims: the allocated device leaves the slice, the pod fails.
    // (Watched from before the change: once the pod has failed, the claim
    // controller releases the claim and the device comes back.)
    let (changed, gone, failed) = tokio::join!(
        set_image(
            &dss,
            "driver",
            "registry.example/sim-dra-driver:v3.2.0-dropclaims"
        ),
        wait_for_all(&slices, watcher::Config::default(), TIMEOUT, |ss| {
            pool_is(ss, "sim-gpu-1", |d| {
                !d.is_empty() && d.iter().all(|d| d.name != device)
            })
        }),
        wait_pod(&pods, "trainer", |p| phase(p) == "Failed"),
    );
    changed?;
    gone?;
    let failed = failed?;
    let message = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("NodePrepareResources failed for ResourceClaim trainer"),
        "{message}"
    );
    assert_ne!(terminated(&failed).map(|t| t.exit_code), Some(0));

    dss.delete("driver", &Default::default()).await?;
    Ok(())
}

/// The cluster's state directory (where `up` keeps `ports` and `pids`):
/// beside its kubeconfig.
fn state_file(name: &str) -> std::path::PathBuf {
    cluster()
        .kubeconfig()
        .parent()
        .expect("state dir")
        .join(name)
}

fn state_numbers(name: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let text = std::fs::read_to_string(state_file(name))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect())
}

/// TCP peers (remote address, first octet) of the sockets the given
/// processes hold, from /proc.
fn tcp_peers_of(pids: &[u64]) -> anyhow::Result<Vec<String>> {
    let mut inodes = std::collections::BTreeSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let mut peers = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || !inodes.contains(cols[9]) {
                continue;
            }
            let remote = cols[2].split(':').next().unwrap_or("");
            // IPv4 (8 hex digits) or v4-mapped IPv6: little-endian words, so
            // the first octet is the word's last byte.
            let v4 = match remote.len() {
                8 => Some(remote),
                32 if &remote[16..24] == "FFFF0000" => Some(&remote[24..32]),
                _ => None,
            };
            if let Some(v4) = v4 {
                let octets: Vec<u8> = (0..4)
                    .rev()
                    .map(|i| u8::from_str_radix(&v4[i * 2..i * 2 + 2], 16).unwrap_or(0))
                    .collect();
                peers.push(format!(
                    "{}.{}.{}.{}",
                    octets[0], octets[1], octets[2], octets[3]
                ));
            }
        }
    }
    Ok(peers)
}

#[tokio::test]
async fn agent_logs_come_through_the_api_server_from_loopback_only() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("agent-logs").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // Nodes advertise a loopback address and KWOK's kubelet port.
    let kubelet_port = state_numbers("ports")?
        .into_iter()
        .find(|(k, _)| k == "kwok-kubelet")
        .map(|(_, v)| v)
        .expect("kwok-kubelet port");
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes.list(&ListParams::default()).await? {
        let status = node.status.unwrap();
        let addresses: Vec<_> = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .collect();
        assert_eq!(addresses, ["127.0.0.1"]);
        let port = status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port;
        assert_eq!(u64::try_from(port)?, kubelet_port);
    }

    let logs_of = |pod: &Pod| {
        let pods = pods.clone();
        let name = pod.metadata.name.clone().unwrap();
        async move {
            pods.logs(
                &name,
                &kube::api::LogParams {
                    container: Some("agent".into()),
                    ..Default::default()
                },
            )
            .await
        }
    };
    let agent_pods = |image: &str| {
        let pods = pods.clone();
        let image = image.to_owned();
        async move {
            wait_for_all(
                &pods,
                watcher::Config::default().labels("app=plugin"),
                TIMEOUT,
                |ps| {
                    ps.len() == NODES
                        && ps.iter().all(|p| {
                            pod_image(p) == image
                                && p.status
                                    .as_ref()
                                    .and_then(|s| s.start_time.as_ref())
                                    .is_some()
                        })
                },
            )
            .await
        }
    };

    // -fatallog: Ready and advertising, yet the fatal line is in the log,
    // next to a secret-looking value.
    let fatal = "registry.example/sim-device-plugin:v4.0.0-fatallog";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("plugin", "device-plugin", fatal),
    )
    .await?;
    wait_agents_ready(&pods, "plugin", fatal).await?;
    let running = agent_pods(fatal).await?;
    // KWOK serves a pod's log once the fixture has written its file and
    // Logs object: poll with a deadline (the API gives no watch for logs).
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let log = loop {
        match logs_of(&running[0]).await {
            Ok(log) if !log.is_empty() => break log,
            other => {
                assert!(tokio::time::Instant::now() < deadline, "no log: {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        log.contains("Failed to initialize NVML: could not load NVML library"),
        "{log}"
    );
    assert!(log.contains("token=simtok-"), "{log}");
    assert!(log.contains("advertising 8 device(s)"), "{log}");

    // -broken and -crashloop agents log their last words.
    for (image, needle) in [
        (
            "registry.example/sim-device-plugin:v4.1.0-broken",
            "Failed to initialize NVML",
        ),
        (
            "registry.example/sim-device-plugin:v4.2.0-crashloop",
            "unknown service v1beta1.Registration",
        ),
        (
            "registry.example/sim-device-plugin:v4.3.0",
            "Registered device plugin",
        ),
    ] {
        set_image(&dss, "plugin", image).await?;
        let running = agent_pods(image).await?;
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let log = logs_of(&running[0]).await.unwrap_or_default();
            if log.contains(needle) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{image}: no {needle:?} in {log:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let healthy =
        logs_of(&agent_pods("registry.example/sim-device-plugin:v4.3.0").await?[0]).await?;
    assert!(!healthy.contains("NVML"), "{healthy}");

    // No process of the cluster holds a connection to 10.0.0.0/8.
    let pids: Vec<u64> = state_numbers("pids")?.into_iter().map(|(_, p)| p).collect();
    let peers = tcp_peers_of(&pids)?;
    assert!(
        !peers.is_empty(),
        "the cluster's processes hold TCP connections"
    );
    let ten: Vec<&String> = peers.iter().filter(|p| p.starts_with("10.")).collect();
    assert!(ten.is_empty(), "connections to 10.x: {ten:?}");
    assert!(
        peers
            .iter()
            .all(|p| p.starts_with("127.") || p == "0.0.0.0"),
        "{peers:?}"
    );
    dss.delete("plugin", &Default::default()).await?;
    Ok(())
}

/// One sample of `metric` for a node's GPU, from the metrics text.
fn gpu_metric(text: &str, metric: &str, node: &str, gpu: u64) -> Option<f64> {
    let want = [format!("gpu=\"{gpu}\""), format!("Hostname=\"{node}\"")];
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| want.iter().all(|w| l.contains(w.as_str())))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn scrape_until(
    port: u64,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let url = format!("http://127.0.0.1:{port}/metrics");
    loop {
        let out = std::process::Command::new("curl")
            .args(["-fsS", &url])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && done(&text) {
            return Ok(text);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last scrape:\n{text}"
        );
        // Polling with a deadline: an HTTP endpoint offers nothing to watch.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn gpu_metrics_go_bad_with_the_agent() -> anyhow::Result<()> {
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("gpu-metrics").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let port = state_numbers("ports")?
        .into_iter()
        .find(|(k, _)| k == "sim-metrics")
        .map(|(_, v)| v)
        .expect("sim-metrics port");
    let _faulty = NodeLabel::set("sim-gpu-2", FAULTY_LABEL, "gpu-6")?;
    let all = |text: &str, metric: &str, value: f64| {
        node_names().iter().all(|n| {
            (0..GPUS as u64).all(|g| {
                n == "sim-gpu-2" && g == 6 || gpu_metric(text, metric, n, g) == Some(value)
            })
        })
    };

    let good = "registry.example/sim-device-plugin:v5.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset("plugin", "device-plugin", good),
    )
    .await?;
    wait_agents_ready(&pods, "plugin", good).await?;
    let text = scrape_until(port, "every GPU healthy", |t| {
        all(t, "saferollout_sim_gpu_healthy", 1.0)
    })
    .await?;
    assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"), "{text}");
    assert_eq!(
        gpu_metric(&text, "saferollout_sim_gpu_healthy", "sim-gpu-2", 6),
        Some(0.0)
    );
    assert_eq!(
        gpu_metric(&text, "DCGM_FI_DEV_XID_ERRORS", "sim-gpu-2", 6),
        Some(79.0)
    );
    assert_eq!(
        gpu_metric(&text, "DCGM_FI_DEV_XID_ERRORS", "sim-gpu-2", 5),
        Some(0.0)
    );
    assert!(
        text.contains(r#"UUID="GPU-"#) && text.contains(r#"node="sim-gpu-0""#),
        "{text}"
    );

    // A workload holding a GPU shows as utilisation.
    pods.create(
        &PostParams::default(),
        &workload_pod("busy", Some("sim-gpu-0"), "Always", Some(1), None),
    )
    .await?;
    wait_pod(&pods, "busy", |p| phase(p) == "Running").await?;
    scrape_until(port, "GPU 0 of sim-gpu-0 busy", |t| {
        gpu_metric(t, "DCGM_FI_DEV_GPU_UTIL", "sim-gpu-0", 0) == Some(100.0)
            && gpu_metric(t, "DCGM_FI_DEV_GPU_UTIL", "sim-gpu-0", 1) == Some(0.0)
    })
    .await?;

    // A broken release: every GPU goes bad.
    set_image(
        &dss,
        "plugin",
        "registry.example/sim-device-plugin:v5.1.0-broken",
    )
    .await?;
    scrape_until(port, "every GPU unhealthy", |t| {
        all(t, "saferollout_sim_gpu_healthy", 0.0)
    })
    .await?;
    // -unhealthy also raises the XID.
    set_image(
        &dss,
        "plugin",
        "registry.example/sim-device-plugin:v5.2.0-unhealthy",
    )
    .await?;
    scrape_until(port, "XID 79 everywhere", |t| {
        all(t, "DCGM_FI_DEV_XID_ERRORS", 79.0)
    })
    .await?;
    dss.delete("plugin", &Default::default()).await?;
    Ok(())
}

/// What a watch of one pool's first slice has seen.
#[derive(Clone, Debug, Default)]
struct PoolSeen {
    /// The slice was deleted at some point.
    deleted: bool,
    /// Every object UID the slice had (a re-creation shows as a second).
    uids: std::collections::BTreeSet<String>,
    /// Publisher pod UID and generation, each change in order.
    publishers: Vec<(String, i64)>,
    /// What the slice holds now: publisher, generation, device names.
    current: Option<(String, i64, Vec<String>)>,
}

/// Watches the node's pool (its first slice) from now on, in a task.
fn watch_pool(
    slices: Api<ResourceSlice>,
    node: &str,
) -> (
    tokio::sync::watch::Receiver<PoolSeen>,
    tokio::task::JoinHandle<()>,
) {
    use futures::TryStreamExt;
    let name = format!("{node}-{}", DRIVER.replace('.', "-"));
    let (tx, rx) = tokio::sync::watch::channel(PoolSeen::default());
    let config = watcher::Config::default().labels(&format!("sim.saferollout.dev/node={node}"));
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(slices, config));
        while let Ok(Some(event)) = stream.try_next().await {
            let (slice, deleted) = match event {
                watcher::Event::Apply(s) | watcher::Event::InitApply(s) => (s, false),
                watcher::Event::Delete(s) => (s, true),
                watcher::Event::Init | watcher::Event::InitDone => continue,
            };
            if slice.metadata.name.as_deref() != Some(name.as_str()) {
                continue;
            }
            tx.send_modify(|seen| {
                if deleted {
                    seen.deleted = true;
                    seen.current = None;
                    return;
                }
                seen.uids.extend(slice.metadata.uid.clone());
                let publisher = slice
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("sim.saferollout.dev/publisher-pod-uid"))
                    .cloned()
                    .unwrap_or_default();
                let generation = slice.spec.pool.generation;
                if seen.publishers.last() != Some(&(publisher.clone(), generation)) {
                    seen.publishers.push((publisher.clone(), generation));
                }
                let devices = slice
                    .spec
                    .devices
                    .iter()
                    .flatten()
                    .map(|d| d.name.clone())
                    .collect();
                seen.current = Some((publisher, generation, devices));
            });
        }
    });
    (rx, task)
}

async fn wait_pool(
    rx: &mut tokio::sync::watch::Receiver<PoolSeen>,
    what: &str,
    done: impl Fn(&PoolSeen) -> bool,
) -> anyhow::Result<PoolSeen> {
    let waited = tokio::time::timeout(TIMEOUT, rx.wait_for(|seen| done(seen)))
        .await
        .map(|seen| seen.map(|s| s.clone()));
    match waited {
        Ok(seen) => Ok(seen?),
        Err(_) => anyhow::bail!("timed out waiting for {what}: {:?}", *rx.borrow()),
    }
}

fn pod_uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn on_node(p: &Pod, node: &str) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Two instances of one DRA driver on a node (Kubernetes 1.33+ rolling
/// update: both annotated `sim.saferollout.dev/rolling-update`), from two
/// DaemonSets: a newer instance that does not register (crash-looping)
/// leaves the older serving; a healthy one serves once Ready, the older is
/// its fallback, and the pool's slice is never deleted; a claim allocated
/// before stays usable.
#[tokio::test]
async fn dra_driver_second_instance_takes_over_and_hands_back_without_a_slice_gap()
-> anyhow::Result<()> {
    use kube::ResourceExt;
    let _serial = NODE_AGENTS.lock().await;
    let c = cluster();
    let ns = c.namespace("dra-two").await?;
    let client = c.client().await?;
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let node = "sim-gpu-3";
    let rolling = json!({"sim.saferollout.dev/rolling-update": "true"});

    let old_image = "registry.example/sim-dra-driver:v4.0.0";
    dss.create(
        &PostParams::default(),
        &agent_daemonset_annotated("driver-old", "dra-driver", old_image, rolling.clone()),
    )
    .await?;
    wait_agents_ready(&pods, "driver-old", old_image).await?;
    let old = pods
        .list(&ListParams::default().labels("app=driver-old"))
        .await?
        .items
        .into_iter()
        .find(|p| on_node(p, node))
        .expect("old driver pod on the node");
    let old_uid = pod_uid(&old);

    let (mut seen, watch) = watch_pool(slices, node);
    let before = wait_pool(&mut seen, "the old pod's publication", |s| {
        s.current.as_ref().is_some_and(|(p, _, _)| *p == old_uid)
    })
    .await?;
    let (_, old_generation, devices) = before.current.clone().unwrap();
    assert_eq!(devices.len(), GPUS as usize);

    // A long-running pod with a claim allocated in the pool before the handover.
    claims
        .create(&PostParams::default(), &gpu_claim("trainer", None))
        .await?;
    pods.create(
        &PostParams::default(),
        &workload_pod("trainer", Some(node), "Always", None, Some("trainer")),
    )
    .await?;
    let healthy = |p: &Pod| {
        phase(p) == "Running"
            && !resource_health(p).is_empty()
            && resource_health(p).iter().all(|(_, _, h)| h == "Healthy")
    };
    let trainer = wait_pod(&pods, "trainer", healthy).await?;
    let trainer_devices = resource_health(&trainer);

    // The second DaemonSet (the canary) runs only on the labelled node. A
    // crash-looping instance never registers: the old one goes on serving
    // (its slice outlives the status delay: the new container restarted).
    let canary_key = "sim.saferollout.dev/test-second-driver";
    let _label = NodeLabel::set(node, canary_key, "true")?;
    let crashing = "registry.example/sim-dra-driver:v4.1.0-crashloop";
    let mut second =
        agent_daemonset_annotated("driver-new", "dra-driver", crashing, rolling.clone());
    second.spec.template.spec.as_mut().unwrap().node_selector =
        Some(BTreeMap::from([(canary_key.to_owned(), "true".to_owned())]));
    dss.create(&PostParams::default(), &second).await?;
    let restarted = |p: &Pod| {
        p.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .any(|c| c.restart_count >= 1)
    };
    wait_for_all(
        &pods,
        watcher::Config::default().labels("app=driver-new"),
        TIMEOUT,
        |ps| ps.iter().any(|p| on_node(p, node) && restarted(p)),
    )
    .await?;
    let meanwhile = seen.borrow().clone();
    assert!(!meanwhile.deleted, "{meanwhile:?}");
    assert_eq!(
        meanwhile.current.as_ref().map(|(p, g, _)| (p.as_str(), *g)),
        Some((old_uid.as_str(), old_generation)),
        "{meanwhile:?}"
    );

    // A healthy release of the canary: its pod serves once Ready.
    let new_image = "registry.example/sim-dra-driver:v4.1.1";
    set_image(&dss, "driver-new", new_image).await?;
    let new = wait_for_all(
        &pods,
        watcher::Config::default().labels("app=driver-new"),
        TIMEOUT,
        |ps| {
            ps.iter()
                .any(|p| on_node(p, node) && pod_ready(p) && pod_image(p) == new_image)
        },
    )
    .await?
    .into_iter()
    .find(|p| on_node(p, node) && pod_ready(p) && pod_image(p) == new_image)
    .expect("new driver pod");
    let new_uid = pod_uid(&new);

    let taken = wait_pool(&mut seen, "the new pod's publication", |s| {
        s.current.as_ref().is_some_and(|(p, _, _)| *p == new_uid)
    })
    .await?;
    let (_, new_generation, devices) = taken.current.clone().unwrap();
    assert!(new_generation > old_generation, "{taken:?}");
    assert_eq!(devices.len(), GPUS as usize, "same devices: {taken:?}");
    // The old pod still runs beside it.
    assert!(pod_ready(&pods.get(&old.name_any()).await?));

    // The new pod goes (its DaemonSet first, orphaning it, so no
    // replacement comes): the old one publishes again.
    dss.delete(
        "driver-new",
        &kube::api::DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await?;
    pods.delete(&new.name_any(), &Default::default()).await?;
    let back = wait_pool(&mut seen, "the old pod's publication again", |s| {
        s.current
            .as_ref()
            .is_some_and(|(p, g, _)| *p == old_uid && *g > new_generation)
    })
    .await?;
    watch.abort();

    assert!(!back.deleted, "the pool's slice was deleted: {back:?}");
    assert_eq!(back.uids.len(), 1, "the slice was re-created: {back:?}");
    let mut order: Vec<&str> = back.publishers.iter().map(|(p, _)| p.as_str()).collect();
    order.dedup();
    assert_eq!(
        order,
        [old_uid.as_str(), new_uid.as_str(), old_uid.as_str()],
        "{back:?}"
    );
    // The claim's pod ran through it all, on the same device.
    let trainer = pods.get("trainer").await?;
    assert!(healthy(&trainer), "{:#?}", trainer.status);
    assert_eq!(resource_health(&trainer), trainer_devices);

    pods.delete("trainer", &Default::default()).await?;
    dss.delete("driver-old", &Default::default()).await?;
    Ok(())
}
