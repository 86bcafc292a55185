//! Giving memory the queues freed back to the operating system.
//!
//! Circuit queues and their buffers come from the process's allocator. glibc's malloc returns
//! freed heap memory to the kernel only from the top of its heap (and whole large chunks that
//! were mapped on their own); memory freed below a chunk that is still in use stays in the
//! process, counted in its RSS, until `malloc_trim` hands the free pages back (`madvise`). After
//! a sniper attack (docs/security.md) a relay's queues fall from `MaxMemInQueues` to nearly
//! nothing once the stopped link is closed, and its RSS stayed at 24–209 MiB instead of falling
//! back to the ~11 MiB it started with: freed, but not returned (session 16: `malloc_info`
//! showed 20 MB of a 21 MB heap free, and a `malloc_trim(0)` from gdb took RSS from 30 to
//! 10 MiB).
//!
//! This crate forbids `unsafe`, so the call itself is the binary's: it registers a function
//! with [`set_release`] (the `chive` binary registers glibc's `malloc_trim(0)` on Linux/glibc);
//! without one nothing is released. The driver asks [`MemRelease::due`] every tick (500 ms)
//! with the bytes counted against `MaxMemInQueues` and the OOM handler's running total of bytes
//! freed; it answers yes once those have fallen by a large amount ([`MemRelease::drop_bytes`]:
//! an eighth of the limit, at most 32 MiB) below their peak since the last release, or the OOM
//! handler freed that much since then, and at most once per [`RELEASE_INTERVAL`], so a relay
//! whose queues swing up and down pays for a trim (it walks the heap's free chunks) at most
//! that often. The OOM total matters when data arrives in a burst: the queues can fill past the
//! limit and be cut back by the handler between two ticks, so no tick sees the peak (a sniper
//! whose exits all started sending at once left relay1 8 MiB above its start).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The least time between two releases.
pub const RELEASE_INTERVAL: Duration = Duration::from_secs(10);

/// The largest fall of the counted queues that is waited for before releasing.
pub const MAX_DROP_BYTES: usize = 32 << 20;

/// The function that gives freed memory back (registered once by the binary).
static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Register `f` as the way to give freed memory back to the operating system (the `chive`
/// binary: `malloc_trim(0)`). Returns false if one was registered before (it stays).
pub fn set_release(f: fn()) -> bool {
    RELEASE.set(f).is_ok()
}

/// Whether a release function is registered.
pub fn can_release() -> bool {
    RELEASE.get().is_some()
}

/// Call the registered release function, if any; true if one ran.
pub fn release() -> bool {
    match RELEASE.get() {
        Some(f) => {
            f();
            true
        }
        None => false,
    }
}

/// When to release: after the counted queues fell far below their peak, rate-limited.
#[derive(Debug, Default)]
pub struct MemRelease {
    /// The highest count seen since the last release (or start).
    peak: usize,
    /// When the last release ran.
    last: Option<Instant>,
    /// The OOM handler's freed-bytes total at the last release.
    oom_freed_at_release: u64,
}

impl MemRelease {
    /// The fall below the peak that makes a release due under `limit` (`MaxMemInQueues`): an
    /// eighth of it (the OOM handler frees at least a tenth of the limit each time it runs, so
    /// a run that freed much more than it keeps in use qualifies), at most [`MAX_DROP_BYTES`],
    /// at least 1 MiB.
    pub fn drop_bytes(limit: usize) -> usize {
        (limit / 8).clamp(1 << 20, MAX_DROP_BYTES)
    }

    /// Note that `in_queues` bytes are counted now and that the OOM handler has freed
    /// `oom_freed` bytes in all (a running total); true if a release is due (and it is then
    /// assumed done: the peak restarts from `in_queues`).
    pub fn due(&mut self, in_queues: usize, oom_freed: u64, limit: usize, now: Instant) -> bool {
        self.peak = self.peak.max(in_queues);
        let fell = self.peak - in_queues;
        let freed = usize::try_from(oom_freed.saturating_sub(self.oom_freed_at_release))
            .unwrap_or(usize::MAX);
        if fell.max(freed) < Self::drop_bytes(limit) {
            return false;
        }
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < RELEASE_INTERVAL)
        {
            return false;
        }
        self.last = Some(now);
        self.peak = in_queues;
        self.oom_freed_at_release = oom_freed;
        true
    }

    /// The peak since the last release (for the log line).
    pub fn peak(&self) -> usize {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_large_fall_below_the_peak_is_due_once() {
        let t0 = Instant::now();
        let mut r = MemRelease::default();
        let limit = 256 * MIB;
        assert!(!r.due(0, 0, limit, t0), "nothing queued, nothing freed");
        assert!(!r.due(250 * MIB, 0, limit, t0));
        assert!(
            !r.due(219 * MIB, 0, limit, t0),
            "31 MiB below the peak: not yet"
        );
        assert!(r.due(218 * MIB, 0, limit, t0), "32 MiB below the peak");
        // The peak restarts at the release: the same level is not due again.
        assert!(!r.due(218 * MIB, 0, limit, t0 + Duration::from_secs(60)));
        assert!(!r.due(190 * MIB, 0, limit, t0 + Duration::from_secs(60)));
        assert!(r.due(186 * MIB, 0, limit, t0 + Duration::from_secs(60)));
    }

    #[test]
    fn releases_are_rate_limited() {
        let t0 = Instant::now();
        let mut r = MemRelease::default();
        let limit = 256 * MIB;
        r.due(200 * MIB, 0, limit, t0);
        assert!(r.due(100 * MIB, 0, limit, t0));
        r.due(200 * MIB, 0, limit, t0 + Duration::from_secs(1));
        assert!(
            !r.due(0, 0, limit, t0 + Duration::from_secs(9)),
            "within the interval"
        );
        assert!(
            r.due(0, 0, limit, t0 + RELEASE_INTERVAL),
            "the fall is still there after it"
        );
    }

    #[test]
    fn the_threshold_follows_a_small_limit() {
        assert_eq!(MemRelease::drop_bytes(16 * MIB), 2 * MIB);
        assert_eq!(MemRelease::drop_bytes(MIB), MIB, "at least 1 MiB");
        assert_eq!(MemRelease::drop_bytes(8 << 30), MAX_DROP_BYTES);
        let t0 = Instant::now();
        let mut r = MemRelease::default();
        r.due(16 * MIB, 0, 16 * MIB, t0);
        assert!(
            r.due(14 * MIB, 0, 16 * MIB, t0),
            "an OOM run at 16 MB frees enough"
        );
    }

    #[test]
    fn memory_the_oom_handler_freed_between_ticks_is_released() {
        let t0 = Instant::now();
        let mut r = MemRelease::default();
        let limit = 16 * MIB;
        // Every tick saw the queues nearly empty: the burst came and was cut between them.
        assert!(!r.due(MIB, 0, limit, t0));
        assert!(
            !r.due(MIB, MIB as u64, limit, t0),
            "1 MiB freed: not enough"
        );
        assert!(
            r.due(MIB, 3 * MIB as u64, limit, t0),
            "3 MiB freed by the handler"
        );
        // What was freed before the release does not count again.
        let later = t0 + RELEASE_INTERVAL;
        assert!(!r.due(MIB, 3 * MIB as u64, limit, later));
        assert!(!r.due(MIB, 4 * MIB as u64, limit, later));
        assert!(r.due(MIB, 5 * MIB as u64, limit, later));
    }

    #[test]
    fn release_calls_the_registered_function_once_registered() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        fn count() {
            CALLS.fetch_add(1, Ordering::SeqCst);
        }
        // The only test that registers (the registration is process-wide).
        assert!(set_release(count));
        assert!(!set_release(count), "a second registration is refused");
        assert!(can_release());
        assert!(release());
        assert_eq!(CALLS.load(Ordering::SeqCst), 1);
    }
}
