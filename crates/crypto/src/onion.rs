//! Onion service addresses, exactly as rend-spec v3 ("Encoding onion addresses") computes them:
//!
//! ```text
//! onion_address = base32(PUBKEY | CHECKSUM | VERSION) + ".onion"
//! CHECKSUM      = SHA3-256(".onion checksum" | PUBKEY | VERSION)[:2]
//! VERSION       = 0x03
//! ```
//!
//! `PUBKEY` is the service's Ed25519 identity key (an [`IdentityKey`]; the service signs with
//! the matching [`crate::IdentityKeypair`]). The 35 bytes encode to exactly 56 base32
//! characters (RFC 4648 alphabet, lower case, no padding since 35 is a multiple of 5).
//!
//! Also here: the service's subcredential, the value that binds the hs-ntor handshake
//! ([`crate::hs_ntor`]) to one service. Chive does not blind keys (see docs/protocol.md,
//! "Onion services"), so the blinded key of rend-spec's formula is the identity key itself.

use sha3::{Digest, Sha3_256};

use crate::identity::{IdentityKey, IDENTITY_LEN};

/// The address version chive (like Tor) produces and accepts.
pub const ONION_VERSION: u8 = 3;
/// Characters in an address without the ".onion" suffix.
pub const ONION_ADDRESS_CHARS: usize = 56;
/// Length of the subcredential `N_hs_subcred`.
pub const SUBCREDENTIAL_LEN: usize = 32;

/// Bytes under the base32: PUBKEY (32) | CHECKSUM (2) | VERSION (1).
const RAW_LEN: usize = IDENTITY_LEN + 2 + 1;
const CHECKSUM_PREFIX: &[u8] = b".onion checksum";
const SUFFIX: &str = ".onion";
/// RFC 4648 base32 alphabet, lower case as onion addresses are written.
const BASE32_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Why a string is not a valid v3 onion address. Each case names one check so that a SOCKS
/// front end can say precisely what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OnionAddressError {
    /// Not 56 bytes (before ".onion"); a 16-character v2 address lands here.
    #[error("onion address must be 56 base32 characters, got {0} bytes")]
    BadLength(usize),
    /// A character outside the base32 alphabet.
    #[error("onion address is not valid base32")]
    BadBase32,
    /// The version byte is not 3.
    #[error("onion address version {0} is not supported (only 3)")]
    BadVersion(u8),
    /// The two checksum bytes do not match the key: a typo or a tampered address.
    #[error("onion address checksum does not match")]
    BadChecksum,
    /// Checksum fine but the 32 bytes are not a valid Ed25519 point.
    #[error("onion address does not contain a valid Ed25519 key")]
    BadKey,
}

/// A v3 onion service address: the service's Ed25519 identity key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct OnionAddress(IdentityKey);

impl OnionAddress {
    /// The address of the service with identity key `key`.
    pub fn from_key(key: IdentityKey) -> Self {
        OnionAddress(key)
    }

    /// The service's identity key (verifies its descriptors).
    pub fn key(&self) -> &IdentityKey {
        &self.0
    }

    /// Parse `<56 base32>.onion` or the 56 characters alone; letters in either case.
    /// Subdomains (`www.<addr>.onion`) are not accepted here: the caller strips them.
    pub fn parse(s: &str) -> Result<Self, OnionAddressError> {
        let label = match s.len().checked_sub(SUFFIX.len()) {
            Some(cut) if s.is_char_boundary(cut) && s[cut..].eq_ignore_ascii_case(SUFFIX) => {
                &s[..cut]
            }
            _ => s,
        };
        if label.len() != ONION_ADDRESS_CHARS {
            return Err(OnionAddressError::BadLength(label.len()));
        }
        let raw = base32_decode_35(label.as_bytes()).ok_or(OnionAddressError::BadBase32)?;
        let version = raw[RAW_LEN - 1];
        if version != ONION_VERSION {
            return Err(OnionAddressError::BadVersion(version));
        }
        let mut pubkey = [0u8; IDENTITY_LEN];
        pubkey.copy_from_slice(&raw[..IDENTITY_LEN]);
        // The checksum is public data: a variable-time comparison leaks nothing.
        if raw[IDENTITY_LEN..IDENTITY_LEN + 2] != checksum(&pubkey, version) {
            return Err(OnionAddressError::BadChecksum);
        }
        let key = IdentityKey::from_bytes(&pubkey).map_err(|_| OnionAddressError::BadKey)?;
        Ok(OnionAddress(key))
    }

    /// The 56 base32 characters, without ".onion".
    pub fn label(&self) -> String {
        let mut raw = [0u8; RAW_LEN];
        raw[..IDENTITY_LEN].copy_from_slice(self.0.as_bytes());
        raw[IDENTITY_LEN..IDENTITY_LEN + 2]
            .copy_from_slice(&checksum(self.0.as_bytes(), ONION_VERSION));
        raw[RAW_LEN - 1] = ONION_VERSION;
        base32_encode_35(&raw)
    }

    /// `N_hs_subcred` of rend-spec v3 with the identity key standing in for the blinded key
    /// (chive does not blind):
    /// `SHA3-256("subcredential" | SHA3-256("credential" | A) | A)`.
    pub fn subcredential(&self) -> [u8; SUBCREDENTIAL_LEN] {
        let a = self.0.as_bytes();
        let cred = Sha3_256::new()
            .chain_update(b"credential")
            .chain_update(a)
            .finalize();
        Sha3_256::new()
            .chain_update(b"subcredential")
            .chain_update(cred)
            .chain_update(a)
            .finalize()
            .into()
    }
}

impl std::fmt::Display for OnionAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{SUFFIX}", self.label())
    }
}

impl std::str::FromStr for OnionAddress {
    type Err = OnionAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// `SHA3-256(".onion checksum" | PUBKEY | VERSION)[:2]`.
fn checksum(pubkey: &[u8; IDENTITY_LEN], version: u8) -> [u8; 2] {
    let h = Sha3_256::new()
        .chain_update(CHECKSUM_PREFIX)
        .chain_update(pubkey)
        .chain_update([version])
        .finalize();
    [h[0], h[1]]
}

/// Base32 of exactly 35 bytes (7 groups of 5 bytes -> 8 characters each, no padding).
fn base32_encode_35(raw: &[u8; RAW_LEN]) -> String {
    let mut out = String::with_capacity(ONION_ADDRESS_CHARS);
    for group in raw.chunks_exact(5) {
        let mut bits = 0u64;
        for &b in group {
            bits = (bits << 8) | u64::from(b);
        }
        for i in (0..8).rev() {
            let idx = ((bits >> (5 * i)) & 0x1f) as usize;
            out.push(char::from(BASE32_ALPHABET[idx]));
        }
    }
    out
}

/// Inverse of [`base32_encode_35`]; accepts either case. `None` on a character outside the
/// alphabet. The caller has checked the length (56).
fn base32_decode_35(s: &[u8]) -> Option<[u8; RAW_LEN]> {
    let mut raw = [0u8; RAW_LEN];
    for (group, chars) in raw.chunks_exact_mut(5).zip(s.chunks_exact(8)) {
        let mut bits = 0u64;
        for &c in chars {
            let v = match c.to_ascii_lowercase() {
                c @ b'a'..=b'z' => c - b'a',
                c @ b'2'..=b'7' => c - b'2' + 26,
                _ => return None,
            };
            bits = (bits << 5) | u64::from(v);
        }
        for (i, byte) in group.iter_mut().enumerate() {
            *byte = (bits >> (8 * (4 - i))) as u8;
        }
    }
    Some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdentityKeypair;

    /// The example addresses printed in rend-spec v3, section 6 ("Encoding onion addresses").
    const SPEC_EXAMPLES: [&str; 3] = [
        "pg6mmjiyjmcrsslvykfwnntlaru7p5svn6y2ymmju6nubxndf4pscryd.onion",
        "sp3k262uwy4r2k3ycr5awluarykdpag6a7y33jxop4cs2lu5uz5sseqd.onion",
        "xa4r2iadxm55fbnqgwwi5mymqdcofiu3w6rpbtqn7b2dyn7mgwj64jyd.onion",
    ];

    #[test]
    fn spec_examples_parse_and_reencode() {
        for s in SPEC_EXAMPLES {
            let addr = OnionAddress::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(addr.to_string(), s);
            // Upper case and a missing suffix name the same service.
            assert_eq!(OnionAddress::parse(&s.to_uppercase()).unwrap(), addr);
            assert_eq!(OnionAddress::parse(&s[..56]).unwrap(), addr);
        }
    }

    #[test]
    fn round_trip_from_key() {
        let kp = IdentityKeypair::generate(&mut rand::thread_rng());
        let addr = OnionAddress::from_key(kp.public());
        let s = addr.to_string();
        assert_eq!(s.len(), 56 + 6);
        assert!(
            s.ends_with("d.onion"),
            "version 3 makes the last character 'd'"
        );
        let back: OnionAddress = s.parse().unwrap();
        assert_eq!(back.key(), &kp.public());
    }

    #[test]
    fn base32_matches_rfc4648() {
        // RFC 4648 section 10: BASE32("fooba") = "MZXW6YTB".
        let mut raw = [0u8; RAW_LEN];
        raw[..5].copy_from_slice(b"fooba");
        let enc = base32_encode_35(&raw);
        assert_eq!(&enc[..8], "mzxw6ytb");
        assert_eq!(base32_decode_35(enc.as_bytes()), Some(raw));
    }

    #[test]
    fn refusals_name_the_problem() {
        let good = SPEC_EXAMPLES[0];
        let label = &good[..56];
        assert_eq!(
            OnionAddress::parse("expyuzz4wqqyqhjn.onion"),
            Err(OnionAddressError::BadLength(16)),
            "a v2 address"
        );
        assert_eq!(
            OnionAddress::parse(&format!("{label}a.onion")),
            Err(OnionAddressError::BadLength(57))
        );
        assert_eq!(
            OnionAddress::parse(""),
            Err(OnionAddressError::BadLength(0))
        );
        let bad_char = format!("{}1{}", &label[..10], &label[11..]);
        assert_eq!(
            OnionAddress::parse(&bad_char),
            Err(OnionAddressError::BadBase32)
        );
        let non_ascii = format!("{}é{}", &label[..10], &label[12..]);
        assert!(OnionAddress::parse(&non_ascii).is_err());

        // Flip one key character: the checksum no longer matches.
        let mut typo = label.as_bytes().to_vec();
        typo[3] = if typo[3] == b'a' { b'b' } else { b'a' };
        assert_eq!(
            OnionAddress::parse(std::str::from_utf8(&typo).unwrap()),
            Err(OnionAddressError::BadChecksum)
        );

        // Version 4, with a checksum made for it: refused for the version alone.
        let key = OnionAddress::parse(good).unwrap();
        let mut raw = [0u8; RAW_LEN];
        raw[..32].copy_from_slice(key.key().as_bytes());
        raw[32..34].copy_from_slice(&checksum(key.key().as_bytes(), 4));
        raw[34] = 4;
        assert_eq!(
            OnionAddress::parse(&base32_encode_35(&raw)),
            Err(OnionAddressError::BadVersion(4))
        );
    }

    #[test]
    fn invalid_point_with_valid_checksum_is_refused() {
        // About half of all y values are not on the Ed25519 curve (no x satisfies the curve
        // equation): a correctly checksummed address around one must still be refused.
        let pubkey = (2u8..)
            .map(|y| {
                let mut k = [0u8; 32];
                k[0] = y;
                k
            })
            .find(|k| IdentityKey::from_bytes(k).is_err())
            .expect("some small y is off the curve");
        let mut raw = [0u8; RAW_LEN];
        raw[..32].copy_from_slice(&pubkey);
        raw[32..34].copy_from_slice(&checksum(&pubkey, 3));
        raw[34] = 3;
        assert_eq!(
            OnionAddress::parse(&base32_encode_35(&raw)),
            Err(OnionAddressError::BadKey)
        );
    }

    #[test]
    fn subcredential_binds_the_key() {
        let a = OnionAddress::parse(SPEC_EXAMPLES[0]).unwrap();
        let b = OnionAddress::parse(SPEC_EXAMPLES[1]).unwrap();
        assert_eq!(a.subcredential(), a.subcredential());
        assert_ne!(a.subcredential(), b.subcredential());
    }
}
