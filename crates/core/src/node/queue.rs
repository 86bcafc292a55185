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

use std::time::Instant;

use chive_cell::{set_wire_circ_id, Cell, CellCommand, CircId, CELL_LEN};

use crate::sched::QueueId;
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

/// A slot of a circuit queue: a cell in its 514-byte wire form, with when it was queued (the
/// OOM handler kills the circuits whose oldest cell is oldest, `node/oom.rs`, and sampled cells
/// report their queueing delay). Slots are written in place and reused: a cell is copied once
/// into its slot and once out of it (into the batch the connection's writer seals).
#[derive(Clone)]
pub(super) struct QueuedCell {
    wire: [u8; CELL_LEN],
    queued: Instant,
    /// Whether this cell is one of the instrumentation samples (`cell_sample_every`).
    sampled: bool,
}

/// What one queued cell costs against `MaxMemInQueues`: the cell and its enqueue time as the
/// queue stores them (Tor charges `packed_cell_mem_cost()`, the same idea).
pub const CELL_MEM_COST: usize = std::mem::size_of::<QueuedCell>();

/// The smallest buffer a queue allocates, in cells (what `VecDeque` allocated first).
const QUEUE_MIN_CELLS: usize = 4;

/// Where [`Core::poll_transmit`] puts the cells it takes: decoded cells (`Vec<Cell>`) or their
/// wire bytes (`Vec<u8>`, [`Core::poll_transmit_wire`]). A queued cell is handed over as the
/// wire bytes its slot holds, so putting it in a wire batch is one 514-byte copy.
pub(super) trait CellSink {
    /// Append `cell` (a link-level cell, not from a circuit queue).
    fn put(&mut self, cell: &Cell);
    /// Append the cell whose wire form is `wire`.
    fn put_wire(&mut self, wire: &[u8; CELL_LEN]);
    /// Cells appended so far (a sampled cell's index in its batch).
    fn cells(&self) -> usize;
}

impl CellSink for Vec<Cell> {
    fn put(&mut self, cell: &Cell) {
        self.push(cell.clone());
    }

    fn put_wire(&mut self, wire: &[u8; CELL_LEN]) {
        self.push(Cell::from_wire(wire));
    }

    fn cells(&self) -> usize {
        self.len()
    }
}

impl CellSink for Vec<u8> {
    fn put(&mut self, cell: &Cell) {
        cell.encode_into(self);
    }

    fn put_wire(&mut self, wire: &[u8; CELL_LEN]) {
        self.extend_from_slice(wire);
    }

    fn cells(&self) -> usize {
        // Only fixed cells leave through the send path.
        self.len() / CELL_LEN
    }
}

/// One direction of a circuit's cells waiting for their channel, oldest first: a ring of
/// [`QueuedCell`] slots (`slots.capacity()` is the ring's size; `len` of them from `head` on,
/// wrapping, hold cells). It grows by doubling like `VecDeque`, and its slots are reused in
/// place. Slots are initialized as the ring's first lap reaches them (`slots.len()` grows to the
/// capacity), never ahead: buffer room no cell has used is not touched, so it costs no resident
/// memory (as with `VecDeque`). Until the first lap ends the cells cannot wrap, so they lie in
/// `slots[head..head + len]` below `slots.len()`. An emptied queue starts again at slot 0
/// (`head = 0`), which keeps this true: the next cells reuse initialized slots from 0 on, and
/// a new slot is initialized only when they reach `slots.len()`.
#[derive(Default)]
pub(super) struct CellQueue {
    slots: Vec<QueuedCell>,
    /// The oldest cell's slot and the number of cells (`u32`: a queue is killed long before
    /// that many, `max_circuit_queue`), so the queue is no larger than the `VecDeque` it was.
    head: u32,
    len: u32,
    /// When the queue last became empty while holding a grown buffer (`None` otherwise).
    emptied: Option<Instant>,
    /// Whether the queue is on `Core::emptied_queues` (at most once).
    listed: bool,
}

/// A cell as [`Core::enqueue`] takes it: owned or borrowed (a relayed cell comes by reference
/// from the driver's decoding buffer). Either way it is written straight into its queue slot:
/// no `Cell` value is built on the way.
pub(super) trait QueueCell {
    /// Write this cell's wire form into `wire`.
    fn write_to(self, wire: &mut [u8; CELL_LEN]);
}

/// A fixed cell as read from a link (`wire`), queued under the circuit id it leaves with.
pub(super) struct WireCell<'a> {
    pub(super) wire: &'a [u8; CELL_LEN],
    pub(super) circ_id: CircId,
}

impl QueueCell for WireCell<'_> {
    fn write_to(self, wire: &mut [u8; CELL_LEN]) {
        *wire = *self.wire;
        set_wire_circ_id(wire, self.circ_id);
    }
}

impl QueueCell for &Cell {
    fn write_to(self, wire: &mut [u8; CELL_LEN]) {
        self.write_wire(wire);
    }
}

impl QueueCell for Cell {
    fn write_to(self, wire: &mut [u8; CELL_LEN]) {
        (&self).write_to(wire)
    }
}

impl CellQueue {
    #[cfg(test)]
    fn push(&mut self, cell: impl QueueCell, now: Instant, sampled: bool) {
        cell.write_to(self.push_slot(now));
        self.set_last_sampled(sampled);
    }

    /// Append a cell slot stamped `now` (not sampled) and return its wire bytes to be written in
    /// place; they hold whatever the slot held before.
    pub(super) fn push_slot(&mut self, now: Instant) -> &mut [u8; CELL_LEN] {
        if self.len() == self.slots.capacity() {
            self.grow();
        }
        let at = self.phys(self.len());
        if at == self.slots.len() {
            // The first lap: this slot is new.
            self.slots.push(QueuedCell {
                wire: [0; CELL_LEN],
                queued: now,
                sampled: false,
            });
        }
        self.len += 1;
        let slot = &mut self.slots[at];
        slot.queued = now;
        slot.sampled = false;
        &mut slot.wire
    }

    /// The slot of the `i`-th cell from the head (`i` ≤ the capacity: at most one wrap; a
    /// modulo would cost a division per cell).
    #[inline(always)]
    fn phys(&self, i: usize) -> usize {
        let at = self.head as usize + i;
        let cap = self.slots.capacity();
        if at >= cap {
            at - cap
        } else {
            at
        }
    }

    /// The newest cell's slot.
    fn last(&mut self) -> Option<&mut QueuedCell> {
        let n = self.len().checked_sub(1)?;
        let at = self.phys(n);
        self.slots.get_mut(at)
    }

    /// Mark the newest cell as an instrumentation sample (or not).
    pub(super) fn set_last_sampled(&mut self, sampled: bool) {
        if let Some(q) = self.last() {
            q.sampled = sampled;
        }
    }

    /// Take back the newest cell's slot (written, then not to be queued). A queue left empty
    /// with the smallest buffer frees it, as a pop would.
    pub(super) fn unpush(&mut self) {
        if self.len == 0 {
            return;
        }
        self.len -= 1;
        if self.len == 0 {
            self.head = 0;
            if self.slots.capacity() <= QUEUE_KEEP_CELLS {
                self.release();
            }
        }
    }

    /// Double the ring (at least [`QUEUE_MIN_CELLS`]), its cells first and in order.
    fn grow(&mut self) {
        let new_cap = (2 * self.slots.capacity()).max(QUEUE_MIN_CELLS);
        self.set_capacity(new_cap);
    }

    /// Re-lay the ring with its cells from index 0 in a buffer of `cap` (≥ `len`) slots. The
    /// cells lie in `slots[..slots.len()]` (wrapping only once every slot is initialized), so
    /// rotating them there puts them first.
    fn set_capacity(&mut self, cap: usize) {
        self.slots.rotate_left(self.head as usize);
        self.head = 0;
        self.slots.truncate(self.len());
        if cap > self.slots.capacity() {
            self.slots.reserve_exact(cap - self.slots.len());
        } else {
            self.slots.shrink_to(cap);
        }
    }

    /// Hand the next cell's wire bytes to `out` where they lie, drop it from the queue; its
    /// command, and its enqueue time if it was sampled.
    fn pop_into(&mut self, out: &mut impl CellSink) -> Option<(CellCommand, Option<Instant>)> {
        if self.len == 0 {
            return None;
        }
        let head = self.head as usize;
        let q = &self.slots[head];
        out.put_wire(&q.wire);
        let taken = (CellCommand(q.wire[4]), q.sampled.then_some(q.queued));
        self.len -= 1;
        // Emptied, the next cell goes to the first slot again rather than on round the ring:
        // a queue that drains after every batch keeps reusing the same few slots, warm in
        // cache, instead of touching every slot a burst once grew it to.
        self.head = if self.len == 0 {
            0
        } else {
            self.phys(1) as u32
        };
        Some(taken)
    }

    /// The next cell, decoded, and its enqueue time if it was sampled.
    #[cfg(test)]
    fn pop(&mut self) -> Option<(Cell, Option<Instant>)> {
        let mut out = Vec::with_capacity(1);
        let (_, sampled) = self.pop_into(&mut out)?;
        Some((out.pop()?, sampled))
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    /// Cells the queue's buffer has room for (what it costs against `MaxMemInQueues`).
    pub(super) fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Free the buffer (the queue must be empty or be cleared).
    fn release(&mut self) {
        self.slots = Vec::new();
        self.head = 0;
        self.len = 0;
    }

    /// Give back buffer room the queue does not use: an empty queue frees its buffer, a
    /// non-empty one whose buffer is more than twice its length shrinks to fit. Returns the
    /// cells of capacity given back. Costs a copy of the queued cells; the OOM handler calls
    /// it, not the send path.
    pub(super) fn compact(&mut self) -> usize {
        let before = self.slots.capacity();
        if self.len == 0 {
            self.release();
        } else if before > 2 * self.len() {
            self.set_capacity(self.len());
        }
        before - self.slots.capacity()
    }

    /// Called when a pop left the queue empty at `now`: release a small buffer now; for a
    /// grown one, note the time and return whether the queue must be listed for the sweep.
    fn emptied_at(&mut self, now: Instant) -> bool {
        if self.slots.capacity() <= QUEUE_KEEP_CELLS {
            // The caller reads the capacity before and after: the release is counted.
            self.release();
            return false;
        }
        self.emptied = Some(now);
        !std::mem::replace(&mut self.listed, true)
    }

    /// The sweep's visit: free the buffer if the queue has stayed empty since `deadline -
    /// QUEUE_RELEASE_AFTER`; otherwise the time to look again (still listed), if any.
    fn sweep(&mut self, now: Instant) -> Option<Instant> {
        match self.emptied {
            Some(t) if self.len == 0 => {
                let due = t + QUEUE_RELEASE_AFTER;
                if due <= now {
                    self.release();
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
        self.slots.capacity() * std::mem::size_of::<QueuedCell>()
    }

    /// When the oldest cell still queued was queued.
    pub(super) fn oldest(&self) -> Option<Instant> {
        (self.len > 0).then(|| self.slots[self.head as usize].queued)
    }

    pub(super) fn clear(&mut self) {
        self.release();
        self.emptied = None;
    }

    /// Give every queued cell a new circuit id (its circuit moved to another connection:
    /// cells carry their id from when they were queued).
    pub(super) fn set_circ_id(&mut self, id: CircId) {
        for i in 0..self.len() {
            let at = self.phys(i);
            set_wire_circ_id(&mut self.slots[at].wire, id);
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
        // The scheduler's next pick when the loop below already made it (`Some(None)`: none).
        let mut carried: Option<Option<(QueueId, usize)>> = None;
        while sent < max {
            if let Some(cell) = ch.urgent.front() {
                out.put(cell);
                ch.urgent.pop_front();
                sent += 1;
                continue;
            }
            let picked = match carried.take() {
                Some(p) => p,
                None => ch.sched.pick_run(now, max - sent),
            };
            let Some((q, mut run)) = picked else { break };
            // A run of 0 would take nothing and ask again forever.
            run = run.max(1);
            let (key, side) = queue_of(q);
            let Some(circ) = self.circuits.get_mut(&key) else {
                ch.sched.deactivate(q);
                continue;
            };
            // The picked queue's cells for as long as the scheduler picks it again (every
            // pick still made, in the same order): its circuit is looked up once for them, and
            // the scheduler is asked once per run of picks it promises (`pick_run`), told once
            // per run (`cells_sent`). Nothing in the loop changes what it would pick: only this
            // queue's cells leave, and link-level cells are only added outside `poll_transmit`.
            loop {
                let mut taken = 0;
                let mut left = usize::MAX;
                while taken < run {
                    let queue = circ.queue(side);
                    let batch_index = out.cells();
                    let Some((command, sampled)) = queue.pop_into(out) else {
                        break;
                    };
                    left = queue.len();
                    taken += 1;
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
                    if left == QUEUE_LOWWATER
                        && circ.edge_out_side() == side
                        && circ.edge_mut().is_some()
                    {
                        drained_edges.push(key);
                    }
                    if left == 0 {
                        break;
                    }
                }
                ch.sched.cells_sent(q, taken, now);
                ch.queued = ch.queued.saturating_sub(taken);
                circ_cells += taken;
                self.stats.queued_cells = self.stats.queued_cells.saturating_sub(taken);
                sent += taken;
                if taken < run && left != 0 {
                    // Nothing to take at all (`pop_into` found the queue empty).
                    ch.sched.deactivate(q);
                    break;
                }
                if left == 0 {
                    ch.sched.deactivate(q);
                    let queue = circ.queue(side);
                    let cap = queue.capacity();
                    if queue.emptied_at(now) {
                        self.emptied_queues
                            .push_back((now + QUEUE_RELEASE_AFTER, q));
                    }
                    self.stats.queue_buffer_cells -= cap - circ.queue(side).capacity();
                    break;
                }
                // The outer loop's checks, in its order: room, link-level cells, the pick.
                if sent >= max || !ch.urgent.is_empty() {
                    break;
                }
                match ch.sched.pick_run(now, max - sent) {
                    Some((next, n)) if next == q => run = n.max(1),
                    next => {
                        carried = Some(next);
                        break;
                    }
                }
            }
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
        self.enqueue_with(key, side, now, |_, slot| {
            cell.write_to(slot);
            None::<()>
        });
    }

    /// [`Core::enqueue`] with the cell written in place by `fill`, which gets the circuit's
    /// role (its crypto) and the slot's wire bytes: a relayed cell is copied into its slot and
    /// its onion layer applied there. If `fill` returns `Some`, the cell is not queued (its slot
    /// is taken back) and that is returned. `fill` is not called when the circuit has no
    /// endpoint on `side`.
    pub(super) fn enqueue_with<R>(
        &mut self,
        key: CircKey,
        side: Side,
        now: Instant,
        fill: impl FnOnce(&mut super::circuit::Role, &mut [u8; CELL_LEN]) -> Option<R>,
    ) -> Option<R> {
        let circ = self.circuits.get_mut(&key)?;
        let (chan, _) = circ.endpoint(side)?;
        let (queue, role) = match side {
            Side::Prev => (&mut circ.q_prev, &mut circ.role),
            Side::Next => (&mut circ.q_next, &mut circ.role),
        };
        let cap = queue.capacity();
        if let Some(taken) = fill(role, queue.push_slot(now)) {
            queue.unpush();
            self.stats.queue_buffer_cells += queue.capacity();
            self.stats.queue_buffer_cells -= cap;
            return Some(taken);
        }
        // `push_slot` cleared the flag: only a sampled cell needs it set.
        if next_sampled(&mut self.sample_counter, self.cfg.cell_sample_every) {
            queue.set_last_sampled(true);
        }
        let len = queue.len();
        self.stats.queued_cells += 1;
        self.stats.queue_buffer_cells += queue.capacity() - cap;
        if len > self.cfg.max_circuit_queue {
            self.kill(
                key,
                "circuit queue limit exceeded (peer ignores flow control)",
                now,
            );
            return None;
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
        None
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

/// Whether the cell being queued is one the queue-delay metric samples: every `every`-th queued
/// cell (`CoreConfig::cell_sample_every`; 0 = none), counted by `counter` across all queues.
pub(super) fn next_sampled(counter: &mut u64, every: u64) -> bool {
    if every == 0 {
        return false;
    }
    *counter = counter.wrapping_add(1);
    counter.is_multiple_of(every)
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

    /// The ring keeps its cells in order through wrapping, growth while wrapped, compaction
    /// and a new circuit id, and initializes a slot only when a cell first reaches it (room no
    /// cell used stays untouched: no resident memory for it).
    #[test]
    fn the_ring_keeps_order_and_touches_only_used_slots() {
        let t0 = Instant::now();
        let cell = |i: u8| Cell::new(7, CellCommand::RELAY, &[i; 20]).unwrap();
        let mut q = CellQueue::default();
        for i in 0..5 {
            q.push(cell(i), t0, false);
        }
        assert_eq!(q.capacity(), 8);
        assert_eq!(q.slots.len(), 5, "three slots never used, never written");
        let mut next_out = 0u8;
        let mut next_in = 5u8;
        // Cycle so the cells wrap around the end, then grow while wrapped.
        for _ in 0..6 {
            assert_eq!(q.pop().unwrap().0.payload[0], next_out);
            next_out += 1;
            q.push(cell(next_in), t0, false);
            next_in += 1;
        }
        assert_eq!((q.len(), q.capacity(), q.slots.len()), (5, 8, 8));
        for _ in 0..10 {
            q.push(cell(next_in), t0, false);
            next_in += 1;
        }
        assert_eq!((q.len(), q.capacity()), (15, 16));
        q.set_circ_id(9);
        for _ in 0..12 {
            let (c, _) = q.pop().unwrap();
            assert_eq!((c.payload[0], c.circ_id), (next_out, 9));
            next_out += 1;
        }
        assert_eq!(q.compact(), 13, "shrunk to its 3 cells");
        while let Some((c, _)) = q.pop() {
            assert_eq!(c.payload[0], next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
    }

    /// A queue that empties starts again at slot 0: cells reuse the first slots (warm) instead
    /// of going on round a ring a burst grew, and slots past those a cell reached stay
    /// untouched (the first lap still initializes them only when reached), in order.
    #[test]
    fn an_emptied_queue_starts_again_at_the_first_slot() {
        let t0 = Instant::now();
        let cell = |i: u8| Cell::new(7, CellCommand::RELAY, &[i; 20]).unwrap();
        let mut q = CellQueue::default();
        for i in 0..40 {
            q.push(cell(i), t0, false);
        }
        for _ in 0..30 {
            q.pop();
        }
        assert_eq!((q.head, q.capacity(), q.slots.len()), (30, 64, 40));
        while q.pop().is_some() {}
        assert_eq!(q.head, 0, "emptied: back to the first slot");
        // A batch of 8 lands in slots 0..8, and again after it drained.
        for round in 0..3u8 {
            for i in 0..8 {
                q.push(cell(round * 10 + i), t0, false);
            }
            assert_eq!((q.head, q.slots.len()), (0, 40), "no slot past 40 touched");
            for i in 0..8 {
                assert_eq!(q.pop().unwrap().0.payload[0], round * 10 + i);
            }
        }
        // Past the initialized slots the first lap goes on one new slot per cell, and a wrap
        // and growth keep the order.
        for i in 0..50 {
            q.push(cell(i), t0, false);
        }
        assert_eq!((q.len(), q.slots.len(), q.capacity()), (50, 50, 64));
        for i in 0..45 {
            assert_eq!(q.pop().unwrap().0.payload[0], i);
        }
        for i in 50..100 {
            q.push(cell(i), t0, false);
        }
        assert_eq!((q.len(), q.capacity()), (55, 64));
        for i in 45..100 {
            assert_eq!(q.pop().unwrap().0.payload[0], i);
        }
        assert_eq!((q.len(), q.head), (0, 0));
        // `unpush` of the only cell empties the queue too.
        q.push(cell(1), t0, false);
        q.pop();
        q.push(cell(2), t0, false);
        q.push(cell(3), t0, false);
        q.pop();
        q.unpush();
        assert_eq!((q.len(), q.head), (0, 0));
    }

    /// The ring's buffer grows as `VecDeque`'s did for the same pushes and pops (4, then
    /// doubling), so a queue holds no more heap than before for the same cells.
    #[test]
    fn the_ring_grows_as_vecdeque_did() {
        let t0 = Instant::now();
        let cell = || Cell::new(1, CellCommand::RELAY, &[]).unwrap();
        let mut q = CellQueue::default();
        let mut d: std::collections::VecDeque<QueuedCell> = std::collections::VecDeque::new();
        let mut x = 12345u32;
        for _ in 0..5000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            // Pushes slightly more often than pops: the queues grow to a few hundred cells.
            if (x >> 16) % 100 < 53 {
                q.push(cell(), t0, false);
                d.push_back(QueuedCell {
                    wire: [0; CELL_LEN],
                    queued: t0,
                    sampled: false,
                });
            } else {
                assert_eq!(q.pop().is_some(), d.pop_front().is_some());
            }
            assert_eq!((q.len(), q.capacity()), (d.len(), d.capacity()));
        }
        assert!(q.capacity() >= 128, "grew to {}", q.capacity());
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
