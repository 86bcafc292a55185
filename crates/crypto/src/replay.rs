//! Replay detection for INTRODUCE2: a bounded set of digests of the introductions a service
//! has accepted on one introduction point.
//!
//! An introduction point sees INTRODUCE1 in the clear and could replay it (or let an observer
//! replay it) to make the service build circuits to a rendezvous point again and again. The
//! hs-ntor MAC covers the whole cell, so a replay is only possible byte for byte; a digest of
//! `ENCRYPTED` (which starts with the client's fresh ephemeral key X) identifies it. rend-spec
//! asks the service to keep the cache as long as it accepts cells under the same encryption
//! key. Chive bounds memory instead: the cache holds at most `capacity` digests and forgets the
//! oldest first, and [`IntroReplayCache::should_rotate`] tells the owner when it has admitted
//! `capacity` introductions — from then on an evicted one could come back, so the service
//! replaces the intro point's keys (a replay under the old key then fails the MAC).

use std::collections::{HashSet, VecDeque};

use sha3::{Digest, Sha3_256};

/// Domain separation for the digest, so it equals no other SHA3-256 in the protocol.
const DIGEST_PREFIX: &[u8] = b"chive intro replay";

/// Whether an INTRODUCE2 was new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Not seen before; now remembered.
    Fresh,
    /// Seen before: drop it and count it.
    Replayed,
}

/// A bounded replay cache keyed by SHA3-256 of INTRODUCE2's `ENCRYPTED` part.
#[derive(Debug)]
pub struct IntroReplayCache {
    seen: HashSet<[u8; 32]>,
    /// Insertion order, oldest first, for eviction.
    order: VecDeque<[u8; 32]>,
    capacity: usize,
    admitted: u64,
    replays: u64,
}

impl IntroReplayCache {
    /// A cache remembering up to `capacity` introductions (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        IntroReplayCache {
            seen: HashSet::with_capacity(capacity.min(1 << 16)),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
            admitted: 0,
            replays: 0,
        }
    }

    /// The digest the cache keys on.
    pub fn digest(encrypted: &[u8]) -> [u8; 32] {
        Sha3_256::new()
            .chain_update(DIGEST_PREFIX)
            .chain_update(encrypted)
            .finalize()
            .into()
    }

    /// Check `encrypted` (INTRODUCE2's `ENCRYPTED`, after its MAC verified, so that forged
    /// cells cannot fill the cache) and remember it if new.
    pub fn check_and_insert(&mut self, encrypted: &[u8]) -> Replay {
        let d = Self::digest(encrypted);
        if self.seen.contains(&d) {
            self.replays += 1;
            return Replay::Replayed;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(d);
        self.order.push_back(d);
        self.admitted += 1;
        Replay::Fresh
    }

    /// Digests held now (at most the capacity).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether nothing has been admitted.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Introductions admitted since the cache was made.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }

    /// Replays detected since the cache was made.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// True once as many introductions were admitted as the cache holds: older ones may have
    /// been forgotten, so the intro point's keys should be replaced.
    pub fn should_rotate(&self) -> bool {
        self.admitted >= self.capacity as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_replays() {
        let mut c = IntroReplayCache::new(8);
        assert!(c.is_empty());
        assert_eq!(c.check_and_insert(b"intro one"), Replay::Fresh);
        assert_eq!(c.check_and_insert(b"intro two"), Replay::Fresh);
        assert_eq!(c.check_and_insert(b"intro one"), Replay::Replayed);
        assert_eq!(c.check_and_insert(b"intro one"), Replay::Replayed);
        assert_eq!(c.len(), 2);
        assert_eq!(c.admitted(), 2);
        assert_eq!(c.replays(), 2);
        assert!(!c.should_rotate());
    }

    #[test]
    fn bounded_and_evicts_oldest_first() {
        let mut c = IntroReplayCache::new(3);
        for i in 0u8..3 {
            assert_eq!(c.check_and_insert(&[i]), Replay::Fresh);
        }
        assert!(c.should_rotate());
        // A fourth pushes out the first; the others are still remembered.
        assert_eq!(c.check_and_insert(&[3]), Replay::Fresh);
        assert_eq!(c.len(), 3);
        assert_eq!(c.check_and_insert(&[1]), Replay::Replayed);
        assert_eq!(c.check_and_insert(&[3]), Replay::Replayed);
        assert_eq!(
            c.check_and_insert(&[0]),
            Replay::Fresh,
            "evicted, so forgotten"
        );
        // Many distinct introductions never grow it past its capacity.
        for i in 0u32..1000 {
            c.check_and_insert(&i.to_be_bytes());
        }
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn zero_capacity_means_one() {
        let mut c = IntroReplayCache::new(0);
        assert_eq!(c.check_and_insert(b"a"), Replay::Fresh);
        assert_eq!(c.check_and_insert(b"a"), Replay::Replayed);
    }
}
