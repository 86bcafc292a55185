//! Hash maps keyed by ids the core allocates itself (channels, circuits, streams, scheduler
//! queues), with a cheap hasher.
//!
//! These ids are never chosen by a peer, so hash flooding is not a concern and SipHash's cost
//! is not worth paying on the per-cell path (a forwarded cell does several lookups; SipHash was
//! 10–15% of a middle relay's per-cell time in `benches/forward.rs`). Maps keyed by what a peer
//! chooses (circuit ids on a link, stream ids on a circuit) keep std's seeded SipHash.
//! `LocalMap` is public for the driver's maps keyed by the same ids (`ChannelId`,
//! `StreamHandle`).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// splitmix64's finaliser over the id's `u64`: every input bit affects every output bit, so
/// sequential ids spread over the table.
#[derive(Default, Clone, Copy)]
pub struct LocalIdHasher(u64);

impl Hasher for LocalIdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached if a key type hashes raw bytes; fold them in (FNV-1a style).
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(5) ^ n;
    }
}

/// A map keyed by a core-allocated id.
pub type LocalMap<K, V> = HashMap<K, V, BuildHasherDefault<LocalIdHasher>>;
/// A set of core-allocated ids.
pub(crate) type LocalSet<K> = HashSet<K, BuildHasherDefault<LocalIdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChannelId, CircKey};
    use std::hash::{BuildHasher, Hash};

    fn hash_of<T: Hash>(x: T) -> u64 {
        BuildHasherDefault::<LocalIdHasher>::default().hash_one(x)
    }

    #[test]
    fn sequential_ids_spread_and_maps_work() {
        // Consecutive ids differ in many bits after hashing (not just the low ones), so a
        // table indexed by the low bits sees them spread.
        let low: HashSet<u64> = (0..1024u64).map(|i| hash_of(CircKey(i)) & 1023).collect();
        assert!(low.len() > 600, "only {} of 1024 buckets used", low.len());
        let mut m: LocalMap<ChannelId, u32> = LocalMap::default();
        for i in 0..10_000u64 {
            m.insert(ChannelId(i), i as u32);
        }
        assert_eq!(m.len(), 10_000);
        assert!((0..10_000u64).all(|i| m.get(&ChannelId(i)) == Some(&(i as u32))));
        let mut s: LocalSet<CircKey> = LocalSet::default();
        assert!(s.insert(CircKey(7)) && !s.insert(CircKey(7)));
    }
}
