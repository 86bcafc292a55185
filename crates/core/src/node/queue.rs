//! The send path: circuit cell queues, their channel's scheduler, and `poll_transmit`, which
//! moves cells out as late as possible. Every queue is bounded: a circuit whose queue passes
//! `max_circuit_queue` is killed, all queues together are capped by `max_queued_cells` (the
//! circuit with the longest queue is killed), and edges stop packaging above
//! [`QUEUE_HIGHWATER`] and resume at [`QUEUE_LOWWATER`].

use std::collections::VecDeque;
use std::time::Instant;

use chive_cell::Cell;
use tracing::warn;

use crate::{ChannelId, CircKey};

use super::circuit::{queue_id, queue_of, Side};
use super::inspect::{CellSample, MAX_PENDING_SAMPLES};
use super::Core;

/// Stop packaging edge data into a circuit queue above this many cells (Tor's high-water mark).
pub(super) const QUEUE_HIGHWATER: usize = 256;

/// Resume packaging once the queue has drained below this.
const QUEUE_LOWWATER: usize = 64;

/// One direction of a circuit's cells waiting for their channel, with the
/// enqueue time of sampled cells (instrumentation: per-cell queue delay).
#[derive(Default)]
pub(super) struct CellQueue {
    pub(super) cells: VecDeque<Cell>,
    pushed: u64,
    popped: u64,
    /// (sequence number of the cell, when it was queued), oldest first.
    pub(super) samples: VecDeque<(u64, Instant)>,
}

impl CellQueue {
    pub(super) fn push(&mut self, cell: Cell, sampled_at: Option<Instant>) {
        if let Some(t) = sampled_at {
            self.samples.push_back((self.pushed, t));
        }
        self.pushed += 1;
        self.cells.push_back(cell);
    }

    /// The next cell, and its enqueue time if it was sampled.
    fn pop(&mut self) -> Option<(Cell, Option<Instant>)> {
        let cell = self.cells.pop_front()?;
        let seq = self.popped;
        self.popped += 1;
        let sampled = match self.samples.front() {
            Some(&(s, t)) if s == seq => {
                self.samples.pop_front();
                Some(t)
            }
            _ => None,
        };
        Some((cell, sampled))
    }

    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }

    pub(super) fn clear(&mut self) {
        self.popped += self.cells.len() as u64;
        self.cells.clear();
        self.samples.clear();
    }
}

impl Core {
    /// Next channel that may have cells to send (possibly spurious). The driver
    /// calls [`Core::poll_transmit`] for it when its connection can take cells.
    pub fn poll_ready_channel(&mut self) -> Option<ChannelId> {
        let chan = self.ready.pop_front()?;
        self.ready_set.remove(&chan);
        Some(chan)
    }

    /// Whether `chan` has cells waiting.
    pub fn has_pending(&self, chan: ChannelId) -> bool {
        self.channels
            .get(&chan)
            .is_some_and(|c| !c.urgent.is_empty() || c.sched.active_len() > 0)
    }

    /// How deserving `chan`'s next cell is, for drivers that share one rate limit among
    /// channels (lower goes first): `Some(-1.0)` while link-level cells (DESTROY, CREATED2…)
    /// wait, else the scheduler's [`crate::sched::CircuitScheduler::head_priority`] (the decayed
    /// EWMA count of the circuit it would pick). `None` if nothing waits or the policy does not
    /// rank (round-robin): then the driver serves channels in turn.
    pub fn channel_priority(&self, chan: ChannelId, now: Instant) -> Option<f64> {
        let ch = self.channels.get(&chan)?;
        if !ch.urgent.is_empty() {
            return Some(-1.0);
        }
        ch.sched.head_priority(now)
    }

    /// Move up to `max` cells for `chan` into `out`, choosing circuits with the
    /// channel's scheduler. Returns how many were added. Call when the
    /// connection's output buffer has room, so the choice is made as late as possible.
    pub fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<Cell>,
    ) -> usize {
        let mut sent = 0;
        let mut drained_edges: Vec<CircKey> = Vec::new();
        let Some(ch) = self.channels.get_mut(&chan) else {
            return 0;
        };
        while sent < max {
            if let Some(cell) = ch.urgent.pop_front() {
                out.push(cell);
                sent += 1;
                continue;
            }
            let Some(q) = ch.sched.pick(now) else { break };
            let (key, side) = queue_of(q);
            let Some(circ) = self.circuits.get_mut(&key) else {
                ch.sched.deactivate(q);
                continue;
            };
            let queue = circ.queue(side);
            let Some((cell, sampled)) = queue.pop() else {
                ch.sched.deactivate(q);
                continue;
            };
            let left = queue.len();
            circ.cells_sent += 1;
            if let Some(queued) = sampled {
                if self.cell_samples.len() < MAX_PENDING_SAMPLES {
                    self.cell_samples.push_back(CellSample {
                        chan,
                        circ: key,
                        queued,
                        dequeued: now,
                        batch_index: out.len(),
                    });
                }
            }
            ch.sched.cell_sent(q, now);
            if left == 0 {
                ch.sched.deactivate(q);
            }
            if left == QUEUE_LOWWATER && circ.edge_out_side() == side && circ.edge_mut().is_some() {
                drained_edges.push(key);
            }
            self.stats.queued_cells = self.stats.queued_cells.saturating_sub(1);
            out.push(cell);
            sent += 1;
        }
        self.stats.cells_transmitted += sent as u64;
        for key in drained_edges {
            self.package_all(key, now);
        }
        sent
    }

    /// Put a cell on a circuit's queue toward `side` and wake its channel.
    pub(super) fn enqueue(&mut self, key: CircKey, side: Side, cell: Cell, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Some((chan, _)) = circ.endpoint(side) else {
            return;
        };
        let sampled_at = match self.cfg.cell_sample_every {
            0 => None,
            every => {
                self.sample_counter = self.sample_counter.wrapping_add(1);
                self.sample_counter.is_multiple_of(every).then_some(now)
            }
        };
        let queue = circ.queue(side);
        queue.push(cell, sampled_at);
        let len = queue.len();
        self.stats.queued_cells += 1;
        if len > self.cfg.max_circuit_queue {
            return self.kill(
                key,
                "circuit queue limit exceeded (peer ignores flow control)",
                now,
            );
        }
        if len == 1 {
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.sched.activate(queue_id(key, side), now);
            }
        }
        self.mark_ready(chan);
        if self.stats.queued_cells > self.cfg.max_queued_cells {
            self.relieve_memory_pressure(now);
        }
    }

    pub(super) fn mark_ready(&mut self, chan: ChannelId) {
        if self.ready_set.insert(chan) {
            self.ready.push_back(chan);
        }
    }

    /// Over the global queue cap: kill the circuit holding the most queued cells.
    fn relieve_memory_pressure(&mut self, now: Instant) {
        let victim = self
            .circuits
            .iter()
            .max_by_key(|(_, c)| c.q_prev.len() + c.q_next.len())
            .map(|(k, _)| *k);
        if let Some(key) = victim {
            warn!(
                ?key,
                queued = self.stats.queued_cells,
                "queue memory cap reached: killing the largest circuit"
            );
            self.kill(key, "queue memory cap reached", now);
        }
    }
}
