//! The tokio token bucket's tests. The waiting rules run on a virtual clock: consumers are
//! simulated as the tasks calling `consume_classed` would run (attempt; refused, sleep the
//! returned wait or until woken; granted, start the next request at once), earliest wake-up
//! first, so rates and waits are exact and the tests need neither real time nor tokio's paused
//! clock (its `test-util` feature would otherwise be compiled into the relay binary). One test
//! runs the async wrapper itself on tokio's real clock, with lower bounds only.

use super::*;
use chive_core::bucket::QUIET_RECHECK;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MB: u64 = 1_000_000;
const MS: Duration = Duration::from_millis(1);

/// A task taking `n` tokens per request from a shared bucket, on the virtual clock.
#[derive(Debug)]
struct Consumer {
    n: usize,
    /// Its draw: quiet requests may spend the reserve (tests flip it to promote a waiter).
    quiet: bool,
    /// When it attempts next.
    at: Instant,
    /// When its current request started.
    since: Instant,
    /// Requests granted so far.
    granted: u64,
    /// Stop after this many requests…
    max: Option<u64>,
    /// …or, like `while start.elapsed() < d { consume }`, before a request that would start at
    /// or after this time.
    until: Option<Instant>,
    /// When it stopped.
    done: Option<Instant>,
}

impl Consumer {
    fn new(n: usize, quiet: bool, at: Instant) -> Self {
        Consumer {
            n,
            quiet,
            at,
            since: at,
            granted: 0,
            max: None,
            until: None,
            done: None,
        }
    }

    fn requests(mut self, max: u64) -> Self {
        self.max = Some(max);
        self
    }

    fn until(mut self, until: Instant) -> Self {
        self.until = Some(until);
        self
    }

    fn taken(&self) -> u64 {
        self.granted * self.n as u64
    }

    /// What a notified waiter does: attempt again at once.
    fn wake(&mut self, now: Instant) {
        self.at = self.at.min(now);
    }
}

/// Run the consumers' attempts up to and including `horizon`, earliest first. Consumers due at
/// the same instant go in the order their requests started (the longest waiting first, then the
/// lowest index): a fair runtime's order, under which a request that is granted whenever the
/// bucket is above its floor cannot be starved (one that waited for `n` tokens could).
fn run(bucket: &TokenBucket, consumers: &mut [Consumer], horizon: Instant) {
    loop {
        let next = consumers
            .iter_mut()
            .filter(|c| c.done.is_none() && c.at <= horizon)
            .min_by_key(|c| (c.at, c.since));
        let Some(c) = next else { return };
        if c.until.is_some_and(|u| c.at >= u) {
            c.done = Some(c.at);
            continue;
        }
        let quiet = c.quiet;
        match bucket.attempt(c.n, &|| quiet, c.at) {
            Ok(()) => {
                c.granted += 1;
                c.since = c.at;
                if c.max.is_some_and(|m| c.granted >= m) {
                    c.done = Some(c.at);
                }
            }
            Err(wait) => c.at += wait,
        }
    }
}

/// One request alone: attempt at `now`, advance the virtual clock by each wait, repeat.
/// Returns how long it waited.
fn take(bucket: &TokenBucket, n: usize, quiet: bool, now: &mut Instant) -> Duration {
    let mut c = [Consumer::new(n, quiet, *now).requests(1)];
    run(bucket, &mut c, *now + Duration::from_secs(3600));
    let done = c[0].done.expect("granted within the hour");
    let waited = done - *now;
    *now = done;
    waited
}

/// Panic unless `waited` lies between `min_ms` and `max_ms`.
fn assert_waited(waited: Duration, min_ms: u64, max_ms: u64) {
    assert!(
        waited >= Duration::from_millis(min_ms) && waited <= Duration::from_millis(max_ms),
        "waited {waited:?}"
    );
}

#[test]
fn rate_over_two_seconds() {
    let t0 = Instant::now();
    let burst = 100_000u64;
    let bucket = TokenBucket::new_at(MB, burst, t0);
    let mut c = [Consumer::new(10_000, false, t0).until(t0 + Duration::from_secs(2))];
    run(&bucket, &mut c, t0 + Duration::from_secs(3));
    let total = c[0].taken();
    // 2 s at 1 MB/s plus the initial burst, within one chunk and the wait granularity.
    let expected = 2 * MB + burst;
    assert!(total >= expected - 20_000, "total {total}");
    assert!(total <= expected + 20_000, "total {total}");
}

#[test]
fn burst_is_immediate_then_waits_exactly() {
    let t0 = Instant::now();
    let mut now = t0;
    let bucket = TokenBucket::new_at(MB, 200_000, t0);
    let waited = take(&bucket, 200_000, false, &mut now);
    assert_eq!(waited, Duration::ZERO, "burst must be available at once");
    // 500 kB more: taken as soon as the bucket is out of debt (one refill step), leaving
    // ~500 kB of debt; the next request waits for that debt to be repaid (0.5 s).
    take(&bucket, 500_000, false, &mut now);
    assert_waited(now - t0, 0, 2);
    assert!(bucket.lock().available(now) <= -497_000);
    take(&bucket, 1, false, &mut now);
    assert_waited(now - t0, 497, 512);
}

/// A large request is not starved by a stream of small ones (the old rule, "wait until
/// min(n, burst) tokens are there", let small consumers take every token as it accrued).
#[test]
fn small_requests_do_not_starve_a_large_one() {
    let t0 = Instant::now();
    let mut now = t0;
    let bucket = TokenBucket::new_at(MB, MB, t0);
    take(&bucket, 1_000_000, false, &mut now); // empty it
    let second = now + Duration::from_secs(1);
    let mut c = [
        Consumer::new(514, false, now).until(second),
        Consumer::new(64 * 1024, false, now).requests(1),
    ];
    run(&bucket, &mut c, second);
    let done = c[1].done.expect("large request starved for 1 s");
    assert_waited(done - now, 0, 100);
    assert!(c[0].granted > 100, "the small requests ran too");
}

#[test]
fn request_larger_than_burst_goes_into_debt() {
    let t0 = Instant::now();
    let mut now = t0;
    let bucket = TokenBucket::new_at(MB, 100_000, t0);
    // 1 MB > burst: granted once the bucket is full (it is), leaving 900 kB of debt.
    assert_eq!(take(&bucket, 1_000_000, false, &mut now), Duration::ZERO);
    assert!(bucket.lock().available(now) <= -899_000);
    // The next byte waits until the debt is repaid: ~0.9 s.
    take(&bucket, 1, false, &mut now);
    assert_waited(now - t0, 899, 912);
}

#[test]
fn unlimited_never_waits_and_set_rate_applies() {
    let t0 = Instant::now();
    let mut now = t0;
    let bucket = TokenBucket::new_at(0, 0, t0);
    for _ in 0..1000 {
        take(&bucket, 1_000_000, false, &mut now);
    }
    assert_eq!(now, t0);
    assert_eq!(bucket.lock().try_take_up_to(5, now), 5);

    // Limit it: starts full at the new burst, then enforces the new rate.
    bucket.lock().set_rate(100_000, 10_000, now);
    assert_eq!(bucket.rate(), (100_000, 10_000));
    assert_eq!(bucket.lock().try_take_up_to(50_000, now), 10_000);
    assert_eq!(bucket.lock().try_take_up_to(1, now), 0);
    let t = now;
    take(&bucket, 10_000, false, &mut now); // taken after one refill step, into 10 kB of debt
    take(&bucket, 1, false, &mut now); // waits for the debt: 0.1 s at 100 kB/s
    assert_waited(now - t, 99, 112);

    // Raising the rate takes effect for waiters within the 10 ms re-check interval.
    bucket.lock().set_rate(10 * MB, 10_000, now);
    let t = now;
    take(&bucket, 10_000, false, &mut now); // 1 ms at 10 MB/s
    assert_waited(now - t, 0, 11);
}

/// Bulk consumers leave the reserve in the bucket; a quiet consumer takes it at once, and
/// the long-run rate is unchanged.
#[test]
fn bulk_leaves_the_reserve_for_quiet_consumers() {
    let t0 = Instant::now();
    let mut now = t0;
    let bucket = TokenBucket::new_at(MB, 100_000, t0);
    bucket.set_reserve(50_000);
    assert_eq!(bucket.reserve(), 50_000);
    // Bulk takes 40 kB of the 50 kB above the reserve at once, then waits at the reserve.
    assert_eq!(take(&bucket, 40_000, false, &mut now), Duration::ZERO);
    let mut bulk = [Consumer::new(5_000, false, now).until(t0 + Duration::from_secs(1))];
    let half = t0 + Duration::from_millis(500);
    run(&bucket, &mut bulk, half);
    // Under saturation the bucket sits at the reserve (within one bulk request).
    let held = bucket.lock().available(half);
    assert!((44_000..=51_000).contains(&held), "bucket at {held}");
    // A quiet burst of 50 kB goes at once.
    assert_eq!(bucket.attempt(50_000, &|| true, half), Ok(()));
    run(&bucket, &mut bulk, t0 + Duration::from_secs(2));
    let bulk_taken = bulk[0].taken();
    // 100 kB at the start + 1 MB accrued in the second, minus 40 kB before the loop, 50 kB
    // quiet and the ~50 kB reserve left at the end: bulk got about 960 kB, no more.
    assert!(
        (945_000..=970_000).contains(&bulk_taken),
        "bulk took {bulk_taken}"
    );
}

/// A waiting request that becomes quiet (its writer got a quiet batch behind it) stops
/// respecting the reserve within the re-check interval, and at once when woken.
#[test]
fn a_waiting_request_can_be_promoted() {
    let t0 = Instant::now();
    let mut now = t0;
    // 1 kB/s: the bucket stays below its reserve for the whole test.
    let bucket = TokenBucket::new_at(1_000, 100_000, t0);
    bucket.set_reserve(100_000);
    assert_eq!(bucket.reserve(), 50_000, "capped at half the burst");
    take(&bucket, 60_000, false, &mut now);
    // 40 kB left, all of it reserve: the bulk request waits.
    let mut waiter = [Consumer::new(10_000, false, now).requests(1)];
    let t = now + 50 * MS;
    run(&bucket, &mut waiter, t);
    assert!(waiter[0].done.is_none());
    waiter[0].quiet = true;
    run(&bucket, &mut waiter, t + Duration::from_secs(1));
    let took = waiter[0].done.expect("promoted") - t;
    assert!(took <= QUIET_RECHECK, "{took:?}");
    // With a wake-up, promotion takes effect at once.
    let start = t + took;
    let mut waiter = [Consumer::new(1_000, false, start).requests(1)];
    let t = start + 50 * MS;
    run(&bucket, &mut waiter, t);
    assert!(waiter[0].done.is_none());
    waiter[0].quiet = true;
    waiter[0].wake(t);
    run(&bucket, &mut waiter, t + Duration::from_secs(1));
    assert_eq!(waiter[0].done, Some(t));
    // The reserve follows a smaller burst: at most half of it.
    bucket.lock().set_rate(MB, 30_000, t);
    assert_eq!(bucket.reserve(), 15_000);
}

#[test]
fn shared_between_tasks() {
    let t0 = Instant::now();
    let bucket = TokenBucket::new_at(MB, 50_000, t0);
    let mut tasks: Vec<Consumer> = (0..4)
        .map(|_| Consumer::new(5_000, false, t0).requests(50))
        .collect();
    run(&bucket, &mut tasks, t0 + Duration::from_secs(10));
    // 4 * 50 * 5 kB = 1 MB; 50 kB came from the burst, the rest at 1 MB/s: ~0.95 s.
    let took = tasks
        .iter()
        .map(|c| c.done.expect("finished"))
        .max()
        .unwrap()
        - t0;
    assert!(took >= Duration::from_millis(940), "{took:?}");
    assert!(took <= Duration::from_millis(970), "{took:?}");
}

/// The async wrapper on tokio's real clock: it sleeps for the waits (lower bounds only: a
/// sleep never ends early, and a loaded machine may make it later), a promoted waiter that is
/// woken completes, and the public methods read the same clock.
#[tokio::test]
async fn the_async_wrapper_sleeps_on_the_tokio_clock() {
    let bucket = Arc::new(TokenBucket::new(MB, 10_000));
    let start = tokio::time::Instant::now();
    bucket.consume(20_000).await; // granted at once, 10 kB into debt
    bucket.consume(1).await; // waits ~10 ms for the debt
    assert!(start.elapsed() >= 9 * MS, "{:?}", start.elapsed());

    // A bulk waiter held back by the reserve, promoted and woken, completes.
    let bucket = Arc::new(TokenBucket::new(1_000, 100_000));
    bucket.set_reserve(50_000);
    let promoted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    let waiter = {
        let (b, p, w) = (bucket.clone(), promoted.clone(), wake.clone());
        tokio::spawn(async move {
            let quiet = || p.load(std::sync::atomic::Ordering::Relaxed);
            b.consume_classed(60_000, quiet, Some(&w)).await; // at once: 40 kB left
            b.consume_classed(1_000, quiet, Some(&w)).await; // waits: all 40 kB are reserve
        })
    };
    // At 1 kB/s the bucket cannot climb back above the 50 kB reserve for tens of seconds.
    tokio::time::sleep(20 * MS).await;
    assert!(!waiter.is_finished());
    promoted.store(true, std::sync::atomic::Ordering::Relaxed);
    wake.notify_one();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("promoted waiter finished")
        .unwrap();

    // Unlimited again: nothing waits, and takers no longer look at the state.
    bucket.set_rate(0, 0);
    assert_eq!(bucket.rate(), (0, 0));
    assert!(bucket.is_unlimited());
    bucket.consume(1 << 30).await;
    assert_eq!(bucket.try_consume(5), 5);

    // Limited once more through the wrapper: the takers' shortcut is off again and the debt
    // is waited out (a bucket that kept its unlimited shortcut would not wait).
    bucket.set_rate(MB, 10_000);
    assert!(!bucket.is_unlimited());
    let start = tokio::time::Instant::now();
    bucket.consume(20_000).await;
    bucket.consume(1).await;
    assert!(start.elapsed() >= 9 * MS, "{:?}", start.elapsed());
}
