//! [`EwmaDirect`]: the EWMA policy computed directly, the reference that [`super::Ewma`] is
//! tested against.

use std::collections::BTreeSet;
use std::time::Instant;

use super::FLOOR;
use crate::sched::{CircuitScheduler, QueueId, QueueMap};

/// EWMA, direct reference implementation: decay every count on every new `now`, add 1 per
/// cell, scan the active queues for the lowest count. O(circuits) per cell; it exists to check
/// [`Ewma`](super::Ewma) against and to show in benchmarks why the heap exists.
pub struct EwmaDirect {
    halflife: f64,
    /// Latest `now` seen; counts are decayed up to it.
    last: Option<Instant>,
    /// Decayed counts (cells) of queues with history, active or not.
    pub(super) counts: QueueMap<f64>,
    /// Active queues, scanned in id order.
    pub(super) active: BTreeSet<QueueId>,
}

impl EwmaDirect {
    /// A fresh scheduler with half-life `halflife` seconds.
    pub fn new(halflife: f64) -> EwmaDirect {
        EwmaDirect {
            halflife,
            last: None,
            counts: QueueMap::default(),
            active: BTreeSet::new(),
        }
    }

    /// The half-life, seconds.
    pub fn halflife(&self) -> f64 {
        self.halflife
    }

    /// Decay every count to `now`.
    fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            if now <= last {
                return;
            }
            let factor = (-(now.duration_since(last).as_secs_f64() / self.halflife)).exp2();
            for c in self.counts.values_mut() {
                *c *= factor;
                if *c < FLOOR {
                    *c = 0.0;
                }
            }
            // Zero counts are no history; keep the map bounded by queues that have some.
            self.counts.retain(|_, c| *c > 0.0);
        }
        self.last = Some(now);
    }
}

impl CircuitScheduler for EwmaDirect {
    fn activate(&mut self, queue: QueueId, now: Instant) {
        self.advance(now);
        self.active.insert(queue);
    }

    fn deactivate(&mut self, queue: QueueId) {
        self.active.remove(&queue);
    }

    fn pick(&mut self, now: Instant) -> Option<QueueId> {
        self.advance(now);
        let count = |q: &QueueId| self.counts.get(q).copied().unwrap_or(0.0);
        // The lowest count; equal counts go to the smaller id (the same order as `Ewma`'s heap).
        self.active
            .iter()
            .min_by(|a, b| count(a).total_cmp(&count(b)).then(a.cmp(b)))
            .copied()
    }

    fn cell_sent(&mut self, queue: QueueId, now: Instant) {
        self.advance(now);
        *self.counts.entry(queue).or_insert(0.0) += 1.0;
    }

    fn forget(&mut self, queue: QueueId) {
        self.active.remove(&queue);
        self.counts.remove(&queue);
    }

    fn ewma_count(&self, queue: QueueId, now: Instant) -> Option<f64> {
        let c = self.counts.get(&queue).copied().unwrap_or(0.0);
        let dt = match self.last {
            Some(last) => now.max(last).duration_since(last).as_secs_f64(),
            None => 0.0,
        };
        let c = c * (-(dt / self.halflife)).exp2();
        Some(if c < FLOOR { 0.0 } else { c })
    }

    fn head_priority(&self, now: Instant) -> Option<f64> {
        self.active
            .iter()
            .filter_map(|q| self.ewma_count(*q, now))
            .min_by(f64::total_cmp)
    }

    fn name(&self) -> &'static str {
        "ewma-direct"
    }

    fn active_len(&self) -> usize {
        self.active.len()
    }
}
