//! The onion service's side of one introduction point: its ESTABLISH_INTRO, and its answer to
//! INTRODUCE2.
//!
//! An INTRODUCE2 is checked in this order, each refusal counted in [`ServiceStats`]: it parses
//! and names this intro point's auth key; hs-ntor's MAC verifies and it decrypts (else
//! `undecryptable`: the intro point or someone else made or changed it); it is not a replay of
//! one already seen (a bounded [`IntroReplayCache`]); its plaintext names a usable rendezvous
//! point. Only then does the service spend a circuit on it: [`IntroduceAccepted`] says where
//! to build to and what to send there, and carries the end-to-end keys for the virtual hop.

use std::net::SocketAddr;

use chive_cell::{
    EstablishIntro, Introduce, IntroducePlaintext, LinkSpec, RelayCommand, Rendezvous1,
};
use chive_crypto::hs_ntor::{self, sha3_mac, HsIntroPublic, HsIntroSecret, HsKeyMaterial};
use chive_crypto::ntor::{NtorPublicKey, NtorSecretKey};
use chive_crypto::{IdentityKey, IdentityKeypair, IntroReplayCache, Replay};
use rand_core::{CryptoRng, RngCore};

use crate::HopSpec;

/// Default size of a service's INTRODUCE2 replay cache (per intro point).
pub const DEFAULT_REPLAY_CACHE: usize = 16 * 1024;

/// Why an INTRODUCE2 was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IntroduceError {
    /// Not an INTRODUCE2 body, or a plaintext that does not parse.
    #[error("malformed INTRODUCE2")]
    Malformed,
    /// For another intro point's auth key.
    #[error("INTRODUCE2 for another auth key")]
    WrongAuthKey,
    /// The MAC did not verify (tampered, or not made with our keys).
    #[error("INTRODUCE2 does not decrypt")]
    Undecryptable,
    /// Seen before.
    #[error("replayed INTRODUCE2")]
    Replayed,
    /// The rendezvous point's link specifiers lack an address or identity.
    #[error("INTRODUCE2 names no usable rendezvous point")]
    BadRendezvousPoint,
}

/// What happened to the INTRODUCE2s an intro point delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Accepted: a rendezvous circuit is to be built.
    pub accepted: u64,
    /// Dropped as [`IntroduceError::Malformed`] or [`IntroduceError::WrongAuthKey`].
    pub malformed: u64,
    /// Dropped as [`IntroduceError::Undecryptable`].
    pub undecryptable: u64,
    /// Dropped as [`IntroduceError::Replayed`].
    pub replayed: u64,
    /// Dropped as [`IntroduceError::BadRendezvousPoint`].
    pub bad_rendezvous_point: u64,
}

/// An accepted introduction.
pub struct IntroduceAccepted {
    /// Where to build the rendezvous circuit.
    pub rendezvous_point: HopSpec,
    /// The relay command and body to send to it once built (RENDEZVOUS1).
    pub rendezvous1: (RelayCommand, Vec<u8>),
    /// End-to-end keys; the service attaches the virtual hop with `service_side = true`.
    pub keys: HsKeyMaterial,
}

/// The service's keys and state for one introduction point.
pub struct OnionServiceIntro {
    auth: IdentityKeypair,
    secret: HsIntroSecret,
    replay: IntroReplayCache,
    /// Counters.
    pub stats: ServiceStats,
}

impl OnionServiceIntro {
    /// Fresh keys for an intro point of the service whose subcredential is given.
    pub fn generate<R: RngCore + CryptoRng>(
        rng: &mut R,
        subcredential: [u8; 32],
        replay_capacity: usize,
    ) -> Self {
        let auth = IdentityKeypair::generate(rng);
        let secret = HsIntroSecret {
            auth_key: auth.public(),
            enc_secret: NtorSecretKey::generate(rng),
            subcredential,
        };
        OnionServiceIntro {
            auth,
            secret,
            replay: IntroReplayCache::new(replay_capacity),
            stats: ServiceStats::default(),
        }
    }

    /// What the descriptor publishes for this intro point (auth key, `B`, subcredential).
    pub fn public(&self) -> HsIntroPublic {
        self.secret.public()
    }

    /// ESTABLISH_INTRO for a circuit whose handshake with the intro relay gave `kh`.
    pub fn establish_intro(&self, kh: &[u8; 20]) -> Vec<u8> {
        let mut est = EstablishIntro {
            auth_key: *self.auth.public().as_bytes(),
            extensions: vec![],
            handshake_auth: [0; 32],
            sig: [0; 64],
        };
        // No extensions: neither call can fail, and the result fits a relay cell.
        est.handshake_auth = sha3_mac(kh, &est.mac_bytes().unwrap_or_default());
        est.sig = self.auth.sign(&est.signed_bytes().unwrap_or_default()).0;
        est.encode().unwrap_or_default()
    }

    /// INTRODUCE2 arrived on this intro point's circuit.
    pub fn on_introduce2<R: RngCore + CryptoRng>(
        &mut self,
        rng: &mut R,
        body: &[u8],
    ) -> Result<IntroduceAccepted, IntroduceError> {
        let r = self.open(rng, body);
        match r {
            Ok(_) => self.stats.accepted += 1,
            Err(IntroduceError::Malformed | IntroduceError::WrongAuthKey) => {
                self.stats.malformed += 1
            }
            Err(IntroduceError::Undecryptable) => self.stats.undecryptable += 1,
            Err(IntroduceError::Replayed) => self.stats.replayed += 1,
            Err(IntroduceError::BadRendezvousPoint) => self.stats.bad_rendezvous_point += 1,
        }
        r
    }

    fn open<R: RngCore + CryptoRng>(
        &mut self,
        rng: &mut R,
        body: &[u8],
    ) -> Result<IntroduceAccepted, IntroduceError> {
        let intro = Introduce::decode(body).map_err(|_| IntroduceError::Malformed)?;
        if intro.auth_key != *self.auth.public().as_bytes() {
            return Err(IntroduceError::WrongAuthKey);
        }
        let header = intro.header().map_err(|_| IntroduceError::Malformed)?;
        let opened = hs_ntor::service_open_introduce(&self.secret, &header, &intro.encrypted)
            .map_err(|_| IntroduceError::Undecryptable)?;
        // Replays are checked after the MAC, so that junk cannot fill the cache.
        if self.replay.check_and_insert(&intro.encrypted) == Replay::Replayed {
            return Err(IntroduceError::Replayed);
        }
        let plain =
            IntroducePlaintext::decode(&opened.plaintext).map_err(|_| IntroduceError::Malformed)?;
        let rendezvous_point = hop_from_link_specs(&plain.link_specifiers, plain.onion_key)
            .ok_or(IntroduceError::BadRendezvousPoint)?;
        let (info, keys) = hs_ntor::service_rendezvous(rng, &self.secret, &opened.client_pk)
            .map_err(|_| IntroduceError::Undecryptable)?;
        let r1 = Rendezvous1 {
            cookie: plain.cookie,
            handshake_info: info.to_vec(),
        }
        .encode()
        .map_err(|_| IntroduceError::Malformed)?;
        Ok(IntroduceAccepted {
            rendezvous_point,
            rendezvous1: (RelayCommand::RENDEZVOUS1, r1),
            keys,
        })
    }

    /// Has the replay cache admitted as many as it holds (time to rotate this intro point)?
    pub fn should_rotate(&self) -> bool {
        self.replay.should_rotate()
    }
}

/// The link specifiers a client gives for its rendezvous point: address, legacy id, Ed25519
/// identity (what [`hop_from_link_specs`] reads back).
pub fn link_specs(hop: &HopSpec) -> Vec<LinkSpec> {
    let addr = match hop.addr {
        SocketAddr::V4(a) => LinkSpec::Ipv4(a),
        SocketAddr::V6(a) => LinkSpec::Ipv6(a),
    };
    vec![
        addr,
        LinkSpec::LegacyId(hop.identity.ntor_id()),
        LinkSpec::Ed25519Id(*hop.identity.as_bytes()),
    ]
}

/// The relay the link specifiers name: an address and an Ed25519 identity are required (chive
/// extends by identity); a legacy id, if given, must match it.
pub fn hop_from_link_specs(specs: &[LinkSpec], onion_key: [u8; 32]) -> Option<HopSpec> {
    let mut addr = None;
    let mut ed = None;
    let mut legacy = None;
    for s in specs {
        match s {
            LinkSpec::Ipv4(a) if addr.is_none() => addr = Some(SocketAddr::V4(*a)),
            LinkSpec::Ipv6(a) if addr.is_none() => addr = Some(SocketAddr::V6(*a)),
            LinkSpec::Ed25519Id(k) => ed = Some(*k),
            LinkSpec::LegacyId(id) => legacy = Some(*id),
            _ => {}
        }
    }
    let identity = IdentityKey::from_bytes(&ed?).ok()?;
    if legacy.is_some_and(|l| l != identity.ntor_id()) {
        return None;
    }
    Some(HopSpec {
        identity,
        ntor_key: NtorPublicKey(onion_key),
        addr: addr?,
    })
}
