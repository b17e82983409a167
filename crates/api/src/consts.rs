//! Every well-known name of the API in one place: group, version, kind, labels,
//! annotations, condition types, the field manager and finalizer. A gate's
//! name is defined next to its type (`PodsReadyGate::NAME`, ...; the
//! `GATE_*` constants at the crate root are the same names).

/// API group of the SafeRollout resource.
pub const GROUP: &str = "saferollout.dev";
/// Served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of a SafeRollout manifest.
pub const API_VERSION: &str = "saferollout.dev/v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "SafeRollout";
/// Plural resource name (the URL segment).
pub const PLURAL: &str = "saferollouts";
/// Short name for kubectl (`kubectl get sr`).
pub const SHORT_NAME: &str = "sr";
/// Name of the CustomResourceDefinition object.
pub const CRD_NAME: &str = "saferollouts.saferollout.dev";

/// Annotation a person sets on a SafeRollout to retry a blocked revision. The
/// value is the revision hash (a DaemonSet `controller-revision-hash`) to unblock.
pub const RETRY_ANNOTATION: &str = "saferollout.dev/retry";

/// Annotation a person sets on a SafeRollout to approve a stage that waits
/// (`pause: true`). The value is `<target revision>:<stage index>`, so an
/// approval left on the object never approves a later rollout.
pub const APPROVE_ANNOTATION: &str = "saferollout.dev/approve";
/// Annotation a person sets on a SafeRollout to revert a rollout now and block
/// its revision. The value is the target revision.
pub const ABORT_ANNOTATION: &str = "saferollout.dev/abort";
/// Annotation on a SafeRollout: what its deletion does with a DaemonSet that
/// carries a revision the gates stopped (Halted, Quarantined, or a revert
/// under way). Absent or [`ON_DELETE_RESTORE_LAST_GOOD`]: the last good
/// template is written back first; [`ON_DELETE_KEEP_TEMPLATE`]: the
/// DaemonSet is handed back as it is (the stopped release then rolls wherever
/// its update strategy takes it).
pub const ON_DELETE_ANNOTATION: &str = "saferollout.dev/on-delete";
pub const ON_DELETE_RESTORE_LAST_GOOD: &str = "RestoreLastGood";
pub const ON_DELETE_KEEP_TEMPLATE: &str = "KeepTemplate";
/// Label on the last-good backup ControllerRevision: the DaemonSet revision it holds.
pub const BACKUP_REVISION_LABEL: &str = "saferollout.dev/revision";
/// The label the DaemonSet controller puts on its ControllerRevisions and pods:
/// the hash naming a template revision.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The well-known zone label stages spread across.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Taint the `Selector` strategy's promotion puts on the canary's nodes for
/// a moment (`NoSchedule`, value: the rollout's id): neither DaemonSet's
/// controller creates or deletes an agent pod there meanwhile.
pub const PROMOTING_TAINT: &str = "saferollout.dev/promoting";

/// Label the operator puts on a node taken by a stage; the value is the stage
/// index (0-based, as a decimal string). Alert rules and probe pods select on it.
pub const STAGE_LABEL: &str = "saferollout.dev/stage";
/// Label the operator puts on nodes (and on objects it creates, such as probe
/// pods) identifying the SafeRollout that owns them.
pub const ROLLOUT_LABEL: &str = "saferollout.dev/rollout";
/// Label the operator puts on a node it cordoned for `spec.nodeMaintenance`
/// (in the same write as the cordon); the value is the SafeRollout's
/// [`ROLLOUT_LABEL`] value. Only a node carrying it is ever uncordoned by
/// the operator, so a cordon someone else made is never lifted.
pub const MAINTENANCE_LABEL: &str = "saferollout.dev/maintenance";
/// The standard label key telling which tool manages an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on objects the operator creates.
pub const MANAGED_BY: &str = "saferollout-operator";
/// Field manager name for every server-side apply and patch the operator makes.
pub const FIELD_MANAGER: &str = "saferollout-operator";
/// Finalizer the operator puts on a SafeRollout so that, on deletion, it can
/// give the DaemonSet back its original update strategy.
pub const FINALIZER: &str = "saferollout.dev/finalizer";

/// Condition type: the target revision runs on every node and every gate passed.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: a rollout (or a revert) is under way.
pub const CONDITION_PROGRESSING: &str = "Progressing";
/// Condition type: a gate failed, a revision was reverted or the rollout is stuck.
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Condition type (kstatus): the operator is still working towards the desired
/// state (taking over, rolling out, reverting, or waiting at a pause).
pub const CONDITION_RECONCILING: &str = "Reconciling";
/// Condition type (kstatus): progress stopped and needs a person or a new spec
/// (a reverted revision, a failed preflight, a conflict, a stuck node).
pub const CONDITION_STALLED: &str = "Stalled";
/// Condition type: a SafeRolloutPolicy holds the rollout back (its budget,
/// its ordering, a maintenance window); set only on governed SafeRollouts.
pub const CONDITION_WAITING: &str = "Waiting";
/// Condition type: the preflight checks of the target revision found no error.
pub const CONDITION_PREFLIGHT_PASSED: &str = "PreflightPassed";

/// The node conditions Kubernetes itself sets: the kubelet's Ready and
/// pressure conditions, the route controller's NetworkUnavailable. The
/// operator reads Ready, and keeps of a node's conditions only Ready and
/// those other writers set (a node-problem detector's, the ones
/// `gates.nodeConditions` names).
pub const KUBERNETES_NODE_CONDITIONS: [&str; 5] = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

/// The `capacityLabel:` prefix of an allocatable gate's `max` bound.
pub const CAPACITY_LABEL_PREFIX: &str = "capacityLabel:";
/// The `baseline` word of an allocatable gate's `min`/`max` bound.
pub const BASELINE: &str = "baseline";

/// Label on the claims probes (pods and the claims the operator creates for
/// them); the value is the SafeRollout's [`ROLLOUT_LABEL`] value.
pub const PROBE_LABEL: &str = "saferollout.dev/probe";
/// Annotation on a claims probe: the node it is for.
pub const PROBE_NODE_ANNOTATION: &str = "saferollout.dev/probe-node";
/// Annotation on a claims probe: the revision being rolled out when it was made.
pub const PROBE_REVISION_ANNOTATION: &str = "saferollout.dev/probe-revision";
/// Label on a quarantine DeviceTaintRule: the node whose devices it takes
/// out of service. Rules also carry [`ROLLOUT_LABEL`].
pub const QUARANTINE_NODE_LABEL: &str = "saferollout.dev/quarantined-node";
/// Key of the device taint a quarantine DeviceTaintRule puts on a failed
/// node's devices (value: the SafeRollout, `<namespace>.<name>`).
pub const QUARANTINE_TAINT_KEY: &str = "saferollout.dev/quarantine";
/// Prefix of the node taint a device-plugin quarantine puts on a failed node:
/// `quarantine.saferollout.dev/<namespace>.<name>=<resource>:<effect>`.
pub const QUARANTINE_NODE_TAINT_PREFIX: &str = "quarantine.saferollout.dev/";
