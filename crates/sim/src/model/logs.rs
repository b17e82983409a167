//! What the simulated agents and workloads print, and the CRI log format
//! the kubelet (here KWOK's kubelet server) reads container logs in.
//!
//! Every agent's log has its start-up lines, one line with a secret-looking
//! value (`token=...`, so log readers can be shown to mask it), and the
//! lines of its fault: the real agents' fatal messages for `-broken`,
//! `-crashloop`, `-fatallog` and `-noisyfatal` (which prints more than
//! [`NOISE_BYTES`] of routine lines before it).

use jiff::Timestamp;

use super::{AgentKind, Fault};

/// The fatal line of a `-broken` or `-fatallog` device plugin: the NVIDIA
/// device plugin's when NVML cannot be loaded.
pub const PLUGIN_FATAL: &str = "Failed to initialize NVML: could not load NVML library";
/// The fatal line of a `-broken` or `-fatallog` DRA driver: its kubelet
/// plugin registration failing.
pub const DRIVER_FATAL: &str = "failed to register plugin with the kubelet: rpc error: code = Unavailable desc = connection error: dial unix /var/lib/kubelet/plugins_registry/gpu.sim.saferollout.dev-reg.sock: connect: connection refused";
/// The last words of a `-crashloop` device plugin.
pub const PLUGIN_CRASH: &str = "failed to register with the kubelet: rpc error: code = Unimplemented desc = unknown service v1beta1.Registration";
/// The last words of a `-crashloop` DRA driver.
pub const DRIVER_CRASH: &str = "NodePrepareResources: failed to restore the checkpoint: checkpoint version v2 is not supported";

/// How much routine logging a `-noisyfatal` agent prints before its fatal
/// line: more than twice the 1 MiB a log reader might read at once.
pub const NOISE_BYTES: usize = 2 << 20;

/// Routine lines of at least `bytes` in all, none of them fatal.
fn noise(at: Timestamp, bytes: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut total = 0;
    let mut seq = 0u64;
    while total <= bytes {
        let line = klog(
            'I',
            at,
            "health.go:63",
            &format!(
                "health check {seq}: device gpu-{} ok, temperature {} C, power {} W, ecc errors 0",
                seq % 8,
                40 + seq % 30,
                150 + seq % 200
            ),
        );
        total += line.len() + 1;
        seq += 1;
        lines.push(line);
    }
    lines
}

/// Details an agent's log mentions.
#[derive(Clone, Copy, Debug)]
pub struct AgentLogFacts<'a> {
    pub kind: Option<AgentKind>,
    pub fault: Fault,
    /// The resource (device plugin) or driver (DRA) name.
    pub name: &'a str,
    pub image: &'a str,
    pub pod_uid: &'a str,
    /// Devices it advertises when it serves.
    pub devices: u64,
}

/// A klog-style line: `I0102 15:04:05.000000       1 main.go:42] message`.
fn klog(severity: char, at: Timestamp, source: &str, message: &str) -> String {
    let time = at.strftime("%m%d %H:%M:%S%.6f");
    format!("{severity}{time}       1 {source}] {message}")
}

/// The lines an agent's container prints, stamped from `at`.
pub fn agent_log_lines(facts: &AgentLogFacts<'_>, at: Timestamp) -> Vec<String> {
    let token = format!(
        "simtok-{:016x}",
        super::ids::hash(&["log-token", facts.pod_uid])
    );
    // Credentials of other formats an agent might print (all fake, derived
    // from the pod): what the operator's masking must never let through.
    let h = |what: &str| super::ids::hash(&[what, facts.pod_uid]);
    let github = format!("ghp_{:016x}{:016x}0000", h("gh1"), h("gh2"));
    let ngc = format!("nvapi-{:016x}", h("ngc"));
    let aws = format!("AKIA{:016X}", h("aws"));
    let jwt = format!(
        "eyJhbGciOiJIUzI1NiJ9.eyJ{:016x}.{:016x}",
        h("jwt1"),
        h("jwt2")
    );
    let (what, fatal, crash) = match facts.kind {
        Some(AgentKind::DraDriver) => ("DRA driver", DRIVER_FATAL, DRIVER_CRASH),
        _ => ("device plugin", PLUGIN_FATAL, PLUGIN_CRASH),
    };
    let mut lines = vec![
        klog(
            'I',
            at,
            "main.go:112",
            &format!("Starting sim {what} {} for {}", facts.image, facts.name),
        ),
        klog(
            'I',
            at,
            "config.go:58",
            &format!(
                "Loaded license server credentials: url=https://license.sim.invalid token={token}"
            ),
        ),
        klog(
            'I',
            at,
            "config.go:71",
            &format!(
                "Loaded registry credentials for https://{github}@git.sim.invalid/drivers, NGC key {ngc}, AWS key {aws}, session {jwt}"
            ),
        ),
    ];
    let info = |message: String| klog('I', at, "plugin.go:201", &message);
    match facts.fault {
        Fault::Crashloop => {
            lines.push(klog('F', at, "main.go:140", crash));
            return lines;
        }
        Fault::Broken => {
            lines.push(klog('E', at, "main.go:131", fatal));
            lines.push(info("No devices found. Waiting indefinitely.".into()));
            return lines;
        }
        Fault::FatalLog => lines.push(klog('E', at, "main.go:131", fatal)),
        Fault::NoisyFatal => {
            lines.extend(noise(at, NOISE_BYTES));
            lines.push(klog('E', at, "main.go:131", fatal));
        }
        _ => {}
    }
    lines.push(match facts.kind {
        Some(AgentKind::DraDriver) => info(format!(
            "Registered DRA driver {} with the kubelet; publishing {} device(s)",
            facts.name, facts.devices
        )),
        _ => info(format!(
            "Registered device plugin for '{}' with Kubelet; advertising {} device(s)",
            facts.name, facts.devices
        )),
    });
    match facts.fault {
        Fault::Unhealthy => lines.push(klog(
            'W',
            at,
            "health.go:77",
            "XID 79 (GPU has fallen off the bus) on every device; marking devices Unhealthy",
        )),
        Fault::Taint => lines.push(klog(
            'W',
            at,
            "health.go:91",
            "tainting every device gpu.sim.saferollout.dev/unhealthy=xid-79:NoSchedule",
        )),
        _ => {}
    }
    lines
}

/// The lines of a container that is not the agent (sidecars, exporters).
pub fn other_container_lines(container: &str, at: Timestamp) -> Vec<String> {
    vec![klog('I', at, "main.go:30", &format!("{container} started"))]
}

/// The CRI log format the kubelet stores and serves:
/// `<RFC 3339 nano time> stdout F <line>`, one entry per line.
pub fn cri_log(lines: &[String], at: Timestamp) -> String {
    let time = at.strftime("%Y-%m-%dT%H:%M:%S%.9fZ");
    lines
        .iter()
        .map(|line| format!("{time} stdout F {line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kind: AgentKind, fault: Fault) -> AgentLogFacts<'static> {
        AgentLogFacts {
            kind: Some(kind),
            fault,
            name: "example.com/gpu",
            image: "plugin:v1",
            pod_uid: "uid-1",
            devices: 8,
        }
    }

    fn at() -> Timestamp {
        "2026-01-02T15:04:05.123456789Z".parse().unwrap()
    }

    #[test]
    fn healthy_agents_start_and_register_with_a_secret_looking_line() {
        let lines = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::Healthy), at());
        assert!(lines[0].starts_with("I0102 15:04:05.123456       1 main.go:112] Starting"));
        assert!(lines.iter().any(|l| l.contains("token=simtok-")));
        let registry = lines
            .iter()
            .find(|l| l.contains("registry credentials"))
            .unwrap();
        for planted in ["@git.sim.invalid", "ghp_", "nvapi-", "AKIA", "eyJ"] {
            assert!(registry.contains(planted), "{registry}");
        }
        assert!(lines.iter().any(|l| l.contains("advertising 8 device(s)")));
        assert!(!lines.iter().any(|l| l.contains(PLUGIN_FATAL)));
        let driver = agent_log_lines(&facts(AgentKind::DraDriver, Fault::Healthy), at());
        assert!(driver.iter().any(|l| l.contains("Registered DRA driver")));
    }

    #[test]
    fn bad_agents_log_their_fatal_lines() {
        let broken = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::Broken), at());
        assert!(
            broken
                .iter()
                .any(|l| l.starts_with('E') && l.contains(PLUGIN_FATAL))
        );
        let broken = agent_log_lines(&facts(AgentKind::DraDriver, Fault::Broken), at());
        assert!(
            broken
                .iter()
                .any(|l| l.contains("failed to register plugin"))
        );
        let crash = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::Crashloop), at());
        assert!(crash.last().unwrap().starts_with('F'));
        assert!(crash.last().unwrap().contains("unknown service"));
        // -fatallog: registers and advertises, yet logs the fatal pattern.
        let fatal = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::FatalLog), at());
        assert!(fatal.iter().any(|l| l.contains(PLUGIN_FATAL)));
        assert!(fatal.iter().any(|l| l.contains("advertising 8")));
        // -noisyfatal: the fatal line only after more than 2 MiB of routine lines.
        let noisy = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::NoisyFatal), at());
        let fatal_at = noisy.iter().position(|l| l.contains(PLUGIN_FATAL)).unwrap();
        let before: usize = noisy[..fatal_at].iter().map(|l| l.len() + 1).sum();
        assert!(before > NOISE_BYTES, "{before}");
        assert_eq!(noisy.iter().filter(|l| l.contains(PLUGIN_FATAL)).count(), 1);
        assert!(noisy.iter().any(|l| l.contains("advertising 8")));
    }

    #[test]
    fn tokens_differ_per_pod() {
        let a = agent_log_lines(&facts(AgentKind::DevicePlugin, Fault::Healthy), at());
        let mut other = facts(AgentKind::DevicePlugin, Fault::Healthy);
        other.pod_uid = "uid-2";
        let b = agent_log_lines(&other, at());
        assert_ne!(a[1], b[1]);
    }

    #[test]
    fn cri_format() {
        let text = cri_log(&["a".into(), "b c".into()], at());
        assert_eq!(
            text,
            "2026-01-02T15:04:05.123456789Z stdout F a\n2026-01-02T15:04:05.123456789Z stdout F b c\n"
        );
    }
}
