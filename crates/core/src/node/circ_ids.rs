//! A channel's circuit ids: the peer-chosen id → circuit map, with a one-entry cache of the
//! last id looked up on the per-cell path.
//!
//! The map is keyed by ids the peer chooses, so it keeps std's seeded SipHash (HashDoS, see
//! `idmap.rs`). A relayed cell looks its circuit up once ([`Core::lookup`](super::Core)), and
//! consecutive cells on a channel mostly belong to the same circuit (a read batch of a busy
//! circuit is up to 128 of its cells): the cache answers those without hashing. Any change
//! to the map empties the cache, so it never answers for an id the map no longer holds or
//! maps elsewhere.

use std::cell::Cell;
use std::collections::hash_map::{HashMap, Iter};

use chive_cell::CircId;

use crate::CircKey;

/// `CircId` → `CircKey` for one channel (see the module docs).
#[derive(Default)]
pub(super) struct CircIds {
    map: HashMap<CircId, CircKey>,
    /// The last id [`CircIds::lookup`] found, and its circuit.
    last: Cell<Option<(CircId, CircKey)>>,
}

impl CircIds {
    /// The circuit `id` names, through the cache (the per-cell path).
    pub(super) fn lookup(&self, id: CircId) -> Option<CircKey> {
        if let Some((last, key)) = self.last.get() {
            if last == id {
                return Some(key);
            }
        }
        let key = self.map.get(&id).copied();
        if let Some(key) = key {
            self.last.set(Some((id, key)));
        }
        key
    }

    pub(super) fn get(&self, id: &CircId) -> Option<&CircKey> {
        self.map.get(id)
    }

    pub(super) fn contains_key(&self, id: &CircId) -> bool {
        self.map.contains_key(id)
    }

    pub(super) fn insert(&mut self, id: CircId, key: CircKey) -> Option<CircKey> {
        self.last.set(None);
        self.map.insert(id, key)
    }

    pub(super) fn remove(&mut self, id: &CircId) -> Option<CircKey> {
        self.last.set(None);
        self.map.remove(id)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(super) fn iter(&self) -> Iter<'_, CircId, CircKey> {
        self.map.iter()
    }
}

impl<'a> IntoIterator for &'a CircIds {
    type Item = (&'a CircId, &'a CircKey);
    type IntoIter = Iter<'a, CircId, CircKey>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_outlives_a_change_to_the_map() {
        let mut ids = CircIds::default();
        assert_eq!(ids.lookup(7), None);
        ids.insert(7, CircKey(1));
        ids.insert(9, CircKey(2));
        assert_eq!(ids.lookup(7), Some(CircKey(1)));
        assert_eq!(ids.lookup(7), Some(CircKey(1)));
        // Removed: the cached answer goes with it.
        ids.remove(&7);
        assert_eq!(ids.lookup(7), None);
        assert_eq!(ids.lookup(9), Some(CircKey(2)));
        // Re-mapped (a switch moves an id to a new circuit): the new circuit is found.
        ids.insert(9, CircKey(3));
        assert_eq!(ids.lookup(9), Some(CircKey(3)));
        ids.insert(7, CircKey(4));
        assert_eq!(ids.lookup(7), Some(CircKey(4)));
        assert_eq!(ids.lookup(9), Some(CircKey(3)));
        assert_eq!(ids.len(), 2);
        assert_eq!(ids.iter().count(), 2);
    }

    #[test]
    fn lookups_agree_with_the_map_under_random_changes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        let mut ids = CircIds::default();
        let mut model: HashMap<CircId, CircKey> = HashMap::new();
        for step in 0..20_000u64 {
            let id: CircId = rng.gen_range(0..8);
            match rng.gen_range(0..4) {
                0 => {
                    ids.insert(id, CircKey(step));
                    model.insert(id, CircKey(step));
                }
                1 => {
                    assert_eq!(ids.remove(&id), model.remove(&id));
                }
                _ => assert_eq!(ids.lookup(id), model.get(&id).copied(), "step {step}"),
            }
        }
    }
}
