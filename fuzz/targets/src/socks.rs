//! Target `socks`: the SOCKS4/4a/5 server handshake of `chive client` ([`accept_socks`]).

use std::net::{IpAddr, SocketAddr};

use chive_client::socks::{
    accept_socks, SocksCommand, SocksError, SocksRequest, SocksVersion, TargetAddr,
};

use crate::io::{block_on, FuzzStream};

/// Outcome of one handshake, comparable across runs: the request (or the error's text), how many
/// input bytes were left unread, and what was written back.
type Outcome = (Result<SocksRequest, String>, usize, Vec<u8>);

fn accept(input: &[u8], chunk: usize) -> Outcome {
    let mut io = FuzzStream::new(input, chunk);
    let res = block_on(accept_socks(&mut io)).map_err(|e: SocksError| e.to_string());
    (res, io.unread(), io.written)
}

/// The input is what an application sends. Properties: the outcome (request or error, bytes
/// consumed, replies written) is the same whether the bytes arrive one at a time or all at
/// once; a parsed request, sent again the way a client would, parses to the same request and
/// consumes exactly its own bytes.
pub fn socks(data: &[u8]) {
    let whole = accept(data, usize::MAX);
    let bytewise = accept(data, 1);
    assert_eq!(whole, bytewise, "outcome depends on how the bytes arrive");
    if let Ok(req) = &whole.0 {
        let wire = client_bytes(req);
        let (again, unread, _) = accept(&wire, usize::MAX);
        assert_eq!(
            again.as_ref(),
            Ok(req),
            "re-sent request parses differently"
        );
        assert_eq!(unread, 0, "re-sent request not consumed exactly");
    }
}

/// How a client sends `req` (the request only; replies are not read).
pub(crate) fn client_bytes(req: &SocksRequest) -> Vec<u8> {
    let mut out = Vec::new();
    let cmd = match req.command {
        SocksCommand::Connect => 0x01,
        SocksCommand::Resolve => 0xF0,
    };
    match req.version {
        SocksVersion::V4 => {
            out.extend_from_slice(&[4, cmd]);
            let (ip, port, host) = match &req.target {
                TargetAddr::Ip(SocketAddr::V4(a)) => (a.ip().octets(), a.port(), None),
                TargetAddr::Domain(h, port) => ([0, 0, 0, 1], *port, Some(h.as_bytes())),
                TargetAddr::Ip(SocketAddr::V6(_)) => unreachable!("SOCKS4 has no IPv6"),
            };
            out.extend_from_slice(&port.to_be_bytes());
            out.extend_from_slice(&ip);
            if let Some((user, _)) = &req.auth {
                out.extend_from_slice(user);
            }
            out.push(0);
            if let Some(h) = host {
                out.extend_from_slice(h);
                out.push(0);
            }
        }
        SocksVersion::V5 => {
            match &req.auth {
                Some((user, pass)) => {
                    out.extend_from_slice(&[5, 1, 2, 1]);
                    out.push(len8(user));
                    out.extend_from_slice(user);
                    out.push(len8(pass));
                    out.extend_from_slice(pass);
                }
                None => out.extend_from_slice(&[5, 1, 0]),
            }
            out.extend_from_slice(&[5, cmd, 0]);
            let port = match &req.target {
                TargetAddr::Ip(a) => {
                    match a.ip() {
                        IpAddr::V4(ip) => {
                            out.push(1);
                            out.extend_from_slice(&ip.octets());
                        }
                        IpAddr::V6(ip) => {
                            out.push(4);
                            out.extend_from_slice(&ip.octets());
                        }
                    }
                    a.port()
                }
                TargetAddr::Domain(h, port) => {
                    out.push(3);
                    out.push(len8(h.as_bytes()));
                    out.extend_from_slice(h.as_bytes());
                    *port
                }
            };
            out.extend_from_slice(&port.to_be_bytes());
        }
    }
    out
}

fn len8(b: &[u8]) -> u8 {
    u8::try_from(b.len()).expect("SOCKS5 fields parsed from one length byte")
}
