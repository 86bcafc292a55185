//! The ntor circuit handshake, exactly as tor-spec ("The ntor handshake") defines it:
//! curve25519 Diffie-Hellman, HMAC-SHA256 with the `ntor-curve25519-sha256-1` tweaks, and
//! HKDF-SHA256 (RFC 5869, salt `t_key`, info `m_expand`) producing 92 bytes of key material.
//!
//! ```text
//! client -> relay (CREATE2 HDATA, 84 bytes):  ID (20) | B (32) | X (32)
//! relay  -> client (CREATED2 HDATA, 64 bytes): Y (32) | AUTH (32)
//!
//! secret_input = EXP(X,y) | EXP(X,b) | ID | B | X | Y | PROTOID     (relay)
//!              = EXP(Y,x) | EXP(B,x) | ID | B | X | Y | PROTOID     (client)
//! verify       = H(secret_input, t_verify)
//! auth_input   = verify | ID | B | Y | X | PROTOID | "Server"
//! AUTH         = H(auth_input, t_mac)
//! keys         = HKDF-SHA256(IKM = secret_input, salt = t_key, info = m_expand), 92 bytes
//!              = Df (20) | Db (20) | Kf (16) | Kb (16) | KH (20)
//! ```
//! where `H(x, t) = HMAC-SHA256(key = t, msg = x)`. Both sides refuse a Diffie-Hellman result
//! that is all zeros (a small-order point sent by a malicious peer).

use hmac::{Hmac, Mac};
use rand_core::{CryptoRng, RngCore};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use x25519_dalek::{PublicKey, SharedSecret, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::CryptoError;

/// CREATE2 handshake type of ntor.
pub const NTOR_HTYPE: u16 = 2;
/// Length of the client's handshake message: ID (20) + B (32) + X (32).
pub const NTOR_ONIONSKIN_LEN: usize = 84;
/// Length of the relay's reply: Y (32) + AUTH (32).
pub const NTOR_REPLY_LEN: usize = 64;
/// Length of the derived key material: Df 20, Db 20, Kf 16, Kb 16, KH 20.
pub const KEY_MATERIAL_LEN: usize = 92;
/// Length of the tor1 part of the key material (Df, Db, Kf, Kb).
pub const TOR1_KEYS_LEN: usize = 72;

/// Length of the relay identity digest (`ID`).
const ID_LEN: usize = 20;
/// Length of a curve25519 key.
const KEY_LEN: usize = 32;

const PROTOID: &[u8] = b"ntor-curve25519-sha256-1";
const T_MAC: &[u8] = b"ntor-curve25519-sha256-1:mac";
const T_KEY: &[u8] = b"ntor-curve25519-sha256-1:key_extract";
const T_VERIFY: &[u8] = b"ntor-curve25519-sha256-1:verify";
const M_EXPAND: &[u8] = b"ntor-curve25519-sha256-1:key_expand";
const SERVER_STR: &[u8] = b"Server";

/// A relay's long-term ntor onion key (curve25519 secret `b`). Zeroized on drop.
#[derive(Clone)]
pub struct NtorSecretKey(StaticSecret);

/// A relay's public ntor onion key `B`, as published in its descriptor.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NtorPublicKey(pub [u8; 32]);

impl NtorSecretKey {
    /// A fresh random key.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut b = Zeroizing::new([0u8; KEY_LEN]);
        rng.fill_bytes(b.as_mut());
        Self::from_bytes(*b)
    }

    /// Rebuild from the 32 stored secret bytes (clamping happens when the key is used).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        NtorSecretKey(StaticSecret::from(bytes))
    }

    /// The 32 secret bytes, for a key file.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The public key `B`.
    pub fn public(&self) -> NtorPublicKey {
        NtorPublicKey(PublicKey::from(&self.0).to_bytes())
    }

    /// `EXP(X, b)` with a peer's public key; hs-ntor uses an onion key of this type as the
    /// service's per-intro-point encryption key.
    pub(crate) fn diffie_hellman(&self, their_public: &[u8; 32]) -> SharedSecret {
        self.0.diffie_hellman(&PublicKey::from(*their_public))
    }
}

impl std::fmt::Debug for NtorSecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NtorSecretKey(public {})", self.public().to_hex())
    }
}

impl NtorPublicKey {
    /// Parse from 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CryptoError> {
        let arr: [u8; KEY_LEN] = bytes.try_into().map_err(|_| CryptoError::BadLength {
            what: "ntor public key",
            expected: KEY_LEN,
            got: bytes.len(),
        })?;
        Ok(NtorPublicKey(arr))
    }

    /// Parse from 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, CryptoError> {
        let bytes = hex::decode(s.trim()).map_err(|_| CryptoError::BadHex)?;
        Self::from_bytes(&bytes)
    }

    /// Lower-case hex encoding.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// Key material derived by the handshake: Df (20) | Db (20) | Kf (16) | Kb (16) | KH (20).
/// Zeroized on drop.
pub struct KeyMaterial(pub [u8; KEY_MATERIAL_LEN]);

impl KeyMaterial {
    /// Key material from the 72 tor1 bytes alone (KH zero): for test vectors and benchmarks
    /// that only exercise relay crypto.
    pub fn from_tor1_keys(keys: &[u8; TOR1_KEYS_LEN]) -> Self {
        let mut km = KeyMaterial([0u8; KEY_MATERIAL_LEN]);
        km.0[..TOR1_KEYS_LEN].copy_from_slice(keys);
        km
    }

    /// Fixed sub-array of the key material. The ranges are compile-time constants inside the
    /// 92-byte array, so the conversion cannot fail.
    fn part<const N: usize>(&self, start: usize) -> &[u8; N] {
        self.0[start..start + N]
            .try_into()
            .expect("constant range inside KEY_MATERIAL_LEN")
    }

    /// Forward digest seed (client to exit).
    pub fn df(&self) -> &[u8; 20] {
        self.part(0)
    }

    /// Backward digest seed (exit to client).
    pub fn db(&self) -> &[u8; 20] {
        self.part(20)
    }

    /// Forward AES-128 key.
    pub fn kf(&self) -> &[u8; 16] {
        self.part(40)
    }

    /// Backward AES-128 key.
    pub fn kb(&self) -> &[u8; 16] {
        self.part(56)
    }

    /// KH, the circuit's handshake digest (tor-spec: the 20 bytes after Kb). An onion service
    /// MACs its ESTABLISH_INTRO with it (rend-spec v3 HANDSHAKE_AUTH), binding the request to
    /// the circuit it arrives on; only the service and the introduction point know it.
    pub fn kh(&self) -> &[u8; 20] {
        self.part(72)
    }
}

impl Drop for KeyMaterial {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMaterial(..)")
    }
}

/// What the client keeps between sending CREATE2 and receiving CREATED2.
/// Holds the ephemeral secret `x` (zeroized on drop); single use.
pub struct NtorClientState {
    x: StaticSecret,
    x_pub: [u8; KEY_LEN],
    relay_id: [u8; ID_LEN],
    relay_key: NtorPublicKey,
}

impl std::fmt::Debug for NtorClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NtorClientState(relay key {})", self.relay_key.to_hex())
    }
}

/// `H(x, t) = HMAC-SHA256(key = t, msg = x)`.
fn h(msg: &[u8], tweak: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length, so this constructor cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(tweak).expect("HMAC accepts any key length");
    mac.update(msg);
    mac.finalize().into_bytes().into()
}

/// The part shared by both sides: from the two DH results and the public values, compute
/// AUTH and the key material. Also returns whether a DH result was all zeros, so that the
/// caller fails only after doing the same work either way.
fn derive(
    dh1: &SharedSecret,
    dh2: &SharedSecret,
    id: &[u8; ID_LEN],
    b: &[u8; KEY_LEN],
    x: &[u8; KEY_LEN],
    y: &[u8; KEY_LEN],
) -> ([u8; 32], KeyMaterial, bool) {
    let bad = !dh1.was_contributory() | !dh2.was_contributory();

    let mut secret_input = Zeroizing::new(Vec::with_capacity(5 * KEY_LEN + ID_LEN + PROTOID.len()));
    secret_input.extend_from_slice(dh1.as_bytes());
    secret_input.extend_from_slice(dh2.as_bytes());
    secret_input.extend_from_slice(id);
    secret_input.extend_from_slice(b);
    secret_input.extend_from_slice(x);
    secret_input.extend_from_slice(y);
    secret_input.extend_from_slice(PROTOID);

    let verify = Zeroizing::new(h(&secret_input, T_VERIFY));
    let mut auth_input =
        Vec::with_capacity(32 + ID_LEN + 3 * KEY_LEN + PROTOID.len() + SERVER_STR.len());
    auth_input.extend_from_slice(verify.as_ref());
    auth_input.extend_from_slice(id);
    auth_input.extend_from_slice(b);
    auth_input.extend_from_slice(y);
    auth_input.extend_from_slice(x);
    auth_input.extend_from_slice(PROTOID);
    auth_input.extend_from_slice(SERVER_STR);
    let auth = h(&auth_input, T_MAC);
    auth_input.zeroize();

    // HKDF-Extract with salt t_key is exactly KEY_SEED = H(secret_input, t_key) of tor-spec.
    let hk = hkdf::Hkdf::<Sha256>::new(Some(T_KEY), &secret_input);
    let mut km = KeyMaterial([0u8; KEY_MATERIAL_LEN]);
    // 92 bytes is far below HKDF-SHA256's limit of 255 * 32, so expand cannot fail.
    hk.expand(M_EXPAND, &mut km.0)
        .expect("92 bytes is a valid HKDF-SHA256 output length");
    (auth, km, bad)
}

/// Client, step 1: make the CREATE2 handshake data for a relay with identity digest
/// `relay_id` (for chive: `IdentityKey::ntor_id()`) and onion key `relay_key`.
pub fn client_create<R: RngCore + CryptoRng>(
    rng: &mut R,
    relay_id: &[u8; 20],
    relay_key: &NtorPublicKey,
) -> (NtorClientState, [u8; NTOR_ONIONSKIN_LEN]) {
    let mut x = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(x.as_mut());
    client_create_with_secret(*x, relay_id, relay_key)
}

/// Like [`client_create`] with a given ephemeral secret `x`. Only for test vectors: reusing
/// `x` breaks forward secrecy.
pub fn client_create_with_secret(
    x: [u8; 32],
    relay_id: &[u8; 20],
    relay_key: &NtorPublicKey,
) -> (NtorClientState, [u8; NTOR_ONIONSKIN_LEN]) {
    let x = StaticSecret::from(x);
    let x_pub = PublicKey::from(&x).to_bytes();
    let mut onionskin = [0u8; NTOR_ONIONSKIN_LEN];
    onionskin[..ID_LEN].copy_from_slice(relay_id);
    onionskin[ID_LEN..ID_LEN + KEY_LEN].copy_from_slice(&relay_key.0);
    onionskin[ID_LEN + KEY_LEN..].copy_from_slice(&x_pub);
    let state = NtorClientState {
        x,
        x_pub,
        relay_id: *relay_id,
        relay_key: *relay_key,
    };
    (state, onionskin)
}

/// Client, step 2: check the relay's reply (AUTH compared in constant time) and derive the
/// key material. Fails on a wrong length, a bad AUTH or a degenerate `Y`.
pub fn client_finish(state: NtorClientState, reply: &[u8]) -> Result<KeyMaterial, CryptoError> {
    let reply: &[u8; NTOR_REPLY_LEN] = reply.try_into().map_err(|_| CryptoError::BadLength {
        what: "ntor reply",
        expected: NTOR_REPLY_LEN,
        got: reply.len(),
    })?;
    let (y_bytes, their_auth) = reply.split_at(KEY_LEN);
    let mut y = [0u8; KEY_LEN];
    y.copy_from_slice(y_bytes);
    let y_pub = PublicKey::from(y);
    let b_pub = PublicKey::from(state.relay_key.0);
    let yx = state.x.diffie_hellman(&y_pub);
    let bx = state.x.diffie_hellman(&b_pub);
    let (auth, km, bad) = derive(
        &yx,
        &bx,
        &state.relay_id,
        &state.relay_key.0,
        &state.x_pub,
        &y,
    );
    let auth_ok: bool = auth.ct_eq(their_auth).into();
    if bad || !auth_ok {
        return Err(CryptoError::HandshakeFailed);
    }
    Ok(km)
}

/// Relay: answer a client's handshake with a fresh ephemeral key. Returns the CREATED2
/// handshake data and the key material. Rejects a wrong length, a handshake addressed to a
/// different identity or onion key, and a degenerate `X`.
pub fn server_handshake<R: RngCore + CryptoRng>(
    rng: &mut R,
    relay_id: &[u8; 20],
    key: &NtorSecretKey,
    onionskin: &[u8],
) -> Result<([u8; NTOR_REPLY_LEN], KeyMaterial), CryptoError> {
    let mut y = Zeroizing::new([0u8; KEY_LEN]);
    rng.fill_bytes(y.as_mut());
    server_handshake_with_secret(*y, relay_id, key, onionskin)
}

/// Like [`server_handshake`] with a given ephemeral secret `y`. Only for test vectors.
pub fn server_handshake_with_secret(
    y: [u8; 32],
    relay_id: &[u8; 20],
    key: &NtorSecretKey,
    onionskin: &[u8],
) -> Result<([u8; NTOR_REPLY_LEN], KeyMaterial), CryptoError> {
    if onionskin.len() != NTOR_ONIONSKIN_LEN {
        return Err(CryptoError::BadLength {
            what: "ntor onionskin",
            expected: NTOR_ONIONSKIN_LEN,
            got: onionskin.len(),
        });
    }
    let (id, rest) = onionskin.split_at(ID_LEN);
    let (b, x) = rest.split_at(KEY_LEN);
    let b_pub = key.public();
    // ID and B are public values: comparing them in variable time leaks nothing.
    if id != relay_id || b != b_pub.0 {
        return Err(CryptoError::WrongRelayKey);
    }
    let mut x_arr = [0u8; KEY_LEN];
    x_arr.copy_from_slice(x);
    let x_pub = PublicKey::from(x_arr);

    let y = StaticSecret::from(y);
    let y_pub = PublicKey::from(&y).to_bytes();
    let xy = y.diffie_hellman(&x_pub);
    let xb = key.0.diffie_hellman(&x_pub);
    let (auth, km, bad) = derive(&xy, &xb, relay_id, &b_pub.0, &x_arr, &y_pub);
    if bad {
        return Err(CryptoError::HandshakeFailed);
    }
    let mut reply = [0u8; NTOR_REPLY_LEN];
    reply[..KEY_LEN].copy_from_slice(&y_pub);
    reply[KEY_LEN..].copy_from_slice(&auth);
    Ok((reply, km))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex<const N: usize>(s: &str) -> [u8; N] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    /// The fixed ntor vector used by Arti's tor-proto (`crypto::handshake::ntor::tests::testvec`),
    /// which matches C Tor's reference implementation (src/test/ntor_ref.py).
    #[test]
    fn published_test_vector() {
        let b_sk: [u8; 32] =
            unhex("4820544f4c4420594f5520444f474954204b454550532048415050454e494e47");
        let b_pk: [u8; 32] =
            unhex("ccbc8541904d18af08753eae967874749e6149f873de937f57f8fd903a21c471");
        let x_sk: [u8; 32] =
            unhex("706f6461792069207075742e2e2e2e2e2e2e2e4a454c4c59206f6e2074686973");
        let y_sk: [u8; 32] =
            unhex("70686520737175697272656c2e2e2e2e2e2e2e2e686173206869732067616d65");
        let id: [u8; 20] = unhex("69546f6c64596f7541626f75745374616972732e");
        let create: [u8; 84] = unhex(
            "69546f6c64596f7541626f75745374616972732eccbc8541904d18af08753eae967874749e6149f873de937f57f8fd903a21c471e65dfdbef8b2635837fe2cebc086a8096eae3213e6830dc407516083d412b078",
        );
        let created: [u8; 64] = unhex(
            "390480a14362761d6aec1fea840f6e9e928fb2adb7b25c670be1045e35133a371cbdf68b89923e1f85e8e18ee6e805ea333fe4849c790ffd2670bd80fec95cc8",
        );
        let keys: [u8; 72] = unhex(
            "0c62dee7f48893370d0ef896758d35729867beef1a5121df80e00f79ed349af39b51cae125719182f19d932a667dae1afbf2e336e6910e7822223e763afad0a13342157969dc6b79",
        );

        let relay_sk = NtorSecretKey::from_bytes(b_sk);
        assert_eq!(relay_sk.public(), NtorPublicKey(b_pk));

        let (state, onionskin) = client_create_with_secret(x_sk, &id, &NtorPublicKey(b_pk));
        assert_eq!(onionskin, create);

        let (reply, server_km) =
            server_handshake_with_secret(y_sk, &id, &relay_sk, &onionskin).unwrap();
        assert_eq!(reply, created);
        assert_eq!(server_km.0[..72], keys);

        let client_km = client_finish(state, &reply).unwrap();
        assert_eq!(client_km.0[..72], keys);
        // KH is bytes 72..92 of the same HKDF output (HKDF output is prefix-stable, so the
        // published 72 bytes stay valid); the vector does not cover it, both ends must agree.
        assert_eq!(client_km.kh(), server_km.kh());
        assert_eq!(&client_km.0[72..], client_km.kh());
        assert_eq!(client_km.df()[..], keys[..20]);
        assert_eq!(client_km.db()[..], keys[20..40]);
        assert_eq!(client_km.kf()[..], keys[40..56]);
        assert_eq!(client_km.kb()[..], keys[56..72]);
    }

    #[test]
    fn random_handshake_agrees() {
        let mut rng = rand::thread_rng();
        let sk = NtorSecretKey::generate(&mut rng);
        let id = [7u8; 20];
        let (state, skin) = client_create(&mut rng, &id, &sk.public());
        let (reply, skm) = server_handshake(&mut rng, &id, &sk, &skin).unwrap();
        let ckm = client_finish(state, &reply).unwrap();
        assert_eq!(ckm.0, skm.0);
        assert_ne!(ckm.0, [0u8; KEY_MATERIAL_LEN]);
        assert_ne!(ckm.kh(), &[0u8; 20]);
        // Key file round trip.
        assert_eq!(
            NtorSecretKey::from_bytes(sk.to_bytes()).public(),
            sk.public()
        );
        assert_eq!(
            NtorPublicKey::from_hex(&sk.public().to_hex()).unwrap(),
            sk.public()
        );
    }

    #[test]
    fn tampered_reply_rejected() {
        let mut rng = rand::thread_rng();
        let sk = NtorSecretKey::generate(&mut rng);
        let id = [1u8; 20];
        for pos in [0, 17, 31, 32, 45, 63] {
            let (state, skin) = client_create(&mut rng, &id, &sk.public());
            let (mut reply, _) = server_handshake(&mut rng, &id, &sk, &skin).unwrap();
            reply[pos] ^= 0x40;
            assert_eq!(
                client_finish(state, &reply).unwrap_err(),
                CryptoError::HandshakeFailed,
                "byte {pos}"
            );
        }
        let (state, _) = client_create(&mut rng, &id, &sk.public());
        assert!(matches!(
            client_finish(state, &[0u8; 63]),
            Err(CryptoError::BadLength { .. })
        ));
    }

    #[test]
    fn wrong_relay_rejected() {
        let mut rng = rand::thread_rng();
        let sk = NtorSecretKey::generate(&mut rng);
        let other = NtorSecretKey::generate(&mut rng);
        let id = [1u8; 20];
        let (_, skin) = client_create(&mut rng, &[2u8; 20], &sk.public());
        assert_eq!(
            server_handshake(&mut rng, &id, &sk, &skin).unwrap_err(),
            CryptoError::WrongRelayKey
        );
        let (_, skin) = client_create(&mut rng, &id, &other.public());
        assert_eq!(
            server_handshake(&mut rng, &id, &sk, &skin).unwrap_err(),
            CryptoError::WrongRelayKey
        );
        assert!(matches!(
            server_handshake(&mut rng, &id, &sk, &skin[..83]),
            Err(CryptoError::BadLength { .. })
        ));
    }

    #[test]
    fn degenerate_points_rejected() {
        let mut rng = rand::thread_rng();
        let sk = NtorSecretKey::generate(&mut rng);
        let id = [3u8; 20];
        // u = 0 and u = 1 are small-order points: every DH result with them is all zeros.
        for small in [[0u8; 32], {
            let mut one = [0u8; 32];
            one[0] = 1;
            one
        }] {
            let mut skin = [0u8; NTOR_ONIONSKIN_LEN];
            skin[..20].copy_from_slice(&id);
            skin[20..52].copy_from_slice(&sk.public().0);
            skin[52..].copy_from_slice(&small);
            assert_eq!(
                server_handshake(&mut rng, &id, &sk, &skin).unwrap_err(),
                CryptoError::HandshakeFailed
            );

            // A reply with Y = small is refused whatever its AUTH (the DH result is zero).
            let (state, _) = client_create(&mut rng, &id, &sk.public());
            let mut reply = [0u8; NTOR_REPLY_LEN];
            reply[..32].copy_from_slice(&small);
            assert_eq!(
                client_finish(state, &reply).unwrap_err(),
                CryptoError::HandshakeFailed
            );
        }
        // A relay with an all-zero onion key can never complete a handshake.
        let zero_key = NtorPublicKey([0u8; 32]);
        let (state, _) = client_create(&mut rng, &id, &zero_key);
        assert_eq!(
            client_finish(state, &[5u8; 64]).unwrap_err(),
            CryptoError::HandshakeFailed
        );
    }
}
