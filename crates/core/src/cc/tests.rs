//! Congestion control on a simulated path, on a virtual clock.
//!
//! The path model: a backlogged sender (an exit with a large download) packages whenever its
//! [`CircuitWindow`] allows; cells go through one FIFO bottleneck that serves `rate` cells
//! per second, then a one-way propagation delay to the receiver; the receiver's SENDME for
//! every 100th cell (with that cell's digest) takes the same delay back. Because the
//! bottleneck is FIFO with a known service time, each cell's departure is computed when it
//! is sent; the only events are SENDME arrivals. Queueing delay is what the bottleneck adds
//! beyond its service time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use super::shared_path;
use super::{CcKind, FixedWindow, Vegas, VegasParams, CC_CWND_LIMIT};
use crate::flow::{CircuitWindow, CIRCUIT_SENDME_INCREMENT};

fn digest(n: u64) -> [u8; 20] {
    let mut d = [0u8; 20];
    d[..8].copy_from_slice(&n.to_be_bytes());
    d
}

/// The bottleneck's rate, switching once at `change_at` (a competing load arrives).
#[derive(Clone, Copy)]
struct PathSpec {
    rate: f64,
    one_way: Duration,
    change_at: Duration,
    rate_after: f64,
}

impl PathSpec {
    fn steady(rate: f64, one_way_ms: u64) -> Self {
        PathSpec {
            rate,
            one_way: Duration::from_millis(one_way_ms),
            change_at: Duration::MAX,
            rate_after: rate,
        }
    }

    fn service(&self, at: Duration) -> Duration {
        let r = if at < self.change_at {
            self.rate
        } else {
            self.rate_after
        };
        Duration::from_secs_f64(1.0 / r)
    }

    /// The bandwidth-delay product at `rate`, in cells (round trip = twice the one-way delay).
    fn bdp(&self, rate: f64) -> f64 {
        rate * 2.0 * self.one_way.as_secs_f64()
    }
}

/// One sample per SENDME: time since start, the window after it, the last cell's queueing delay.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    cwnd: u32,
    queue_delay: Duration,
}

/// Run a backlogged sender for `duration` over `path`; returns one sample per SENDME and the
/// cells delivered.
fn simulate(window: &mut CircuitWindow, path: PathSpec, duration: Duration) -> (Vec<Sample>, u64) {
    let base = Instant::now();
    let mut now = Duration::ZERO;
    let mut sent = 0u64;
    let mut bottleneck_free = Duration::ZERO;
    let mut last_queue_delay = Duration::ZERO;
    let mut delivered = 0u64;
    let mut sendmes: BinaryHeap<Reverse<(Duration, u64)>> = BinaryHeap::new();
    let mut samples = Vec::new();
    loop {
        while window.can_package() {
            sent += 1;
            window.on_data_sent(digest(sent), base + now);
            let start = bottleneck_free.max(now);
            last_queue_delay = start - now;
            bottleneck_free = start + path.service(start);
            let arrives = bottleneck_free + path.one_way;
            if arrives <= duration {
                delivered += 1;
            }
            if sent.is_multiple_of(u64::from(CIRCUIT_SENDME_INCREMENT)) {
                sendmes.push(Reverse((arrives + path.one_way, sent)));
            }
        }
        let Some(Reverse((at, n))) = sendmes.pop() else {
            panic!("sender stalled after {sent} cells with nothing in flight");
        };
        if at > duration {
            return (samples, delivered);
        }
        now = at;
        window.on_sendme(Some(digest(n)), base + now).unwrap();
        samples.push(Sample {
            at: now,
            cwnd: window.cwnd(),
            queue_delay: last_queue_delay,
        });
    }
}

fn vegas() -> CircuitWindow {
    CircuitWindow::with_policy(CcKind::Vegas(VegasParams::default()).build(1000))
}

fn between(samples: &[Sample], from: Duration, to: Duration) -> Vec<Sample> {
    samples
        .iter()
        .copied()
        .filter(|s| s.at >= from && s.at < to)
        .collect()
}

/// 5000 cells/s (2.5 MB/s) and 60 ms each way: the BDP is 600 cells. Vegas leaves slow start,
/// then keeps between `alpha` and `beta` cells queued (as it measures them), so its window
/// settles within `bdp + alpha - step ..= bdp + beta + step` plus what its RTT samples do not
/// see, and the bottleneck stays busy.
#[test]
fn vegas_window_grows_to_the_bandwidth_delay_product() {
    let path = PathSpec::steady(5000.0, 60);
    let p = VegasParams::default();
    let mut w = vegas();
    let (samples, delivered) = simulate(&mut w, path, Duration::from_secs(20));
    let bdp = path.bdp(path.rate);
    assert!(!w.policy().in_slow_start(), "slow start never ended");
    let late = between(&samples, Duration::from_secs(10), Duration::from_secs(20));
    assert!(late.len() > 100);
    // RTT samples time the last cell of a group of 100, sent in a burst with the group: the
    // smallest one (the base delay, as Vegas sees it) holds up to a group of the circuit's own
    // queue, and a sample up to another group, so the window can sit that much higher.
    let hidden = 2.0 * f64::from(CIRCUIT_SENDME_INCREMENT);
    let lo = bdp + f64::from(p.alpha) - f64::from(p.cwnd_inc);
    let hi = bdp + f64::from(p.beta) + f64::from(p.cwnd_inc) + hidden;
    for s in &late {
        let c = f64::from(s.cwnd);
        assert!(
            (lo..=hi).contains(&c),
            "cwnd {} at {:?} outside {lo}..={hi} (bdp {bdp})",
            s.cwnd,
            s.at
        );
    }
    // The window is never the bottleneck: at least 95% of the link's capacity was used.
    let capacity = path.rate * 20.0;
    assert!(
        delivered as f64 > 0.95 * capacity,
        "{delivered} of {capacity} cells"
    );
}

/// The same path, then the bottleneck's rate halves at 10 s (a competing load): the queue
/// builds, the RTT rises, and Vegas backs off to the new, smaller BDP (300 cells) instead of
/// keeping its old window queued at the bottleneck.
#[test]
fn vegas_backs_off_when_the_queue_builds() {
    let path = PathSpec {
        change_at: Duration::from_secs(10),
        rate_after: 2500.0,
        ..PathSpec::steady(5000.0, 60)
    };
    let p = VegasParams::default();
    let mut w = vegas();
    let (samples, _) = simulate(&mut w, path, Duration::from_secs(25));
    let before = between(&samples, Duration::from_secs(8), Duration::from_secs(10));
    let after = between(&samples, Duration::from_secs(18), Duration::from_secs(25));
    let max_before = before.iter().map(|s| s.cwnd).max().unwrap();
    let max_after = after.iter().map(|s| s.cwnd).max().unwrap();
    let new_bdp = path.bdp(path.rate_after);
    assert!(
        f64::from(max_after) <= new_bdp + f64::from(p.beta + p.cwnd_inc),
        "after the rate halved cwnd is {max_after}, new bdp {new_bdp}"
    );
    assert!(max_after < max_before, "{max_after} !< {max_before}");
    // Queueing delay comes back down to what beta cells cost at the new rate.
    let worst_after = after.iter().map(|s| s.queue_delay).max().unwrap();
    let beta_delay = Duration::from_secs_f64(f64::from(p.beta + p.cwnd_inc) / path.rate_after);
    assert!(
        worst_after <= beta_delay,
        "queue delay {worst_after:?} > {beta_delay:?}"
    );
}

/// The fixed 1000-cell window on the same halved path: it does not move, so its queue (and
/// every cell's wait) stays at `1000 - bdp` cells, more than Vegas keeps.
#[test]
fn fixed_window_does_not_adapt() {
    let path = PathSpec {
        change_at: Duration::from_secs(10),
        rate_after: 2500.0,
        ..PathSpec::steady(5000.0, 60)
    };
    let mut fixed = CircuitWindow::new(1000);
    let (samples, _) = simulate(&mut fixed, path, Duration::from_secs(25));
    assert!(samples.iter().all(|s| s.cwnd == 1000));
    let after = between(&samples, Duration::from_secs(18), Duration::from_secs(25));
    let fixed_delay = after.iter().map(|s| s.queue_delay).max().unwrap();

    let mut v = vegas();
    let (samples, _) = simulate(&mut v, path, Duration::from_secs(25));
    let after = between(&samples, Duration::from_secs(18), Duration::from_secs(25));
    let vegas_delay = after.iter().map(|s| s.queue_delay).max().unwrap();
    // 1000 - 300 = 700 cells at 2500/s: 280 ms.
    assert!(fixed_delay >= Duration::from_millis(270), "{fixed_delay:?}");
    assert!(
        vegas_delay < fixed_delay / 2,
        "{vegas_delay:?} vs {fixed_delay:?}"
    );
}

/// A path whose BDP is beyond the largest window (50 000 cells/s, 60 ms: 6000 cells): the
/// window stops at `cwnd_max`, below the relays' per-circuit queue limit.
#[test]
fn vegas_window_is_bounded() {
    let mut w = vegas();
    let (samples, _) = simulate(
        &mut w,
        PathSpec::steady(50_000.0, 60),
        Duration::from_secs(5),
    );
    assert_eq!(samples.last().unwrap().cwnd, CC_CWND_LIMIT);
    assert!(samples.iter().all(|s| s.cwnd <= CC_CWND_LIMIT));
}

/// An application-limited sender (a trickle, never filling its window) gives no evidence of
/// spare capacity: the window does not grow.
#[test]
fn vegas_does_not_grow_when_the_window_is_unused() {
    let mut w = vegas();
    let base = Instant::now();
    let init = w.cwnd();
    for n in 1..=2_000u64 {
        let t = base + Duration::from_millis(n);
        w.on_data_sent(digest(n), t);
        if n.is_multiple_of(100) {
            w.on_sendme(Some(digest(n)), t + Duration::from_millis(50))
                .unwrap();
        }
    }
    assert_eq!(w.cwnd(), init);
}

/// `cc_alg=0` is today's window exactly: against a reference model of the old arithmetic
/// (package window starts at `start`, -1 per DATA cell, +100 per SENDME, at most 1000) the
/// package window agrees after every step of pseudo-random send/acknowledge sequences.
#[test]
fn fixed_window_matches_the_old_package_window() {
    let base = Instant::now();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for start in [100u32, 101, 150, 500, 999, 1000] {
        let mut w = CircuitWindow::with_policy(Box::new(FixedWindow::new(start)));
        let mut old_package = start;
        let (mut sent, mut acked) = (0u64, 0u64);
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let can_ack = (acked + 1) * 100 <= sent;
            if can_ack && seed.is_multiple_of(3) {
                acked += 1;
                w.on_sendme(Some(digest(acked * 100)), base).unwrap();
                old_package = (old_package + 100).min(1000);
            } else if old_package > 0 {
                assert!(w.can_package());
                sent += 1;
                w.on_data_sent(digest(sent), base);
                old_package -= 1;
            } else {
                assert!(!w.can_package());
            }
            assert_eq!(w.package_window(), old_package, "start {start}");
        }
    }
}

/// Parameters from a consensus are made consistent, whatever an authority sets.
#[test]
fn vegas_params_are_sanitized() {
    let p = VegasParams {
        cwnd_min: 5,
        cwnd_max: 1_000_000,
        cwnd_init: 1,
        ss_max: 0,
        cwnd_inc: 0,
        ..VegasParams::default()
    }
    .sanitized();
    assert_eq!(p.cwnd_min, CIRCUIT_SENDME_INCREMENT);
    assert_eq!(p.cwnd_max, CC_CWND_LIMIT);
    assert_eq!((p.cwnd_init, p.ss_max, p.cwnd_inc), (100, 100, 1));
    assert_eq!(Vegas::new(p).bdp(), None);
}

/// Paper 004's testbed as the shared-path model sees it: 10 Mbit/s of cells (2250 a second),
/// 120 ms each way (four 30 ms hops), two backlogged downloads, a torperf loop fetching 40 KiB
/// (83 cells) and one fetching 1 MiB (2106 cells), each pausing 1 s between fetches.
fn torperf_mix(kind: CcKind, fresh: bool, secs: u64) -> shared_path::Outcome {
    use shared_path::Load;
    let mk = || CircuitWindow::with_policy(kind.build(1000));
    let fetch = |cells, start_ms| Load::Fetches {
        cells,
        pause: Duration::from_secs(1),
        start: Duration::from_millis(start_ms),
        fresh: fresh.then_some(kind),
    };
    shared_path::run(
        vec![
            (mk(), Load::Backlogged),
            (mk(), Load::Backlogged),
            (mk(), fetch(83, 5100)),
            (mk(), fetch(2106, 5000)),
        ],
        TORPERF_RATE,
        Duration::from_millis(120),
        Duration::from_secs(secs),
    )
}

const TORPERF_RATE: f64 = 2250.0;

/// Tor's exit thresholds (multiples of its 62-cell buffers, in chive's 64-cell ones), the
/// defaults before issue 17's change.
fn tor_thresholds() -> VegasParams {
    VegasParams {
        alpha: 128,
        beta: 256,
        gamma: 192,
        delta: 384,
        ..VegasParams::default()
    }
}

struct MixFigures {
    small: Duration,
    large: Duration,
    queue_p50: Duration,
    queue_p95: Duration,
    utilization: f64,
}

fn mix_figures(o: &shared_path::Outcome, secs: u64) -> MixFigures {
    use shared_path::{median, quantile};
    // Leave out the first fetches and the first tenth of the cells (start-up).
    let q = &o.queue_delays[o.queue_delays.len() / 10..];
    MixFigures {
        small: median(&o.fetch_times[2][2..]),
        large: median(&o.fetch_times[3][2..]),
        queue_p50: quantile(q, 0.5),
        queue_p95: quantile(q, 0.95),
        utilization: o.delivered.iter().sum::<u64>() as f64 / (TORPERF_RATE * secs as f64),
    }
}

/// Vegas against the fixed 1000-cell window on paper 004's mix: the bottleneck stays busy,
/// the standing queue is a fraction of the fixed window's, so the 40 KiB fetches are much
/// faster, and the 1 MiB fetches are no slower.
#[test]
fn vegas_keeps_the_shared_queue_short() {
    let secs = 300;
    let v = mix_figures(
        &torperf_mix(CcKind::Vegas(VegasParams::default()), false, secs),
        secs,
    );
    let f = mix_figures(&torperf_mix(CcKind::Fixed, false, secs), secs);
    assert!(
        v.utilization > 0.95,
        "vegas used {:.3} of the link",
        v.utilization
    );
    assert!(
        f.utilization > 0.95,
        "fixed used {:.3} of the link",
        f.utilization
    );
    assert!(
        v.queue_p95 * 3 < f.queue_p95,
        "queue p95 {:?} vs fixed {:?}",
        v.queue_p95,
        f.queue_p95
    );
    assert!(
        v.small * 2 < f.small,
        "40 KiB {:?} vs fixed {:?}",
        v.small,
        f.small
    );
    assert!(
        v.large <= f.large,
        "1 MiB {:?} vs fixed {:?}",
        v.large,
        f.large
    );
}

/// Issue 17's change, on the same mix: chive's smaller queue targets and the cut to the middle
/// of the band against Tor's thresholds with one step per round trip. The standing queue is
/// shorter, so 40 KiB fetches are faster, on open circuits and on fresh ones; 1 MiB fetches on
/// fresh circuits are faster too (they reach their share sooner), and the bottleneck stays
/// busy. (1 MiB fetches on an open circuit get their share of the bottleneck either way: within
/// a tenth, as this model's fetch phases move the median by that much.)
#[test]
fn smaller_targets_shorten_fetches_behind_bulk() {
    let secs = 300;
    for fresh in [false, true] {
        let new = mix_figures(
            &torperf_mix(CcKind::Vegas(VegasParams::default()), fresh, secs),
            secs,
        );
        let old = mix_figures(
            &torperf_mix(CcKind::Vegas(tor_thresholds()), fresh, secs),
            secs,
        );
        let say = format!(
            "fresh={fresh}: 40K {:?} vs {:?}, 1MiB {:?} vs {:?}, queue p50 {:?} vs {:?}, util {:.3} vs {:.3}",
            new.small, old.small, new.large, old.large, new.queue_p50, old.queue_p50,
            new.utilization, old.utilization
        );
        assert!(new.utilization > 0.95, "{say}");
        assert!(new.queue_p50 * 4 < old.queue_p50 * 3, "{say}");
        assert!(new.queue_p95 < old.queue_p95, "{say}");
        assert!(new.small * 10 < old.small * 9, "{say}");
        if fresh {
            assert!(new.large * 10 < old.large * 9, "{say}");
        } else {
            assert!(new.large * 10 < old.large * 11, "{say}");
        }
    }
}
