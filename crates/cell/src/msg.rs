//! Message bodies carried in cells: circuit messages (CREATE2, DESTROY, …), relay messages
//! (BEGIN, END, EXTEND2, …) and link messages (VERSIONS, LINK_FEATURES, AUTHENTICATE).
//!
//! Formats follow tor-spec. Every `decode` takes the body (a fixed cell's 509-byte payload or a
//! relay cell's data) and ignores trailing zero padding where tor-spec's format is
//! self-delimiting. Decoding never panics on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use crate::reader::Reader;
use crate::CellError;

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

/// BEGIN body: "host:port\0" then optional 4-byte flags.
///
/// An IPv6 host travels in brackets (`[::1]:80`) and is stored here without them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begin {
    /// Host name or address literal (IPv6 without brackets).
    pub host: String,
    /// Destination port (never 0).
    pub port: u16,
    /// BEGIN flags (tor-spec: bit 1 IPv6 okay, bit 2 IPv4 not okay, bit 3 IPv6 preferred).
    pub flags: u32,
}

impl Begin {
    /// Encode. Flags are written only when nonzero (as Tor does).
    /// Fails for an empty host, a host containing NUL, a bare ':' outside an IPv6 literal, or port 0.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let what = "BEGIN";
        if self.host.is_empty() {
            return Err(CellError::Invalid {
                what,
                why: "empty host",
            });
        }
        if self.host.contains('\0') {
            return Err(CellError::Invalid {
                what,
                why: "host contains NUL",
            });
        }
        if self.port == 0 {
            return Err(CellError::Invalid {
                what,
                why: "port 0",
            });
        }
        let addrport = if self.host.contains(':') {
            if self.host.parse::<Ipv6Addr>().is_err() {
                return Err(CellError::Invalid {
                    what,
                    why: "host with ':' is not an IPv6 address",
                });
            }
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        };
        let mut out = addrport.into_bytes();
        out.push(0);
        if self.flags != 0 {
            out.extend_from_slice(&self.flags.to_be_bytes());
        }
        Ok(out)
    }

    /// Decode. Rejects non-UTF-8, a missing NUL, a missing or bad port, an empty host, and a
    /// bare IPv6 address without brackets. Fewer than 4 bytes after the NUL means flags = 0.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "BEGIN";
        let nul = body
            .iter()
            .position(|&b| b == 0)
            .ok_or(CellError::Invalid {
                what,
                why: "missing NUL after host:port",
            })?;
        let (addrport, after) = body.split_at(nul);
        let after = after.get(1..).unwrap_or(&[]);
        let flags = match after.get(..4) {
            Some(f) => u32::from_be_bytes([f[0], f[1], f[2], f[3]]),
            None => 0,
        };
        let s = std::str::from_utf8(addrport).map_err(|_| CellError::Invalid {
            what,
            why: "host:port is not UTF-8",
        })?;
        let (host, port) = split_host_port(s)?;
        Ok(Begin {
            host: host.to_owned(),
            port,
            flags,
        })
    }
}

/// Split "host:port" / "[v6]:port" into host (brackets removed) and a nonzero port.
fn split_host_port(s: &str) -> Result<(&str, u16), CellError> {
    let what = "BEGIN";
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, port) = rest.split_once("]:").ok_or(CellError::Invalid {
            what,
            why: "bracketed host without ]:port",
        })?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(CellError::Invalid {
                what,
                why: "bracketed host is not an IPv6 address",
            });
        }
        (host, port)
    } else {
        let (host, port) = s.rsplit_once(':').ok_or(CellError::Invalid {
            what,
            why: "missing :port",
        })?;
        if host.contains(':') {
            return Err(CellError::Invalid {
                what,
                why: "IPv6 address without brackets",
            });
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(CellError::Invalid {
            what,
            why: "empty host",
        });
    }
    // u16::from_str accepts a leading '+'; a port is digits only.
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CellError::Invalid {
            what,
            why: "port is not a number",
        });
    }
    let port: u16 = port.parse().map_err(|_| CellError::Invalid {
        what,
        why: "port out of range",
    })?;
    if port == 0 {
        return Err(CellError::Invalid {
            what,
            why: "port 0",
        });
    }
    Ok((host, port))
}

/// CONNECTED body: empty, or IPv4 (4) TTL (4), or 0.0.0.0 (4) type 6 (1) IPv6 (16) TTL (4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connected {
    /// The address the exit connected to, if it says.
    pub addr: Option<IpAddr>,
    /// How long the client may cache the address (seconds). Not sent when `addr` is `None`.
    pub ttl: u32,
}

impl Connected {
    /// Encode. With `addr: None` the body is empty (and `ttl` is not sent).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(25);
        match self.addr {
            None => return out,
            Some(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            Some(IpAddr::V6(a)) => {
                out.extend_from_slice(&[0, 0, 0, 0, 6]);
                out.extend_from_slice(&a.octets());
            }
        }
        out.extend_from_slice(&self.ttl.to_be_bytes());
        out
    }

    /// Decode; trailing bytes are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.is_empty() {
            return Ok(Connected { addr: None, ttl: 0 });
        }
        let mut r = Reader::new(body, "CONNECTED");
        let v4 = Ipv4Addr::from(r.array::<4>()?);
        let addr = if v4.is_unspecified() {
            if r.u8()? != 6 {
                return Err(CellError::Invalid {
                    what: "CONNECTED",
                    why: "address type is not 6",
                });
            }
            IpAddr::V6(Ipv6Addr::from(r.array::<16>()?))
        } else {
            IpAddr::V4(v4)
        };
        let ttl = r.u32()?;
        Ok(Connected {
            addr: Some(addr),
            ttl,
        })
    }
}

/// Why a stream ended (END message).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EndReason(pub u8);

impl EndReason {
    /// Catch-all.
    pub const MISC: Self = Self(1);
    /// DNS resolution failed.
    pub const RESOLVEFAILED: Self = Self(2);
    /// The destination refused the connection.
    pub const CONNECTREFUSED: Self = Self(3);
    /// The exit policy forbids it.
    pub const EXITPOLICY: Self = Self(4);
    /// The circuit is being destroyed.
    pub const DESTROY: Self = Self(5);
    /// Normal close.
    pub const DONE: Self = Self(6);
    /// Connection timed out.
    pub const TIMEOUT: Self = Self(7);
    /// No route to host.
    pub const NOROUTE: Self = Self(8);
    /// Relay is hibernating.
    pub const HIBERNATING: Self = Self(9);
    /// Internal error.
    pub const INTERNAL: Self = Self(10);
    /// Out of resources.
    pub const RESOURCELIMIT: Self = Self(11);
    /// Connection reset.
    pub const CONNRESET: Self = Self(12);
    /// Protocol violation.
    pub const TORPROTOCOL: Self = Self(13);
    /// BEGIN_DIR to a relay that is not a directory.
    pub const NOTDIRECTORY: Self = Self(14);

    /// Name as in tor-spec, or `None` for an unknown number.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "MISC",
            2 => "RESOLVEFAILED",
            3 => "CONNECTREFUSED",
            4 => "EXITPOLICY",
            5 => "DESTROY",
            6 => "DONE",
            7 => "TIMEOUT",
            8 => "NOROUTE",
            9 => "HIBERNATING",
            10 => "INTERNAL",
            11 => "RESOURCELIMIT",
            12 => "CONNRESET",
            13 => "TORPROTOCOL",
            14 => "NOTDIRECTORY",
            _ => return None,
        })
    }
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "UNKNOWN({})", self.0),
        }
    }
}

/// END body: reason (1). (Tor may append an address for EXITPOLICY; chive ignores it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End {
    /// Why.
    pub reason: EndReason,
}

impl End {
    /// Encode (one byte).
    pub fn encode(&self) -> Vec<u8> {
        vec![self.reason.0]
    }

    /// Decode; an empty body means MISC (tor-spec), trailing bytes are ignored.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let reason = body.first().map_or(EndReason::MISC, |&b| EndReason(b));
        Ok(End { reason })
    }
}

/// SENDME body: empty or version 0 (no authentication), or version 1: VERSION (1) DATA_LEN (2)
/// DATA (20 bytes: the running digest of the cell being acknowledged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sendme {
    /// The authenticated digest (version 1), or `None` (version 0).
    pub digest: Option<[u8; 20]>,
}

impl Sendme {
    /// Encode: empty for `None`, version 1 otherwise.
    pub fn encode(&self) -> Vec<u8> {
        match &self.digest {
            None => Vec::new(),
            Some(d) => {
                let mut out = Vec::with_capacity(23);
                out.push(1);
                out.extend_from_slice(&20u16.to_be_bytes());
                out.extend_from_slice(d);
                out
            }
        }
    }

    /// Decode; rejects unknown versions and a version-1 DATA_LEN other than 20.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "SENDME");
        if r.remaining() == 0 {
            return Ok(Sendme { digest: None });
        }
        match r.u8()? {
            0 => Ok(Sendme { digest: None }),
            1 => {
                let len = usize::from(r.u16()?);
                if len != 20 {
                    return Err(CellError::WrongLength {
                        what: "SENDME v1 digest",
                        expected: 20,
                        got: len,
                    });
                }
                Ok(Sendme {
                    digest: Some(r.array()?),
                })
            }
            _ => Err(CellError::Invalid {
                what: "SENDME",
                why: "unknown version",
            }),
        }
    }
}

/// RESOLVE body: "host\0".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolve {
    /// Host name to resolve (or in-addr.arpa name for reverse lookups).
    pub host: String,
}

impl Resolve {
    /// Encode; fails for an empty host or one containing NUL.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        if self.host.is_empty() || self.host.contains('\0') {
            return Err(CellError::Invalid {
                what: "RESOLVE",
                why: "empty host or host contains NUL",
            });
        }
        let mut out = self.host.as_bytes().to_vec();
        out.push(0);
        Ok(out)
    }

    /// Decode; rejects a missing NUL, an empty host and non-UTF-8.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "RESOLVE";
        let nul = body
            .iter()
            .position(|&b| b == 0)
            .ok_or(CellError::Invalid {
                what,
                why: "missing NUL",
            })?;
        let host = std::str::from_utf8(&body[..nul]).map_err(|_| CellError::Invalid {
            what,
            why: "host is not UTF-8",
        })?;
        if host.is_empty() {
            return Err(CellError::Invalid {
                what,
                why: "empty host",
            });
        }
        Ok(Resolve {
            host: host.to_owned(),
        })
    }
}

/// One answer in a RESOLVED message. The `u32` is the TTL in seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolvedAnswer {
    /// Type 4 / 6: an address.
    Ip(IpAddr, u32),
    /// Type 0: a host name (reverse lookup).
    Hostname(String, u32),
    /// Type 0xF0: transient error.
    TransientError(u32),
    /// Type 0xF1: non-transient error.
    NontransientError(u32),
}

/// RESOLVED body: a sequence of TYPE (1) LEN (1) VALUE TTL (4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The answers.
    pub answers: Vec<ResolvedAnswer>,
}

impl Resolved {
    /// Encode; fails for a host name longer than 255 bytes. Errors are sent with an empty value.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = Vec::new();
        for a in &self.answers {
            let (ty, value, ttl): (u8, &[u8], u32) = match a {
                ResolvedAnswer::Ip(IpAddr::V4(ip), ttl) => {
                    out.push(4);
                    out.push(4);
                    out.extend_from_slice(&ip.octets());
                    out.extend_from_slice(&ttl.to_be_bytes());
                    continue;
                }
                ResolvedAnswer::Ip(IpAddr::V6(ip), ttl) => {
                    out.push(6);
                    out.push(16);
                    out.extend_from_slice(&ip.octets());
                    out.extend_from_slice(&ttl.to_be_bytes());
                    continue;
                }
                ResolvedAnswer::Hostname(h, ttl) => (0, h.as_bytes(), *ttl),
                ResolvedAnswer::TransientError(ttl) => (0xF0, &[], *ttl),
                ResolvedAnswer::NontransientError(ttl) => (0xF1, &[], *ttl),
            };
            out.push(ty);
            put_len8(&mut out, "RESOLVED hostname", value.len())?;
            out.extend_from_slice(value);
            out.extend_from_slice(&ttl.to_be_bytes());
        }
        Ok(out)
    }

    /// Decode; answers of unknown type are skipped (forward compatibility), a truncated answer,
    /// a wrong address length or a non-UTF-8 host name is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "RESOLVED";
        let mut r = Reader::new(body, what);
        let mut answers = Vec::new();
        while r.remaining() > 0 {
            let ty = r.u8()?;
            let len = usize::from(r.u8()?);
            let value = r.take(len)?;
            let ttl = r.u32()?;
            let answer = match ty {
                0 => {
                    let h = std::str::from_utf8(value).map_err(|_| CellError::Invalid {
                        what,
                        why: "hostname is not UTF-8",
                    })?;
                    ResolvedAnswer::Hostname(h.to_owned(), ttl)
                }
                4 => {
                    let a: [u8; 4] = value.try_into().map_err(|_| CellError::WrongLength {
                        what: "RESOLVED IPv4",
                        expected: 4,
                        got: len,
                    })?;
                    ResolvedAnswer::Ip(IpAddr::V4(a.into()), ttl)
                }
                6 => {
                    let a: [u8; 16] = value.try_into().map_err(|_| CellError::WrongLength {
                        what: "RESOLVED IPv6",
                        expected: 16,
                        got: len,
                    })?;
                    ResolvedAnswer::Ip(IpAddr::V6(a.into()), ttl)
                }
                0xF0 => ResolvedAnswer::TransientError(ttl),
                0xF1 => ResolvedAnswer::NontransientError(ttl),
                _ => continue,
            };
            answers.push(answer);
        }
        Ok(Resolved { answers })
    }
}

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
/// connection derive from its TLS session (chive-net's `Link::bind_token`). Exactly 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The channel's bind token.
    pub token: [u8; 32],
}

impl Bind {
    /// Encoded length.
    pub const LEN: usize = 32;

    /// Encode (32 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.token.to_vec()
    }

    /// Decode; the body must be exactly 32 bytes (no slack in authentication data).
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.len() != Self::LEN {
            return Err(CellError::WrongLength {
                what: "BIND",
                expected: Self::LEN,
                got: body.len(),
            });
        }
        Ok(Bind {
            token: Reader::new(body, "BIND").array()?,
        })
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
