//! Relay descriptors: what a relay tells the authority about itself, signed with its
//! own Ed25519 identity.

use std::net::SocketAddr;

use chive_crypto::{IdentityKey, IdentityKeypair};
use serde::{Deserialize, Serialize};

use crate::document;
use crate::policy::ExitPolicy;
use crate::DirError;

/// Largest accepted descriptor document, in bytes.
pub const MAX_DESCRIPTOR_LEN: usize = 64 * 1024;
/// Longest accepted version string.
const MAX_VERSION_LEN: usize = 128;
/// First word of a descriptor's header line; the version number follows.
const HEADER: &str = "chive-descriptor 1";

/// A relay's self-description, as published to the authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayDescriptor {
    /// 1-19 ASCII letters or digits (Tor's rule).
    pub nickname: String,
    /// The relay's Ed25519 identity; the descriptor is signed with it.
    pub identity: IdentityKey,
    /// The ntor onion key (x25519 public key).
    pub ntor_key: [u8; 32],
    /// Where the relay's ORPort listens.
    pub address: SocketAddr,
    /// Bytes per second the relay can carry: its BandwidthRate, or a large default if
    /// unlimited.
    pub bandwidth: u64,
    /// The relay's exit policy.
    pub exit_policy: ExitPolicy,
    /// Link/protocol feature bits the relay supports.
    pub features: u64,
    /// When the relay made this descriptor (UNIX seconds).
    pub published: u64,
    /// Seconds the relay has been running.
    pub uptime: u64,
    /// Software version, free text (printable ASCII, at most 128 bytes).
    pub version: String,
}

/// The JSON body: keys as hex so the document stays plain text.
#[derive(Serialize, Deserialize)]
struct Body {
    nickname: String,
    identity: String,
    ntor_key: String,
    address: SocketAddr,
    bandwidth: u64,
    exit_policy: ExitPolicy,
    features: u64,
    published: u64,
    uptime: u64,
    version: String,
}

/// Whether `nick` is a valid relay nickname: 1-19 ASCII letters or digits.
pub fn valid_nickname(nick: &str) -> bool {
    (1..=19).contains(&nick.len()) && nick.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Checks shared by descriptors and consensus entries: a usable nickname and address.
pub(crate) fn check_relay(nickname: &str, address: &SocketAddr) -> Result<(), DirError> {
    if !valid_nickname(nickname) {
        return Err(DirError::BadNickname(nickname.chars().take(40).collect()));
    }
    if address.port() == 0 || address.ip().is_unspecified() {
        return Err(DirError::Malformed(format!(
            "relay {nickname} has unusable address {address}"
        )));
    }
    Ok(())
}

/// Parse 64 lower-case hex digits into 32 bytes.
pub(crate) fn parse_key32(hex_str: &str, what: &str) -> Result<[u8; 32], DirError> {
    let bad = || DirError::Malformed(format!("{what} is not 64 lower-case hex digits"));
    if hex_str.len() != 64 || !document::is_lower_hex(hex_str) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_str, &mut out).map_err(|_| bad())?;
    Ok(out)
}

impl RelayDescriptor {
    /// The signed text document: header with the identity, JSON body, signature line.
    pub fn sign(&self, key: &IdentityKeypair) -> String {
        let body = Body {
            nickname: self.nickname.clone(),
            identity: self.identity.to_hex(),
            ntor_key: hex::encode(self.ntor_key),
            address: self.address,
            bandwidth: self.bandwidth,
            exit_policy: self.exit_policy.clone(),
            features: self.features,
            published: self.published,
            uptime: self.uptime,
            version: self.version.clone(),
        };
        // Serializing plain structs with string keys cannot fail.
        let json = serde_json::to_string(&body).unwrap_or_default();
        document::sign(&format!("{HEADER} {}", key.public().to_hex()), &json, key)
    }

    /// Parse and check a descriptor document: size, the signature by the identity
    /// named in its header (checked before the body is read), then the body (which must
    /// name the same identity), nickname, address and version.
    pub fn verify(doc: &str) -> Result<RelayDescriptor, DirError> {
        if doc.len() > MAX_DESCRIPTOR_LEN {
            return Err(DirError::TooLarge {
                what: "descriptor",
                size: doc.len(),
                max: MAX_DESCRIPTOR_LEN,
            });
        }
        let (signed, sig) = document::split(doc).ok_or(DirError::BadDescriptorSignature)?;
        let (header, body) = document::parts(signed).ok_or(DirError::BadDescriptorSignature)?;
        let (id_hex, identity) = Self::header_identity(header)?;
        identity
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| DirError::BadDescriptorSignature)?;
        Self::parse_signed(id_hex, identity, body)
    }

    /// The identity a descriptor's header line names (and its hex form), before anything
    /// else is believed: the signature is checked against it.
    pub(crate) fn header_identity(header: &str) -> Result<(&str, IdentityKey), DirError> {
        let id_hex = header
            .strip_prefix(HEADER)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or(DirError::BadDescriptorSignature)?;
        if id_hex.len() != 64 || !document::is_lower_hex(id_hex) {
            return Err(DirError::BadDescriptorSignature);
        }
        let identity =
            IdentityKey::from_hex(id_hex).map_err(|_| DirError::BadDescriptorSignature)?;
        Ok((id_hex, identity))
    }

    /// The checks of [`RelayDescriptor::verify`] after the signature by `identity` (whose hex
    /// form is `id_hex`, from the header): the body and its fields.
    pub(crate) fn parse_signed(
        id_hex: &str,
        identity: IdentityKey,
        body: &str,
    ) -> Result<RelayDescriptor, DirError> {
        let b: Body = serde_json::from_str(body)
            .map_err(|e| DirError::Malformed(format!("descriptor body: {e}")))?;
        if b.identity != id_hex {
            return Err(DirError::Malformed(
                "descriptor body names another identity than its header".into(),
            ));
        }
        check_relay(&b.nickname, &b.address)?;
        if b.version.len() > MAX_VERSION_LEN
            || !b.version.bytes().all(|c| (0x20..0x7f).contains(&c))
        {
            return Err(DirError::Malformed(format!(
                "descriptor version must be at most {MAX_VERSION_LEN} printable ASCII bytes"
            )));
        }
        Ok(RelayDescriptor {
            nickname: b.nickname,
            identity,
            ntor_key: parse_key32(&b.ntor_key, "ntor key")?,
            address: b.address,
            bandwidth: b.bandwidth,
            exit_policy: b.exit_policy,
            features: b.features,
            published: b.published,
            uptime: b.uptime,
            version: b.version,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A test keypair from a one-byte seed.
    pub(crate) fn keypair(n: u8) -> IdentityKeypair {
        IdentityKeypair::from_secret_bytes(&[n; 32])
    }

    /// A test descriptor for the relay with seed `n`.
    pub(crate) fn desc(n: u8, bandwidth: u64) -> (RelayDescriptor, IdentityKeypair) {
        let kp = keypair(n);
        let d = RelayDescriptor {
            nickname: format!("relay{n}"),
            identity: kp.public(),
            ntor_key: [n.wrapping_add(100); 32],
            address: format!("127.0.0.1:{}", 9000 + u16::from(n))
                .parse()
                .unwrap(),
            bandwidth,
            exit_policy: ExitPolicy::parse(&["accept 127.0.0.0/8:*", "reject *:*"], false).unwrap(),
            features: 0b101,
            published: 1_700_000_000,
            uptime: 3600,
            version: "chive 0.1.0".into(),
        };
        (d, kp)
    }

    #[test]
    fn round_trip() {
        let (d, kp) = desc(1, 5_000_000);
        let doc = d.sign(&kp);
        assert!(doc.starts_with("chive-descriptor 1 "));
        assert_eq!(RelayDescriptor::verify(&doc).unwrap(), d);
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let (d, kp) = desc(2, 1);
        let doc = d.sign(&kp);
        for i in 0..doc.len() {
            for bit in [0x01u8, 0x20] {
                let mut bytes = doc.clone().into_bytes();
                bytes[i] ^= bit;
                let Ok(t) = String::from_utf8(bytes) else {
                    continue;
                };
                assert_eq!(
                    RelayDescriptor::verify(&t),
                    Err(DirError::BadDescriptorSignature),
                    "byte {i} ^ {bit:#x}"
                );
            }
        }
    }

    #[test]
    fn signed_by_another_key_fails() {
        let (d, _) = desc(3, 1);
        // Signed by key 4 while the body claims identity 3.
        let doc = d.sign(&keypair(4));
        assert!(matches!(
            RelayDescriptor::verify(&doc),
            Err(DirError::Malformed(m)) if m.contains("another identity")
        ));
        // Header rewritten to claim identity 3: the signature no longer matches.
        let forged = doc.replacen(&keypair(4).public().to_hex(), &d.identity.to_hex(), 1);
        assert_eq!(
            RelayDescriptor::verify(&forged),
            Err(DirError::BadDescriptorSignature)
        );
    }

    #[test]
    fn bad_fields_rejected() {
        let (mut d, kp) = desc(5, 1);
        d.nickname = "bad-name".into();
        assert!(matches!(
            RelayDescriptor::verify(&d.sign(&kp)),
            Err(DirError::BadNickname(_))
        ));
        d.nickname = "a".repeat(20);
        assert!(matches!(
            RelayDescriptor::verify(&d.sign(&kp)),
            Err(DirError::BadNickname(_))
        ));
        d.nickname = "ok".into();
        d.address = "0.0.0.0:9001".parse().unwrap();
        assert!(matches!(
            RelayDescriptor::verify(&d.sign(&kp)),
            Err(DirError::Malformed(_))
        ));
        d.address = "127.0.0.1:9001".parse().unwrap();
        d.version = "x\ny".into();
        assert!(matches!(
            RelayDescriptor::verify(&d.sign(&kp)),
            Err(DirError::Malformed(_))
        ));
        d.version = "v".repeat(MAX_DESCRIPTOR_LEN);
        assert!(matches!(
            RelayDescriptor::verify(&d.sign(&kp)),
            Err(DirError::TooLarge {
                what: "descriptor",
                ..
            })
        ));
        assert_eq!(
            RelayDescriptor::verify(""),
            Err(DirError::BadDescriptorSignature)
        );
        assert_eq!(
            RelayDescriptor::verify("<html>nope</html>\n"),
            Err(DirError::BadDescriptorSignature)
        );
    }
}
