//! Command line of `saferollout-sim`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::model::Timings;

/// Plays accelerator agents (device plugin, DRA driver) for pods labelled
/// `sim.saferollout.dev/agent` on KWOK nodes: writes their pod status,
/// advertises their devices on the node and publishes their ResourceSlices.
#[derive(Clone, Debug, Parser)]
#[command(name = "saferollout-sim", version)]
pub struct Args {
    /// Kubeconfig file; without it, KUBECONFIG or the in-cluster config.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Delay of the simulated kubelet node-status update: how long after a
    /// plugin stops its allocatable drops to 0 and its slice is deleted.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub status_delay: Duration,

    /// How long a stopped plugin's resource stays in node capacity.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub endpoint_stop_grace: Duration,

    /// How long `-slow` agents take to become Ready and advertise.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = parse_duration)]
    pub slow_delay: Duration,

    /// How often `-flap` agents switch between advertising and not.
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = parse_positive_duration)]
    pub flap_period: Duration,

    /// How long devices read Unknown in workload pods'
    /// allocatedResourcesStatus after their agent stops serving (the
    /// kubelet's DRA health cache waits 30s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub health_handover: Duration,

    /// How long run-to-completion workload pods (restartPolicy Never or
    /// OnFailure) run before they succeed or fail.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub workload_run_time: Duration,

    /// Directory for container log files, served by KWOK's kubelet server
    /// through a KWOK `Logs` object per pod (KWOK needs --enable-crds=Logs).
    /// Without it no logs are written.
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,

    /// Address to serve DCGM-style per-GPU metrics on (`/metrics`), e.g.
    /// 127.0.0.1:9400. Without it no metrics are served.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl Args {
    pub fn timings(&self) -> Timings {
        Timings {
            status_delay: self.status_delay,
            endpoint_stop_grace: self.endpoint_stop_grace,
            slow_delay: self.slow_delay,
            flap_period: self.flap_period,
            health_handover: self.health_handover,
            workload_run_time: self.workload_run_time,
            ..Timings::default()
        }
    }

    pub fn outputs(&self) -> crate::cluster::Outputs {
        crate::cluster::Outputs {
            pod_logs_dir: self.pod_logs_dir.clone(),
            metrics_addr: self.metrics_addr,
        }
    }
}

/// Parses durations such as `1s`, `500ms`, `1m30s`, `1.5h` or `0`.
/// Units: `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let value: f64 = number.parse().map_err(|_| {
            format!("invalid duration {text:?}: expected a number, found {number:?}")
        })?;
        let seconds_per_unit = match unit.trim() {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit (e.g. 1s, 500ms)"
                ));
            }
            other => return Err(format!("invalid duration {text:?}: unknown unit {other:?}")),
        };
        total += value * seconds_per_unit;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be longer than 0".into()),
        duration => Ok(duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let cases = [
            ("1s", Duration::from_secs(1)),
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("2h", Duration::from_secs(7200)),
            ("250us", Duration::from_micros(250)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 4s ", Duration::from_secs(4)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        for bad in ["", "s", "5", "5x", "1..5s", "-1s", "1s2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cli_defaults_and_flags() {
        let defaults = Args::try_parse_from(["saferollout-sim"]).unwrap();
        assert_eq!(defaults.kubeconfig, None);
        let timings = defaults.timings();
        assert_eq!(timings.status_delay, Duration::from_secs(1));
        assert_eq!(timings.endpoint_stop_grace, Duration::from_secs(30));
        assert_eq!(timings.slow_delay, Duration::from_secs(20));
        assert_eq!(timings.flap_period, Duration::from_secs(4));
        assert_eq!(timings.health_handover, Duration::from_secs(5));
        assert_eq!(timings.workload_run_time, Duration::from_secs(1));
        assert_eq!(defaults.pod_logs_dir, None);
        assert_eq!(defaults.metrics_addr, None);

        let args = Args::try_parse_from([
            "saferollout-sim",
            "--kubeconfig",
            "/tmp/kc",
            "--status-delay",
            "200ms",
            "--endpoint-stop-grace=5s",
            "--slow-delay",
            "3s",
            "--flap-period",
            "1s",
            "--health-handover=2s",
            "--workload-run-time=500ms",
            "--pod-logs-dir=/tmp/logs",
            "--metrics-addr=127.0.0.1:9400",
        ])
        .unwrap();
        assert_eq!(args.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(args.status_delay, Duration::from_millis(200));
        assert_eq!(args.endpoint_stop_grace, Duration::from_secs(5));
        assert_eq!(args.slow_delay, Duration::from_secs(3));
        assert_eq!(args.flap_period, Duration::from_secs(1));
        assert_eq!(args.health_handover, Duration::from_secs(2));
        assert_eq!(args.workload_run_time, Duration::from_millis(500));
        assert_eq!(args.pod_logs_dir, Some(PathBuf::from("/tmp/logs")));
        assert_eq!(args.metrics_addr, Some("127.0.0.1:9400".parse().unwrap()));
        assert!(Args::try_parse_from(["saferollout-sim", "--metrics-addr", "localhost"]).is_err());

        assert!(Args::try_parse_from(["saferollout-sim", "--flap-period", "0s"]).is_err());
        assert!(Args::try_parse_from(["saferollout-sim", "--slow-delay", "soon"]).is_err());
    }
}
