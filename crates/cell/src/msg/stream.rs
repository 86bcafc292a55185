//! Relay messages of streams: BEGIN, CONNECTED, END, SENDME, RESOLVE, RESOLVED.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::put_len8;
use crate::reader::Reader;
use crate::CellError;

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

/// XOFF body (proposal 324 section 4.1): VERSION (1) = 0. The sender stops packaging the
/// stream until an [`Xon`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Xoff;

impl Xoff {
    /// Encode: version 0.
    pub fn encode(&self) -> Vec<u8> {
        vec![0]
    }

    /// Decode; an unknown version is an error (the spec: a protocol violation).
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "XOFF");
        match r.u8()? {
            0 => Ok(Xoff),
            _ => Err(CellError::Invalid {
                what: "XOFF",
                why: "unknown version",
            }),
        }
    }
}

/// XON body (proposal 324 section 4.1): VERSION (1) = 0, KBPS_EWMA (4): the rate at which
/// the receiver drains the stream toward its application, in 1000 bytes/s; 0 = unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Xon {
    /// Advisory drain rate in 1000 bytes/s (0: no limit).
    pub kbps_ewma: u32,
}

impl Xon {
    /// Encode: version 0 and the rate.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5);
        out.push(0);
        out.extend_from_slice(&self.kbps_ewma.to_be_bytes());
        out
    }

    /// Decode; an unknown version or a missing rate is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "XON");
        match r.u8()? {
            0 => Ok(Xon {
                kbps_ewma: r.u32()?,
            }),
            _ => Err(CellError::Invalid {
                what: "XON",
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
