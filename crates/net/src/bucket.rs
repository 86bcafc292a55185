//! Token buckets: Tor's `BandwidthRate` / `BandwidthBurst`, in bytes.
//!
//! One read bucket and one write bucket are shared (via `Arc`) by all links of a relay. Tokens
//! accrue continuously from elapsed time, so the sending rate is smooth: there is no periodic
//! refill that would release an artificial burst every tick (C tor's old 1-second refill did).
//!
//! A write bucket may hold back a *reserve* (`QuietReserve`): ordinary consumers wait until the
//! bucket holds more than the reserve, consumers marked quiet may spend it. Under saturation
//! bulk traffic then leaves the bucket at the reserve instead of empty, and a quiet circuit's
//! burst (a web page, a circuit handshake) leaves at once instead of waiting for tokens to
//! accrue behind bulk. The long-run rate is unchanged; the reserve is part of the burst.
//!
//! The bucket's rules are sans-IO ([`chive_core::bucket::TokenBucketState`], time passed in);
//! this is the tokio wrapper that shares one between tasks and sleeps for its waits.

use std::sync::Mutex;

use chive_core::bucket::{Draw, TokenBucketState};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A token bucket limiting a byte rate with a burst allowance, shared by the tasks of a relay.
///
/// `consume(n)` waits while the bucket is in debt and then takes `n`, going into debt by what was
/// missing; the debt is repaid (by later callers waiting) at the configured rate. Waiting for the
/// whole `n` instead would let a stream of small requests starve a large one forever. The rules
/// (refill, floor, debt, re-check intervals) are [`TokenBucketState`]'s; this type adds the
/// lock, tokio's clock and the sleeping.
#[derive(Debug)]
pub struct TokenBucket {
    inner: Mutex<TokenBucketState>,
}

impl TokenBucket {
    /// A bucket with `rate_bytes_per_sec` (0 = unlimited) and a capacity of `burst_bytes`.
    /// It starts full, as in Tor.
    pub fn new(rate_bytes_per_sec: u64, burst_bytes: u64) -> Self {
        TokenBucket {
            inner: Mutex::new(TokenBucketState::new(
                rate_bytes_per_sec,
                burst_bytes,
                now(),
            )),
        }
    }

    /// An unlimited bucket (`consume` never waits).
    pub fn unlimited() -> Self {
        Self::new(0, 0)
    }

    /// Take `n` tokens, waiting while the bucket is in debt.
    ///
    /// Waits until the bucket holds a positive number of tokens, then subtracts `n`, possibly
    /// going negative (debt that later callers wait out). A request is never starved by smaller
    /// ones, and none larger than the burst deadlocks; the overshoot is at most one request.
    /// Ignores the reserve (reads, and writers that do not classify their traffic).
    pub async fn consume(&self, n: usize) {
        self.consume_classed(n, || true, None).await
    }

    /// Like [`TokenBucket::consume`], but while `quiet()` is false the request waits until the
    /// bucket holds more than the reserve, and then takes `n` (going below the reserve by at
    /// most one request). `quiet` is re-evaluated at every re-check (at most
    /// [`chive_core::bucket::MAX_WAIT`] apart, [`chive_core::bucket::QUIET_RECHECK`] while a
    /// reserve holds the request back, and at once when `wake` is notified), so a request can
    /// be promoted while it waits: a writer whose queue gains a quiet batch behind this one.
    pub async fn consume_classed(&self, n: usize, quiet: impl Fn() -> bool, wake: Option<&Notify>) {
        loop {
            let wait = {
                let mut inner = self.lock();
                // Asked only when it matters (limited, with a reserve), as the caller's test
                // may be a shared counter.
                let draw = if !inner.is_unlimited() && inner.reserve() > 0 && !quiet() {
                    Draw::Bulk
                } else {
                    Draw::Quiet
                };
                match inner.try_take(n, draw, now()) {
                    Ok(()) => return,
                    Err(wait) => wait,
                }
            };
            let sleep = tokio::time::sleep(wait);
            match wake {
                Some(w) => {
                    tokio::select! {
                        _ = sleep => {}
                        _ = w.notified() => {}
                    }
                }
                None => sleep.await,
            }
        }
    }

    /// Take up to `n` tokens without waiting; returns how many were taken (0 if the bucket is
    /// empty or in debt). Unlimited buckets always grant `n`.
    pub fn try_consume(&self, n: usize) -> usize {
        self.lock().try_take_up_to(n, now())
    }

    /// Change rate and burst at runtime (SIGHUP). Tokens accrued so far at the old rate are kept,
    /// capped at the new burst; switching from unlimited to limited starts with a full bucket.
    pub fn set_rate(&self, rate: u64, burst: u64) {
        self.lock().set_rate(rate, burst, now());
    }

    /// Hold back `reserve` bytes for quiet consumers; 0 turns it off. Capped at half the
    /// burst, so that ordinary consumers always have tokens above it to take.
    pub fn set_reserve(&self, reserve: u64) {
        self.lock().set_reserve(reserve);
    }

    /// The reserve in force (bytes).
    pub fn reserve(&self) -> u64 {
        self.lock().reserve()
    }

    /// The configured `(rate, burst)`.
    pub fn rate(&self) -> (u64, u64) {
        self.lock().rate()
    }

    /// Tokens currently available (negative while in debt), after refilling. For monitoring.
    pub fn available(&self) -> i64 {
        self.lock().available(now())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TokenBucketState> {
        // The lock is never held across an await or a panic-prone call, but recover from
        // poisoning anyway rather than propagating a panic into every link.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// tokio's clock (paused in tests) as the std instant the sans-IO bucket takes.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_core::bucket::QUIET_RECHECK;
    use std::sync::Arc;
    use std::time::Duration;

    const MB: u64 = 1_000_000;

    /// Panic unless the (paused) clock moved between `min_ms` and `max_ms` since `since`.
    fn assert_waited(since: Instant, min_ms: u64, max_ms: u64) {
        let waited = since.elapsed();
        assert!(
            waited >= Duration::from_millis(min_ms) && waited <= Duration::from_millis(max_ms),
            "waited {waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn rate_over_two_seconds() {
        let burst = 100_000u64;
        let bucket = TokenBucket::new(MB, burst);
        let start = Instant::now();
        let mut total = 0u64;
        while start.elapsed() < Duration::from_secs(2) {
            bucket.consume(10_000).await;
            total += 10_000;
        }
        // 2 s at 1 MB/s plus the initial burst, within one chunk and the wait granularity.
        let expected = 2 * MB + burst;
        assert!(total >= expected - 20_000, "total {total}");
        assert!(total <= expected + 20_000, "total {total}");
    }

    #[tokio::test(start_paused = true)]
    async fn burst_is_immediate_then_waits_exactly() {
        let bucket = TokenBucket::new(MB, 200_000);
        let start = Instant::now();
        bucket.consume(200_000).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "burst must be available at once"
        );
        // 500 kB more: taken as soon as the bucket is out of debt (one refill step), leaving
        // ~500 kB of debt; the next request waits for that debt to be repaid (0.5 s).
        bucket.consume(500_000).await;
        assert_waited(start, 0, 2);
        assert!(bucket.available() <= -497_000);
        bucket.consume(1).await;
        assert_waited(start, 497, 512);
    }

    /// A large request is not starved by a stream of small ones (the old rule, "wait until
    /// min(n, burst) tokens are there", let small consumers take every token as it accrued).
    #[tokio::test(start_paused = true)]
    async fn small_requests_do_not_starve_a_large_one() {
        let bucket = Arc::new(TokenBucket::new(MB, MB));
        bucket.consume(1_000_000).await; // empty it
        let small = {
            let bucket = bucket.clone();
            tokio::spawn(async move {
                loop {
                    bucket.consume(514).await;
                }
            })
        };
        let t = Instant::now();
        let done = tokio::time::timeout(Duration::from_secs(1), bucket.consume(64 * 1024)).await;
        small.abort();
        assert!(done.is_ok(), "large request starved for 1 s");
        assert_waited(t, 0, 100);
    }

    #[tokio::test(start_paused = true)]
    async fn request_larger_than_burst_goes_into_debt() {
        let bucket = TokenBucket::new(MB, 100_000);
        let start = Instant::now();
        // 1 MB > burst: granted once the bucket is full (it is), leaving 900 kB of debt.
        bucket.consume(1_000_000).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(bucket.available() <= -899_000);
        // The next byte waits until the debt is repaid: ~0.9 s.
        bucket.consume(1).await;
        assert_waited(start, 899, 912);
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_waits_and_set_rate_applies() {
        let bucket = TokenBucket::new(0, 0);
        let start = Instant::now();
        for _ in 0..1000 {
            bucket.consume(1_000_000).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(bucket.try_consume(5), 5);

        // Limit it: starts full at the new burst, then enforces the new rate.
        bucket.set_rate(100_000, 10_000);
        assert_eq!(bucket.rate(), (100_000, 10_000));
        assert_eq!(bucket.try_consume(50_000), 10_000);
        assert_eq!(bucket.try_consume(1), 0);
        let t = Instant::now();
        bucket.consume(10_000).await; // taken after one refill step, into 10 kB of debt
        bucket.consume(1).await; // waits for the debt: 0.1 s at 100 kB/s
        assert_waited(t, 99, 112);

        // Raising the rate takes effect for waiters within the 10 ms re-check interval.
        bucket.set_rate(10 * MB, 10_000);
        let t = Instant::now();
        bucket.consume(10_000).await; // 1 ms at 10 MB/s
        assert_waited(t, 0, 11);
    }

    /// Bulk consumers leave the reserve in the bucket; a quiet consumer takes it at once, and
    /// the long-run rate is unchanged.
    #[tokio::test(start_paused = true)]
    async fn bulk_leaves_the_reserve_for_quiet_consumers() {
        let bucket = Arc::new(TokenBucket::new(MB, 100_000));
        bucket.set_reserve(50_000);
        assert_eq!(bucket.reserve(), 50_000);
        let start = Instant::now();
        // Bulk takes 40 kB of the 50 kB above the reserve at once, then waits at the reserve.
        bucket.consume_classed(40_000, || false, None).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        let bulk = {
            let b = bucket.clone();
            tokio::spawn(async move {
                let mut taken = 0u64;
                while start.elapsed() < Duration::from_secs(1) {
                    b.consume_classed(5_000, || false, None).await;
                    taken += 5_000;
                }
                taken
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Under saturation the bucket sits at the reserve (within one bulk request).
        let held = bucket.available();
        assert!((44_000..=51_000).contains(&held), "bucket at {held}");
        // A quiet burst of 50 kB goes at once.
        let t = Instant::now();
        bucket.consume_classed(50_000, || true, None).await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        let bulk_taken = bulk.await.unwrap();
        // 100 kB at the start + 1 MB accrued in the second, minus 40 kB before the loop, 50 kB
        // quiet and the ~50 kB reserve left at the end: bulk got about 960 kB, no more.
        assert!(
            (945_000..=970_000).contains(&bulk_taken),
            "bulk took {bulk_taken}"
        );
    }

    /// A waiting request that becomes quiet (its writer got a quiet batch behind it) stops
    /// respecting the reserve within the re-check interval.
    /// A task taking `n` tokens, as quiet once `promoted` is set (re-checked when `wake` is
    /// notified, if given); it returns when it got them.
    fn spawn_promotable(
        bucket: &Arc<TokenBucket>,
        n: usize,
        promoted: &Arc<std::sync::atomic::AtomicBool>,
        wake: Option<Arc<Notify>>,
    ) -> tokio::task::JoinHandle<Instant> {
        let (b, p) = (bucket.clone(), promoted.clone());
        tokio::spawn(async move {
            let quiet = || p.load(std::sync::atomic::Ordering::Relaxed);
            b.consume_classed(n, quiet, wake.as_deref()).await;
            Instant::now()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_can_be_promoted() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // 1 kB/s: the bucket stays below its reserve for the whole test.
        let bucket = Arc::new(TokenBucket::new(1_000, 100_000));
        bucket.set_reserve(100_000);
        assert_eq!(bucket.reserve(), 50_000, "capped at half the burst");
        bucket.consume_classed(60_000, || false, None).await;
        let promoted = Arc::new(AtomicBool::new(false));
        let waiter = spawn_promotable(&bucket, 10_000, &promoted, None);
        // 40 kB left, all of it reserve: the bulk request waits.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        let t = Instant::now();
        promoted.store(true, Ordering::Relaxed);
        let took = waiter.await.unwrap() - t;
        assert!(took <= QUIET_RECHECK, "{took:?}");
        // With a wake-up, promotion takes effect at once.
        promoted.store(false, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let waiter = spawn_promotable(&bucket, 1_000, &promoted, Some(wake.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        let t = Instant::now();
        promoted.store(true, Ordering::Relaxed);
        wake.notify_one();
        assert_eq!(waiter.await.unwrap(), t);
        // The reserve follows a smaller burst: at most half of it.
        bucket.set_rate(MB, 30_000);
        assert_eq!(bucket.reserve(), 15_000);
    }

    #[tokio::test(start_paused = true)]
    async fn shared_between_tasks() {
        let bucket = Arc::new(TokenBucket::new(MB, 50_000));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let b = bucket.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..50 {
                    b.consume(5_000).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 4 * 50 * 5 kB = 1 MB; 50 kB came from the burst, the rest at 1 MB/s: ~0.95 s.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(940), "{took:?}");
        assert!(took <= Duration::from_millis(970), "{took:?}");
    }
}
