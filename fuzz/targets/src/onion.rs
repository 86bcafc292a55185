//! Targets `onion_msg` and `onion_descriptor`: the onion-service relay messages (and the
//! switching / conflux messages beside them in chive-cell's `msg`), and onion service
//! descriptors as a client or the authority's onion store reads them.

use std::sync::OnceLock;

use chive_cell::{
    ConfluxLink, ConfluxSwitch, Congested, EstablishIntro, EstablishRendezvous, IntroEstablished,
    Introduce, IntroduceAck, IntroducePlaintext, Rendezvous1, Rendezvous2, SwitchAck,
    SwitchConfirm, SwitchConn, SwitchMarker,
};
use chive_crypto::{IdentityKeypair, OnionAddress};
use chive_dir::fuzzing::onion_descriptor_unsigned;
use chive_dir::OnionDescriptor;

use crate::dir::{clock, input, signed_part, Input};

/// The message kinds of `onion_msg`, selected by the input's first byte (modulo their count);
/// the rest is the body.
pub const ONION_KINDS: &[&str] = &[
    "establish_intro",
    "intro_established",
    "introduce",
    "introduce_ack",
    "establish_rendezvous",
    "rendezvous1",
    "rendezvous2",
    "introduce_plaintext",
    "switch_conn",
    "switch_ack",
    "switch_marker",
    "conflux_link",
    "conflux_switch",
    "switch_confirm",
    "congested",
];

/// Secret seed of the onion service whose descriptors the inputs are.
pub(crate) const SERVICE_SEED: [u8; 32] = [5; 32];

/// The seeds' onion service key.
pub(crate) fn service_key() -> &'static IdentityKeypair {
    static K: OnceLock<IdentityKeypair> = OnceLock::new();
    K.get_or_init(|| IdentityKeypair::from_secret_bytes(&SERVICE_SEED))
}

/// The seeds' onion address.
pub(crate) fn service_address() -> OnionAddress {
    OnionAddress::from_key(service_key().public())
}

/// See [`ONION_KINDS`]. Property: every successful decode round-trips through its encoder
/// (the INTRODUCE plaintext without its padding, which the decoder ignores).
pub fn onion_msg(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    // A body is what one relay cell carries: the decoders never see more (the first run found
    // INTRO_ESTABLISHED decoding a 588-byte body its encoder then refused; unreachable, since
    // `parse_relay` yields at most RELAY_DATA_LEN bytes).
    let body = &body[..body.len().min(chive_cell::RELAY_DATA_LEN)];
    match usize::from(kind) % ONION_KINDS.len() {
        0 => round_trip!(EstablishIntro, body, fallible),
        1 => round_trip!(IntroEstablished, body, fallible),
        2 => round_trip!(Introduce, body, fallible),
        3 => round_trip!(IntroduceAck, body, fallible),
        4 => round_trip!(EstablishRendezvous, body),
        5 => round_trip!(Rendezvous1, body, fallible),
        6 => round_trip!(Rendezvous2, body, fallible),
        7 => {
            if let Ok(m) = IntroducePlaintext::decode(body) {
                let enc = m.encode(0).expect("plaintext decoded but cannot encode");
                assert!(enc.len() <= body.len(), "plaintext grew when re-encoded");
                assert_eq!(IntroducePlaintext::decode(&enc).as_ref(), Ok(&m));
                // Padding is ignored, whatever its length.
                let padded = m.encode(body.len() + 7).expect("padded plaintext encodes");
                assert_eq!(IntroducePlaintext::decode(&padded).as_ref(), Ok(&m));
            }
        }
        8 => round_trip!(SwitchConn, body),
        9 => round_trip!(SwitchAck, body),
        10 => round_trip!(SwitchMarker, body),
        11 => round_trip!(ConfluxLink, body),
        12 => round_trip!(ConfluxSwitch, body),
        13 => round_trip!(SwitchConfirm, body),
        14 => round_trip!(Congested, body),
        _ => unreachable!("kind is taken modulo ONION_KINDS.len()"),
    }
}

/// Inputs as for the `descriptor` target (first byte: raw or unsigned mode, and the clock),
/// for the seeds' service address. Property: a descriptor that verifies, signed again by the
/// service, parses to the same value, and that text is a fixed point.
pub fn onion_descriptor(data: &[u8]) {
    let now = clock(data);
    let addr = service_address();
    let parsed = match input(data) {
        Some(Input::Raw(doc)) => OnionDescriptor::verify(&doc, &addr, now),
        Some(Input::Unsigned(signed)) => onion_descriptor_unsigned(&signed, &addr, now),
        None => return,
    };
    let Ok(d) = parsed else {
        return;
    };
    assert_eq!(d.address, addr);
    assert!(!d.intro_points.is_empty() && d.valid_after <= d.valid_until);
    let text = d
        .sign(service_key())
        .expect("the service key signs its own descriptor");
    let again = onion_descriptor_unsigned(signed_part(&text), &addr, now)
        .expect("a re-signed onion descriptor must parse");
    assert_eq!(again, d);
    assert_eq!(
        again.sign(service_key()).expect("signs"),
        text,
        "re-signing is not a fixed point"
    );
}
