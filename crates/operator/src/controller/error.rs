//! The controller's errors, each with the label the error metric uses and
//! whether a fast retry is right.

use crate::client::Fenced;
use std::time::Duration;

use kube::runtime::controller::Action as Requeue;
use kube::runtime::finalizer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer error: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("serialization error: {0}")]
    Serde(#[from] serde_json::Error),
    #[error("the last good template is missing: {0}")]
    MissingBackup(String),
    #[error("the last good backup is not the one the operator wrote: {0}")]
    BackupMismatch(String),
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// `strategy: Selector` cannot build its canary DaemonSet for the target.
    #[error("{0}")]
    Selector(String),
    #[error("the DaemonSet's spec changed since it was read; retrying with fresh caches")]
    StaleDaemonSet,
    #[error("this replica does not hold the leader lease; not writing")]
    NotLeader,
    /// A deletion's clean-up is not finished (it goes on in a later pass):
    /// an error, so kube's finalizer helper keeps the finalizer (it removes
    /// it once the clean-up returns `Ok`).
    #[error("the clean-up goes on in {0:?}: {1}")]
    CleanupPending(Duration, &'static str),
    /// The pass panicked (a bug): abandoned, reported on the SafeRollout.
    #[error("the pass panicked: {0}")]
    Panicked(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How soon a pass that met the closed write fence runs again. The pass
/// stops at the fence before any request, so retrying costs nothing.
pub const NOT_LEADER_RETRY: Duration = Duration::from_millis(500);

/// How soon a SafeRollout whose pass panicked is tried again.
pub const PANICKED_RETRY: Duration = Duration::from_secs(30);

impl Error {
    /// The error itself, seen through the finalizer's wrapping.
    pub fn root(&self) -> &Error {
        match self {
            Error::Finalizer(f) => match &**f {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            other => other,
        }
    }

    /// The `error` label of `saferollout_reconcile_errors_total`: the kind of
    /// the underlying error, not the wrapper it came through.
    pub fn metric_label(&self) -> String {
        match self.root() {
            Error::Kube(kube::Error::Api(s)) => format!("api_{}", s.reason.to_lowercase()),
            Error::Kube(e) => match Fenced::of(e) {
                Some(Fenced::NotSent) => "not_leader".into(),
                Some(Fenced::GivenUp) => "write_deadline".into(),
                None => "kube".into(),
            },
            Error::Finalizer(f) => match &**f {
                finalizer::Error::AddFinalizer(_) => "finalizer_add".into(),
                finalizer::Error::RemoveFinalizer(_) => "finalizer_remove".into(),
                _ => "finalizer".into(),
            },
            Error::Serde(_) => "serde".into(),
            Error::MissingBackup(_) => "missing_backup".into(),
            Error::BackupMismatch(_) => "backup_mismatch".into(),
            Error::MissingField(_) => "missing_field".into(),
            Error::Selector(_) => "selector".into(),
            Error::CleanupPending(..) => "cleanup_pending".into(),
            Error::StaleDaemonSet => "stale_daemonset".into(),
            Error::NotLeader => "not_leader".into(),
            Error::Panicked(_) => "panic".into(),
        }
    }

    /// What to do next: conflicts resolve on the next pass with fresh caches
    /// (retry at once); a closed write fence retries shortly (the queue ends
    /// with the leadership); anything else backs off.
    pub fn requeue(&self) -> Requeue {
        Requeue::requeue(self.retry_delay())
    }

    /// How long to wait before trying again after this error.
    pub fn retry_delay(&self) -> Duration {
        match self.root() {
            Error::StaleDaemonSet => Duration::from_millis(200),
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => Duration::from_millis(200),
            Error::Finalizer(f) if matches!(&**f, finalizer::Error::AddFinalizer(kube::Error::Api(s)) | finalizer::Error::RemoveFinalizer(kube::Error::Api(s)) if s.code == 409) => {
                Duration::from_millis(200)
            }
            // The add's JSON-patch test (the finalizers as cached) failed:
            // the cache is behind the object; the next pass reads it fresh.
            Error::Finalizer(f) if matches!(&**f, finalizer::Error::AddFinalizer(kube::Error::Api(s)) if s.code == 422) => {
                Duration::from_millis(200)
            }
            // The fence is closed while this replica leads: the lease is
            // held but its renewal not yet seen (just elected, or the
            // Lease watch lags). Waiting for a change lost the pass: at
            // start-up, every rollout the new leader queued could meet the
            // fence before the first confirmation and then sat untouched
            // until something about it changed (a SafeRollout created just
            // before the operator started stayed without status for
            // minutes). A replica that stops leading drops its queue, so
            // the retry ends with the leadership.
            Error::NotLeader => NOT_LEADER_RETRY,
            // The writer client met the fence (see `client::FenceLayer`):
            // as above, or a write given up at the fence's deadline, which
            // the next pass re-derives from the caches.
            Error::Kube(e) if Fenced::of(e).is_some() => NOT_LEADER_RETRY,
            // A bug that will likely recur: try again now and then (a
            // transient one clears), without spinning.
            Error::Panicked(_) => PANICKED_RETRY,
            Error::CleanupPending(after, _) => *after,
            _ => Duration::from_secs(5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("the object has been modified", "Conflict")
                .with_code(409)
                .boxed(),
        )
    }

    #[test]
    fn a_wrapped_error_keeps_its_own_label_and_retry() {
        let wrapped = Error::Finalizer(Box::new(finalizer::Error::ApplyFailed(Error::Kube(
            conflict(),
        ))));
        assert_eq!(wrapped.metric_label(), "api_conflict");
        assert_eq!(
            wrapped.requeue(),
            Requeue::requeue(Duration::from_millis(200))
        );
        let stale = Error::Finalizer(Box::new(finalizer::Error::ApplyFailed(
            Error::StaleDaemonSet,
        )));
        assert_eq!(stale.metric_label(), "stale_daemonset");
        assert_eq!(
            stale.requeue(),
            Requeue::requeue(Duration::from_millis(200))
        );
        let add = Error::Finalizer(Box::new(finalizer::Error::AddFinalizer(conflict())));
        assert_eq!(add.metric_label(), "finalizer_add");
        assert_eq!(add.requeue(), Requeue::requeue(Duration::from_millis(200)));
        let refused_test =
            Error::Finalizer(Box::new(finalizer::Error::AddFinalizer(kube::Error::Api(
                kube::core::Status::failure(
                    "the server rejected our request due to an error in our request",
                    "Invalid",
                )
                .with_code(422)
                .boxed(),
            ))));
        assert_eq!(refused_test.metric_label(), "finalizer_add");
        assert_eq!(
            refused_test.requeue(),
            Requeue::requeue(Duration::from_millis(200))
        );
        assert_eq!(
            Error::MissingField("x").requeue(),
            Requeue::requeue(Duration::from_secs(5))
        );
        assert_eq!(
            Error::NotLeader.requeue(),
            Requeue::requeue(NOT_LEADER_RETRY)
        );
    }
}
