//! The onion-service handshake, hs-ntor, exactly as rend-spec v3 defines it
//! ([NTOR-WITH-EXTRA-DATA] and [JOIN_REND]): an ntor variant that also lets the client encrypt
//! its INTRODUCE data to the service, with the service's per-introduction-point encryption key
//! `B` in the place of a relay's onion key and the intro point's auth key in the place of the
//! relay ID. Every key is bound to the service by its subcredential.
//!
//! ```text
//! H = SHA3-256, KDF = SHAKE-256, MAC(k, m) = H(htonll(len(k)) | k | m)
//! PROTOID = "tor-hs-ntor-curve25519-sha3-256-1", t_hsenc/t_hsverify/t_hsmac/m_hsexpand = PROTOID | ":hs_key_extract"/":hs_verify"/":hs_mac"/":hs_key_expand"
//!
//! INTRODUCE1 (client, ephemeral x, X):
//!   intro_secret_hs_input = EXP(B,x) | AUTH_KEY | X | B | PROTOID
//!   ENC_KEY (32) | MAC_KEY (32) = KDF(intro_secret_hs_input | t_hsenc | m_hsexpand | N_hs_subcred)
//!   ENCRYPTED = X | AES-256-CTR(ENC_KEY, iv 0, plaintext) = C | MAC(MAC_KEY, header | X | C)
//!
//! RENDEZVOUS1 (service, ephemeral y, Y), HANDSHAKE_INFO = Y | AUTH_INPUT_MAC:
//!   rend_secret_hs_input = EXP(X,y) | EXP(X,b) | AUTH_KEY | B | X | Y | PROTOID
//!   NTOR_KEY_SEED  = MAC(rend_secret_hs_input, t_hsenc)
//!   verify         = MAC(rend_secret_hs_input, t_hsverify)
//!   AUTH_INPUT_MAC = MAC(verify | AUTH_KEY | B | Y | X | PROTOID | "Server", t_hsmac)
//!   K = KDF(NTOR_KEY_SEED | m_hsexpand), 128 bytes: Df (32) | Db (32) | Kf (32) | Kb (32)
//! ```
//!
//! `header` is everything of the INTRODUCE1 body before `ENCRYPTED` (chive-cell builds it), so
//! the introduction point can change none of it without the service noticing. Checked against
//! rend-spec v3's test vector (Appendix G.1), generated from C tor. Like [`crate::ntor`], both
//! sides refuse an all-zero Diffie-Hellman result.

use aes::cipher::{KeyIvInit, StreamCipher};
use rand_core::{CryptoRng, RngCore};
use sha3::digest::{ExtendableOutput, Update, XofReader};
use sha3::{Digest, Sha3_256, Shake256};
use subtle::ConstantTimeEq;
use x25519_dalek::{PublicKey, SharedSecret, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::identity::IdentityKey;
use crate::ntor::{NtorPublicKey, NtorSecretKey};
use crate::onion::SUBCREDENTIAL_LEN;
use crate::CryptoError;

/// Length of `CLIENT_PK` (X) at the start of INTRODUCE1's `ENCRYPTED`.
pub const HS_CLIENT_PK_LEN: usize = 32;
/// Length of the MAC at the end of INTRODUCE1's `ENCRYPTED`.
pub const HS_MAC_LEN: usize = 32;
/// Bytes `ENCRYPTED` adds around the plaintext: X (32) and the MAC (32).
pub const HS_INTRO_OVERHEAD: usize = HS_CLIENT_PK_LEN + HS_MAC_LEN;
/// Length of RENDEZVOUS1's `HANDSHAKE_INFO`: Y (32) | AUTH_INPUT_MAC (32).
pub const HS_RENDEZVOUS_HANDSHAKE_LEN: usize = 64;
/// Length of the end-to-end key material: Df, Db, Kf, Kb of 32 bytes each.
pub const HS_KEY_MATERIAL_LEN: usize = 128;

const KEY_LEN: usize = 32;
const PROTOID: &[u8] = b"tor-hs-ntor-curve25519-sha3-256-1";
const T_HSENC: &[u8] = b"tor-hs-ntor-curve25519-sha3-256-1:hs_key_extract";
const T_HSVERIFY: &[u8] = b"tor-hs-ntor-curve25519-sha3-256-1:hs_verify";
const T_HSMAC: &[u8] = b"tor-hs-ntor-curve25519-sha3-256-1:hs_mac";
const M_HSEXPAND: &[u8] = b"tor-hs-ntor-curve25519-sha3-256-1:hs_key_expand";
const SERVER_STR: &[u8] = b"Server";

type Aes256Ctr = ctr::Ctr128BE<aes::Aes256>;

/// What a client knows about one introduction point of a service, from its descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HsIntroPublic {
    /// The intro point's auth key `AUTH_KEY` (Ed25519, also named in ESTABLISH_INTRO).
    pub auth_key: IdentityKey,
    /// The service's encryption key `B` for this intro point (curve25519).
    pub enc_key: NtorPublicKey,
    /// The service's subcredential ([`crate::OnionAddress::subcredential`]).
    pub subcredential: [u8; SUBCREDENTIAL_LEN],
}

/// The service's side of one introduction point: as [`HsIntroPublic`] with the secret `b`.
#[derive(Clone, Debug)]
pub struct HsIntroSecret {
    /// The intro point's auth key `AUTH_KEY`.
    pub auth_key: IdentityKey,
    /// The encryption secret `b`.
    pub enc_secret: NtorSecretKey,
    /// The service's subcredential.
    pub subcredential: [u8; SUBCREDENTIAL_LEN],
}

impl HsIntroSecret {
    /// The public half, as put in the descriptor.
    pub fn public(&self) -> HsIntroPublic {
        HsIntroPublic {
            auth_key: self.auth_key,
            enc_key: self.enc_secret.public(),
            subcredential: self.subcredential,
        }
    }
}

/// End-to-end key material between client and service: Df | Db | Kf | Kb, 32 bytes each (the
/// SHA3-256 digest seeds and AES-256 keys of rend-spec's virtual hop). Zeroized on drop.
pub struct HsKeyMaterial(pub [u8; HS_KEY_MATERIAL_LEN]);

impl HsKeyMaterial {
    fn part(&self, i: usize) -> &[u8; 32] {
        self.0[32 * i..32 * (i + 1)]
            .try_into()
            .expect("four 32-byte parts inside HS_KEY_MATERIAL_LEN")
    }

    /// Forward digest seed (client to service).
    pub fn df(&self) -> &[u8; 32] {
        self.part(0)
    }

    /// Backward digest seed (service to client).
    pub fn db(&self) -> &[u8; 32] {
        self.part(1)
    }

    /// Forward AES-256 key.
    pub fn kf(&self) -> &[u8; 32] {
        self.part(2)
    }

    /// Backward AES-256 key.
    pub fn kb(&self) -> &[u8; 32] {
        self.part(3)
    }
}

impl Drop for HsKeyMaterial {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for HsKeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HsKeyMaterial(..)")
    }
}

/// What the client keeps between sending INTRODUCE1 and receiving RENDEZVOUS2: the ephemeral
/// secret `x` (zeroized on drop) and the intro point's keys. Single use.
pub struct HsNtorClientState {
    x: StaticSecret,
    x_pub: [u8; KEY_LEN],
    intro: HsIntroPublic,
}

impl std::fmt::Debug for HsNtorClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HsNtorClientState(B {})", self.intro.enc_key.to_hex())
    }
}

/// What the service learns from a valid INTRODUCE2.
#[derive(Debug, PartialEq, Eq)]
pub struct IntroduceOpened {
    /// The client's ephemeral key X, for [`service_rendezvous`].
    pub client_pk: [u8; HS_CLIENT_PK_LEN],
    /// The decrypted plaintext (chive-cell's `IntroducePlaintext`).
    pub plaintext: Vec<u8>,
}

/// rend-spec's `MAC(k, m) = SHA3-256(htonll(len(k)) | k | m)`. Besides hs-ntor, it is what
/// ESTABLISH_INTRO's HANDSHAKE_AUTH uses (keyed with the circuit's `KH`).
pub fn sha3_mac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    mac(key, &[msg])
}

/// [`sha3_mac`] over the concatenation of `msg`.
fn mac(key: &[u8], msg: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha3_256::new();
    Digest::update(&mut h, (key.len() as u64).to_be_bytes());
    Digest::update(&mut h, key);
    for m in msg {
        Digest::update(&mut h, m);
    }
    h.finalize().into()
}

/// SHAKE-256 of the concatenated `parts`, `out.len()` bytes.
fn kdf(parts: &[&[u8]], out: &mut [u8]) {
    let mut shake = Shake256::default();
    for p in parts {
        shake.update(p);
    }
    shake.finalize_xof().read(out);
}

/// ENC_KEY and MAC_KEY of the INTRODUCE1 encryption, from `EXP(B,x)` (= `EXP(X,b)`).
fn intro_keys(
    bx: &SharedSecret,
    intro: &HsIntroPublic,
    x_pub: &[u8; KEY_LEN],
) -> Zeroizing<[u8; 2 * KEY_LEN]> {
    let mut keys = Zeroizing::new([0u8; 2 * KEY_LEN]);
    kdf(
        &[
            bx.as_bytes(),
            intro.auth_key.as_bytes(),
            x_pub,
            &intro.enc_key.0,
            PROTOID,
            T_HSENC,
            M_HSEXPAND,
            &intro.subcredential,
        ],
        keys.as_mut(),
    );
    keys
}

/// AUTH_INPUT_MAC and NTOR_KEY_SEED from the two Diffie-Hellman results.
fn rendezvous_keys(
    xy: &SharedSecret,
    xb: &SharedSecret,
    intro: &HsIntroPublic,
    x_pub: &[u8; KEY_LEN],
    y_pub: &[u8; KEY_LEN],
) -> ([u8; 32], Zeroizing<[u8; 32]>) {
    let auth_key = intro.auth_key.as_bytes();
    let b = &intro.enc_key.0;
    let mut secret_input = Zeroizing::new(Vec::with_capacity(6 * KEY_LEN + PROTOID.len()));
    for part in [
        xy.as_bytes(),
        xb.as_bytes(),
        auth_key,
        b,
        x_pub,
        y_pub,
        PROTOID,
    ] {
        secret_input.extend_from_slice(part);
    }
    let seed = Zeroizing::new(mac(&secret_input, &[T_HSENC]));
    let verify = Zeroizing::new(mac(&secret_input, &[T_HSVERIFY]));
    let mut auth_input = Zeroizing::new(Vec::with_capacity(5 * KEY_LEN + 64));
    for part in [
        verify.as_slice(),
        auth_key,
        b,
        y_pub,
        x_pub,
        PROTOID,
        SERVER_STR,
    ] {
        auth_input.extend_from_slice(part);
    }
    (mac(&auth_input, &[T_HSMAC]), seed)
}

/// `K = KDF(NTOR_KEY_SEED | m_hsexpand)`, 128 bytes.
fn expand(seed: &[u8; 32]) -> HsKeyMaterial {
    let mut km = HsKeyMaterial([0u8; HS_KEY_MATERIAL_LEN]);
    kdf(&[seed, M_HSEXPAND], &mut km.0);
    km
}

/// Client: encrypt `plaintext` for the service behind `intro`. `header` is the INTRODUCE1 body
/// before `ENCRYPTED`; the result is `ENCRYPTED` = X | C | MAC, to be appended to it.
/// Fails only if `B` is a degenerate point (the descriptor was bad).
pub fn client_introduce<R: RngCore + CryptoRng>(
    rng: &mut R,
    intro: &HsIntroPublic,
    header: &[u8],
    plaintext: &[u8],
) -> Result<(HsNtorClientState, Vec<u8>), CryptoError> {
    let mut x = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(x.as_mut());
    client_introduce_with_secret(*x, intro, header, plaintext)
}

/// Like [`client_introduce`] with a given ephemeral secret `x`. Only for test vectors: reusing
/// `x` breaks forward secrecy.
pub fn client_introduce_with_secret(
    x: [u8; 32],
    intro: &HsIntroPublic,
    header: &[u8],
    plaintext: &[u8],
) -> Result<(HsNtorClientState, Vec<u8>), CryptoError> {
    let x = StaticSecret::from(x);
    let x_pub = PublicKey::from(&x).to_bytes();
    let bx = x.diffie_hellman(&PublicKey::from(intro.enc_key.0));
    if !bx.was_contributory() {
        return Err(CryptoError::HandshakeFailed);
    }
    let keys = intro_keys(&bx, intro, &x_pub);
    let (enc_key, mac_key) = keys.split_at(KEY_LEN);

    let mut out = Vec::with_capacity(HS_INTRO_OVERHEAD + plaintext.len());
    out.extend_from_slice(&x_pub);
    out.extend_from_slice(plaintext);
    let mut cipher = Aes256Ctr::new(enc_key.into(), &[0u8; 16].into());
    cipher.apply_keystream(&mut out[HS_CLIENT_PK_LEN..]);
    let tag = mac(mac_key, &[header, &out]);
    out.extend_from_slice(&tag);
    let state = HsNtorClientState {
        x,
        x_pub,
        intro: intro.clone(),
    };
    Ok((state, out))
}

/// Service: check the MAC of an INTRODUCE2's `ENCRYPTED` (with its `header`) and decrypt it.
/// Fails with `HandshakeFailed` if the MAC does not verify (tampered, or for another
/// intro point or service) or X is degenerate, with `BadLength` if it is too short.
pub fn service_open_introduce(
    intro: &HsIntroSecret,
    header: &[u8],
    encrypted: &[u8],
) -> Result<IntroduceOpened, CryptoError> {
    if encrypted.len() < HS_INTRO_OVERHEAD {
        return Err(CryptoError::BadLength {
            what: "INTRODUCE2 encrypted part",
            expected: HS_INTRO_OVERHEAD,
            got: encrypted.len(),
        });
    }
    let (covered, their_mac) = encrypted.split_at(encrypted.len() - HS_MAC_LEN);
    let mut x_pub = [0u8; KEY_LEN];
    x_pub.copy_from_slice(&covered[..HS_CLIENT_PK_LEN]);
    let bx = intro.enc_secret.diffie_hellman(&x_pub);
    if !bx.was_contributory() {
        return Err(CryptoError::HandshakeFailed);
    }
    let keys = intro_keys(&bx, &intro.public(), &x_pub);
    let (enc_key, mac_key) = keys.split_at(KEY_LEN);
    let tag = mac(mac_key, &[header, covered]);
    if !bool::from(tag.ct_eq(their_mac)) {
        return Err(CryptoError::HandshakeFailed);
    }
    let mut plaintext = covered[HS_CLIENT_PK_LEN..].to_vec();
    let mut cipher = Aes256Ctr::new(enc_key.into(), &[0u8; 16].into());
    cipher.apply_keystream(&mut plaintext);
    Ok(IntroduceOpened {
        client_pk: x_pub,
        plaintext,
    })
}

/// Service: answer an opened introduction with a fresh ephemeral key. Returns RENDEZVOUS1's
/// `HANDSHAKE_INFO` (Y | AUTH_INPUT_MAC) and the end-to-end key material.
pub fn service_rendezvous<R: RngCore + CryptoRng>(
    rng: &mut R,
    intro: &HsIntroSecret,
    client_pk: &[u8; HS_CLIENT_PK_LEN],
) -> Result<([u8; HS_RENDEZVOUS_HANDSHAKE_LEN], HsKeyMaterial), CryptoError> {
    let mut y = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(y.as_mut());
    service_rendezvous_with_secret(*y, intro, client_pk)
}

/// Like [`service_rendezvous`] with a given ephemeral secret `y`. Only for test vectors.
pub fn service_rendezvous_with_secret(
    y: [u8; 32],
    intro: &HsIntroSecret,
    client_pk: &[u8; HS_CLIENT_PK_LEN],
) -> Result<([u8; HS_RENDEZVOUS_HANDSHAKE_LEN], HsKeyMaterial), CryptoError> {
    let (reply, seed) = service_rendezvous_seed(y, intro, client_pk)?;
    Ok((reply, expand(&seed)))
}

/// The service's half up to NTOR_KEY_SEED (split out so the test vector can check the seed).
fn service_rendezvous_seed(
    y: [u8; 32],
    intro: &HsIntroSecret,
    client_pk: &[u8; HS_CLIENT_PK_LEN],
) -> Result<([u8; HS_RENDEZVOUS_HANDSHAKE_LEN], Zeroizing<[u8; 32]>), CryptoError> {
    let y = StaticSecret::from(y);
    let y_pub = PublicKey::from(&y).to_bytes();
    let x_pub = PublicKey::from(*client_pk);
    let xy = y.diffie_hellman(&x_pub);
    let xb = intro.enc_secret.diffie_hellman(client_pk);
    if !xy.was_contributory() || !xb.was_contributory() {
        return Err(CryptoError::HandshakeFailed);
    }
    let (auth, seed) = rendezvous_keys(&xy, &xb, &intro.public(), client_pk, &y_pub);
    let mut reply = [0u8; HS_RENDEZVOUS_HANDSHAKE_LEN];
    reply[..KEY_LEN].copy_from_slice(&y_pub);
    reply[KEY_LEN..].copy_from_slice(&auth);
    Ok((reply, seed))
}

/// Client: check RENDEZVOUS2's `HANDSHAKE_INFO` (AUTH compared in constant time) and derive
/// the end-to-end key material.
pub fn client_rendezvous(
    state: HsNtorClientState,
    handshake_info: &[u8],
) -> Result<HsKeyMaterial, CryptoError> {
    let info: &[u8; HS_RENDEZVOUS_HANDSHAKE_LEN] =
        handshake_info
            .try_into()
            .map_err(|_| CryptoError::BadLength {
                what: "RENDEZVOUS2 handshake info",
                expected: HS_RENDEZVOUS_HANDSHAKE_LEN,
                got: handshake_info.len(),
            })?;
    let (y_bytes, their_auth) = info.split_at(KEY_LEN);
    let mut y_pub = [0u8; KEY_LEN];
    y_pub.copy_from_slice(y_bytes);
    let xy = state.x.diffie_hellman(&PublicKey::from(y_pub));
    let xb = state
        .x
        .diffie_hellman(&PublicKey::from(state.intro.enc_key.0));
    let (auth, seed) = rendezvous_keys(&xy, &xb, &state.intro, &state.x_pub, &y_pub);
    let auth_ok: bool = auth.ct_eq(their_auth).into();
    if !xy.was_contributory() || !xb.was_contributory() || !auth_ok {
        return Err(CryptoError::HandshakeFailed);
    }
    Ok(expand(&seed))
}

#[cfg(test)]
#[path = "hs_ntor_tests.rs"]
mod tests;
