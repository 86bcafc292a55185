//! Circuit schedulers: which circuit's queue sends the next cell on a channel.
//!
//! Each channel owns one scheduler instance (its "circuitmux policy", in C tor's
//! terms). The core tells the scheduler which queues have cells waiting and asks
//! it which one to serve next; the policy never sees cells or other channels.
//!
//! Hooks, in the order the core calls them:
//! - [`CircuitScheduler::activate`] (mandatory): a queue went from empty to non-empty.
//! - [`CircuitScheduler::pick`] (mandatory): choose an active queue to send one cell from.
//! - [`CircuitScheduler::cell_sent`] (optional, default no-op): one cell left the picked queue.
//!   Policies that rank by history (EWMA) count here.
//! - [`CircuitScheduler::pick_run`] and [`CircuitScheduler::cells_sent`] (optional, defaults in
//!   terms of `pick` and `cell_sent`): the same pick, with how many cells in a row the queue
//!   would be picked for (a busy circuit alone on its channel sends a whole batch), and the
//!   accounting for such a run at once; the per-cell path then costs the policy nothing per cell.
//! - [`CircuitScheduler::deactivate`] (mandatory): a queue became empty or its circuit went away.
//! - [`CircuitScheduler::forget`] (optional, default no-op): the circuit is gone for good; drop
//!   any history kept for the queue.
//! - [`CircuitScheduler::ewma_count`] (optional, default `None`): the queue's current priority
//!   value, for metrics only.
//! - [`CircuitScheduler::head_priority`] (optional, default `None`): the priority value of the
//!   queue [`CircuitScheduler::pick`] would choose now, so that a driver sharing one rate limit
//!   among many channels can serve the channel with the most deserving circuit first (C tor's
//!   `circuitmux_compare_muxes`, used by its KIST scheduler). `None` = the policy does not rank.
//!
//! `now` is always passed in, read once per write event by the driver, never from a clock
//! (the papers' cached-time fix: one clock read per write event, not per cell).
//!
//! Policies: [`RoundRobin`] (the papers' unprioritised baseline), [`Ewma`] (Tang & Goldberg's
//! EWMA with Mathewson's scale-factor and min-heap optimisation, as in C tor's
//! `circuitmux_ewma`) and [`EwmaDirect`] (the same policy computed naively, as the reference the
//! fast one is tested against). [`SchedulerKind`] chooses one by configuration.

mod ewma;
mod rr;

use std::time::Instant;

pub use ewma::{Ewma, EwmaDirect};
pub use rr::RoundRobin;

/// One direction of one circuit, as seen by the channel it is queued on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u64);

/// Half-life used when EWMA is chosen and neither the consensus nor the relay's config gives
/// one (C tor's default `CircuitPriorityHalflife`, in seconds).
pub const DEFAULT_HALFLIFE: f64 = 30.0;
/// Smallest accepted half-life, in seconds (C tor's `CircuitPriorityHalflifeMsec` minimum, 1 ms).
pub const MIN_HALFLIFE: f64 = 0.001;
/// Largest accepted half-life, in seconds (C tor's `CircuitPriorityHalflifeMsec` maximum,
/// `INT32_MAX` ms).
pub const MAX_HALFLIFE: f64 = 2_147_483.647;

/// Which scheduling policy a channel uses.
///
/// `Default` is [`SchedulerKind::RoundRobin`], so that a bare [`crate::CoreConfig`] keeps the
/// baseline behaviour; configuration goes through [`SchedulerKind::from_config`], whose default
/// (no name given by the caller aside) is EWMA with [`DEFAULT_HALFLIFE`].
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum SchedulerKind {
    /// Round-robin over active circuits, one cell each (the papers' "unprioritised" baseline).
    #[default]
    RoundRobin,
    /// EWMA, fast implementation (scale factor + indexed min-heap). `halflife` in seconds.
    Ewma {
        /// Seconds after which a sent cell counts half.
        halflife: f64,
    },
    /// EWMA, direct reference implementation (decay every count, linear scan). Same choices as
    /// [`SchedulerKind::Ewma`], O(circuits) per cell; for tests and benchmarks.
    EwmaDirect {
        /// Seconds after which a sent cell counts half.
        halflife: f64,
    },
}

impl SchedulerKind {
    /// Whether the policy ranks circuits by recent activity (EWMA), so that "quiet" means
    /// something: [`CircuitScheduler::head_priority`] is `Some` when a queue is active.
    pub fn ranks_circuits(&self) -> bool {
        !matches!(self, SchedulerKind::RoundRobin)
    }

    /// Parse the configured policy: `name` is `"rr"`, `"ewma"` or `"ewma-direct"` (ASCII case
    /// ignored, surrounding blanks trimmed); `halflife` is `CircuitPriorityHalflife` in seconds,
    /// [`DEFAULT_HALFLIFE`] when `None`.
    ///
    /// As in C tor, an EWMA half-life ≤ 0 disables EWMA and gives round-robin. A positive
    /// half-life outside [`MIN_HALFLIFE`]..=[`MAX_HALFLIFE`], or a NaN, is an error. For `"rr"`
    /// the half-life is ignored.
    pub fn from_config(name: &str, halflife: Option<f64>) -> Result<SchedulerKind, String> {
        let name = name.trim().to_ascii_lowercase();
        let direct = match name.as_str() {
            "rr" => return Ok(SchedulerKind::RoundRobin),
            "ewma" => false,
            "ewma-direct" => true,
            other => {
                return Err(format!(
                    "unknown scheduler {other:?} (expected \"rr\", \"ewma\" or \"ewma-direct\")"
                ))
            }
        };
        let h = halflife.unwrap_or(DEFAULT_HALFLIFE);
        if h.is_nan() {
            return Err("scheduler half-life is NaN".to_string());
        }
        if h <= 0.0 {
            return Ok(SchedulerKind::RoundRobin);
        }
        if !(MIN_HALFLIFE..=MAX_HALFLIFE).contains(&h) {
            return Err(format!(
                "scheduler half-life {h} s out of range ({MIN_HALFLIFE}..={MAX_HALFLIFE} s, or <= 0 for round-robin)"
            ));
        }
        Ok(if direct {
            SchedulerKind::EwmaDirect { halflife: h }
        } else {
            SchedulerKind::Ewma { halflife: h }
        })
    }

    /// Short label for logs and metrics: `"rr"`, `"ewma(H=30)"`, `"ewma-direct(H=2.5)"`.
    pub fn label(&self) -> String {
        match self {
            SchedulerKind::RoundRobin => "rr".to_string(),
            SchedulerKind::Ewma { halflife } => format!("ewma(H={halflife})"),
            SchedulerKind::EwmaDirect { halflife } => format!("ewma-direct(H={halflife})"),
        }
    }

    /// A fresh scheduler of this kind.
    ///
    /// Never panics: a kind built by hand with a half-life that is not positive (or NaN) gives
    /// round-robin, as [`SchedulerKind::from_config`] would; a positive one is clamped to
    /// [`MIN_HALFLIFE`]..=[`MAX_HALFLIFE`].
    pub fn build(self) -> Box<dyn CircuitScheduler> {
        match self {
            SchedulerKind::RoundRobin => Box::new(RoundRobin::default()),
            SchedulerKind::Ewma { halflife } => match clamp_halflife(halflife) {
                Some(h) => Box::new(Ewma::new(h)),
                None => Box::new(RoundRobin::default()),
            },
            SchedulerKind::EwmaDirect { halflife } => match clamp_halflife(halflife) {
                Some(h) => Box::new(EwmaDirect::new(h)),
                None => Box::new(RoundRobin::default()),
            },
        }
    }
}

/// `None` if `h` disables EWMA (≤ 0 or NaN), else `h` within the accepted range.
fn clamp_halflife(h: f64) -> Option<f64> {
    if h > 0.0 {
        Some(h.clamp(MIN_HALFLIFE, MAX_HALFLIFE))
    } else {
        None
    }
}

/// A per-channel circuit scheduling policy. See the module docs for the hook contract.
pub trait CircuitScheduler: Send {
    /// Mandatory. `queue` now has at least one cell waiting. Called once per
    /// empty → non-empty transition; a call for a queue that is already active is a no-op.
    fn activate(&mut self, queue: QueueId, now: Instant);

    /// Mandatory. `queue` has no cell waiting any more, or its circuit is gone.
    /// May be called for a queue that is not active (then it is a no-op).
    /// History (EWMA counts) survives: a busy circuit that goes quiet keeps its decaying count.
    fn deactivate(&mut self, queue: QueueId);

    /// Mandatory. The queue to send the next cell from, among the active ones;
    /// `None` only if no queue is active.
    fn pick(&mut self, now: Instant) -> Option<QueueId>;

    /// Optional (default no-op). One cell from `queue` (normally the one [`Self::pick`] just
    /// returned) was moved to the channel's output. Call before deactivating the queue.
    fn cell_sent(&mut self, _queue: QueueId, _now: Instant) {}

    /// Optional (default: [`Self::pick`] and a run of 1). [`Self::pick`], and `n` (1 ≤ `n` ≤
    /// `max(limit, 1)`) such that, at this `now` and with nothing else called in between, `pick`
    /// would return the same queue again after each of the next `n - 1` [`Self::cell_sent`]s
    /// for it: the caller may send up to `n` cells from it and account them with one
    /// [`Self::cells_sent`]. `n` may be smaller than the true run (then the next `pick_run`
    /// returns the same queue again); it is never larger.
    fn pick_run(&mut self, now: Instant, limit: usize) -> Option<(QueueId, usize)> {
        let _ = limit;
        self.pick(now).map(|q| (q, 1))
    }

    /// Optional (default: [`Self::cell_sent`] `n` times). `n` cells from `queue` were moved to
    /// the channel's output: the same as `n` calls of [`Self::cell_sent`] (the state after it
    /// is the one those calls leave), with the per-call work done once.
    fn cells_sent(&mut self, queue: QueueId, n: usize, now: Instant) {
        for _ in 0..n {
            self.cell_sent(queue, now);
        }
    }

    /// Optional (default no-op). The circuit owning `queue` is gone for good: deactivate it if
    /// needed and drop any history (EWMA count), so that memory stays bounded by live circuits.
    fn forget(&mut self, _queue: QueueId) {}

    /// Optional (default `None`). The queue's current EWMA cell count (cells, decayed to
    /// `now`), for metrics; `None` for policies without one. `Some(0.0)` for a queue with no
    /// history.
    fn ewma_count(&self, _queue: QueueId, _now: Instant) -> Option<f64> {
        None
    }

    /// Optional (default `None`). The decayed count (cells, at `now`) of the queue
    /// [`Self::pick`] would choose now; lower is more deserving. Values of different channels
    /// using the same policy and half-life are comparable: counts are decayed to the same
    /// instant. `None` if no queue is active or the policy does not rank queues.
    fn head_priority(&self, _now: Instant) -> Option<f64> {
        None
    }

    /// Short policy name for logs and metrics (`"rr"`, `"ewma"`, `"ewma-direct"`).
    fn name(&self) -> &'static str;

    /// Number of active queues.
    fn active_len(&self) -> usize;
}

/// Map keyed by queue id (core-allocated: circuit key and direction) with the cheap hasher.
pub(crate) type QueueMap<V> = crate::idmap::LocalMap<QueueId, V>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn from_config_names_defaults_and_errors() {
        assert_eq!(
            SchedulerKind::from_config("rr", None),
            Ok(SchedulerKind::RoundRobin)
        );
        assert_eq!(
            SchedulerKind::from_config("rr", Some(5.0)),
            Ok(SchedulerKind::RoundRobin)
        );
        assert_eq!(
            SchedulerKind::from_config("ewma", None),
            Ok(SchedulerKind::Ewma { halflife: 30.0 })
        );
        assert_eq!(
            SchedulerKind::from_config(" EWMA ", Some(2.5)),
            Ok(SchedulerKind::Ewma { halflife: 2.5 })
        );
        assert_eq!(
            SchedulerKind::from_config("ewma-direct", Some(7.0)),
            Ok(SchedulerKind::EwmaDirect { halflife: 7.0 })
        );
        // Tor's rule: a half-life <= 0 disables EWMA.
        assert_eq!(
            SchedulerKind::from_config("ewma", Some(0.0)),
            Ok(SchedulerKind::RoundRobin)
        );
        assert_eq!(
            SchedulerKind::from_config("ewma-direct", Some(-3.0)),
            Ok(SchedulerKind::RoundRobin)
        );
        assert!(SchedulerKind::from_config("fifo", None).is_err());
        assert!(SchedulerKind::from_config("", None).is_err());
        assert!(SchedulerKind::from_config("ewma", Some(f64::NAN)).is_err());
        assert!(SchedulerKind::from_config("ewma", Some(1e-4)).is_err());
        assert!(SchedulerKind::from_config("ewma", Some(f64::INFINITY)).is_err());
    }

    #[test]
    fn labels_and_built_names() {
        assert_eq!(SchedulerKind::RoundRobin.label(), "rr");
        assert_eq!(SchedulerKind::Ewma { halflife: 30.0 }.label(), "ewma(H=30)");
        assert_eq!(
            SchedulerKind::EwmaDirect { halflife: 2.5 }.label(),
            "ewma-direct(H=2.5)"
        );
        assert_eq!(SchedulerKind::RoundRobin.build().name(), "rr");
        assert_eq!(
            SchedulerKind::Ewma { halflife: 30.0 }.build().name(),
            "ewma"
        );
        assert_eq!(
            SchedulerKind::EwmaDirect { halflife: 30.0 }.build().name(),
            "ewma-direct"
        );
        // Hand-built kinds with a disabling half-life fall back to round-robin, never panic.
        assert_eq!(SchedulerKind::Ewma { halflife: 0.0 }.build().name(), "rr");
        assert_eq!(
            SchedulerKind::Ewma { halflife: f64::NAN }.build().name(),
            "rr"
        );
        assert_eq!(SchedulerKind::default(), SchedulerKind::RoundRobin);
    }

    /// Result of one run of the channel scenario.
    struct Scenario {
        /// For each interactive burst: ticks from arrival until its last cell left (1 = same tick).
        burst_ticks: Vec<u64>,
        /// For each burst: interactive cells sent in the tick the burst arrived.
        first_tick_interactive: Vec<usize>,
        /// Cells sent per tick, all ticks (the channel must never idle: bulk is always full).
        sent_per_tick: Vec<usize>,
    }

    /// One channel, a bulk queue that always has cells, an interactive queue that gets 20 cells
    /// every second, and a write budget of `budget` cells per 10 ms tick. Drives the scheduler
    /// exactly as the core's `poll_transmit` does: pick, pop, `cell_sent`, deactivate if empty.
    fn run_scenario(kind: SchedulerKind, budget: usize, seconds: u64) -> Scenario {
        const TICK: Duration = Duration::from_millis(10);
        const TICKS_PER_SECOND: u64 = 100;
        const BURST: usize = 20;
        let bulk = QueueId(7);
        let interactive = QueueId(8);
        let mut sched = kind.build();
        let start = Instant::now();
        sched.activate(bulk, start);
        let mut waiting = 0usize;
        let mut arrived_at = 0u64;
        let mut out = Scenario {
            burst_ticks: Vec::new(),
            first_tick_interactive: Vec::new(),
            sent_per_tick: Vec::new(),
        };
        for tick in 0..seconds * TICKS_PER_SECOND {
            let now = start + TICK * tick as u32;
            let second_starts = tick > 0 && (tick / TICKS_PER_SECOND) * TICKS_PER_SECOND == tick;
            if second_starts {
                assert_eq!(waiting, 0, "previous burst still queued at tick {tick}");
                waiting = BURST;
                arrived_at = tick;
                sched.activate(interactive, now);
                out.first_tick_interactive.push(0);
            }
            let mut sent = 0;
            while sent < budget {
                let Some(q) = sched.pick(now) else { break };
                sent += 1;
                sched.cell_sent(q, now);
                if q == interactive {
                    if tick == arrived_at {
                        if let Some(n) = out.first_tick_interactive.last_mut() {
                            *n += 1;
                        }
                    }
                    waiting -= 1;
                    if waiting == 0 {
                        sched.deactivate(interactive);
                        out.burst_ticks.push(tick - arrived_at + 1);
                    }
                } else {
                    assert_eq!(q, bulk);
                }
            }
            out.sent_per_tick.push(sent);
        }
        out
    }

    #[test]
    fn ewma_sends_interactive_burst_within_its_first_tick() {
        for halflife in [0.1, 1.0, 30.0, 100.0] {
            for kind in [
                SchedulerKind::Ewma { halflife },
                SchedulerKind::EwmaDirect { halflife },
            ] {
                for budget in [21, 25, 30, 39] {
                    let s = run_scenario(kind, budget, 6);
                    assert_eq!(s.burst_ticks.len(), 5, "{} N={budget}", kind.label());
                    assert!(
                        s.burst_ticks.iter().all(|&t| t == 1),
                        "{} N={budget}: bursts took {:?} ticks",
                        kind.label(),
                        s.burst_ticks
                    );
                    assert!(s.first_tick_interactive.iter().all(|&n| n == 20));
                    assert!(s.sent_per_tick.iter().all(|&n| n == budget));
                }
            }
        }
    }

    #[test]
    fn round_robin_interleaves_interactive_burst_with_bulk() {
        for budget in [21, 25, 30, 39] {
            let s = run_scenario(SchedulerKind::RoundRobin, budget, 6);
            assert_eq!(s.burst_ticks.len(), 5);
            assert!(
                s.burst_ticks.iter().all(|&t| t >= 2),
                "rr N={budget}: bursts took {:?} ticks",
                s.burst_ticks
            );
            // Interleaved one-for-one with bulk: at most half the first tick's budget.
            assert!(
                s.first_tick_interactive
                    .iter()
                    .all(|&n| n <= budget.div_ceil(2)),
                "rr N={budget}: {:?}",
                s.first_tick_interactive
            );
            assert!(s.sent_per_tick.iter().all(|&n| n == budget));
        }
    }
}
