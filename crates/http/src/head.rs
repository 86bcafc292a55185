//! Heads: formatting a request head, parsing a response head. Pure functions on bytes.

use crate::HttpError;

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The status code (three digits).
    pub status: u16,
    /// The body length, if the response states one and is not chunked
    /// (RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length).
    pub content_length: Option<u64>,
    /// Whether the body is sent with `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// Every header as (name as sent, trimmed value), in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// An interim (1xx) response: another head follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status)
    }

    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether a body follows this head (204 and 304 never have one; the caller knows
    /// whether it sent HEAD, where none follows either).
    pub fn has_body(&self) -> bool {
        !(self.is_interim() || self.status == 204 || self.status == 304)
    }
}

/// Parse a response head: everything before the blank line that ends it.
pub fn parse_head(raw: &[u8]) -> Result<Head, HttpError> {
    let text = std::str::from_utf8(raw).map_err(|_| HttpError::HeadNotText)?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !(version == "HTTP/1.1" || version == "HTTP/1.0")
        || code.len() != 3
        || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(HttpError::BadStatusLine);
    }
    let status: u16 = code.parse().map_err(|_| HttpError::BadStatusLine)?;
    let mut content_length = None;
    let mut chunked = false;
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(HttpError::BadHeaderLine)?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: u64 = value.parse().map_err(|_| HttpError::BadContentLength)?;
            if content_length.is_some_and(|old| old != n) {
                return Err(HttpError::ConflictingContentLength);
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only a final "chunked" frames the body (RFC 9112 section 6.1).
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
        headers.push((name.trim().to_string(), value.to_string()));
    }
    if chunked {
        content_length = None;
    }
    Ok(Head {
        status,
        content_length,
        chunked,
        headers,
    })
}

/// Format a request head: `METHOD TARGET HTTP/1.1`, the headers in the order given, and
/// the blank line. Refuses control characters anywhere (no header injection).
pub fn request_head(
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<String, HttpError> {
    let clean = |s: &str, what| {
        if s.bytes().any(|b| b < b' ' || b == 0x7F) {
            Err(HttpError::BadRequest(what))
        } else {
            Ok(())
        }
    };
    clean(method, "method")?;
    clean(target, "target")?;
    if method.contains(' ') || target.contains(' ') {
        return Err(HttpError::BadRequest("request line"));
    }
    let mut head = format!("{method} {target} HTTP/1.1\r\n");
    for (name, value) in headers {
        clean(name, "header name")?;
        clean(value, "header value")?;
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y").unwrap();
        assert_eq!(
            (h.status, h.content_length, h.chunked),
            (200, Some(12), false)
        );
        assert_eq!(h.header("x"), Some("y"));
        assert_eq!(h.header("content-length"), Some("12"));
        assert!(h.is_success() && h.has_body() && !h.is_interim());
        let h = parse_head(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\nTransfer-Encoding: gzip, chunked",
        )
        .unwrap();
        assert_eq!((h.status, h.content_length, h.chunked), (404, None, true));
        // "chunked" not last: the body is not chunk-framed.
        let h = parse_head(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked, gzip").unwrap();
        assert!(!h.chunked);
        let h = parse_head(b"HTTP/1.1 100 Continue").unwrap();
        assert!(h.is_interim() && !h.has_body());
        assert!(!parse_head(b"HTTP/1.1 204 No Content").unwrap().has_body());
        // Equal duplicate lengths are fine.
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2").unwrap();
        assert_eq!(h.content_length, Some(2));
    }

    #[test]
    fn hostile_heads_are_refused() {
        for (bad, want) in [
            (&b"HTTP/2 200 OK"[..], HttpError::BadStatusLine),
            (b"HTTP/1.1 20 OK", HttpError::BadStatusLine),
            (b"HTTP/1.1 abc", HttpError::BadStatusLine),
            (b"HTTP/1.1 +20 OK", HttpError::BadStatusLine),
            (b"garbage", HttpError::BadStatusLine),
            (b"", HttpError::BadStatusLine),
            (b"SSH-2.0-OpenSSH", HttpError::BadStatusLine),
            (b"HTTP/1.1 200 OK\r\nnocolon", HttpError::BadHeaderLine),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -1",
                HttpError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999",
                HttpError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
                HttpError::ConflictingContentLength,
            ),
            (b"\xff\xfe", HttpError::HeadNotText),
        ] {
            assert_eq!(
                parse_head(bad),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn request_heads_keep_header_order_and_refuse_injection() {
        let h = request_head("GET", "/a?b", &[("Host", "x:1"), ("Connection", "close")]).unwrap();
        assert_eq!(
            h,
            "GET /a?b HTTP/1.1\r\nHost: x:1\r\nConnection: close\r\n\r\n"
        );
        assert!(request_head("GET", "/a\r\nX: y", &[]).is_err());
        assert!(request_head("GET", "/a b", &[]).is_err());
        assert!(request_head("GET", "/", &[("Host", "x\r\nEvil: 1")]).is_err());
        assert!(request_head("GET", "/", &[("Ho\nst", "x")]).is_err());
    }
}
