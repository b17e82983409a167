//! The memory allocator (jemalloc, unless the `system-allocator` feature
//! picks the C library's malloc for heap profilers): its byte counts for
//! `/metrics`, and the thread caches, turned off on the threads doing the
//! steady work once the caches have listed.
//!
//! Why: at 5,000 nodes and 50 SafeRollouts the live bytes stayed at 28-31
//! MiB through the rollouts, but the pages partly used by them (jemalloc's
//! active less allocated) grew from 2 to 10 MiB over eight minutes, and the
//! peak RSS reached 63-64 MiB. A thread cache hands the objects a thread
//! frees to that thread's next allocations of the same size, whichever
//! thread allocated them, so the caches' long-lived objects (each new pod
//! or node version, decoded on a worker) and the passes' short-lived ones
//! end up mixed in the same pages, which stay in use while any object in
//! them lives. With every thread cache off the partly used pages stayed at
//! 2.5-3.6 MiB and the peak was 58.6 MiB, but the start-up, which decodes
//! every node and pod at once, took 4.0 s to the first status write against
//! 2.0 (one run each); so the thread caches stay on until the caches have
//! listed (bench/results/2026-12-05-tcache.md).

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once every cache has listed: from then on the threads doing the
/// steady work turn their thread cache off at their next call of
/// [`steady_work_on_this_thread`].
static CACHES_LISTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static THREAD_CACHE_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Every cache has listed: the start-up's burst of decoding is over.
pub fn caches_listed() {
    CACHES_LISTED.store(true, Ordering::Release);
}

/// Called by the threads doing the steady work: each worker thread when it
/// wakes (the runtime's `on_thread_unpark`), and each pass. After the
/// caches listed, the first call on a thread turns its thread cache off;
/// the others cost a load.
pub fn steady_work_on_this_thread() {
    if !CACHES_LISTED.load(Ordering::Acquire) || THREAD_CACHE_OFF.get() {
        return;
    }
    THREAD_CACHE_OFF.set(true);
    turn_thread_cache_off();
}

#[cfg(not(feature = "system-allocator"))]
fn turn_thread_cache_off() {
    // SAFETY: `thread.tcache.enabled` is a documented read-write bool of
    // the calling thread; flushing it on disable is jemalloc's to do.
    let r = unsafe { tikv_jemalloc_ctl::raw::write(b"thread.tcache.enabled\0", false) };
    if let Err(e) = r {
        tracing::debug!(error = %e, "could not turn the allocator's thread cache off");
    }
}

#[cfg(feature = "system-allocator")]
fn turn_thread_cache_off() {}

/// jemalloc's statistics, refreshed (they are cached until the epoch moves):
/// what the process's RSS is made of. Allocated against active is the
/// fragmentation of partly used pages; resident against active plus
/// metadata is freed memory not yet returned to the kernel. Empty when the
/// operator runs on the C library's malloc (feature `system-allocator`) or a
/// read fails.
pub fn bytes() -> Vec<(&'static str, usize)> {
    #[cfg(not(feature = "system-allocator"))]
    {
        use tikv_jemalloc_ctl::{epoch, stats};
        if epoch::advance().is_err() {
            return Vec::new();
        }
        let read = [
            ("allocated", stats::allocated::read()),
            ("active", stats::active::read()),
            ("resident", stats::resident::read()),
            ("metadata", stats::metadata::read()),
            ("retained", stats::retained::read()),
        ];
        read.into_iter()
            .filter_map(|(kind, bytes)| Some((kind, bytes.ok()?)))
            .collect()
    }
    #[cfg(feature = "system-allocator")]
    Vec::new()
}

#[cfg(all(test, not(feature = "system-allocator")))]
mod tests {
    use super::*;

    fn thread_cache_on() -> bool {
        // SAFETY: reads a documented bool of the calling thread.
        unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"thread.tcache.enabled\0") }.unwrap()
    }

    #[test]
    fn a_thread_turns_its_thread_cache_off_once_the_caches_listed() {
        // Threads of their own: the flag is the process's, the cache each
        // thread's.
        std::thread::spawn(|| {
            assert!(thread_cache_on(), "on by default");
            steady_work_on_this_thread();
            assert!(
                thread_cache_on() || CACHES_LISTED.load(Ordering::Acquire),
                "untouched before the caches listed"
            );
        })
        .join()
        .unwrap();
        caches_listed();
        std::thread::spawn(|| {
            assert!(thread_cache_on());
            steady_work_on_this_thread();
            assert!(!thread_cache_on(), "off after the caches listed");
            steady_work_on_this_thread();
            assert!(!thread_cache_on());
        })
        .join()
        .unwrap();
    }
}
