//! Ed25519 identities: relays and authorities sign descriptors, consensuses and
//! link authentication with them.

use ed25519_dalek::{Signer, Verifier};
use rand_core::{CryptoRng, RngCore};
use sha1::{Digest, Sha1};

use crate::CryptoError;

/// Length of an Ed25519 public key.
pub const IDENTITY_LEN: usize = 32;
/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

/// A long-term Ed25519 signing key (relay or authority identity).
pub struct IdentityKeypair(ed25519_dalek::SigningKey);

/// The public half of an [`IdentityKeypair`]: how a relay is named in the consensus.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityKey([u8; IDENTITY_LEN]);

/// An Ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(pub [u8; SIGNATURE_LEN]);

impl IdentityKeypair {
    /// A fresh random identity.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        Self::from_secret_bytes(&seed)
    }

    /// Rebuild a keypair from its 32-byte secret seed.
    pub fn from_secret_bytes(seed: &[u8; 32]) -> Self {
        IdentityKeypair(ed25519_dalek::SigningKey::from_bytes(seed))
    }

    /// The 32-byte secret seed, for storing in a key file.
    pub fn secret_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The public identity.
    pub fn public(&self) -> IdentityKey {
        IdentityKey(self.0.verifying_key().to_bytes())
    }

    /// Sign `msg`.
    pub fn sign(&self, msg: &[u8]) -> Signature {
        Signature(self.0.sign(msg).to_bytes())
    }
}

impl IdentityKey {
    /// Parse a public key; fails if the bytes are not a valid curve point.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CryptoError> {
        let arr: [u8; IDENTITY_LEN] = bytes.try_into().map_err(|_| CryptoError::BadLength {
            what: "identity key",
            expected: IDENTITY_LEN,
            got: bytes.len(),
        })?;
        ed25519_dalek::VerifyingKey::from_bytes(&arr).map_err(|_| CryptoError::BadKey)?;
        Ok(IdentityKey(arr))
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

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; IDENTITY_LEN] {
        &self.0
    }

    /// The 20-byte relay ID used where tor-spec expects an RSA identity digest
    /// (the ntor handshake's `ID`, the legacy link specifier): SHA-1 of the Ed25519 key.
    pub fn ntor_id(&self) -> [u8; 20] {
        Sha1::digest(self.0).into()
    }

    /// Verify `sig` over `msg`.
    pub fn verify(&self, msg: &[u8], sig: &Signature) -> Result<(), CryptoError> {
        let key =
            ed25519_dalek::VerifyingKey::from_bytes(&self.0).map_err(|_| CryptoError::BadKey)?;
        let sig = ed25519_dalek::Signature::from_bytes(&sig.0);
        key.verify(msg, &sig).map_err(|_| CryptoError::BadSignature)
    }
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdentityKey({})", &self.to_hex()[..16])
    }
}

impl std::fmt::Display for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Signature {
    /// Parse from 64 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CryptoError> {
        let arr: [u8; SIGNATURE_LEN] = bytes.try_into().map_err(|_| CryptoError::BadLength {
            what: "signature",
            expected: SIGNATURE_LEN,
            got: bytes.len(),
        })?;
        Ok(Signature(arr))
    }

    /// Parse from 128 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, CryptoError> {
        let bytes = hex::decode(s.trim()).map_err(|_| CryptoError::BadHex)?;
        Self::from_bytes(&bytes)
    }

    /// Lower-case hex encoding.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signature({}…)", &self.to_hex()[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_tamper() {
        let kp = IdentityKeypair::generate(&mut rand::thread_rng());
        let sig = kp.sign(b"consensus body");
        kp.public().verify(b"consensus body", &sig).unwrap();
        assert_eq!(
            kp.public().verify(b"consensus bodY", &sig),
            Err(CryptoError::BadSignature)
        );
        let again = IdentityKeypair::from_secret_bytes(&kp.secret_bytes());
        assert_eq!(again.public(), kp.public());
        assert_eq!(
            IdentityKey::from_hex(&kp.public().to_hex()).unwrap(),
            kp.public()
        );
    }

    #[test]
    fn rejects_bad_lengths() {
        assert!(IdentityKey::from_bytes(&[0u8; 31]).is_err());
        assert!(Signature::from_bytes(&[0u8; 63]).is_err());
        assert!(IdentityKey::from_hex("zz").is_err());
    }
}
