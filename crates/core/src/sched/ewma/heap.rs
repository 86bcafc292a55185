//! The indexed min-heap the fast EWMA scheduler keeps out-of-order queues in.

use super::QueueId;

/// "Not in this heap" marker.
pub(super) const NIL: u32 = u32::MAX;

/// A heap element: the queue's stored count, its id (tie-break) and its slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) key: f64,
    pub(super) id: QueueId,
    pub(super) slot: u32,
}

/// Exact heap order: (stored count, id). A strict total order (counts are never NaN), which a
/// heap needs.
#[inline(always)]
pub(super) fn entry_before(a: &Entry, b: &Entry) -> bool {
    a.key < b.key || (a.key == b.key && a.id < b.id)
}

/// Children per heap node. A 4-ary heap is half as deep as a binary one; the four children of a
/// node are adjacent (96 bytes), so each level costs about one cache miss, which is what
/// dominates once the cells moving through the relay have evicted the heap from cache.
pub(super) const ARITY: usize = 4;

/// `ARITY`-ary min-heap of entries with a position map (slot → index), so an arbitrary queue can
/// be removed or re-keyed in O(log n). Keys live in the entries, so sifting reads no other memory.
#[derive(Default)]
pub(super) struct Heap {
    pub(super) items: Vec<Entry>,
    /// `pos[slot]` is the slot's index in `items`, or `NIL`.
    pos: Vec<u32>,
}

impl Heap {
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    pub(super) fn peek(&self) -> Option<&Entry> {
        self.items.first()
    }

    fn position(&self, slot: u32) -> Option<usize> {
        match self.pos.get(slot as usize) {
            Some(&p) if p != NIL => Some(p as usize),
            _ => None,
        }
    }

    pub(super) fn contains(&self, slot: u32) -> bool {
        self.position(slot).is_some()
    }

    #[inline(always)]
    fn place(&mut self, i: usize, e: Entry) {
        self.items[i] = e;
        self.pos[e.slot as usize] = i as u32;
    }

    pub(super) fn push(&mut self, e: Entry) {
        let s = e.slot as usize;
        if s >= self.pos.len() {
            self.pos.resize(s + 1, NIL);
        }
        let i = self.items.len();
        self.items.push(e);
        self.pos[s] = i as u32;
        self.sift_up(i);
    }

    /// The entry that would be the root if the root were removed: the first of its children.
    pub(super) fn second(&self) -> Option<&Entry> {
        self.min_child(0).and_then(|i| self.items.get(i))
    }

    /// Index of the first child of `i` that goes first, if `i` has children.
    #[inline(always)]
    fn min_child(&self, i: usize) -> Option<usize> {
        let first = ARITY * i + 1;
        let children = self.items.get(first..)?;
        let mut best = 0;
        for (k, c) in children.iter().enumerate().take(ARITY).skip(1) {
            if entry_before(c, &children[best]) {
                best = k;
            }
        }
        (!children.is_empty()).then_some(first + best)
    }

    /// Move the entry at `i` up to its place; returns its final index.
    fn sift_up(&mut self, i: usize) -> usize {
        let e = self.items[i];
        self.fill_hole_upward(i, 0, e)
    }

    /// Put `e` into the hole at `i`, first moving the hole up past every ancestor (down to
    /// index `top`) that `e` goes before; returns where `e` landed.
    #[inline]
    fn fill_hole_upward(&mut self, mut i: usize, top: usize, e: Entry) -> usize {
        while i > top {
            let parent = (i - 1) / ARITY;
            let p = self.items[parent];
            if !entry_before(&e, &p) {
                break;
            }
            self.place(i, p);
            i = parent;
        }
        self.place(i, e);
        i
    }

    /// Move the entry at `i` down to its place; returns its final index.
    fn sift_down(&mut self, mut i: usize) -> usize {
        let e = self.items[i];
        while let Some(child) = self.min_child(i) {
            let c = self.items[child];
            if !entry_before(&c, &e) {
                break;
            }
            self.place(i, c);
            i = child;
        }
        self.place(i, e);
        i
    }

    /// Restore the heap order around index `i` after its key changed either way.
    fn fix(&mut self, i: usize) {
        if self.sift_up(i) == i {
            self.sift_down(i);
        }
    }

    /// Remove the slot's entry, if present.
    pub(super) fn remove(&mut self, slot: u32) -> Option<Entry> {
        let i = self.position(slot)?;
        let removed = self.items[i];
        self.pos[slot as usize] = NIL;
        let last = self.items.pop()?;
        if i < self.items.len() {
            self.place(i, last);
            self.fix(i);
        }
        Some(removed)
    }

    /// Set the slot's key (if present) and restore the order.
    #[inline]
    pub(super) fn set_key(&mut self, slot: u32, key: f64) {
        if let Some(i) = self.position(slot) {
            let old = self.items[i].key;
            self.items[i].key = key;
            if key >= old {
                self.key_increased(i);
            } else {
                self.sift_up(i);
            }
        }
    }

    /// The key at `i` grew. Bottom-up sift (Floyd): move the hole down along the first-going
    /// children to a leaf, without comparing against the entry, then sift the entry back up.
    /// The queue that just sent a cell usually belongs near the bottom, so this saves a
    /// comparison per level over the textbook sift-down.
    #[inline]
    fn key_increased(&mut self, top: usize) {
        let e = self.items[top];
        let mut i = top;
        while let Some(child) = self.min_child(i) {
            let c = self.items[child];
            self.place(i, c);
            i = child;
        }
        self.fill_hole_upward(i, top, e);
    }

    /// Take every entry out, leaving the heap empty (position map reset).
    pub(super) fn drain(&mut self) -> Vec<Entry> {
        for e in &self.items {
            self.pos[e.slot as usize] = NIL;
        }
        std::mem::take(&mut self.items)
    }

    /// Replace the contents with `entries` in O(n) (Floyd's heapify).
    pub(super) fn rebuild(&mut self, entries: Vec<Entry>) {
        self.drain();
        self.items = entries;
        for i in 0..self.items.len() {
            let s = self.items[i].slot as usize;
            if s >= self.pos.len() {
                self.pos.resize(s + 1, NIL);
            }
            self.pos[s] = i as u32;
        }
        for i in (0..self.items.len() / ARITY + 1).rev() {
            if i < self.items.len() {
                self.sift_down(i);
            }
        }
    }
}
