//! A TCP proxy for tests that corrupts one byte of the traffic in one direction when asked to:
//! how the record layers' tests put a tampered record on a real socket.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which direction the proxy corrupts (the other is copied unchanged).
#[derive(Clone, Copy)]
pub(crate) enum Towards {
    /// Bytes from the connecting side to `to`.
    Server,
    /// Bytes from `to` back to the connecting side.
    Client,
}

/// Listens on loopback and forwards its first connection to `to`. While `flip` is set, the next
/// read towards `towards` longer than `min_read` bytes gets `mask` XORed into its middle byte
/// (and `flip` is cleared): exactly one corrupted byte per request.
pub(crate) async fn tampering_proxy(
    to: SocketAddr,
    flip: Arc<AtomicBool>,
    towards: Towards,
    min_read: usize,
    mask: u8,
) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (a, _) = l.accept().await.unwrap();
        let b = TcpStream::connect(to).await.unwrap();
        let (ar, aw) = a.into_split();
        let (br, bw) = b.into_split();
        match towards {
            Towards::Server => {
                tokio::spawn(copy_then_shutdown(br, aw));
                tamper(ar, bw, flip, min_read, mask).await;
            }
            Towards::Client => {
                tokio::spawn(copy_then_shutdown(ar, bw));
                tamper(br, aw, flip, min_read, mask).await;
            }
        }
    });
    addr
}

async fn copy_then_shutdown<R, W>(mut r: R, mut w: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let _ = tokio::io::copy(&mut r, &mut w).await;
    let _ = w.shutdown().await;
}

async fn tamper<R, W>(mut r: R, mut w: W, flip: Arc<AtomicBool>, min_read: usize, mask: u8)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if n > min_read && flip.swap(false, Ordering::SeqCst) {
            buf[n / 2] ^= mask;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}
