//! Single transfers against a local httpd, SOCKS proxy and raw fake servers: records,
//! SOCKS outcomes, content checks, body framings, partial times.

use std::time::Duration;

use chive_client::socks::TargetAddr;
use tokio::net::TcpListener;

use crate::options::HttpMethod;
use crate::record::{Clock, PARTIAL_SIZES};
use crate::testutil::*;

#[tokio::test]
async fn get_through_socks_with_hostname() {
    let http = start_httpd().await;
    let (socks, seen) = start_socks().await;
    let url = format!("http://LocalHost:{}/bytes/1000000", http.port());
    let r = transfer(&base(socks, url.clone()), &Clock::new(), None).await;
    assert_eq!(r.error, None);
    assert_eq!(r.status, Some(200));
    assert_eq!(r.bytes, 1_000_000);
    assert_eq!(r.expected_bytes, Some(1_000_000));
    assert_eq!(r.url, url);
    assert_eq!(r.socks_user, None);
    assert_monotonic(&r);
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].target,
        TargetAddr::Domain("localhost".into(), http.port())
    );
    assert_eq!(seen[0].auth, None);
}

#[tokio::test]
async fn post_upload_counts_and_verifies() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
    s.method = HttpMethod::Post;
    s.upload_bytes = 300_001;
    let r = transfer(&s, &Clock::new(), None).await;
    assert_eq!(r.error, None);
    assert_eq!(r.bytes, 300_001);
    assert_eq!(r.expected_bytes, Some(300_001));
    assert_eq!(r.status, Some(200));
    assert_monotonic(&r);
}

#[tokio::test]
async fn http_404_is_an_error_record() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let r = transfer(
        &base(socks, format!("http://127.0.0.1:{}/nope", http.port())),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error.as_deref(), Some("http: status 404"));
    assert_eq!(r.status, Some(404));
    assert!(r.last_byte.is_some());
}

#[tokio::test]
async fn unreachable_socks_port_gives_error_record() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    let r = transfer(
        &base(dead, "http://127.0.0.1:1/bytes/1".into()),
        &Clock::new(),
        None,
    )
    .await;
    let e = r.error.unwrap();
    assert!(e.starts_with("socks: cannot connect to proxy"), "{e}");
    assert_eq!(r.socket_connected, None);
    assert_eq!(r.bytes, 0);
}

#[tokio::test]
async fn socks_refusal_is_reported() {
    let (socks, _) = start_socks().await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    let r = transfer(
        &base(socks, format!("http://{dead}/bytes/1")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error.as_deref(), Some("socks: connection refused"));
    assert!(r.socket_connected.is_some());
    assert_eq!(r.socks_connected, None);
}

#[tokio::test]
async fn credentials_and_isolation_reach_the_proxy() {
    let http = start_httpd().await;
    let (socks, seen) = start_socks().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/10", http.port()));
    s.pass = "pw".into();
    let clock = Clock::new();
    let a = transfer(&s, &clock, Some("alice".into())).await;
    let b = transfer(&s, &clock, Some("bob".into())).await;
    assert_eq!((a.error, b.error), (None, None));
    assert!(b.start >= a.last_byte.unwrap());
    assert_eq!(a.socks_user.as_deref(), Some("alice"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].auth, Some((b"alice".to_vec(), b"pw".to_vec())));
    assert_eq!(seen[1].auth, Some((b"bob".to_vec(), b"pw".to_vec())));
}

#[tokio::test]
async fn verify_detects_mismatch_and_truncation() {
    let (socks, _) = start_socks().await;
    let bad = start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n\x00\x01\x02\x09\x04").await;
    let r = transfer(
        &base(socks, format!("http://{bad}/bytes/5")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error.as_deref(), Some("verify: mismatch at byte 3"));
    let short = start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n\x00\x01\x02\x03").await;
    let r = transfer(
        &base(socks, format!("http://{short}/bytes/10")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(
        r.error.as_deref(),
        Some("http: connection closed after 4 of 10 body bytes")
    );
    assert_eq!(r.bytes, 4);
    assert_eq!(r.last_byte, None);
}

#[tokio::test]
async fn chunked_and_eof_delimited_bodies() {
    let (socks, _) = start_socks().await;
    let chunked = start_raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n\x00\x01\r\n3\r\n\x02\x03\x04\r\n0\r\nX-T: 1\r\n\r\n",
        )
        .await;
    let r = transfer(
        &base(socks, format!("http://{chunked}/")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error, None);
    assert_eq!((r.bytes, r.expected_bytes), (5, None));
    // Unknown length: only sizes reached are reported, here none.
    assert!(r.partials.is_empty());
    let eof = start_raw(b"HTTP/1.0 200 OK\r\n\r\n\x00\x01\x02").await;
    let r = transfer(&base(socks, format!("http://{eof}/")), &Clock::new(), None).await;
    assert_eq!(r.error, None);
    assert_eq!(r.bytes, 3);
    let garbage = start_raw(b"SSH-2.0-OpenSSH\r\n\r\n").await;
    let r = transfer(
        &base(socks, format!("http://{garbage}/")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error.as_deref(), Some("http: bad status line"));
}

#[tokio::test]
async fn timeout_keeps_partial_record() {
    // A "proxy" that accepts and never answers.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = l.accept().await.unwrap();
            held.push(s);
        }
    });
    let mut s = base(a, "http://127.0.0.1:1/".into());
    s.timeout = Duration::from_millis(200);
    let r = transfer(&s, &Clock::new(), None).await;
    assert_eq!(r.error.as_deref(), Some("timeout"));
    assert!(r.socket_connected.is_some());
    assert_eq!(r.socks_connected, None);
}

#[tokio::test]
async fn partials_are_monotonic_and_only_for_reached_sizes() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let r = transfer(
        &base(
            socks,
            format!("http://127.0.0.1:{}/bytes/600000", http.port()),
        ),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.error, None);
    let keys: Vec<u64> = r.partials.keys().copied().collect();
    assert_eq!(keys, PARTIAL_SIZES[..6]);
    let times: Vec<f64> = r.partials.values().map(|t| t.unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times[0] >= r.first_byte.unwrap());
    assert!(times[5] <= r.last_byte.unwrap());
    // In JSON the sizes are string keys; sizes above the transfer are absent.
    let v = serde_json::to_value(&r).unwrap();
    assert!(v["partials"]["512000"].is_f64());
    assert!(v["partials"].get("1048576").is_none());

    // A size exactly on a boundary includes that boundary.
    let r = transfer(
        &base(
            socks,
            format!("http://127.0.0.1:{}/bytes/51200", http.port()),
        ),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(
        r.partials.keys().copied().collect::<Vec<_>>(),
        [10_240, 20_480, 51_200]
    );
    assert!(r.partials.values().all(|t| t.is_some()));

    // A truncated body: sizes within Content-Length but never reached are null.
    let mut reply = b"HTTP/1.1 200 OK\r\nContent-Length: 30000\r\n\r\n".to_vec();
    reply.extend((0..15_000u64).map(|i| (i % 251) as u8));
    let short = start_raw(Box::leak(reply.into_boxed_slice())).await;
    let r = transfer(
        &base(socks, format!("http://{short}/bytes/30000")),
        &Clock::new(),
        None,
    )
    .await;
    assert_eq!(r.bytes, 15_000);
    assert!(r.error.unwrap().contains("15000 of 30000"));
    assert!(r.partials[&10_240].is_some());
    assert_eq!(r.partials.get(&20_480), Some(&None));
    assert_eq!(r.partials.len(), 2);

    // Uploads: the times at which that many bytes were sent.
    let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
    s.method = HttpMethod::Post;
    s.upload_bytes = 300_001;
    let r = transfer(&s, &Clock::new(), None).await;
    assert_eq!(r.error, None);
    assert_eq!(
        r.partials.keys().copied().collect::<Vec<_>>(),
        PARTIAL_SIZES[..5]
    );
    let times: Vec<f64> = r.partials.values().map(|t| t.unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times[0] >= r.socks_connected.unwrap());
    assert!(times[4] <= r.request_sent.unwrap());
}
