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

use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether the rate is 0 (kept with the rate under the lock): an unlimited bucket grants
    /// every request, so takers skip the lock and the clock read (every read and every batch
    /// of an unlimited relay asks).
    unlimited: AtomicBool,
}

impl TokenBucket {
    /// A bucket with `rate_bytes_per_sec` (0 = unlimited) and a capacity of `burst_bytes`.
    /// It starts full, as in Tor.
    pub fn new(rate_bytes_per_sec: u64, burst_bytes: u64) -> Self {
        Self::new_at(rate_bytes_per_sec, burst_bytes, now())
    }

    /// [`TokenBucket::new`], full at `at` (the tests' virtual clock).
    fn new_at(rate_bytes_per_sec: u64, burst_bytes: u64, at: std::time::Instant) -> Self {
        TokenBucket {
            inner: Mutex::new(TokenBucketState::new(rate_bytes_per_sec, burst_bytes, at)),
            unlimited: AtomicBool::new(rate_bytes_per_sec == 0),
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
        if self.is_unlimited() {
            return;
        }
        loop {
            let wait = match self.attempt(n, &quiet, now()) {
                Ok(()) => return,
                Err(wait) => wait,
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

    /// One attempt of [`TokenBucket::consume_classed`] at `at`: `Ok` if the `n` tokens were
    /// taken, else how long to sleep before the next attempt (the caller's clock is `at`'s).
    fn attempt(
        &self,
        n: usize,
        quiet: &impl Fn() -> bool,
        at: std::time::Instant,
    ) -> Result<(), std::time::Duration> {
        let mut inner = self.lock();
        // Asked only when it matters (limited, with a reserve), as the caller's test may be a
        // shared counter.
        let draw = if !inner.is_unlimited() && inner.reserve() > 0 && !quiet() {
            Draw::Bulk
        } else {
            Draw::Quiet
        };
        inner.try_take(n, draw, at)
    }

    /// Take up to `n` tokens without waiting; returns how many were taken (0 if the bucket is
    /// empty or in debt). Unlimited buckets always grant `n`.
    pub fn try_consume(&self, n: usize) -> usize {
        if self.is_unlimited() {
            return n;
        }
        self.lock().try_take_up_to(n, now())
    }

    /// Change rate and burst at runtime (SIGHUP). Tokens accrued so far at the old rate are kept,
    /// capped at the new burst; switching from unlimited to limited starts with a full bucket.
    pub fn set_rate(&self, rate: u64, burst: u64) {
        let mut inner = self.lock();
        inner.set_rate(rate, burst, now());
        self.unlimited.store(rate == 0, Ordering::Relaxed);
    }

    /// Whether the rate is 0: every request is granted at once, and nothing is counted.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited.load(Ordering::Relaxed)
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

/// tokio's clock as the std instant the sans-IO bucket takes.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

#[cfg(test)]
#[path = "bucket_tests.rs"]
mod tests;
