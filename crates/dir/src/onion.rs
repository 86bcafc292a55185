//! Onion service descriptors: a service's signed, time-limited list of introduction points.
//!
//! Simplified from rend-spec v3 (the reasons are in docs/protocol.md, "Onion services"): the
//! descriptor is signed directly by the service's identity key (no blinded keys, no signing-key
//! certificate) and is not encrypted (no superencrypted / encrypted layers). It uses the same
//! framing as the other chive documents:
//!
//! ```text
//! chive-onion-descriptor 1 <56-character onion address label>
//! { JSON body on one line }
//! signature <128 lower-case hex: Ed25519 by the service identity over every byte above>
//! ```
//!
//! The header names the address so a verifier checks "is this for the service I asked for"
//! and the signature before it reads the body. Time comes from the caller (`now`, UNIX seconds).

use std::net::SocketAddr;

use chive_crypto::{IdentityKey, IdentityKeypair, NtorPublicKey, OnionAddress};
use serde::{Deserialize, Serialize};

use crate::descriptor::parse_key32;
use crate::document;
use crate::DirError;

/// Largest accepted onion descriptor, in bytes (a full one with 10 intro points is ~4 KiB).
pub const MAX_ONION_DESCRIPTOR_LEN: usize = 16 * 1024;
/// Most introduction points in one descriptor (Tor allows up to 20 and uses 3 by default).
pub const MAX_INTRO_POINTS: usize = 10;
/// Most addresses (IPv4 / IPv6 link specifiers) per introduction point.
pub const MAX_INTRO_ADDRESSES: usize = 4;
/// Longest validity window a descriptor may claim (Tor's maximum descriptor lifetime, 12 h):
/// a leaked descriptor cannot be made to live for ever.
pub const MAX_ONION_DESCRIPTOR_LIFETIME: u64 = 12 * 3600;
/// Clock difference tolerated at both ends of the validity window.
pub const ONION_DESCRIPTOR_CLOCK_SKEW: u64 = 60;
/// First words of the header line; the address label follows.
const HEADER: &str = "chive-onion-descriptor 1";

/// One introduction point: the relay to build a circuit to, and the service's keys for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntroPoint {
    /// The intro relay's Ed25519 identity (Ed25519 and legacy-ID link specifiers).
    pub relay: IdentityKey,
    /// The intro relay's ntor onion key, to extend to it without a consensus entry.
    pub onion_key: NtorPublicKey,
    /// Where the intro relay listens (IPv4 / IPv6 link specifiers), 1 to 4.
    pub addresses: Vec<SocketAddr>,
    /// The intro point auth key (`AUTH_KEY` of ESTABLISH_INTRO and INTRODUCE1).
    pub auth_key: IdentityKey,
    /// The service's hs-ntor encryption key `B` for this intro point.
    pub enc_key: NtorPublicKey,
}

/// A service descriptor, as published and as returned by [`OnionDescriptor::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnionDescriptor {
    /// The service; its identity key signs the descriptor.
    pub address: OnionAddress,
    /// Increases with each new descriptor of the service, so a directory keeps the newest.
    pub revision: u64,
    /// Start of validity (UNIX seconds).
    pub valid_after: u64,
    /// End of validity (UNIX seconds), at most 12 h after `valid_after`.
    pub valid_until: u64,
    /// 1 to [`MAX_INTRO_POINTS`] introduction points.
    pub intro_points: Vec<IntroPoint>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IntroBody {
    relay: String,
    onion_key: String,
    addresses: Vec<SocketAddr>,
    auth_key: String,
    enc_key: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    address: String,
    revision: u64,
    valid_after: u64,
    valid_until: u64,
    intro_points: Vec<IntroBody>,
}

fn parse_ed25519(hex_str: &str, what: &str) -> Result<IdentityKey, DirError> {
    IdentityKey::from_bytes(&parse_key32(hex_str, what)?)
        .map_err(|_| DirError::Malformed(format!("{what} is not a valid Ed25519 key")))
}

impl IntroPoint {
    fn to_body(&self) -> IntroBody {
        IntroBody {
            relay: self.relay.to_hex(),
            onion_key: self.onion_key.to_hex(),
            addresses: self.addresses.clone(),
            auth_key: self.auth_key.to_hex(),
            enc_key: self.enc_key.to_hex(),
        }
    }

    fn from_body(b: IntroBody) -> Result<Self, DirError> {
        if b.addresses.is_empty() || b.addresses.len() > MAX_INTRO_ADDRESSES {
            return Err(DirError::Malformed(format!(
                "intro point needs 1 to {MAX_INTRO_ADDRESSES} addresses, has {}",
                b.addresses.len()
            )));
        }
        if let Some(a) = b
            .addresses
            .iter()
            .find(|a| a.port() == 0 || a.ip().is_unspecified())
        {
            return Err(DirError::Malformed(format!(
                "intro point has unusable address {a}"
            )));
        }
        Ok(IntroPoint {
            relay: parse_ed25519(&b.relay, "intro relay identity")?,
            onion_key: NtorPublicKey(parse_key32(&b.onion_key, "intro relay onion key")?),
            addresses: b.addresses,
            auth_key: parse_ed25519(&b.auth_key, "intro auth key")?,
            enc_key: NtorPublicKey(parse_key32(&b.enc_key, "intro encryption key")?),
        })
    }
}

impl OnionDescriptor {
    /// The signed document. Fails if `key` is not the service's identity (the result could
    /// never verify).
    pub fn sign(&self, key: &IdentityKeypair) -> Result<String, DirError> {
        if &key.public() != self.address.key() {
            return Err(DirError::Malformed(
                "onion descriptor must be signed by the service's identity key".into(),
            ));
        }
        let body = Body {
            address: self.address.label(),
            revision: self.revision,
            valid_after: self.valid_after,
            valid_until: self.valid_until,
            intro_points: self.intro_points.iter().map(IntroPoint::to_body).collect(),
        };
        // Serializing plain structs with string keys cannot fail.
        let json = serde_json::to_string(&body).unwrap_or_default();
        let header = format!("{HEADER} {}", self.address.label());
        Ok(document::sign(&header, &json, key))
    }

    /// Parse and check a descriptor fetched for `expected` at time `now`, in this order: size;
    /// that the header names `expected` ([`DirError::WrongOnionAddress`]); the signature by
    /// `expected`'s key before anything in the body is read
    /// ([`DirError::BadOnionSignature`]); the body ([`DirError::Malformed`]); the validity
    /// window, give or take [`ONION_DESCRIPTOR_CLOCK_SKEW`] ([`DirError::OnionExpired`],
    /// [`DirError::OnionNotYetValid`]).
    pub fn verify(
        doc: &str,
        expected: &OnionAddress,
        now: u64,
    ) -> Result<OnionDescriptor, DirError> {
        if doc.len() > MAX_ONION_DESCRIPTOR_LEN {
            return Err(DirError::TooLarge {
                what: "onion descriptor",
                size: doc.len(),
                max: MAX_ONION_DESCRIPTOR_LEN,
            });
        }
        let (signed, sig) = document::split(doc).ok_or(DirError::BadOnionSignature)?;
        let (header, body) = document::parts(signed).ok_or(DirError::BadOnionSignature)?;
        let label = Self::header_label(header, expected)?;
        expected
            .key()
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| DirError::BadOnionSignature)?;
        Self::parse_signed(label, body, expected, now)
    }

    /// The address label a descriptor's header names, which must be `expected`'s.
    pub(crate) fn header_label<'a>(
        header: &'a str,
        expected: &OnionAddress,
    ) -> Result<&'a str, DirError> {
        let label = header
            .strip_prefix(HEADER)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or(DirError::BadOnionSignature)?;
        if label != expected.label() {
            return Err(DirError::WrongOnionAddress {
                expected: expected.to_string(),
                got: label.chars().take(70).collect(),
            });
        }
        Ok(label)
    }

    /// The checks of [`OnionDescriptor::verify`] after the signature by `expected`'s key: the
    /// body (whose header named `label`) and the validity window.
    pub(crate) fn parse_signed(
        label: &str,
        body: &str,
        expected: &OnionAddress,
        now: u64,
    ) -> Result<OnionDescriptor, DirError> {
        let b: Body = serde_json::from_str(body)
            .map_err(|e| DirError::Malformed(format!("onion descriptor body: {e}")))?;
        if b.address != label {
            return Err(DirError::Malformed(
                "onion descriptor body names another address than its header".into(),
            ));
        }
        if b.intro_points.is_empty() || b.intro_points.len() > MAX_INTRO_POINTS {
            return Err(DirError::Malformed(format!(
                "onion descriptor needs 1 to {MAX_INTRO_POINTS} intro points, has {}",
                b.intro_points.len()
            )));
        }
        if b.valid_until < b.valid_after
            || b.valid_until - b.valid_after > MAX_ONION_DESCRIPTOR_LIFETIME
        {
            return Err(DirError::Malformed(format!(
                "onion descriptor validity {}..{} is not a window of at most {MAX_ONION_DESCRIPTOR_LIFETIME} s",
                b.valid_after, b.valid_until
            )));
        }
        if now.saturating_add(ONION_DESCRIPTOR_CLOCK_SKEW) < b.valid_after {
            return Err(DirError::OnionNotYetValid {
                valid_after: b.valid_after,
                now,
            });
        }
        if b.valid_until.saturating_add(ONION_DESCRIPTOR_CLOCK_SKEW) < now {
            return Err(DirError::OnionExpired {
                valid_until: b.valid_until,
                now,
            });
        }
        let intro_points = b
            .intro_points
            .into_iter()
            .map(IntroPoint::from_body)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OnionDescriptor {
            address: *expected,
            revision: b.revision,
            valid_after: b.valid_after,
            valid_until: b.valid_until,
            intro_points,
        })
    }
}

#[cfg(test)]
#[path = "onion_tests.rs"]
mod tests;
