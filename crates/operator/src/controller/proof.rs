//! The runtime of the probe, logs and prometheus gates: reading what they
//! observe before each decision, as `saferollout_core::pass::needs` says
//! (which pods, logs and queries, and when), and creating and deleting
//! probe pods.
//!
//! - Probe pods come from a label-selected watch of the operator's own probe
//!   pods (`caches.probe_pods`); a failed probe's last log lines are read
//!   once (`pods/log`, tail, size-limited).
//! - Agent logs are read through `pods/log` for the target pods on the
//!   nodes status holds, each at most every `interval` while its window is
//!   open and once after it closed, at most 4 at a time, each with a
//!   timeout. Each read streams the log through the pure reader of
//!   `saferollout_core::gates::log_reader`, which goes on from where the
//!   last read stopped and scans at most 1 MiB of new lines with the
//!   patterns of `saferollout_core::gates::logs`; a read that stops at its
//!   bound is followed at once, so the whole window is read whatever the
//!   log's size. Only the scan result and the position (a few numbers and
//!   at most 4 KiB of an unfinished line) are kept per pod.
//! - Prometheus queries run beside the passes, never in them: when one is
//!   due (`pass::needs`: `prometheus::due`, from the tally in status, at most
//!   once per interval per gate, one at a time) and every node the rollout holds runs
//!   a Ready new agent, a task runs it and wakes the rollout with its
//!   measurement, which the next pass hands to the gate; so a slow or
//!   hostile server never delays a revert. Only addresses the operator's
//!   limits allow are dialled, a Secret is read (by name) only for an
//!   address it is bound to, and a token only goes over https; the answer is
//!   read up to 4 MiB and 10,000 samples within the gate's timeout (at most
//!   30 s), and what a server says goes to status truncated and masked.
//!
//! Re-checks are requeues the gates ask for; nothing here loops or sleeps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{AsyncReadExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, LogParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use saferollout_api::{
    FIELD_MANAGER, LogsGate, PROBE_NODE_LABEL, PrometheusGate, SafeRollout, SafeRolloutSpec,
    SecretKeyRef,
};
use saferollout_core::gates::log_reader::{LogCursor, LogPass, READ_LIMIT, ReadEnd};
use saferollout_core::gates::logs::Patterns;
use saferollout_core::gates::probe::{self, ProbePodParams, ProbeRequest};
use saferollout_core::gates::proof::{
    LogObservation, LogRead, Measurement, MeasurementOutcome, ProbePod, ProofEvidence, Sample,
    clean_line, clean_lines,
};
use saferollout_core::pass::needs::{LogMemo, LogNeed, Measurements, Needs, Remembered};
use tracing::{debug, info, warn};

use super::error::Result;
use super::snapshot::World;
use super::{Context, RolloutKey};

/// Reads of pods/log at once.
const LOG_READS: usize = 4;
/// Longest wait for one log read.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of one read of an agent log's stream at a time.
const LOG_CHUNK: usize = 64 << 10;
/// Lines of a failed probe's log kept.
const PROBE_TAIL_LINES: i64 = 5;

/// What the operator remembers between passes (losing it costs a re-read).
#[derive(Default)]
pub struct Memory {
    /// Per agent pod UID: what its log showed, when it was last read, and
    /// how far (the next read goes on from there).
    logs: HashMap<String, LogMemory>,
    /// Per failed probe pod UID: its last log lines, cleaned.
    probe_tails: HashMap<String, String>,
    /// Per probe pod name: why creating it failed.
    probe_errors: BTreeMap<String, String>,
    /// Per prometheus gate: when it was last queried.
    queried: HashMap<String, Instant>,
    /// Per prometheus gate: the last measurement a query task finished, and
    /// what it measured (`<revision>/<stage>/<query>`, its nodes in the
    /// measurement): one of another rollout, stage or query is never handed in.
    measured: HashMap<String, (String, Measurement)>,
    /// Per prometheus gate: the query task under way.
    in_flight: HashMap<String, tokio::task::JoinHandle<()>>,
}

/// What the operator remembers of one agent pod's log.
#[derive(Clone)]
struct LogMemory {
    obs: LogObservation,
    read_at: Instant,
    cursor: LogCursor,
    /// The patterns the cursor's lines were scanned with: other patterns
    /// (the gate was edited) scan the log again from its start.
    patterns: u64,
}

/// A fingerprint of the logs gate's patterns.
fn patterns_of(gate: &LogsGate) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?}", gate.builtin).hash(&mut h);
    gate.patterns.hash(&mut h);
    h.finish()
}

impl Memory {
    /// What the proof gates' earlier reads left, as
    /// `saferollout_core::pass::needs` weighs it.
    pub fn remembered<'a>(&'a self, spec: &SafeRolloutSpec) -> Remembered<'a> {
        let patterns = spec.logs_gate().map(patterns_of);
        Remembered {
            dry_run: None,
            logs: (self.logs.iter())
                .map(|(uid, k)| {
                    let memo = LogMemo {
                        observed: &k.obs,
                        since_read: k.read_at.elapsed(),
                        same_patterns: patterns == Some(k.patterns),
                    };
                    (uid.as_str(), memo)
                })
                .collect(),
            queried: (self.queried.iter())
                .map(|(gate, at)| (gate.as_str(), at.elapsed()))
                .collect(),
            querying: (self.in_flight.iter())
                .filter(|(_, task)| !task.is_finished())
                .map(|(gate, _)| gate.as_str())
                .collect(),
        }
    }
}

impl Drop for Memory {
    /// A forgotten rollout (deleted, or this replica no longer leads) stops
    /// its queries.
    fn drop(&mut self) {
        for task in self.in_flight.values() {
            task.abort();
        }
    }
}

/// Everything the three gates observe for `sr` now: what `needs` says
/// (see `saferollout_core::pass::needs`).
pub async fn gather(
    sr: &SafeRollout,
    ctx: &Arc<Context>,
    key: &RolloutKey,
    needs: &Needs,
    now: Timestamp,
) -> ProofEvidence {
    let mut evidence = ProofEvidence::default();
    if needs.probe_pods {
        evidence.probe_pods = probe_pods(ctx, key).await;
        evidence.probe_errors = ctx.memory(key, |m| m.proof.probe_errors.clone());
    }
    if let (Some(gate), Some(logs)) = (sr.spec.logs_gate(), &needs.logs) {
        evidence.agent_logs = agent_logs(ctx, key, gate, logs, now).await;
    }
    if let Some(wanted) = &needs.prometheus {
        evidence.measurements = measurements(ctx, key, wanted, now);
    }
    evidence
}

async fn probe_pods(ctx: &Context, key: &RolloutKey) -> Vec<ProbePod> {
    let pods = ctx.caches.probe_pods_of(&key.0, &ctx.rollout_id(key));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let mut out = Vec::with_capacity(pods.len());
    for pod in pods {
        let mut view = probe_view(&pod);
        if view.phase == "Failed" {
            let cached = ctx.memory(key, |m| m.proof.probe_tails.get(&view.uid).cloned());
            let tail = match cached {
                Some(t) => t,
                None => {
                    let t = read_tail(&api, &pod).await;
                    ctx.memory(key, |m| {
                        m.proof.probe_tails.insert(view.uid.clone(), t.clone())
                    });
                    t
                }
            };
            view.log_tail = Some(tail);
        }
        out.push(view);
    }
    // Forget tails of pods that are gone.
    let alive: Vec<String> = out.iter().map(|p| p.uid.clone()).collect();
    ctx.memory(key, |m| {
        m.proof.probe_tails.retain(|uid, _| alive.contains(uid))
    });
    out
}

/// A probe pod as the gate sees it (no environment, no spec beyond its node).
pub fn probe_view(pod: &Pod) -> ProbePod {
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    let terminated = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let waiting = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    let unschedulable = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .map(|c| {
            (
                c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
                c.message.clone().unwrap_or_default(),
            )
        });
    ProbePod {
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        node: pod
            .labels()
            .get(PROBE_NODE_LABEL)
            .cloned()
            .unwrap_or_default(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        unschedulable,
        waiting_reason: waiting.and_then(|w| w.reason.clone()),
        exit_code: terminated.map(|t| t.exit_code),
        terminated_reason: terminated.and_then(|t| t.reason.clone()),
        terminated_message: terminated.and_then(|t| t.message.clone()),
        message: status.and_then(|s| s.message.clone()),
        log_tail: None,
    }
}

/// The last lines of a probe's log, cleaned (secrets masked, truncated).
async fn read_tail(api: &Api<Pod>, pod: &Pod) -> String {
    let params = LogParams {
        container: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone()),
        tail_lines: Some(PROBE_TAIL_LINES),
        limit_bytes: Some(16 * 1024),
        ..Default::default()
    };
    match tokio::time::timeout(LOG_TIMEOUT, api.logs(&pod.name_any(), &params)).await {
        Ok(Ok(text)) => clean_lines(&text, PROBE_TAIL_LINES as usize),
        Ok(Err(e)) => format!("(log unreadable: {})", clean_line(&e.to_string())),
        Err(_) => "(log unreadable: timed out)".into(),
    }
}

/// Reads the agent logs `logs` says are due, each from where its last read
/// stopped (or from its start); the others' last observations stand.
async fn agent_logs(
    ctx: &Context,
    key: &RolloutKey,
    gate: &LogsGate,
    logs: &[LogNeed],
    now: Timestamp,
) -> BTreeMap<String, LogObservation> {
    let patterns = match Patterns::of(gate) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            warn!(ns = %key.0, name = %key.1, error = %e, "logs gate patterns do not compile");
            return BTreeMap::new();
        }
    };
    let fingerprint = patterns_of(gate);
    let mut remembered = ctx.memory(key, |m| {
        let uids: HashSet<&str> = logs.iter().map(|l| l.uid.as_str()).collect();
        m.proof.logs.retain(|uid, _| uids.contains(uid.as_str()));
        m.proof.logs.clone()
    });
    let mut out = BTreeMap::new();
    let mut to_read = Vec::new();
    for need in logs {
        let known = remembered.remove(&need.uid).filter(|_| !need.from_start);
        let (obs, cursor) = match known {
            Some(k) => (k.obs, k.cursor),
            None => (
                LogObservation {
                    pod: need.pod.clone(),
                    started_at: need.started,
                    read: LogRead::Unread,
                },
                LogCursor::default(),
            ),
        };
        if need.read {
            to_read.push((need, obs, cursor));
        } else {
            out.insert(need.uid.clone(), obs);
        }
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let reads = futures::stream::iter(to_read.into_iter().map(|(need, obs, cursor)| {
        let (api, patterns) = (api.clone(), patterns.clone());
        async move {
            let (cursor, read) = read_log(
                &api,
                &need.pod,
                need.container.clone(),
                &patterns,
                cursor,
                need.window_end,
                now,
                &obs.read,
            )
            .await;
            if let LogRead::Matched(m) = &read {
                info!(pod = %need.pod, pattern = %m.pattern, "agent log matched a fatal pattern");
            }
            (need.uid.clone(), LogObservation { read, ..obs }, cursor)
        }
    }))
    .buffer_unordered(LOG_READS)
    .collect::<Vec<_>>()
    .await;
    let read_now = Instant::now();
    ctx.memory(key, |m| {
        for (uid, obs, cursor) in &reads {
            m.proof.logs.insert(
                uid.clone(),
                LogMemory {
                    obs: obs.clone(),
                    read_at: read_now,
                    cursor: cursor.clone(),
                    patterns: fingerprint,
                },
            );
        }
    });
    out.extend(reads.into_iter().map(|(uid, obs, _)| (uid, obs)));
    out
}

/// One read of an agent's log, going on from `cursor` (see
/// `saferollout_core::gates::log_reader`): the log since the cursor's
/// second, with timestamps, streamed through the reader, which skips what
/// earlier reads scanned and scans at most `READ_LIMIT` new bytes, all
/// within `LOG_TIMEOUT`. What a read that breaks off scanned still counts.
#[allow(clippy::too_many_arguments)]
async fn read_log(
    api: &Api<Pod>,
    pod: &str,
    container: Option<String>,
    patterns: &Patterns,
    cursor: LogCursor,
    window_end: Option<Timestamp>,
    now: Timestamp,
    before: &LogRead,
) -> (LogCursor, LogRead) {
    let params = LogParams {
        container,
        since_time: cursor.since,
        timestamps: true,
        limit_bytes: Some(i64::try_from(cursor.request_bytes(READ_LIMIT)).unwrap_or(i64::MAX)),
        ..Default::default()
    };
    let mut pass = LogPass::new(patterns, cursor, window_end, READ_LIMIT);
    let deadline = tokio::time::Instant::now() + LOG_TIMEOUT;
    let streamed: std::result::Result<bool, String> = async {
        let stream = tokio::time::timeout_at(deadline, api.log_stream(pod, &params))
            .await
            .map_err(|_| format!("reading the log timed out after {LOG_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let mut stream = std::pin::pin!(stream);
        let mut chunk = vec![0u8; LOG_CHUNK];
        loop {
            let n = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
                .await
                .map_err(|_| format!("reading the log timed out after {LOG_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Ok(true);
            }
            if pass.feed(&chunk[..n]) {
                return Ok(false);
            }
        }
    }
    .await;
    let (cursor, end) = pass.finish(streamed == Ok(true));
    let read = match (end, streamed) {
        (ReadEnd::Matched(m), _) => LogRead::Matched(m),
        (ReadEnd::WindowRead, _) => LogRead::Clean {
            at: window_end.map_or(now, |e| e.max(now)),
        },
        (ReadEnd::CaughtUp, _) => LogRead::Clean { at: now },
        (ReadEnd::Behind | ReadEnd::Resync, _) => LogRead::Behind { at: now },
        (ReadEnd::Interrupted, result) => LogRead::Unreadable {
            error: result.err().unwrap_or_else(|| "the log ended early".into()),
            clean_at: match before {
                LogRead::Clean { at } => Some(*at),
                LogRead::Unreadable { clean_at, .. } => *clean_at,
                _ => None,
            },
        },
    };
    (cursor, read)
}

/// Starts the prometheus queries `wanted` says are due (each in a task of
/// its own) and hands in the measurements the tasks finished, those of
/// what each gate measures now.
fn measurements(
    ctx: &Arc<Context>,
    key: &RolloutKey,
    wanted: &Measurements,
    now: Timestamp,
) -> BTreeMap<String, Measurement> {
    for q in &wanted.queries {
        let task = {
            let (ctx, key, q) = (ctx.clone(), key.clone(), q.clone());
            tokio::spawn(async move {
                let outcome = query_prometheus(&ctx, &key.0, &q.gate, &q.query).await;
                debug!(ns = %key.0, gate = %q.name, ?outcome, "prometheus measurement");
                let m = Measurement {
                    at: now,
                    stage_nodes: q.stage_nodes,
                    outcome,
                };
                ctx.memory(&key, |mem| {
                    mem.proof.measured.insert(q.name, (q.subject, m))
                });
                ctx.triggers.send(
                    kube::runtime::reflector::ObjectRef::new(&key.1).within(&key.0),
                    super::caches::triggers::Cause::Measurement,
                );
            })
        };
        ctx.memory(key, |m| {
            m.proof.queried.insert(q.name.clone(), Instant::now());
            m.proof.in_flight.insert(q.name.clone(), task);
        });
    }
    ctx.memory(key, |m| {
        m.proof
            .measured
            .retain(|g, (of, _)| wanted.subjects.get(g) == Some(of));
        m.proof
            .measured
            .iter()
            .map(|(g, (_, m))| (g.clone(), m.clone()))
            .collect()
    })
}

/// Most of a Prometheus answer the operator reads: a larger one is
/// inconclusive (a healthy instant query over a fleet is far smaller).
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Most samples of one answer.
pub const MAX_SAMPLES: usize = 10_000;

/// One instant query, within the operator's limits; every failure is an
/// inconclusive outcome with a message that carries no credential.
pub async fn query_prometheus(
    ctx: &Context,
    ns: &str,
    gate: &PrometheusGate,
    query: &str,
) -> MeasurementOutcome {
    // The pass refuses such a spec (InvalidSpec); checked again here, before
    // any Secret is read or any address dialled.
    if let Some(refusal) = saferollout_core::limits::refusals_of_prometheus(gate, &ctx.limits) {
        return MeasurementOutcome::Error(refusal);
    }
    let token = match &gate.bearer_token_secret {
        Some(r) => match secret_value(ctx, ns, r).await {
            Ok(v) => Some(v),
            Err(e) => return MeasurementOutcome::Error(e),
        },
        None => None,
    };
    let ca = match gate.tls.as_ref().and_then(|t| t.ca_secret.as_ref()) {
        Some(r) => match secret_value(ctx, ns, r).await {
            Ok(v) => Some(v),
            Err(e) => return MeasurementOutcome::Error(e),
        },
        None => None,
    };
    let timeout = gate.timeout.to_std().unwrap_or(Duration::from_secs(10));
    query_with(
        &gate.address,
        query,
        timeout,
        token.as_deref(),
        ca.as_deref(),
    )
    .await
}

/// Reads one key of a Secret (by name: `get`, never `list`).
async fn secret_value(
    ctx: &Context,
    ns: &str,
    r: &SecretKeyRef,
) -> std::result::Result<Vec<u8>, String> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = api.get(&r.name).await.map_err(|e| {
        format!(
            "cannot read Secret {:?}: {}",
            r.name,
            match e {
                kube::Error::Api(s) => format!("{} ({})", s.reason, s.code),
                other => clean_line(&other.to_string()),
            }
        )
    })?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .map(|b| b.0.clone())
        .ok_or_else(|| format!("Secret {:?} has no key {:?}", r.name, r.key))
}

/// The query against `address` (POST `/api/v1/query`), with an optional
/// bearer token (https only) and CA bundle (PEM); at most `timeout` (and
/// never more than the schema's 30 s) for the whole exchange, the answer
/// read up to [`MAX_ANSWER_BYTES`].
pub async fn query_with(
    address: &str,
    query: &str,
    timeout: Duration,
    token: Option<&[u8]>,
    ca_pem: Option<&[u8]>,
) -> MeasurementOutcome {
    let timeout = timeout.min(saferollout_api::proof::max_prometheus_timeout());
    if token.is_some() && !address.starts_with("https://") {
        return MeasurementOutcome::Error("a bearer token is sent only over https".into());
    }
    let client = match http_client(timeout, token, ca_pem) {
        Ok(c) => c,
        Err(e) => return MeasurementOutcome::Error(e),
    };
    let url = format!("{}/api/v1/query", address.trim_end_matches('/'));
    let secs = format!("{}s", timeout.as_secs().max(1));
    let exchange = async {
        let mut answer = client
            .post(&url)
            .form(&[("query", query), ("timeout", secs.as_str())])
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let code = answer.status();
        if answer
            .content_length()
            .is_some_and(|l| l > MAX_ANSWER_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(|e| describe(&e))? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok((code, body))
    };
    let (code, body) = match tokio::time::timeout(timeout, exchange).await {
        Err(_) => {
            return MeasurementOutcome::Error(format!("the query timed out after {timeout:?}"));
        }
        Ok(Err(e)) => return MeasurementOutcome::Error(e),
        Ok(Ok(answer)) => answer,
    };
    parse_answer(code.as_u16(), &body)
}

fn too_large() -> String {
    format!(
        "the answer exceeds {} MiB; the operator stopped reading it",
        MAX_ANSWER_BYTES >> 20
    )
}

/// The Prometheus HTTP API's answer to an instant query.
#[derive(serde::Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<AnswerData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum AnswerData {
    Vector(Vec<VectorSample>),
    Scalar((f64, String)),
    Matrix(serde::de::IgnoredAny),
    String(serde::de::IgnoredAny),
}

#[derive(serde::Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// A sample's value as Prometheus writes it (`"1"`, `"NaN"`, `"+Inf"`).
fn sample_value(v: &str) -> f64 {
    v.parse().unwrap_or(f64::NAN)
}

/// The samples of an answer, or what was wrong with it (cleaned: a server's
/// words reach status).
fn parse_answer(code: u16, body: &[u8]) -> MeasurementOutcome {
    let answer: Answer = match serde_json::from_slice(body) {
        Ok(a) => a,
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            return MeasurementOutcome::Error(clean_line(&format!(
                "the server answered {code} and not the Prometheus API: {text}"
            )));
        }
    };
    if answer.status != "success" || !(200..300).contains(&code) {
        return MeasurementOutcome::Error(clean_line(&format!(
            "Prometheus answered {code}: {}: {}",
            answer.error_type.as_deref().unwrap_or("error"),
            answer.error.as_deref().unwrap_or("no error message")
        )));
    }
    match answer.data {
        Some(AnswerData::Vector(v)) if v.len() > MAX_SAMPLES => MeasurementOutcome::Error(format!(
            "the query returned {} samples, more than {MAX_SAMPLES}: aggregate it (e.g. max by (node))",
            v.len()
        )),
        Some(AnswerData::Vector(v)) => MeasurementOutcome::Samples(
            v.into_iter()
                .map(|s| Sample {
                    labels: s.metric,
                    value: sample_value(&s.value.1),
                })
                .collect(),
        ),
        Some(AnswerData::Scalar((_, v))) => MeasurementOutcome::Samples(vec![Sample {
            labels: BTreeMap::new(),
            value: sample_value(&v),
        }]),
        Some(AnswerData::Matrix(_)) | Some(AnswerData::String(_)) => MeasurementOutcome::Error(
            "the query returned a range vector or a string; use an instant vector or scalar".into(),
        ),
        None => MeasurementOutcome::Error("Prometheus answered success without data".into()),
    }
}

/// An error without anything a request carried (no headers, no token).
fn describe(e: &reqwest::Error) -> String {
    // reqwest's message names the URL (not the headers); cut to one line.
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "request failed"
    };
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    clean_line(&format!("{what}: {text}"))
}

fn http_client(
    timeout: Duration,
    token: Option<&[u8]>,
    ca_pem: Option<&[u8]>,
) -> std::result::Result<reqwest::Client, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("the CA bundle is not PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("a CA certificate is not usable: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the CA bundle holds no certificate".into());
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        let t = std::str::from_utf8(t)
            .map_err(|_| "the bearer token is not UTF-8".to_string())?
            .trim();
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| "the bearer token is not a valid header value".to_string())?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    // The whole exchange is bounded by the caller's timeout (its message
    // says so); connecting alone by the same.
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .default_headers(headers)
        .connect_timeout(timeout)
        .no_proxy()
        // A redirect would carry the token elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        // The token goes only over TLS, whatever the address says.
        .https_only(token.is_some())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Creates the probe pods asked for (AlreadyExists is fine); a failure is
/// remembered for the gate's message.
pub async fn create_probes(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    world: &World,
    probes: &[ProbeRequest],
) -> Result<()> {
    let Some(gate) = sr.spec.probe_gate() else {
        return Ok(());
    };
    let id = ctx.rollout_id(key);
    let owner = sr
        .controller_owner_ref(&())
        .ok_or(super::Error::MissingField("metadata.uid"))?;
    let agent_tolerations = world
        .ds
        .as_ref()
        .and_then(|d| d.spec.template.spec.as_ref())
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let claim_template = match &gate.device_class_name {
        Some(class) => {
            let name = probe::claim_template_name(&id, class);
            ensure_claim_template(ctx, &key.0, gate, &name, &id, owner.clone()).await?;
            Some(name)
        }
        None => None,
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for req in probes {
        let taints = ctx
            .caches
            .nodes
            .state()
            .iter()
            .find(|n| n.name_any() == req.node)
            .and_then(|n| n.spec.as_ref().and_then(|s| s.taints.clone()))
            .unwrap_or_default();
        let pod = probe::probe_pod(
            gate,
            &ProbePodParams {
                name: &req.name,
                namespace: &key.0,
                node: &req.node,
                stage: req.stage,
                revision: &req.revision,
                rollout_id: &id,
                owner: owner.clone(),
                agent_tolerations: &agent_tolerations,
                node_taints: &taints,
                claim_template: claim_template.as_deref(),
            },
        );
        let result = match pod {
            Err(e) => Err(e),
            Ok(pod) => match api.create(&params, &pod).await {
                Ok(_) => {
                    info!(ns = %key.0, pod = %req.name, node = %req.node, "created probe pod");
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                // Refused for good (invalid, forbidden): the gate reports it at its timeout.
                Err(kube::Error::Api(s)) if (400..500).contains(&s.code) => Err(clean_line(
                    &format!("{} ({}): {}", s.reason, s.code, s.message),
                )),
                Err(e) => return Err(e.into()),
            },
        };
        ctx.memory(key, |m| match result {
            Ok(()) => {
                m.proof.probe_errors.remove(&req.name);
            }
            Err(e) => {
                warn!(ns = %key.0, pod = %req.name, error = %e, "cannot create probe pod");
                m.proof.probe_errors.insert(req.name.clone(), e);
            }
        });
    }
    Ok(())
}

async fn ensure_claim_template(
    ctx: &Context,
    ns: &str,
    gate: &saferollout_api::ProbeGate,
    name: &str,
    id: &str,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Result<()> {
    let Some(t) = probe::claim_template(gate, name, ns, id, owner) else {
        return Ok(());
    };
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &t).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes probe pods by name, each conditional on its UID, with the pod's
/// own grace period (a judged probe has ended: the API server removes an
/// ended or unscheduled pod at once; one still running is stopped by its
/// kubelet, never force-deleted while it holds a device).
pub async fn delete_probes(
    ctx: &Context,
    key: &RolloutKey,
    pods: &[(String, String)],
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    for (name, uid) in pods {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => info!(ns = %key.0, pod = %name, "deleted probe pod"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"n1"},"value":[1.0,"1"]}]}}"#;

    /// Reads one HTTP/1.1 request (head and a Content-Length body); returns the head.
    async fn read_request<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        let _ = s.read_exact(&mut body).await;
        head
    }

    fn response(code: u16, body: &str) -> String {
        format!(
            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    /// A Prometheus HTTP API stand-in over TLS on 127.0.0.1 (a self-signed
    /// certificate from openssl) that answers only with the right bearer
    /// token: (port, the CA bundle, requests served).
    async fn tls_prometheus(token: &'static str) -> (u16, Vec<u8>, Arc<AtomicUsize>) {
        let dir = std::env::temp_dir().join(format!("sr-prom-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .current_dir(&dir)
                .args(args)
                .output()
                .expect("openssl");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        // A CA, and a certificate for 127.0.0.1 it signed.
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-subj",
                    "/CN=test-ca",
                    "-days",
                    "1",
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                ],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &ec,
                &[
                    "-subj",
                    "/CN=127.0.0.1",
                    "-keyout",
                    "key.pem",
                    "-out",
                    "leaf.csr",
                ],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext",
            "-out",
            "cert.pem",
        ]);
        let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();
        let leaf = std::fs::read(&cert).unwrap();
        let certs: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&leaf)
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(&key).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let head = read_request(&mut tls).await;
                    count.fetch_add(1, Ordering::SeqCst);
                    let authorized = head.lines().any(|l| {
                        l.to_ascii_lowercase().starts_with("authorization:")
                            && l.ends_with(&format!("Bearer {token}"))
                    });
                    let answer = if authorized {
                        response(200, VECTOR)
                    } else {
                        response(
                            401,
                            r#"{"status":"error","errorType":"unauthorized","error":"bad token"}"#,
                        )
                    };
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, ca, served)
    }

    /// A plain HTTP server on 127.0.0.1 that answers each request with
    /// `answer` (run with the connection; it may stream forever or never
    /// answer): (port, requests served).
    async fn raw_server<F, Fut>(answer: F) -> (u16, Arc<AtomicUsize>)
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                read_request(&mut tcp).await;
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(answer(tcp));
            }
        });
        (port, served)
    }

    #[tokio::test]
    async fn the_bearer_token_goes_only_over_https_and_never_into_an_error() {
        let (port, ca, served) = tls_prometheus("s3cr3t-token").await;
        let address = format!("https://127.0.0.1:{port}");
        let ok = query_with(
            &address,
            "up",
            Duration::from_secs(5),
            Some(b"s3cr3t-token\n"),
            Some(&ca),
        )
        .await;
        assert_eq!(
            ok,
            MeasurementOutcome::Samples(vec![Sample {
                labels: BTreeMap::from([("node".to_string(), "n1".to_string())]),
                value: 1.0
            }])
        );
        let wrong = query_with(
            &address,
            "up",
            Duration::from_secs(5),
            Some(b"other-token"),
            Some(&ca),
        )
        .await;
        match wrong {
            MeasurementOutcome::Error(e) => {
                assert!(!e.contains("other-token"), "{e}");
                assert!(e.contains("401") && e.contains("unauthorized"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // Without the CA the server is not trusted: nothing is sent.
        let untrusted = query_with(
            &address,
            "up",
            Duration::from_secs(5),
            Some(b"s3cr3t-token"),
            None,
        )
        .await;
        assert!(
            matches!(untrusted, MeasurementOutcome::Error(_)),
            "{untrusted:?}"
        );
        assert_eq!(
            served.load(Ordering::SeqCst),
            2,
            "the untrusted handshake sent no request"
        );
        // A token is never sent in the clear: refused before dialling.
        let (plain, plain_served) = raw_server(|mut tcp| async move {
            let _ = tcp.write_all(response(200, VECTOR).as_bytes()).await;
        })
        .await;
        let clear = query_with(
            &format!("http://127.0.0.1:{plain}"),
            "up",
            Duration::from_secs(5),
            Some(b"s3cr3t-token"),
            None,
        )
        .await;
        assert_eq!(
            clear,
            MeasurementOutcome::Error("a bearer token is sent only over https".into())
        );
        assert_eq!(plain_served.load(Ordering::SeqCst), 0);
        // Nothing listens: an error, not a hang.
        let closed = query_with(
            "http://127.0.0.1:1",
            "up",
            Duration::from_secs(2),
            None,
            None,
        )
        .await;
        assert!(matches!(closed, MeasurementOutcome::Error(_)), "{closed:?}");
    }

    #[tokio::test]
    async fn an_endless_answer_is_cut_at_4_mib_and_a_silent_server_at_the_timeout() {
        let written = Arc::new(AtomicUsize::new(0));
        let counter = written.clone();
        let (port, _) = raw_server(move |mut tcp| {
            let counter = counter.clone();
            async move {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n";
                let _ = tcp.write_all(head.as_bytes()).await;
                let _ = tcp
                    .write_all(br#"{"status":"success","data":{"resultType":"vector","result":["#)
                    .await;
                let sample = br#"{"metric":{"node":"n"},"value":[1,"1"]},"#.repeat(1024);
                // Up to 1 GiB, as long as the client reads.
                while counter.load(Ordering::SeqCst) < 1 << 30 {
                    if tcp.write_all(&sample).await.is_err() {
                        return;
                    }
                    counter.fetch_add(sample.len(), Ordering::SeqCst);
                }
            }
        })
        .await;
        let started = Instant::now();
        let big = query_with(
            &format!("http://127.0.0.1:{port}"),
            "up",
            Duration::from_secs(20),
            None,
            None,
        )
        .await;
        match big {
            MeasurementOutcome::Error(e) => assert!(e.contains("exceeds 4 MiB"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "cut, not timed out"
        );
        // The connection is dropped: the server stops far below 1 GiB.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = written.load(Ordering::SeqCst);
        assert!(sent < 64 << 20, "the server wrote {sent} bytes");

        let (silent, served) = raw_server(|tcp| async move {
            // Holds the connection and never answers.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(tcp);
        })
        .await;
        let started = Instant::now();
        let hung = query_with(
            &format!("http://127.0.0.1:{silent}"),
            "up",
            Duration::from_secs(1),
            None,
            None,
        )
        .await;
        assert_eq!(served.load(Ordering::SeqCst), 1);
        match hung {
            MeasurementOutcome::Error(e) => assert!(e.contains("timed out"), "{e}"),
            other => panic!("{other:?}"),
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[test]
    fn answers_are_parsed_bounded_and_what_a_server_says_is_cleaned() {
        match parse_answer(
            200,
            br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"NaN"]}}"#,
        ) {
            MeasurementOutcome::Samples(s) => {
                assert!(
                    s.len() == 1 && s[0].value.is_nan() && s[0].labels.is_empty(),
                    "{s:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        match parse_answer(200, br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"a"},"value":[1,"+Inf"]}]}}"#) {
            MeasurementOutcome::Samples(s) => assert_eq!(s[0].value, f64::INFINITY),
            other => panic!("{other:?}"),
        }
        let many = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            vec![r#"{"metric":{},"value":[1,"0"]}"#; MAX_SAMPLES + 1].join(",")
        );
        match parse_answer(200, many.as_bytes()) {
            MeasurementOutcome::Error(e) => assert!(e.contains("more than 10000"), "{e}"),
            other => panic!("{other:?}"),
        }
        let html = format!(
            "<html>proxy error; upstream token=tok-9f8e7d6c5b4a {}</html>",
            "x".repeat(1000)
        );
        match parse_answer(502, html.as_bytes()) {
            MeasurementOutcome::Error(e) => {
                assert!(e.contains("502") && !e.contains("tok-9f8e7d6c5b4a"), "{e}");
                assert!(
                    e.chars().count() <= saferollout_core::gates::proof::MAX_LINE,
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        match parse_answer(422, br#"{"status":"error","errorType":"bad_data","error":"parse error: password=hunter2-prom"}"#) {
            MeasurementOutcome::Error(e) => {
                assert!(e.contains("bad_data") && !e.contains("hunter2-prom"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        match parse_answer(
            200,
            br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
        ) {
            MeasurementOutcome::Error(e) => assert!(e.contains("range vector"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
