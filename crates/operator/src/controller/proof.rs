//! The runtime of the probe, logs and prometheus gates: gathering what they
//! observe before each decision, and creating and deleting probe pods.
//!
//! - Probe pods come from a label-selected watch of the operator's own probe
//!   pods (`caches.probe_pods`); a failed probe's last log lines are read
//!   once (`pods/log`, tail, size-limited).
//! - Agent logs are read through `pods/log` for the target pods on the
//!   nodes status holds, each at most every `interval` while its window is
//!   open and once after it closed, at most 4 at a time, each with a
//!   timeout, and scanned at once with the pure patterns of
//!   `saferollout_core::gates::logs` (only the scan result is kept).
//! - Prometheus queries run when one is due (`prometheus::due`, from the
//!   tally in status, and at most once per interval per gate in memory),
//!   with `$STAGE_NODES` from status, over HTTP(S) with the gate's timeout;
//!   a bearer token or CA is read from its Secret by name when configured,
//!   and never logged or written anywhere.
//!
//! Re-checks are requeues the gates ask for; nothing here loops or sleeps.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, LogParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use saferollout_api::{
    FIELD_MANAGER, GateResult, LogsGate, PROBE_NODE_LABEL, PrometheusGate, SafeRollout,
    SafeRolloutStatus, SecretKeyRef,
};
use saferollout_core::gates::logs::{Patterns, window_end};
use saferollout_core::gates::probe::{self, ProbePodParams, ProbeRequest};
use saferollout_core::gates::prometheus;
use saferollout_core::gates::proof::{
    LogObservation, LogRead, Measurement, MeasurementOutcome, ProbePod, ProofEvidence, Sample,
    clean_line, clean_lines,
};
use saferollout_core::objects::SlimPod;
use tracing::{debug, info, warn};

use super::error::Result;
use super::snapshot::World;
use super::{Context, RolloutKey};

/// Reads of pods/log at once.
const LOG_READS: usize = 4;
/// Longest wait for one log read.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of an agent log read (from its start).
const LOG_LIMIT: i64 = 1 << 20;
/// Lines of a failed probe's log kept.
const PROBE_TAIL_LINES: i64 = 5;

/// What the operator remembers between passes (losing it costs a re-read).
#[derive(Default)]
pub struct Memory {
    /// Per agent pod UID: what its log showed, and when it was last read.
    logs: HashMap<String, (LogObservation, Instant)>,
    /// Per failed probe pod UID: its last log lines, cleaned.
    probe_tails: HashMap<String, String>,
    /// Per probe pod name: why creating it failed.
    probe_errors: BTreeMap<String, String>,
    /// Per prometheus gate: when it was last queried.
    queried: HashMap<String, Instant>,
}

/// The nodes status says the rollout holds now (stages up to the current one).
fn held_nodes(st: &SafeRolloutStatus) -> Vec<String> {
    let Some(current) = st.current_stage else {
        return Vec::new();
    };
    let mut nodes: Vec<String> = st
        .stages
        .iter()
        .filter(|s| s.index <= current)
        .flat_map(|s| s.nodes.iter().cloned())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

fn current_gates(st: &SafeRolloutStatus) -> &[GateResult] {
    st.current_stage
        .and_then(|c| st.stage(c))
        .map(|s| s.gates.as_slice())
        .unwrap_or(&[])
}

/// Everything the three gates observe for `sr` now.
pub async fn gather(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    status: &SafeRolloutStatus,
    world: &World,
    now: Timestamp,
) -> ProofEvidence {
    let spec = &sr.spec;
    let mut evidence = ProofEvidence::default();
    // Logs and measurements matter only while a stage is being judged.
    let rolling = status.target_revision.is_some()
        && status.current_stage.is_some()
        && matches!(
            status.phase,
            Some(saferollout_api::Phase::Progressing | saferollout_api::Phase::Paused)
        );
    if spec.probe_gate().is_some()
        || !ctx
            .caches
            .probe_pods_of(&key.0, &ctx.rollout_id(key))
            .is_empty()
    {
        evidence.probe_pods = probe_pods(ctx, key).await;
        evidence.probe_errors = ctx.memory(key, |m| m.proof.probe_errors.clone());
    }
    if let (Some(gate), true) = (spec.logs_gate(), rolling) {
        evidence.agent_logs = agent_logs(ctx, key, gate, status, world, now).await;
    }
    if rolling && !spec.prometheus_gates().is_empty() {
        evidence.measurements = measurements(sr, ctx, key, status, now).await;
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

/// When the agent container (or else the pod) started.
fn started_at(pod: &SlimPod, container: Option<&str>) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    let cs = status
        .container_statuses
        .as_ref()
        .and_then(|cs| match container {
            Some(name) => cs.iter().find(|c| c.name == name),
            None => cs.first(),
        });
    cs.and_then(|c| c.state.as_ref())
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .or(status.start_time.as_ref())
        .map(|t| t.0)
}

async fn agent_logs(
    ctx: &Context,
    key: &RolloutKey,
    gate: &LogsGate,
    status: &SafeRolloutStatus,
    world: &World,
    now: Timestamp,
) -> BTreeMap<String, LogObservation> {
    let patterns = match Patterns::of(gate) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            warn!(ns = %key.0, name = %key.1, error = %e, "logs gate patterns do not compile");
            return BTreeMap::new();
        }
    };
    let target = status.target_revision.clone().unwrap_or_default();
    let held = held_nodes(status);
    let interval = gate.interval.to_std().unwrap_or(Duration::from_secs(10));
    let pods: Vec<Arc<SlimPod>> = world
        .pods()
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.labels().get(saferollout_api::REVISION_HASH_LABEL) == Some(&target))
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| held.contains(n))
        })
        .cloned()
        .collect();
    let remembered = ctx.memory(key, |m| {
        let uids: Vec<String> = pods.iter().filter_map(|p| p.uid()).collect();
        m.proof.logs.retain(|uid, _| uids.contains(uid));
        m.proof.logs.clone()
    });
    let mut out = BTreeMap::new();
    let mut to_read = Vec::new();
    for pod in pods {
        let uid = pod.uid().unwrap_or_default();
        let started = started_at(&pod, gate.container.as_deref());
        let known = remembered.get(&uid);
        let obs = known.map(|(o, _)| o.clone()).unwrap_or(LogObservation {
            pod: pod.name_any(),
            started_at: started,
            read: LogRead::Unread,
        });
        // A restarted container starts a new window.
        let obs = if obs.started_at != started {
            LogObservation {
                started_at: started,
                read: LogRead::Unread,
                ..obs
            }
        } else {
            obs
        };
        let end = started.map(|s| window_end(gate, s));
        let read_after_end = |at: &Timestamp| end.is_some_and(|e| *at >= e);
        let settled = match &obs.read {
            LogRead::Matched(_) => true,
            LogRead::Clean { at } => read_after_end(at),
            LogRead::Unreadable { clean_at, .. } => clean_at.as_ref().is_some_and(read_after_end),
            LogRead::Unread => false,
        };
        let last_at = match &obs.read {
            LogRead::Clean { at } => Some(*at),
            _ => None,
        };
        let window_closed_since_read =
            end.is_some_and(|e| now >= e && last_at.is_none_or(|a| a < e));
        let interval_passed = known.is_none_or(|(_, at)| at.elapsed() >= interval);
        if started.is_some() && !settled && (interval_passed || window_closed_since_read) {
            to_read.push((pod, obs));
        } else {
            out.insert(uid, obs);
        }
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.0);
    let container = gate.container.clone();
    let reads = futures::stream::iter(to_read.into_iter().map(|(pod, obs)| {
        let (api, patterns, container) = (api.clone(), patterns.clone(), container.clone());
        async move {
            let params = LogParams {
                container: container.or_else(|| {
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .map(|c| c.name.clone())
                }),
                limit_bytes: Some(LOG_LIMIT),
                ..Default::default()
            };
            let read = match tokio::time::timeout(LOG_TIMEOUT, api.logs(&pod.name_any(), &params)).await {
                Ok(Ok(text)) => match patterns.scan(&text) {
                    Some(m) => LogRead::Matched(m),
                    None => LogRead::Clean { at: now },
                },
                Ok(Err(e)) => LogRead::Unreadable {
                    error: e.to_string(),
                    clean_at: match &obs.read {
                        LogRead::Clean { at } => Some(*at),
                        LogRead::Unreadable { clean_at, .. } => *clean_at,
                        _ => None,
                    },
                },
                Err(_) => LogRead::Unreadable {
                    error: format!("reading the log timed out after {LOG_TIMEOUT:?}"),
                    clean_at: None,
                },
            };
            if let LogRead::Matched(m) = &read {
                info!(pod = %pod.name_any(), pattern = %m.pattern, "agent log matched a fatal pattern");
            }
            (pod.uid().unwrap_or_default(), LogObservation { read, ..obs })
        }
    }))
    .buffer_unordered(LOG_READS)
    .collect::<Vec<_>>()
    .await;
    let read_now = Instant::now();
    ctx.memory(key, |m| {
        for (uid, obs) in &reads {
            m.proof.logs.insert(uid.clone(), (obs.clone(), read_now));
        }
    });
    out.extend(reads);
    out
}

async fn measurements(
    sr: &SafeRollout,
    ctx: &Context,
    key: &RolloutKey,
    status: &SafeRolloutStatus,
    now: Timestamp,
) -> BTreeMap<String, Measurement> {
    let held = held_nodes(status);
    if held.is_empty() {
        return BTreeMap::new();
    }
    let gates = current_gates(status);
    let mut out = BTreeMap::new();
    for gate in sr.spec.prometheus_gates() {
        let name = prometheus::gate_name(&gate.name);
        let previous = gates.iter().find(|g| g.gate == name);
        let every = gate.interval.to_std().unwrap_or(Duration::from_secs(30));
        let recently = ctx.memory(key, |m| {
            m.proof
                .queried
                .get(&name)
                .is_some_and(|at| at.elapsed() < every)
        });
        if !prometheus::due(gate, previous, now) || recently {
            continue;
        }
        ctx.memory(key, |m| {
            m.proof.queried.insert(name.clone(), Instant::now())
        });
        let query = prometheus::render_query(gate, &held);
        let outcome = query_prometheus(ctx, &key.0, gate, &query).await;
        debug!(ns = %key.0, gate = %name, ?outcome, "prometheus measurement");
        out.insert(
            name,
            Measurement {
                at: now,
                stage_nodes: prometheus::stage_nodes_regex(&held),
                outcome,
            },
        );
    }
    out
}

/// One instant query; every failure is an inconclusive outcome with a
/// message that carries no credential.
pub async fn query_prometheus(
    ctx: &Context,
    ns: &str,
    gate: &PrometheusGate,
    query: &str,
) -> MeasurementOutcome {
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
                other => other.to_string(),
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

/// The query against `address`, with an optional bearer token and CA
/// bundle (PEM).
pub async fn query_with(
    address: &str,
    query: &str,
    timeout: Duration,
    token: Option<&[u8]>,
    ca_pem: Option<&[u8]>,
) -> MeasurementOutcome {
    let client = match http_client(timeout, token, ca_pem) {
        Ok(c) => c,
        Err(e) => return MeasurementOutcome::Error(e),
    };
    let client = match prometheus_http_query::Client::from(client, address) {
        Ok(c) => c,
        Err(e) => return MeasurementOutcome::Error(format!("address {address:?}: {e}")),
    };
    let secs = timeout.as_secs().max(1) as i64;
    let run = client.query(query).timeout(secs * 1000).get();
    let result = match tokio::time::timeout(timeout, run).await {
        Err(_) => {
            return MeasurementOutcome::Error(format!("the query timed out after {timeout:?}"));
        }
        Ok(Err(e)) => return MeasurementOutcome::Error(describe(&e)),
        Ok(Ok(r)) => r,
    };
    use prometheus_http_query::response::Data;
    let samples = match result.data() {
        Data::Vector(v) => v
            .iter()
            .map(|iv| Sample {
                labels: iv
                    .metric()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                value: iv.sample().value(),
            })
            .collect(),
        Data::Scalar(s) => vec![Sample {
            labels: BTreeMap::new(),
            value: s.value(),
        }],
        Data::Matrix(_) => {
            return MeasurementOutcome::Error(
                "the query returned a range vector; use an instant vector or scalar".into(),
            );
        }
    };
    MeasurementOutcome::Samples(samples)
}

/// An error without anything a request carried (no headers, no token).
fn describe(e: &prometheus_http_query::Error) -> String {
    use prometheus_http_query::Error;
    match e {
        Error::Prometheus(p) => format!("Prometheus answered an error: {p}"),
        Error::Client(c) => {
            // reqwest's message names the URL (not the headers); cut to one line.
            clean_line(&format!("request failed: {c}"))
        }
        other => clean_line(&other.to_string()),
    }
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
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .default_headers(headers)
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        // A redirect would carry the token elsewhere.
        .redirect(reqwest::redirect::Policy::none())
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
                Err(kube::Error::Api(s)) if (400..500).contains(&s.code) => {
                    Err(format!("{} ({}): {}", s.reason, s.code, s.message))
                }
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
    use super::*;

    /// A Prometheus HTTP API stand-in on loopback that answers only with
    /// the right bearer token (real Prometheus has no bearer auth; the
    /// end-to-end tests use a real one without it).
    async fn fake_prometheus(token: &'static str) -> u16 {
        use axum::http::{HeaderMap, StatusCode};
        let app = axum::Router::new().route(
            "/api/v1/query",
            axum::routing::get(move |headers: HeaderMap| async move {
                let ok = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    == Some(&format!("Bearer {token}"));
                let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
                if !ok {
                    return (
                        StatusCode::UNAUTHORIZED,
                        json,
                        r#"{"status":"error","errorType":"unauthorized","error":"bad token"}"#,
                    );
                }
                (
                    StatusCode::OK,
                    json,
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":"n1"},"value":[1.0,"1"]}]}}"#,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }

    #[tokio::test]
    async fn the_bearer_token_is_sent_and_never_in_an_error() {
        let port = fake_prometheus("s3cr3t-token").await;
        let address = format!("http://127.0.0.1:{port}");
        let ok = query_with(
            &address,
            "up",
            Duration::from_secs(5),
            Some(b"s3cr3t-token\n"),
            None,
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
            None,
        )
        .await;
        match wrong {
            MeasurementOutcome::Error(e) => assert!(!e.contains("other-token"), "{e}"),
            other => panic!("{other:?}"),
        }
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
}
