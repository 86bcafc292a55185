//! Target `link_handshake`: chive-net's link handshake with the fuzzer as the peer (its VERSIONS,
//! LINK_FEATURES and AUTHENTICATE cells, framed by the link reader's buffer).

use std::sync::{Arc, OnceLock};

use chive_crypto::{IdentityKey, IdentityKeypair};
use chive_net::fuzzing::{handshake, handshake_cells};
use chive_net::{FeatureSet, LinkConfig, LINK_VERSIONS, SPLIT_DIRECTION};

use crate::io::{block_on, FuzzStream};

/// The TLS exporter value both ends see (fixed: there is no TLS session here).
pub(crate) const EXPORTER: [u8; 32] = [0x5e; 32];
/// Read sizes the stream can deliver the peer's bytes in (the reader must not care).
const CHUNKS: [usize; 4] = [1, 7, 512, 1 << 20];

/// Secret seed of our relay identity (used when we are the responder).
const OUR_SEED: [u8; 32] = [1; 32];
/// Secret seed of the peer's identity in the seed inputs.
pub(crate) const PEER_SEED: [u8; 32] = [2; 32];

/// The seed peer's identity (derived once: a scalar multiplication per execution would
/// dominate the target's cost).
pub(crate) fn peer_identity() -> IdentityKey {
    static KEY: OnceLock<IdentityKey> = OnceLock::new();
    *KEY.get_or_init(|| IdentityKeypair::from_secret_bytes(&PEER_SEED).public())
}

/// Our side's configuration: a relay (responder) or an anonymous client (initiator), both
/// offering split-direction.
pub(crate) fn config(responder: bool) -> &'static LinkConfig {
    static RESPONDER: OnceLock<LinkConfig> = OnceLock::new();
    static INITIATOR: OnceLock<LinkConfig> = OnceLock::new();
    let make = |identity: Option<[u8; 32]>| LinkConfig {
        identity: identity.map(|s| Arc::new(IdentityKeypair::from_secret_bytes(&s))),
        features: FeatureSet(SPLIT_DIRECTION),
        socket_buffer: None,
        unsent_limit: None,
        unsent_rtt_rate: None,
        congestion_control: None,
        record_layer: Default::default(),
    };
    if responder {
        RESPONDER.get_or_init(|| make(Some(OUR_SEED)))
    } else {
        INITIATOR.get_or_init(|| make(None))
    }
}

/// The first byte chooses our role (bit 0: responder), whether we expect the seed peer's
/// identity (bit 1) and the read size (bits 2-3); the rest is what the peer sends. Properties:
/// no panic, and no pending (a complete input never leaves the handshake waiting); a success
/// negotiates one of our versions, a subset of our features, and the expected identity when
/// one was expected; an initiator never accepts an unauthenticated responder.
pub fn link_handshake(data: &[u8]) {
    let Some((&mode, peer_bytes)) = data.split_first() else {
        return;
    };
    let responder = mode & 1 != 0;
    let expected = (mode & 2 != 0).then(peer_identity);
    let chunk = CHUNKS[usize::from(mode >> 2) % CHUNKS.len()];
    let cfg = config(responder);
    let mut io = FuzzStream::new(peer_bytes, chunk);
    let Ok(settled) = block_on(handshake(&mut io, responder, cfg, &EXPORTER, expected)) else {
        return;
    };
    assert!(LINK_VERSIONS.contains(&settled.version));
    assert_eq!(settled.features.intersect(cfg.features), settled.features);
    if let Some(e) = expected {
        assert_eq!(settled.peer_identity, Some(e));
    }
    if !responder {
        assert!(
            settled.peer_identity.is_some(),
            "initiator accepted an anonymous responder"
        );
    }
    // Our own cells went out first, whatever the peer sent.
    assert!(!io.written.is_empty());
}

/// What a well-behaved peer sends to us in the given role of ours, with or without a relay
/// identity of its own.
pub(crate) fn peer_cells(we_respond: bool, peer_has_identity: bool) -> Vec<u8> {
    let peer = LinkConfig {
        identity: peer_has_identity
            .then(|| Arc::new(IdentityKeypair::from_secret_bytes(&PEER_SEED))),
        features: FeatureSet(SPLIT_DIRECTION),
        socket_buffer: None,
        unsent_limit: None,
        unsent_rtt_rate: None,
        congestion_control: None,
        record_layer: Default::default(),
    };
    handshake_cells(!we_respond, &peer, &EXPORTER).expect("peer cells encode")
}
