//! Talking to the directory authority: upload a relay descriptor, fetch and verify
//! the consensus. A deliberately small HTTP/1.1 client (one request per connection,
//! `Connection: close`), with a 10 s deadline and bounded response sizes, because the
//! authority's answers are the only input here and they must not be able to stall or
//! exhaust a node.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chive_crypto::IdentityKey;
use chive_dir::{Consensus, MAX_CONSENSUS_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::unix_now;

/// Whole-request deadline: connect, send, read the full response.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted.
const MAX_BODY: usize = MAX_CONSENSUS_LEN;
/// Largest response head (status line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// How much of an error body is quoted in an error message.
const MAX_QUOTED: usize = 300;

/// Upload a signed descriptor to the authority (`POST /descriptor`). Fails with the
/// authority's reason if it refuses the descriptor.
pub async fn publish_descriptor(authority: SocketAddr, doc: &str) -> anyhow::Result<()> {
    let (status, body) = request(authority, "POST", "/descriptor", Some(doc.as_bytes()))
        .await
        .with_context(|| format!("cannot upload descriptor to authority {authority}"))?;
    if status != 200 {
        bail!(
            "authority {authority} refused the descriptor (HTTP {status}): {}",
            quote(&body)
        );
    }
    Ok(())
}

/// Fetch the consensus (`GET /consensus`) and verify it against `authority_id` at the
/// current time. Returns the parsed consensus and the document. A verification failure
/// keeps the [`chive_dir::DirError`] as the error's source (so `downcast_ref` finds it).
pub async fn fetch_consensus(
    authority: SocketAddr,
    authority_id: &IdentityKey,
) -> anyhow::Result<(Consensus, String)> {
    let (status, body) = request(authority, "GET", "/consensus", None)
        .await
        .with_context(|| format!("cannot fetch the consensus from authority {authority}"))?;
    match status {
        200 => {}
        503 => bail!("authority {authority} has no consensus yet"),
        s => bail!(
            "authority {authority} answered HTTP {s} for the consensus: {}",
            quote(&body)
        ),
    }
    let doc = String::from_utf8(body)
        .map_err(|_| anyhow!("consensus from authority {authority} is not UTF-8 text"))?;
    let consensus = Consensus::verify(&doc, authority_id, unix_now())
        .with_context(|| format!("consensus from authority {authority} rejected"))?;
    Ok((consensus, doc))
}

/// A printable, bounded excerpt of an error body.
fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .trim()
        .chars()
        .take(MAX_QUOTED)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().chars().count() > MAX_QUOTED {
        out.push('…');
    }
    out
}

/// One HTTP/1.1 request; returns (status, body).
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    tokio::time::timeout(TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await.context("connect")?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: chive/{}\r\n",
            env!("CARGO_PKG_VERSION")
        );
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: text/plain\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.context("send")?;
        if let Some(b) = body {
            stream.write_all(b).await.context("send")?;
        }
        stream.flush().await.context("send")?;
        // The server closes after its answer; read to EOF, at most one byte past the limit
        // so an oversized answer is detected rather than silently cut.
        let limit = MAX_HEAD + MAX_BODY;
        let mut raw = Vec::new();
        (&mut stream)
            .take(limit as u64 + 1)
            .read_to_end(&mut raw)
            .await
            .context("receive")?;
        if raw.len() > limit {
            bail!("response larger than {limit} bytes");
        }
        parse_response(&raw)
    })
    .await
    .map_err(|_| anyhow!("no complete answer within {} s", TIMEOUT.as_secs()))?
}

/// Parse a complete HTTP/1.x response (read to EOF).
fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let head_end = raw
        .windows(4)
        .take(MAX_HEAD)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no complete HTTP response head"))?;
    let head = std::str::from_utf8(raw.get(..head_end).unwrap_or_default())
        .map_err(|_| anyhow!("HTTP response head is not text"))?;
    let rest = raw.get(head_end + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        bail!(
            "not an HTTP/1.x response: {}",
            quote(status_line.as_bytes())
        );
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| anyhow!("bad HTTP status line: {}", quote(status_line.as_bytes())))?;
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            bail!("bad HTTP header line: {}", quote(line.as_bytes()));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse()
                .map_err(|_| anyhow!("bad Content-Length {}", quote(value.as_bytes())))?;
            if content_length.is_some_and(|old| old != n) {
                bail!("conflicting Content-Length headers");
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .to_ascii_lowercase()
                .split(',')
                .any(|v| v.trim() == "chunked");
        }
    }
    let body = if chunked {
        decode_chunked(rest)?
    } else if let Some(n) = content_length {
        rest.get(..n)
            .ok_or_else(|| anyhow!("response body cut short: {} of {n} bytes", rest.len()))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    if body.len() > MAX_BODY {
        bail!("response body larger than {MAX_BODY} bytes");
    }
    Ok((status, body))
}

/// Decode a `Transfer-Encoding: chunked` body.
fn decode_chunked(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("chunked body cut short"))?;
        let line = std::str::from_utf8(data.get(..line_end).unwrap_or_default())
            .map_err(|_| anyhow!("bad chunk size line"))?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| anyhow!("bad chunk size {}", quote(size_hex.as_bytes())))?;
        data = data.get(line_end + 2..).unwrap_or_default();
        if size == 0 {
            return Ok(out);
        }
        if size > MAX_BODY.saturating_sub(out.len()) {
            bail!("response body larger than {MAX_BODY} bytes");
        }
        let chunk = data
            .get(..size)
            .ok_or_else(|| anyhow!("chunked body cut short"))?;
        out.extend_from_slice(chunk);
        data = data
            .get(size..)
            .and_then(|d| d.strip_prefix(b"\r\n"))
            .ok_or_else(|| anyhow!("chunk not followed by CRLF"))?;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::authority::tests::{descriptor, settings};
    use crate::authority::{publish_loop, serve, Authority};
    use chive_crypto::IdentityKeypair;
    use chive_dir::DirError;
    use tokio::net::TcpListener;

    /// Start an in-process authority on a loopback port; returns its address and key.
    async fn start_authority(tag: &str, seed: u8) -> (SocketAddr, IdentityKey, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("chive-dirclient-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = IdentityKeypair::from_secret_bytes(&[seed; 32]);
        let id = key.public();
        let auth = Arc::new(Authority::new(
            key,
            settings(&dir, "ConsensusInterval = 3600"),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(publish_loop(auth.clone()));
        tokio::spawn(serve(auth, listener));
        (addr, id, dir)
    }

    /// Poll until the authority serves a consensus listing `n` relays.
    async fn wait_for(addr: SocketAddr, id: &IdentityKey, n: usize) -> (Consensus, String) {
        for _ in 0..100 {
            if let Ok((c, doc)) = fetch_consensus(addr, id).await {
                if c.relays.len() == n {
                    return (c, doc);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no consensus with {n} relays within 5 s");
    }

    #[tokio::test]
    async fn publish_then_fetch_verified_consensus() {
        let (addr, id, dir) = start_authority("ok", 210).await;
        let err = fetch_consensus(addr, &id).await.unwrap_err();
        assert!(format!("{err:#}").contains("no consensus yet"), "{err:#}");

        let now = unix_now();
        for n in 1..=3u8 {
            let (d, k) = descriptor(n, now);
            publish_descriptor(addr, &d.sign(&k)).await.unwrap();
        }
        // The interval is an hour: only the new-relay trigger can publish this fast.
        let (c, doc) = wait_for(addr, &id, 3).await;
        assert!(c.relay_by_nickname("relay2").is_some());
        assert!(doc.starts_with("chive-consensus 1\n"));
        let saved = std::fs::read_to_string(dir.join("consensus")).unwrap();
        assert!(
            Consensus::verify(&saved, &id, unix_now()).is_ok(),
            "debug copy is the signed document"
        );

        // GET /identity returns the key in hex.
        let (status, body) = request(addr, "GET", "/identity", None).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(String::from_utf8(body).unwrap().trim(), id.to_hex());
        let (status, _) = request(addr, "GET", "/nothing", None).await.unwrap();
        assert_eq!(status, 404);

        // A consensus checked against another authority's key is refused clearly.
        let other = IdentityKeypair::from_secret_bytes(&[211; 32]).public();
        let err = fetch_consensus(addr, &other).await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<DirError>(),
            Some(&DirError::BadSignature)
        );
        assert!(
            format!("{err:#}").contains("signed by another authority"),
            "{err:#}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn bad_descriptors_rejected_with_reason() {
        let (addr, _id, dir) = start_authority("bad", 212).await;
        let (d, k) = descriptor(5, unix_now());
        let doc = d.sign(&k).replacen("relay5", "relay6", 1);
        let err = publish_descriptor(addr, &doc).await.unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("HTTP 400") && msg.contains("signature"),
            "{msg}"
        );

        let huge = "x".repeat(70 * 1024);
        let err = publish_descriptor(addr, &huge).await.unwrap_err();
        assert!(format!("{err:#}").contains("HTTP 413"), "{err:#}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A server that answers every connection with `response` bytes, then closes.
    async fn fake_server(response: Vec<u8>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let response = response.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(&response).await;
                });
            }
        });
        addr
    }

    fn http_ok(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn tampered_and_expired_consensus_rejected() {
        let key = IdentityKeypair::from_secret_bytes(&[213; 32]);
        let now = unix_now();
        let (d, _) = descriptor(1, now);
        let good = chive_dir::build_consensus(
            &[d],
            chive_dir::NetParams::new(),
            &chive_dir::FlagPolicy::default(),
            now,
            60,
            0,
        )
        .sign(&key);

        let addr = fake_server(http_ok(&good)).await;
        assert!(fetch_consensus(addr, &key.public()).await.is_ok());

        // One changed bandwidth digit: the signature no longer verifies.
        let tampered = good.replacen("\"bandwidth\":1000000", "\"bandwidth\":9000000", 1);
        assert_ne!(tampered, good);
        let addr = fake_server(http_ok(&tampered)).await;
        let err = fetch_consensus(addr, &key.public()).await.unwrap_err();
        assert_eq!(
            err.downcast_ref::<DirError>(),
            Some(&DirError::BadSignature)
        );
        let msg = format!("{err:#}");
        assert!(
            msg.contains("rejected: consensus signature does not verify: tampered"),
            "{msg}"
        );

        let old = chive_dir::build_consensus(
            &[],
            chive_dir::NetParams::new(),
            &chive_dir::FlagPolicy::default(),
            now - 10_000,
            60,
            0,
        )
        .sign(&key);
        let addr = fake_server(http_ok(&old)).await;
        let err = fetch_consensus(addr, &key.public()).await.unwrap_err();
        assert!(matches!(
            err.downcast_ref::<DirError>(),
            Some(DirError::Expired { .. })
        ));
        assert!(format!("{err:#}").contains("expired"), "{err:#}");
    }

    #[tokio::test]
    async fn broken_http_answers_are_errors() {
        let key = IdentityKeypair::from_secret_bytes(&[214; 32]).public();
        for raw in [
            b"garbage\r\n\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_vec(),
            b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom".to_vec(),
            b"HTTP/1.1 200 OK\r\n".to_vec(),
            Vec::new(),
        ] {
            let addr = fake_server(raw.clone()).await;
            assert!(
                fetch_consensus(addr, &key).await.is_err(),
                "{:?}",
                String::from_utf8_lossy(&raw)
            );
        }
        let err = fetch_consensus(
            fake_server(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom".to_vec()).await,
            &key,
        )
        .await
        .unwrap_err();
        assert!(format!("{err:#}").contains("HTTP 500") && format!("{err:#}").contains("boom"));
    }

    #[test]
    fn parses_chunked_and_plain_bodies() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\n\r\n").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"abcdefg"[..]));
        let (s, b) = parse_response(b"HTTP/1.0 503 X\r\n\r\nno consensus yet\n").unwrap();
        assert_eq!((s, b.as_slice()), (503, &b"no consensus yet\n"[..]));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
                .is_err()
        );
        assert!(parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        )
        .is_err());
    }
}
