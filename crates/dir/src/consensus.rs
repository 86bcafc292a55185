//! The consensus: the authority's signed list of relays, their flags and the network
//! parameters, plus the pure functions the authority uses to build it.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;

use chive_crypto::{IdentityKey, IdentityKeypair};
use serde::{Deserialize, Serialize};

use crate::descriptor::{check_relay, parse_key32, RelayDescriptor};
use crate::document;
use crate::params::NetParams;
use crate::policy::ExitPolicy;
use crate::DirError;

/// Largest accepted consensus document, in bytes.
pub const MAX_CONSENSUS_LEN: usize = 16 * 1024 * 1024;
/// Most relays one consensus may list.
pub const MAX_RELAYS: usize = 10_000;
/// Clock skew tolerated on both ends of a consensus' validity, in seconds.
pub const CONSENSUS_CLOCK_SKEW: u64 = 60;
/// Header line of a consensus document.
const HEADER: &str = "chive-consensus 1";

/// A set of relay flags (Tor's names), as a small bit set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RelayFlags(u32);

impl RelayFlags {
    /// Suitable as the first hop.
    pub const GUARD: RelayFlags = RelayFlags(1 << 0);
    /// Exit policy allows some exit traffic.
    pub const EXIT: RelayFlags = RelayFlags(1 << 1);
    /// Bandwidth at least the authority's Fast threshold.
    pub const FAST: RelayFlags = RelayFlags(1 << 2);
    /// Uptime at least the authority's Stable threshold.
    pub const STABLE: RelayFlags = RelayFlags(1 << 3);
    /// Currently running (listed with a fresh descriptor).
    pub const RUNNING: RelayFlags = RelayFlags(1 << 4);
    /// Valid descriptor.
    pub const VALID: RelayFlags = RelayFlags(1 << 5);

    /// Names in document order (alphabetical, as Tor lists them).
    const NAMES: [(RelayFlags, &'static str); 6] = [
        (RelayFlags::EXIT, "Exit"),
        (RelayFlags::FAST, "Fast"),
        (RelayFlags::GUARD, "Guard"),
        (RelayFlags::RUNNING, "Running"),
        (RelayFlags::STABLE, "Stable"),
        (RelayFlags::VALID, "Valid"),
    ];

    /// No flags.
    pub const fn empty() -> RelayFlags {
        RelayFlags(0)
    }

    /// Whether every flag in `other` is set.
    pub const fn contains(self, other: RelayFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Set the flags in `other`.
    pub fn insert(&mut self, other: RelayFlags) {
        self.0 |= other.0;
    }

    /// Clear the flags in `other`.
    pub fn remove(&mut self, other: RelayFlags) {
        self.0 &= !other.0;
    }

    /// The flag names, e.g. `["Exit", "Running"]`.
    pub fn names(self) -> Vec<&'static str> {
        RelayFlags::NAMES
            .iter()
            .filter(|(f, _)| self.contains(*f))
            .map(|(_, n)| *n)
            .collect()
    }

    /// Flags from names; unknown names are ignored (a newer authority may add flags).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> RelayFlags {
        let mut out = RelayFlags::empty();
        for n in names {
            if let Some((f, _)) = RelayFlags::NAMES
                .iter()
                .find(|(_, name)| *name == n.as_ref())
            {
                out.insert(*f);
            }
        }
        out
    }
}

impl std::ops::BitOr for RelayFlags {
    type Output = RelayFlags;
    fn bitor(self, rhs: RelayFlags) -> RelayFlags {
        RelayFlags(self.0 | rhs.0)
    }
}

impl fmt::Display for RelayFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(" "))
    }
}

impl fmt::Debug for RelayFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RelayFlags({self})")
    }
}

/// The authority's thresholds for flags.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlagPolicy {
    /// Fast needs at least this bandwidth (bytes/s). 0 in test networks.
    pub fast_min: u64,
    /// Stable needs at least this uptime (seconds).
    pub stable_min_uptime: u64,
    /// Test networks: every Fast relay gets Guard (Tor's TestingDirAuthVoteGuard-like).
    pub all_guards: bool,
}

/// One relay as listed in the consensus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsensusRelay {
    /// Nickname (not unique; the identity is).
    pub nickname: String,
    /// Ed25519 identity.
    pub identity: IdentityKey,
    /// ntor onion key (x25519 public key).
    pub ntor_key: [u8; 32],
    /// ORPort address.
    pub address: SocketAddr,
    /// Bytes per second, the weight for path selection.
    pub bandwidth: u64,
    /// Flags the authority assigned.
    pub flags: RelayFlags,
    /// The relay's exit policy.
    pub exit_policy: ExitPolicy,
    /// Feature bits from its descriptor.
    pub features: u64,
}

/// A consensus document's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consensus {
    /// Start of validity (UNIX seconds).
    pub valid_after: u64,
    /// When clients should fetch a newer one.
    pub fresh_until: u64,
    /// End of validity: after this (plus skew) the consensus is refused.
    pub valid_until: u64,
    /// Network parameters.
    pub params: NetParams,
    /// The relays, sorted by identity.
    pub relays: Vec<ConsensusRelay>,
}

#[derive(Serialize, Deserialize)]
struct RelayBody {
    nickname: String,
    identity: String,
    ntor_key: String,
    address: SocketAddr,
    bandwidth: u64,
    flags: Vec<String>,
    exit_policy: ExitPolicy,
    features: u64,
}

#[derive(Serialize, Deserialize)]
struct Body {
    valid_after: u64,
    fresh_until: u64,
    valid_until: u64,
    params: NetParams,
    relays: Vec<RelayBody>,
}

impl Consensus {
    /// The signed text document (header, JSON body, signature line).
    pub fn sign(&self, key: &IdentityKeypair) -> String {
        let body = Body {
            valid_after: self.valid_after,
            fresh_until: self.fresh_until,
            valid_until: self.valid_until,
            params: self.params.clone(),
            relays: self
                .relays
                .iter()
                .map(|r| RelayBody {
                    nickname: r.nickname.clone(),
                    identity: r.identity.to_hex(),
                    ntor_key: hex::encode(r.ntor_key),
                    address: r.address,
                    bandwidth: r.bandwidth,
                    flags: r.flags.names().into_iter().map(String::from).collect(),
                    exit_policy: r.exit_policy.clone(),
                    features: r.features,
                })
                .collect(),
        };
        // Serializing plain structs with string keys cannot fail.
        let json = serde_json::to_string(&body).unwrap_or_default();
        document::sign(HEADER, &json, key)
    }

    /// Check a consensus document: size, then the signature by `authority` (before
    /// anything in the body is believed), then the body, then that `now` lies within
    /// `valid_after..=valid_until` give or take [`CONSENSUS_CLOCK_SKEW`].
    pub fn verify(doc: &str, authority: &IdentityKey, now: u64) -> Result<Consensus, DirError> {
        if doc.len() > MAX_CONSENSUS_LEN {
            return Err(DirError::TooLarge {
                what: "consensus",
                size: doc.len(),
                max: MAX_CONSENSUS_LEN,
            });
        }
        let (header, body) = document::verify(doc, authority).ok_or(DirError::BadSignature)?;
        Self::parse_signed(header, body, now)
    }

    /// The checks of [`Consensus::verify`] after the signature: header, body, validity at `now`.
    pub(crate) fn parse_signed(header: &str, body: &str, now: u64) -> Result<Consensus, DirError> {
        if header != HEADER {
            // Signed by the authority, but not a consensus (or a newer format).
            return Err(DirError::Malformed(format!(
                "expected header {HEADER:?}, got {:?}",
                header.chars().take(40).collect::<String>()
            )));
        }
        let b: Body = serde_json::from_str(body)
            .map_err(|e| DirError::Malformed(format!("consensus body: {e}")))?;
        if !(b.valid_after <= b.fresh_until && b.fresh_until <= b.valid_until) {
            return Err(DirError::Malformed(
                "consensus times out of order (valid_after <= fresh_until <= valid_until)".into(),
            ));
        }
        if b.relays.len() > MAX_RELAYS {
            return Err(DirError::Malformed(format!(
                "more than {MAX_RELAYS} relays"
            )));
        }
        let mut seen = HashSet::new();
        let mut relays = Vec::with_capacity(b.relays.len());
        for r in b.relays {
            check_relay(&r.nickname, &r.address)?;
            let identity = IdentityKey::from_hex(&r.identity).map_err(|_| {
                DirError::Malformed(format!("relay {} has a bad identity key", r.nickname))
            })?;
            if !seen.insert(identity) {
                return Err(DirError::Malformed(format!(
                    "relay identity {identity} listed twice"
                )));
            }
            relays.push(ConsensusRelay {
                ntor_key: parse_key32(&r.ntor_key, "ntor key")?,
                nickname: r.nickname,
                identity,
                address: r.address,
                bandwidth: r.bandwidth,
                flags: RelayFlags::from_names(&r.flags),
                exit_policy: r.exit_policy,
                features: r.features,
            });
        }
        if now.saturating_add(CONSENSUS_CLOCK_SKEW) < b.valid_after {
            return Err(DirError::NotYetValid {
                valid_after: b.valid_after,
                now,
            });
        }
        if now > b.valid_until.saturating_add(CONSENSUS_CLOCK_SKEW) {
            return Err(DirError::Expired {
                valid_until: b.valid_until,
                now,
            });
        }
        Ok(Consensus {
            valid_after: b.valid_after,
            fresh_until: b.fresh_until,
            valid_until: b.valid_until,
            params: b.params,
            relays,
        })
    }

    /// The first relay with this nickname (ASCII case-insensitive, like hostnames).
    pub fn relay_by_nickname(&self, nickname: &str) -> Option<&ConsensusRelay> {
        self.relays
            .iter()
            .find(|r| r.nickname.eq_ignore_ascii_case(nickname))
    }

    /// The relay with this identity.
    pub fn relay_by_identity(&self, identity: &IdentityKey) -> Option<&ConsensusRelay> {
        self.relays.iter().find(|r| r.identity == *identity)
    }
}

/// The lower median of the bandwidths of `all` (0 if empty): at least half the relays
/// are at or above it.
fn median_bandwidth(all: &[RelayDescriptor]) -> u64 {
    let mut bws: Vec<u64> = all.iter().map(|d| d.bandwidth).collect();
    bws.sort_unstable();
    match bws.len() {
        0 => 0,
        n => bws.get((n - 1) / 2).copied().unwrap_or(0),
    }
}

/// The flags the authority gives `desc`, among the listed relays `all`:
/// - Running and Valid: always (the caller lists only relays with a fresh, verified
///   descriptor).
/// - Exit: its exit policy accepts some address and port.
/// - Fast: bandwidth >= `policy.fast_min`.
/// - Stable: uptime >= `policy.stable_min_uptime`.
/// - Guard: Fast and either `policy.all_guards`, or Stable with bandwidth >= the (lower)
///   median bandwidth of `all`.
pub fn assign_flags(
    desc: &RelayDescriptor,
    all: &[RelayDescriptor],
    policy: &FlagPolicy,
) -> RelayFlags {
    assign_flags_with_median(desc, median_bandwidth(all), policy)
}

fn assign_flags_with_median(
    desc: &RelayDescriptor,
    median: u64,
    policy: &FlagPolicy,
) -> RelayFlags {
    let mut flags = RelayFlags::RUNNING | RelayFlags::VALID;
    if desc.exit_policy.is_exit() {
        flags.insert(RelayFlags::EXIT);
    }
    let fast = desc.bandwidth >= policy.fast_min;
    let stable = desc.uptime >= policy.stable_min_uptime;
    if fast {
        flags.insert(RelayFlags::FAST);
    }
    if stable {
        flags.insert(RelayFlags::STABLE);
    }
    if fast && (policy.all_guards || (stable && desc.bandwidth >= median)) {
        flags.insert(RelayFlags::GUARD);
    }
    flags
}

/// Build the consensus from the current descriptors. If an identity appears more than
/// once, its most recently published descriptor counts. Relays are sorted by identity;
/// at most [`MAX_RELAYS`] are listed (the highest bandwidths). Validity: `valid_after =
/// now`, `fresh_until = now + interval`, `valid_until = now + validity` (`validity` 0
/// means 3 x interval; never before `fresh_until`).
pub fn build_consensus(
    descs: &[RelayDescriptor],
    params: NetParams,
    policy: &FlagPolicy,
    now: u64,
    interval: u64,
    validity: u64,
) -> Consensus {
    let mut latest: BTreeMap<IdentityKey, &RelayDescriptor> = BTreeMap::new();
    for d in descs {
        match latest.get(&d.identity) {
            Some(old) if old.published > d.published => {}
            _ => {
                latest.insert(d.identity, d);
            }
        }
    }
    let mut chosen: Vec<RelayDescriptor> = latest.into_values().cloned().collect();
    if chosen.len() > MAX_RELAYS {
        chosen.sort_by_key(|d| std::cmp::Reverse(d.bandwidth));
        chosen.truncate(MAX_RELAYS);
        chosen.sort_by_key(|d| d.identity);
    }
    let median = median_bandwidth(&chosen);
    let relays = chosen
        .iter()
        .map(|d| ConsensusRelay {
            nickname: d.nickname.clone(),
            identity: d.identity,
            ntor_key: d.ntor_key,
            address: d.address,
            bandwidth: d.bandwidth,
            flags: assign_flags_with_median(d, median, policy),
            exit_policy: d.exit_policy.clone(),
            features: d.features,
        })
        .collect();
    let validity = if validity == 0 {
        interval.saturating_mul(3)
    } else {
        validity
    };
    let fresh_until = now.saturating_add(interval);
    Consensus {
        valid_after: now,
        fresh_until,
        valid_until: now.saturating_add(validity).max(fresh_until),
        params,
        relays,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::tests::{desc, keypair};

    const NOW: u64 = 1_700_000_000;

    fn sample() -> (Consensus, IdentityKeypair) {
        let descs: Vec<RelayDescriptor> =
            (1..=4u8).map(|n| desc(n, u64::from(n) * 1000).0).collect();
        let mut params = NetParams::new();
        params.set("circwindow", 101).unwrap();
        params.set("FutureParam", -7).unwrap();
        let c = build_consensus(&descs, params, &FlagPolicy::default(), NOW, 60, 0);
        (c, keypair(200))
    }

    #[test]
    fn round_trip() {
        let (c, auth) = sample();
        let doc = c.sign(&auth);
        let back = Consensus::verify(&doc, &auth.public(), NOW + 10).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.params.circwindow(), 101);
        assert_eq!(back.params.get_raw("FutureParam"), Some(-7));
        assert_eq!(back.relays.len(), 4);
        assert_eq!(
            back.relay_by_nickname("RELAY2").map(|r| r.bandwidth),
            Some(2000)
        );
        let id3 = keypair(3).public();
        assert_eq!(
            back.relay_by_identity(&id3).map(|r| r.nickname.as_str()),
            Some("relay3")
        );
        assert!(back.relay_by_nickname("nobody").is_none());
    }

    #[test]
    fn every_flipped_byte_is_bad_signature() {
        let (mut c, auth) = sample();
        c.relays.truncate(1); // keep the loop short
        let doc = c.sign(&auth);
        for i in 0..doc.len() {
            for bit in [0x01u8, 0x20, 0x80] {
                let mut bytes = doc.clone().into_bytes();
                bytes[i] ^= bit;
                let Ok(t) = String::from_utf8(bytes) else {
                    continue;
                };
                assert_eq!(
                    Consensus::verify(&t, &auth.public(), NOW),
                    Err(DirError::BadSignature),
                    "byte {i} ^ {bit:#x}"
                );
            }
        }
        // Truncation and appended junk too.
        assert_eq!(
            Consensus::verify(&doc[..doc.len() - 1], &auth.public(), NOW),
            Err(DirError::BadSignature)
        );
        assert_eq!(
            Consensus::verify(&format!("{doc}x\n"), &auth.public(), NOW),
            Err(DirError::BadSignature)
        );
    }

    #[test]
    fn wrong_authority_is_bad_signature() {
        let (c, auth) = sample();
        let doc = c.sign(&auth);
        let err = Consensus::verify(&doc, &keypair(201).public(), NOW).unwrap_err();
        assert_eq!(err, DirError::BadSignature);
        assert!(err.to_string().contains("signed by another authority"));
        // A relay descriptor signed with the authority key is not a consensus: the
        // header (inside the signed bytes) tells them apart.
        let d = desc(9, 1).0.sign(&auth);
        assert!(matches!(
            Consensus::verify(&d, &auth.public(), NOW),
            Err(DirError::Malformed(m)) if m.contains("expected header")
        ));
    }

    #[test]
    fn validity_window_with_skew() {
        let (c, auth) = sample();
        let doc = c.sign(&auth);
        let pk = auth.public();
        assert_eq!(c.valid_until, NOW + 180, "validity 0 = 3 x interval");
        assert!(
            Consensus::verify(&doc, &pk, NOW - 60).is_ok(),
            "60 s skew early"
        );
        assert_eq!(
            Consensus::verify(&doc, &pk, NOW - 61),
            Err(DirError::NotYetValid {
                valid_after: NOW,
                now: NOW - 61
            })
        );
        assert!(
            Consensus::verify(&doc, &pk, NOW + 180 + 60).is_ok(),
            "60 s skew late"
        );
        let err = Consensus::verify(&doc, &pk, NOW + 1000).unwrap_err();
        assert_eq!(
            err,
            DirError::Expired {
                valid_until: NOW + 180,
                now: NOW + 1000
            }
        );
        assert!(err.to_string().contains("expired"), "{err}");
    }

    #[test]
    fn oversized_and_bad_bodies() {
        let auth = keypair(200);
        let big = "x".repeat(MAX_CONSENSUS_LEN + 1);
        assert!(matches!(
            Consensus::verify(&big, &auth.public(), NOW),
            Err(DirError::TooLarge {
                what: "consensus",
                ..
            })
        ));
        // Correctly signed garbage is Malformed, not BadSignature.
        let doc = document::sign(HEADER, "{not json", &auth);
        assert!(matches!(
            Consensus::verify(&doc, &auth.public(), NOW),
            Err(DirError::Malformed(_))
        ));
        let doc = document::sign(
            HEADER,
            r#"{"valid_after":10,"fresh_until":5,"valid_until":20,"params":{},"relays":[]}"#,
            &auth,
        );
        assert!(matches!(
            Consensus::verify(&doc, &auth.public(), 10),
            Err(DirError::Malformed(m)) if m.contains("out of order")
        ));
        // Duplicate identities are refused.
        let (mut c, _) = sample();
        let first = c.relays[0].clone();
        c.relays.push(first);
        assert!(matches!(
            Consensus::verify(&c.sign(&auth), &auth.public(), NOW),
            Err(DirError::Malformed(m)) if m.contains("twice")
        ));
    }

    #[test]
    fn flag_rules() {
        let all: Vec<RelayDescriptor> = [
            (1u8, 100u64, 10u64),
            (2, 200, 10),
            (3, 300, 1000),
            (4, 400, 1000),
        ]
        .iter()
        .map(|&(n, bw, up)| {
            let mut d = desc(n, bw).0;
            d.uptime = up;
            d
        })
        .collect();
        let strict = FlagPolicy {
            fast_min: 150,
            stable_min_uptime: 100,
            all_guards: false,
        };
        let f: Vec<RelayFlags> = all.iter().map(|d| assign_flags(d, &all, &strict)).collect();
        for x in &f {
            assert!(x.contains(RelayFlags::RUNNING | RelayFlags::VALID));
            assert!(
                x.contains(RelayFlags::EXIT),
                "accept 127.0.0.0/8 is an exit policy"
            );
        }
        assert!(!f[0].contains(RelayFlags::FAST));
        assert!(f[1].contains(RelayFlags::FAST) && !f[1].contains(RelayFlags::STABLE));
        assert!(f[2].contains(RelayFlags::FAST | RelayFlags::STABLE));
        // Lower median of 100,200,300,400 is 200: 3 and 4 are Fast+Stable and above it.
        assert!(!f[0].contains(RelayFlags::GUARD));
        assert!(!f[1].contains(RelayFlags::GUARD), "not Stable");
        assert!(f[2].contains(RelayFlags::GUARD));
        assert!(f[3].contains(RelayFlags::GUARD));

        let test_net = FlagPolicy {
            all_guards: true,
            ..strict.clone()
        };
        let g: Vec<RelayFlags> = all
            .iter()
            .map(|d| assign_flags(d, &all, &test_net))
            .collect();
        assert!(
            !g[0].contains(RelayFlags::GUARD),
            "all_guards still needs Fast"
        );
        assert!(
            g[1].contains(RelayFlags::GUARD),
            "all_guards: Fast is enough"
        );

        let mut non_exit = all[3].clone();
        non_exit.exit_policy = ExitPolicy::reject_all();
        assert!(!assign_flags(&non_exit, &all, &strict).contains(RelayFlags::EXIT));

        let defaults = FlagPolicy::default();
        let h = assign_flags(&all[0], &all, &defaults);
        assert!(
            h.contains(RelayFlags::FAST | RelayFlags::STABLE),
            "test-network defaults"
        );
        assert!(!h.contains(RelayFlags::GUARD), "below the median");
    }

    #[test]
    fn build_dedups_and_sorts() {
        let (mut old, _) = desc(1, 10);
        old.published = NOW - 100;
        let (mut new, _) = desc(1, 20);
        new.published = NOW - 10;
        let (other, _) = desc(2, 30);
        let c = build_consensus(
            &[new.clone(), other, old],
            NetParams::new(),
            &FlagPolicy::default(),
            NOW,
            5,
            7,
        );
        assert_eq!(c.relays.len(), 2);
        assert_eq!(
            c.relay_by_identity(&new.identity).map(|r| r.bandwidth),
            Some(20)
        );
        assert!(c.relays.windows(2).all(|w| w[0].identity < w[1].identity));
        assert_eq!(
            (c.valid_after, c.fresh_until, c.valid_until),
            (NOW, NOW + 5, NOW + 7)
        );
        let c2 = build_consensus(&[], NetParams::new(), &FlagPolicy::default(), NOW, 10, 3);
        assert_eq!(c2.valid_until, NOW + 10, "never before fresh_until");
    }

    #[test]
    fn flags_names_round_trip() {
        let f = RelayFlags::GUARD | RelayFlags::EXIT | RelayFlags::RUNNING;
        assert_eq!(f.names(), vec!["Exit", "Guard", "Running"]);
        assert_eq!(
            RelayFlags::from_names(&["Exit", "Guard", "Running", "HSDir"]),
            f
        );
        let mut g = f;
        g.remove(RelayFlags::EXIT);
        assert!(!g.contains(RelayFlags::EXIT) && g.contains(RelayFlags::GUARD));
        assert_eq!(f.to_string(), "Exit Guard Running");
    }
}
