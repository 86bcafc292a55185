//! Target `ntor`: the circuit handshakes on bytes from the network — the relay's side of ntor
//! on a CREATE2 onionskin, the client's on a CREATED2 reply, the onion service's opening of an
//! INTRODUCE2 and the client's check of RENDEZVOUS2 (hs-ntor), and both sides of ntor v3
//! (CREATE2 with the congestion-control request, CREATED2 with the answer).
//! For ntor v3 every change is refused: the MAC covers ID, B, X and the encrypted message
//! (its key comes from Bx), AUTH covers Y and the encrypted reply.
//!
//! A fuzzer cannot forge a MAC, so arbitrary bytes would only ever reach the first length check.
//! Instead every input is a *change* to a genuine message, made with fixed keys: the first byte
//! picks the message (modulo [`NTOR_KINDS`]'s length; bit 7 asks for the message to be cut to the
//! input's length), the rest is XORed into the genuine message byte by byte and, where it is
//! longer, appended. Properties: no panic; the unchanged message is accepted and both sides
//! derive the same keys (or the same plaintext); a changed message is refused, except where the
//! protocol lets the sender choose the bytes (the client's ephemeral key X in an onionskin: the
//! relay answers, and the genuine client then refuses that answer).

use std::sync::OnceLock;

use chive_crypto::hs_ntor::{
    client_introduce_with_secret, client_rendezvous, service_open_introduce,
    service_rendezvous_with_secret, HsIntroPublic, HsNtorClientState,
};
use chive_crypto::ntor::{
    client_create_with_secret, client_finish, server_handshake_with_secret, NtorClientState,
};
use chive_crypto::ntor_v3 as v3;
use chive_crypto::{HsIntroSecret, IdentityKeypair, NtorPublicKey, NtorSecretKey};

use crate::changed;

/// The message kinds, selected by the input's first byte.
pub const NTOR_KINDS: &[&str] = &[
    "onionskin",
    "created2",
    "introduce2",
    "rendezvous2",
    "ntor3_create2",
    "ntor3_created2",
];

const RELAY_ED_ID: [u8; 32] = [0x12; 32];
/// The messages ntor v3 carries: proposal 324's request and answer.
const V3_REQUEST: &[u8] = &[1, 0x01, 0];
const V3_ANSWER: &[u8] = &[1, 0x02, 1, 100];

const RELAY_ID: [u8; 20] = [0x11; 20];
const CLIENT_X: [u8; 32] = [0x22; 32];
const RELAY_Y: [u8; 32] = [0x33; 32];
/// INTRODUCE2's cleartext header (covered by the MAC, not encrypted).
const INTRO_HEADER: &[u8] = b"introduce2 header: auth key, extensions";
const INTRO_PLAINTEXT: &[u8] = b"rendezvous cookie, onion key, link specifiers";

fn relay_key() -> NtorSecretKey {
    NtorSecretKey::from_bytes([0x44; 32])
}

fn intro_secret() -> HsIntroSecret {
    HsIntroSecret {
        auth_key: IdentityKeypair::from_secret_bytes(&[0x55; 32]).public(),
        enc_secret: NtorSecretKey::from_bytes([0x66; 32]),
        subcredential: [0x77; 32],
    }
}

/// The fixed keys (and their public halves), the genuine messages and what the receiving side
/// derives from them, made once per process: an execution then runs only the side that reads
/// the changed message. Client states are single use by design (no `Clone`), so the few kinds
/// that need one make it again with the same fixed secret, from the cached public keys (each
/// `public()` is a scalar multiplication, and the intro point's key an Ed25519 key expansion:
/// session 20 took them out of the per-input work).
struct Genuine {
    key: NtorSecretKey,
    key_pub: NtorPublicKey,
    intro: HsIntroSecret,
    intro_pub: HsIntroPublic,
    skin: Vec<u8>,
    reply: Vec<u8>,
    relay_km: Vec<u8>,
    introduce: Vec<u8>,
    info: Vec<u8>,
    service_km: Vec<u8>,
    v3_create: Vec<u8>,
    v3_reply: Vec<u8>,
    v3_km: Vec<u8>,
}

fn genuine() -> &'static Genuine {
    static GENUINE: OnceLock<Genuine> = OnceLock::new();
    GENUINE.get_or_init(|| {
        let key = relay_key();
        let key_pub = key.public();
        let intro = intro_secret();
        let intro_pub = intro.public();
        let (_, skin) = client_create_with_secret(CLIENT_X, &RELAY_ID, &key_pub);
        let (reply, relay_km) = server_handshake_with_secret(RELAY_Y, &RELAY_ID, &key, &skin)
            .expect("the genuine onionskin is accepted");
        let (_, introduce) = introduce_state(&intro_pub);
        let opened = service_open_introduce(&intro, INTRO_HEADER, &introduce)
            .expect("the genuine INTRODUCE2 opens");
        let (info, service_km) = service_rendezvous_with_secret(RELAY_Y, &intro, &opened.client_pk)
            .expect("the genuine client key is a valid point");
        let (_, v3_create) = v3_state(&key_pub);
        let (v3_reply, v3_km) = v3::server_open_with_secret(
            RELAY_Y,
            &RELAY_ED_ID,
            &key,
            &v3_create,
            v3::CIRCUIT_VERIFICATION,
        )
        .expect("the genuine ntor v3 CREATE2 opens")
        .finish(V3_ANSWER)
        .expect("the genuine client key is a valid point");
        Genuine {
            key,
            key_pub,
            intro,
            intro_pub,
            v3_create,
            v3_reply,
            v3_km: v3_km.0.to_vec(),
            skin: skin.to_vec(),
            reply: reply.to_vec(),
            relay_km: relay_km.0.to_vec(),
            introduce,
            info: info.to_vec(),
            service_km: service_km.0.to_vec(),
        }
    })
}

fn create_state(key_pub: &NtorPublicKey) -> NtorClientState {
    client_create_with_secret(CLIENT_X, &RELAY_ID, key_pub).0
}

fn v3_state(key_pub: &NtorPublicKey) -> (v3::NtorV3ClientState, Vec<u8>) {
    v3::client_create_with_secret(
        CLIENT_X,
        &RELAY_ED_ID,
        key_pub,
        V3_REQUEST,
        v3::CIRCUIT_VERIFICATION,
    )
}

fn introduce_state(intro_pub: &HsIntroPublic) -> (HsNtorClientState, Vec<u8>) {
    client_introduce_with_secret(CLIENT_X, intro_pub, INTRO_HEADER, INTRO_PLAINTEXT)
        .expect("the service's key is a valid point")
}

/// The fuzz target.
pub fn ntor(data: &[u8]) {
    let Some((&select, input)) = data.split_first() else {
        return;
    };
    let cut = select & 0x80 != 0;
    let genuine = genuine();
    match usize::from(select & 0x7f) % NTOR_KINDS.len() {
        0 => {
            let skin = &genuine.skin;
            let msg = changed(skin, input, cut);
            let served = server_handshake_with_secret(RELAY_Y, &RELAY_ID, &genuine.key, &msg);
            if msg == *skin {
                let (reply, relay_km) = served.expect("the genuine onionskin is accepted");
                let client_km = client_finish(create_state(&genuine.key_pub), &reply)
                    .expect("the genuine reply checks");
                assert_eq!(client_km.0, relay_km.0, "both sides derive the same keys");
            } else if let Ok((reply, _)) = served {
                // Only X may differ (ID and B are checked, the length is fixed): the relay
                // answers a key the genuine client did not send, and that client refuses it.
                assert_eq!(msg[..52], skin[..52], "relay accepted a wrong ID or B");
                assert!(
                    client_finish(create_state(&genuine.key_pub), &reply).is_err(),
                    "client accepted a reply to another X"
                );
            }
        }
        1 => {
            let msg = changed(&genuine.reply, input, cut);
            let finished = client_finish(create_state(&genuine.key_pub), &msg);
            if msg == genuine.reply {
                let km = finished.expect("the genuine reply checks");
                assert_eq!(
                    km.0[..],
                    genuine.relay_km[..],
                    "both sides derive the same keys"
                );
            } else {
                assert!(finished.is_err(), "client accepted a changed CREATED2");
            }
        }
        2 => {
            let msg = changed(&genuine.introduce, input, cut);
            let opened = service_open_introduce(&genuine.intro, INTRO_HEADER, &msg);
            if msg == genuine.introduce {
                let opened = opened.expect("the genuine INTRODUCE2 opens");
                assert_eq!(opened.plaintext, INTRO_PLAINTEXT, "plaintext survives");
            } else {
                assert!(opened.is_err(), "service opened a changed INTRODUCE2");
            }
        }
        4 => {
            let msg = changed(&genuine.v3_create, input, cut);
            let opened = v3::server_open_with_secret(
                RELAY_Y,
                &RELAY_ED_ID,
                &genuine.key,
                &msg,
                v3::CIRCUIT_VERIFICATION,
            );
            if msg == genuine.v3_create {
                let opened = opened.expect("the genuine ntor v3 CREATE2 opens");
                assert_eq!(opened.message, V3_REQUEST, "the request survives");
            } else {
                assert!(opened.is_err(), "relay opened a changed ntor v3 CREATE2");
            }
        }
        5 => {
            let msg = changed(&genuine.v3_reply, input, cut);
            let finished = v3::client_finish(v3_state(&genuine.key_pub).0, &msg);
            if msg == genuine.v3_reply {
                let (answer, km) = finished.expect("the genuine ntor v3 reply checks");
                assert_eq!(answer, V3_ANSWER, "the answer survives");
                assert_eq!(
                    km.0[..],
                    genuine.v3_km[..],
                    "both sides derive the same keys"
                );
            } else {
                assert!(
                    finished.is_err(),
                    "client accepted a changed ntor v3 CREATED2"
                );
            }
        }
        _ => {
            let msg = changed(&genuine.info, input, cut);
            let finished = client_rendezvous(introduce_state(&genuine.intro_pub).0, &msg);
            if msg == genuine.info {
                let km = finished.expect("the genuine RENDEZVOUS2 checks");
                assert_eq!(
                    km.0[..],
                    genuine.service_km[..],
                    "both sides derive the same keys"
                );
            } else {
                assert!(finished.is_err(), "client accepted a changed RENDEZVOUS2");
            }
        }
    }
}

/// Seeds: each message unchanged, cut to its own length, and with one byte flipped.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, kind) in NTOR_KINDS.iter().enumerate() {
        let select = u8::try_from(i).expect("few kinds");
        out.push((format!("{kind}-genuine"), vec![select]));
        out.push((format!("{kind}-flip-first"), vec![select, 0x01]));
        let mut late = vec![select];
        late.extend(std::iter::repeat_n(0u8, 40));
        late.push(0x80);
        out.push((format!("{kind}-flip-late"), late));
        out.push((format!("{kind}-cut"), vec![select | 0x80, 0, 0, 0]));
    }
    out
}
