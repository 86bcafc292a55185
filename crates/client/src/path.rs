//! Path selection: which relays a circuit goes through. Pure functions over a
//! [`Consensus`]; the caller passes the random number generator, so tests are
//! deterministic with a seeded one.
//!
//! Order, as in Tor: the exit first (it is the most constrained: Exit flag and a policy
//! that allows the target), then the guard (the client's preferred guard if it is usable
//! and not the exit), then middles. Every choice is weighted by the relays' bandwidth
//! and all relays on a path are distinct. Only relays flagged Running and Valid are
//! used.
//!
//! Tor's `EntryNodes` / `MiddleNodes` restrict the guard and the middles to listed
//! relays (nicknames or hex identities), for testbeds that must use exact paths. Since
//! the exit is chosen first, an unpinned exit (and then the guard) avoids relays whose
//! choice would leave no listed relay for a later hop, when another choice exists.

use std::fmt;
use std::net::SocketAddr;

use chive_crypto::IdentityKey;
use chive_dir::{valid_nickname, Consensus, ConsensusRelay, RelayFlags};
use rand::Rng;

/// Longest path we build (Tor's limit of 8 RELAY_EARLY cells bounds it too).
pub const MAX_HOPS: usize = 8;

/// What the exit must be able to reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathTarget<'a> {
    /// A known address and port: the exit policy must allow exactly it.
    Ip(SocketAddr),
    /// A hostname the exit will resolve: the policy must allow the port somewhere.
    Host(&'a str, u16),
    /// Any address on this port (a circuit for a predicted exit and port).
    Port(u16),
    /// No particular target (preemptive circuits): any exit.
    Any,
}

/// A request for one path.
#[derive(Debug, Clone, Copy)]
pub struct PathRequest<'a> {
    /// What the exit must allow.
    pub target: PathTarget<'a>,
    /// Pin the exit (from `host.<nickname>.exit`): a nickname or a hex identity.
    pub exit_nickname: Option<&'a str>,
    /// The client's preferred guard, used when usable and distinct from the exit.
    pub guard: Option<&'a IdentityKey>,
    /// Number of relays, normally 3.
    pub hops: usize,
    /// Tor's EntryNodes: if non-empty, the first hop is chosen only among these relays
    /// (nicknames or 64-hex identities; the Guard flag is not required), and `guard`
    /// is used only if it is one of them. Ignored for one-hop paths.
    pub entry_nodes: &'a [String],
    /// Tor's MiddleNodes: if non-empty, every middle hop is chosen only among these.
    pub middle_nodes: &'a [String],
}

/// Why no path could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// No running relay with the Exit flag allows the target.
    #[error("no exit relay in the consensus allows {target}")]
    NoExit {
        /// The target, as text.
        target: String,
    },
    /// The pinned exit is not in the consensus (or not running).
    #[error("exit relay {0:?} (from .exit notation) is not in the consensus")]
    UnknownExit(String),
    /// The pinned exit's policy does not allow the target.
    #[error("exit relay {exit} does not allow {target} by its exit policy")]
    ExitPolicyRejects {
        /// The pinned exit's nickname.
        exit: String,
        /// The target, as text.
        target: String,
    },
    /// Fewer usable relays than hops.
    #[error("not enough relays for a {need}-hop path: {have} usable in the consensus")]
    NotEnoughRelays {
        /// Hops requested.
        need: usize,
        /// Usable relays available.
        have: usize,
    },
    /// `hops` outside `1..=MAX_HOPS`.
    #[error("cannot build a path of {0} hops (1 to {MAX_HOPS})")]
    BadHopCount(usize),
    /// EntryNodes or MiddleNodes is set but no usable relay that is not already on the
    /// path matches it.
    #[error(
        "no relay in the consensus matches {option} {nodes:?} \
         (only running, valid relays not already on this path count)"
    )]
    NoMatchingRelay {
        /// `"EntryNodes"` or `"MiddleNodes"`.
        option: &'static str,
        /// The configured list.
        nodes: Vec<String>,
    },
}

impl fmt::Display for PathTarget<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathTarget::Ip(a) => write!(f, "{a}"),
            PathTarget::Host(h, p) => write!(f, "{h}:{p}"),
            PathTarget::Port(p) => write!(f, "port {p}"),
            PathTarget::Any => f.write_str("any destination"),
        }
    }
}

/// Running and Valid: the relay may be used at all.
fn usable(r: &ConsensusRelay) -> bool {
    r.flags.contains(RelayFlags::RUNNING | RelayFlags::VALID)
}

/// Whether `r`'s exit policy allows `target`.
fn allows(r: &ConsensusRelay, target: &PathTarget<'_>) -> bool {
    match target {
        PathTarget::Ip(a) => r.exit_policy.allows(a.ip(), a.port()),
        PathTarget::Host(_, port) | PathTarget::Port(port) => {
            r.exit_policy.allows_port_somewhere(*port)
        }
        PathTarget::Any => r.exit_policy.is_exit(),
    }
}

/// Pick one relay with probability proportional to its bandwidth (uniformly if all
/// bandwidths are 0). `None` if `cands` is empty.
fn pick_weighted<'c, R: Rng + ?Sized>(
    cands: &[&'c ConsensusRelay],
    rng: &mut R,
) -> Option<&'c ConsensusRelay> {
    // u128: the sum of up to MAX_RELAYS u64 bandwidths cannot overflow it.
    let total: u128 = cands.iter().map(|r| u128::from(r.bandwidth)).sum();
    if total == 0 {
        if cands.is_empty() {
            return None;
        }
        return cands.get(rng.gen_range(0..cands.len())).copied();
    }
    let mut x = rng.gen_range(0..total);
    for r in cands {
        let w = u128::from(r.bandwidth);
        if x < w {
            return Some(r);
        }
        x -= w;
    }
    None
}

/// Whether `s` may appear in EntryNodes / MiddleNodes (or `.exit` notation): a relay
/// nickname (1-19 ASCII letters or digits) or an identity of exactly 64 hex digits.
pub fn valid_node_spec(s: &str) -> bool {
    valid_nickname(s) || (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// One EntryNodes / MiddleNodes list, with its hex identities decoded once. Matching is
/// the same as for a pinned exit: nickname (case-insensitive) or identity.
struct NodeFilter<'a> {
    names: &'a [String],
    ids: Vec<IdentityKey>,
}

impl<'a> NodeFilter<'a> {
    fn new(names: &'a [String]) -> Self {
        let ids = names
            .iter()
            .filter(|n| n.len() == 64)
            .filter_map(|n| IdentityKey::from_hex(n).ok())
            .collect();
        NodeFilter { names, ids }
    }

    /// An empty list means "no restriction". A non-empty list whose entries are all
    /// malformed still restricts (to nothing): a typo must not silently unpin a path.
    fn restricted(&self) -> bool {
        !self.names.is_empty()
    }

    fn matches(&self, r: &ConsensusRelay) -> bool {
        self.names
            .iter()
            .any(|n| r.nickname.eq_ignore_ascii_case(n))
            || self.ids.contains(&r.identity)
    }

    /// Whether `r` may take this role (always, when unrestricted).
    fn allows(&self, r: &ConsensusRelay) -> bool {
        !self.restricted() || self.matches(r)
    }

    fn error(&self, option: &'static str) -> PathError {
        PathError::NoMatchingRelay {
            option,
            nodes: self.names.to_vec(),
        }
    }
}

/// Find a pinned exit by nickname (case-insensitive) or by 64-hex-digit identity.
pub(crate) fn find_pinned<'c>(consensus: &'c Consensus, name: &str) -> Option<&'c ConsensusRelay> {
    consensus
        .relays
        .iter()
        .filter(|r| usable(r))
        .find(|r| r.nickname.eq_ignore_ascii_case(name))
        .or_else(|| {
            let id = IdentityKey::from_hex(name).ok()?;
            consensus
                .relays
                .iter()
                .filter(|r| usable(r))
                .find(|r| r.identity == id)
        })
}

/// The first non-empty candidate list, weighted pick. Lists go from most to least
/// preferred, so a preference (Guard flag, keeping the path completable) is dropped
/// only when nothing satisfies it.
fn pick_tiered<'c, R: Rng + ?Sized>(
    tiers: &[Vec<&'c ConsensusRelay>],
    rng: &mut R,
) -> Option<&'c ConsensusRelay> {
    tiers
        .iter()
        .find(|t| !t.is_empty())
        .and_then(|t| pick_weighted(t, rng))
}

/// Choose a path of `req.hops` distinct relays: `[guard, middles..., exit]` (for one
/// hop, just `[exit]`).
pub fn select_path<'c, R: Rng>(
    consensus: &'c Consensus,
    req: &PathRequest,
    rng: &mut R,
) -> Result<Vec<&'c ConsensusRelay>, PathError> {
    if req.hops == 0 || req.hops > MAX_HOPS {
        return Err(PathError::BadHopCount(req.hops));
    }
    let all: Vec<&ConsensusRelay> = consensus.relays.iter().filter(|r| usable(r)).collect();
    if all.len() < req.hops {
        return Err(PathError::NotEnoughRelays {
            need: req.hops,
            have: all.len(),
        });
    }
    let entry = NodeFilter::new(req.entry_nodes);
    let middle = NodeFilter::new(req.middle_nodes);
    let n_middles = req.hops.saturating_sub(2);
    // Whether, with `taken` on the path, enough listed middles remain.
    let middles_left = |taken: &[&ConsensusRelay]| {
        n_middles == 0
            || !middle.restricted()
            || all
                .iter()
                .filter(|r| middle.matches(r) && !taken.iter().any(|t| t.identity == r.identity))
                .count()
                >= n_middles
    };
    // Whether, with `exit` chosen, a listed guard and enough listed middles remain.
    let exit_completable = |e: &ConsensusRelay| {
        req.hops == 1
            || ((!entry.restricted()
                || all
                    .iter()
                    .any(|r| entry.matches(r) && r.identity != e.identity))
                && middles_left(&[e]))
    };

    let exit = match req.exit_nickname {
        Some(name) => {
            let r = find_pinned(consensus, name)
                .ok_or_else(|| PathError::UnknownExit(name.to_string()))?;
            if !allows(r, &req.target) {
                return Err(PathError::ExitPolicyRejects {
                    exit: r.nickname.clone(),
                    target: req.target.to_string(),
                });
            }
            r
        }
        None => {
            let exits: Vec<&ConsensusRelay> = all
                .iter()
                .copied()
                .filter(|r| r.flags.contains(RelayFlags::EXIT) && allows(r, &req.target))
                .collect();
            let completable: Vec<&ConsensusRelay> = exits
                .iter()
                .copied()
                .filter(|r| exit_completable(r))
                .collect();
            // If no exit keeps the path completable, choose anyway: the guard or
            // middle step then reports which list cannot be satisfied.
            pick_tiered(&[completable, exits], rng).ok_or_else(|| PathError::NoExit {
                target: req.target.to_string(),
            })?
        }
    };
    if req.hops == 1 {
        return Ok(vec![exit]);
    }

    let mut path: Vec<&ConsensusRelay> = Vec::with_capacity(req.hops);
    let guard_ok = |g: &ConsensusRelay| middles_left(&[exit, g]);
    let preferred = req
        .guard
        .and_then(|id| all.iter().copied().find(|r| r.identity == *id))
        .filter(|r| r.identity != exit.identity && entry.allows(r) && guard_ok(r));
    let guard = match preferred {
        Some(g) => g,
        None => {
            let not_exit: Vec<&ConsensusRelay> = all
                .iter()
                .copied()
                .filter(|r| r.identity != exit.identity)
                .collect();
            let tiers = if entry.restricted() {
                // EntryNodes: listed relays only, Guard flag ignored.
                let listed: Vec<&ConsensusRelay> = not_exit
                    .iter()
                    .copied()
                    .filter(|r| entry.matches(r))
                    .collect();
                if listed.is_empty() {
                    return Err(entry.error("EntryNodes"));
                }
                let good = listed.iter().copied().filter(|r| guard_ok(r)).collect();
                vec![good, listed]
            } else {
                let good: Vec<&ConsensusRelay> =
                    not_exit.iter().copied().filter(|r| guard_ok(r)).collect();
                let flag = |v: &[&'c ConsensusRelay]| -> Vec<&'c ConsensusRelay> {
                    v.iter()
                        .copied()
                        .filter(|r| r.flags.contains(RelayFlags::GUARD))
                        .collect()
                };
                vec![flag(&good), good, flag(&not_exit), not_exit]
            };
            pick_tiered(&tiers, rng).ok_or(PathError::NotEnoughRelays {
                need: req.hops,
                have: all.len(),
            })?
        }
    };
    path.push(guard);

    for _ in 0..n_middles {
        let rest: Vec<&ConsensusRelay> = all
            .iter()
            .copied()
            .filter(|r| {
                r.identity != exit.identity
                    && !path.iter().any(|p| p.identity == r.identity)
                    && middle.allows(r)
            })
            .collect();
        let m = match pick_weighted(&rest, rng) {
            Some(m) => m,
            None if middle.restricted() => return Err(middle.error("MiddleNodes")),
            None => {
                return Err(PathError::NotEnoughRelays {
                    need: req.hops,
                    have: all.len(),
                })
            }
        };
        path.push(m);
    }
    path.push(exit);
    Ok(path)
}

/// A spare path for paper 003's path switching (issue 16): the same exit as `primary`
/// (`[guard, middle, exit]`, identities), through an entry and a middle that are on neither
/// leg, chosen as usual (entry: Guard-flagged first; both bandwidth-weighted) among
/// `entry_nodes` / `middle_nodes` when those restrict. `None` when the consensus offers no
/// such pair or the exit left it.
pub fn select_spare_path<'c, R: Rng>(
    consensus: &'c Consensus,
    primary: &[IdentityKey],
    entry_nodes: &[String],
    middle_nodes: &[String],
    rng: &mut R,
) -> Option<Vec<&'c ConsensusRelay>> {
    let exit_id = primary.last()?;
    let exit = consensus
        .relays
        .iter()
        .find(|r| usable(r) && r.identity == *exit_id)?;
    let entry = NodeFilter::new(entry_nodes);
    let middle = NodeFilter::new(middle_nodes);
    let free: Vec<&ConsensusRelay> = consensus
        .relays
        .iter()
        .filter(|r| usable(r) && !primary.contains(&r.identity))
        .collect();
    let entries: Vec<&ConsensusRelay> = free.iter().copied().filter(|r| entry.allows(r)).collect();
    let flagged: Vec<&ConsensusRelay> = entries
        .iter()
        .copied()
        .filter(|r| r.flags.contains(RelayFlags::GUARD))
        .collect();
    // Prefer an entry that leaves a middle to choose.
    let has_middle = |g: &ConsensusRelay| {
        free.iter()
            .any(|m| m.identity != g.identity && middle.allows(m))
    };
    let good = |v: &[&'c ConsensusRelay]| -> Vec<&'c ConsensusRelay> {
        v.iter().copied().filter(|r| has_middle(r)).collect()
    };
    let guard = pick_tiered(&[good(&flagged), good(&entries)], rng)?;
    let middles: Vec<&ConsensusRelay> = free
        .iter()
        .copied()
        .filter(|r| r.identity != guard.identity && middle.allows(r))
        .collect();
    let mid = pick_weighted(&middles, rng)?;
    Some(vec![guard, mid, exit])
}

/// Choose the relays before a fixed last hop `last` (an onion service's introduction or
/// rendezvous point, which need not be an exit nor even in the consensus): a path of
/// `req.hops` relays in all, so `req.hops - 1` are returned, `[guard, middles...]`, distinct
/// from each other and from `last`. `req.target` and `req.exit_nickname` are ignored; the guard
/// preference, `entry_nodes` and `middle_nodes` apply as in [`select_path`]. With fewer usable
/// relays than that, the path is shortened (down to the guard alone), since a small testbed
/// must still reach the point.
pub fn select_path_to<'c, R: Rng>(
    consensus: &'c Consensus,
    req: &PathRequest,
    last: &IdentityKey,
    rng: &mut R,
) -> Result<Vec<&'c ConsensusRelay>, PathError> {
    if req.hops < 2 || req.hops > MAX_HOPS {
        return Err(PathError::BadHopCount(req.hops));
    }
    let others: Vec<&ConsensusRelay> = consensus
        .relays
        .iter()
        .filter(|r| usable(r) && r.identity != *last)
        .collect();
    if others.is_empty() {
        return Err(PathError::NotEnoughRelays {
            need: 2,
            have: others.len() + 1,
        });
    }
    let entry = NodeFilter::new(req.entry_nodes);
    let middle = NodeFilter::new(req.middle_nodes);
    let preferred = req
        .guard
        .and_then(|id| others.iter().copied().find(|r| r.identity == *id))
        .filter(|r| entry.allows(r));
    let guard = match preferred {
        Some(g) => g,
        None => {
            let listed: Vec<&ConsensusRelay> =
                others.iter().copied().filter(|r| entry.allows(r)).collect();
            let flagged: Vec<&ConsensusRelay> = listed
                .iter()
                .copied()
                .filter(|r| entry.restricted() || r.flags.contains(RelayFlags::GUARD))
                .collect();
            pick_tiered(&[flagged, listed], rng).ok_or_else(|| entry.error("EntryNodes"))?
        }
    };
    let mut path = vec![guard];
    for _ in 0..req.hops - 2 {
        let rest: Vec<&ConsensusRelay> = others
            .iter()
            .copied()
            .filter(|r| !path.iter().any(|p| p.identity == r.identity) && middle.allows(r))
            .collect();
        match pick_weighted(&rest, rng) {
            Some(m) => path.push(m),
            None if middle.restricted() && path.len() < 2 => {
                return Err(middle.error("MiddleNodes"))
            }
            None => break,
        }
    }
    Ok(path)
}

/// Choose a guard for a client that has none: bandwidth-weighted among Guard-flagged
/// usable relays, or among all usable relays if none has the flag. With a non-empty
/// `entry_nodes` (Tor's EntryNodes), among the usable relays it lists instead, Guard
/// flag or not; `None` if it lists none.
pub fn choose_guard<'c, R: Rng>(
    consensus: &'c Consensus,
    entry_nodes: &[String],
    rng: &mut R,
) -> Option<&'c ConsensusRelay> {
    let entry = NodeFilter::new(entry_nodes);
    let all: Vec<&ConsensusRelay> = consensus
        .relays
        .iter()
        .filter(|r| usable(r) && entry.allows(r))
        .collect();
    if entry.restricted() {
        return pick_weighted(&all, rng);
    }
    let flagged: Vec<&ConsensusRelay> = all
        .iter()
        .copied()
        .filter(|r| r.flags.contains(RelayFlags::GUARD))
        .collect();
    pick_weighted(&flagged, rng).or_else(|| pick_weighted(&all, rng))
}

/// Parse "host.nickname.exit" -> (host, nickname); None if not .exit notation
/// (the `.exit` suffix is case-insensitive; host and nickname must be non-empty).
pub fn parse_exit_notation(host: &str) -> Option<(&str, &str)> {
    let cut = host.len().checked_sub(".exit".len())?;
    let suffix = host.get(cut..)?;
    if !suffix.eq_ignore_ascii_case(".exit") {
        return None;
    }
    let (name, nick) = host.get(..cut)?.rsplit_once('.')?;
    if name.is_empty() || nick.is_empty() {
        return None;
    }
    Some((name, nick))
}

#[cfg(test)]
mod tests;
