//! The ntor v3 circuit handshake (proposal 332, tor-spec "The ntor-v3 handshake", CREATE2
//! handshake type 3): ntor with an encrypted, authenticated message in each direction. chive
//! carries the congestion-control negotiation of proposal 324 in those messages
//! (`chive_cell::ntor3_ext`).
//!
//! ```text
//! client -> relay (CREATE2 HDATA):  ID (32) | B (32) | X (32) | ENC(CM) | MSG_MAC (32)
//! relay  -> client (CREATED2 HDATA): Y (32) | AUTH (32) | ENC(SM)
//!
//! ENCAP(s) = u64be(len(s)) | s
//! H(s, t)  = SHA3-256(ENCAP(t) | s)          KDF(s, t) = SHAKE-256(ENCAP(t) | s)
//! MAC(k, m, t) = SHA3-256(ENCAP(t) | ENCAP(k) | m)      ENC = AES-256-CTR, IV 0
//!
//! phase1         = KDF(Bx | ID | X | B | PROTOID | ENCAP(VER), t_msgkdf) = ENC_K1 (32) | MAC_K1 (32)
//! MSG_MAC        = MAC(MAC_K1, ID | B | X | ENC(ENC_K1, CM), t_msgmac)
//! secret_input   = Yx | Bx | ID | B | X | Y | PROTOID | ENCAP(VER)
//! key_seed       = H(secret_input, t_key_seed);  verify = H(secret_input, t_verify)
//! KDF(key_seed, t_final) = ENC_K2 (32) | key material (92: Df Db Kf Kb KH, as ntor v1)
//! AUTH           = H(verify | ID | B | Y | X | MSG_MAC | ENCAP(ENC(ENC_K2, SM)) | PROTOID | "Server", t_auth)
//! ```
//! `ID` is the relay's Ed25519 identity (32 bytes, not ntor v1's 20-byte digest) and `VER`
//! the verification string, `"circuit extend"` for circuits (as tor and arti use). Both sides
//! refuse an all-zero Diffie-Hellman result; the relay answers a handshake whose MAC does not
//! verify with an error only after the same work.

use aes::cipher::{KeyIvInit, StreamCipher};
use rand_core::{CryptoRng, RngCore};
use sha3::digest::{ExtendableOutput, Update, XofReader};
use sha3::{Digest, Sha3_256, Shake256};
use subtle::ConstantTimeEq;
use x25519_dalek::{PublicKey, SharedSecret, StaticSecret};
use zeroize::Zeroizing;

use crate::ntor::{KeyMaterial, NtorPublicKey, NtorSecretKey, KEY_MATERIAL_LEN};
use crate::CryptoError;

/// CREATE2 handshake type of ntor v3.
pub const NTOR_V3_HTYPE: u16 = 3;
/// The verification string for circuit extension (tor's and arti's).
pub const CIRCUIT_VERIFICATION: &[u8] = b"circuit extend";
/// Length of the client's handshake without its message: ID, B, X, MSG_MAC.
pub const NTOR_V3_CLIENT_OVERHEAD: usize = 4 * 32;
/// Length of the relay's reply without its message: Y, AUTH.
pub const NTOR_V3_REPLY_OVERHEAD: usize = 2 * 32;

const KEY_LEN: usize = 32;
const PROTOID: &[u8] = b"ntor3-curve25519-sha3_256-1";
const T_MSGKDF: &[u8] = b"ntor3-curve25519-sha3_256-1:kdf_phase1";
const T_MSGMAC: &[u8] = b"ntor3-curve25519-sha3_256-1:msg_mac";
const T_KEY_SEED: &[u8] = b"ntor3-curve25519-sha3_256-1:key_seed";
const T_VERIFY: &[u8] = b"ntor3-curve25519-sha3_256-1:verify";
const T_FINAL: &[u8] = b"ntor3-curve25519-sha3_256-1:kdf_final";
const T_AUTH: &[u8] = b"ntor3-curve25519-sha3_256-1:auth_final";
const SERVER_STR: &[u8] = b"Server";

type Aes256Ctr = ctr::Ctr128BE<aes::Aes256>;

/// What the client keeps between CREATE2 and CREATED2; holds the ephemeral secret `x`
/// (zeroized on drop). Single use.
pub struct NtorV3ClientState {
    x: StaticSecret,
    x_pub: [u8; KEY_LEN],
    id: [u8; KEY_LEN],
    b: [u8; KEY_LEN],
    bx: SharedSecret,
    msg_mac: [u8; 32],
    verification: Vec<u8>,
}

impl std::fmt::Debug for NtorV3ClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NtorV3ClientState(relay key {})", hex::encode(self.b))
    }
}

/// `u64be(len) | bytes`.
fn encap(h: &mut impl Update, s: &[u8]) {
    h.update(&(s.len() as u64).to_be_bytes());
    h.update(s);
}

/// `H(parts, t)`.
fn hash(tweak: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut d = Sha3_256::new();
    Digest::update(&mut d, (tweak.len() as u64).to_be_bytes());
    Digest::update(&mut d, tweak);
    for p in parts {
        Digest::update(&mut d, p);
    }
    d.finalize().into()
}

/// AES-256-CTR with a zero IV, in place (each key is used once).
fn crypt(key: &[u8; 32], data: &mut [u8]) {
    let mut c = Aes256Ctr::new(key.into(), &[0u8; 16].into());
    c.apply_keystream(data);
}

/// Phase 1: the keys that encrypt the client's message and MAC it (ENC_K1, MAC_K1).
fn phase1(
    bx: &SharedSecret,
    id: &[u8; 32],
    x: &[u8; 32],
    b: &[u8; 32],
    verification: &[u8],
) -> (Zeroizing<[u8; 32]>, Zeroizing<[u8; 32]>) {
    let mut kdf = Shake256::default();
    encap(&mut kdf, T_MSGKDF);
    for p in [bx.as_bytes().as_slice(), id, x, b, PROTOID] {
        kdf.update(p);
    }
    encap(&mut kdf, verification);
    let mut r = kdf.finalize_xof();
    let mut enc = Zeroizing::new([0u8; 32]);
    let mut mac_key = Zeroizing::new([0u8; 32]);
    r.read(enc.as_mut());
    r.read(mac_key.as_mut());
    (enc, mac_key)
}

/// `MSG_MAC = MAC(MAC_K1, ID | B | X | encrypted, t_msgmac)`.
fn compute_msg_mac(
    mac_key: &[u8; 32],
    id: &[u8; 32],
    b: &[u8; 32],
    x: &[u8; 32],
    encrypted: &[u8],
) -> [u8; 32] {
    let mut mac = Sha3_256::default();
    encap(&mut mac, T_MSGMAC);
    encap(&mut mac, mac_key);
    for p in [id.as_slice(), b, x, encrypted] {
        Update::update(&mut mac, p);
    }
    mac.finalize().into()
}

/// The final phase shared by both sides: `verify`, the key that encrypts the reply, and the
/// circuit's key material.
struct Final {
    verify: Zeroizing<[u8; 32]>,
    enc: Zeroizing<[u8; 32]>,
    km: KeyMaterial,
}

#[allow(clippy::too_many_arguments)]
fn final_keys(
    yx: &SharedSecret,
    bx: &SharedSecret,
    id: &[u8; 32],
    b: &[u8; 32],
    x: &[u8; 32],
    y: &[u8; 32],
    verification: &[u8],
) -> Final {
    let mut si = Zeroizing::new(Vec::with_capacity(6 * 32 + PROTOID.len() + 8 + 32));
    for p in [
        yx.as_bytes().as_slice(),
        bx.as_bytes(),
        id,
        b,
        x,
        y,
        PROTOID,
    ] {
        si.extend_from_slice(p);
    }
    si.extend_from_slice(&(verification.len() as u64).to_be_bytes());
    si.extend_from_slice(verification);
    let seed = Zeroizing::new(hash(T_KEY_SEED, &[&si]));
    let verify = Zeroizing::new(hash(T_VERIFY, &[&si]));
    let mut kdf = Shake256::default();
    encap(&mut kdf, T_FINAL);
    kdf.update(seed.as_ref());
    let mut r = kdf.finalize_xof();
    let mut enc = Zeroizing::new([0u8; 32]);
    r.read(enc.as_mut());
    let mut km = KeyMaterial([0u8; KEY_MATERIAL_LEN]);
    r.read(&mut km.0);
    Final { verify, enc, km }
}

#[allow(clippy::too_many_arguments)]
fn auth(
    verify: &[u8; 32],
    id: &[u8; 32],
    b: &[u8; 32],
    y: &[u8; 32],
    x: &[u8; 32],
    msg_mac: &[u8; 32],
    encrypted_reply: &[u8],
) -> [u8; 32] {
    let len = (encrypted_reply.len() as u64).to_be_bytes();
    hash(
        T_AUTH,
        &[
            verify,
            id,
            b,
            y,
            x,
            msg_mac,
            &len,
            encrypted_reply,
            PROTOID,
            SERVER_STR,
        ],
    )
}

/// Client, step 1: the CREATE2 handshake data carrying `message` (encrypted and MACed) for a
/// relay with Ed25519 identity `relay_id` and onion key `relay_key`.
pub fn client_create<R: RngCore + CryptoRng>(
    rng: &mut R,
    relay_id: &[u8; 32],
    relay_key: &NtorPublicKey,
    message: &[u8],
    verification: &[u8],
) -> (NtorV3ClientState, Vec<u8>) {
    let mut x = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(x.as_mut());
    client_create_with_secret(*x, relay_id, relay_key, message, verification)
}

/// Like [`client_create`] with a given ephemeral secret `x`. Only for test vectors.
pub fn client_create_with_secret(
    x: [u8; 32],
    relay_id: &[u8; 32],
    relay_key: &NtorPublicKey,
    message: &[u8],
    verification: &[u8],
) -> (NtorV3ClientState, Vec<u8>) {
    let x = StaticSecret::from(x);
    let x_pub = PublicKey::from(&x).to_bytes();
    let bx = x.diffie_hellman(&PublicKey::from(relay_key.0));
    let (enc, mac_key) = phase1(&bx, relay_id, &x_pub, &relay_key.0, verification);
    let mut encrypted = message.to_vec();
    crypt(&enc, &mut encrypted);
    let msg_mac = compute_msg_mac(&mac_key, relay_id, &relay_key.0, &x_pub, &encrypted);
    let mut out = Vec::with_capacity(NTOR_V3_CLIENT_OVERHEAD + message.len());
    out.extend_from_slice(relay_id);
    out.extend_from_slice(&relay_key.0);
    out.extend_from_slice(&x_pub);
    out.extend_from_slice(&encrypted);
    out.extend_from_slice(&msg_mac);
    let state = NtorV3ClientState {
        x,
        x_pub,
        id: *relay_id,
        b: relay_key.0,
        bx,
        msg_mac,
        verification: verification.to_vec(),
    };
    (state, out)
}

/// Client, step 2: check the relay's reply (AUTH in constant time), and return the relay's
/// decrypted message and the key material. Fails on a short reply, a bad AUTH or a degenerate
/// `Y` or `B`.
pub fn client_finish(
    state: NtorV3ClientState,
    reply: &[u8],
) -> Result<(Vec<u8>, KeyMaterial), CryptoError> {
    if reply.len() < NTOR_V3_REPLY_OVERHEAD {
        return Err(CryptoError::BadLength {
            what: "ntor v3 reply",
            expected: NTOR_V3_REPLY_OVERHEAD,
            got: reply.len(),
        });
    }
    let (y, rest) = reply.split_at(KEY_LEN);
    let (their_auth, encrypted) = rest.split_at(32);
    let y: [u8; 32] = y.try_into().map_err(|_| CryptoError::BadKey)?;
    let yx = state.x.diffie_hellman(&PublicKey::from(y));
    let f = final_keys(
        &yx,
        &state.bx,
        &state.id,
        &state.b,
        &state.x_pub,
        &y,
        &state.verification,
    );
    let ours = auth(
        &f.verify,
        &state.id,
        &state.b,
        &y,
        &state.x_pub,
        &state.msg_mac,
        encrypted,
    );
    let ok: bool = ours.ct_eq(their_auth).into();
    if !ok || !yx.was_contributory() || !state.bx.was_contributory() {
        return Err(CryptoError::HandshakeFailed);
    }
    let mut msg = encrypted.to_vec();
    crypt(&f.enc, &mut msg);
    Ok((msg, f.km))
}

/// What the relay learnt from a client's handshake: its decrypted message, to be answered
/// with [`ServerHandshake::finish`].
pub struct ServerHandshake {
    y: StaticSecret,
    x_pub: [u8; 32],
    id: [u8; 32],
    b: [u8; 32],
    bx: SharedSecret,
    msg_mac: [u8; 32],
    verification: Vec<u8>,
    /// The client's message, decrypted and authenticated.
    pub message: Vec<u8>,
}

impl std::fmt::Debug for ServerHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerHandshake({} message bytes)", self.message.len())
    }
}

/// Relay, step 1: check a client's handshake (addressed to our identity and onion key, MAC
/// verified in constant time, `X` not degenerate) and decrypt its message. The caller decides
/// the reply from [`ServerHandshake::message`] and calls [`ServerHandshake::finish`].
pub fn server_open<R: RngCore + CryptoRng>(
    rng: &mut R,
    relay_id: &[u8; 32],
    key: &NtorSecretKey,
    handshake: &[u8],
    verification: &[u8],
) -> Result<ServerHandshake, CryptoError> {
    let mut y = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(y.as_mut());
    server_open_with_secret(*y, relay_id, key, handshake, verification)
}

/// Like [`server_open`] with a given ephemeral secret `y`. Only for test vectors.
pub fn server_open_with_secret(
    y: [u8; 32],
    relay_id: &[u8; 32],
    key: &NtorSecretKey,
    handshake: &[u8],
    verification: &[u8],
) -> Result<ServerHandshake, CryptoError> {
    if handshake.len() < NTOR_V3_CLIENT_OVERHEAD {
        return Err(CryptoError::BadLength {
            what: "ntor v3 handshake",
            expected: NTOR_V3_CLIENT_OVERHEAD,
            got: handshake.len(),
        });
    }
    let (head, msg_mac) = handshake.split_at(handshake.len() - 32);
    let (id, rest) = head.split_at(KEY_LEN);
    let (b, rest) = rest.split_at(KEY_LEN);
    let (x, encrypted) = rest.split_at(KEY_LEN);
    let b_ours = key.public();
    let same: bool = (id.ct_eq(relay_id) & b.ct_eq(&b_ours.0)).into();
    if !same {
        return Err(CryptoError::WrongRelayKey);
    }
    let x_pub: [u8; 32] = x.try_into().map_err(|_| CryptoError::BadKey)?;
    let bx = key.diffie_hellman(&x_pub);
    let (enc, mac_key) = phase1(&bx, relay_id, &x_pub, &b_ours.0, verification);
    let ours = compute_msg_mac(&mac_key, relay_id, &b_ours.0, &x_pub, encrypted);
    let ok: bool = ours.ct_eq(msg_mac).into();
    if !ok || !bx.was_contributory() {
        return Err(CryptoError::HandshakeFailed);
    }
    let mut message = encrypted.to_vec();
    crypt(&enc, &mut message);
    let mut mac = [0u8; 32];
    mac.copy_from_slice(msg_mac);
    Ok(ServerHandshake {
        y: StaticSecret::from(y),
        x_pub,
        id: *relay_id,
        b: b_ours.0,
        bx,
        msg_mac: mac,
        verification: verification.to_vec(),
        message,
    })
}

impl ServerHandshake {
    /// Relay, step 2: the CREATED2 handshake data carrying `reply`, and the key material.
    /// Fails if the client's `X` gives an all-zero `Yx`.
    pub fn finish(self, reply: &[u8]) -> Result<(Vec<u8>, KeyMaterial), CryptoError> {
        let y_pub = PublicKey::from(&self.y).to_bytes();
        let yx = self.y.diffie_hellman(&PublicKey::from(self.x_pub));
        let f = final_keys(
            &yx,
            &self.bx,
            &self.id,
            &self.b,
            &self.x_pub,
            &y_pub,
            &self.verification,
        );
        let mut encrypted = reply.to_vec();
        crypt(&f.enc, &mut encrypted);
        let a = auth(
            &f.verify,
            &self.id,
            &self.b,
            &y_pub,
            &self.x_pub,
            &self.msg_mac,
            &encrypted,
        );
        if !yx.was_contributory() {
            return Err(CryptoError::HandshakeFailed);
        }
        let mut out = Vec::with_capacity(NTOR_V3_REPLY_OVERHEAD + encrypted.len());
        out.extend_from_slice(&y_pub);
        out.extend_from_slice(&a);
        out.extend_from_slice(&encrypted);
        Ok((out, f.km))
    }
}

#[cfg(test)]
#[path = "ntor_v3_tests.rs"]
mod tests;
