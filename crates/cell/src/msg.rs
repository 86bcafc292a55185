//! Message bodies carried in cells: circuit messages (CREATE2, DESTROY, …), relay messages
//! (BEGIN, END, EXTEND2, …) and link messages (VERSIONS, LINK_FEATURES, AUTHENTICATE).
//!
//! This file holds the messages that build and tear down circuits (CREATE2, CREATED2,
//! EXTEND2 with its link specifiers, EXTENDED2, DESTROY); `stream` the relay messages of
//! streams (BEGIN … RESOLVED); `link` the messages of a connection's handshake; `onion` the
//! relay messages of onion services (ESTABLISH_INTRO … RENDEZVOUS2); `switching` those of
//! circuit switching (SWITCH_CONN … CONGESTED); `circ_ext` the extensions ntor v3 carries
//! inside CREATE2/CREATED2 (congestion-control negotiation). All are re-exported here.
//!
//! Formats follow tor-spec. Every `decode` takes the body (a fixed cell's 509-byte payload or a
//! relay cell's data) and ignores trailing zero padding where tor-spec's format is
//! self-delimiting. Decoding never panics on any input.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use crate::reader::Reader;
use crate::CellError;

mod circ_ext;
mod link;
mod onion;
mod stream;
mod switching;

pub use circ_ext::*;
pub use link::*;
pub use onion::*;
pub use stream::*;
pub use switching::*;

/// Write a 16-bit length prefix, failing if `len` does not fit.
fn put_len16(out: &mut Vec<u8>, what: &'static str, len: usize) -> Result<(), CellError> {
    let l = u16::try_from(len).map_err(|_| CellError::TooLong {
        what,
        max: 65535,
        got: len,
    })?;
    out.extend_from_slice(&l.to_be_bytes());
    Ok(())
}

/// Write an 8-bit length prefix, failing if `len` does not fit.
fn put_len8(out: &mut Vec<u8>, what: &'static str, len: usize) -> Result<(), CellError> {
    let l = u8::try_from(len).map_err(|_| CellError::TooLong {
        what,
        max: 255,
        got: len,
    })?;
    out.push(l);
    Ok(())
}

/// CREATE2 body: HTYPE (2) HLEN (2) HDATA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create2 {
    /// Handshake type (2 = ntor).
    pub handshake_type: u16,
    /// The client's handshake message (ntor onionskin).
    pub handshake: Vec<u8>,
}

impl Create2 {
    /// Encode; fails if the handshake is longer than 65535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = Vec::with_capacity(4 + self.handshake.len());
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Append the encoding to `out` (shared with EXTEND2).
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CellError> {
        out.extend_from_slice(&self.handshake_type.to_be_bytes());
        put_len16(out, "CREATE2 handshake", self.handshake.len())?;
        out.extend_from_slice(&self.handshake);
        Ok(())
    }

    /// Decode; trailing bytes (cell padding) are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Self::read(&mut Reader::new(body, "CREATE2"))
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, CellError> {
        let handshake_type = r.u16()?;
        let len = usize::from(r.u16()?);
        let handshake = r.take(len)?.to_vec();
        Ok(Create2 {
            handshake_type,
            handshake,
        })
    }
}

/// Encode HLEN (2) HDATA.
fn encode_hdata(what: &'static str, h: &[u8]) -> Result<Vec<u8>, CellError> {
    let mut out = Vec::with_capacity(2 + h.len());
    put_len16(&mut out, what, h.len())?;
    out.extend_from_slice(h);
    Ok(out)
}

/// Decode HLEN (2) HDATA, ignoring trailing bytes.
fn decode_hdata(what: &'static str, body: &[u8]) -> Result<Vec<u8>, CellError> {
    let mut r = Reader::new(body, what);
    let len = usize::from(r.u16()?);
    Ok(r.take(len)?.to_vec())
}

/// CREATED2 body: HLEN (2) HDATA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created2 {
    /// The relay's handshake reply.
    pub handshake: Vec<u8>,
}

impl Created2 {
    /// Encode; fails if the handshake is longer than 65535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        encode_hdata("CREATED2 handshake", &self.handshake)
    }

    /// Decode; trailing bytes (cell padding) are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(Created2 {
            handshake: decode_hdata("CREATED2", body)?,
        })
    }
}

/// EXTENDED2 body (relay message): same layout as CREATED2, HLEN (2) HDATA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extended2 {
    /// The new hop's handshake reply.
    pub handshake: Vec<u8>,
}

impl Extended2 {
    /// Encode; fails if the handshake is longer than 65535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        encode_hdata("EXTENDED2 handshake", &self.handshake)
    }

    /// Decode; trailing bytes are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(Extended2 {
            handshake: decode_hdata("EXTENDED2", body)?,
        })
    }
}

impl From<Created2> for Extended2 {
    fn from(c: Created2) -> Self {
        Extended2 {
            handshake: c.handshake,
        }
    }
}

impl From<Extended2> for Created2 {
    fn from(e: Extended2) -> Self {
        Created2 {
            handshake: e.handshake,
        }
    }
}

/// Why a circuit was destroyed (DESTROY cell, TRUNCATED message).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DestroyReason(pub u8);

impl DestroyReason {
    /// No reason given.
    pub const NONE: Self = Self(0);
    /// Protocol violation.
    pub const PROTOCOL: Self = Self(1);
    /// Internal error.
    pub const INTERNAL: Self = Self(2);
    /// The other side asked for it.
    pub const REQUESTED: Self = Self(3);
    /// Relay is hibernating.
    pub const HIBERNATING: Self = Self(4);
    /// Out of memory, sockets or circuit ids.
    pub const RESOURCELIMIT: Self = Self(5);
    /// Could not connect to the next relay.
    pub const CONNECTFAILED: Self = Self(6);
    /// The next relay had the wrong identity.
    pub const OR_IDENTITY: Self = Self(7);
    /// The channel carrying this circuit closed.
    pub const CHANNEL_CLOSED: Self = Self(8);
    /// Circuit expired or was finished.
    pub const FINISHED: Self = Self(9);
    /// Circuit construction took too long.
    pub const TIMEOUT: Self = Self(10);
    /// The circuit was destroyed without a client TRUNCATE.
    pub const DESTROYED: Self = Self(11);
    /// Request for an unknown onion service.
    pub const NOSUCHSERVICE: Self = Self(12);

    /// Name as in tor-spec, or `None` for an unknown number.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "NONE",
            1 => "PROTOCOL",
            2 => "INTERNAL",
            3 => "REQUESTED",
            4 => "HIBERNATING",
            5 => "RESOURCELIMIT",
            6 => "CONNECTFAILED",
            7 => "OR_IDENTITY",
            8 => "CHANNEL_CLOSED",
            9 => "FINISHED",
            10 => "TIMEOUT",
            11 => "DESTROYED",
            12 => "NOSUCHSERVICE",
            _ => return None,
        })
    }
}

impl std::fmt::Display for DestroyReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "UNKNOWN({})", self.0),
        }
    }
}

/// DESTROY body: reason (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Destroy {
    /// Why.
    pub reason: DestroyReason,
}

impl Destroy {
    /// Encode (one byte).
    pub fn encode(&self) -> Vec<u8> {
        vec![self.reason.0]
    }

    /// Decode; an empty body is an error, trailing bytes are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let reason = Reader::new(body, "DESTROY").u8()?;
        Ok(Destroy {
            reason: DestroyReason(reason),
        })
    }
}

/// A link specifier in EXTEND2: how to reach and authenticate the next hop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkSpec {
    /// Type 0: IPv4 address and port (6 bytes).
    Ipv4(SocketAddrV4),
    /// Type 1: IPv6 address and port (18 bytes).
    Ipv6(SocketAddrV6),
    /// Type 2: the 20-byte legacy identity (chive: SHA-1 of the Ed25519 identity).
    LegacyId([u8; 20]),
    /// Type 3: Ed25519 identity (32 bytes).
    Ed25519Id([u8; 32]),
    /// Any other type, kept so that it can be passed on unchanged.
    Unrecognized {
        /// Link specifier type.
        ty: u8,
        /// Raw body (at most 255 bytes).
        data: Vec<u8>,
    },
}

impl LinkSpec {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CellError> {
        let (ty, body): (u8, Vec<u8>) = match self {
            LinkSpec::Ipv4(a) => {
                let mut b = a.ip().octets().to_vec();
                b.extend_from_slice(&a.port().to_be_bytes());
                (0, b)
            }
            LinkSpec::Ipv6(a) => {
                let mut b = a.ip().octets().to_vec();
                b.extend_from_slice(&a.port().to_be_bytes());
                (1, b)
            }
            LinkSpec::LegacyId(id) => (2, id.to_vec()),
            LinkSpec::Ed25519Id(id) => (3, id.to_vec()),
            LinkSpec::Unrecognized { ty, data } => {
                if *ty <= 3 {
                    // Would decode as a different variant: refuse to produce it.
                    return Err(CellError::Invalid {
                        what: "link specifier",
                        why: "Unrecognized uses a known type number",
                    });
                }
                (*ty, data.clone())
            }
        };
        out.push(ty);
        put_len8(out, "link specifier", body.len())?;
        out.extend_from_slice(&body);
        Ok(())
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, CellError> {
        let ty = r.u8()?;
        let len = usize::from(r.u8()?);
        let body = r.take(len)?;
        let mut b = Reader::new(body, "link specifier");
        let wrong = |expected| CellError::WrongLength {
            what: "link specifier",
            expected,
            got: len,
        };
        Ok(match ty {
            0 => {
                if len != 6 {
                    return Err(wrong(6));
                }
                let ip = Ipv4Addr::from(b.array::<4>()?);
                LinkSpec::Ipv4(SocketAddrV4::new(ip, b.u16()?))
            }
            1 => {
                if len != 18 {
                    return Err(wrong(18));
                }
                let ip = Ipv6Addr::from(b.array::<16>()?);
                LinkSpec::Ipv6(SocketAddrV6::new(ip, b.u16()?, 0, 0))
            }
            2 => {
                if len != 20 {
                    return Err(wrong(20));
                }
                LinkSpec::LegacyId(b.array()?)
            }
            3 => {
                if len != 32 {
                    return Err(wrong(32));
                }
                LinkSpec::Ed25519Id(b.array()?)
            }
            _ => LinkSpec::Unrecognized {
                ty,
                data: body.to_vec(),
            },
        })
    }
}

/// EXTEND2 body: NSPEC (1), link specifiers, then a CREATE2 body (HTYPE HLEN HDATA).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extend2 {
    /// How to reach the next hop (at most 255).
    pub link_specifiers: Vec<LinkSpec>,
    /// The handshake for the next hop.
    pub create2: Create2,
}

impl Extend2 {
    /// Encode; fails if there are more than 255 specifiers or a field is too long.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = Vec::with_capacity(128 + self.create2.handshake.len());
        put_len8(
            &mut out,
            "EXTEND2 link specifiers",
            self.link_specifiers.len(),
        )?;
        for ls in &self.link_specifiers {
            ls.encode_into(&mut out)?;
        }
        self.create2.encode_into(&mut out)?;
        Ok(out)
    }

    /// Decode; trailing bytes are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "EXTEND2");
        let n = r.u8()?;
        // At most 255 entries, each at least 2 bytes: bounded by the body length anyway.
        let mut link_specifiers = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            link_specifiers.push(LinkSpec::read(&mut r)?);
        }
        let create2 = Create2::read(&mut r)?;
        Ok(Extend2 {
            link_specifiers,
            create2,
        })
    }
}
