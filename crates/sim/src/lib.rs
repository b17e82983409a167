//! `saferollout-sim`: a test fixture that plays accelerator agents (device
//! plugin, DRA driver) on KWOK-simulated nodes of a real kube-apiserver.
//!
//! KWOK simulates the kubelet for every pod except those labelled
//! `sim.saferollout.dev/agent` or `sim.saferollout.dev/workload` (KWOK still
//! completes the deletion of all pods). For agent pods the sim is both their
//! kubelet and the agent they run: it writes their status and, on their
//! node, advertises devices the way a device plugin (through the kubelet
//! device manager) or a DRA driver (through ResourceSlices) would, faulty or
//! not as the image tag asks. For workload pods it is the kubelet of a node
//! with those devices: it runs them, ends probe-style pods as the devices
//! allow and reports device health (see [`model::workload`]).
//!
//! # Conventions
//!
//! - Agent pods carry label `sim.saferollout.dev/agent` = `device-plugin` or
//!   `dra-driver`.
//! - Device-plugin resource name: pod annotation `sim.saferollout.dev/resource`,
//!   default `example.com/gpu`.
//! - DRA driver name: pod annotation `sim.saferollout.dev/driver`, default
//!   `gpu.sim.saferollout.dev`.
//! - Physical device count: node label `sim.saferollout.dev/devices` (integer;
//!   missing/invalid = 0). Devices are `gpu-0` .. `gpu-<n-1>`.
//! - Physically faulty devices: node label `sim.saferollout.dev/faulty-devices`
//!   (`gpu-3_gpu-5` or `3_5`). A healthy agent reports them Unhealthy; a
//!   healthy driver publishes them with the health taint
//!   `gpu.sim.saferollout.dev/unhealthy=xid-79:NoSchedule`; a healthy plugin
//!   leaves them out of allocatable.
//! - Report delay: agent pod annotation `sim.saferollout.dev/report-delay`
//!   (a duration): its devices are reported that much later than the whole
//!   second after its Ready (see below), as a kubelet's 10 s status sync may.
//! - Two instances of one DRA driver on a node (Kubernetes 1.33+ rolling
//!   update, `maxSurge` or a second DaemonSet): driver pods annotated
//!   `sim.saferollout.dev/rolling-update: "true"` register on sockets of
//!   their own and run side by side; the newest registered one serves (once
//!   its first publication is due), the older ones are its fallback, and the
//!   pool's slices stay throughout. Driver pods without the annotation share
//!   the driver's one socket: the newest of them is the driver, registered
//!   or not, and the older ones are no fallback while it runs (as before;
//!   once it goes, the newest left is the driver again).
//! - Partitionable devices: driver pod annotation
//!   `sim.saferollout.dev/partitions: "N"` (N >= 2): a counter set per GPU in
//!   a counter slice, N partitions `gpu-<i>-part-<j>` per GPU (see
//!   [`model::slice`]). Every DRA device has a `memory` capacity.
//! - Fault = suffix of the image TAG of the pod's first container (tag = text
//!   after the last ':' that comes after the last '/'; no tag = healthy):
//!   - `-broken`: Running+Ready but advertises 0 devices / publishes no slices;
//!   - `-overcount`: advertises 2x physical / publishes 2x devices;
//!   - `-crashloop`: container never runs (containerStatuses
//!     state.waiting.reason=CrashLoopBackOff, lastState.terminated exitCode 1
//!     reason Error, restartCount rising every few seconds, pod Ready=False);
//!     advertises nothing;
//!   - `-unready`: container running but never Ready; still advertises
//!     normally so only a readiness gate catches it;
//!   - `-slow`: Ready and advertising only after `--slow-delay` (default 20s),
//!     counted from when the sim first started the pod;
//!   - `-flap`: Ready; advertises the physical count and 0 in turn, switching
//!     every `--flap-period` (default 4s);
//!   - `-fewer`: Ready; advertises / publishes half the devices (rounded down);
//!   - `-taint`: Ready; a driver publishes every device with the health taint
//!     (a plugin is healthy: plugins have no taints);
//!   - `-cleartaints`: Ready; publishes the faulty devices without their taint
//!     and reports them Healthy ("health laundering");
//!   - `-unhealthy`: Ready; reports its devices Unhealthy (a plugin's are then
//!     not allocatable: capacity = count, allocatable = 0);
//!   - `-dropclaims`: Ready; a driver withdraws the devices allocated to
//!     ResourceClaims from its slice and the pods using them fail (a plugin is
//!     healthy);
//!   - `-fatallog`: healthy in every respect but logs a fatal line.
//!   - `-noisyfatal`: as `-fatallog`, but the fatal line comes after more
//!     than 2 MiB of routine lines.
//!
//!   Anything else is healthy (Ready, advertises the physical count).
//!
//! # What the sim writes
//!
//! - Agent pod status (status subresource, strategic merge patch, field manager
//!   `saferollout-sim`), only when it differs from what is there. The fault
//!   applies to the first container; other containers run and are Ready, init
//!   containers have completed (sidecars run). Ready also waits for the pod's
//!   readiness gates, whose conditions the sim never writes. Deleting pods are
//!   left to KWOK.
//! - Node `status.capacity[resource]` / `status.allocatable[resource]`
//!   (strategic merge patch of only those keys, field manager
//!   `saferollout-sim`), with kubelet device-manager semantics: a registered
//!   plugin sets both to its count; once no plugin runs, allocatable drops to
//!   0 after `--status-delay` and the resource disappears after
//!   `--endpoint-stop-grace`. Only nodes where an agent pod runs or where the
//!   managed fields say the sim wrote the resource are touched (the latter
//!   lets a restarted sim retire leftovers). As a kubelet does, every such
//!   write stamps the Ready condition's `lastHeartbeatTime` (merged into the
//!   condition by its type), and a plugin whose pod became Ready is reported
//!   (its devices, or a heartbeat alone when they did not change) in the
//!   whole second after its Ready, its devices held back until then: a
//!   kubelet reports a registration at its next node-status sync, and API
//!   times keep whole seconds, so only a later second tells a gate the
//!   status is the new plugin's. KWOK does not refresh node heartbeats here
//!   (`tests/cluster/kwok-stages.yaml`): a heartbeat stamped on a status the
//!   sim has not brought up to date would claim the old plugin's devices as
//!   fresh, which no kubelet's single status write does.
//! - The ResourceSlices of one pool per node and driver (pool name = node
//!   name): the first named `<node>-<driver with dots replaced by dashes>`,
//!   more devices in `...-<k>`, counter sets in `...-counters-<k>`; labelled
//!   `sim.saferollout.dev/node=<node>`, owned by the Node, and annotated
//!   `sim.saferollout.dev/publisher-pod-uid` with the driver pod whose
//!   publication set the pool generation (so a restarted sim neither resets
//!   nor needlessly bumps it). A `-flap` driver's off phase keeps the slice
//!   with no devices; `-broken` drivers withdraw their slices, and
//!   `-crashloop`, not-yet-ready `-slow` drivers and absent drivers have none
//!   (deleted `--status-delay` after the last registered driver went, as the
//!   kubelet wipes a departed driver's slices). A new driver pod publishes
//!   (or withdraws) in the whole second after its pod became Ready, the old
//!   driver's slices kept until then (the kubelet wipes nothing while a
//!   driver is registered), so its slices are written after its Ready.
//!
//! - Workload pod statuses (same write path as agents), with
//!   `allocatedResourcesStatus`; see [`model::workload`].
//! - With `--pod-logs-dir`: each agent and workload container's log in the CRI
//!   format (`<dir>/<ns>_<pod>_<uid>/<container>.log`) and a KWOK `Logs`
//!   object (`kwok.x-k8s.io/v1alpha1`, named and owned by the pod) pointing at
//!   it, so `pods/log` works through the API server and KWOK's kubelet server.
//! - With `--metrics-addr`: DCGM-style per-GPU metrics at `/metrics` (see
//!   [`model::metrics`]).
//!
//! The pure decision logic lives in [`model`]; the API glue (watchers, caches,
//! writes, the reconcile loop, log files, the metrics endpoint) lives in
//! [`cluster`].

pub mod cli;
pub mod cluster;
pub mod model;

/// Label that marks agent pods; its value says which agent the pod plays.
pub const AGENT_LABEL: &str = "sim.saferollout.dev/agent";
/// [`AGENT_LABEL`] value of device-plugin pods.
pub const AGENT_DEVICE_PLUGIN: &str = "device-plugin";
/// [`AGENT_LABEL`] value of DRA-driver pods.
pub const AGENT_DRA_DRIVER: &str = "dra-driver";
/// Pod annotation naming the extended resource a device plugin advertises.
pub const RESOURCE_ANNOTATION: &str = "sim.saferollout.dev/resource";
/// Extended resource advertised when [`RESOURCE_ANNOTATION`] is absent.
pub const DEFAULT_RESOURCE: &str = "example.com/gpu";
/// Pod annotation naming the DRA driver a driver pod plays.
pub const DRIVER_ANNOTATION: &str = "sim.saferollout.dev/driver";
/// DRA driver used when [`DRIVER_ANNOTATION`] is absent.
pub const DEFAULT_DRIVER: &str = "gpu.sim.saferollout.dev";
/// Node label holding the node's physical device count.
pub const DEVICES_LABEL: &str = "sim.saferollout.dev/devices";
/// Node label naming the node's physically faulty GPUs (`gpu-3_gpu-5`).
pub const FAULTY_LABEL: &str = "sim.saferollout.dev/faulty-devices";
/// Driver pod annotation: partitions per GPU (2 or more makes the devices
/// partitionable, with shared counters).
pub const PARTITIONS_ANNOTATION: &str = "sim.saferollout.dev/partitions";
/// Device-plugin pod annotation: how many units of the resource each device
/// counts for (default 1), as Intel's `gpu.intel.com/millicores` advertises
/// 1000 per GPU. The node then shows e.g. `8k` for 8 devices.
pub const UNITS_ANNOTATION: &str = "sim.saferollout.dev/units-per-device";
/// Agent pod annotation: how much later than usual (the whole second after
/// its pod became Ready) its devices are reported, the node's status written
/// with them or its slices published (a duration, e.g. `3s`). A kubelet syncs
/// the node's status every 10 s (`nodeStatusUpdateFrequency`), so a real
/// plugin's devices may show that long after its Ready; a gate must not
/// judge the node on what it showed meanwhile.
pub const REPORT_DELAY_ANNOTATION: &str = "sim.saferollout.dev/report-delay";
/// Driver pod annotation (`"true"`): the instance registers with the kubelet
/// on a socket of its own (the `kubeletplugin` helper's `RollingUpdate`
/// option), so it can run beside another instance of the same driver on the
/// node (Kubernetes 1.33+): the newer registered instance serves, the older
/// is the fallback. Without it an instance listens on the driver's one
/// shared socket: the newest such pod is the driver and the older ones are
/// no fallback while it runs.
pub const ROLLING_UPDATE_ANNOTATION: &str = "sim.saferollout.dev/rolling-update";
/// Label that marks workload pods the sim plays the kubelet for (any value).
pub const WORKLOAD_LABEL: &str = "sim.saferollout.dev/workload";
/// Label on every ResourceSlice the sim publishes: the node it describes.
pub const SLICE_NODE_LABEL: &str = "sim.saferollout.dev/node";
/// Annotation on published ResourceSlices: UID of the driver pod that
/// published the current pool generation, so a restarted sim knows whether a
/// driver pod it finds is the same one or a replacement (which bumps the
/// generation).
pub const SLICE_PUBLISHER_ANNOTATION: &str = "sim.saferollout.dev/publisher-pod-uid";
/// Field manager of every write the sim makes.
pub const FIELD_MANAGER: &str = "saferollout-sim";
