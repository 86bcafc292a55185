//! The pool's policy against a core with no network (its circuits never build unless the test
//! says so): when it fills, what it takes for a point, backoff and expiry. Extending a real
//! circuit: `chive-core`'s `tests/it/onion.rs` (`a_stream_through_cannibalised_circuits_…`).

use super::*;
use crate::onion::test_net::consensus;
use crate::onion::{LONG_ONION_HOPS, SHORT_ONION_HOPS};
use chive_core::CoreConfig;
use rand::rngs::StdRng;
use rand::SeedableRng;

struct T {
    core: Core,
    cons: std::sync::Arc<Consensus>,
    guard: Option<IdentityKey>,
    rng: StdRng,
    now: Instant,
}

impl T {
    fn new(relays: u8) -> T {
        T {
            core: Core::new(CoreConfig::default(), [1; 32]),
            cons: consensus(relays),
            guard: None,
            rng: StdRng::seed_from_u64(9),
            now: Instant::now(),
        }
    }

    fn fill(&mut self, pool: &mut InternalPool, after: Duration) {
        let paths = OnionPaths::default();
        pool.fill(
            &mut self.core,
            &self.cons,
            &paths,
            &mut self.guard,
            &mut self.rng,
            self.now + after,
        );
    }
}

fn lengths(pool: &InternalPool) -> Vec<usize> {
    let mut v: Vec<usize> = pool.circs.values().map(|e| e.relays.len()).collect();
    v.sort();
    v
}

#[test]
fn a_client_pool_fills_only_while_onion_connections_are_predicted() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(2, &[SHORT_ONION_HOPS, LONG_ONION_HOPS], false);
    t.fill(&mut pool, Duration::ZERO);
    assert!(pool.is_empty(), "nothing before the first onion connection");
    pool.note_used(t.now);
    t.fill(&mut pool, Duration::ZERO);
    // Two of each kind, one hop short of its path: 2 + 1 and 3 + 1 relays.
    assert_eq!(lengths(&pool), vec![2, 2, 3, 3]);
    assert_eq!(pool.counters.launched, 4);
    // Full: nothing more; every circuit starts at the owner's guard, chosen by the first.
    t.fill(&mut pool, Duration::from_secs(1));
    assert_eq!(pool.counters.launched, 4);
    let guard = t.guard.expect("the pool chose the guard");
    assert!(pool.circs.values().all(|e| e.relays[0] == guard));
    // Past the prediction window a closed circuit is not replaced.
    let c = *pool.circs.keys().next().unwrap();
    assert!(pool.on_closed(c, "test", t.now));
    t.fill(&mut pool, PREDICTION_WINDOW + Duration::from_secs(60));
    assert_eq!((pool.len(), pool.counters.launched), (3, 4));
}

#[test]
fn zero_disables_the_pool() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(0, &[LONG_ONION_HOPS], true);
    t.fill(&mut pool, Duration::ZERO);
    assert!(pool.is_empty());
    assert!(t.core.poll_event().is_none());
}

#[test]
fn take_gives_a_built_circuit_of_the_length_that_avoids_the_point() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(2, &[SHORT_ONION_HOPS], true);
    t.fill(&mut pool, Duration::ZERO);
    let circs: Vec<CircKey> = pool.circs.keys().copied().collect();
    assert_eq!(circs.len(), 2);
    let relays_of = |pool: &InternalPool, c: CircKey| pool.circs[&c].relays.clone();
    let (a, b) = (circs[0], circs[1]);
    let a_relays = relays_of(&pool, a);
    // Nothing built yet: nothing to take.
    let elsewhere = t
        .cons
        .relays
        .iter()
        .map(|r| r.identity)
        .find(|id| !a_relays.contains(id) && !relays_of(&pool, b).contains(id))
        .expect("a relay on neither circuit");
    assert_eq!(pool.take(2, &elsewhere), None);
    assert!(pool.on_built(a, t.now));
    assert!(!pool.on_built(CircKey(u64::MAX), t.now), "not ours");
    // Only `a` is built: not for a point it passes through, not for another length.
    assert_eq!(pool.take(2, &a_relays[1]), None);
    assert_eq!(pool.take(3, &elsewhere), None);
    assert_eq!(pool.take(2, &elsewhere), Some(a));
    assert!(!pool.owns(a), "taken circuits leave the pool");
    assert_eq!(pool.counters.used, 1);
    assert_eq!(pool.take(2, &elsewhere), None, "b is not built");
    // The next fill replaces the taken one.
    t.fill(&mut pool, Duration::from_millis(500));
    assert_eq!(pool.len(), 2);
}

#[test]
fn failed_builds_back_off_and_idle_circuits_expire() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(1, &[LONG_ONION_HOPS], true);
    t.fill(&mut pool, Duration::ZERO);
    let c = *pool.circs.keys().next().unwrap();
    assert!(pool.on_closed(c, "connect failed", t.now));
    assert_eq!(pool.counters.failed, 1);
    // Not at once: after half of 2 s.
    t.fill(&mut pool, Duration::from_millis(500));
    assert!(pool.is_empty());
    t.fill(&mut pool, Duration::from_secs(1));
    assert_eq!(pool.len(), 1);
    // A second failure in a row waits longer (2 s).
    let c = *pool.circs.keys().next().unwrap();
    pool.on_closed(c, "connect failed", t.now + Duration::from_secs(1));
    t.fill(&mut pool, Duration::from_secs(2));
    assert!(pool.is_empty());
    t.fill(&mut pool, Duration::from_secs(3));
    assert_eq!(pool.len(), 1);
    // Built and never taken: closed after MAX_IDLE and replaced.
    let c = *pool.circs.keys().next().unwrap();
    pool.on_built(c, t.now + Duration::from_secs(3));
    t.fill(&mut pool, Duration::from_secs(3) + MAX_IDLE);
    assert_eq!(pool.counters.expired, 1);
    assert!(!pool.owns(c) && pool.len() == 1);
}

#[test]
fn a_circuit_the_core_will_not_extend_is_replaced_by_a_fresh_build() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(1, &[SHORT_ONION_HOPS], true);
    t.fill(&mut pool, Duration::ZERO);
    let c = *pool.circs.keys().next().unwrap();
    // The pool believes it built; the core (no network) never built it.
    pool.on_built(c, t.now);
    let point = t
        .cons
        .relays
        .iter()
        .find(|r| !pool.circs[&c].relays.contains(&r.identity))
        .unwrap();
    // A fresh path of the same length (3) to that point.
    let mut path: Vec<HopSpec> = t
        .cons
        .relays
        .iter()
        .filter(|r| r.identity != point.identity)
        .take(2)
        .map(hop_of)
        .collect();
    path.push(hop_of(point));
    let (got, predicted) = launch_or_extend(&mut pool, &mut t.core, path, t.now);
    assert!(!predicted && got != c);
    assert!(!pool.owns(c));
    assert!(!t.core.circuit_is_open(c));
}

#[test]
fn whole_circuits_end_at_their_point_and_are_taken_only_whole() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(1, &[SHORT_ONION_HOPS, LONG_ONION_HOPS], true)
        .with_whole(&[SHORT_ONION_HOPS]);
    t.fill(&mut pool, Duration::ZERO);
    // The rendezvous kind is built to its point (3 relays), the introduction kind one short.
    assert_eq!(lengths(&pool), vec![3, 3]);
    let whole = *pool
        .circs
        .iter()
        .find(|(_, e)| e.end.is_some())
        .map(|(c, _)| c)
        .expect("a whole circuit");
    let end = pool.circs[&whole].end.clone().unwrap();
    assert_eq!(pool.circs[&whole].relays.last(), Some(&end.identity));
    assert_ne!(Some(end.identity), t.guard, "the point is not the guard");
    for c in pool.circs.keys().copied().collect::<Vec<_>>() {
        pool.on_built(c, t.now);
    }
    let elsewhere = t
        .cons
        .relays
        .iter()
        .map(|r| r.identity)
        .find(|id| !pool.circs.values().any(|e| e.relays.contains(id)))
        .expect("a relay on no circuit");
    // A whole circuit is never extended: `take` gives only the prefix of length 3.
    let prefix = pool.take(3, &elsewhere).expect("the introduction prefix");
    assert_ne!(prefix, whole);
    assert_eq!(pool.take(3, &elsewhere), None);
    // Not for a point it ends at (the intro point the caller avoids).
    let id = |t: Option<(CircKey, HopSpec)>| t.map(|(c, h)| (c, h.identity));
    assert_eq!(id(pool.take_whole(3, &end.identity)), None);
    assert_eq!(id(pool.take_whole(2, &elsewhere)), None, "another length");
    assert_eq!(
        id(pool.take_whole(3, &elsewhere)),
        Some((whole, end.identity))
    );
    assert!(pool.is_empty());
    assert_eq!(pool.counters.used, 2);
}

#[test]
fn whole_circuits_ending_at_an_unusable_point_are_replaced() {
    let mut t = T::new(5);
    let mut pool = InternalPool::new(1, &[SHORT_ONION_HOPS], true).with_whole(&[SHORT_ONION_HOPS]);
    t.fill(&mut pool, Duration::ZERO);
    let (c, end) = pool.whole_circuits()[0].clone();
    pool.on_built(c, t.now);
    // The only introduction point is its end: not taken, and retired so a new end is drawn.
    assert!(pool.take_whole(3, &end.identity).is_none());
    pool.retire_whole_ending_at(&mut t.core, 3, &end.identity, t.now);
    assert!(!pool.owns(c) && pool.is_empty());
    assert_eq!(pool.counters.expired, 1);
    t.fill(&mut pool, Duration::from_millis(100));
    assert_eq!(pool.len(), 1);
    assert_eq!(pool.counters.launched, 2);
}
