{{/*
The operator's RBAC rules, one rule a line, each with why it is needed.
Verbs are enumerated (no wildcards) and nothing reads Secrets unless
`prometheusGate.secrets` names them (then only those, by name). Reads and
writes of a resource are separate lines, so a write can be audited (and
removed) on its own. To add a rule, add one line to the right set below; an
optional rule goes behind a value, e.g.
  {{- if .Values.rbac.someFeature }}
  - {apiGroups: [...], resources: [...], verbs: [...]}
  {{- end }}
*/}}

{{/* Rules on namespaced objects of the watched namespaces: a ClusterRole
when every namespace is watched, a Role in each of `watchNamespaces` otherwise. */}}
{{- define "saferollout.rules.rollouts" -}}
# SafeRollouts: read; patch (and update) its finalizer and the annotations it consumes.
- {apiGroups: [saferollout.dev], resources: [saferollouts], verbs: [get, list, watch, patch, update]}
# SafeRollout status: the operator's record of a rollout, written before it acts.
- {apiGroups: [saferollout.dev], resources: [saferollouts/status], verbs: [get, patch, update]}
# Owner references (blockOwnerDeletion) from the backups it creates to their SafeRollout.
- {apiGroups: [saferollout.dev], resources: [saferollouts/finalizers], verbs: [update]}
# DaemonSets: read the target.
- {apiGroups: [apps], resources: [daemonsets], verbs: [get, list, watch]}
# DaemonSets: updateStrategy OnDelete, the template stage by stage, the last good template on revert.
- {apiGroups: [apps], resources: [daemonsets], verbs: [patch]}
# ControllerRevisions: read the DaemonSet's revisions.
- {apiGroups: [apps], resources: [controllerrevisions], verbs: [get, list, watch]}
# ControllerRevisions: create and delete the last-good backup the SafeRollout owns.
- {apiGroups: [apps], resources: [controllerrevisions], verbs: [create, delete]}
# Pods: read the agent pods.
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch]}
# Pods: replace agent pods node by node, at most maxUnavailable at a time; delete judged probe pods.
- {apiGroups: [""], resources: [pods], verbs: [delete]}
# Pods: create the probe gate's probe pods (pinned to a stage node, one device, owned by the SafeRollout).
- {apiGroups: [""], resources: [pods], verbs: [create]}
# Pod logs: the logs gate reads agent logs for fatal lines; the probe gate reads a failed probe's last lines.
- {apiGroups: [""], resources: [pods/log], verbs: [get]}
# ResourceClaimTemplates: the one through which DRA probes claim a device (probe gate with deviceClassName).
- {apiGroups: [resource.k8s.io], resources: [resourceclaimtemplates], verbs: [create]}
{{- $secrets := list }}
{{- range .Values.prometheusGate.secrets }}
{{- $secrets = append $secrets .name }}
{{- end }}
{{- with $secrets | uniq }}
# Secrets: only these, by name: the prometheus gate's bearer tokens and CA bundles.
- {apiGroups: [""], resources: [secrets], verbs: [get], resourceNames: [{{ join ", " . }}]}
{{- end }}
# Events about each SafeRollout (gate failures, reverts, preflight findings).
- {apiGroups: [events.k8s.io], resources: [events], verbs: [create, patch]}
{{- if .Values.selector.enabled }}
# DaemonSets: strategy Selector creates each rollout's canary DaemonSet (owned by the SafeRollout) and deletes it.
- {apiGroups: [apps], resources: [daemonsets], verbs: [create, delete]}
# Pods: strategy Selector relabels agent pods (the promotion hands the canary's pods to the target).
- {apiGroups: [""], resources: [pods], verbs: [patch]}
{{- end }}
{{- if .Values.deviceGates.enabled }}
# Pods: create the claims probes (gates.claims.probe), owned by the SafeRollout.
- {apiGroups: [""], resources: [pods], verbs: [create]}
# ResourceClaims: create and delete the claims of DeviceClass probes, owned by the SafeRollout.
- {apiGroups: [resource.k8s.io], resources: [resourceclaims], verbs: [create, delete]}
{{- end }}
{{- end -}}

{{/* Rules that are cluster-wide whatever the mode. */}}
{{- define "saferollout.rules.cluster" -}}
# Nodes: read their devices (allocatable), readiness, taints and zones.
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
# Nodes: the stage labels (saferollout.dev/stage, saferollout.dev/rollout); with strategy
# Selector, the handover label and the promotion's taint; with nodeMaintenance, the
# cordon (spec.unschedulable) and its mark (saferollout.dev/maintenance).
- {apiGroups: [""], resources: [nodes], verbs: [patch]}
# Namespaces: the Pod Security level preflight checks a template against.
{{- if .Values.watchNamespaces }}
- {apiGroups: [""], resources: [namespaces], verbs: [get], resourceNames: [{{ join ", " .Values.watchNamespaces }}]}
{{- else }}
- {apiGroups: [""], resources: [namespaces], verbs: [get]}
{{- end }}
{{- if .Values.fleetPolicies.enabled }}
# SafeRolloutPolicies: read the fleet policies (cluster-scoped) that govern SafeRollouts together.
- {apiGroups: [saferollout.dev], resources: [saferolloutpolicies], verbs: [get, list, watch]}
# SafeRolloutPolicy status: whether each policy is applied, and why not (an ordering cycle, an unknown zone).
- {apiGroups: [saferollout.dev], resources: [saferolloutpolicies/status], verbs: [get, patch]}
# Namespaces: a policy selects SafeRollouts by their namespace's labels.
- {apiGroups: [""], resources: [namespaces], verbs: [list, watch]}
{{- end }}
{{- if .Values.nodeMaintenance.enabled }}
# Pods: list the pods of a node a rollout holds in maintenance, in any namespace (nodeMaintenance.drain).
- {apiGroups: [""], resources: [pods], verbs: [list]}
# Evictions: drain a node before its agent is replaced, through the Eviction API (PodDisruptionBudgets hold).
- {apiGroups: [""], resources: [pods/eviction], verbs: [create]}
{{- end }}
{{- if .Values.ownerRevert.enabled }}
# Vendor operators' custom resources: spec.ownerRevert reads whether a GitOps tool manages one
# (its labels and annotations) and puts back the version fields that made the last good template.
- {apiGroups: [nvidia.com], resources: [clusterpolicies], verbs: [get, patch]}
- {apiGroups: [amd.com], resources: [deviceconfigs], verbs: [get, patch]}
- {apiGroups: [deviceplugin.intel.com], resources: [gpudeviceplugins], verbs: [get, patch]}
{{- end }}
{{- if .Values.deviceGates.enabled }}
# ResourceSlices: what a DRA driver publishes per node (gates.resourceSlices, deviceTaints).
- {apiGroups: [resource.k8s.io], resources: [resourceslices], verbs: [get, list, watch]}
# ResourceClaims: claims allocated on the rollout's nodes, in any namespace (gates.claims).
- {apiGroups: [resource.k8s.io], resources: [resourceclaims], verbs: [get, list, watch]}
{{- if .Values.watchNamespaces }}
# Pods: the workloads on the nodes a rollout holds, in any namespace (gates.deviceHealth, claims).
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch]}
{{- end }}
{{- if .Values.deviceGates.quarantine }}
# DeviceTaintRules: onFailure Quarantine takes a failed node's devices out of service, and lifts it.
- {apiGroups: [resource.k8s.io], resources: [devicetaintrules], verbs: [get, list, watch, create, delete]}
{{- end }}
{{- end }}
{{- end -}}

{{/* Leader election, in the Lease's namespace only. */}}
{{- define "saferollout.rules.leaderElection" -}}
# Leases: create the leader-election Lease (create cannot be limited by name).
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}
# Leases: hold and renew that one Lease, and watch it (the write fence: a
# replica writes only while its own renewals keep arriving).
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, update, patch], resourceNames: [{{ include "saferollout.leaseName" . }}]}
{{- end -}}
