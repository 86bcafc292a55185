//! Link messages, exchanged once per connection: VERSIONS, LINK_FEATURES, BIND, HANDOFF,
//! AUTHENTICATE.

use crate::reader::Reader;
use crate::CellError;

/// VERSIONS body: a list of 2-byte link protocol versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// Supported versions.
    pub versions: Vec<u16>,
}

impl Versions {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        self.versions.iter().flat_map(|v| v.to_be_bytes()).collect()
    }

    /// Decode; an odd length is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let chunks = body.chunks_exact(2);
        if !chunks.remainder().is_empty() {
            return Err(CellError::Invalid {
                what: "VERSIONS",
                why: "odd length",
            });
        }
        let versions = chunks.map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        Ok(Versions { versions })
    }

    /// The highest version present in both lists, if any.
    pub fn best_common(&self, other: &Versions) -> Option<u16> {
        self.versions
            .iter()
            .copied()
            .filter(|v| other.versions.contains(v))
            .max()
    }
}

/// LINK_FEATURES body (chive's own, command 133): a 64-bit feature bit set, big-endian.
/// Trailing bytes are ignored so that later versions can add fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkFeatures {
    /// Feature bits.
    pub features: u64,
}

impl LinkFeatures {
    /// Encode (8 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.features.to_be_bytes().to_vec()
    }

    /// Decode; fewer than 8 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let features = u64::from_be_bytes(Reader::new(body, "LINK_FEATURES").array()?);
        Ok(LinkFeatures { features })
    }
}

/// BIND body (chive's own, command 134): the 32-byte token both ends of a channel's first
/// connection derive from its TLS session (chive-net's `Link::bind_token`), then `seq` (4,
/// big-endian): the sequence number of the sender's next HANDOFF, the one that will switch its
/// writing onto this connection. The receiver may still have earlier markers (of an older
/// second connection) to read on the first connection; `seq` tells it to apply those first.
/// Exactly 36 bytes; the 32-byte body of earlier versions (no `seq`) is still accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The channel's bind token.
    pub token: [u8; 32],
    /// The sender's next HANDOFF sequence number (`None`: a 32-byte BIND of an earlier version).
    pub seq: Option<u32>,
}

impl Bind {
    /// Encoded length.
    pub const LEN: usize = 36;
    /// Encoded length of an earlier version's BIND (token only).
    pub const LEN_V1: usize = 32;

    /// Encode (36 bytes; 32 without `seq`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.token.to_vec();
        if let Some(seq) = self.seq {
            out.extend_from_slice(&seq.to_be_bytes());
        }
        out
    }

    /// Decode; the body must be exactly 36 (or 32) bytes (no slack in authentication data).
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.len() != Self::LEN && body.len() != Self::LEN_V1 {
            return Err(CellError::WrongLength {
                what: "BIND",
                expected: Self::LEN,
                got: body.len(),
            });
        }
        let mut r = Reader::new(body, "BIND");
        let token = r.array()?;
        let seq = if body.len() == Self::LEN {
            Some(r.u32()?)
        } else {
            None
        };
        Ok(Bind { token, seq })
    }
}

/// HANDOFF body (chive's own, command 135): `seq` (4, big-endian), `cells` (8, big-endian),
/// `flags` (1). Trailing bytes are ignored so that later versions can add fields.
///
/// `seq` numbers the sender's switches on a channel from 0; `cells` is how many cells the sender
/// wrote on the connection it leaves since its previous switch (so the receiver can check that
/// none is missing); `flags` bit 0 ([`Handoff::RECOVERY`]) marks a marker sent on the connection
/// the sender resumes because the one it leaves failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handoff {
    /// Switch number, from 0 on each channel.
    pub seq: u32,
    /// Cells written on the connection being left, in this epoch.
    pub cells: u64,
    /// Flag bits.
    pub flags: u8,
}

impl Handoff {
    /// Encoded length.
    pub const LEN: usize = 13;
    /// Flag: sent on the connection being resumed, because the one being left failed.
    pub const RECOVERY: u8 = 1;

    /// Encode (13 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.cells.to_be_bytes());
        out.push(self.flags);
        out
    }

    /// Decode; fewer than 13 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "HANDOFF");
        Ok(Handoff {
            seq: r.u32()?,
            cells: u64::from_be_bytes(r.array()?),
            flags: r.u8()?,
        })
    }

    /// Whether this is a recovery marker (see [`Handoff::RECOVERY`]).
    pub fn is_recovery(&self) -> bool {
        self.flags & Self::RECOVERY != 0
    }
}

/// AUTHENTICATE body (chive's layout): Ed25519 identity (32) and signature (64).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticate {
    /// The relay's Ed25519 identity key.
    pub identity: [u8; 32],
    /// Its signature over the link's authentication transcript.
    pub signature: [u8; 64],
}

impl Authenticate {
    /// Encoded length.
    pub const LEN: usize = 96;

    /// Encode (96 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.identity);
        out.extend_from_slice(&self.signature);
        out
    }

    /// Decode; the body must be exactly 96 bytes (no slack in authentication data).
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.len() != Self::LEN {
            return Err(CellError::WrongLength {
                what: "AUTHENTICATE",
                expected: Self::LEN,
                got: body.len(),
            });
        }
        let mut r = Reader::new(body, "AUTHENTICATE");
        Ok(Authenticate {
            identity: r.array()?,
            signature: r.array()?,
        })
    }
}
