//! The SOCKS5 client (RFC 1928, username/password auth of RFC 1929): a CONNECT to the
//! URL's host as given, so names are resolved by the proxy (like `curl --socks5-hostname`).

use std::net::IpAddr;

use chive_http::{HttpUrl, UrlHost};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) async fn socks5_connect(
    s: &mut TcpStream,
    url: &HttpUrl,
    creds: Option<&(String, String)>,
) -> Result<(), String> {
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "socks: proxy closed the connection".to_string()
        } else {
            format!("socks: {}", e.kind())
        }
    };
    // Offer only user/pass when we have credentials: isolation must not
    // silently degrade to no-auth.
    let method = if creds.is_some() { 0x02 } else { 0x00 };
    s.write_all(&[5, 1, method]).await.map_err(io)?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.map_err(io)?;
    if choice[0] != 5 {
        return Err(format!("socks: bad reply version {}", choice[0]));
    }
    if choice[1] != method {
        return Err("socks: no acceptable authentication method".into());
    }
    if let Some((user, pass)) = creds {
        let mut msg = Vec::with_capacity(3 + user.len() + pass.len());
        msg.push(1);
        msg.push(u8::try_from(user.len()).map_err(|_| "socks: username too long")?);
        msg.extend_from_slice(user.as_bytes());
        msg.push(u8::try_from(pass.len()).map_err(|_| "socks: password too long")?);
        msg.extend_from_slice(pass.as_bytes());
        s.write_all(&msg).await.map_err(io)?;
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.map_err(io)?;
        if status[1] != 0 {
            return Err("socks: authentication failed".into());
        }
    }
    let mut req = vec![5, 1, 0];
    match &url.host {
        UrlHost::Ip(IpAddr::V4(ip)) => {
            req.push(1);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Ip(IpAddr::V6(ip)) => {
            req.push(4);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Name(name) => {
            req.push(3);
            // parse_url bounds names to 255 bytes.
            req.push(u8::try_from(name.len()).map_err(|_| "socks: hostname too long")?);
            req.extend_from_slice(name.as_bytes());
        }
    }
    req.extend_from_slice(&url.port.to_be_bytes());
    s.write_all(&req).await.map_err(io)?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(io)?;
    if head[0] != 5 {
        return Err(format!("socks: bad reply version {}", head[0]));
    }
    if head[1] != 0 {
        return Err(format!("socks: {}", socks5_reply_text(head[1])));
    }
    // Skip BND.ADDR and BND.PORT.
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => usize::from(s.read_u8().await.map_err(io)?),
        other => return Err(format!("socks: bad address type {other} in reply")),
    };
    let mut skip = [0u8; 255 + 2];
    s.read_exact(&mut skip[..addr_len + 2]).await.map_err(io)?;
    Ok(())
}

/// Human text for a SOCKS5 REP code (RFC 1928 section 6).
fn socks5_reply_text(code: u8) -> String {
    match code {
        1 => "general failure".into(),
        2 => "connection not allowed by ruleset".into(),
        3 => "network unreachable".into(),
        4 => "host unreachable".into(),
        5 => "connection refused".into(),
        6 => "TTL expired".into(),
        7 => "command not supported".into(),
        8 => "address type not supported".into(),
        other => format!("reply code {other}"),
    }
}
