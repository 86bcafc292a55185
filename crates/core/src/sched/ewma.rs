//! EWMA circuit scheduling (Tang & Goldberg, CCS 2010; C tor's `circuitmux_ewma`).
//!
//! Every queue has a cell count that decays with half-life H: a cell sent Δt seconds ago weighs
//! 2^(-Δt/H). The active queue with the lowest count sends next, so a circuit that has been quiet
//! (interactive) goes ahead of one that has been busy (bulk). History survives deactivation: a
//! busy circuit that pauses keeps its decaying count; [`CircuitScheduler::forget`] drops it.
//!
//! Two implementations of the same policy:
//! - [`EwmaDirect`], the reference: on every event with a new `now` it multiplies every count by
//!   2^(-Δt/H), adds 1 per sent cell and scans the active queues for the minimum. O(circuits)
//!   per cell.
//! - [`Ewma`], the fast one (Mathewson's optimisation, described in the paper's §3.5): counts are
//!   stored relative to a reference time t0. One scale value V = 2^((now - t0)/H) is the weight
//!   of a cell sent now, and a sent cell adds V to its queue's stored count. All stored counts
//!   are the decayed counts times the same V, so their order is the decayed order and stays
//!   valid as time passes. Before V grows large enough to cost precision (2^32), every stored
//!   count is divided by V, V reset to 1 and t0 to now (renormalisation).
//!
//!   The active queues are kept in a sorted run plus an indexed min-heap. Within one write event
//!   V is constant, so every sent cell adds the same amount; when busy circuits have counts
//!   within one cell of each other (bulk circuits at equal rates, the common case), the queue
//!   that just sent has the largest count and EWMA serves them like round-robin. The run, a
//!   ring buffer in ascending order, holds such queues: the pick is its front and the queue that
//!   sent goes to its back, O(1). A queue whose count does not go after the run's back (a new
//!   circuit with a small count, a quiet one) goes to the heap, O(log n); the pick is the
//!   smaller of the run's front and the heap's root, exactly the choice one heap of all queues
//!   would make. Deactivation in the middle of the run leaves a tombstone, compacted away once
//!   tombstones outnumber live entries (amortised O(1)).
//!
//! Shared rules:
//! - the pick is the active queue with the lowest count, exactly; equal counts go to the smaller
//!   [`QueueId`]. The two implementations round differently, so counts that are equal in exact
//!   arithmetic may differ in the last bits and such a tie may break differently: the property
//!   test accepts a different pick only when the two counts agree to 1e-9 (and then drives both
//!   with the same queue). An earlier version used a tie window (smallest id within 1e-9 of the
//!   minimum) so that both picked identically, but searching the window cost up to 2× per cell
//!   when many circuits had identical histories;
//! - a decayed count below 1e-12 cells is zero (no history): both would otherwise end up
//!   comparing subnormal leftovers of circuits idle for hundreds of half-lives;
//! - time never goes backwards: a `now` older than the latest one seen counts as the latest.

use std::time::{Duration, Instant};

use super::{CircuitScheduler, QueueId, QueueMap};

mod direct;
mod heap;
#[cfg(test)]
mod tests;

pub use direct::EwmaDirect;
use heap::{entry_before, Entry, Heap, NIL};

/// A decayed count below this many cells is flushed to zero.
const FLOOR: f64 = 1e-12;
/// Renormalise when the exponent of V exceeds this (V > 2^32). Well inside f64's range and
/// precision: stored counts stay below 2^32 × (the largest decayed count).
const RENORM_EXP: f64 = 32.0;
/// Half-lives after an exact exp2() during which V is derived from it by a series (2^-10).
const ANCHOR_SPAN: f64 = 1.0 / 1024.0;

/// `Slot::pos` of a queue that has no live entry in the run.
const NO_POS: u32 = u32::MAX;
/// Tombstones the run may hold beyond its live entries before it is compacted: a few, so that
/// a handful of churning queues does not force a pass over a long run. Tests use fewer, so that
/// the property test's dozen queues reach compaction often.
const COMPACT_SLACK: usize = if cfg!(test) { 3 } else { 16 };
/// An unused position of the run's buffer.
const JUNK: Entry = Entry {
    key: 0.0,
    id: QueueId(0),
    slot: NIL,
};

/// The run: active queues in ascending (stored count, id) order, the exact order of
/// [`entry_before`], in a ring buffer. An entry is only ever appended when it goes after the
/// back, so the buffer stays sorted without comparisons in the middle; when all busy circuits
/// send at about the same rate, the queue that just sent is the largest, and EWMA is served
/// like round-robin, O(1) per cell.
///
/// Each live entry's physical position is recorded in its slot (`Slot::pos`). When the buffer is
/// full (no free position), moving the front to the back is only `head` advancing: the entry
/// stays where it is, and the per-cell path writes no memory other than that entry's key (with
/// thousands of circuits, every other line it touched would be a cache miss, as the cells
/// moving through evict the scheduler's state). When it is not full, the entry moves to the free
/// position after the back and its slot is updated; after about two rounds of such moves the
/// buffer is shrunk to fit (O(n), amortised O(1)).
///
/// An entry deactivated in the middle becomes a tombstone (`slot == NIL`, key kept so the
/// buffer stays sorted) instead of being shifted out; tombstones at either end are popped at
/// once, so the front and the back are always live.
#[derive(Default)]
struct Run {
    /// Every position of the ring; those outside `head .. head + len` (mod length) are unused.
    buf: Vec<Entry>,
    /// Physical position of the front.
    head: usize,
    /// Entries in the ring, tombstones included.
    len: usize,
    /// Tombstones in the ring.
    dead: usize,
    /// Entries written to a new position since the buffer was last laid out.
    moves: usize,
}

impl Run {
    /// Positions in the buffer.
    #[inline(always)]
    fn cap(&self) -> usize {
        self.buf.len()
    }

    /// Physical position of the `i`-th entry (`i <= len`, so at most one wrap).
    #[inline(always)]
    fn phys(&self, i: usize) -> usize {
        let p = self.head + i;
        if p >= self.cap() {
            p - self.cap()
        } else {
            p
        }
    }

    /// Live entries.
    fn live_len(&self) -> usize {
        self.len - self.dead
    }

    /// The `i`-th entry in order (tombstones included).
    #[inline(always)]
    fn get(&self, i: usize) -> Option<&Entry> {
        if i < self.len {
            self.buf.get(self.phys(i))
        } else {
            None
        }
    }

    /// The smallest live entry (the front is never a tombstone).
    #[inline(always)]
    fn front(&self) -> Option<&Entry> {
        self.get(0)
    }

    /// True if `e` may be appended: it goes after the back (or the run is empty).
    #[inline(always)]
    fn accepts(&self, e: &Entry) -> bool {
        match self.len.checked_sub(1).and_then(|i| self.get(i)) {
            Some(b) => entry_before(b, e),
            None => true,
        }
    }

    /// Remove the front entry and any tombstones behind it.
    #[inline(always)]
    fn pop_front(&mut self) -> Option<Entry> {
        let e = *self.front()?;
        self.head = self.phys(1);
        self.len -= 1;
        self.trim();
        Some(e)
    }

    /// Pop tombstones at both ends.
    #[inline(always)]
    fn trim(&mut self) {
        while self.front().is_some_and(|e| e.slot == NIL) {
            self.head = self.phys(1);
            self.len -= 1;
            self.dead -= 1;
        }
        while self
            .len
            .checked_sub(1)
            .and_then(|i| self.get(i))
            .is_some_and(|e| e.slot == NIL)
        {
            self.len -= 1;
            self.dead -= 1;
        }
    }

    /// Too many tombstones: memory would no longer be bounded by the live entries.
    fn needs_compaction(&self) -> bool {
        self.dead > self.live_len() + COMPACT_SLACK
    }

    /// Positions to give the buffer when it is laid out again for `live` entries and may grow.
    fn roomy(live: usize) -> usize {
        live + live / 4 + 4
    }
}

/// A queue the fast scheduler knows: active, or inactive with history.
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: QueueId,
    /// Stored count: decayed count × V. Not maintained while the queue is in the run: its
    /// entry's key is the count then (so that the per-cell path need not touch the slot).
    count: f64,
    /// Physical position of the queue's live entry in the run, or [`NO_POS`].
    pos: u32,
    /// False when the slot is on the free list.
    live: bool,
}

impl Slot {
    fn fresh(id: QueueId) -> Slot {
        Slot {
            id,
            count: 0.0,
            pos: NO_POS,
            live: true,
        }
    }
}

/// EWMA, fast implementation: scale factor V, and the active queues in a sorted run plus an
/// indexed min-heap.
///
/// Every active queue is in exactly one of three places:
/// - `zero`, a heap ordered by id, if its count is 0 (all such counts are equal); this makes
///   "a count that decayed below 1e-12 is zero" exact: the smallest positive count is the
///   front of the run or the root of the heap, so flushing the ones that crossed the floor is a
///   pop loop at pick time;
/// - the run (see [`Run`]), if it sent a cell and its new count went after every queue there:
///   the common case, O(1);
/// - `heap`, otherwise: activated queues with a positive count, and queues whose count grew but
///   is still below the run's back, O(log n). Such a queue goes to the run's back once it is
///   picked and sends (see [`Ewma::requeue`]).
///
/// The pick is the zero heap's root if any, else the smaller of the run's front and the heap's
/// root, in the exact (count, id) order: the same choice as a single heap of all queues.
pub struct Ewma {
    halflife: f64,
    inv_halflife: f64,
    /// 1 / (H in nanoseconds).
    inv_halflife_ns: f64,
    /// Reference time of stored counts; `None` before the first event.
    t0: Option<Instant>,
    /// Latest `now` seen (time never goes backwards).
    last: Option<Instant>,
    /// V = 2^((last - t0)/H): weight of a cell sent at `last`, in stored units.
    scale: f64,
    /// (time, exponent (time - t0)/H, V) at the last exact exp2(): V at a nearby time is
    /// computed from it with a short series.
    anchor: Option<(Instant, f64, f64)>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: QueueMap<u32>,
    /// Active queues with a positive count, in ascending order (most of them).
    run: Run,
    /// Active queues with a positive count that are not in the run.
    heap: Heap,
    /// Active queues with count 0.
    zero: Heap,
    /// The queue returned by the last `pick` and its slot: `cell_sent` and `deactivate` for it
    /// (the per-cell path) need no hash lookup.
    picked: Option<(QueueId, u32)>,
}

impl Ewma {
    /// A fresh scheduler with half-life `halflife` seconds (callers validate the range; see
    /// [`super::SchedulerKind::from_config`]).
    pub fn new(halflife: f64) -> Ewma {
        Ewma {
            halflife,
            inv_halflife: 1.0 / halflife,
            inv_halflife_ns: 1e-9 / halflife,
            t0: None,
            last: None,
            scale: 1.0,
            anchor: None,
            slots: Vec::new(),
            free: Vec::new(),
            index: QueueMap::default(),
            run: Run::default(),
            heap: Heap::default(),
            zero: Heap::default(),
            picked: None,
        }
    }

    /// The half-life, seconds.
    pub fn halflife(&self) -> f64 {
        self.halflife
    }

    /// Queues with state (active, or inactive with history). Bounded: inactive queues whose
    /// count decayed to zero are dropped at renormalisation.
    pub fn tracked_len(&self) -> usize {
        self.index.len()
    }

    /// `d` in half-lives, with multiplications only (`as_secs_f64` divides).
    #[inline(always)]
    fn halflives(&self, d: Duration) -> f64 {
        d.as_secs() as f64 * self.inv_halflife + f64::from(d.subsec_nanos()) * self.inv_halflife_ns
    }

    /// Bring V up to `now`, renormalising if it grew past 2^32.
    #[inline]
    fn advance(&mut self, now: Instant) {
        let (Some(t0), Some(last)) = (self.t0, self.last) else {
            self.t0 = Some(now);
            self.last = Some(now);
            self.scale = 1.0;
            self.anchor = Some((now, 0.0, 1.0));
            return;
        };
        if now <= last {
            // Same write event (cached time), or a stale `now`: V is current.
            return;
        }
        self.last = Some(now);
        // V at t0 is 1 by definition.
        let (at, ae, av) = self.anchor.unwrap_or((t0, 0.0, 1.0));
        let d = self.halflives(now.duration_since(at));
        if d < ANCHOR_SPAN {
            // V = V(anchor) · 2^d, with 2^d = e^x from its Taylor series: x < 6.8e-4, so the
            // terms left out are below 2e-18 relative. Multiplications only (no exp2() call, no
            // division) on the per-cell path, and exact to rounding because it never compounds
            // (always from the anchor).
            let x = d * std::f64::consts::LN_2;
            let p = 1.0 + x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0))));
            self.scale = av * p;
            if ae + d <= RENORM_EXP {
                return;
            }
        }
        let e = self.halflives(now.duration_since(t0));
        if e > RENORM_EXP {
            self.renormalise(e, now);
        } else {
            self.scale = e.exp2();
            self.anchor = Some((now, e, self.scale));
        }
    }

    /// Divide every stored count by V = 2^e, reset V to 1 and t0 to `now`. Counts that fall
    /// below the floor become zero; inactive queues left with no history are dropped.
    #[cold]
    fn renormalise(&mut self, e: f64, now: Instant) {
        // The run's keys are its queues' counts: bring the slots up to date first.
        let mut in_run = Vec::with_capacity(self.run.live_len());
        for i in 0..self.run.len {
            if let Some(&entry) = self.run.get(i).filter(|e| e.slot != NIL) {
                if let Some(s) = self.slots.get_mut(entry.slot as usize) {
                    s.count = entry.key;
                    s.pos = NO_POS;
                }
                in_run.push(entry);
            }
        }
        // 2^-e underflows to 0 for very long idle gaps: then every count is zero, as it should.
        let factor = (-e).exp2();
        for s in self.slots.iter_mut().filter(|s| s.live) {
            s.count *= factor;
            if s.count < FLOOR {
                s.count = 0.0;
            }
        }
        self.t0 = Some(now);
        self.scale = 1.0;
        self.anchor = Some((now, 0.0, 1.0));
        self.picked = None;
        // Multiplying by a positive factor keeps the run ascending, except that rounding may make
        // two neighbouring counts equal with their ids the wrong way round: such an entry (rare)
        // goes to the heap. The run is laid out again from its live entries in order (which
        // drops its tombstones); the heap's entries stay in the heap.
        let cap = self.run.cap().max(in_run.len());
        self.run = Run {
            buf: vec![JUNK; cap],
            ..Run::default()
        };
        let mut zero = self.zero.drain();
        let mut heap = Vec::new();
        for mut entry in in_run {
            let Some(slot) = self.slots.get_mut(entry.slot as usize) else {
                continue;
            };
            entry.key = slot.count;
            if entry.key <= 0.0 {
                zero.push(entry);
            } else if self.run.accepts(&entry) {
                let p = self.run.len;
                if let Some(b) = self.run.buf.get_mut(p) {
                    *b = entry;
                    self.run.len += 1;
                    slot.pos = p as u32;
                }
            } else {
                heap.push(entry);
            }
        }
        for mut entry in self.heap.drain() {
            entry.key = self.slots.get(entry.slot as usize).map_or(0.0, |s| s.count);
            if entry.key <= 0.0 {
                zero.push(entry);
            } else {
                heap.push(entry);
            }
        }
        self.heap.rebuild(heap);
        self.zero.rebuild(zero);
        // Inactive queues without history are the same as unknown ones: free them.
        let stale: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| {
                self.slots
                    .get(i as usize)
                    .is_some_and(|s| s.live && s.count == 0.0 && s.pos == NO_POS)
                    && !self.heap.contains(i)
                    && !self.zero.contains(i)
            })
            .collect();
        for i in stale {
            self.free_slot(i);
        }
    }

    /// Lay the run out again in a buffer of `cap` positions (at least the live entries), front
    /// at position 0, tombstones dropped, every live entry's slot updated. O(run).
    #[cold]
    fn relayout(&mut self, cap: usize) {
        let cap = cap.max(self.run.live_len());
        let mut buf = Vec::with_capacity(cap);
        for i in 0..self.run.len {
            let Some(&e) = self.run.get(i) else { break };
            if e.slot == NIL {
                continue;
            }
            if let Some(s) = self.slots.get_mut(e.slot as usize) {
                s.pos = buf.len() as u32;
            }
            buf.push(e);
        }
        let len = buf.len();
        buf.resize(cap, JUNK);
        self.run = Run {
            buf,
            head: 0,
            len,
            dead: 0,
            moves: 0,
        };
    }

    /// Append `e` to the run (the caller checked [`Run::accepts`]) at the free position after
    /// the back, growing the buffer if it is full.
    #[inline(always)]
    fn run_push(&mut self, e: Entry) {
        if self.run.len == self.run.cap() {
            self.relayout(Run::roomy(self.run.live_len() + 1));
        }
        let p = self.run.phys(self.run.len);
        let Some(b) = self.run.buf.get_mut(p) else {
            return;
        };
        *b = e;
        self.run.len += 1;
        self.run.moves += 1;
        if let Some(s) = self.slots.get_mut(e.slot as usize) {
            s.pos = p as u32;
        }
        // Moving entries costs a slot update each; once that has been paid for about two rounds,
        // shrink the buffer to fit so that rotations happen in place.
        if self.run.moves > 2 * self.run.cap() + COMPACT_SLACK && self.run.len < self.run.cap() {
            self.relayout(self.run.live_len());
        }
    }

    /// Put an active queue that just sent a cell (and is in no structure now) at the run's back
    /// if it goes after it, else in the heap.
    ///
    /// Only queues that sent enter the run, never activated ones: the queue that sends is
    /// normally the one with the lowest count, so its new count is that minimum plus V, and
    /// neither the minimum (counts only grow) nor V (time only advances) goes down. The run
    /// therefore keeps accepting the queues that send, whatever the spread of the counts. A
    /// queue activated with a count far above the others, if appended, would instead sit at the
    /// back and turn every later send away to the heap.
    #[inline(always)]
    fn requeue(&mut self, e: Entry) {
        if self.run.accepts(&e) {
            self.run_push(e);
        } else {
            if let Some(s) = self.slots.get_mut(e.slot as usize) {
                s.count = e.key;
                s.pos = NO_POS;
            }
            self.heap.push(e);
        }
    }

    /// Whether an activated queue may go straight to the run's back: it goes after the back,
    /// and by at most one cell's weight (V). That is a queue which drained right after it sent
    /// (it was the back, and trimmed as a tombstone) and refilled, the common case for bulk
    /// circuits whose queue runs dry between reads; the run takes it back as if it had never
    /// left, O(1) instead of a heap insert now and a heap removal at its next send. A count
    /// further above the back stays out, so that it does not turn every later send away from
    /// the run (see [`Ewma::requeue`]).
    #[inline(always)]
    fn rejoins_run(&self, e: &Entry) -> bool {
        let Some(back) = self.run.len.checked_sub(1).and_then(|i| self.run.get(i)) else {
            return false;
        };
        entry_before(back, e) && e.key <= back.key + self.scale
    }

    /// The run's front (the pick) sent a cell: its count is now `key`. The per-cell path.
    #[inline(always)]
    fn run_front_sent(&mut self, key: f64) {
        let Some(&front) = self.run.front() else {
            return;
        };
        let new = Entry { key, ..front };
        // Still before the next entry (a tombstone's key still bounds the live ones behind it):
        // the run stays sorted with the key updated in place.
        let stays = match self.run.get(1) {
            Some(next) => entry_before(&new, next),
            None => true,
        };
        if stays || (self.run.len == self.run.cap() && self.run.accepts(&new)) {
            let head = self.run.head;
            if let Some(e) = self.run.buf.get_mut(head) {
                e.key = key;
            }
            if !stays {
                // Full ring: the front becomes the back by advancing `head`; the entry stays
                // where it is, so its slot's position is still right.
                self.run.head = self.run.phys(1);
                self.run.trim();
            }
            return;
        }
        self.run.pop_front();
        self.requeue(new);
    }

    /// Take the queue in `slot`, whose live entry in the run is at position `pos`, out of the
    /// run (a tombstone), keeping its count in the slot; compact the run if tombstones
    /// outnumber live entries.
    fn run_remove(&mut self, slot: u32, pos: u32) {
        let Some(e) = self.run.buf.get_mut(pos as usize) else {
            return;
        };
        if e.slot != slot {
            return;
        }
        e.slot = NIL;
        let key = e.key;
        self.run.dead += 1;
        self.run.trim();
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.count = key;
            s.pos = NO_POS;
        }
        if self.run.needs_compaction() {
            self.relayout(Run::roomy(self.run.live_len()));
        }
    }

    /// Active queues whose count decayed below the floor become zero-count queues. The smallest
    /// positive counts are the run's front and the heap's root, so this stops at the first pair
    /// above the floor.
    #[inline]
    fn flush_decayed(&mut self) {
        let limit = FLOOR * self.scale;
        loop {
            let e = if self.run.front().is_some_and(|f| f.key < limit) {
                self.run.pop_front()
            } else if let Some(root) = self.heap.peek().filter(|r| r.key < limit) {
                let slot = root.slot;
                self.heap.remove(slot)
            } else {
                break;
            };
            let Some(mut e) = e else { break };
            e.key = 0.0;
            if let Some(s) = self.slots.get_mut(e.slot as usize) {
                s.count = 0.0;
                s.pos = NO_POS;
            }
            self.zero.push(e);
        }
    }

    /// The entry `pick` chooses among the positive counts: the smaller of the run's front and
    /// the heap's root.
    #[inline(always)]
    fn positive_min(&self) -> Option<&Entry> {
        match (self.run.front(), self.heap.peek()) {
            (Some(f), Some(r)) => Some(if entry_before(r, f) { r } else { f }),
            (f, r) => f.or(r),
        }
    }

    fn slot_of(&self, queue: QueueId) -> Option<u32> {
        if let Some((id, slot)) = self.picked {
            if id == queue {
                return Some(slot);
            }
        }
        self.index.get(&queue).copied()
    }

    fn slot_or_insert(&mut self, queue: QueueId) -> Option<u32> {
        if let Some(s) = self.slot_of(queue) {
            return Some(s);
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let s = u32::try_from(self.slots.len()).ok().filter(|&s| s != NIL)?;
                self.slots.push(Slot::fresh(queue));
                s
            }
        };
        let s = self.slots.get_mut(slot as usize)?;
        *s = Slot::fresh(queue);
        self.index.insert(queue, slot);
        Some(slot)
    }

    fn free_slot(&mut self, slot: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if !s.live {
            return;
        }
        s.live = false;
        s.pos = NO_POS;
        let id = s.id;
        self.index.remove(&id);
        self.free.push(slot);
        if self.picked.is_some_and(|(_, p)| p == slot) {
            self.picked = None;
        }
    }

    /// The stored count of a known queue: its run entry's key while it is in the run, else the
    /// slot's.
    fn count_of(&self, s: &Slot) -> f64 {
        if s.pos != NO_POS {
            if let Some(e) = self.run.buf.get(s.pos as usize) {
                return e.key;
            }
        }
        s.count
    }

    /// A stored (scaled) count as cells decayed to `now`.
    fn decayed(&self, count: f64, now: Instant) -> f64 {
        let e = match (self.t0, self.last) {
            (Some(t0), Some(last)) => now.max(last).duration_since(t0).as_secs_f64(),
            _ => 0.0,
        } * self.inv_halflife;
        let c = count * (-e).exp2();
        if c < FLOOR {
            0.0
        } else {
            c
        }
    }

    /// One cell of `queue` (in `slot`) was sent at the current V: [`CircuitScheduler::cell_sent`]
    /// after its clock and slot lookup, which [`CircuitScheduler::cells_sent`] does once per run.
    #[inline(always)]
    fn sent_one(&mut self, queue: QueueId, slot: u32) {
        // Per-cell path: the picked queue is the run's front; its slot is not touched.
        if let Some(f) = self.run.front().filter(|f| f.slot == slot) {
            let key = f.key + self.scale;
            self.run_front_sent(key);
            return;
        }
        let Some(s) = self.slots.get(slot as usize) else {
            return;
        };
        let was_in_run = s.pos != NO_POS;
        if was_in_run {
            // In the run but not its front (not the pick): out (its count goes back to the
            // slot), and back in where it fits.
            let pos = s.pos;
            self.run_remove(slot, pos);
        }
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        s.count += self.scale;
        let count = s.count;
        let e = Entry {
            key: count,
            id: queue,
            slot,
        };
        if self.heap.contains(slot) {
            if self.run.accepts(&e) {
                self.heap.remove(slot);
                self.run_push(e);
            } else {
                self.heap.set_key(slot, count);
            }
        } else if was_in_run || self.zero.remove(slot).is_some() {
            self.requeue(e);
        }
        // Otherwise inactive: the count is kept as history.
    }

    /// Current V (test helper).
    #[cfg(test)]
    fn scale(&self) -> f64 {
        self.scale
    }

    /// (entries in the run including tombstones, live run entries, heap entries) (test helper).
    #[cfg(test)]
    fn structure_lens(&self) -> (usize, usize, usize) {
        (self.run.len, self.run.live_len(), self.heap.len())
    }

    /// Check every internal invariant, panicking with a description if one is broken (test
    /// helper, called after each step of the property test).
    #[cfg(test)]
    fn check_invariants(&self) {
        let run = &self.run;
        assert!(run.len <= run.cap() && (run.cap() == 0 || run.head < run.cap()));
        let items: Vec<Entry> = (0..run.len).filter_map(|i| run.get(i).copied()).collect();
        assert_eq!(items.len(), run.len);
        for (a, b) in items.iter().zip(items.iter().skip(1)) {
            assert!(entry_before(a, b), "run not ascending: {a:?} then {b:?}");
        }
        assert_ne!(items.first().map(|e| e.slot), Some(NIL), "dead front");
        assert_ne!(items.last().map(|e| e.slot), Some(NIL), "dead back");
        let dead = items.iter().filter(|e| e.slot == NIL).count();
        assert_eq!(dead, run.dead, "tombstone count");
        assert!(
            run.len <= 2 * run.live_len() + COMPACT_SLACK + 1,
            "run of {} for {} live entries",
            run.len,
            run.live_len()
        );
        let mut in_run = 0;
        for (i, e) in items.iter().enumerate().filter(|(_, e)| e.slot != NIL) {
            let s = &self.slots[e.slot as usize];
            assert!(s.live && s.id == e.id, "run entry for a dead or other slot");
            assert_eq!(s.pos as usize, run.phys(i), "slot's position");
            assert!(e.key > 0.0, "zero count in the run");
            assert!(!self.heap.contains(e.slot) && !self.zero.contains(e.slot));
            in_run += 1;
        }
        assert_eq!(in_run, run.live_len());
        for e in &self.heap.items {
            let s = &self.slots[e.slot as usize];
            assert!(s.live && s.id == e.id && s.pos == NO_POS && s.count == e.key);
            assert!(!self.zero.contains(e.slot));
        }
        for e in &self.zero.items {
            let s = &self.slots[e.slot as usize];
            assert!(s.live && s.id == e.id && s.pos == NO_POS && s.count == 0.0);
        }
        for (i, s) in self.slots.iter().enumerate() {
            if s.live {
                assert_eq!(self.index.get(&s.id), Some(&(i as u32)));
            }
            if s.pos != NO_POS {
                assert!(s.live && run.buf[s.pos as usize].slot == i as u32);
            }
        }
    }
}

impl CircuitScheduler for Ewma {
    fn activate(&mut self, queue: QueueId, now: Instant) {
        self.advance(now);
        let Some(slot) = self.slot_or_insert(queue) else {
            return;
        };
        let Some(s) = self.slots.get(slot as usize) else {
            return;
        };
        if s.pos != NO_POS || self.heap.contains(slot) || self.zero.contains(slot) {
            return;
        }
        // An old count that decayed below the floor while inactive goes into the heap and is
        // flushed to zero by the next `pick`, like any other. (The heap, not the run: see
        // `requeue`.)
        let entry = Entry {
            key: s.count,
            id: queue,
            slot,
        };
        if entry.key <= 0.0 {
            self.zero.push(entry);
        } else if self.rejoins_run(&entry) {
            self.run_push(entry);
        } else {
            self.heap.push(entry);
        }
    }

    fn deactivate(&mut self, queue: QueueId) {
        let Some(slot) = self.slot_of(queue) else {
            return;
        };
        let pos = self.slots.get(slot as usize).map_or(NO_POS, |s| s.pos);
        if pos != NO_POS {
            self.run_remove(slot, pos);
            return; // history kept
        }
        if self.heap.remove(slot).is_some() {
            return; // history kept
        }
        if self.zero.remove(slot).is_some() {
            // No history to keep: the same as never seen.
            self.free_slot(slot);
        }
    }

    #[inline]
    fn pick(&mut self, now: Instant) -> Option<QueueId> {
        self.advance(now);
        self.flush_decayed();
        // Zero counts come first; among them the smallest id.
        let e = match self.zero.peek() {
            Some(z) => z,
            None => self.positive_min()?,
        };
        let picked = (e.id, e.slot);
        self.picked = Some(picked);
        Some(picked.0)
    }

    /// The pick, and how many cells in a row it stays the pick: while its count plus one
    /// cell's weight per cell sent stays before every other active queue, which `pick` (the
    /// minimum of all of them) decides one cell at a time after the same additions. The others'
    /// minimum: for the run's front, the run's second entry (a tombstone's key bounds the live
    /// ones behind it) and the heap's root; for the heap's root, the run's front and the heap's
    /// second. A zero-count pick, or any pick while zero-count queues wait, gets a run of 1.
    #[inline]
    fn pick_run(&mut self, now: Instant, limit: usize) -> Option<(QueueId, usize)> {
        let q = self.pick(now)?;
        let limit = limit.max(1);
        if limit == 1 || !self.zero.items.is_empty() {
            return Some((q, 1));
        }
        let first = |a: Option<&Entry>, b: Option<&Entry>| match (a, b) {
            (Some(a), Some(b)) => Some(if entry_before(b, a) { *b } else { *a }),
            (a, b) => a.or(b).copied(),
        };
        let (front, rival) = if let Some(&f) = self.run.front().filter(|f| f.id == q) {
            (f, first(self.run.get(1), self.heap.peek()))
        } else if let Some(&r) = self.heap.peek().filter(|r| r.id == q) {
            (r, first(self.run.front(), self.heap.second()))
        } else {
            return Some((q, 1));
        };
        let Some(rival) = rival else {
            // Alone: picked again whatever its count.
            return Some((q, limit));
        };
        let mut e = front;
        let mut n = 1;
        while n < limit {
            e.key += self.scale;
            if !entry_before(&e, &rival) {
                break;
            }
            n += 1;
        }
        Some((q, n))
    }

    #[inline]
    fn cells_sent(&mut self, queue: QueueId, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        self.advance(now);
        let Some(slot) = self.slot_or_insert(queue) else {
            return;
        };
        let mut left = n;
        // The run's front that stays before the entry behind it: `sent_one` would add V to its
        // key in place, cell after cell; the same additions here, with the entry behind it
        // read once (only the front's key changes meanwhile).
        if let Some(&front) = self.run.front().filter(|f| f.slot == slot) {
            let next = self.run.get(1).copied();
            let mut e = front;
            while left > 0 {
                let new = Entry {
                    key: e.key + self.scale,
                    ..e
                };
                if next.is_some_and(|b| !entry_before(&new, &b)) {
                    break;
                }
                e = new;
                left -= 1;
            }
            if let Some(f) = self.run.buf.get_mut(self.run.head) {
                f.key = e.key;
            }
        }
        for _ in 0..left {
            self.sent_one(queue, slot);
        }
    }

    #[inline]
    fn cell_sent(&mut self, queue: QueueId, now: Instant) {
        self.advance(now);
        let Some(slot) = self.slot_or_insert(queue) else {
            return;
        };
        self.sent_one(queue, slot);
    }

    fn forget(&mut self, queue: QueueId) {
        let Some(slot) = self.slot_of(queue) else {
            return;
        };
        let pos = self.slots.get(slot as usize).map_or(NO_POS, |s| s.pos);
        if pos != NO_POS {
            self.run_remove(slot, pos);
        }
        self.heap.remove(slot);
        self.zero.remove(slot);
        self.free_slot(slot);
    }

    fn ewma_count(&self, queue: QueueId, now: Instant) -> Option<f64> {
        let count = self
            .index
            .get(&queue)
            .and_then(|&s| self.slots.get(s as usize))
            .map_or(0.0, |s| self.count_of(s));
        Some(self.decayed(count, now))
    }

    fn head_priority(&self, now: Instant) -> Option<f64> {
        if !self.zero.items.is_empty() {
            return Some(0.0);
        }
        let e = self.positive_min()?;
        Some(self.decayed(e.key, now))
    }

    fn name(&self) -> &'static str {
        "ewma"
    }

    fn active_len(&self) -> usize {
        self.run.live_len() + self.heap.len() + self.zero.len()
    }
}
