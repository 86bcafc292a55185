//! chive-crypto: the only home of cryptography in chive.
//!
//! - [`identity`]: Ed25519 identity keys and signatures.
//! - `ntor`: the ntor circuit handshake exactly as tor-spec defines it.
//! - [`ntor_v3`]: ntor v3 (proposal 332), which carries encrypted extensions (chive: the
//!   congestion-control negotiation of proposal 324).
//! - `relay`: Tor's `tor1` relay cell crypto (AES-128-CTR, running SHA-1 digests).
//! - [`onion`]: v3 onion addresses (`<base32>.onion`) and the service subcredential.
//! - [`hs_ntor`]: the onion-service handshake of rend-spec v3 (INTRODUCE / RENDEZVOUS).
//! - [`replay`]: the bounded INTRODUCE2 replay cache of an onion service.
#![forbid(unsafe_code)]

pub mod hs_ntor;
pub mod identity;
pub mod ntor;
pub mod ntor_v3;
pub mod onion;
pub mod relay;
pub mod replay;
mod running_sha1;

pub use hs_ntor::{
    HsIntroPublic, HsIntroSecret, HsKeyMaterial, HsNtorClientState, IntroduceOpened,
};
pub use identity::{IdentityKey, IdentityKeypair, Signature};
pub use ntor::{
    client_create, client_finish, server_handshake, KeyMaterial, NtorClientState, NtorPublicKey,
    NtorSecretKey, KEY_MATERIAL_LEN, NTOR_HTYPE, NTOR_ONIONSKIN_LEN, NTOR_REPLY_LEN, TOR1_KEYS_LEN,
};
pub use onion::{OnionAddress, OnionAddressError};
pub use relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
pub use replay::{IntroReplayCache, Replay};

/// Errors from cryptographic operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// An input had the wrong length.
    #[error("{what} has wrong length: expected {expected}, got {got}")]
    BadLength {
        /// What was being parsed.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// Bytes are not a valid public key.
    #[error("invalid public key")]
    BadKey,
    /// A signature did not verify.
    #[error("signature does not verify")]
    BadSignature,
    /// Input was not valid hex.
    #[error("invalid hex encoding")]
    BadHex,
    /// A handshake's authentication check failed.
    #[error("handshake authentication failed")]
    HandshakeFailed,
    /// An ntor handshake names a relay identity or onion key that is not ours.
    #[error("handshake is for a different relay identity or onion key")]
    WrongRelayKey,
    /// A circuit operation named a hop the circuit does not have.
    #[error("no hop {hop} on a circuit of {len} hops")]
    NoSuchHop {
        /// The hop asked for.
        hop: usize,
        /// Hops the circuit has.
        len: usize,
    },
}
