//! The entry relay's congestion detector (paper 003, section 4.2, Algorithm 1) and its choice of
//! the circuit to move.
//!
//! One [`CongestionDetector`] per outgoing connection. Every `sample_interval` the driver passes
//! the connection's output-buffer occupancy (cells in chive's bounded outbuf plus the bytes the
//! kernel still holds unsent, [`Occupancy`]); between samples it reports every write the socket
//! refused ([`CongestionDetector::write_refused`]: a real EAGAIN / not-writable event, not an
//! application counter). The detector smooths the occupancy,
//!
//! ```text
//! B_t = γ·B_{t−1} + (1−γ)·B_sample
//! ```
//!
//! and classifies B_t against the buffer size C (32 KB, as in the paper):
//!
//! - B_t > β·C: overfull, congestion;
//! - α·C ≤ B_t ≤ β·C: no action;
//! - B_t < α·C: underfull.
//!
//! **Why α and β are fractions of the buffer, not of B_{t−1}.** The paper writes the band both
//! as `α·B_{t−1} ≤ B_t ≤ β·B_{t−1}` and as "fractions of the total allocated memory for each
//! output buffer, which is 32 KB". With the paper's own defaults the relative reading is
//! degenerate: since B_t ≥ γ·B_{t−1} = 0.7·B_{t−1} for any sample ≥ 0, `B_t > 0.5·B_{t−1}` holds
//! on every sample once anything was ever queued, and `B_t < 0.1·B_{t−1}` never does; every
//! β < γ would fire constantly. It also contradicts the paper's measurement that larger α and β
//! lengthen the time to switch "due to more cells queued up": only an absolute threshold needs
//! more queued bytes when it grows. So chive reads α and β as fractions of the buffer.
//!
//! **Edge-triggered, with α as the re-arm level.** A congested connection is reported once
//! ([`Trigger`]), then the detector is *latched*: it reports again only after the occupancy went
//! underfull (B_t < α·C, the paper's "underfull", so a drained connection may switch again at
//! once) or after `holdoff` (the one switch did not relieve it; the next-heaviest circuit may
//! go). Without the latch a connection that stays full for the duration of one switch would
//! move every circuit it carries, one per sample.
//!
//! **Refused writes** trigger at the next sample whatever B_t is (the paper's "S → 0"), subject
//! to the same latch.
//!
//! Samples are taken when the driver calls [`CongestionDetector::sample`] at or after
//! [`CongestionDetector::next_sample`]; early calls change nothing, so the outcome depends only
//! on the occupancies passed and the times they were passed at.

use std::time::{Duration, Instant};

use crate::CircKey;

/// Settings of a detector. Build with [`DetectorConfig::new`] (checks ranges) or take
/// [`DetectorConfig::default`] (the paper's values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DetectorConfig {
    gamma: f64,
    alpha: f64,
    beta: f64,
    sample_interval: Duration,
    buffer_bytes: u64,
    holdoff: Duration,
}

impl Default for DetectorConfig {
    /// γ 0.7, α 0.1, β 0.5 (paper 003), 100 ms samples, a 32 KB buffer, 1 s hold-off.
    fn default() -> Self {
        DetectorConfig {
            gamma: 0.7,
            alpha: 0.1,
            beta: 0.5,
            sample_interval: Duration::from_millis(100),
            buffer_bytes: 32_768,
            holdoff: Duration::from_secs(1),
        }
    }
}

/// Why a [`DetectorConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("switching detector: {0}")]
pub struct DetectorConfigError(&'static str);

impl DetectorConfig {
    /// A configuration; γ must lie in (0, 1), 0 ≤ α ≤ β ≤ 1, the interval and the buffer must
    /// be non-zero.
    pub fn new(
        gamma: f64,
        alpha: f64,
        beta: f64,
        sample_interval: Duration,
        buffer_bytes: u64,
    ) -> Result<Self, DetectorConfigError> {
        // Written so that NaN fails every check.
        if !(gamma > 0.0 && gamma < 1.0) {
            return Err(DetectorConfigError("γ must lie strictly between 0 and 1"));
        }
        if !(alpha >= 0.0 && beta <= 1.0 && alpha <= beta) {
            return Err(DetectorConfigError("need 0 ≤ α ≤ β ≤ 1"));
        }
        if sample_interval.is_zero() || buffer_bytes == 0 {
            return Err(DetectorConfigError(
                "sample interval and buffer must be non-zero",
            ));
        }
        Ok(DetectorConfig {
            gamma,
            alpha,
            beta,
            sample_interval,
            buffer_bytes,
            holdoff: DetectorConfig::default().holdoff,
        })
    }

    /// From the consensus's integers (thousandths, milliseconds; see chive-dir's
    /// `SwitchingParams`, already clamped there). Out-of-range values are refused, not clamped.
    pub fn from_milli(
        gamma_milli: u32,
        alpha_milli: u32,
        beta_milli: u32,
        sample_interval_ms: u32,
        buffer_bytes: u32,
    ) -> Result<Self, DetectorConfigError> {
        let frac = |m: u32| f64::from(m) / 1000.0;
        DetectorConfig::new(
            frac(gamma_milli),
            frac(alpha_milli),
            frac(beta_milli),
            Duration::from_millis(u64::from(sample_interval_ms)),
            u64::from(buffer_bytes),
        )
    }

    /// The same, with another hold-off (how long a latched detector waits before it may
    /// report a connection that never went underfull again).
    pub fn with_holdoff(mut self, holdoff: Duration) -> Self {
        self.holdoff = holdoff;
        self
    }

    /// The sample interval.
    pub fn sample_interval(&self) -> Duration {
        self.sample_interval
    }

    fn overfull_bytes(&self) -> f64 {
        self.beta * self.buffer_bytes as f64
    }

    fn underfull_bytes(&self) -> f64 {
        self.alpha * self.buffer_bytes as f64
    }
}

/// One sample of a connection's output-buffer occupancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Occupancy {
    /// Cells handed to the connection but not yet written (chive's bounded outbuf).
    pub outbuf_cells: u64,
    /// Bytes written to the socket that the kernel has not sent yet (`SIOCOUTQ` minus
    /// unacknowledged-but-sent, or the whole send queue where only that is known).
    pub kernel_unsent_bytes: u64,
    /// Bytes sent that wait in a queue on the path (a shaper's or router's, downstream of the
    /// socket), estimated from the socket's round trips: in flight × (srtt − min_rtt) / srtt.
    /// 0 where the driver does not count it (`SwitchNetworkQueue 0`).
    pub network_queued_bytes: u64,
}

impl Occupancy {
    /// Total bytes: cells count at their wire size.
    pub fn bytes(&self) -> u64 {
        self.outbuf_cells
            .saturating_mul(chive_cell::CELL_LEN as u64)
            .saturating_add(self.kernel_unsent_bytes)
            .saturating_add(self.network_queued_bytes)
    }
}

/// Where a connection's smoothed occupancy lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// B_t < α·C.
    Underfull,
    /// α·C ≤ B_t ≤ β·C: no action.
    Normal,
    /// B_t > β·C.
    Overfull,
}

/// What made a detector report congestion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerReason {
    /// The smoothed occupancy rose above β·C.
    Overfull,
    /// The socket refused a write since the previous sample (checked first: it is the
    /// stronger signal).
    WriteRefused,
}

/// The detector's report: move a circuit off this connection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trigger {
    /// Why.
    pub reason: TriggerReason,
    /// B_t in bytes at the sample that fired (for the `switch` metrics record).
    pub estimate_bytes: f64,
}

/// The outcome of one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// B_t after this sample, in bytes.
    pub estimate_bytes: f64,
    /// Its level.
    pub level: Level,
    /// Set when the connection is reported congested.
    pub trigger: Option<Trigger>,
}

/// Per-connection congestion detector. See the module documentation.
#[derive(Clone, Debug)]
pub struct CongestionDetector {
    config: DetectorConfig,
    /// B_{t−1}; `None` before the first sample.
    estimate: Option<f64>,
    /// When the next sample is due; `None` before the first.
    next_sample: Option<Instant>,
    /// A write was refused since the last sample.
    refused: bool,
    /// Reported and not re-armed yet: until when (the hold-off).
    latched_until: Option<Instant>,
}

impl CongestionDetector {
    /// A detector for a new connection (B_0 = 0; the first sample may be taken at once).
    pub fn new(config: DetectorConfig) -> Self {
        CongestionDetector {
            config,
            estimate: None,
            next_sample: None,
            refused: false,
            latched_until: None,
        }
    }

    /// The socket refused a write (would block / not writable with data pending).
    pub fn write_refused(&mut self) {
        self.refused = true;
    }

    /// When the next sample is due (`None`: at once).
    pub fn next_sample(&self) -> Option<Instant> {
        self.next_sample
    }

    /// B_{t} of the last sample, in bytes (0 before the first).
    pub fn estimate_bytes(&self) -> f64 {
        self.estimate.unwrap_or(0.0)
    }

    /// Take a sample at `now`. Returns `None` (and changes nothing) if the next sample is not
    /// due yet. The schedule keeps its phase: a late call does not shift later samples.
    pub fn sample(&mut self, now: Instant, occupancy: Occupancy) -> Option<Sample> {
        let interval = self.config.sample_interval;
        match self.next_sample {
            Some(due) if now < due => return None,
            Some(due) => {
                // Skip the samples missed while the driver was late, keeping the phase.
                let late = now.duration_since(due).as_nanos() / interval.as_nanos().max(1);
                let skip = u32::try_from(late).unwrap_or(u32::MAX).saturating_add(1);
                self.next_sample = Some(due + interval.saturating_mul(skip));
            }
            None => self.next_sample = Some(now + interval),
        }
        let gamma = self.config.gamma;
        let b = gamma * self.estimate.unwrap_or(0.0) + (1.0 - gamma) * occupancy.bytes() as f64;
        self.estimate = Some(b);
        let level = if b > self.config.overfull_bytes() {
            Level::Overfull
        } else if b < self.config.underfull_bytes() {
            Level::Underfull
        } else {
            Level::Normal
        };
        let refused = std::mem::take(&mut self.refused);
        // Re-arm: the connection drained, or the hold-off passed.
        match self.latched_until {
            Some(_) if level == Level::Underfull => self.latched_until = None,
            Some(until) if now >= until => self.latched_until = None,
            _ => {}
        }
        let reason = if refused {
            Some(TriggerReason::WriteRefused)
        } else if level == Level::Overfull {
            Some(TriggerReason::Overfull)
        } else {
            None
        };
        let trigger = match reason {
            Some(reason) if self.latched_until.is_none() => {
                self.latched_until = Some(now + self.config.holdoff);
                Some(Trigger {
                    reason,
                    estimate_bytes: b,
                })
            }
            _ => None,
        };
        Some(Sample {
            estimate_bytes: b,
            level,
            trigger,
        })
    }
}

/// The default [`circuit_to_move`] share: a circuit must be able to account for at least a
/// quarter of what the congested connection holds (`SwitchMinShareMilli` 250).
pub const DEFAULT_MIN_SHARE: f64 = 0.25;

/// The circuit to move off a congested connection: the one with the highest weight (its EWMA
/// cell count plus the cells it has queued for the connection: the paper's "bulk" circuit),
/// provided that weight is at least `min_share` of `load_cells`, the connection's load (the
/// detector's occupancy estimate in cells plus every circuit's queued cells for it).
///
/// **Why the share test.** A circuit's EWMA count is (almost) an upper bound on the cells it
/// has in the connection's buffer: every buffered byte was sent within the buffer's drain time
/// (about a second at 1.5 Mbit/s), and the count decays by only 2^(-drain/half-life) over it
/// (0.98 with Tor's 30 s half-life). So a circuit whose weight is below `min_share · load`
/// cannot hold more than about that share of the queue, and moving it cannot relieve the
/// connection by more: it costs a connection and a round trip for nothing. Without the test, a
/// connection still full of bulk bytes just after the bulk circuits moved off made the entry
/// move the remaining light circuits (5 and 7 cells) one per hold-off.
///
/// `candidates` are (circuit, weight) pairs of the circuits that may be moved. Weights that
/// are NaN or not positive are ignored; ties go to the lowest `CircKey`, so the choice is
/// deterministic. A `load_cells` of 0 (e.g. a refused write with nothing counted) leaves only
/// the positive-weight test. Whether a lone circuit may be moved is the caller's rule.
pub fn circuit_to_move(
    candidates: impl IntoIterator<Item = (CircKey, f64)>,
    load_cells: f64,
    min_share: f64,
) -> Option<CircKey> {
    let mut best: Option<(CircKey, f64)> = None;
    for (circ, weight) in candidates {
        if weight.is_nan() || weight <= 0.0 {
            continue;
        }
        best = match best {
            Some((b, w)) if w > weight || (w == weight && b < circ) => Some((b, w)),
            _ => Some((circ, weight)),
        };
    }
    let (circ, weight) = best?;
    let need = if load_cells.is_finite() && load_cells > 0.0 {
        min_share.clamp(0.0, 1.0) * load_cells
    } else {
        0.0
    };
    (weight >= need).then_some(circ)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn cells(n: u64) -> Occupancy {
        Occupancy {
            outbuf_cells: n,
            ..Occupancy::default()
        }
    }

    fn bytes(n: u64) -> Occupancy {
        Occupancy {
            kernel_unsent_bytes: n,
            ..Occupancy::default()
        }
    }

    /// Sample at t0, t0+100ms, ... with the given occupancies; the samples' outcomes.
    fn run(det: &mut CongestionDetector, t0: Instant, occ: &[Occupancy]) -> Vec<Sample> {
        occ.iter()
            .enumerate()
            .map(|(i, o)| det.sample(t0 + 100 * MS * i as u32, *o).expect("due"))
            .collect()
    }

    #[test]
    fn ewma_follows_the_formula() {
        let mut d = CongestionDetector::new(DetectorConfig::default());
        let t0 = Instant::now();
        let s = run(&mut d, t0, &[bytes(10_000), bytes(10_000), bytes(0)]);
        // B1 = 0.3·10000, B2 = 0.7·3000 + 3000, B3 = 0.7·B2.
        let expect = [3000.0, 5100.0, 3570.0];
        for (s, e) in s.iter().zip(expect) {
            assert!(
                (s.estimate_bytes - e).abs() < 1e-6,
                "{} vs {e}",
                s.estimate_bytes
            );
        }
        assert_eq!(s[0].level, Level::Underfull, "3000 < 0.1·32768");
        assert_eq!(s[1].level, Level::Normal);
        assert_eq!(cells(2).bytes(), 1028, "cells count at 514 bytes");
        assert_eq!(
            Occupancy {
                outbuf_cells: u64::MAX,
                kernel_unsent_bytes: 5,
                network_queued_bytes: 7,
            }
            .bytes(),
            u64::MAX,
            "saturates"
        );
    }

    #[test]
    fn overfull_triggers_once_then_latches_until_underfull() {
        let mut d = CongestionDetector::new(DetectorConfig::default());
        let t0 = Instant::now();
        // A full 64-cell outbuf plus 16 KB in the kernel: 49 KB a sample; B crosses
        // β·C = 16384 on the second sample (0.51·49280 ≈ 25 KB).
        let full = Occupancy {
            outbuf_cells: 64,
            kernel_unsent_bytes: 16_384,
            ..Occupancy::default()
        };
        let s = run(&mut d, t0, &[full, full, full, full, cells(0)]);
        assert_eq!(s[0].level, Level::Normal);
        assert!(s[0].trigger.is_none());
        assert_eq!(s[1].level, Level::Overfull);
        let t = s[1].trigger.expect("congestion at the crossing");
        assert_eq!(t.reason, TriggerReason::Overfull);
        assert!(s[2].trigger.is_none() && s[3].trigger.is_none(), "latched");
        // Drain to underfull: re-armed, and the next overfull sample fires again.
        let t1 = t0 + 500 * MS;
        let drained = run(&mut d, t1, &[cells(0); 6]);
        assert_eq!(drained.last().unwrap().level, Level::Underfull);
        let t2 = t1 + 600 * MS;
        let again = run(&mut d, t2, &[full, full, full]);
        assert!(again.iter().any(|s| s.trigger.is_some()), "re-armed");
    }

    #[test]
    fn the_normal_band_takes_no_action() {
        let mut d = CongestionDetector::new(DetectorConfig::default());
        // 10 KB steady: converges to 10 KB, between α·C ≈ 3.3 KB and β·C ≈ 16.4 KB.
        let s = run(&mut d, Instant::now(), &[bytes(10_000); 40]);
        assert!(s.iter().all(|s| s.trigger.is_none()));
        assert_eq!(s.last().unwrap().level, Level::Normal);
    }

    /// Where the backlog builds in a queue downstream of the socket (the lab's shaped port:
    /// TCP keeps sending into it, so the kernel holds little unsent), counting the network
    /// queue makes the detector fire samples earlier under the same ramp; an uncongested path
    /// (srtt at min_rtt: nothing queued) adds nothing, so the same in-flight bytes on a long
    /// but idle path never fire.
    #[test]
    fn the_network_queue_makes_a_downstream_backlog_visible_earlier() {
        // Every 100 ms the bottleneck queue grows by 6 KB; the socket holds 2 KB unsent and a
        // 16-cell outbuf, as long as TCP's window has room.
        let ramp = |count_net: bool| -> Vec<Occupancy> {
            (0..30)
                .map(|i| Occupancy {
                    outbuf_cells: 16,
                    kernel_unsent_bytes: 2_000,
                    network_queued_bytes: if count_net { i * 6_000 } else { 0 },
                })
                .collect()
        };
        let first = |occ: &[Occupancy]| {
            let mut d = CongestionDetector::new(DetectorConfig::default());
            run(&mut d, Instant::now(), occ)
                .iter()
                .position(|s| s.trigger.is_some())
        };
        assert_eq!(first(&ramp(false)), None, "the socket alone never shows it");
        let with = first(&ramp(true)).expect("the queue is seen");
        assert!(with <= 5, "fired at sample {with}");
        // 200 KB in flight on a path whose srtt is its min_rtt: queued 0, no trigger.
        let idle = vec![
            Occupancy {
                outbuf_cells: 4,
                network_queued_bytes: 0,
                ..Occupancy::default()
            };
            30
        ];
        assert_eq!(first(&idle), None);
        // A lone 32 KB burst (a web page) that the 1.5 Mbit/s path drains in 170 ms: queued
        // downstream 32, 13, 0 KB at three samples. Not congestion, and no trigger.
        let burst: Vec<Occupancy> = [32_000, 13_300, 0, 0, 0]
            .iter()
            .map(|&q| Occupancy {
                network_queued_bytes: q,
                ..Occupancy::default()
            })
            .collect();
        assert_eq!(first(&burst), None);
    }

    #[test]
    fn holdoff_rearms_a_connection_that_stays_full() {
        let cfg = DetectorConfig::default().with_holdoff(300 * MS);
        let mut d = CongestionDetector::new(cfg);
        let s = run(&mut d, Instant::now(), &[bytes(50_000); 10]);
        let fired: Vec<usize> = (0..10).filter(|&i| s[i].trigger.is_some()).collect();
        // First overfull at sample 1 (0.51·50000 > 16384), then every 300 ms.
        assert_eq!(fired, vec![1, 4, 7]);
    }

    #[test]
    fn a_refused_write_triggers_at_the_next_sample_whatever_the_level() {
        let mut d = CongestionDetector::new(DetectorConfig::default());
        let t0 = Instant::now();
        assert!(d.sample(t0, cells(0)).unwrap().trigger.is_none());
        d.write_refused();
        // Not due yet: nothing happens, the refusal is kept.
        assert!(d.sample(t0 + 50 * MS, cells(0)).is_none());
        let s = d.sample(t0 + 100 * MS, cells(0)).unwrap();
        assert_eq!(s.level, Level::Underfull);
        // Underfull re-arms before the check, so the refusal fires.
        assert_eq!(s.trigger.unwrap().reason, TriggerReason::WriteRefused);
        let s = d.sample(t0 + 200 * MS, cells(0)).unwrap();
        assert!(s.trigger.is_none(), "a refusal counts once");
    }

    #[test]
    fn samples_keep_their_phase_and_early_calls_change_nothing() {
        let mut d = CongestionDetector::new(DetectorConfig::default());
        let t0 = Instant::now();
        d.sample(t0, bytes(1000)).unwrap();
        assert_eq!(d.next_sample(), Some(t0 + 100 * MS));
        assert!(d.sample(t0 + 99 * MS, bytes(1 << 30)).is_none());
        assert!(
            (d.estimate_bytes() - 300.0).abs() < 1e-9,
            "early sample ignored"
        );
        // 250 ms late: one sample, the next due at t0 + 400 ms.
        d.sample(t0 + 350 * MS, bytes(1000)).unwrap();
        assert_eq!(d.next_sample(), Some(t0 + 400 * MS));
    }

    #[test]
    fn larger_thresholds_switch_later() {
        // The paper's Fig 4: raising (α, β) delays the switch under the same load ramp.
        let ramp: Vec<Occupancy> = (0..50).map(|i| bytes(i * 1000)).collect();
        let first = |alpha: f64, beta: f64| {
            let cfg = DetectorConfig::new(0.7, alpha, beta, 100 * MS, 32_768).unwrap();
            let mut d = CongestionDetector::new(cfg);
            run(&mut d, Instant::now(), &ramp)
                .iter()
                .position(|s| s.trigger.is_some())
                .unwrap()
        };
        let order = [
            first(0.05, 0.1),
            first(0.1, 0.5),
            first(0.3, 0.75),
            first(0.5, 0.9),
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }

    #[test]
    fn config_ranges() {
        let i = 100 * MS;
        assert!(DetectorConfig::new(0.7, 0.1, 0.5, i, 32_768).is_ok());
        assert!(DetectorConfig::new(0.0, 0.1, 0.5, i, 32_768).is_err());
        assert!(DetectorConfig::new(1.0, 0.1, 0.5, i, 32_768).is_err());
        assert!(DetectorConfig::new(f64::NAN, 0.1, 0.5, i, 32_768).is_err());
        assert!(
            DetectorConfig::new(0.7, 0.6, 0.5, i, 32_768).is_err(),
            "α > β"
        );
        assert!(DetectorConfig::new(0.7, -0.1, 0.5, i, 32_768).is_err());
        assert!(DetectorConfig::new(0.7, 0.1, 1.5, i, 32_768).is_err());
        assert!(DetectorConfig::new(0.7, 0.1, 0.5, Duration::ZERO, 32_768).is_err());
        assert!(DetectorConfig::new(0.7, 0.1, 0.5, i, 0).is_err());
        let m = DetectorConfig::from_milli(700, 100, 500, 100, 32_768).unwrap();
        assert_eq!(m, DetectorConfig::default());
        assert!(DetectorConfig::from_milli(1000, 100, 500, 100, 32_768).is_err());
    }

    #[test]
    fn the_ewma_schedulers_counts_name_the_bulk_circuit() {
        use crate::sched::{QueueId, SchedulerKind};
        // One bulk circuit (queue 1) sending every 10 ms and two light ones sending every
        // 500 ms share a connection, as in the paper's testbed; the counts come from the
        // channel's real EWMA scheduler, the way the driver will take them.
        let mut sched = SchedulerKind::Ewma { halflife: 1.0 }.build();
        let t0 = Instant::now();
        for q in 1..=3 {
            sched.activate(QueueId(q), t0);
        }
        for i in 0..300u32 {
            let t = t0 + 10 * MS * i;
            sched.cell_sent(QueueId(1), t);
            if i % 50 == 0 {
                sched.cell_sent(QueueId(2), t);
                sched.cell_sent(QueueId(3), t);
            }
        }
        let t = t0 + 3000 * MS;
        let counts = (1..=3).map(|q| {
            let count = sched.ewma_count(QueueId(q), t).expect("EWMA ranks");
            (CircKey(q), count)
        });
        assert_eq!(
            circuit_to_move(counts, 50.0, DEFAULT_MIN_SHARE),
            Some(CircKey(1))
        );
    }

    #[test]
    fn circuit_to_move_picks_the_bulk_one() {
        let c = CircKey;
        let pick = |cands: &[(CircKey, f64)]| circuit_to_move(cands.iter().copied(), 0.0, 0.25);
        assert_eq!(
            pick(&[(c(1), 3.0), (c(2), 900.5), (c(3), 12.0)]),
            Some(c(2))
        );
        assert_eq!(pick(&[(c(7), 5.0), (c(4), 5.0)]), Some(c(4)), "tie");
        assert_eq!(pick(&[(c(4), 5.0), (c(7), 5.0)]), Some(c(4)), "tie");
        assert_eq!(
            pick(&[(c(1), 1e9)]),
            Some(c(1)),
            "a lone circuit is the caller's rule"
        );
        assert_eq!(pick(&[]), None);
        assert_eq!(
            pick(&[(c(1), f64::NAN), (c(2), 0.5)]),
            Some(c(2)),
            "NaN ignored"
        );
        assert_eq!(pick(&[(c(1), f64::NAN), (c(2), f64::NAN)]), None);
        assert_eq!(
            pick(&[(c(1), 0.0), (c(2), -1.0)]),
            None,
            "nothing sent: nothing to move"
        );
    }

    #[test]
    fn circuit_to_move_leaves_light_circuits() {
        let c = CircKey;
        // 64 KB held (128 cells): a 7-cell circuit cannot be the cause of a quarter of it.
        assert_eq!(
            circuit_to_move([(c(1), 5.0), (c(2), 7.0)], 128.0, 0.25),
            None
        );
        // The bulk circuit can, whatever the light ones weigh.
        assert_eq!(
            circuit_to_move([(c(1), 5.0), (c(2), 3900.0), (c(3), 7.0)], 128.0, 0.25),
            Some(c(2))
        );
        // The threshold is inclusive, and the share is the option's.
        assert_eq!(circuit_to_move([(c(1), 32.0)], 128.0, 0.25), Some(c(1)));
        assert_eq!(circuit_to_move([(c(1), 31.9)], 128.0, 0.25), None);
        assert_eq!(circuit_to_move([(c(1), 7.0)], 128.0, 0.05), Some(c(1)));
        assert_eq!(
            circuit_to_move([(c(1), 7.0)], 128.0, 0.0),
            Some(c(1)),
            "share 0: off"
        );
        // A load that is unknown (0, NaN) leaves only the positive-weight test.
        assert_eq!(circuit_to_move([(c(1), 1.0)], f64::NAN, 0.25), Some(c(1)));
    }
}
