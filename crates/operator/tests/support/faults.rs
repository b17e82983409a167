//! The fault tests' proxy between the operator and the API server, started
//! for a test and stopped when dropped ([`FaultProxy`]). Both halves are
//! built by tests/tools/build-bins and listen on 127.0.0.1 only:
//!
//! ```text
//! operator --HTTP/1.1--> toxiproxy --TCP--> faultproxy --TLS (admin cert)--> kube-apiserver
//!             (plain)    TCP faults          HTTP faults
//! ```
//!
//! Toxiproxy sits on the operator's side so its TCP faults (latency,
//! bandwidth, resets, timeouts) land on the operator's own connections, as a
//! bad network between the operator and the API server would: a reset breaks
//! the operator's watch or request, not one of faultproxy's multiplexed
//! HTTP/2 streams to the API server, which faultproxy would answer as a 502
//! the real API server never sends. faultproxy then answers as an API server
//! in trouble would (429 with Retry-After, 500, 409, watches gone silent),
//! and otherwise forwards with the admin's client certificate and every
//! header, Impersonate-User included: the operator still acts as its
//! ServiceAccount and RBAC still applies.
//!
//! The test's own client talks to the API server directly, so what the test
//! observes is never faulted.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use kube::config::Kubeconfig;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{TIMEOUT, free_loopback_port, poll, tool};

/// The proxy (Toxiproxy in front of faultproxy) for one test.
pub struct FaultProxy {
    toxiproxy: Child,
    faultproxy: Child,
    /// faultproxy's stdout, kept open: it printed its addresses there.
    _faultproxy_out: BufReader<ChildStdout>,
    /// Toxiproxy's API.
    toxiproxy_api: u16,
    /// faultproxy's control API.
    control: u16,
    /// Where the operator connects (Toxiproxy's listener).
    pub port: u16,
    /// A kubeconfig for the operator that points at the proxy, with no
    /// credentials of its own (the proxy presents the admin's).
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

/// The proxy in Toxiproxy that leads to faultproxy.
const PROXY: &str = "apiserver";

/// What faultproxy counted (its `GET /faults`).
#[derive(Debug, Default, Deserialize)]
pub struct FaultStats {
    /// Requests by verb ("other": not a resource request).
    pub requests: BTreeMap<String, u64>,
    /// Error answers injected, by code.
    pub injected: BTreeMap<String, u64>,
    /// Error answers injected, by "verb resource".
    #[serde(rename = "injectedBy")]
    pub injected_by: BTreeMap<String, u64>,
    /// Watches held silent or silenced open.
    pub blackholed: u64,
}

impl FaultStats {
    pub fn requests_total(&self) -> u64 {
        self.requests.values().sum()
    }

    pub fn injected_total(&self) -> u64 {
        self.injected.values().sum()
    }

    pub fn injected_code(&self, code: u16) -> u64 {
        self.injected
            .get(&code.to_string())
            .copied()
            .unwrap_or_default()
    }
}

impl FaultProxy {
    /// Starts both proxies in front of the API server of `admin_kubeconfig`
    /// (the test cluster's: its server, CA and client certificate), with no
    /// fault set. Logs go to files in [`FaultProxy::dir`].
    pub async fn start(name: &str, admin_kubeconfig: &Path) -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("saferollout-faults-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let admin = AdminConnection::read(admin_kubeconfig)?;

        let faultproxy_log = std::fs::File::create(dir.join("faultproxy.log"))?;
        let mut faultproxy = Command::new(tool("faultproxy"))
            .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"])
            .args(["--upstream", &admin.server])
            .args([
                "--ca",
                &admin.ca,
                "--cert",
                &admin.cert,
                "--key",
                &admin.key,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(faultproxy_log))
            .spawn()
            .context("starting faultproxy")?;
        // Its first line names the ports it bound (no race for a free port).
        let mut out = BufReader::new(faultproxy.stdout.take().context("faultproxy stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        let field = |key: &str| -> anyhow::Result<u16> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(key))
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .with_context(|| format!("no {key} in faultproxy's first line {line:?}"))
        };
        let (faultproxy_port, control) = match (field("proxy="), field("control=")) {
            (Ok(p), Ok(c)) => (p, c),
            (Err(e), _) | (_, Err(e)) => {
                let _ = faultproxy.kill();
                return Err(e);
            }
        };

        let toxiproxy_api = free_loopback_port()?;
        let toxiproxy_log = std::fs::File::create(dir.join("toxiproxy.log"))?;
        let toxiproxy = Command::new(tool("toxiproxy"))
            .args(["-host", "127.0.0.1", "-port", &toxiproxy_api.to_string()])
            .stdout(Stdio::from(toxiproxy_log.try_clone()?))
            .stderr(Stdio::from(toxiproxy_log))
            .spawn()
            .context("starting toxiproxy")?;
        let mut proxy = FaultProxy {
            toxiproxy,
            faultproxy,
            _faultproxy_out: out,
            toxiproxy_api,
            control,
            port: 0,
            kubeconfig: dir.join("kubeconfig"),
            dir,
        };
        poll("toxiproxy's API up", TIMEOUT, || {
            Ok(http_json(toxiproxy_api, "GET", "/version", None)
                .ok()
                .filter(|(code, _)| *code == 200))
        })
        .await?;
        // Port 0: Toxiproxy answers with the address it bound.
        let created = proxy.toxiproxy(
            "POST",
            "/proxies",
            Some(json!({
                "name": PROXY,
                "listen": "127.0.0.1:0",
                "upstream": format!("127.0.0.1:{faultproxy_port}"),
                "enabled": true,
            })),
        )?;
        proxy.port = created["listen"]
            .as_str()
            .and_then(|a| a.strip_prefix("127.0.0.1:"))
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("toxiproxy's proxy: {created}"))?;
        std::fs::write(
            &proxy.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters:\n- name: saferollout-faults\n  cluster: {{server: \"http://127.0.0.1:{}\"}}\n\
                 users:\n- name: through-the-proxy\n  user: {{}}\n\
                 contexts:\n- name: saferollout-faults\n  context: {{cluster: saferollout-faults, user: through-the-proxy}}\n\
                 current-context: saferollout-faults\n",
                proxy.port
            ),
        )?;
        eprintln!(
            "fault proxy: operator -> 127.0.0.1:{} (toxiproxy, API :{toxiproxy_api}) -> 127.0.0.1:{faultproxy_port} (faultproxy, control :{control}) -> {}; logs in {}",
            proxy.port,
            admin.server,
            proxy.dir.display()
        );
        Ok(proxy)
    }

    /// A kubeconfig through the proxy that impersonates `user` with the
    /// extra field `key: value`: two clients of the same user, each through
    /// its own proxy, are told apart in the API server's audit log by it
    /// (the extra grants nothing: RBAC binds the user).
    pub fn kubeconfig_as(&self, user: &str, key: &str, value: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("kubeconfig-{value}"));
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "saferollout-faults",
                "cluster": {"server": format!("http://127.0.0.1:{}", self.port)}}],
            "users": [{"name": "through-the-proxy",
                "user": {"as": user, "as-user-extra": {key: [value]}}}],
            "contexts": [{"name": "saferollout-faults",
                "context": {"cluster": "saferollout-faults", "user": "through-the-proxy"}}],
            "current-context": "saferollout-faults",
        });
        // JSON is YAML: kubeconfig readers take it as is.
        std::fs::write(&path, config.to_string())?;
        Ok(path)
    }

    /// Delays everything the API server sends back by `ms` ± `jitter_ms`
    /// (uniform; each chunk of a watch too), replacing an earlier latency.
    pub fn set_latency(&self, ms: u64, jitter_ms: u64) -> anyhow::Result<()> {
        self.set_toxic(
            "latency",
            "latency",
            "downstream",
            1.0,
            json!({"latency": ms, "jitter": jitter_ms}),
        )
    }

    /// Limits what the API server sends back to `kb_per_s` KB/s.
    pub fn set_bandwidth(&self, kb_per_s: u64) -> anyhow::Result<()> {
        self.set_toxic(
            "bandwidth",
            "bandwidth",
            "downstream",
            1.0,
            json!({"rate": kb_per_s}),
        )
    }

    /// Resets (TCP RST) a `toxicity` fraction of the operator's connections,
    /// `after_ms` after they send data.
    pub fn set_resets(&self, toxicity: f64, after_ms: u64) -> anyhow::Result<()> {
        self.set_toxic(
            "reset",
            "reset_peer",
            "upstream",
            toxicity,
            json!({"timeout": after_ms}),
        )
    }

    /// Stops all data on a `toxicity` fraction of the connections and closes
    /// them after `ms` (0: holds them until the toxic is removed).
    pub fn set_timeouts(&self, toxicity: f64, ms: u64) -> anyhow::Result<()> {
        self.set_toxic(
            "timeout",
            "timeout",
            "upstream",
            toxicity,
            json!({"timeout": ms}),
        )
    }

    /// Adds (or replaces) a Toxiproxy toxic.
    pub fn set_toxic(
        &self,
        name: &str,
        kind: &str,
        stream: &str,
        toxicity: f64,
        attributes: Value,
    ) -> anyhow::Result<()> {
        self.remove_toxic(name)?;
        self.toxiproxy(
            "POST",
            &format!("/proxies/{PROXY}/toxics"),
            Some(json!({
                "name": name, "type": kind, "stream": stream,
                "toxicity": toxicity, "attributes": attributes,
            })),
        )?;
        Ok(())
    }

    pub fn remove_toxic(&self, name: &str) -> anyhow::Result<()> {
        let (code, body) = http_json(
            self.toxiproxy_api,
            "DELETE",
            &format!("/proxies/{PROXY}/toxics/{name}"),
            None,
        )?;
        // 404: there was none.
        anyhow::ensure!(
            code == 204 || code == 404,
            "toxiproxy: removing {name}: {code} {body}"
        );
        Ok(())
    }

    /// Answers a `fraction` of the requests of `verbs` on `resources` (empty:
    /// all) with one of `codes` (409, 429, 500, 503, 504) instead of the API
    /// server; adds to the rules already set.
    pub fn errors(
        &self,
        fraction: f64,
        codes: &[u16],
        verbs: &[&str],
        resources: &[&str],
    ) -> anyhow::Result<()> {
        self.error_rule(json!({
            "fraction": fraction, "codes": codes, "verbs": verbs, "resources": resources,
        }))
    }

    /// Answers the next `count` requests of `verbs` on `resources` with one
    /// of `codes`.
    pub fn burst(
        &self,
        count: u32,
        codes: &[u16],
        verbs: &[&str],
        resources: &[&str],
    ) -> anyhow::Result<()> {
        self.error_rule(json!({
            "fraction": 1.0, "count": count, "codes": codes, "verbs": verbs, "resources": resources,
        }))
    }

    /// Adds a faultproxy error rule as is (see tests/faultproxy/main.go:
    /// `retryAfterSeconds`, `after`, ...).
    pub fn error_rule(&self, rule: Value) -> anyhow::Result<()> {
        self.control("POST", "/errors", Some(rule))?;
        Ok(())
    }

    /// Watches of `resources` ("pods", "nodes", ...) go silent and stay open:
    /// new ones get their headers and nothing more, open ones deliver
    /// nothing more, for good.
    pub fn blackhole_watch(&self, resources: &[&str]) -> anyhow::Result<()> {
        self.control("PUT", "/blackhole", Some(json!({"resources": resources})))?;
        Ok(())
    }

    /// Removes every fault: the toxics, the error rules and the blackhole
    /// (watches silenced already stay silent until their client leaves).
    pub fn clear(&self) -> anyhow::Result<()> {
        let toxics = self.toxiproxy("GET", &format!("/proxies/{PROXY}/toxics"), None)?;
        for t in toxics.as_array().into_iter().flatten() {
            if let Some(name) = t["name"].as_str() {
                self.remove_toxic(name)?;
            }
        }
        self.control("POST", "/clear", None)?;
        Ok(())
    }

    /// What faultproxy counted so far.
    pub fn stats(&self) -> anyhow::Result<FaultStats> {
        let faults = self.control("GET", "/faults", None)?;
        Ok(serde_json::from_value(faults["stats"].clone())?)
    }

    fn toxiproxy(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        json_answer("toxiproxy", self.toxiproxy_api, method, path, body)
    }

    fn control(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        json_answer("faultproxy", self.control, method, path, body)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for child in [&mut self.toxiproxy, &mut self.faultproxy] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The admin's connection to the API server, from its kubeconfig.
struct AdminConnection {
    server: String,
    ca: String,
    cert: String,
    key: String,
}

impl AdminConnection {
    fn read(kubeconfig: &Path) -> anyhow::Result<Self> {
        let config = Kubeconfig::read_from(kubeconfig)?;
        let context = config
            .contexts
            .iter()
            .find(|c| Some(&c.name) == config.current_context.as_ref())
            .and_then(|c| c.context.as_ref())
            .context("the kubeconfig's current context")?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .context("the context's cluster")?;
        let user = config
            .auth_infos
            .iter()
            .find(|u| Some(&u.name) == context.user.as_ref())
            .and_then(|u| u.auth_info.as_ref())
            .context("the context's user")?;
        let (Some(server), Some(ca), Some(cert), Some(key)) = (
            cluster.server.clone(),
            cluster.certificate_authority.clone(),
            user.client_certificate.clone(),
            user.client_key.clone(),
        ) else {
            bail!(
                "{}: the fault proxy needs a server, a CA file and a client certificate and key file",
                kubeconfig.display()
            );
        };
        Ok(AdminConnection {
            server,
            ca,
            cert,
            key,
        })
    }
}

/// An HTTP/1.0 request with a JSON body to 127.0.0.1:`port`: (status, body).
fn http_json(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, String)> {
    let body = body.map(|b| b.to_string());
    super::http_request(port, method, path, body.as_deref())
}

/// The JSON answer of a successful (2xx) request; `null` for an empty one.
fn json_answer(
    what: &str,
    port: u16,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let (code, text) = http_json(port, method, path, body.as_ref())?;
    anyhow::ensure!(
        (200..300).contains(&code),
        "{what}: {method} {path}: {code} {text}"
    );
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).with_context(|| format!("{what}: {method} {path}: {text}"))
}
