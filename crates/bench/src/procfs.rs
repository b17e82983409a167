//! Memory and CPU of a process, from /proc.

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcStat {
    /// Resident set size now, MiB.
    pub rss_mib: f64,
    /// Peak resident set size since the process started (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// User + system CPU time since the process started, seconds.
    pub cpu_secs: f64,
}

/// Clock ticks per second of /proc/<pid>/stat times.
fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

pub fn read(pid: u32) -> anyhow::Result<ProcStat> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse(&status, &stat, ticks_per_second())
}

/// Parses /proc/<pid>/status (VmRSS, VmHWM) and /proc/<pid>/stat (utime, stime).
pub fn parse(status: &str, stat: &str, ticks: f64) -> anyhow::Result<ProcStat> {
    let kib = |field: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .with_context(|| format!("no {field} in /proc status"))?;
        let n: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("bad line {line:?}"))?;
        Ok(n)
    };
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("bad /proc stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    let tick = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .context("bad /proc stat times")
    };
    Ok(ProcStat {
        rss_mib: kib("VmRSS:")? / 1024.0,
        peak_rss_mib: kib("VmHWM:")? / 1024.0,
        cpu_secs: (tick(11)? + tick(12)?) / ticks,
    })
}

/// The 1-minute load average of the machine.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tx\nVmHWM:\t  20480 kB\nVmRSS:\t   10240 kB\n";
        let stat =
            "42 (saferollout op) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 100 0 0";
        let s = parse(status, stat, 100.0).unwrap();
        assert_eq!(s.rss_mib, 10.0);
        assert_eq!(s.peak_rss_mib, 20.0);
        assert_eq!(s.cpu_secs, 3.0);
        assert!(parse("Name: x\n", stat, 100.0).is_err());
    }

    #[test]
    fn reads_this_process() {
        let s = read(std::process::id()).unwrap();
        assert!(s.rss_mib > 0.0 && s.peak_rss_mib >= s.rss_mib);
    }
}
