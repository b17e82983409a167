//! Leader election on a `coordination.k8s.io` Lease, so two replicas never
//! act at once: only the leader reconciles and writes; followers keep their
//! caches warm and serve metrics and readiness, so a failover acts within a
//! moment of taking the lease.
//!
//! The election itself is `kube-lease-manager`'s (acquire, renew `grace`
//! seconds before expiry, take over an expired lease, release on shutdown).
//! `kube-leader-election`, the other well-kept crate, has no release for
//! kube 5 yet.
//!
//! On top of it, a write fence ([`Fence`]): every write the operator makes
//! first checks that the lease is held and was confirmed recently enough that
//! no other replica can have taken it. The confirmation is our own renewal as
//! the Lease watch delivers it, dated by the `renewTime` we wrote (our own
//! clock), not by when the watch delivered it: a watch that lags would
//! otherwise keep the fence open past the lease.
//!
//! The fence closes `duration - grace/2` after that renewal. The manager
//! renews `grace` before expiry, so a renewal has `grace/2` to be written
//! and seen before the fence closes; and a write sent just before the fence
//! closes has `grace/2` to reach the API server before the lease expires and
//! another replica may take it (the margin; 5 s with the defaults, 15 s and
//! 10 s). The writer client ([`crate::client`]) checks the fence before
//! sending every write, retries included, and gives a write up at the
//! fence's deadline, so a leader that stops renewing (frozen, cut off from the
//! API, its writes delayed) sends nothing after the fence closed. What no
//! client can bound is a write's time in transit once sent: the margin is
//! the assumption, so on an API server slower than that, raise
//! `--lease-grace` (and `--lease-duration`).

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tracing::{info, warn};

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// Seconds a lease is valid after a renewal.
    pub duration: u64,
    /// Seconds before expiry the holder renews.
    pub grace: u64,
}

/// Whether this replica may write now.
#[derive(Debug)]
pub struct Fence {
    state: Mutex<FenceState>,
}

#[derive(Debug)]
enum FenceState {
    /// No election: a single replica always writes.
    Always,
    /// Held (per the lease manager) and confirmed until then.
    Lease {
        held: bool,
        valid_until: Option<Instant>,
    },
}

impl Fence {
    pub fn always() -> Arc<Self> {
        Arc::new(Fence {
            state: Mutex::new(FenceState::Always),
        })
    }

    /// A fence for a replica in an election: closed until the lease is held
    /// and a renewal confirmed ([`elect`] opens it).
    pub fn elected() -> Arc<Self> {
        Arc::new(Fence {
            state: Mutex::new(FenceState::Lease {
                held: false,
                valid_until: None,
            }),
        })
    }

    /// May this replica write now?
    pub fn is_open(&self) -> bool {
        !matches!(self.admits(), Admits::Nothing)
    }

    /// Whether a write may be sent now, and until when it may be in flight.
    pub fn admits(&self) -> Admits {
        match &*self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            FenceState::Always => Admits::Always,
            FenceState::Lease {
                held: true,
                valid_until: Some(until),
            } if Instant::now() < *until => Admits::Until(*until),
            FenceState::Lease { .. } => Admits::Nothing,
        }
    }

    pub(crate) fn set_held(&self, now_held: bool) {
        if let FenceState::Lease { held, valid_until } =
            &mut *self.state.lock().unwrap_or_else(|e| e.into_inner())
        {
            *held = now_held;
            if !now_held {
                *valid_until = None;
            }
        }
    }

    pub(crate) fn confirm_until(&self, until: Instant) {
        if let FenceState::Lease { valid_until, .. } =
            &mut *self.state.lock().unwrap_or_else(|e| e.into_inner())
        {
            *valid_until = Some(until);
        }
    }
}

/// What the fence admits now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admits {
    /// No election: writes go at any time, with no deadline.
    Always,
    /// Writes sent before this instant, and given up at it.
    Until(Instant),
    /// No write.
    Nothing,
}

/// When a renewal we wrote at `renewed` (our wall clock) stops vouching for
/// the lease, as a monotonic instant: `validity` after it. A renewal dated in
/// the future (a clock step back) counts from now.
fn confirmed_until(renewed: SystemTime, validity: Duration) -> Instant {
    let age = SystemTime::now()
        .duration_since(renewed)
        .unwrap_or(Duration::ZERO);
    let now = Instant::now();
    (now + validity).checked_sub(age).unwrap_or(now)
}

/// A failure to join the election, said with its fix: at start-up, the
/// usual causes are a namespace that does not exist (the operator run
/// outside the cluster) and missing RBAC.
fn explain(e: kube_lease_manager::LeaseManagerError, config: &ElectionConfig) -> anyhow::Error {
    use kube_lease_manager::LeaseManagerError::KubeError;
    let (ns, lease) = (&config.namespace, &config.lease_name);
    match &e {
        KubeError(kube::Error::Api(s))
            if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") =>
        {
            anyhow::anyhow!(
                "the leader Lease's namespace {ns:?} does not exist: create it (kubectl create namespace {ns}), pick another with --leader-election-namespace, or run one replica with --leader-election=false"
            )
        }
        KubeError(kube::Error::Api(s)) if s.code == 403 => anyhow::anyhow!(
            "the operator may not read or write the Lease {ns}/{lease} ({}): apply the operator's RBAC (deploy/rbac.yaml or the chart), or run one replica with --leader-election=false",
            s.message
        ),
        _ => anyhow::Error::new(e)
            .context(format!("joining the leader election on Lease {ns}/{lease}")),
    }
}

/// Leadership as the rest of the operator sees it.
pub struct Leadership {
    pub fence: Arc<Fence>,
    /// `true` while this replica holds the lease.
    pub changes: tokio::sync::watch::Receiver<bool>,
    /// Releases the lease on shutdown.
    pub step_down: StepDown,
}

/// Gives the lease up (on shutdown), so a replica started next takes it at once.
pub struct StepDown(
    Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
);

impl StepDown {
    pub async fn release(self) {
        if let Some((stop, done)) = self.0 {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), done).await;
        }
    }
}

/// No election: this replica leads from the start.
pub fn sole_leader(fence: Arc<Fence>) -> Leadership {
    let (tx, rx) = tokio::sync::watch::channel(true);
    // Keep the sender alive for the whole process: the receiver must not see a close.
    std::mem::forget(tx);
    Leadership {
        fence,
        changes: rx,
        step_down: StepDown(None),
    }
}

/// Joins the election with `fence` (from [`Fence::elected`]); returns once
/// the lease's state has been read.
pub async fn elect(
    client: Client,
    config: ElectionConfig,
    fence: Arc<Fence>,
) -> anyhow::Result<Leadership> {
    let params = LeaseParams::new(config.identity.clone(), config.duration, config.grace)
        .with_field_manager(format!("saferollout-operator/{}", config.identity));
    // Reading the lease (and creating it when missing) is the first thing
    // the operator asks of the API server. A refusal the API server would
    // not repeat (429, 500, a dropped connection, or another replica creating
    // the lease first) is tried again, backing off, rather than ending the
    // process: before, one injected 500 on the Lease create made the operator
    // exit at start-up (tests/faults.rs).
    let manager = crate::retry::retry_passing("reading the leader lease", is_transient, || {
        LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.namespace)
            .with_parameters(params.clone())
            .build()
    })
    .await
    .map_err(|e| explain(e, &config))?;
    let (mut from_manager, task) = manager.watch().await;
    let (tx, rx) = tokio::sync::watch::channel(false);

    // Follow the manager's view of leadership; on shutdown, close its channel
    // so it releases the lease.
    let f = fence.clone();
    let identity = config.identity.clone();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let follower = tokio::spawn(async move {
        loop {
            let held = *from_manager.borrow_and_update();
            f.set_held(held);
            let _ = tx.send(held);
            info!(%identity, leader = held, "leader lease");
            tokio::select! {
                changed = from_manager.changed() => {
                    if changed.is_err() {
                        f.set_held(false);
                        let _ = tx.send(false);
                        warn!("the lease manager stopped: {:?}", task.await);
                        return;
                    }
                }
                _ = &mut stop_rx => {
                    f.set_held(false);
                    drop(from_manager);
                    match task.await {
                        Ok(Ok(_)) => info!(%identity, "released the leader lease"),
                        other => warn!(%identity, "releasing the leader lease: {other:?}"),
                    }
                    return;
                }
            }
        }
    });

    // Confirm the lease from its own watch: our renewals open the fence for
    // a little less than the lease's validity.
    let f = fence.clone();
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    let identity = config.identity.clone();
    let validity = Duration::from_secs(config.duration)
        .saturating_sub(Duration::from_millis(config.grace * 500));
    let watch_config =
        watcher::Config::default().fields(&format!("metadata.name={}", config.lease_name));
    tokio::spawn(async move {
        let mut leases = watcher(leases, watch_config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(lease) = leases.next().await {
            let Ok(lease) = lease else { continue };
            let spec = lease.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                continue;
            }
            if let Some(MicroTime(renewed)) = spec.renew_time {
                f.confirm_until(confirmed_until(renewed.into(), validity));
            }
        }
    });
    Ok(Leadership {
        fence,
        changes: rx,
        step_down: StepDown(Some((stop_tx, follower))),
    })
}

/// An error the API server (or the way to it) may not give again: worth
/// another try. A refusal that will stand (401, 403, 404, 422) is not.
fn is_transient(e: &kube_lease_manager::LeaseManagerError) -> bool {
    use kube_lease_manager::LeaseManagerError as E;
    match e {
        E::KubeError(kube::Error::Api(status)) => {
            matches!(status.code, 409 | 429 | 500 | 502 | 503 | 504)
        }
        // Transport: the connection failed, timed out or was reset.
        E::KubeError(_) => true,
        // Another replica created the lease between our read and our create.
        E::LeaseAlreadyExists(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_that_may_not_stand_are_retried() {
        use kube_lease_manager::LeaseManagerError as E;
        let api = |code: u16| {
            E::KubeError(kube::Error::Api(
                kube::core::Status::failure("test", "test")
                    .with_code(code)
                    .boxed(),
            ))
        };
        for code in [409, 429, 500, 503, 504] {
            assert!(is_transient(&api(code)), "{code} is retried");
        }
        for code in [401, 403, 404, 422] {
            assert!(!is_transient(&api(code)), "{code} ends the start-up");
        }
        assert!(is_transient(&E::LeaseAlreadyExists("l".into())));
        assert!(!is_transient(&E::InconsistentState("bug".into())));
    }

    #[test]
    fn the_fence_opens_only_while_held_and_confirmed() {
        let f = Fence::elected();
        assert!(!f.is_open());
        f.set_held(true);
        assert!(!f.is_open(), "held but never confirmed");
        f.confirm_until(Instant::now() + Duration::from_secs(5));
        assert!(f.is_open());
        f.confirm_until(Instant::now() - Duration::from_millis(1));
        assert!(
            !f.is_open(),
            "confirmation expired: stop before the lease can"
        );
        f.confirm_until(Instant::now() + Duration::from_secs(5));
        f.set_held(false);
        assert!(!f.is_open());
        assert!(Fence::always().is_open());
        assert_eq!(Fence::always().admits(), Admits::Always);
    }

    #[test]
    fn a_renewal_vouches_from_when_it_was_written_not_when_it_was_seen() {
        let validity = Duration::from_secs(10);
        // Seen 4 s after we wrote it (a lagging watch): 6 s are left.
        let until = confirmed_until(SystemTime::now() - Duration::from_secs(4), validity);
        let left = until - Instant::now();
        assert!(
            left <= Duration::from_secs(6) && left > Duration::from_millis(5900),
            "{left:?}"
        );
        // Older than the validity: vouches for nothing.
        let until = confirmed_until(SystemTime::now() - Duration::from_secs(11), validity);
        assert!(until <= Instant::now());
        // Dated in the future: counts from now, never beyond the validity.
        let until = confirmed_until(SystemTime::now() + Duration::from_secs(30), validity);
        assert!(until <= Instant::now() + validity);
        let f = Fence::elected();
        f.set_held(true);
        f.confirm_until(until);
        assert_eq!(f.admits(), Admits::Until(until));
    }
}
