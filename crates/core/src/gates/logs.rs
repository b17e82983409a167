//! logs: every agent pod of the target revision on the rollout's nodes must
//! not log a line matching a fatal pattern within `window` after its
//! container started. A Ready plugin that printed `Failed to initialize
//! NVML` serves nothing, whatever its readiness says.
//!
//! The runtime reads each such pod's log (`pods/log`) every `interval` while
//! its window is open and once after it closed, each read going on from
//! where the last one stopped and scanning at most 1 MiB of new lines
//! ([`super::log_reader`], pure, here: a read that stops at its bound is
//! followed at once by the next, so every line of the window is scanned,
//! whatever its offset); the gate judges the scan results:
//! - a match fails the gate at once on that node (no soak: a fatal line does
//!   not heal), naming the pattern and the line (truncated, secrets masked);
//! - a node passes once its log was read clean after its window closed;
//! - a log that cannot be read once the window has closed is inconclusive:
//!   `onUnreadable: Fail` fails the gate, `Pause` holds the stage (until the
//!   progress deadline). It never passes on logs it did not read.
//!
//! Built-in patterns are the agents' own fatal messages, each cited from the
//! agent's sources (commit and file), case-insensitive.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use jiff::Timestamp;
use regex::Regex;
use saferollout_api::{GATE_LOGS, GateStatus, LogsGate, PatternSet, UnreadablePolicy};

pub use super::proof::LogMatch;
use super::proof::{LogRead, clean_line};
use super::{Snapshot, Verdict, list_some, result};

pub const NAME: &str = GATE_LOGS;

/// One built-in pattern and where the agent prints it.
pub struct BuiltinPattern {
    pub pattern: &'static str,
    pub source: &'static str,
}

/// The built-in patterns of a set.
pub fn builtin(set: PatternSet) -> &'static [BuiltinPattern] {
    match set {
        // Any plugin or driver: kubelet registration. The kubelet's device
        // plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) serves
        // the gRPC services v1beta1.Registration and v1beta1.DevicePlugin;
        // gRPC answers "unknown service <name>" when one side speaks another
        // API version.
        PatternSet::Generic => &[
            BuiltinPattern {
                pattern: r"unknown service v1beta1\.(DevicePlugin|Registration)",
                source: "gRPC status of the kubelet device plugin API v1beta1 (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)",
            },
            BuiltinPattern {
                pattern: r"failed to register\b",
                source: "kubelet plugin registration failures (device plugins and DRA kubelet plugins)",
            },
            BuiltinPattern {
                pattern: r"\bno devices found\b",
                source: "device plugins that find no device (NVIDIA, Cambricon and Ascend plugins print it verbatim)",
            },
        ],
        // NVIDIA/k8s-device-plugin @ 1b826acc6af3
        PatternSet::NvidiaDevicePlugin => &[
            BuiltinPattern {
                pattern: r"Failed to initialize NVML",
                source: "NVIDIA/k8s-device-plugin internal/plugin/factory.go:99 (klog.Errorf(\"Failed to initialize NVML: %v.\"))",
            },
            BuiltinPattern {
                pattern: r"could not load NVML library",
                source: "NVIDIA/k8s-device-plugin vendor/github.com/NVIDIA/go-nvlib/pkg/nvlib/info/property-extractor.go:55",
            },
            BuiltinPattern {
                pattern: r"Incompatible strategy detected",
                source: "NVIDIA/k8s-device-plugin internal/plugin/factory.go:118",
            },
            BuiltinPattern {
                pattern: r"Could not (register|start) device plugin",
                source: "NVIDIA/k8s-device-plugin internal/plugin/server.go:137,146",
            },
            BuiltinPattern {
                pattern: r"error starting plugins",
                source: "NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go:297",
            },
        ],
        // NVIDIA/k8s-dra-driver-gpu @ 22407113785e
        PatternSet::NvidiaDraDriver => &[
            BuiltinPattern {
                pattern: r"failed registration process",
                source: "NVIDIA/k8s-dra-driver-gpu vendor/k8s.io/dynamic-resource-allocation/kubeletplugin/registrationserver.go:62",
            },
            BuiltinPattern {
                pattern: r"start registrar:",
                source: "NVIDIA/k8s-dra-driver-gpu vendor/k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go:831",
            },
            BuiltinPattern {
                pattern: r"error creating driver",
                source: "NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/main.go:283",
            },
            BuiltinPattern {
                pattern: r"error preparing devices for claim|prepare devices failed",
                source: "NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/driver.go:401, device_state.go:298 (NodePrepareResources)",
            },
            BuiltinPattern {
                pattern: r"failed to call NodePrepareResources",
                source: "NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/health.go:140",
            },
            BuiltinPattern {
                pattern: r"NodePrepareResources.*failed",
                source: "kubelet DRA manager: a NodePrepareResources call that failed",
            },
        ],
        // ROCm/k8s-device-plugin @ ed7646843003
        PatternSet::AmdDevicePlugin => &[
            BuiltinPattern {
                pattern: r"amdgpu driver unavailable",
                source: "ROCm/k8s-device-plugin internal/pkg/amdgpu/amdgpu.go:159",
            },
            BuiltinPattern {
                pattern: r"No GPU nodes found via properties",
                source: "ROCm/k8s-device-plugin internal/pkg/plugin/plugin.go:204",
            },
            BuiltinPattern {
                pattern: r": Registration failed:",
                source: "ROCm/k8s-device-plugin vendor/github.com/kubevirt/device-plugin-manager/pkg/dpm/plugin.go:157",
            },
            BuiltinPattern {
                pattern: r"Failed to start plugin",
                source: "ROCm/k8s-device-plugin vendor/github.com/kubevirt/device-plugin-manager/pkg/dpm/manager.go:187",
            },
        ],
        // intel/intel-device-plugins-for-kubernetes @ 94a91bc94134
        PatternSet::IntelDevicePlugin => &[
            BuiltinPattern {
                pattern: r"Cannot register to kubelet service",
                source: "intel/intel-device-plugins-for-kubernetes pkg/deviceplugin/server.go:364",
            },
            BuiltinPattern {
                pattern: r"Device scan failed",
                source: "intel/intel-device-plugins-for-kubernetes pkg/deviceplugin/manager.go:102",
            },
            BuiltinPattern {
                pattern: r"Failed to serve .*/",
                source: "intel/intel-device-plugins-for-kubernetes pkg/deviceplugin/manager.go:146",
            },
            BuiltinPattern {
                pattern: r"Failed to listen to plugin socket",
                source: "intel/intel-device-plugins-for-kubernetes pkg/deviceplugin/server.go:277",
            },
        ],
    }
}

/// Most memory a user pattern's compiled program may take: a 512-byte
/// pattern such as `(a{100}){100}` would otherwise expand to megabytes.
const USER_PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// A user's pattern as the operator compiles it (Rust's `regex`, which
/// differs from the API server's RE2 in a few corners such as `\Q...\E`),
/// with its program bounded in size. The operator refuses a SafeRollout
/// whose pattern does not compile here (`InvalidSpec`, naming it) before
/// any stage starts, so the gate never waits on a pattern it cannot apply.
pub fn compile_user_pattern(pattern: &str) -> Result<Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(USER_PATTERN_SIZE_LIMIT)
        .dfa_size_limit(USER_PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => {
                format!("its compiled form exceeds {limit} bytes")
            }
            other => other
                .to_string()
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_string(),
        })
}

/// Why the operator cannot compile a user's pattern, if it cannot
/// ([`compile_user_pattern`]), remembered per pattern: the operator's
/// limits ask on every pass of every rollout with a logs gate, and a
/// pattern's answer never changes. At most 4,096 patterns are remembered.
pub fn user_pattern_error(pattern: &str) -> Option<String> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<HashMap<String, Option<String>>>> =
        std::sync::OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(known) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(pattern) {
        return known.clone();
    }
    let error = compile_user_pattern(pattern).err();
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if seen.len() >= 4096 {
        seen.clear();
    }
    seen.insert(pattern.to_string(), error.clone());
    error
}

/// The compiled patterns of one gate.
pub struct Patterns {
    /// (the pattern as written, where it comes from, compiled).
    list: Vec<(String, String, Regex)>,
}

impl Patterns {
    /// The gate's patterns: the built-in sets (all when not listed) and the
    /// user's (case-sensitive as written; built-ins ignore case). A user
    /// pattern that does not compile is an error (the CRD refuses it).
    pub fn of(gate: &LogsGate) -> Result<Patterns, String> {
        let sets: Vec<PatternSet> = gate
            .builtin
            .clone()
            .unwrap_or_else(|| PatternSet::ALL.to_vec());
        let mut list = Vec::new();
        for set in sets.into_iter().collect::<BTreeSet<_>>() {
            for p in builtin(set) {
                let re = Regex::new(&format!("(?i){}", p.pattern))
                    .map_err(|e| format!("built-in pattern {:?}: {e}", p.pattern))?;
                list.push((
                    p.pattern.to_string(),
                    format!("builtin:{}", set.as_str()),
                    re,
                ));
            }
        }
        for (i, p) in gate.patterns.iter().enumerate() {
            let re = compile_user_pattern(p)
                .map_err(|e| format!("spec.gates.logs.patterns[{i}] {p:?} is not valid: {e}"))?;
            list.push((p.clone(), format!("spec.gates.logs.patterns[{i}]"), re));
        }
        Ok(Patterns { list })
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first line of `text` (in log order) that matches a pattern.
    pub fn scan(&self, text: &str) -> Option<LogMatch> {
        text.lines().find_map(|line| self.match_line(line))
    }

    /// `line` if it matches a pattern (the first that matches).
    pub fn match_line(&self, line: &str) -> Option<LogMatch> {
        self.list
            .iter()
            .find(|(_, _, re)| re.is_match(line))
            .map(|(pattern, origin, _)| LogMatch {
                pattern: pattern.clone(),
                origin: origin.clone(),
                line: clean_line(line),
            })
    }
}

/// Scans `text` with the gate's patterns (see [`Patterns::scan`]).
pub fn scan(gate: &LogsGate, text: &str) -> Result<Option<LogMatch>, String> {
    Ok(Patterns::of(gate)?.scan(text))
}

fn durations(gate: &LogsGate) -> (Duration, Duration) {
    (
        gate.window.to_std().unwrap_or(Duration::from_secs(60)),
        gate.interval
            .to_std()
            .unwrap_or(Duration::from_secs(10))
            .max(Duration::from_secs(1)),
    )
}

/// When the log of a container started at `started` has been watched for
/// the whole window.
pub fn window_end(gate: &LogsGate, started: Timestamp) -> Timestamp {
    let (window, _) = durations(gate);
    started
        .checked_add(jiff::SignedDuration::try_from(window).unwrap_or_default())
        .unwrap_or(started)
}

enum NodeState {
    Awaiting,
    Watching,
    Clean,
    Matched(String, super::logs::LogMatch),
    Unreadable(String, String),
}

pub fn evaluate(gate: &LogsGate, snap: &Snapshot) -> Verdict {
    let (_, interval) = durations(gate);
    if snap.nodes.is_empty() {
        return Verdict::new(result(
            NAME,
            GateStatus::Pending,
            "NoNodes",
            "no node of the rollout to judge yet".into(),
        ));
    }
    let logs = snap.evidence.proof.map(|p| &p.agent_logs);
    let mut states = Vec::new();
    let mut recheck: Option<Duration> = None;
    for &node in snap.nodes {
        let Some(pod) = snap.target_pod(node) else {
            states.push((node, NodeState::Awaiting));
            continue;
        };
        let obs = logs.and_then(|l| l.get(pod.uid));
        let state = match obs {
            None => NodeState::Awaiting,
            Some(o) => {
                let end = o.started_at.map(|s| window_end(gate, s));
                match (&o.read, end) {
                    (LogRead::Matched(m), _) => NodeState::Matched(o.pod.clone(), m.clone()),
                    (_, None) => NodeState::Awaiting,
                    (LogRead::Unread, Some(_)) => NodeState::Watching,
                    (LogRead::Behind { .. }, Some(_)) => {
                        // More to read: the next read goes on at once.
                        recheck = Some(Duration::ZERO);
                        NodeState::Watching
                    }
                    (LogRead::Clean { at }, Some(end)) if *at >= end => NodeState::Clean,
                    (LogRead::Clean { .. }, Some(end)) => {
                        let left = super::elapsed(snap.now, end);
                        recheck = Some(recheck.map_or(left, |r| r.min(left)));
                        NodeState::Watching
                    }
                    (LogRead::Unreadable { clean_at, .. }, Some(end))
                        if clean_at.is_some_and(|c| c >= end) =>
                    {
                        NodeState::Clean
                    }
                    (LogRead::Unreadable { error, .. }, Some(end)) if snap.now >= end => {
                        NodeState::Unreadable(o.pod.clone(), error.clone())
                    }
                    (LogRead::Unreadable { .. }, Some(_)) => NodeState::Watching,
                }
            }
        };
        states.push((node, state));
    }
    let recheck = Some(
        recheck
            .map_or(interval, |r| r.min(interval))
            .max(Duration::from_millis(500)),
    );

    let matched: Vec<(&str, &String, &LogMatch)> = states
        .iter()
        .filter_map(|(n, s)| match s {
            NodeState::Matched(pod, m) => Some((*n, pod, m)),
            _ => None,
        })
        .collect();
    if let Some((node, pod, m)) = matched.first() {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            "FatalLogLine",
            format!(
                "agent pod {pod} on node {node} logged a line matching {:?} ({}): {}",
                m.pattern, m.origin, m.line
            ),
        );
        r.node = Some(node.to_string());
        r.observed = Some(m.line.clone());
        r.expected = Some(format!("no line matching {:?}", m.pattern));
        r.since = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            snap.now,
        ));
        return Verdict {
            violating: matched.iter().map(|(n, _, _)| n.to_string()).collect(),
            ..Verdict::new(r)
        };
    }

    let unreadable: Vec<(&str, &String, &String)> = states
        .iter()
        .filter_map(|(n, s)| match s {
            NodeState::Unreadable(pod, e) => Some((*n, pod, e)),
            _ => None,
        })
        .collect();
    if let Some((node, pod, error)) = unreadable.first() {
        let deadline = snap.deadline_passed();
        let (status, policy) = match gate.on_unreadable {
            UnreadablePolicy::Fail => (GateStatus::Failed, "onUnreadable: Fail"),
            UnreadablePolicy::Pause if deadline => (
                GateStatus::Failed,
                "onUnreadable: Pause, and the progress deadline passed",
            ),
            UnreadablePolicy::Pause => (GateStatus::Pending, "onUnreadable: Pause"),
        };
        let mut r = result(
            NAME,
            status,
            "LogsUnreadable",
            format!(
                "cannot read the log of agent pod {pod} on node {node} after its window: {} ({policy}; the gate never passes on logs it did not read)",
                clean_line(error)
            ),
        );
        r.node = Some(node.to_string());
        r.observed = Some("unreadable".into());
        r.expected = Some("a log read clean after the window".into());
        return Verdict {
            violating: unreadable.iter().map(|(n, _, _)| n.to_string()).collect(),
            recheck_after: (status == GateStatus::Pending).then_some(interval),
            ..Verdict::new(r)
        };
    }

    let total = states.len();
    let clean = states
        .iter()
        .filter(|(_, s)| matches!(s, NodeState::Clean))
        .count();
    let window = gate.window.as_str();
    if clean == total {
        return Verdict::new(result(
            NAME,
            GateStatus::Passed,
            "NoFatalLines",
            format!(
                "no fatal line in the agent logs of all {total} nodes within {window} of start"
            ),
        ));
    }
    let awaiting: Vec<&str> = states
        .iter()
        .filter_map(|(n, s)| matches!(s, NodeState::Awaiting).then_some(*n))
        .collect();
    let message = if awaiting.is_empty() {
        format!(
            "{clean}/{total} agent logs clean for their whole {window} window; watching the others"
        )
    } else {
        format!(
            "{clean}/{total} agent logs clean for their whole {window} window; waiting for the new agent on {}",
            list_some(&awaiting)
        )
    };
    if snap.deadline_passed() {
        let mut r = result(
            NAME,
            GateStatus::Failed,
            "ProgressDeadlineExceeded",
            format!("no progress before the deadline: {message}"),
        );
        r.node = states
            .iter()
            .find(|(_, s)| !matches!(s, NodeState::Clean))
            .map(|(n, _)| n.to_string());
        return Verdict::new(r);
    }
    Verdict {
        recheck_after: recheck,
        ..Verdict::new(result(NAME, GateStatus::Pending, "WatchingLogs", message))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::proof::{LogObservation, ProofEvidence};
    use super::super::test_support::*;
    use super::*;

    fn gate() -> LogsGate {
        LogsGate {
            window: "30s".into(),
            interval: "5s".into(),
            ..Default::default()
        }
    }

    fn eval(g: &LogsGate, w: &World, logs: BTreeMap<String, LogObservation>) -> Verdict {
        let ev = ProofEvidence {
            agent_logs: logs,
            ..Default::default()
        };
        w.with_proof(&ev, |s| evaluate(g, s))
    }

    fn obs(w: &World, node: &str, started: i64, read: LogRead) -> (String, LogObservation) {
        let pod = w.pods[node][0].name.clone();
        (
            pod.clone(),
            LogObservation {
                pod,
                started_at: Some(ts(started)),
                read,
            },
        )
    }

    #[test]
    fn builtin_patterns_catch_the_agents_fatal_lines_and_not_healthy_ones() {
        let p = Patterns::of(&LogsGate::default()).unwrap();
        assert!(p.len() >= 15);
        for fatal in [
            "E0102 15:04:05.000000       1 main.go:131] Failed to initialize NVML: could not load NVML library",
            "I0102 15:04:05.0 1 main.go:416] No devices found. Waiting indefinitely.",
            "failed to register plugin with the kubelet: rpc error: code = Unavailable",
            "rpc error: code = Unimplemented desc = unknown service v1beta1.DevicePlugin",
            "E0102 driver.go:401] error preparing devices for claim default/c: boom",
            "F0102 amdgpu.go:159] amdgpu driver unavailable. exiting with exit code 2. error: x",
            "E0102 server.go:364] Cannot register to kubelet service: x",
            "failed registration process: plugin name mismatch",
        ] {
            assert!(p.scan(fatal).is_some(), "{fatal}");
        }
        for healthy in [
            "I0102 main.go:112] Starting sim device plugin registry.example/plugin:v2 for example.com/gpu",
            "I0102 config.go:58] Loaded license server credentials: url=https://license.sim.invalid token=simtok-0011",
            "I0102 config.go:71] Loaded registry credentials for https://ghp_0011@git.sim.invalid/drivers, NGC key nvapi-0011, AWS key AKIA0011, session eyJ0011",
            "I0102 plugin.go:201] Registered device plugin for 'example.com/gpu' with Kubelet; advertising 8 device(s)",
            "I0102 plugin.go:201] Registered DRA driver gpu.sim.saferollout.dev with the kubelet; publishing 8 device(s)",
        ] {
            assert_eq!(p.scan(healthy), None, "{healthy}");
        }
    }

    #[test]
    fn the_first_matching_line_is_reported_cleaned_and_user_patterns_apply() {
        let g = LogsGate {
            builtin: Some(vec![]),
            patterns: vec!["license server".into()],
            ..Default::default()
        };
        let text =
            "ok\nLoaded license server credentials: token=simtok-abcdef0123\nlicense server again";
        let m = scan(&g, text).unwrap().unwrap();
        assert_eq!(m.pattern, "license server");
        assert_eq!(m.origin, "spec.gates.logs.patterns[0]");
        assert!(!m.line.contains("simtok-abcdef0123"), "{}", m.line);
        assert!(m.line.contains("***"), "{}", m.line);
        // Only the built-in sets listed apply.
        let amd_only = LogsGate {
            builtin: Some(vec![PatternSet::AmdDevicePlugin]),
            ..Default::default()
        };
        assert_eq!(
            scan(&amd_only, "Failed to initialize NVML: x").unwrap(),
            None
        );
    }

    #[test]
    fn a_fatal_line_fails_at_once_naming_pattern_node_and_masked_line() {
        let w = World::healthy(2, 8);
        let m = Patterns::of(&gate())
            .unwrap()
            .scan("E main.go:131] Failed to initialize NVML: could not load NVML library token=abc")
            .unwrap();
        let logs = BTreeMap::from([
            obs(&w, "node-0", 100, LogRead::Clean { at: ts(100) }),
            obs(&w, "node-1", 100, LogRead::Matched(m)),
        ]);
        let v = eval(&gate(), &w, logs);
        assert_eq!(v.result.status, GateStatus::Failed);
        assert_eq!(v.result.reason, "FatalLogLine");
        assert_eq!(v.result.node.as_deref(), Some("node-1"));
        assert!(
            v.result.message.contains("Failed to initialize NVML"),
            "{}",
            v.result.message
        );
        assert!(
            !v.result.message.contains("token=abc"),
            "{}",
            v.result.message
        );
        assert_eq!(v.violating.iter().collect::<Vec<_>>(), ["node-1"]);
    }

    #[test]
    fn passes_only_after_a_clean_read_past_the_window() {
        let mut w = World::healthy(1, 8);
        w.now = ts(110);
        let v = eval(
            &gate(),
            &w,
            BTreeMap::from([obs(&w, "node-0", 100, LogRead::Clean { at: ts(110) })]),
        );
        assert_eq!(v.result.status, GateStatus::Pending);
        assert_eq!(v.recheck_after, Some(Duration::from_secs(5)));
        w.now = ts(131);
        let v = eval(
            &gate(),
            &w,
            BTreeMap::from([obs(&w, "node-0", 100, LogRead::Clean { at: ts(131) })]),
        );
        assert_eq!(v.result.status, GateStatus::Passed, "{:?}", v.result);
        // Nothing read yet: never passes.
        let v = eval(&gate(), &w, BTreeMap::new());
        assert_eq!(v.result.status, GateStatus::Pending);
    }

    #[test]
    fn unreadable_logs_follow_the_policy_and_never_pass() {
        let mut w = World::healthy(1, 8);
        let unreadable = LogRead::Unreadable {
            error: "pods \"agent\" is forbidden: User cannot get resource \"pods/log\"".into(),
            clean_at: Some(ts(105)),
        };
        w.now = ts(120);
        // Within the window: keep trying.
        let v = eval(
            &gate(),
            &w,
            BTreeMap::from([obs(&w, "node-0", 100, unreadable.clone())]),
        );
        assert_eq!(v.result.status, GateStatus::Pending);
        w.now = ts(140);
        let logs = BTreeMap::from([obs(&w, "node-0", 100, unreadable.clone())]);
        let v = eval(&gate(), &w, logs.clone());
        assert_eq!(
            (v.result.status, v.result.reason.as_str()),
            (GateStatus::Failed, "LogsUnreadable")
        );
        assert!(
            v.result.message.contains("forbidden"),
            "{}",
            v.result.message
        );
        let pause = LogsGate {
            on_unreadable: UnreadablePolicy::Pause,
            ..gate()
        };
        let v = eval(&pause, &w, logs.clone());
        assert_eq!(v.result.status, GateStatus::Pending);
        assert!(v.violating.contains("node-0"), "a pause holds the stage");
        w.without_progress = Duration::from_secs(600);
        assert_eq!(eval(&pause, &w, logs).result.status, GateStatus::Failed);
    }
}
