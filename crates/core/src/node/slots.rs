//! A circuit queue's buffer: a ring of cell slots that stay filled once made, so a relayed
//! cell is copied straight into its slot.
//!
//! With a `VecDeque`, `push_back(QueuedCell { cell: cell.clone(), .. })` built the clone on the
//! stack (before the deque's possible growth) and then moved it into place: two 514-byte copies
//! per relayed cell, of which only one is needed (the driver decodes into a reused cell and the
//! core passes it on by reference). Here the cell's fields are assigned into a slot that is
//! already there; only growth makes new slots. The room a ring holds, and so what it costs
//! against `MaxMemInQueues`, grows as a `VecDeque`'s does (4 cells, then doubling) and is given
//! back the same way ([`SlotRing::release`], [`SlotRing::shrink`]).

use std::time::Instant;

use chive_cell::Cell;

/// A cell waiting in a circuit queue, with when it was queued: the OOM handler kills the
/// circuits whose oldest cell is oldest (`node/oom.rs`), and sampled cells report their
/// queueing delay.
#[derive(Clone)]
pub(super) struct QueuedCell {
    pub(super) cell: Cell,
    pub(super) queued: Instant,
    /// Whether this cell is one of the instrumentation samples (`cell_sample_every`).
    pub(super) sampled: bool,
}

/// A cell as a queue takes it: owned (moved into its slot) or borrowed (copied into it).
pub(super) trait QueueCell {
    /// Write this cell over the cell in `slot`.
    fn write_to(self, slot: &mut Cell);
    /// This cell as a value of its own (a slot the ring makes when it grows).
    fn into_cell(self) -> Cell;
}

impl QueueCell for Cell {
    fn write_to(self, slot: &mut Cell) {
        *slot = self;
    }

    fn into_cell(self) -> Cell {
        self
    }
}

impl QueueCell for &Cell {
    fn write_to(self, slot: &mut Cell) {
        // Field by field from the reference: one copy of the payload, no temporary.
        slot.circ_id = self.circ_id;
        slot.command = self.command;
        slot.payload = self.payload;
    }

    fn into_cell(self) -> Cell {
        self.clone()
    }
}

/// Queued cells in `slots[head..]` then `slots[..]`, `len` of them. Every element of `slots`
/// is a valid cell (those past the queued ones are left from earlier cells) and `slots` is as
/// long as its allocation, so a push within the room writes over an existing slot.
///
/// `head` and `len` are `u32`, so the ring is as small as the `VecDeque` it replaced (a
/// circuit holds two inline): a queue never holds 2^32 cells (`max_circuit_queue` kills a
/// circuit whose queue passes it, and 2^32 cells would be 2 TiB).
#[derive(Default)]
pub(super) struct SlotRing {
    slots: Vec<QueuedCell>,
    head: u32,
    len: u32,
}

#[cfg(test)]
thread_local! {
    /// Pushes that wrote over a slot, on this thread (test hook: a steady queue makes no new
    /// slots). Not a field, so the ring's size in tests is its size in the build.
    pub(super) static REUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl SlotRing {
    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cells of room the ring's allocation holds.
    pub(super) fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Where the queue's `i`-th cell lies in `slots` (`i < slots.len()`).
    fn at(&self, i: usize) -> usize {
        let p = self.head as usize + i;
        if p >= self.slots.len() {
            p - self.slots.len()
        } else {
            p
        }
    }

    pub(super) fn push(&mut self, cell: impl QueueCell, queued: Instant, sampled: bool) {
        if self.len() < self.slots.len() {
            let at = self.at(self.len());
            let slot = &mut self.slots[at];
            cell.write_to(&mut slot.cell);
            slot.queued = queued;
            slot.sampled = sampled;
            self.len += 1;
            #[cfg(test)]
            REUSED.with(|r| r.set(r.get() + 1));
            return;
        }
        self.grow(QueuedCell {
            cell: cell.into_cell(),
            queued,
            sampled,
        });
    }

    /// Full: put the cells in order from slot 0, double the room (4 at first, as `VecDeque`)
    /// and fill the new room with copies of `first`, which goes in after the queued cells.
    #[cold]
    fn grow(&mut self, first: QueuedCell) {
        self.slots.rotate_left(self.head as usize);
        self.head = 0;
        let room = (2 * self.slots.len()).max(4);
        self.slots.reserve_exact(room - self.slots.len());
        let fill = self.slots.capacity() - self.slots.len();
        self.slots.extend(std::iter::repeat_n(first, fill));
        self.len += 1;
    }

    pub(super) fn front(&self) -> Option<&QueuedCell> {
        (self.len > 0).then(|| &self.slots[self.head as usize])
    }

    /// Drop the oldest cell (its slot stays for a later push).
    pub(super) fn pop_front(&mut self) {
        if self.len == 0 {
            return;
        }
        // `at` is below `slots.len()`, which is below 2^32 (the type's note).
        self.head = self.at(1) as u32;
        self.len -= 1;
    }

    /// Free the buffer (the ring must be empty or its cells are dropped with it).
    pub(super) fn release(&mut self) {
        *self = SlotRing::default();
    }

    /// Shrink the buffer to the queued cells (costs a copy of them; the OOM handler's call).
    pub(super) fn shrink(&mut self) {
        if self.len == 0 {
            return self.release();
        }
        self.slots.rotate_left(self.head as usize);
        self.head = 0;
        self.slots.truncate(self.len());
        self.slots.shrink_to_fit();
    }

    /// Every queued cell, oldest first.
    pub(super) fn for_each_mut(&mut self, mut f: impl FnMut(&mut QueuedCell)) {
        for i in 0..self.len() {
            let at = self.at(i);
            f(&mut self.slots[at]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use chive_cell::CellCommand;

    use super::*;

    fn cell(n: u32) -> Cell {
        let mut c = Cell::new(n, CellCommand::RELAY, &n.to_be_bytes()).unwrap();
        c.payload[508] = n as u8;
        c
    }

    /// Pushes (owned and borrowed) and pops in an uneven pattern, wrapping round the ring and
    /// growing it while it wraps: the cells come out as a `VecDeque` gives them back, and the
    /// room grows as a `VecDeque`'s does.
    #[test]
    fn the_ring_keeps_order_across_wraps_and_growth() {
        let t0 = Instant::now();
        let mut ring = SlotRing::default();
        let mut model: VecDeque<u32> = VecDeque::new();
        let mut next = 0u32;
        let mut rng = 7u32;
        for step in 0..4000 {
            rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            // Mostly balanced, with bursts that grow the ring from a wrapped state.
            let pushes = if step % 500 == 499 {
                40
            } else {
                (rng >> 16) % 3
            };
            for _ in 0..pushes {
                let c = cell(next);
                if next.is_multiple_of(2) {
                    ring.push(&c, t0, false);
                } else {
                    ring.push(c, t0, false);
                }
                model.push_back(next);
                next += 1;
            }
            let pops = (rng >> 20) % 3;
            for _ in 0..pops {
                let want = model.pop_front();
                let got = ring.front().map(|q| q.cell.clone());
                assert_eq!(got.as_ref().map(|c| c.circ_id), want);
                if let (Some(c), Some(w)) = (got, want) {
                    let w = cell(w);
                    assert_eq!((c.command, c.payload), (w.command, w.payload));
                }
                ring.pop_front();
            }
            assert_eq!(ring.len(), model.len());
            assert!(ring.capacity() >= ring.len());
        }
        let mut ids = Vec::new();
        ring.for_each_mut(|q| ids.push(q.cell.circ_id));
        assert_eq!(ids, model.iter().copied().collect::<Vec<_>>());
        // Room as a VecDeque's: a power of two from 4, at most twice the longest queue.
        assert!(ring.capacity().is_power_of_two() && ring.capacity() >= 4);
    }

    /// A queue that fills and drains within its room writes every later cell over an old slot:
    /// after the first fill no push makes a new slot, whatever the wrap.
    #[test]
    fn a_steady_queue_writes_over_its_slots() {
        let t0 = Instant::now();
        let mut ring = SlotRing::default();
        // By reference, as the relay path pushes (the driver's reused cell).
        let mut relayed = cell(0);
        for n in 0..16 {
            relayed.circ_id = n;
            ring.push(&relayed, t0, false);
        }
        let room = ring.capacity();
        let reused = REUSED.with(|r| r.get());
        for round in 0..50u32 {
            for _ in 0..5 {
                ring.pop_front();
            }
            for n in 0..5 {
                relayed.circ_id = 100 + round * 5 + n;
                ring.push(&relayed, t0, true);
            }
        }
        assert_eq!(ring.capacity(), room);
        assert_eq!(REUSED.with(|r| r.get()) - reused, 250);
        // The last 16 cells pushed: 334..350.
        assert_eq!(ring.front().map(|q| q.cell.circ_id), Some(334));
        // Shrinking keeps the cells in order and gives back the spare room.
        ring.pop_front();
        ring.shrink();
        assert_eq!(ring.capacity(), 15);
        let mut ids = Vec::new();
        ring.for_each_mut(|q| ids.push(q.cell.circ_id));
        assert_eq!(ids, (335..350).collect::<Vec<_>>());
        ring.release();
        assert_eq!((ring.len(), ring.capacity()), (0, 0));
    }
}
