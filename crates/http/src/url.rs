//! `http://` URLs: split into what a SOCKS CONNECT needs (host, port) and what the
//! request needs (path, Host header).

use std::net::IpAddr;

/// The host part of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlHost {
    /// An IPv4 or IPv6 address.
    Ip(IpAddr),
    /// A host name, lower-cased; resolved by whoever connects (e.g. the SOCKS proxy).
    Name(String),
}

/// An `http://` URL, split for the SOCKS request and the HTTP request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// The host.
    pub host: UrlHost,
    /// The port (80 if not given).
    pub port: u16,
    /// `host[:port]` as written, for the Host header.
    pub authority: String,
    /// Path and query, starting with '/'.
    pub path: String,
}

/// Parse `http://HOST[:PORT][/PATH][?QUERY][#FRAGMENT]`.
pub fn parse_url(url: &str) -> Result<HttpUrl, &'static str> {
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .and_then(|_| url.get(7..))
        .ok_or("only http:// URLs are supported")?;
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if path.bytes().any(|b| b <= b' ' || b == 0x7F) {
        return Err("the path must not contain spaces or control characters");
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    if authority.contains('@') {
        return Err("user info in URLs is not supported");
    }
    let (host_text, port_text) = if let Some(inner) = authority.strip_prefix('[') {
        let (v6, after) = inner.split_once(']').ok_or("unterminated [IPv6] host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after [IPv6] host")?),
        };
        let ip: std::net::Ipv6Addr = v6.parse().map_err(|_| "bad IPv6 address")?;
        (UrlHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let host = if let Ok(ip) = h.parse::<std::net::Ipv4Addr>() {
            UrlHost::Ip(IpAddr::V4(ip))
        } else {
            if h.is_empty() || h.len() > 255 {
                return Err("the host must be 1 to 255 characters");
            }
            if !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            {
                return Err("bad character in host name");
            }
            UrlHost::Name(h.to_ascii_lowercase())
        };
        (host, p)
    };
    let port = match port_text {
        None => 80,
        // Digits only: u16::from_str would also take a leading '+'.
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(p) if p != 0 => p,
                _ => return Err("bad port"),
            }
        }
        Some(_) => return Err("bad port"),
    };
    Ok(HttpUrl {
        host: host_text,
        port,
        authority: authority.to_string(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parsing() {
        let u = parse_url("http://example.com:8080/a/b?c=d#frag").unwrap();
        assert_eq!(u.host, UrlHost::Name("example.com".into()));
        assert_eq!(
            (u.port, u.authority.as_str(), u.path.as_str()),
            (8080, "example.com:8080", "/a/b?c=d")
        );
        let u = parse_url("HTTP://10.0.0.1").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("10.0.0.1".parse().unwrap()), 80, "/")
        );
        let u = parse_url("http://[::1]:81?q").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("::1".parse().unwrap()), 81, "/?q")
        );
        for bad in [
            "https://x/",
            "ftp://x",
            "http://",
            "http://a b/",
            "http://x:0/",
            "http://x:99999/",
            "http://x:/",
            "http://u@x/",
            "http://[::1/",
            "http://[zz]/",
            "http://x/a b",
            "http://x:+80/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
