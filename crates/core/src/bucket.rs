//! A sans-IO token bucket: Tor's `BandwidthRate` / `BandwidthBurst` in bytes, with the
//! `QuietReserve`. Time is passed in; the bucket never sleeps and never reads a clock.
//! `chive_net::TokenBucket` wraps it for tokio (a mutex, and sleeping for the waits it computes).
//!
//! Tokens accrue continuously from elapsed time, so the sending rate is smooth: there is no
//! periodic refill that would release an artificial burst every tick (C tor's old 1-second refill
//! did). A request is granted as soon as the bucket is above its *floor* and takes all it asked
//! for, going below the floor (into debt) by the rest: the rate holds on average, a request larger
//! than the burst never deadlocks, and a large request is never starved by a stream of small ones
//! (waiting for the whole `n` to accrue let small consumers take every token as it appeared).
//!
//! The floor is 0 for quiet requests and the reserve for bulk ones: under saturation bulk traffic
//! leaves the bucket at the reserve instead of empty, and a quiet circuit's burst (a web page, a
//! circuit handshake) leaves at once instead of waiting for tokens to accrue behind bulk. The
//! long-run rate is unchanged; the reserve is part of the burst.

use std::time::{Duration, Instant};

/// Do not refill more often than this: avoids float work on every small request, without
/// letting the bucket lag measurably behind real time.
pub const REFILL_GRANULARITY: Duration = Duration::from_millis(1);
/// A waiter re-checks the bucket at least this often, so that a rate increase
/// ([`TokenBucketState::set_rate`]) or a competitor's consumption is noticed quickly.
pub const MAX_WAIT: Duration = Duration::from_millis(10);
/// A request held back by the reserve re-checks whether it has become quiet this often.
pub const QUIET_RECHECK: Duration = Duration::from_millis(2);

/// The state of one token bucket. Rate 0 means unlimited.
#[derive(Clone, Debug)]
pub struct TokenBucketState {
    /// Bytes per second; 0 means unlimited.
    rate: u64,
    /// Maximum number of tokens the bucket holds.
    burst: u64,
    /// Tokens only quiet requests may take (at most half the burst).
    reserve: u64,
    /// Current tokens; negative while in debt.
    tokens: f64,
    /// When tokens were last added.
    last_refill: Instant,
}

/// Which requests a bucket serves first when short of tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// May spend the reserve: waits only while the bucket is in debt.
    Quiet,
    /// Leaves the reserve alone: waits until the bucket holds more than it.
    Bulk,
}

impl TokenBucketState {
    /// A bucket with `rate` bytes per second (0 = unlimited) and a capacity of `burst` bytes,
    /// full at `now` (as in Tor), without a reserve.
    pub fn new(rate: u64, burst: u64, now: Instant) -> Self {
        TokenBucketState {
            rate,
            burst,
            reserve: 0,
            tokens: burst as f64,
            last_refill: now,
        }
    }

    /// Add the tokens accrued since the last refill, at most every [`REFILL_GRANULARITY`].
    pub fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last_refill);
        if elapsed < REFILL_GRANULARITY {
            return;
        }
        self.last_refill = now;
        if self.rate == 0 {
            return;
        }
        let added = self.rate as f64 * elapsed.as_secs_f64();
        self.tokens = (self.tokens + added).min(self.burst as f64);
    }

    /// Whether the bucket limits nothing (rate 0).
    pub fn is_unlimited(&self) -> bool {
        self.rate == 0
    }

    /// The level a `draw` request must find the bucket above.
    fn floor(&self, draw: Draw) -> f64 {
        match draw {
            Draw::Bulk if self.reserve > 0 => self.reserve as f64,
            _ => 0.0,
        }
    }

    /// Try to take `n` tokens at `now`. `Ok` if granted (always, when unlimited or `n` is 0):
    /// the bucket was above the floor for `draw` and now holds `n` fewer, possibly going below
    /// it. `Err(wait)`: not granted; ask again after `wait`, which is the time until the bucket
    /// is above the floor ([`Self::time_until_above`]) clamped to
    /// [`REFILL_GRANULARITY`]..=[`MAX_WAIT`], and at most [`QUIET_RECHECK`] while the reserve
    /// holds the request back (it may become quiet meanwhile).
    pub fn try_take(&mut self, n: usize, draw: Draw, now: Instant) -> Result<(), Duration> {
        if n == 0 || self.rate == 0 {
            return Ok(());
        }
        self.refill(now);
        let floor = self.floor(draw);
        if self.tokens > floor {
            self.tokens -= n as f64;
            return Ok(());
        }
        let wait = self.time_until_above(floor);
        let wait = if floor > 0.0 {
            wait.min(QUIET_RECHECK)
        } else {
            wait
        };
        Err(wait.clamp(REFILL_GRANULARITY, MAX_WAIT))
    }

    /// Time until the bucket holds more than `level` tokens (at least one token above it),
    /// counted from the last refill; zero if it already does or the bucket is unlimited.
    pub fn time_until_above(&self, level: f64) -> Duration {
        if self.rate == 0 || self.tokens > level {
            return Duration::ZERO;
        }
        let deficit = level + 1.0 - self.tokens;
        Duration::from_secs_f64(deficit / self.rate as f64)
    }

    /// Time until the bucket holds `n` tokens (capped at the burst, which is all it can hold),
    /// counted from the last refill; zero if it already does or the bucket is unlimited.
    pub fn time_until(&self, n: u64) -> Duration {
        let want = n.min(self.burst) as f64;
        if self.rate == 0 || self.tokens >= want {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((want - self.tokens) / self.rate as f64)
    }

    /// Take up to `n` tokens without going into debt; returns how many were taken (0 if the
    /// bucket holds less than one token). Unlimited buckets grant `n`.
    pub fn try_take_up_to(&mut self, n: usize, now: Instant) -> usize {
        if self.rate == 0 {
            return n;
        }
        self.refill(now);
        if self.tokens < 1.0 {
            return 0;
        }
        let granted = (self.tokens.floor() as u64).min(n as u64) as usize;
        self.tokens -= granted as f64;
        granted
    }

    /// Change rate and burst (SIGHUP). Tokens accrued so far at the old rate are kept, capped at
    /// the new burst; switching from unlimited to limited starts with a full bucket. The reserve
    /// follows a smaller burst (at most half of it).
    pub fn set_rate(&mut self, rate: u64, burst: u64, now: Instant) {
        let was_unlimited = self.rate == 0;
        self.refill(now);
        self.last_refill = now;
        self.rate = rate;
        self.burst = burst;
        self.reserve = self.reserve.min(burst / 2);
        self.tokens = if was_unlimited {
            burst as f64
        } else {
            self.tokens.min(burst as f64)
        };
    }

    /// Hold back `reserve` bytes for quiet requests; 0 turns it off. Capped at half the burst,
    /// so that bulk requests always have tokens above it to take.
    pub fn set_reserve(&mut self, reserve: u64) {
        self.reserve = reserve.min(self.burst / 2);
    }

    /// The reserve in force (bytes).
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// The configured `(rate, burst)`.
    pub fn rate(&self) -> (u64, u64) {
        (self.rate, self.burst)
    }

    /// Tokens available at `now` (negative while in debt), after refilling.
    pub fn available(&mut self, now: Instant) -> i64 {
        self.refill(now);
        self.tokens as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;
    const MS: Duration = Duration::from_millis(1);

    /// Take `n` as a waiter would: ask, advance the virtual clock by the returned wait, repeat.
    fn take(b: &mut TokenBucketState, n: usize, draw: Draw, now: &mut Instant) -> Duration {
        let start = *now;
        while let Err(wait) = b.try_take(n, draw, *now) {
            *now += wait;
        }
        *now - start
    }

    #[test]
    fn rate_and_burst_over_two_virtual_seconds() {
        let t0 = Instant::now();
        let mut now = t0;
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        let mut total = 0u64;
        while now - t0 < Duration::from_secs(2) {
            take(&mut b, 10_000, Draw::Quiet, &mut now);
            total += 10_000;
        }
        let expected = 2 * MB + 100_000;
        assert!(total.abs_diff(expected) <= 20_000, "total {total}");
    }

    #[test]
    fn burst_is_immediate_then_debt_is_repaid_at_the_rate() {
        let t0 = Instant::now();
        let mut now = t0;
        let mut b = TokenBucketState::new(MB, 200_000, t0);
        assert_eq!(b.try_take(200_000, Draw::Quiet, now), Ok(()));
        // Empty, not in debt: the next request waits one refill step, then goes into debt.
        assert_eq!(take(&mut b, 500_000, Draw::Quiet, &mut now), MS);
        assert!(b.available(now) <= -499_000);
        // The debt (500 kB at 1 MB/s) is repaid before anything else is granted.
        let waited = take(&mut b, 1, Draw::Quiet, &mut now);
        assert!(
            (Duration::from_millis(499)..=Duration::from_millis(512)).contains(&waited),
            "{waited:?}"
        );
    }

    #[test]
    fn waits_are_clamped_to_granularity_and_recheck_interval() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        b.try_take(1_000_000, Draw::Quiet, t0).unwrap();
        // 900 kB of debt: 0.9 s away, but a waiter re-checks every MAX_WAIT.
        assert_eq!(b.try_take(1, Draw::Quiet, t0), Err(MAX_WAIT));
        assert_eq!(
            b.time_until_above(0.0),
            Duration::from_secs_f64(900_001.0 / MB as f64)
        );
        // Nearly repaid: the wait is never shorter than one refill step.
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        b.try_take(100_000, Draw::Quiet, t0).unwrap();
        assert_eq!(b.try_take(1, Draw::Quiet, t0), Err(REFILL_GRANULARITY));
    }

    #[test]
    fn refill_has_one_millisecond_granularity() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        b.try_take(100_000, Draw::Quiet, t0).unwrap();
        assert_eq!(b.available(t0 + Duration::from_micros(900)), 0);
        assert_eq!(b.available(t0 + MS), 1_000);
        // Not refilled again within the next millisecond.
        assert_eq!(b.available(t0 + MS + Duration::from_micros(999)), 1_000);
        assert_eq!(b.available(t0 + 2 * MS + Duration::from_micros(999)), 2_999);
    }

    #[test]
    fn bulk_stops_at_the_reserve_quiet_spends_it() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        b.set_reserve(50_000);
        assert_eq!(b.reserve(), 50_000);
        // Above the reserve: bulk is granted and may go below it by its request.
        assert_eq!(b.try_take(45_000, Draw::Bulk, t0), Ok(()));
        assert_eq!(b.try_take(10_000, Draw::Bulk, t0), Ok(()));
        assert_eq!(b.available(t0), 45_000);
        // At or below the reserve: bulk waits, re-checking often in case it turns quiet.
        assert_eq!(b.try_take(1, Draw::Bulk, t0), Err(QUIET_RECHECK));
        assert_eq!(
            b.time_until_above(50_000.0),
            Duration::from_secs_f64(5_001.0 / MB as f64)
        );
        // Quiet takes the reserve at once.
        assert_eq!(b.try_take(45_000, Draw::Quiet, t0), Ok(()));
        assert_eq!(b.available(t0), 0);
        // Bulk waits until the bucket is back above the reserve: 50 ms at 1 MB/s.
        let mut now = t0;
        let waited = take(&mut b, 1_000, Draw::Bulk, &mut now);
        assert!(
            (Duration::from_millis(50)..=Duration::from_millis(52)).contains(&waited),
            "{waited:?}"
        );
    }

    #[test]
    fn saturating_bulk_leaves_the_reserve_and_the_rate_holds() {
        let t0 = Instant::now();
        let mut now = t0;
        let mut b = TokenBucketState::new(MB, 100_000, t0);
        b.set_reserve(50_000);
        let mut bulk = 0u64;
        while now - t0 < Duration::from_secs(1) {
            take(&mut b, 5_000, Draw::Bulk, &mut now);
            bulk += 5_000;
        }
        let held = b.available(now);
        assert!((44_000..=51_000).contains(&held), "bucket at {held}");
        // 100 kB burst + 1 MB accrued, less the ~50 kB reserve left in the bucket.
        assert!((1_040_000..=1_060_000).contains(&bulk), "bulk took {bulk}");
        assert_eq!(b.try_take(held as usize, Draw::Quiet, now), Ok(()));
    }

    #[test]
    fn reserve_is_capped_at_half_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(1_000, 100_000, t0);
        b.set_reserve(100_000);
        assert_eq!(b.reserve(), 50_000);
        b.set_rate(MB, 30_000, t0);
        assert_eq!(b.reserve(), 15_000);
        b.set_reserve(0);
        assert_eq!(b.try_take(20_000, Draw::Bulk, t0), Ok(()));
    }

    #[test]
    fn unlimited_grants_everything_and_set_rate_starts_full() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(0, 0, t0);
        assert!(b.is_unlimited());
        for _ in 0..1000 {
            assert_eq!(b.try_take(1_000_000, Draw::Bulk, t0), Ok(()));
        }
        assert_eq!(b.try_take_up_to(5, t0), 5);
        b.set_rate(100_000, 10_000, t0);
        assert_eq!(b.rate(), (100_000, 10_000));
        assert_eq!(b.try_take_up_to(50_000, t0), 10_000);
        assert_eq!(b.try_take_up_to(1, t0), 0);
        assert_eq!(b.time_until(10_000), Duration::from_millis(100));
        // Tokens accrued at the old rate survive a rate change, capped at the new burst.
        let t1 = t0 + Duration::from_millis(50);
        b.set_rate(MB, 2_000, t1);
        assert_eq!(b.available(t1), 2_000);
        // A request larger than the burst needs only a full bucket.
        assert_eq!(b.time_until(1_000_000), Duration::ZERO);
    }

    #[test]
    fn a_large_request_is_not_starved_by_small_ones() {
        let t0 = Instant::now();
        let mut b = TokenBucketState::new(MB, MB, t0);
        b.try_take(1_000_000, Draw::Quiet, t0).unwrap();
        // Small requests drain every token as it accrues; the large one asks in between and is
        // granted the first time the bucket is above zero.
        let mut granted_at = None;
        for step in 1..100u32 {
            let now = t0 + MS * step;
            if b.try_take(64 * 1024, Draw::Quiet, now).is_ok() {
                granted_at = Some(step);
                break;
            }
            while b.try_take_up_to(514, now) > 0 {}
        }
        assert_eq!(granted_at, Some(1));
    }
}
