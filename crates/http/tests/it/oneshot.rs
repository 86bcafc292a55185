//! `request` against loopback servers: answers, deadline, refused connections, limits.

use std::net::SocketAddr;
use std::time::Duration;

use chive_http::{request, request_head, HttpError, OneShot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BOUNDS: OneShot = OneShot {
    timeout: Duration::from_secs(5),
    max_head: 16 * 1024,
    max_body: 1024,
};

/// A server that reads one request, answers every connection with `response`, then
/// closes; the request it saw comes back on the returned channel.
async fn fake_server(response: Vec<u8>) -> (SocketAddr, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let response = response.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(buf[..n].to_vec()).await;
                let _ = s.write_all(&response).await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn sends_the_head_and_body_and_reads_the_answer() {
    let (addr, mut seen) =
        fake_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA".to_vec()).await;
    let head = request_head(
        "POST",
        "/descriptor",
        &[
            ("Host", "a"),
            ("Connection", "close"),
            ("Content-Length", "3"),
        ],
    )
    .unwrap();
    let r = request(addr, &head, Some(b"doc"), &BOUNDS).await.unwrap();
    assert_eq!((r.head.status, r.body.as_slice()), (200, &b"ok"[..]));
    let sent = seen.recv().await.unwrap();
    assert_eq!(
        sent,
        b"POST /descriptor HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 3\r\n\r\ndoc"
    );
}

#[tokio::test]
async fn oversized_and_broken_answers_are_errors() {
    let get = request_head("GET", "/", &[("Connection", "close")]).unwrap();
    let mut big = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    big.extend([b'x'; 2000]);
    let (addr, _) = fake_server(big).await;
    assert_eq!(
        request(addr, &get, None, &BOUNDS).await,
        Err(HttpError::BodyTooLarge(1024))
    );
    let (addr, _) =
        fake_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_vec()).await;
    assert_eq!(
        request(addr, &get, None, &BOUNDS).await,
        Err(HttpError::ClosedInBody {
            received: 5,
            expected: 100
        })
    );
    let (addr, _) = fake_server(Vec::new()).await;
    assert_eq!(
        request(addr, &get, None, &BOUNDS).await,
        Err(HttpError::ClosedBeforeResponse)
    );
}

#[tokio::test]
async fn a_silent_server_meets_the_deadline_and_a_closed_port_refuses() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let get = request_head("GET", "/", &[]).unwrap();
    let bounds = OneShot {
        timeout: Duration::from_millis(200),
        ..BOUNDS
    };
    assert_eq!(
        request(addr, &get, None, &bounds).await,
        Err(HttpError::Timeout(Duration::from_millis(200)))
    );
    holder.abort();

    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    assert_eq!(
        request(dead, &get, None, &BOUNDS).await,
        Err(HttpError::Connect(std::io::ErrorKind::ConnectionRefused))
    );
}
