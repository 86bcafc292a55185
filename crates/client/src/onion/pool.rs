//! Predicted internal circuits, as Tor's: a few clean circuits built ahead of need, each
//! extended by one hop ([`Core::extend_circuit`], EXTEND2 from its last relay) to an
//! introduction or rendezvous point once one is chosen, so an onion connection waits for one
//! handshake instead of a whole circuit build ("cannibalising" in Tor), or, for a kind built
//! whole (below), used as it is.
//!
//! A pool keeps `per_kind` circuits for each kind of path it serves: a kind is the length of
//! the full path to a point (`SHORT_ONION_HOPS` or `LONG_ONION_HOPS`); its circuits are that
//! path without the point, chosen as a path to a random relay the pins do not name, so they
//! have the same guard, pins and shortening as a path built from scratch. A circuit is taken
//! only for a point it does not already pass through and whose fresh path would have the
//! same length. A kind marked *whole* ([`InternalPool::with_whole`]) is built to its last hop
//! instead, a random relay chosen as a point would be, and taken as it is with that relay as
//! the point ([`InternalPool::take_whole`]): a client's rendezvous circuits, whose point the
//! client picks freely (Tor's client also makes the last hop of an internal circuit its
//! rendezvous point), so a connection does not wait for an EXTEND2 round trip through
//! loaded relays before ESTABLISH_RENDEZVOUS. Circuits are single-use: taken, they leave the
//! pool for good. A built circuit
//! nobody took within [`MAX_IDLE`] is closed and replaced. Failed builds back off (1 s,
//! doubling, at most 30 s) so a broken network is not hammered.
//!
//! When: a service's pool fills from its first consensus; a client's only while onion
//! connections are predicted, from its first one until [`PREDICTION_WINDOW`] after its last
//! (Tor predicts internal circuits from past use the same way), so a client that never visits
//! an onion service builds nothing extra.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chive_core::{CircKey, Core, HopSpec};
use chive_crypto::IdentityKey;
use chive_dir::Consensus;
use rand::seq::SliceRandom;
use rand::Rng;
use tracing::{debug, warn};

use super::{hop_of, path_to, usable_relays, OnionPaths};

/// Circuits of each kind a pool keeps by default (`OnionPredictedCircuits`).
pub const DEFAULT_PREDICTED: usize = 2;
/// Most circuits of one kind a pool keeps (the option's upper bound).
pub const MAX_PREDICTED: usize = 8;
/// A built circuit not taken within this is closed and replaced.
pub const MAX_IDLE: Duration = Duration::from_secs(3600);
/// A client keeps its pool filled this long after its last onion connection (Tor's
/// `PredictedPortsRelevanceTime` default).
pub const PREDICTION_WINDOW: Duration = Duration::from_secs(3600);
const BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What a pool did (for the owner's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Circuits launched for the pool.
    pub launched: u64,
    /// Of them, built.
    pub built: u64,
    /// Taken for a point (extended to it, or a whole circuit ending at it).
    pub used: u64,
    /// Closed before they were taken (failed to build, or lost while waiting).
    pub failed: u64,
    /// Closed unused: after [`MAX_IDLE`], or a built whole circuit ending at a point it could
    /// not serve ([`InternalPool::retire_whole_ending_at`]).
    pub expired: u64,
}

struct Entry {
    /// The kind: full path length it was built for.
    kind: usize,
    relays: Vec<IdentityKey>,
    /// A whole circuit's last hop (the point it is taken for); `None`: a prefix.
    end: Option<HopSpec>,
    built: Option<Instant>,
}

/// One owner's predicted circuits. See the module docs.
pub struct InternalPool {
    per_kind: usize,
    kinds: Vec<usize>,
    /// Kinds built whole (see the module docs).
    whole: Vec<usize>,
    /// Fill until then (`None`: not yet predicted); a service's is never over.
    active_until: Option<Instant>,
    always: bool,
    circs: HashMap<CircKey, Entry>,
    failures: u32,
    not_before: Option<Instant>,
    /// Counters.
    pub counters: PoolCounters,
}

impl InternalPool {
    /// A pool of `per_kind` circuits for each path length in `kinds`; `always`: fill from the
    /// first [`InternalPool::fill`] on (a service), else only after
    /// [`InternalPool::note_used`] (a client). `per_kind` is capped at [`MAX_PREDICTED`]; 0
    /// disables the pool.
    pub fn new(per_kind: usize, kinds: &[usize], always: bool) -> Self {
        InternalPool {
            per_kind: per_kind.min(MAX_PREDICTED),
            kinds: kinds.to_vec(),
            whole: Vec::new(),
            active_until: None,
            always,
            circs: HashMap::new(),
            failures: 0,
            not_before: None,
            counters: PoolCounters::default(),
        }
    }

    /// Build the circuits of `kinds` (of those given to [`InternalPool::new`]) whole, ending at
    /// a random relay that [`InternalPool::take_whole`] hands out as the point.
    pub fn with_whole(mut self, kinds: &[usize]) -> Self {
        self.whole = kinds
            .iter()
            .copied()
            .filter(|k| self.kinds.contains(k))
            .collect();
        self
    }

    /// An onion connection started now: keep the pool filled for [`PREDICTION_WINDOW`].
    pub fn note_used(&mut self, now: Instant) {
        self.active_until = Some(now + PREDICTION_WINDOW);
    }

    /// Does the pool own `circ`?
    pub fn owns(&self, circ: CircKey) -> bool {
        self.circs.contains_key(&circ)
    }

    /// Built circuits waiting in the pool.
    pub fn ready(&self) -> usize {
        self.circs.values().filter(|e| e.built.is_some()).count()
    }

    /// Circuits in the pool, built or building.
    pub fn len(&self) -> usize {
        self.circs.len()
    }

    /// True if the pool holds no circuit.
    pub fn is_empty(&self) -> bool {
        self.circs.is_empty()
    }

    /// Close expired circuits and launch what is missing (if the pool is active and not
    /// backing off). `guard` is the owner's guard: used if set, set from the first path
    /// otherwise.
    pub fn fill<R: Rng>(
        &mut self,
        core: &mut Core,
        consensus: &Consensus,
        paths: &OnionPaths,
        guard: &mut Option<IdentityKey>,
        rng: &mut R,
        now: Instant,
    ) {
        let expired: Vec<CircKey> = self
            .circs
            .iter()
            .filter(|(_, e)| e.built.is_some_and(|t| now.duration_since(t) >= MAX_IDLE))
            .map(|(c, _)| *c)
            .collect();
        for c in expired {
            self.circs.remove(&c);
            self.counters.expired += 1;
            core.close_circuit(c, now);
        }
        let active = self.always || self.active_until.is_some_and(|t| now < t);
        if !active || self.per_kind == 0 || self.not_before.is_some_and(|t| now < t) {
            return;
        }
        for kind in self.kinds.clone() {
            let have = self.circs.values().filter(|e| e.kind == kind).count();
            let whole = self.whole.contains(&kind);
            for _ in have..self.per_kind {
                let Some(mut path) = path_to_random(consensus, paths, guard.as_ref(), kind, rng)
                else {
                    debug!(kind, "no path for a predicted circuit");
                    return;
                };
                let end = if whole {
                    path.last().cloned()
                } else {
                    path.pop();
                    None
                };
                guard.get_or_insert(path[0].identity);
                let relays = path.iter().map(|h| h.identity).collect();
                let circ = core.launch_circuit(path, now);
                self.counters.launched += 1;
                self.circs.insert(
                    circ,
                    Entry {
                        kind,
                        relays,
                        end,
                        built: None,
                    },
                );
            }
        }
    }

    /// A built circuit of `len` relays that does not pass through `point`, taken out of the
    /// pool (the caller extends it to `point`); `None` if there is none. Whole circuits are
    /// not taken here.
    pub fn take(&mut self, len: usize, point: &IdentityKey) -> Option<CircKey> {
        let circ = self
            .circs
            .iter()
            .filter(|(_, e)| {
                e.end.is_none()
                    && e.built.is_some()
                    && e.relays.len() == len
                    && !e.relays.contains(point)
            })
            .min_by_key(|(c, e)| (e.built, **c))
            .map(|(c, _)| *c)?;
        self.circs.remove(&circ);
        self.counters.used += 1;
        Some(circ)
    }

    /// A built whole circuit of `len` relays that does not end at `avoid`, taken out of the
    /// pool with its last hop, the point it is for; `None` if there is none.
    pub fn take_whole(&mut self, len: usize, avoid: &IdentityKey) -> Option<(CircKey, HopSpec)> {
        let circ = self
            .circs
            .iter()
            .filter(|(_, e)| {
                e.built.is_some()
                    && e.relays.len() == len
                    && e.end.as_ref().is_some_and(|h| h.identity != *avoid)
            })
            .min_by_key(|(c, e)| (e.built, **c))
            .map(|(c, _)| *c)?;
        let e = self.circs.remove(&circ)?;
        self.counters.used += 1;
        Some((circ, e.end?))
    }

    /// Close the built whole circuits of `len` relays that end at `point` (the caller could not
    /// use them for it), so the next fill draws new last hops: without this a service whose
    /// only usable introduction point is that relay would leave them in the pool unused until
    /// [`MAX_IDLE`], and every connection would build or extend its rendezvous circuit.
    pub fn retire_whole_ending_at(
        &mut self,
        core: &mut Core,
        len: usize,
        point: &IdentityKey,
        now: Instant,
    ) {
        let stale: Vec<CircKey> = self
            .circs
            .iter()
            .filter(|(_, e)| {
                e.built.is_some()
                    && e.relays.len() == len
                    && e.end.as_ref().is_some_and(|h| h.identity == *point)
            })
            .map(|(c, _)| *c)
            .collect();
        for c in stale {
            self.circs.remove(&c);
            self.counters.expired += 1;
            debug!(
                ?c,
                "whole predicted circuit ends at the introduction point: replaced"
            );
            core.close_circuit(c, now);
        }
    }

    /// The last hops of the built whole circuits of `len` relays (the points they can serve).
    pub fn ready_whole_ends(&self, len: usize) -> Vec<IdentityKey> {
        self.circs
            .values()
            .filter(|e| e.built.is_some() && e.relays.len() == len)
            .filter_map(|e| e.end.as_ref().map(|h| h.identity))
            .collect()
    }

    /// The whole circuits and their last hops (for tests).
    #[cfg(test)]
    pub(crate) fn whole_circuits(&self) -> Vec<(CircKey, HopSpec)> {
        self.circs
            .iter()
            .filter_map(|(c, e)| e.end.clone().map(|h| (*c, h)))
            .collect()
    }

    /// A circuit was built; true if it is the pool's.
    pub fn on_built(&mut self, circ: CircKey, now: Instant) -> bool {
        let Some(e) = self.circs.get_mut(&circ) else {
            return false;
        };
        e.built = Some(now);
        self.counters.built += 1;
        self.failures = 0;
        self.not_before = None;
        true
    }

    /// A circuit closed; true if it was the pool's.
    pub fn on_closed(&mut self, circ: CircKey, reason: &str, now: Instant) -> bool {
        let Some(e) = self.circs.remove(&circ) else {
            return false;
        };
        self.counters.failed += 1;
        if e.built.is_none() {
            self.failures += 1;
            let backoff = BACKOFF
                .saturating_mul(1 << self.failures.min(6))
                .min(MAX_BACKOFF);
            self.not_before = Some(now + backoff / 2);
        }
        debug!(?circ, %reason, built = e.built.is_some(), "predicted circuit closed");
        true
    }
}

/// A path of `kind` hops to a random relay (not the guard; one the pins do not name, if any):
/// without its last relay, what a circuit to a point will be before its point.
fn path_to_random<R: Rng>(
    consensus: &Consensus,
    paths: &OnionPaths,
    guard: Option<&IdentityKey>,
    kind: usize,
    rng: &mut R,
) -> Option<Vec<HopSpec>> {
    // Not the guard: a path to it would need another first hop.
    let all: Vec<_> = usable_relays(consensus)
        .into_iter()
        .filter(|r| Some(&r.identity) != guard)
        .collect();
    let free: Vec<_> = all.iter().copied().filter(|r| !paths.pins(r)).collect();
    let last = if free.is_empty() { &all } else { &free }.choose(rng)?;
    match path_to(consensus, paths, guard, hop_of(last), kind, rng) {
        Ok(p) if p.len() >= 2 => Some(p),
        Ok(_) => None,
        Err(e) => {
            warn!(error = %e, "no path for a predicted circuit");
            None
        }
    }
}

/// Extend a circuit from `pool` to `path`'s last hop if one fits, else build `path`. Returns
/// the circuit and whether it was a predicted one.
pub(crate) fn launch_or_extend(
    pool: &mut InternalPool,
    core: &mut Core,
    path: Vec<HopSpec>,
    now: Instant,
) -> (CircKey, bool) {
    if let Some(point) = path.last().filter(|_| path.len() >= 2).cloned() {
        if let Some(c) = pool.take(path.len() - 1, &point.identity) {
            match core.extend_circuit(c, point, now) {
                Ok(()) => return (c, true),
                Err(e) => {
                    warn!(circ = ?c, error = %e, "cannot extend a predicted circuit; building anew");
                    core.close_circuit(c, now);
                }
            }
        }
    }
    (core.launch_circuit(path, now), false)
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
