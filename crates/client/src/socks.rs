//! Server side of the SOCKS4, SOCKS4a and SOCKS5 handshakes, as spoken by
//! `chive client` to applications.
//!
//! Only the handshake lives here: [`accept_socks`] reads and validates one
//! request from a fresh stream, and [`send_reply`] answers it once the caller
//! knows the outcome (stream attached, exit refused, ...). Everything is
//! bounded and read with exact-length reads, so no byte after the request
//! (for example optimistic application data) is ever consumed by this module.
//! The caller applies a timeout around [`accept_socks`].
//!
//! Supported: SOCKS5 (RFC 1928) with "no authentication" and RFC 1929
//! username/password (credentials are not checked; they only isolate streams,
//! like Tor's `IsolateSOCKSAuth`), commands CONNECT and Tor's RESOLVE (0xF0),
//! address types IPv4, domain name and IPv6; SOCKS4 CONNECT/RESOLVE with a
//! user id, and SOCKS4a (`0.0.0.x` plus a hostname). Not supported: BIND,
//! UDP ASSOCIATE, GSSAPI, Tor's RESOLVE_PTR.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest hostname accepted (SOCKS5 cannot encode more; SOCKS4a is held to the same bound).
pub const MAX_HOSTNAME_LEN: usize = 255;
/// Longest SOCKS4 user id accepted (the same bound as a SOCKS5 user name).
pub const MAX_USERID_LEN: usize = 255;

/// Where the application wants to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetAddr {
    /// A literal address and port (SOCKS5 IPv4/IPv6, plain SOCKS4).
    Ip(SocketAddr),
    /// A hostname, passed on unresolved (SOCKS5 domain, SOCKS4a). It is kept
    /// exactly as the client sent it, even if it spells an IP address.
    Domain(String, u16),
}

/// Which protocol version the client spoke; replies use the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocksVersion {
    /// SOCKS4 or SOCKS4a.
    V4,
    /// SOCKS5.
    V5,
}

/// What the client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocksCommand {
    /// Open a stream to the target (command 0x01).
    Connect,
    /// Resolve the target hostname through the overlay (Tor extension, command 0xF0).
    Resolve,
}

/// One parsed SOCKS request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocksRequest {
    /// Protocol version the client used.
    pub version: SocksVersion,
    /// Requested command.
    pub command: SocksCommand,
    /// Requested destination.
    pub target: TargetAddr,
    /// Credentials used for stream isolation: SOCKS5 (username, password), or a
    /// non-empty SOCKS4 user id as (userid, []). `None` if the client sent none.
    pub auth: Option<(Vec<u8>, Vec<u8>)>,
}

/// The outcome reported to the client by [`send_reply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocksReply {
    /// The stream is open (or the name resolved).
    Succeeded,
    /// Any other failure.
    GeneralFailure,
    /// Refused by policy (e.g. no exit allows the target).
    NotAllowed,
    /// The network is unreachable.
    NetworkUnreachable,
    /// The host is unreachable (or the name did not resolve).
    HostUnreachable,
    /// The target refused the connection.
    ConnectionRefused,
    /// Timed out.
    TtlExpired,
    /// The command is not supported.
    CommandNotSupported,
    /// The address type is not supported.
    AddressTypeNotSupported,
    /// Proposal 304's onion-service errors (SOCKS5 extended codes 0xF0..0xF7, as Tor sends
    /// them with `ExtendedErrors`); SOCKS4 sees a plain rejection.
    Onion(OnionSocksError),
}

/// Why an `.onion` connection failed (proposal 304, "SOCKS5 extended error codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnionSocksError {
    /// 0xF0: no descriptor for the address.
    DescriptorNotFound,
    /// 0xF1: the descriptor did not verify or parse.
    InvalidDescriptor,
    /// 0xF2: every introduction point failed.
    IntroFailed,
    /// 0xF3: the rendezvous did not complete.
    RendezvousFailed,
    /// 0xF4: the service requires client authorization, and none was given.
    MissingClientAuth,
    /// 0xF5: the client authorization given was refused.
    WrongClientAuth,
    /// 0xF6: the address is malformed (length, base32, version or checksum).
    BadAddress,
    /// 0xF7: the introduction or rendezvous did not finish in time.
    IntroTimedOut,
}

impl OnionSocksError {
    /// The SOCKS5 REP code.
    pub fn code(self) -> u8 {
        match self {
            OnionSocksError::DescriptorNotFound => 0xF0,
            OnionSocksError::InvalidDescriptor => 0xF1,
            OnionSocksError::IntroFailed => 0xF2,
            OnionSocksError::RendezvousFailed => 0xF3,
            OnionSocksError::MissingClientAuth => 0xF4,
            OnionSocksError::WrongClientAuth => 0xF5,
            OnionSocksError::BadAddress => 0xF6,
            OnionSocksError::IntroTimedOut => 0xF7,
        }
    }
}

impl SocksReply {
    /// The SOCKS5 REP code (RFC 1928 section 6).
    pub fn v5_code(self) -> u8 {
        match self {
            SocksReply::Succeeded => 0x00,
            SocksReply::GeneralFailure => 0x01,
            SocksReply::NotAllowed => 0x02,
            SocksReply::NetworkUnreachable => 0x03,
            SocksReply::HostUnreachable => 0x04,
            SocksReply::ConnectionRefused => 0x05,
            SocksReply::TtlExpired => 0x06,
            SocksReply::CommandNotSupported => 0x07,
            SocksReply::AddressTypeNotSupported => 0x08,
            SocksReply::Onion(e) => e.code(),
        }
    }

    /// The SOCKS4 reply code: 0x5A granted, 0x5B rejected (SOCKS4 has no finer codes).
    pub fn v4_code(self) -> u8 {
        if self == SocksReply::Succeeded {
            0x5A
        } else {
            0x5B
        }
    }
}

/// Why a handshake failed. Where the protocol has an error reply, it has
/// already been sent when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum SocksError {
    /// Reading or writing the stream failed (including EOF in mid-request).
    #[error("socks: i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The first byte is neither 4 nor 5.
    #[error("socks: unknown protocol version {0:#04x}")]
    BadVersion(u8),
    /// The request is syntactically invalid.
    #[error("socks: malformed request: {0}")]
    Malformed(&'static str),
    /// The SOCKS5 client offered no method we support (0xFF was sent).
    #[error("socks: no acceptable authentication method offered")]
    NoAcceptableAuth,
    /// The command byte is not CONNECT or RESOLVE.
    #[error("socks: unsupported command {0:#04x}")]
    UnsupportedCommand(u8),
    /// The SOCKS5 address type is not IPv4, domain or IPv6.
    #[error("socks: unsupported address type {0:#04x}")]
    UnsupportedAddressType(u8),
    /// A hostname or user id exceeds its bound.
    #[error("socks: field too long")]
    TooLong,
}

/// SOCKS5 method: no authentication.
const METHOD_NO_AUTH: u8 = 0x00;
/// SOCKS5 method: username/password (RFC 1929).
const METHOD_USER_PASS: u8 = 0x02;
/// SOCKS5 method reply: nothing acceptable.
const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;
const CMD_CONNECT: u8 = 0x01;
const CMD_RESOLVE: u8 = 0xF0;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// Run the server side of the handshake on a fresh stream and return the
/// client's request. See the module documentation for what is supported. On
/// failure, the protocol's error reply (if it has one) has been sent.
pub async fn accept_socks<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<SocksRequest, SocksError> {
    let version = s.read_u8().await?;
    match version {
        4 => accept_v4(s).await,
        5 => accept_v5(s).await,
        other => Err(SocksError::BadVersion(other)),
    }
}

/// SOCKS4/4a after the version byte:
/// CMD(1) DSTPORT(2) DSTIP(4) USERID NUL [HOSTNAME NUL if DSTIP = 0.0.0.x, x != 0].
async fn accept_v4<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<SocksRequest, SocksError> {
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await?;
    let [cmd, p0, p1, a, b, c, d] = head;
    let port = u16::from_be_bytes([p0, p1]);
    let ip = Ipv4Addr::new(a, b, c, d);
    // Read the whole request before answering, so the reject is not lost to a
    // reset caused by unread input.
    let userid = match read_nul_terminated(s, MAX_USERID_LEN).await {
        Ok(u) => u,
        Err(e) => return Err(reject_v4(s, e).await),
    };
    let is_4a = a == 0 && b == 0 && c == 0 && d != 0;
    let target = if is_4a {
        let host = match read_nul_terminated(s, MAX_HOSTNAME_LEN).await {
            Ok(h) => h,
            Err(e) => return Err(reject_v4(s, e).await),
        };
        match validate_hostname(host) {
            Ok(h) => TargetAddr::Domain(h, port),
            Err(e) => return Err(reject_v4(s, e).await),
        }
    } else if ip.is_unspecified() {
        return Err(reject_v4(s, SocksError::Malformed("SOCKS4 destination 0.0.0.0")).await);
    } else {
        TargetAddr::Ip(SocketAddr::new(IpAddr::V4(ip), port))
    };
    let command = match cmd {
        CMD_CONNECT => SocksCommand::Connect,
        // Tor accepts RESOLVE over SOCKS4a too; it needs a name to resolve.
        CMD_RESOLVE if is_4a => SocksCommand::Resolve,
        CMD_RESOLVE => {
            return Err(reject_v4(s, SocksError::Malformed("RESOLVE needs a hostname")).await)
        }
        other => return Err(reject_v4(s, SocksError::UnsupportedCommand(other)).await),
    };
    let auth = if userid.is_empty() {
        None
    } else {
        Some((userid, Vec::new()))
    };
    Ok(SocksRequest {
        version: SocksVersion::V4,
        command,
        target,
        auth,
    })
}

/// Send a SOCKS4 rejection (best effort: the error being reported matters more
/// than a failed write) and return `err`.
async fn reject_v4<S: AsyncWrite + Unpin>(s: &mut S, err: SocksError) -> SocksError {
    if matches!(err, SocksError::Io(_)) {
        // The stream is broken or closed: there is nobody to answer.
        return err;
    }
    let _ = write_flush(
        s,
        &[0x00, SocksReply::GeneralFailure.v4_code(), 0, 0, 0, 0, 0, 0],
    )
    .await;
    err
}

/// SOCKS5 after the version byte: method negotiation, optional RFC 1929
/// sub-negotiation, then the request.
async fn accept_v5<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<SocksRequest, SocksError> {
    let nmethods = usize::from(s.read_u8().await?);
    let mut methods = [0u8; 255];
    let methods = methods
        .get_mut(..nmethods)
        .ok_or(SocksError::Malformed("method count"))?;
    s.read_exact(methods).await?;
    // Prefer username/password: the credentials are what isolates streams.
    let auth = if methods.contains(&METHOD_USER_PASS) {
        write_flush(s, &[5, METHOD_USER_PASS]).await?;
        Some(read_user_pass(s).await?)
    } else if methods.contains(&METHOD_NO_AUTH) {
        write_flush(s, &[5, METHOD_NO_AUTH]).await?;
        None
    } else {
        write_flush(s, &[5, METHOD_NONE_ACCEPTABLE]).await?;
        return Err(SocksError::NoAcceptableAuth);
    };

    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    let [ver, cmd, _reserved, atyp] = head;
    if ver != 5 {
        return Err(reject_v5(s, SocksError::BadVersion(ver), SocksReply::GeneralFailure).await);
    }
    let target = match atyp {
        ATYP_IPV4 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a).await?;
            let port = s.read_u16().await?;
            TargetAddr::Ip(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port))
        }
        ATYP_IPV6 => {
            let mut a = [0u8; 16];
            s.read_exact(&mut a).await?;
            let port = s.read_u16().await?;
            TargetAddr::Ip(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), port))
        }
        ATYP_DOMAIN => {
            let len = usize::from(s.read_u8().await?);
            let mut buf = vec![0u8; len];
            s.read_exact(&mut buf).await?;
            let port = s.read_u16().await?;
            match validate_hostname(buf) {
                Ok(h) => TargetAddr::Domain(h, port),
                Err(e) => return Err(reject_v5(s, e, SocksReply::GeneralFailure).await),
            }
        }
        other => {
            // The address length is unknown, so nothing more can be read.
            return Err(reject_v5(
                s,
                SocksError::UnsupportedAddressType(other),
                SocksReply::AddressTypeNotSupported,
            )
            .await);
        }
    };
    let command = match cmd {
        CMD_CONNECT => SocksCommand::Connect,
        CMD_RESOLVE => SocksCommand::Resolve,
        other => {
            return Err(reject_v5(
                s,
                SocksError::UnsupportedCommand(other),
                SocksReply::CommandNotSupported,
            )
            .await)
        }
    };
    Ok(SocksRequest {
        version: SocksVersion::V5,
        command,
        target,
        auth,
    })
}

/// RFC 1929: VER(1)=1 ULEN(1) UNAME PLEN(1) PASSWD; every credential is accepted.
async fn read_user_pass<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<(Vec<u8>, Vec<u8>), SocksError> {
    let ver = s.read_u8().await?;
    if ver != 1 {
        // Status != 0 means failure; the client must close the connection.
        let _ = write_flush(s, &[1, 1]).await;
        return Err(SocksError::Malformed(
            "username/password sub-negotiation version",
        ));
    }
    let ulen = usize::from(s.read_u8().await?);
    let mut user = vec![0u8; ulen];
    s.read_exact(&mut user).await?;
    let plen = usize::from(s.read_u8().await?);
    let mut pass = vec![0u8; plen];
    s.read_exact(&mut pass).await?;
    write_flush(s, &[1, 0]).await?;
    Ok((user, pass))
}

/// Send a SOCKS5 error reply (best effort) and return `err`.
async fn reject_v5<S: AsyncWrite + Unpin>(
    s: &mut S,
    err: SocksError,
    reply: SocksReply,
) -> SocksError {
    let _ = write_flush(s, &[5, reply.v5_code(), 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0]).await;
    err
}

/// Read bytes up to (not including) a NUL, at most `max` of them. Reads one
/// byte at a time so nothing after the NUL is consumed.
async fn read_nul_terminated<S: AsyncRead + Unpin>(
    s: &mut S,
    max: usize,
) -> Result<Vec<u8>, SocksError> {
    let mut out = Vec::new();
    loop {
        let b = s.read_u8().await?;
        if b == 0 {
            return Ok(out);
        }
        if out.len() >= max {
            return Err(SocksError::TooLong);
        }
        out.push(b);
    }
}

/// A hostname must be non-empty, within bounds, UTF-8 and free of control
/// characters (it ends up in logs and in a BEGIN cell's NUL-terminated address).
fn validate_hostname(raw: Vec<u8>) -> Result<String, SocksError> {
    if raw.is_empty() {
        return Err(SocksError::Malformed("empty hostname"));
    }
    if raw.len() > MAX_HOSTNAME_LEN {
        return Err(SocksError::TooLong);
    }
    if raw.iter().any(|&b| b < 0x20 || b == 0x7F) {
        return Err(SocksError::Malformed("control character in hostname"));
    }
    String::from_utf8(raw).map_err(|_| SocksError::Malformed("hostname is not UTF-8"))
}

async fn write_flush<S: AsyncWrite + Unpin>(s: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(bytes).await?;
    s.flush().await
}

/// Send the final reply to `req` in its version's format. SOCKS4: 0x5A granted
/// or 0x5B rejected, with `bound` if it is IPv4. SOCKS5: the REP code with
/// BND.ADDR = `bound` (or 0.0.0.0:0). For a successful RESOLVE, `bound`
/// carries the resolved address.
pub async fn send_reply<S: AsyncWrite + Unpin>(
    s: &mut S,
    req: &SocksRequest,
    reply: SocksReply,
    bound: Option<SocketAddr>,
) -> std::io::Result<()> {
    match req.version {
        SocksVersion::V4 => {
            let (ip, port) = match bound {
                Some(SocketAddr::V4(a)) => (a.ip().octets(), a.port()),
                _ => ([0u8; 4], 0),
            };
            let mut msg = [0u8; 8];
            msg[1] = reply.v4_code();
            msg[2..4].copy_from_slice(&port.to_be_bytes());
            msg[4..8].copy_from_slice(&ip);
            write_flush(s, &msg).await
        }
        SocksVersion::V5 => {
            let bound = bound.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
            let mut msg = Vec::with_capacity(22);
            msg.extend_from_slice(&[5, reply.v5_code(), 0]);
            match bound.ip() {
                IpAddr::V4(ip) => {
                    msg.push(ATYP_IPV4);
                    msg.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    msg.push(ATYP_IPV6);
                    msg.extend_from_slice(&ip.octets());
                }
            }
            msg.extend_from_slice(&bound.port().to_be_bytes());
            write_flush(s, &msg).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, DuplexStream};

    /// Feed `input` to the server side, close the client's write half, and
    /// return the parse result together with everything the server wrote.
    async fn run(input: &[u8]) -> (Result<SocksRequest, SocksError>, Vec<u8>) {
        let (mut client, mut server) = duplex(4096);
        client.write_all(input).await.unwrap();
        client.shutdown().await.unwrap();
        let res = accept_socks(&mut server).await;
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        (res, out)
    }

    fn v5_connect(atyp_addr: &[u8], port: u16) -> Vec<u8> {
        let mut v = vec![5, 1, 0, 5, 1, 0];
        v.extend_from_slice(atyp_addr);
        v.extend_from_slice(&port.to_be_bytes());
        v
    }

    #[tokio::test]
    async fn v5_noauth_ipv4() {
        let (res, out) = run(&v5_connect(&[1, 127, 0, 0, 1], 8080)).await;
        let req = res.unwrap();
        assert_eq!(out, [5, 0]);
        assert_eq!(
            req,
            SocksRequest {
                version: SocksVersion::V5,
                command: SocksCommand::Connect,
                target: TargetAddr::Ip("127.0.0.1:8080".parse().unwrap()),
                auth: None,
            }
        );
    }

    #[tokio::test]
    async fn v5_ipv6_and_domain() {
        let mut a = vec![4];
        a.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        let (res, _) = run(&v5_connect(&a, 443)).await;
        assert_eq!(
            res.unwrap().target,
            TargetAddr::Ip("[::1]:443".parse().unwrap())
        );

        let mut d = vec![3, 11];
        d.extend_from_slice(b"example.org");
        let (res, _) = run(&v5_connect(&d, 80)).await;
        assert_eq!(
            res.unwrap().target,
            TargetAddr::Domain("example.org".into(), 80)
        );
    }

    #[tokio::test]
    async fn v5_user_pass_preferred_and_recorded() {
        let mut input = vec![5, 2, 0, 2, 1, 5];
        input.extend_from_slice(b"alice");
        input.push(3);
        input.extend_from_slice(b"pwd");
        input.extend_from_slice(&[5, 0xF0, 0, 3, 4]);
        input.extend_from_slice(b"a.bc");
        input.extend_from_slice(&0u16.to_be_bytes());
        let (res, out) = run(&input).await;
        assert_eq!(out, [5, 2, 1, 0]);
        let req = res.unwrap();
        assert_eq!(req.command, SocksCommand::Resolve);
        assert_eq!(req.auth, Some((b"alice".to_vec(), b"pwd".to_vec())));
    }

    #[tokio::test]
    async fn v5_no_acceptable_method() {
        let (res, out) = run(&[5, 1, 0x01]).await;
        assert!(matches!(res, Err(SocksError::NoAcceptableAuth)));
        assert_eq!(out, [5, 0xFF]);
        // Zero methods offered: nothing acceptable either.
        let (res, out) = run(&[5, 0]).await;
        assert!(matches!(res, Err(SocksError::NoAcceptableAuth)));
        assert_eq!(out, [5, 0xFF]);
    }

    #[tokio::test]
    async fn v5_unsupported_command_gets_reply_07() {
        // BIND (0x02).
        let (res, out) = run(&[5, 1, 0, 5, 2, 0, 1, 10, 0, 0, 1, 0, 80]).await;
        assert!(matches!(res, Err(SocksError::UnsupportedCommand(2))));
        assert_eq!(out, [5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn v5_unsupported_atyp_gets_reply_08() {
        let (res, out) = run(&[5, 1, 0, 5, 1, 0, 9, 1, 2, 3]).await;
        assert!(matches!(res, Err(SocksError::UnsupportedAddressType(9))));
        assert_eq!(out, [5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn v5_bad_hostnames_get_general_failure() {
        for host in [&b""[..], b"a\0b", b"\xff\xfe", b"bad\nname"] {
            let mut a = vec![3, host.len() as u8];
            a.extend_from_slice(host);
            let (res, out) = run(&v5_connect(&a, 80)).await;
            assert!(matches!(res, Err(SocksError::Malformed(_))), "{host:?}");
            assert_eq!(out, [5, 0, 5, 1, 0, 1, 0, 0, 0, 0, 0, 0]);
        }
    }

    #[tokio::test]
    async fn v5_wrong_request_version() {
        let (res, out) = run(&[5, 1, 0, 4, 1, 0, 1, 1, 2, 3, 4, 0, 80]).await;
        assert!(matches!(res, Err(SocksError::BadVersion(4))));
        assert_eq!(out, [5, 0, 5, 1, 0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[tokio::test]
    async fn v5_bad_subnegotiation_version() {
        let (res, out) = run(&[5, 1, 2, 5, 1, b'u', 1, b'p']).await;
        assert!(matches!(res, Err(SocksError::Malformed(_))));
        assert_eq!(out, [5, 2, 1, 1]);
    }

    #[tokio::test]
    async fn v5_truncated_everywhere() {
        let full = {
            let mut d = vec![5, 2, 0, 2, 1, 1, b'u', 1, b'p', 5, 1, 0, 3, 3];
            d.extend_from_slice(b"a.b");
            d.extend_from_slice(&[0, 80]);
            d
        };
        assert!(run(&full).await.0.is_ok());
        for cut in 0..full.len() {
            let (res, _) = run(&full[..cut]).await;
            assert!(
                matches!(res, Err(SocksError::Io(_))),
                "cut at {cut}: {res:?}"
            );
        }
    }

    #[tokio::test]
    async fn v4_connect_with_userid() {
        let mut input = vec![4, 1, 0x1F, 0x90, 10, 1, 2, 3];
        input.extend_from_slice(b"bob\0");
        let (res, out) = run(&input).await;
        assert!(out.is_empty());
        assert_eq!(
            res.unwrap(),
            SocksRequest {
                version: SocksVersion::V4,
                command: SocksCommand::Connect,
                target: TargetAddr::Ip("10.1.2.3:8080".parse().unwrap()),
                auth: Some((b"bob".to_vec(), vec![])),
            }
        );
    }

    #[tokio::test]
    async fn v4a_hostname_and_empty_userid() {
        let mut input = vec![4, 1, 0, 80, 0, 0, 0, 1, 0];
        input.extend_from_slice(b"example.com\0");
        let (res, _) = run(&input).await;
        let req = res.unwrap();
        assert_eq!(req.target, TargetAddr::Domain("example.com".into(), 80));
        assert_eq!(req.auth, None);
    }

    #[tokio::test]
    async fn v4_errors_get_5b() {
        let reject = [0, 0x5B, 0, 0, 0, 0, 0, 0];
        // BIND.
        let (res, out) = run(&[4, 2, 0, 80, 1, 2, 3, 4, 0]).await;
        assert!(matches!(res, Err(SocksError::UnsupportedCommand(2))));
        assert_eq!(out, reject);
        // Oversized user id.
        let mut input = vec![4, 1, 0, 80, 1, 2, 3, 4];
        input.extend_from_slice(&[b'x'; 300]);
        input.push(0);
        let (res, out) = run(&input).await;
        assert!(matches!(res, Err(SocksError::TooLong)));
        assert_eq!(out, reject);
        // Oversized 4a hostname.
        let mut input = vec![4, 1, 0, 80, 0, 0, 0, 9, 0];
        input.extend_from_slice(&[b'h'; 256]);
        input.push(0);
        let (res, out) = run(&input).await;
        assert!(matches!(res, Err(SocksError::TooLong)));
        assert_eq!(out, reject);
        // Destination 0.0.0.0.
        let (res, out) = run(&[4, 1, 0, 80, 0, 0, 0, 0, 0]).await;
        assert!(matches!(res, Err(SocksError::Malformed(_))));
        assert_eq!(out, reject);
        // A user id with no terminating NUL before EOF.
        let (res, out) = run(&[4, 1, 0, 80, 1, 2, 3, 4, b'a']).await;
        assert!(matches!(res, Err(SocksError::Io(_))));
        assert!(out.is_empty());
    }

    #[tokio::test]
    async fn garbage_and_unknown_version() {
        let (res, out) = run(b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(matches!(res, Err(SocksError::BadVersion(b'G'))));
        assert!(out.is_empty());
        let (res, _) = run(&[6, 1, 0]).await;
        assert!(matches!(res, Err(SocksError::BadVersion(6))));
        let (res, _) = run(&[]).await;
        assert!(matches!(res, Err(SocksError::Io(_))));
    }

    #[tokio::test]
    async fn does_not_consume_bytes_after_request() {
        let (mut client, mut server) = duplex(4096);
        let mut input = v5_connect(&[1, 127, 0, 0, 1], 80);
        input.extend_from_slice(b"early data");
        client.write_all(&input).await.unwrap();
        accept_socks(&mut server).await.unwrap();
        let mut rest = [0u8; 10];
        server.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"early data");
    }

    async fn reply_bytes(
        req: &SocksRequest,
        reply: SocksReply,
        bound: Option<SocketAddr>,
    ) -> Vec<u8> {
        let (mut a, mut b): (DuplexStream, DuplexStream) = duplex(256);
        send_reply(&mut a, req, reply, bound).await.unwrap();
        drop(a);
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn reply_formats() {
        let mut req = SocksRequest {
            version: SocksVersion::V5,
            command: SocksCommand::Connect,
            target: TargetAddr::Domain("x".into(), 1),
            auth: None,
        };
        assert_eq!(
            reply_bytes(&req, SocksReply::Succeeded, None).await,
            [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            reply_bytes(
                &req,
                SocksReply::ConnectionRefused,
                Some("1.2.3.4:258".parse().unwrap())
            )
            .await,
            [5, 5, 0, 1, 1, 2, 3, 4, 1, 2]
        );
        let v6 = reply_bytes(
            &req,
            SocksReply::Succeeded,
            Some("[::2]:1".parse().unwrap()),
        )
        .await;
        assert_eq!(v6.len(), 22);
        assert_eq!(&v6[..4], &[5, 0, 0, 4]);
        assert_eq!(v6[19], 2);
        req.version = SocksVersion::V4;
        assert_eq!(
            reply_bytes(
                &req,
                SocksReply::Succeeded,
                Some("1.2.3.4:80".parse().unwrap())
            )
            .await,
            [0, 0x5A, 0, 80, 1, 2, 3, 4]
        );
        assert_eq!(
            reply_bytes(&req, SocksReply::HostUnreachable, None).await,
            [0, 0x5B, 0, 0, 0, 0, 0, 0]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Arbitrary input never panics; it either parses or yields an error.
        #[test]
        fn random_bytes_never_panic(
            first in proptest::prelude::prop_oneof![proptest::prelude::Just(4u8), proptest::prelude::Just(5u8), proptest::prelude::any::<u8>()],
            rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut input = vec![first];
            input.extend_from_slice(&rest);
            let _ = rt.block_on(run(&input));
        }

        /// Past SOCKS5 method negotiation, arbitrary requests never panic either.
        #[test]
        fn random_v5_requests_never_panic(rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut input = vec![5, 1, 0, 5];
            input.extend_from_slice(&rest);
            let _ = rt.block_on(run(&input));
        }
    }

    #[test]
    fn proposal_304_codes() {
        use OnionSocksError::*;
        let all = [
            (DescriptorNotFound, 0xF0),
            (InvalidDescriptor, 0xF1),
            (IntroFailed, 0xF2),
            (RendezvousFailed, 0xF3),
            (MissingClientAuth, 0xF4),
            (WrongClientAuth, 0xF5),
            (BadAddress, 0xF6),
            (IntroTimedOut, 0xF7),
        ];
        for (e, code) in all {
            assert_eq!(SocksReply::Onion(e).v5_code(), code);
            assert_eq!(SocksReply::Onion(e).v4_code(), 0x5B);
        }
    }
}
