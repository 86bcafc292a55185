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
//! - [`CircuitScheduler::deactivate`] (mandatory): a queue became empty or its circuit went away.
//!
//! `now` is always passed in, read once per write event by the driver, never from a clock.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

/// One direction of one circuit, as seen by the channel it is queued on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u64);

/// Which scheduling policy a channel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulerKind {
    /// Round-robin over active circuits, one cell each (the papers' "unprioritised" baseline).
    #[default]
    RoundRobin,
}

impl SchedulerKind {
    /// A fresh scheduler of this kind.
    pub fn build(self) -> Box<dyn CircuitScheduler> {
        match self {
            SchedulerKind::RoundRobin => Box::new(RoundRobin::default()),
        }
    }
}

/// A per-channel circuit scheduling policy. See the module docs for the hook contract.
pub trait CircuitScheduler: Send {
    /// Mandatory. `queue` now has at least one cell waiting. Called once per
    /// empty → non-empty transition; never for a queue that is already active.
    fn activate(&mut self, queue: QueueId, now: Instant);

    /// Mandatory. `queue` has no cell waiting any more, or its circuit is gone.
    /// May be called for a queue that is not active (then it is a no-op).
    fn deactivate(&mut self, queue: QueueId);

    /// Mandatory. The queue to send the next cell from, among the active ones;
    /// `None` only if no queue is active.
    fn pick(&mut self, now: Instant) -> Option<QueueId>;

    /// Optional. One cell from `queue` was moved to the channel's output.
    fn cell_sent(&mut self, _queue: QueueId, _now: Instant) {}

    /// Short policy name for logs and metrics.
    fn name(&self) -> &'static str;

    /// Number of active queues.
    fn active_len(&self) -> usize;
}

/// Round-robin: each active queue sends one cell in turn.
#[derive(Default)]
pub struct RoundRobin {
    /// Rotation order. May hold queues that were deactivated since (removed lazily on pick),
    /// so deactivation is O(1).
    order: VecDeque<QueueId>,
    active: HashSet<QueueId>,
}

impl CircuitScheduler for RoundRobin {
    fn activate(&mut self, queue: QueueId, _now: Instant) {
        if self.active.insert(queue) {
            self.order.push_back(queue);
        }
    }

    fn deactivate(&mut self, queue: QueueId) {
        self.active.remove(&queue);
        // Keep `order` from growing without bound when queues flap.
        if self.order.len() > 2 * self.active.len() + 16 {
            let active = &self.active;
            self.order.retain(|q| active.contains(q));
        }
    }

    fn pick(&mut self, _now: Instant) -> Option<QueueId> {
        while let Some(&front) = self.order.front() {
            if self.active.contains(&front) {
                return Some(front);
            }
            self.order.pop_front();
        }
        None
    }

    fn cell_sent(&mut self, queue: QueueId, _now: Instant) {
        if self.order.front() == Some(&queue) {
            self.order.pop_front();
            // A re-activation may already have queued it again; avoid a duplicate turn.
            if self.active.contains(&queue) && !self.order.contains(&queue) {
                self.order.push_back(queue);
            }
        }
    }

    fn name(&self) -> &'static str {
        "rr"
    }

    fn active_len(&self) -> usize {
        self.active.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_alternates_and_forgets_inactive() {
        let now = Instant::now();
        let mut rr = RoundRobin::default();
        let (a, b, c) = (QueueId(1), QueueId(2), QueueId(3));
        rr.activate(a, now);
        rr.activate(b, now);
        rr.activate(c, now);
        let mut seen = Vec::new();
        for _ in 0..6 {
            let q = rr.pick(now).unwrap();
            seen.push(q.0);
            rr.cell_sent(q, now);
        }
        assert_eq!(seen, vec![1, 2, 3, 1, 2, 3]);
        rr.deactivate(b);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let q = rr.pick(now).unwrap();
            seen.push(q.0);
            rr.cell_sent(q, now);
        }
        assert_eq!(seen, vec![1, 3, 1, 3]);
        rr.deactivate(a);
        rr.deactivate(c);
        assert_eq!(rr.pick(now), None);
        assert_eq!(rr.active_len(), 0);
    }
}
