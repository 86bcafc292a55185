//! Talking to the directory authority: upload a relay descriptor, fetch and verify
//! the consensus, with `chive-http`'s small client (one request per connection,
//! `Connection: close`), a 10 s deadline and bounded response sizes, because the
//! authority's answers are the only input here and they must not be able to stall or
//! exhaust a node.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use chive_crypto::IdentityKey;
use chive_dir::{Consensus, MAX_CONSENSUS_LEN};

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
pub(crate) fn quote(body: &[u8]) -> String {
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
pub(crate) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let host = addr.to_string();
    let agent = format!("chive/{}", env!("CARGO_PKG_VERSION"));
    let length = body.map(|b| b.len().to_string());
    let mut headers = vec![
        ("Host", host.as_str()),
        ("Connection", "close"),
        ("User-Agent", agent.as_str()),
    ];
    if let Some(length) = &length {
        headers.push(("Content-Type", "text/plain"));
        headers.push(("Content-Length", length));
    }
    let head = chive_http::request_head(method, path, &headers)?;
    let bounds = chive_http::OneShot {
        timeout: TIMEOUT,
        max_head: MAX_HEAD,
        max_body: MAX_BODY,
    };
    let response = chive_http::request(addr, &head, body, &bounds).await?;
    Ok((response.head.status, response.body))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::authority::tests::{descriptor, settings};
    use crate::authority::{publish_loop, serve, Authority};
    use chive_crypto::IdentityKeypair;
    use chive_dir::DirError;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
}
