//! The test cluster's processes as `tests/cluster/up` started them (its state
//! dir's `pids` and `ports`), for the tests that break the control plane
//! itself: the kube-apiserver killed and started again in place, etcd's
//! revision moved on and its history compacted away.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::{Value, json};

use crate::{keep_cluster, kubectl, parse_name_number_lines};

/// The processes and ports of a cluster `up` started.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    pub(crate) dir: PathBuf,
    pub(crate) kubeconfig: PathBuf,
}

impl ControlPlane {
    /// The state dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn pid(&self, name: &str) -> anyhow::Result<u32> {
        let text = std::fs::read_to_string(self.dir.join("pids"))?;
        parse_name_number_lines(&text)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, pid)| pid)
            .with_context(|| format!("no {name} in {}/pids", self.dir.display()))
    }

    fn port(&self, name: &str) -> anyhow::Result<u16> {
        let text = std::fs::read_to_string(self.dir.join("ports"))?;
        parse_name_number_lines(&text)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, port)| port)
            .with_context(|| format!("no {name} in {}/ports", self.dir.display()))
    }

    /// Where the API server writes its audit log, read from its command line
    /// (`--audit-log-path`): `None` when it keeps none. (Not the file: the
    /// API server creates it on its first logged request.)
    pub fn audit_log(&self) -> anyhow::Result<Option<PathBuf>> {
        let args = command_line(self.pid("kube-apiserver")?)?;
        Ok(args
            .iter()
            .find_map(|a| a.strip_prefix("--audit-log-path="))
            .map(PathBuf::from))
    }

    /// Kills the kube-apiserver (SIGKILL, as an OOM kill or a crash would:
    /// every connection to it drops at once; stopped with SIGTERM it held
    /// its open watches for 30 s before it exited). The returned handle
    /// starts it again, when told or when dropped.
    pub fn kill_api_server(&self) -> anyhow::Result<StoppedApiServer> {
        let pid = self.pid("kube-apiserver")?;
        let args = command_line(pid)?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
        signal(pid, "KILL")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive(pid) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the kube-apiserver ({pid}) outlived SIGKILL for 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(StoppedApiServer {
            plane: self.clone(),
            exe,
            args,
            started: false,
        })
    }

    /// etcd's client API (plain HTTP on loopback).
    pub fn etcd(&self) -> anyhow::Result<Etcd> {
        Ok(Etcd {
            port: self.port("etcd")?,
        })
    }
}

/// A kube-apiserver killed by [`ControlPlane::kill_api_server`].
#[derive(Debug)]
pub struct StoppedApiServer {
    plane: ControlPlane,
    exe: PathBuf,
    /// Its command line, the program's name first.
    args: Vec<String>,
    started: bool,
}

impl StoppedApiServer {
    /// Starts the kube-apiserver again with the same command line, detached
    /// as `up` starts it, its output appended to its log, its PID recorded
    /// for `down` in place of the old one; returns once it is ready
    /// (`/readyz`), with the time that took.
    pub fn start(mut self) -> anyhow::Result<Duration> {
        self.started = true;
        self.start_again()
    }

    fn start_again(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let log_path = self.plane.dir.join("logs/kube-apiserver.log");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log_path)?;
        let child = Command::new("setsid")
            .arg(&self.exe)
            .args(&self.args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting the kube-apiserver again")?;
        let pid = child.id();
        let pids = self.plane.dir.join("pids");
        let text = std::fs::read_to_string(&pids)?;
        let updated: String = text
            .lines()
            .map(|l| match l.split_once(' ') {
                Some(("kube-apiserver", _)) => format!("kube-apiserver {pid}\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&pids, updated)?;
        let deadline = started + Duration::from_secs(120);
        loop {
            if kubectl(&self.plane.kubeconfig, &["get", "--raw", "/readyz"]).is_ok() {
                return Ok(started.elapsed());
            }
            let failed = if !alive(pid) {
                Some("exited")
            } else if Instant::now() > deadline {
                Some("was not ready in 120 s")
            } else {
                None
            };
            if let Some(failed) = failed {
                let why = format!(
                    "the kube-apiserver started again {failed}; see {}",
                    log_path.display()
                );
                keep_cluster(&why);
                bail!(why);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for StoppedApiServer {
    /// A test that failed half-way leaves the cluster serving the next one.
    fn drop(&mut self) {
        if !self.started {
            self.started = true;
            if let Err(e) = self.start_again() {
                eprintln!("starting the kube-apiserver again: {e:#}");
            }
        }
    }
}

/// etcd's JSON gateway to its gRPC API (`/v3/...`), through curl (which
/// `up` already needs).
#[derive(Debug)]
pub struct Etcd {
    port: u16,
}

impl Etcd {
    /// The store's current revision.
    pub fn revision(&self) -> anyhow::Result<i64> {
        header_revision(&self.call("/v3/maintenance/status", json!({}))?)
    }

    /// Writes `value` under `key` and returns the revision it made. A key
    /// outside the API server's `/registry/` changes no object: only the
    /// revision moves on.
    pub fn put(&self, key: &str, value: &str) -> anyhow::Result<i64> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        header_revision(&self.call("/v3/kv/put", json!({"key": b64(key), "value": b64(value)}))?)
    }

    /// Compacts the history before `revision` away (physically: the call
    /// returns once it is applied), then checks that a read at the revision
    /// before is refused as compacted.
    pub fn compact(&self, revision: i64) -> anyhow::Result<()> {
        self.call(
            "/v3/kv/compaction",
            json!({"revision": revision.to_string(), "physical": true}),
        )?;
        let b64 = base64::engine::general_purpose::STANDARD.encode("/registry/");
        match self.call(
            "/v3/kv/range",
            json!({"key": b64, "revision": (revision - 1).to_string(), "count_only": true}),
        ) {
            Err(e) if e.to_string().contains("compacted") => Ok(()),
            other => bail!(
                "a read at revision {} after compacting: {other:?}",
                revision - 1
            ),
        }
    }

    fn call(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let out = Command::new("curl")
            .args(["-sS", "-X", "POST", "-w", "\n%{http_code}", "-d"])
            .arg(body.to_string())
            .arg(format!("http://127.0.0.1:{}{path}", self.port))
            .output()
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (answer, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        if !out.status.success() || code != "200" {
            bail!(
                "etcd {path}: {code} {answer} {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_str(answer)?)
    }
}

/// The revision in an etcd answer's header (int64 fields come as strings).
fn header_revision(answer: &Value) -> anyhow::Result<i64> {
    answer["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .with_context(|| format!("no header revision in {answer}"))
}

fn command_line(pid: u32) -> anyhow::Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("process {pid} is gone"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// Running: not gone and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.starts_with(" Z"))
    })
}
