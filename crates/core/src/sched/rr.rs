//! Round-robin: the papers' "unprioritised" baseline.

use std::time::Instant;

use super::{CircuitScheduler, QueueId, QueueMap};

/// "No slot" marker in the intrusive list.
const NIL: u32 = u32::MAX;

/// One active queue, a node of the circular rotation list.
#[derive(Clone, Copy)]
struct Node {
    id: QueueId,
    prev: u32,
    next: u32,
}

/// Round-robin: each active queue sends one cell in turn.
///
/// Active queues form a circular doubly-linked list (in a slot vector, so no allocation per
/// activation once warm); `head` is the queue whose turn it is. `cell_sent` on the head just
/// advances `head`, and deactivating a queue unlinks it, both O(1). The hash map from
/// [`QueueId`] to slot is only consulted on activation and on deactivation of a queue other than
/// the one that was just served (which is cached), so the per-cell path does no hashing.
/// Round-robin keeps no history: a deactivated queue's slot is freed at once.
pub struct RoundRobin {
    nodes: Vec<Node>,
    free: Vec<u32>,
    index: QueueMap<u32>,
    head: u32,
    /// The queue served last and its slot: the core deactivates it right after `cell_sent`
    /// when it became empty, so this saves a hash lookup per drained queue.
    last_sent: Option<(QueueId, u32)>,
}

impl Default for RoundRobin {
    fn default() -> Self {
        RoundRobin {
            nodes: Vec::new(),
            free: Vec::new(),
            index: QueueMap::default(),
            head: NIL,
            last_sent: None,
        }
    }
}

impl RoundRobin {
    /// Slot of an active queue, if any.
    fn slot_of(&self, queue: QueueId) -> Option<u32> {
        if let Some((id, slot)) = self.last_sent {
            if id == queue {
                return Some(slot);
            }
        }
        self.index.get(&queue).copied()
    }
}

impl CircuitScheduler for RoundRobin {
    fn activate(&mut self, queue: QueueId, _now: Instant) {
        if self.index.contains_key(&queue) {
            return;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                // More than u32::MAX - 1 simultaneously active queues cannot happen (the core
                // bounds circuits per channel far below), but never wrap into NIL.
                let Ok(s) = u32::try_from(self.nodes.len()) else {
                    return;
                };
                if s == NIL {
                    return;
                }
                self.nodes.push(Node {
                    id: queue,
                    prev: s,
                    next: s,
                });
                s
            }
        };
        self.index.insert(queue, slot);
        // Insert just before `head`, i.e. at the end of the current rotation.
        let node = if self.head == NIL {
            self.head = slot;
            Node {
                id: queue,
                prev: slot,
                next: slot,
            }
        } else {
            let head = self.head;
            let tail = self.nodes[head as usize].prev;
            self.nodes[tail as usize].next = slot;
            self.nodes[head as usize].prev = slot;
            Node {
                id: queue,
                prev: tail,
                next: head,
            }
        };
        self.nodes[slot as usize] = node;
    }

    fn deactivate(&mut self, queue: QueueId) {
        let Some(slot) = self.slot_of(queue) else {
            return;
        };
        self.index.remove(&queue);
        if self.last_sent.is_some_and(|(id, _)| id == queue) {
            self.last_sent = None;
        }
        let Node { prev, next, .. } = self.nodes[slot as usize];
        if next == slot {
            // It was the only active queue.
            self.head = NIL;
        } else {
            self.nodes[prev as usize].next = next;
            self.nodes[next as usize].prev = prev;
            if self.head == slot {
                self.head = next;
            }
        }
        self.free.push(slot);
    }

    fn pick(&mut self, _now: Instant) -> Option<QueueId> {
        self.nodes.get(self.head as usize).map(|n| n.id)
    }

    fn cell_sent(&mut self, queue: QueueId, _now: Instant) {
        // Only the queue whose turn it is advances the rotation; a stray call is ignored.
        if let Some(node) = self.nodes.get(self.head as usize) {
            if node.id == queue {
                self.last_sent = Some((queue, self.head));
                self.head = node.next;
            }
        }
    }

    /// A queue alone in the rotation is picked again after every cell: a run of `limit`.
    fn pick_run(&mut self, _now: Instant, limit: usize) -> Option<(QueueId, usize)> {
        let node = self.nodes.get(self.head as usize)?;
        let n = if node.next == self.head {
            limit.max(1)
        } else {
            1
        };
        Some((node.id, n))
    }

    /// `cell_sent` moves the rotation on from `queue` only while it is the head: after the first
    /// call the head is the next queue (the calls after it are stray, ignored) or, alone in the
    /// rotation, `queue` again (where another call would leave it). One call is `n` calls.
    fn cells_sent(&mut self, queue: QueueId, n: usize, now: Instant) {
        if n > 0 {
            self.cell_sent(queue, now);
        }
    }

    fn forget(&mut self, queue: QueueId) {
        // Round-robin has no history; forgetting is just leaving the rotation.
        self.deactivate(queue);
    }

    fn name(&self) -> &'static str {
        "rr"
    }

    fn active_len(&self) -> usize {
        self.index.len()
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

    #[test]
    fn reactivated_queue_joins_end_of_rotation_once() {
        let now = Instant::now();
        let mut rr = RoundRobin::default();
        for i in 1..=3 {
            rr.activate(QueueId(i), now);
        }
        // Serve 1, it drains (deactivate right after cell_sent, as the core does), refills.
        let q = rr.pick(now).unwrap();
        assert_eq!(q, QueueId(1));
        rr.cell_sent(q, now);
        rr.deactivate(q);
        rr.activate(q, now);
        rr.activate(q, now); // duplicate activation is a no-op
        assert_eq!(rr.active_len(), 3);
        let mut seen = Vec::new();
        for _ in 0..6 {
            let q = rr.pick(now).unwrap();
            seen.push(q.0);
            rr.cell_sent(q, now);
        }
        assert_eq!(seen, vec![2, 3, 1, 2, 3, 1]);
        // Deactivating the queue whose turn it is passes the turn on.
        assert_eq!(rr.pick(now), Some(QueueId(2)));
        rr.deactivate(QueueId(2));
        assert_eq!(rr.pick(now), Some(QueueId(3)));
        // Unknown queues and stray cell_sent calls are ignored.
        rr.deactivate(QueueId(99));
        rr.cell_sent(QueueId(1), now);
        assert_eq!(rr.pick(now), Some(QueueId(3)));
        rr.forget(QueueId(3));
        rr.forget(QueueId(1));
        assert_eq!(rr.pick(now), None);
        // Slots are reused, not leaked.
        rr.activate(QueueId(5), now);
        assert_eq!(rr.pick(now), Some(QueueId(5)));
        assert!(rr.nodes.len() <= 3);
    }
}
