//! Onion services from a client's side, as policy over a sans-IO [`chive_core::Core`] (like
//! [`crate::circmgr`]): which circuits to build, what to send on them, what to do with the
//! answers. The protocol steps themselves are `chive_core::onion`'s state machines; the IO
//! (descriptor upload and fetch over HTTP, the service's local TCP connections) is the
//! caller's, asked for through the actions these return. Time is passed in.
//!
//! - [`service`]: [`OnionService`], one service (`HiddenServiceDir`): introduction points,
//!   their circuits and ESTABLISH_INTRO, the descriptor to publish (again before it expires and
//!   when an introduction point changes), INTRODUCE2 → a circuit to the rendezvous point →
//!   RENDEZVOUS1 and the virtual hop, and which local target a stream's port goes to.
//! - [`connect`]: [`OnionConnector`], the client's connections to services: rendezvous
//!   circuit, INTRODUCE1 through an introduction point, RENDEZVOUS2, streams on the joined
//!   circuit (reused for later streams of the same address and isolation), bounded retries
//!   and a deadline, each failure with its proposal 304 SOCKS code.
//! - [`desc_cache`]: [`DescriptorCache`], verified descriptors kept until they expire (dropped
//!   when an introduction through them fails), so a new rendezvous skips the directory.
//! - [`pool`]: [`InternalPool`], predicted internal circuits (Tor's): clean circuits built
//!   ahead and extended by one hop to an introduction or rendezvous point when one is chosen,
//!   or (a client's rendezvous circuits) built whole, their last hop becoming the point.
//!
//! Path lengths (simplified from Tor, docs/protocol.md "Onion services"): a circuit ends at
//! the introduction or rendezvous point; the client's rendezvous and the service's
//! introduction circuits have 3 hops, the client's introduction and the service's rendezvous
//! circuits 4 (as Tor), each shortened when the consensus has too few other relays.

pub mod connect;
pub mod desc_cache;
pub mod pool;
pub mod service;
#[cfg(test)]
pub(crate) mod test_net;
#[cfg(test)]
mod pins_tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn pins_match_nickname_or_identity() {
        let c = test_net::consensus(3);
        let by_name = OnionPaths {
            entry_nodes: vec!["R1".into()],
            middle_nodes: vec![],
        };
        assert!(by_name.pins(&c.relays[0]) && !by_name.pins(&c.relays[1]));
        let by_id = OnionPaths {
            entry_nodes: vec![],
            middle_nodes: vec![c.relays[2].identity.to_hex(), "not-hex".into()],
        };
        assert!(by_id.pins(&c.relays[2]) && !by_id.pins(&c.relays[0]));
        assert!(!OnionPaths::default().pins(&c.relays[0]));
    }

    #[test]
    fn a_pinned_point_takes_its_pinned_place() {
        let c = test_net::consensus(5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let paths = OnionPaths {
            entry_nodes: vec!["r1".into()],
            middle_nodes: vec!["r2".into()],
        };
        let id = |i: usize| c.relays[i].identity;
        let mut to = |i: usize| {
            path_to(
                &c,
                &paths,
                None,
                hop_of(&c.relays[i]),
                LONG_ONION_HOPS,
                &mut rng,
            )
            .unwrap()
            .into_iter()
            .map(|h| h.identity)
            .collect::<Vec<_>>()
        };
        // An unpinned point: the pinned entry and middle first, the point last.
        let p = to(4);
        assert_eq!((p[0], p[1], p[p.len() - 1]), (id(0), id(1), id(4)));
        // The pinned middle as the point: guard, then it; the pinned entry: alone.
        assert_eq!(to(1), vec![id(0), id(1)]);
        assert_eq!(to(0), vec![id(0)]);
    }
}

use chive_core::HopSpec;
use chive_crypto::ntor::NtorPublicKey;
use chive_crypto::IdentityKey;
use chive_dir::{Consensus, ConsensusRelay, RelayFlags};
use rand::Rng;

use crate::path::{select_path_to, PathRequest, PathTarget};

pub use connect::{ConnectKey, ConnectorCounters, JoinTiming, OnionConnector, OnionOutcome};
pub use desc_cache::DescriptorCache;
pub use pool::{InternalPool, PoolCounters};
pub use service::{OnionService, ServiceAction, ServiceConfig, ServiceCounters};

/// Hops of a circuit to a point this side chose itself (the client's rendezvous circuit, the
/// service's introduction circuits), the point included.
pub const SHORT_ONION_HOPS: usize = 3;
/// Hops of a circuit to a point the other side chose (the client's introduction circuit,
/// the service's rendezvous circuit): one more, as Tor, so the chosen point is never the
/// relay after the guard.
pub const LONG_ONION_HOPS: usize = 4;

/// Settings both roles use for their paths.
#[derive(Clone, Debug, Default)]
pub struct OnionPaths {
    /// Tor's EntryNodes (see [`crate::circmgr::CircMgrConfig`]).
    pub entry_nodes: Vec<String>,
    /// Tor's MiddleNodes.
    pub middle_nodes: Vec<String>,
}

impl OnionPaths {
    /// Whether `r` is named in EntryNodes or MiddleNodes (by nickname or 64-hex identity). A
    /// pinned path needs such a relay before its last hop, so it is a poor introduction or
    /// rendezvous point: with one relay allowed in its position no path to it can be built.
    pub fn pins(&self, r: &ConsensusRelay) -> bool {
        names(&self.entry_nodes, r) || names(&self.middle_nodes, r)
    }
}

/// Whether `list` (nicknames or 64-hex identities) names `r`.
fn names(list: &[String], r: &ConsensusRelay) -> bool {
    list.iter().any(|n| {
        r.nickname.eq_ignore_ascii_case(n)
            || IdentityKey::from_hex(n).is_ok_and(|id| id == r.identity)
    })
}

/// The hop spec of a consensus relay.
pub(crate) fn hop_of(r: &ConsensusRelay) -> HopSpec {
    HopSpec {
        identity: r.identity,
        ntor_key: NtorPublicKey(r.ntor_key),
        addr: r.address,
    }
}

/// A path of about `hops` relays ending at `last`: the relays before it from the consensus
/// ([`select_path_to`]), then `last`. When no such path exists because `last` is a relay the
/// pins need before the last hop (the other side chose it), `last` takes its pinned place:
/// alone if EntryNodes names it, after the guard if MiddleNodes does.
pub(crate) fn path_to<R: Rng>(
    consensus: &Consensus,
    paths: &OnionPaths,
    guard: Option<&IdentityKey>,
    last: HopSpec,
    hops: usize,
    rng: &mut R,
) -> Result<Vec<HopSpec>, String> {
    let err = match path_to_hops(consensus, paths, guard, last.clone(), hops, rng) {
        Ok(path) => return Ok(path),
        Err(e) => e,
    };
    match consensus
        .relays
        .iter()
        .find(|r| r.identity == last.identity)
    {
        Some(r) if names(&paths.entry_nodes, r) => Ok(vec![last]),
        Some(r) if names(&paths.middle_nodes, r) && hops > 2 => {
            path_to_hops(consensus, paths, guard, last, 2, rng)
        }
        _ => Err(err),
    }
}

fn path_to_hops<R: Rng>(
    consensus: &Consensus,
    paths: &OnionPaths,
    guard: Option<&IdentityKey>,
    last: HopSpec,
    hops: usize,
    rng: &mut R,
) -> Result<Vec<HopSpec>, String> {
    let req = PathRequest {
        target: PathTarget::Any,
        exit_nickname: None,
        guard,
        hops,
        entry_nodes: &paths.entry_nodes,
        middle_nodes: &paths.middle_nodes,
    };
    let before = select_path_to(consensus, &req, &last.identity, rng).map_err(|e| e.to_string())?;
    let mut path: Vec<HopSpec> = before.into_iter().map(hop_of).collect();
    path.push(last);
    Ok(path)
}

/// Running and Valid relays, the candidates for introduction and rendezvous points.
pub(crate) fn usable_relays(consensus: &Consensus) -> Vec<&ConsensusRelay> {
    consensus
        .relays
        .iter()
        .filter(|r| r.flags.contains(RelayFlags::RUNNING | RelayFlags::VALID))
        .collect()
}
