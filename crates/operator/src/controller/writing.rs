//! What every write of the operator shares, whichever module sends it (the
//! passes' writes, the label writers, the quarantine's): the slots of
//! writes in flight, the field manager, the crash hook of the end-to-end
//! tests. A leaf: it knows nothing of what is written.

use kube::api::PatchParams;
use saferollout_api::FIELD_MANAGER;

/// Node and pod writes in flight at once, all SafeRollouts together (each
/// also keeps to its own limit). 50 SafeRollouts labelling their stages at
/// once had 1,600 requests ready to send; over HTTP/1.1 each held a
/// connection of its own (541 connections, 15 MB of the heap at 5,000 nodes,
/// heaptrack). Since [`crate::client`] speaks HTTP/2 they are streams of one
/// connection, and the limit keeps the API server's load and the requests'
/// own buffers bounded. Status writes, Events and DaemonSet writes take no
/// slot, so a revert never queues behind another rollout's label writes.
pub const API_WRITES_IN_FLIGHT: usize = 64;

/// The slots of [`API_WRITES_IN_FLIGHT`], shared by the passes and the label
/// writers.
#[derive(Clone)]
pub struct WriteSlots(std::sync::Arc<tokio::sync::Semaphore>);

impl Default for WriteSlots {
    fn default() -> Self {
        WriteSlots(std::sync::Arc::new(tokio::sync::Semaphore::new(
            API_WRITES_IN_FLIGHT,
        )))
    }
}

impl WriteSlots {
    /// Runs `write` once a slot is free.
    pub async fn run<T>(&self, write: impl std::future::Future<Output = T>) -> T {
        // Never closed; if it were, the write would go without a slot.
        let _slot = self.0.acquire().await.ok();
        write.await
    }
}

/// A JSON patch whose `test` operation failed: the API server answers 422
/// without field causes (an invalid object gets 422 with causes).
pub fn is_failed_guard(s: &kube::core::Status) -> bool {
    s.code == 422 && s.details.as_ref().is_none_or(|d| d.causes.is_empty())
}

/// Patch parameters naming the operator's field manager.
pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Test hook, in debug builds only: `SAFEROLLOUT_DEBUG_CRASH_AFTER=<kind>:<n>`
/// ends the process right after its `n`th successful write of `kind`
/// (`template`, `backup`, `label`, `deletion`, `status`; `promotion`, each
/// step of a `Selector` promotion or deletion but the nudge; `devicetaintrule`,
/// each quarantine rule created; `quarantine`, a quarantine's rules and
/// node taints all written) with
/// SIGABRT: no clean-up and the lease kept, as a SIGKILL would. The
/// end-to-end tests use it to check that a crash after any kind of write
/// repeats or skips nothing.
pub(super) fn crash_point(kind: &str) {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static WRITES: AtomicUsize = AtomicUsize::new(0);
        let Ok(hook) = std::env::var("SAFEROLLOUT_DEBUG_CRASH_AFTER") else {
            return;
        };
        let Some((which, n)) = hook.split_once(':') else {
            return;
        };
        if which == kind && WRITES.fetch_add(1, Ordering::SeqCst) + 1 == n.parse().unwrap_or(0) {
            eprintln!("SAFEROLLOUT_DEBUG_CRASH_AFTER: ending the process after {kind} write {n}");
            std::process::abort();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = kind;
}
