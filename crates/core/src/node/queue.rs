//! The send path: circuit cell queues, their channel's scheduler, and `poll_transmit`, which
//! moves cells out as late as possible. Every queue is bounded: a circuit whose queue passes
//! `max_circuit_queue` is killed, all queues together count against `MaxMemInQueues` (the OOM
//! handler in `oom.rs` kills the circuits holding the oldest cells), and edges stop packaging
//! above [`QUEUE_HIGHWATER`] and resume at [`QUEUE_LOWWATER`].
//!
//! A queue's buffer is released once it has been empty for [`QUEUE_RELEASE_AFTER`] (at once
//! if it never grew past the smallest allocation): an idle circuit holds no cell buffers, and
//! a busy one keeps its grown buffer between batches (no regrowth copies per batch).
//!
//! `MaxMemInQueues` counts what the buffers hold, not only the cells in them: every change of
//! a queue's capacity (growth on push, release, clear, teardown) updates
//! `CoreStats::queue_buffer_cells`, and the OOM handler first gives back idle and oversized
//! buffers ([`Core::compact_queues`]) before it kills anything.

use std::collections::VecDeque;
use std::time::Instant;

use chive_cell::Cell;

use crate::{ChannelId, CircKey};

use super::circuit::{queue_id, queue_of, Side};
use super::inspect::{CellSample, MAX_PENDING_SAMPLES};
use super::Core;

/// Stop packaging edge data into a circuit queue above this many cells (Tor's high-water mark).
pub(super) const QUEUE_HIGHWATER: usize = 256;

/// Resume packaging once the queue has drained below this.
const QUEUE_LOWWATER: usize = 64;

/// An emptied queue whose buffer holds more than this many cells keeps it for
/// [`QUEUE_RELEASE_AFTER`]; a smaller one is released at once (reallocating it costs one
/// allocation and no copy: `VecDeque`'s first allocation holds 4 cells).
const QUEUE_KEEP_CELLS: usize = 4;

/// How long an emptied queue keeps a grown buffer before [`Core::handle_timeout`] frees it.
pub(super) const QUEUE_RELEASE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A cell waiting in a circuit queue, with when it was queued: the OOM handler kills the
/// circuits whose oldest cell is oldest (`node/oom.rs`), and sampled cells report their
/// queueing delay.
pub(super) struct QueuedCell {
    cell: Cell,
    queued: Instant,
    /// Whether this cell is one of the instrumentation samples (`cell_sample_every`).
    sampled: bool,
}

/// What one queued cell costs against `MaxMemInQueues`: the cell and its enqueue time as the
/// queue stores them (Tor charges `packed_cell_mem_cost()`, the same idea).
pub const CELL_MEM_COST: usize = std::mem::size_of::<QueuedCell>();

/// Where [`Core::poll_transmit`] puts the cells it takes: decoded cells (`Vec<Cell>`) or their
/// wire bytes (`Vec<u8>`, [`Core::poll_transmit_wire`]). A cell is handed over by reference
/// from its queue, so encoding it is its only copy.
pub(super) trait CellSink {
    /// Append `cell`.
    fn put(&mut self, cell: &Cell);
    /// Cells appended so far (a sampled cell's index in its batch).
    fn cells(&self) -> usize;
}

impl CellSink for Vec<Cell> {
    fn put(&mut self, cell: &Cell) {
        self.push(cell.clone());
    }

    fn cells(&self) -> usize {
        self.len()
    }
}

impl CellSink for Vec<u8> {
    fn put(&mut self, cell: &Cell) {
        cell.encode_into(self);
    }

    fn cells(&self) -> usize {
        // Only fixed cells leave through the send path.
        self.len() / chive_cell::CELL_LEN
    }
}

/// One direction of a circuit's cells waiting for their channel, oldest first.
#[derive(Default)]
pub(super) struct CellQueue {
    cells: VecDeque<QueuedCell>,
    /// When the queue last became empty while holding a grown buffer (`None` otherwise).
    emptied: Option<Instant>,
    /// Whether the queue is on `Core::emptied_queues` (at most once).
    listed: bool,
}

/// A cell as [`Core::enqueue`] takes it: owned (moved into the queue) or borrowed (copied
/// into the queue: a relayed cell comes by reference from the driver's decoding buffer, so this
/// copy is its only one between decoding and encoding).
pub(super) trait QueueCell {
    /// Append this cell to `cells`.
    fn push_to(self, cells: &mut VecDeque<QueuedCell>, queued: Instant, sampled: bool);
}

impl QueueCell for Cell {
    fn push_to(self, cells: &mut VecDeque<QueuedCell>, queued: Instant, sampled: bool) {
        cells.push_back(QueuedCell {
            cell: self,
            queued,
            sampled,
        });
    }
}

impl QueueCell for &Cell {
    fn push_to(self, cells: &mut VecDeque<QueuedCell>, queued: Instant, sampled: bool) {
        cells.push_back(QueuedCell {
            cell: self.clone(),
            queued,
            sampled,
        });
    }
}

impl CellQueue {
    pub(super) fn push(&mut self, cell: impl QueueCell, now: Instant, sampled: bool) {
        cell.push_to(&mut self.cells, now, sampled);
    }

    /// Hand the next cell to `out` where it lies (no move out of the queue first), drop it from
    /// the queue; its command, and its enqueue time if it was sampled.
    fn pop_into(
        &mut self,
        out: &mut impl CellSink,
    ) -> Option<(chive_cell::CellCommand, Option<Instant>)> {
        let q = self.cells.front()?;
        out.put(&q.cell);
        let taken = (q.cell.command, q.sampled.then_some(q.queued));
        self.cells.pop_front();
        Some(taken)
    }

    /// The next cell, moved out, and its enqueue time if it was sampled.
    #[cfg(test)]
    fn pop(&mut self) -> Option<(Cell, Option<Instant>)> {
        let mut out = Vec::with_capacity(1);
        let (_, sampled) = self.pop_into(&mut out)?;
        Some((out.pop()?, sampled))
    }

    pub(super) fn len(&self) -> usize {
        self.cells.len()
    }

    /// Cells the queue's buffer has room for (what it costs against `MaxMemInQueues`).
    pub(super) fn capacity(&self) -> usize {
        self.cells.capacity()
    }

    /// Give back buffer room the queue does not use: an empty queue frees its buffer, a
    /// non-empty one whose buffer is more than twice its length shrinks to fit. Returns the
    /// cells of capacity given back. Costs a copy of the queued cells; the OOM handler calls
    /// it, not the send path.
    pub(super) fn compact(&mut self) -> usize {
        let before = self.cells.capacity();
        if self.cells.is_empty() {
            self.cells = VecDeque::new();
        } else if before > 2 * self.cells.len() {
            self.cells.shrink_to_fit();
        }
        before - self.cells.capacity()
    }

    /// Called when a pop left the queue empty at `now`: release a small buffer now; for a
    /// grown one, note the time and return whether the queue must be listed for the sweep.
    fn emptied_at(&mut self, now: Instant) -> bool {
        if self.cells.capacity() <= QUEUE_KEEP_CELLS {
            // The caller reads the capacity before and after: the release is counted.
            self.cells = VecDeque::new();
            return false;
        }
        self.emptied = Some(now);
        !std::mem::replace(&mut self.listed, true)
    }

    /// The sweep's visit: free the buffer if the queue has stayed empty since `deadline -
    /// QUEUE_RELEASE_AFTER`; otherwise the time to look again (still listed), if any.
    fn sweep(&mut self, now: Instant) -> Option<Instant> {
        match self.emptied {
            Some(t) if self.cells.is_empty() => {
                let due = t + QUEUE_RELEASE_AFTER;
                if due <= now {
                    self.cells = VecDeque::new();
                    self.emptied = None;
                    self.listed = false;
                    None
                } else {
                    Some(due)
                }
            }
            _ => {
                // Busy again: listed anew when it next empties.
                self.emptied = None;
                self.listed = false;
                None
            }
        }
    }

    /// Heap bytes of this queue's buffer.
    #[cfg(test)]
    fn buffer_bytes(&self) -> usize {
        self.cells.capacity() * std::mem::size_of::<QueuedCell>()
    }

    /// When the oldest cell still queued was queued.
    pub(super) fn oldest(&self) -> Option<Instant> {
        self.cells.front().map(|q| q.queued)
    }

    pub(super) fn clear(&mut self) {
        self.cells = VecDeque::new();
        self.emptied = None;
    }

    /// Give every queued cell a new circuit id (its circuit moved to another connection:
    /// cells carry their id from when they were queued).
    pub(super) fn set_circ_id(&mut self, id: chive_cell::CircId) {
        for q in &mut self.cells {
            q.cell.circ_id = id;
        }
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
        self.transmit_into(chan, max, now, out)
    }

    /// [`Core::poll_transmit`], appending each cell's wire encoding ([`Cell::encode_into`], 514
    /// bytes) to `out` instead: the cell is encoded once, from where it lies in its queue,
    /// straight into the buffer the connection's writer hands to TLS.
    pub fn poll_transmit_wire(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> usize {
        self.transmit_into(chan, max, now, out)
    }

    fn transmit_into(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut impl CellSink,
    ) -> usize {
        let mut sent = 0;
        let mut circ_cells = 0;
        let mut drained_edges: Vec<CircKey> = Vec::new();
        let Some(ch) = self.channels.get_mut(&chan) else {
            return 0;
        };
        while sent < max {
            if let Some(cell) = ch.urgent.front() {
                out.put(cell);
                ch.urgent.pop_front();
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
            let batch_index = out.cells();
            let Some((command, sampled)) = queue.pop_into(out) else {
                ch.sched.deactivate(q);
                continue;
            };
            let left = queue.len();
            ch.queued = ch.queued.saturating_sub(1);
            circ_cells += 1;
            circ.cells_sent += 1;
            if super::switch::counted(command) {
                circ.sw.sent[usize::from(side == Side::Next)] += 1;
            }
            if self.sw.tracking() {
                self.sw.cell_left(key, chan, now);
            }
            if let Some(queued) = sampled {
                if self.cell_samples.len() < MAX_PENDING_SAMPLES {
                    self.cell_samples.push_back(CellSample {
                        chan,
                        circ: key,
                        queued,
                        dequeued: now,
                        batch_index,
                    });
                }
            }
            ch.sched.cell_sent(q, now);
            if left == 0 {
                ch.sched.deactivate(q);
                let queue = circ.queue(side);
                let cap = queue.capacity();
                if queue.emptied_at(now) {
                    self.emptied_queues
                        .push_back((now + QUEUE_RELEASE_AFTER, q));
                }
                self.stats.queue_buffer_cells -= cap - circ.queue(side).capacity();
            }
            if left == QUEUE_LOWWATER && circ.edge_out_side() == side && circ.edge_mut().is_some() {
                drained_edges.push(key);
            }
            self.stats.queued_cells = self.stats.queued_cells.saturating_sub(1);
            sent += 1;
        }
        self.stats.cells_transmitted += sent as u64;
        for key in drained_edges {
            self.package_all(key, now);
        }
        if circ_cells > 0 {
            self.hold_after_transmit(chan, now);
        }
        sent
    }

    /// Put a cell on a circuit's queue toward `side` and wake its channel.
    pub(super) fn enqueue(&mut self, key: CircKey, side: Side, cell: impl QueueCell, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Some((chan, _)) = circ.endpoint(side) else {
            return;
        };
        let sampled = match self.cfg.cell_sample_every {
            0 => false,
            every => {
                self.sample_counter = self.sample_counter.wrapping_add(1);
                self.sample_counter.is_multiple_of(every)
            }
        };
        let queue = circ.queue(side);
        let cap = queue.capacity();
        queue.push(cell, now, sampled);
        let len = queue.len();
        self.stats.queued_cells += 1;
        self.stats.queue_buffer_cells += queue.capacity() - cap;
        if len > self.cfg.max_circuit_queue {
            return self.kill(
                key,
                "circuit queue limit exceeded (peer ignores flow control)",
                now,
            );
        }
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.queued += 1;
            if len == 1 {
                ch.sched.activate(queue_id(key, side), now);
            }
        }
        if self.hold.has_channels() {
            self.hold_arrival(chan, key, now);
        }
        self.mark_ready(chan);
        self.check_mem_in_queues(now);
    }

    /// When the sweep of emptied queues next has work ([`QUEUE_RELEASE_AFTER`] after the
    /// oldest listed queue emptied).
    pub(super) fn queue_sweep_deadline(&self) -> Option<Instant> {
        self.emptied_queues.front().map(|(due, _)| *due)
    }

    /// Free the buffers of queues empty for [`QUEUE_RELEASE_AFTER`]. Each queue is listed at
    /// most once (its `listed` flag), so the list is bounded by the number of queues.
    pub(super) fn sweep_emptied_queues(&mut self, now: Instant) {
        let mut again = Vec::new();
        while let Some(&(due, q)) = self.emptied_queues.front() {
            if due > now {
                break;
            }
            self.emptied_queues.pop_front();
            let (key, side) = queue_of(q);
            if let Some(circ) = self.circuits.get_mut(&key) {
                let queue = circ.queue(side);
                let cap = queue.capacity();
                if let Some(next) = queue.sweep(now) {
                    again.push((next, q));
                }
                self.stats.queue_buffer_cells -= cap - queue.capacity();
            }
        }
        // The list stays in due order: entries are appended at now + QUEUE_RELEASE_AFTER,
        // a re-listed one may be due earlier than the last of them.
        for e in again {
            let pos = self.emptied_queues.partition_point(|(d, _)| *d <= e.0);
            self.emptied_queues.insert(pos, e);
        }
    }

    /// Give back the buffer room no queued cell uses: free the buffers of empty queues (those
    /// waiting for the sweep) and shrink queues whose buffer is more than twice their length.
    /// Returns the bytes given back. The OOM handler calls this before it kills circuits: a
    /// burst that drained leaves grown buffers nobody needs, and freeing them costs no circuit.
    pub(super) fn compact_queues(&mut self) -> usize {
        let mut freed = 0;
        for circ in self.circuits.values_mut() {
            for side in [Side::Prev, Side::Next] {
                freed += circ.queue(side).compact();
            }
        }
        self.stats.queue_buffer_cells -= freed;
        freed * CELL_MEM_COST
    }

    pub(super) fn mark_ready(&mut self, chan: ChannelId) {
        if self.ready_set.insert(chan) {
            self.ready.push_back(chan);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chive_cell::CellCommand;

    use super::*;

    /// Every cell keeps its enqueue time: the head's is the queue's oldest, and sampled cells
    /// report theirs when they leave.
    #[test]
    fn cells_carry_their_enqueue_time() {
        let t0 = Instant::now();
        let cell = || Cell::new(1, CellCommand::RELAY, &[]).unwrap();
        let mut q = CellQueue::default();
        assert_eq!(q.oldest(), None);
        q.push(cell(), t0, false);
        q.push(cell(), t0 + Duration::from_secs(1), true);
        q.push(cell(), t0 + Duration::from_secs(2), false);
        assert_eq!(q.oldest(), Some(t0));
        assert_eq!(q.pop().map(|(_, s)| s), Some(None));
        assert_eq!(q.oldest(), Some(t0 + Duration::from_secs(1)));
        assert_eq!(
            q.pop().map(|(_, s)| s),
            Some(Some(t0 + Duration::from_secs(1)))
        );
        q.clear();
        assert_eq!((q.len(), q.oldest()), (0, None));
        assert!(CELL_MEM_COST >= std::mem::size_of::<Cell>() + std::mem::size_of::<Instant>());
    }

    /// An emptied queue holds no buffer if it never grew; a grown one keeps its buffer until
    /// the sweep finds it empty for QUEUE_RELEASE_AFTER, and keeps it if it filled again.
    #[test]
    fn emptied_queues_give_their_buffer_back() {
        let t0 = Instant::now();
        let cell = || Cell::new(1, CellCommand::RELAY, &[]).unwrap();
        let mut q = CellQueue::default();
        q.push(cell(), t0, false);
        q.pop();
        assert!(!q.emptied_at(t0), "a 4-cell buffer is not listed");
        assert_eq!(q.buffer_bytes(), 0);

        for _ in 0..40 {
            q.push(cell(), t0, false);
        }
        while q.pop().is_some() {}
        assert!(q.emptied_at(t0), "a grown buffer is listed");
        assert!(!q.emptied_at(t0), "and listed once");
        assert!(q.buffer_bytes() >= 40 * CELL_MEM_COST);
        let half = t0 + QUEUE_RELEASE_AFTER / 2;
        assert_eq!(q.sweep(half), Some(t0 + QUEUE_RELEASE_AFTER));
        assert_eq!(q.sweep(t0 + QUEUE_RELEASE_AFTER), None);
        assert_eq!(q.buffer_bytes(), 0);

        // Filled again before the sweep: the buffer stays, the queue is unlisted.
        for _ in 0..40 {
            q.push(cell(), t0, false);
        }
        while q.pop().is_some() {}
        assert!(q.emptied_at(t0));
        q.push(cell(), half, false);
        assert_eq!(q.sweep(t0 + QUEUE_RELEASE_AFTER), None);
        assert!(q.buffer_bytes() > 0);
        q.pop();
        assert!(q.emptied_at(half), "listed again when it empties again");
    }
}
