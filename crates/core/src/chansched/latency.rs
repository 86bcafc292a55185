//! How late the driver reacts to its writers, and the output bound that follows from it.
//!
//! Under a write rate, cells wait for write-bucket tokens in their connection's writer; the
//! send path hands a writer more only when it reports a batch paid ([`super::SendPath::paid`]).
//! Between the moment a writer pays and the moment it holds the next batch lie the report's trip
//! to the driver, the driver's wake-up, the scheduling decision and the writer's wake-up: the
//! *reaction latency*. Whatever is unpaid when room appears must cover it, or the bucket fills
//! unused while the writer waits for work. A fixed bound of 10 ms of the rate does when wake-ups
//! take a millisecond; on a loaded machine (40+ ms late) it caps the rate at bound / latency.
//!
//! [`ReactionLatency`] keeps a smoothed mean and mean deviation of the measured latency (as TCP
//! does for its round trip, RFC 6298); [`stretched_bound`] adds the rate's worth of its upper
//! estimate (mean + 2 deviations) to `OutbufCells`, capped at `OutbufMaxMsec` of the rate. The
//! half-buffer quantum that room is handed out in stays at `OutbufCells / 2`, so a newcomer
//! still waits behind no more than that of one channel's cells.

use std::time::Duration;

use chive_cell::CELL_LEN;

/// Gain of the mean (1/8, as TCP's SRTT).
const MEAN_GAIN: f64 = 0.125;
/// Gain of the mean deviation (1/4, as TCP's RTTVAR).
const DEV_GAIN: f64 = 0.25;
/// Deviations added to the mean for the latency the bound must cover. Late wake-ups are
/// skewed (most are on time, some are very late); the mean alone left the writer idle in every
/// cycle slower than average (the virtual-clock test with exponential latencies).
const DEVS: f64 = 2.0;

/// Smoothed reaction latency (seconds): mean and mean deviation of the samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReactionLatency {
    mean: f64,
    dev: f64,
    samples: u64,
}

impl ReactionLatency {
    /// Add one measured latency.
    pub fn sample(&mut self, lag: Duration) {
        let s = lag.as_secs_f64();
        if self.samples == 0 {
            self.mean = s;
            self.dev = s / 2.0;
        } else {
            self.dev += DEV_GAIN * ((self.mean - s).abs() - self.dev);
            self.mean += MEAN_GAIN * (s - self.mean);
        }
        self.samples = self.samples.saturating_add(1);
    }

    /// The smoothed mean (zero before the first sample).
    pub fn mean(&self) -> Duration {
        Duration::from_secs_f64(self.mean.max(0.0))
    }

    /// The latency the output bound covers: mean + 2 mean deviations.
    pub fn high(&self) -> Duration {
        Duration::from_secs_f64((self.mean + DEVS * self.dev).max(0.0))
    }

    /// Samples taken.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// The output bound in cells: `base` (`OutbufCells`) plus `rate` bytes/s for `latency`, at most
/// `max` of the rate (never below `base`). `base` alone without a rate or with `max` zero
/// (`OutbufMaxMsec = 0`: the fixed bound).
pub fn stretched_bound(base: usize, rate: u64, latency: Duration, max: Duration) -> usize {
    if rate == 0 || max.is_zero() {
        return base;
    }
    let cells_for = |d: Duration| (rate as f64 * d.as_secs_f64() / CELL_LEN as f64).round();
    let cap = cells_for(max).min(1e6) as usize;
    let extra = cells_for(latency).min(1e6) as usize;
    base.saturating_add(extra).min(cap.max(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_bound_is_base_without_rate_or_cap_and_grows_with_latency_up_to_the_cap() {
        let max = 200 * MS;
        assert_eq!(stretched_bound(9, 0, 50 * MS, max), 9);
        assert_eq!(stretched_bound(9, 500_000, 50 * MS, Duration::ZERO), 9);
        assert_eq!(stretched_bound(9, 500_000, Duration::ZERO, max), 9);
        // 50 ms of 500 kB/s is 48.6 cells.
        assert_eq!(stretched_bound(9, 500_000, 50 * MS, max), 9 + 49);
        // 200 ms of the rate: 195 cells at most.
        assert_eq!(stretched_bound(9, 500_000, 2000 * MS, max), 195);
        // A cap below the base leaves the base.
        assert_eq!(stretched_bound(64, 500_000, 2000 * MS, MS), 64);
    }

    #[test]
    fn the_estimate_follows_the_samples_and_covers_their_spread() {
        let mut l = ReactionLatency::default();
        assert_eq!(l.high(), Duration::ZERO);
        for _ in 0..100 {
            l.sample(20 * MS);
        }
        assert!((l.mean().as_secs_f64() - 0.020).abs() < 1e-6);
        assert!(
            l.high() < 21 * MS,
            "steady samples leave no spread: {:?}",
            l.high()
        );
        for i in 0..200 {
            l.sample(if i % 2 == 0 { Duration::ZERO } else { 40 * MS });
        }
        let mean = l.mean().as_secs_f64();
        assert!((0.015..0.025).contains(&mean), "mean {mean}");
        assert!(
            l.high() > 50 * MS,
            "alternating samples spread: {:?}",
            l.high()
        );
        assert_eq!(l.samples(), 300);
    }
}
