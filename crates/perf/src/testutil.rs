//! Test fixtures shared by the runner's and the transfer's tests: a local httpd, a SOCKS
//! proxy that records what it was asked, raw and slow HTTP servers, base settings.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chive_client::socks::{accept_socks, send_reply, SocksReply, SocksRequest, TargetAddr};
use chive_http::parse_url;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::cancel::Cancel;
use crate::options::{HttpMethod, Settings};
use crate::record::{Clock, Record, Tag};
use crate::runner::{guarded_transfer, run_transfers, Shared};

/// One transfer with no loop around it: no deadline, no cancellation, no progress.
pub(crate) async fn transfer(s: &Settings, clock: &Clock, user: Option<String>) -> Record {
    let shared = Shared {
        settings: s.clone(),
        clock: *clock,
        cancel: Cancel::new(),
        deadline: None,
    };
    let tag = Tag {
        class: None,
        loop_index: 0,
        seq: 0,
    };
    guarded_transfer(&shared, tag, user, None).await.0
}

/// Run the loops into a buffer; the outcome and every JSON line.
pub(crate) async fn run_collect(s: Settings, cancel: Cancel) -> (anyhow::Result<()>, Vec<Value>) {
    let mut out = Vec::new();
    let r = run_transfers(s, &mut out, cancel).await;
    let lines = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (r, lines)
}

/// The records of one "type".
pub(crate) fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["type"] == kind).collect()
}

pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

/// A loopback server that runs `handler` on every connection, each in its own task.
async fn serve_each<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(handler(s));
        }
    });
    a
}

/// An HTTP server that sends `total` pattern bytes (with Content-Length),
/// `piece` bytes every `every`, so transfers take a known time.
pub(crate) async fn start_slow(total: usize, piece: usize, every: Duration) -> SocketAddr {
    serve_each(move |mut s| async move {
        if !read_request_head(&mut s).await {
            return;
        }
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n");
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let body: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        for c in body.chunks(piece) {
            if s.write_all(c).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    })
    .await
}

pub(crate) async fn start_httpd() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(chive_tools::httpd::serve(l));
    a
}

pub(crate) type Seen = Arc<Mutex<Vec<SocksRequest>>>;

/// A tiny SOCKS server: accept_socks, then a direct TCP connect. Every domain
/// maps to 127.0.0.1 (so tests also prove names are sent unresolved).
pub(crate) async fn start_socks() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    let a = serve_each(move |mut s| {
        let seen = seen2.clone();
        async move {
            let Ok(req) = accept_socks(&mut s).await else {
                return;
            };
            seen.lock().unwrap().push(req.clone());
            let target = match &req.target {
                TargetAddr::Ip(a) => *a,
                TargetAddr::Domain(_, p) => SocketAddr::from(([127, 0, 0, 1], *p)),
            };
            match TcpStream::connect(target).await {
                Ok(mut up) => {
                    let bound = up.local_addr().ok();
                    send_reply(&mut s, &req, SocksReply::Succeeded, bound)
                        .await
                        .unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                }
                Err(_) => {
                    let _ = send_reply(&mut s, &req, SocksReply::ConnectionRefused, None).await;
                }
            }
        }
    })
    .await;
    (a, seen)
}

/// A raw HTTP server that reads a request head, then sends `reply` and closes.
pub(crate) async fn start_raw(reply: &'static [u8]) -> SocketAddr {
    serve_each(move |mut s| async move {
        if read_request_head(&mut s).await {
            let _ = s.write_all(reply).await;
        }
    })
    .await
}

pub(crate) fn base(socks: SocketAddr, url: String) -> Settings {
    Settings {
        socks,
        url: parse_url(&url).unwrap(),
        url_text: url,
        count: 1,
        duration: None,
        cut_at_deadline: false,
        interval: Duration::ZERO,
        pause: Duration::ZERO,
        think: None,
        think_mean: Duration::ZERO,
        seed: 1,
        start_delay: Duration::ZERO,
        parallel: 1,
        progress: None,
        label: None,
        user: None,
        pass: String::new(),
        isolate: false,
        timeout: Duration::from_secs(20),
        method: HttpMethod::Get,
        upload_bytes: 0,
        verify: true,
        log: "warn".into(),
    }
}

pub(crate) fn assert_monotonic(r: &Record) {
    let times = [
        Some(r.start),
        r.socket_connected,
        r.socks_connected,
        r.request_sent,
        r.first_byte,
        r.last_byte,
    ];
    let times: Vec<f64> = times
        .iter()
        .map(|t| t.expect("all times reached"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // Sanity: near the real clock.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - r.start).abs() < 60.0);
}

/// Read a request head (ignored); false if the client went away first.
async fn read_request_head(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    true
}
