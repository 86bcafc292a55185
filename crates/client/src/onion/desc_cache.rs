//! The client's cache of verified onion-service descriptors (Tor's client-side `hs_cache`,
//! simplified): a descriptor fetched and verified once serves every later connection to its
//! service until its `valid_until`, so a new rendezvous (another SOCKS isolation, or after the
//! joined circuit closed) skips the round trip to the directory.
//!
//! An entry goes when it expires (checked on lookup), when a connection through one of its
//! introduction points fails (the service may have moved them: the next request fetches
//! again; [`crate::onion::OnionConnector`] drops it), or when the cache is full and a new
//! service arrives (the entry closest to expiry makes room). A newer descriptor of the same
//! service replaces an older one; an older one never replaces a newer. Bounded by `max`
//! entries; no IO, time is passed in (UNIX seconds, as descriptors carry it).

use std::collections::HashMap;

use chive_crypto::OnionAddress;
use chive_dir::OnionDescriptor;

/// Services a client keeps descriptors for, by default.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 256;

/// Verified descriptors by service. See the module docs.
pub struct DescriptorCache {
    entries: HashMap<OnionAddress, OnionDescriptor>,
    max: usize,
}

impl DescriptorCache {
    /// An empty cache of at most `max` descriptors (at least one).
    pub fn new(max: usize) -> Self {
        DescriptorCache {
            entries: HashMap::new(),
            max: max.max(1),
        }
    }

    /// The descriptor of `address` if one is held and still valid at `now` (UNIX seconds);
    /// an expired one is dropped.
    pub fn get(&mut self, address: &OnionAddress, now: u64) -> Option<OnionDescriptor> {
        let d = self.entries.get(address)?;
        if now < d.valid_until {
            return Some(d.clone());
        }
        self.entries.remove(address);
        None
    }

    /// Keep `desc` (already verified) until it expires. Ignored when it is already expired at
    /// `now` or older than the one held. Returns whether it was stored.
    pub fn insert(&mut self, desc: OnionDescriptor, now: u64) -> bool {
        if now >= desc.valid_until {
            return false;
        }
        if let Some(old) = self.entries.get(&desc.address) {
            if old.revision > desc.revision {
                return false;
            }
        } else if self.entries.len() >= self.max {
            self.entries.retain(|_, d| now < d.valid_until);
            if self.entries.len() >= self.max {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, d)| d.valid_until)
                    .map(|(a, _)| *a);
                if let Some(a) = soonest {
                    self.entries.remove(&a);
                }
            }
        }
        self.entries.insert(desc.address, desc);
        true
    }

    /// Forget the descriptor of `address` (its introduction failed). Whether one was held.
    pub fn remove(&mut self, address: &OnionAddress) -> bool {
        self.entries.remove(address).is_some()
    }

    /// Descriptors held (expired ones not yet looked up included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no descriptor is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_crypto::IdentityKeypair;

    fn desc(seed: u8, revision: u64, valid_until: u64) -> OnionDescriptor {
        let id = IdentityKeypair::from_secret_bytes(&[seed; 32]);
        OnionDescriptor {
            address: OnionAddress::from_key(id.public()),
            revision,
            valid_after: 0,
            valid_until,
            intro_points: vec![],
        }
    }

    #[test]
    fn a_descriptor_serves_until_it_expires() {
        let mut c = DescriptorCache::new(4);
        let d = desc(1, 1, 100);
        assert!(c.insert(d.clone(), 10));
        assert_eq!(c.get(&d.address, 99).map(|x| x.revision), Some(1));
        assert!(c.get(&d.address, 100).is_none(), "expired at valid_until");
        assert!(c.is_empty(), "the expired entry was dropped");
        assert!(!c.insert(d, 100), "an expired descriptor is not kept");
    }

    #[test]
    fn newer_revisions_replace_older_and_never_the_reverse() {
        let mut c = DescriptorCache::new(4);
        let a = desc(1, 5, 100);
        assert!(c.insert(a.clone(), 0));
        assert!(!c.insert(desc(1, 4, 200), 0));
        assert_eq!(c.get(&a.address, 1).unwrap().revision, 5);
        assert!(c.insert(desc(1, 6, 200), 0));
        assert_eq!(c.get(&a.address, 1).unwrap().revision, 6);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn removed_on_request_and_bounded_by_evicting_the_soonest_to_expire() {
        let mut c = DescriptorCache::new(2);
        let (a, b, d) = (desc(1, 1, 300), desc(2, 1, 100), desc(3, 1, 200));
        c.insert(a.clone(), 0);
        c.insert(b.clone(), 0);
        c.insert(d.clone(), 0);
        assert_eq!(c.len(), 2);
        assert!(c.get(&b.address, 1).is_none(), "b expired soonest");
        assert!(c.get(&a.address, 1).is_some() && c.get(&d.address, 1).is_some());
        assert!(c.remove(&a.address));
        assert!(!c.remove(&a.address));
        assert!(c.get(&a.address, 1).is_none());
    }
}
