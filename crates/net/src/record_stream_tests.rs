//! The record stream over loopback TCP against tokio-rustls (rustls's buffered connection) on
//! the other end: the exporters agree, data is byte-exact both ways, KeyUpdates from either
//! side, a byte flipped on the wire fails the stream with bad_record_mac, close_notify.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::record::{HEADER_LEN, MAX_PLAINTEXT, TAG_LEN};
use crate::test_proxy::{tampering_proxy, Towards};
use crate::tls;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// A TCP pair over loopback (client end, server end).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
    (c.unwrap(), s.unwrap().0)
}

/// rustls's own exporter values for the link's two labels.
fn export<D>(conn: &rustls::ConnectionCommon<D>) -> [[u8; 32]; 2] {
    let value = |label: &[u8]| conn.export_keying_material([0u8; 32], label, None).unwrap();
    [value(EXPORTER_LABEL), value(BIND_EXPORTER_LABEL)]
}

#[tokio::test]
async fn own_client_against_rustls_server_exporters_data_and_key_updates() {
    let (c, s) = tcp_pair().await;
    let acceptor = TlsAcceptor::from(tls::server_config().unwrap());
    let server = tokio::spawn(async move {
        let mut tls = acceptor.accept(s).await.unwrap();
        let ours = export(tls.get_ref().1);
        // 2 MB in, then KeyUpdates mid-stream (rustls asks for ours in return), 2 MB out.
        let mut got = vec![0u8; 2_000_000];
        tls.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data(2_000_000, 1));
        for round in 0..3u8 {
            tls.write_all(&data(300_000, round)).await.unwrap();
            tls.get_mut().1.refresh_traffic_keys().unwrap();
            tls.write_all(&data(400_000, round + 50)).await.unwrap();
            tls.flush().await.unwrap();
        }
        // Our peer's data after its answering KeyUpdates.
        let mut got = vec![0u8; 100_000];
        tls.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data(100_000, 9));
        // Its close_notify ends our read side.
        let mut rest = Vec::new();
        tls.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        ours
    });
    let cfg = tls::client_config().unwrap();
    let (mut stream, exporter, bind) =
        connect(c, &cfg, tls::server_name("127.0.0.1:1".parse().unwrap()))
            .await
            .unwrap();
    assert_eq!(
        stream.suite(),
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256
    );
    stream.write_all(&data(2_000_000, 1)).await.unwrap();
    stream.flush().await.unwrap();
    let mut want = Vec::new();
    for round in 0..3u8 {
        want.extend(data(300_000, round));
        want.extend(data(400_000, round + 50));
    }
    let mut got = vec![0u8; want.len()];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(got, want);
    assert!(
        stream.opener.seq() < 100,
        "the key was updated (sequence restarted)"
    );
    stream.write_all(&data(100_000, 9)).await.unwrap();
    stream.shutdown().await.unwrap();
    let theirs = server.await.unwrap();
    assert_eq!(theirs, [exporter, bind]);
}

#[tokio::test]
async fn own_server_against_rustls_client_with_our_key_updates() {
    let (c, s) = tcp_pair().await;
    let connector = TlsConnector::from(tls::client_config().unwrap());
    let client = tokio::spawn(async move {
        let mut tls = connector
            .connect(tls::server_name("127.0.0.1:1".parse().unwrap()), c)
            .await
            .unwrap();
        let theirs = export(tls.get_ref().1);
        // The rustls client speaks first right after the handshake (as a link initiator
        // does): its first bytes may arrive with its Finished.
        tls.write_all(&data(50_000, 3)).await.unwrap();
        tls.flush().await.unwrap();
        let mut got = Vec::new();
        tls.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, data(3_000_000, 4));
        tls.shutdown().await.unwrap();
        theirs
    });
    let cfg = tls::server_config().unwrap();
    let (mut stream, exporter, bind) = accept(s, &cfg).await.unwrap();
    let mut got = vec![0u8; 50_000];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(got, data(50_000, 3));
    let sent = data(3_000_000, 4);
    for (i, chunk) in sent.chunks(1_000_000).enumerate() {
        stream.write_all(chunk).await.unwrap();
        if i < 2 {
            // Force a KeyUpdate of ours between chunks.
            stream.send_key_update(false).unwrap();
        }
    }
    assert!(stream.sealer.seq() < 100);
    stream.shutdown().await.unwrap();
    // The client's close_notify: EOF.
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    assert_eq!(client.await.unwrap(), [exporter, bind]);
}

#[tokio::test]
async fn own_layer_on_both_ends() {
    let (c, s) = tcp_pair().await;
    let scfg = tls::server_config().unwrap();
    let server = tokio::spawn(async move {
        let (mut st, e, b) = accept(s, &scfg).await.unwrap();
        let mut got = Vec::new();
        st.read_to_end(&mut got).await.unwrap();
        st.write_all(&got).await.unwrap();
        st.shutdown().await.unwrap();
        (e, b)
    });
    let ccfg = tls::client_config().unwrap();
    let (mut st, e, b) = connect(c, &ccfg, tls::server_name("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    st.write_all(&data(1_000_003, 5)).await.unwrap();
    st.shutdown().await.unwrap();
    let mut back = Vec::new();
    st.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, data(1_000_003, 5));
    assert_eq!(server.await.unwrap(), (e, b));
}

/// Memory per connection: the receive buffer holds at most the start of one record between a
/// link's reads (64 KiB reads, as the link's `CellBuf` makes them, go straight to the caller),
/// none when the last read ended on a record boundary (an idle link), takes `RECV_BUF` only while
/// small reads need it, and gives it back once reads are large again.
#[tokio::test]
async fn receive_buffer_holds_at_most_a_record_start_between_large_reads() {
    let (c, s) = tcp_pair().await;
    let scfg = tls::server_config().unwrap();
    let total = 4_000_000;
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let first = 100_000;
    let server = tokio::spawn(async move {
        let (mut st, _, _) = accept(s, &scfg).await.unwrap();
        let all = data(total, 3);
        st.write_all(&all[..first]).await.unwrap();
        st.flush().await.unwrap();
        wait.await.unwrap();
        st.write_all(&all[first..]).await.unwrap();
        st.shutdown().await.unwrap();
    });
    let ccfg = tls::client_config().unwrap();
    let (mut st, _, _) = connect(c, &ccfg, tls::server_name("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    assert!(st.rbuf.capacity() < MAX_RECORD, "after the handshake");
    let mut got = Vec::new();
    let mut room = vec![0u8; 64 * 1024];
    let mut held = 0;
    // Everything the peer sent, then nothing more for now: the last read ended on a record
    // boundary, and a link with nothing in flight holds no receive buffer.
    while got.len() < first {
        let n = st.read(&mut room).await.unwrap();
        got.extend_from_slice(&room[..n]);
    }
    assert_eq!(st.rbuf.capacity(), 0, "idle, nothing kept");
    go.send(()).unwrap();
    // Large reads, then small ones (the buffered path), then large ones to the end.
    while got.len() < 2_000_000 {
        let n = st.read(&mut room).await.unwrap();
        got.extend_from_slice(&room[..n]);
        assert!(
            st.rbuf.capacity() < MAX_RECORD,
            "{} bytes buffered",
            st.rbuf.capacity()
        );
        held = held.max(st.rend - st.rstart);
    }
    assert!(
        held > 0,
        "no read ended inside a record: the test shows nothing"
    );
    for _ in 0..10 {
        let n = st.read(&mut room[..100]).await.unwrap();
        got.extend_from_slice(&room[..n]);
    }
    assert_eq!(st.rbuf.len(), RECV_BUF, "small reads go through the buffer");
    loop {
        let n = st.read(&mut room).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&room[..n]);
    }
    assert!(st.rbuf.capacity() < MAX_RECORD, "buffer not given back");
    assert_eq!(got, data(total, 3));
    server.await.unwrap();
}

#[tokio::test]
async fn a_byte_flipped_on_the_wire_fails_the_stream_and_tells_the_peer() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let flip = Arc::new(AtomicBool::new(false));
    let proxy = tampering_proxy(
        l.local_addr().unwrap(),
        flip.clone(),
        Towards::Client,
        0,
        0x10,
    )
    .await;
    let acceptor = TlsAcceptor::from(tls::server_config().unwrap());
    let flip2 = flip.clone();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut tls = acceptor.accept(s).await.unwrap();
        let mut hello = [0u8; 5];
        tls.read_exact(&mut hello).await.unwrap();
        flip2.store(true, Ordering::SeqCst);
        tls.write_all(&data(10_000, 7)).await.unwrap();
        tls.flush().await.unwrap();
        // Our end answers the bad record with a sealed bad_record_mac alert.
        let mut rest = Vec::new();
        tls.read_to_end(&mut rest).await.unwrap_err()
    });
    let c = TcpStream::connect(proxy).await.unwrap();
    let cfg = tls::client_config().unwrap();
    let (mut stream, _, _) = connect(c, &cfg, tls::server_name("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    stream.write_all(b"hello").await.unwrap();
    stream.flush().await.unwrap();
    let mut got = vec![0u8; 10_000];
    let err = stream.read_exact(&mut got).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("failed authentication"), "{err}");
    // It stays failed.
    assert!(stream.read(&mut got).await.is_err());
    let peer_err = server.await.unwrap();
    assert!(peer_err.to_string().contains("BadRecordMac"), "{peer_err}");
}

/// A transport whose reads bring at most `max` bytes each (set after the handshake).
struct Trickle<S> {
    inner: S,
    max: Arc<std::sync::atomic::AtomicUsize>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Trickle<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let max = this.max.load(Ordering::SeqCst).min(buf.remaining());
        let mut part = ReadBuf::new(buf.initialize_unfilled_to(max));
        ready!(Pin::new(&mut this.inner).poll_read(cx, &mut part))?;
        let n = part.filled().len();
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Trickle<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Records arriving one byte per read (a peer trickling them) are moved in user space about
/// twice per byte (appended to the kept start, then into the caller's buffer once whole), not
/// once per read: before, every read inside a record copied its whole start out and back, so a
/// 16 KiB record in 1-byte reads moved ~270 MB. Counted by the stream's `moved` hook, not timed.
#[tokio::test]
async fn records_in_one_byte_reads_are_moved_a_bounded_number_of_times() {
    let (c, s) = tokio::io::duplex(256 * 1024);
    let max = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let c = Trickle {
        inner: c,
        max: max.clone(),
    };
    let scfg = tls::server_config().unwrap();
    let records = 3;
    let trickled = records * MAX_PLAINTEXT;
    let total = trickled + 200_000;
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut st, _, _) = accept(s, &scfg).await.unwrap();
        wait.await.unwrap();
        st.write_all(&data(total, 9)).await.unwrap();
        st.shutdown().await.unwrap();
        let mut rest = Vec::new();
        st.read_to_end(&mut rest).await.unwrap();
    });
    let ccfg = tls::client_config().unwrap();
    let (mut st, _, _) = connect(c, &ccfg, tls::server_name("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    max.store(1, Ordering::SeqCst);
    go.send(()).unwrap();
    let mut room = vec![0u8; 64 * 1024];
    let mut got = Vec::new();
    while got.len() < trickled {
        let n = st.read(&mut room).await.unwrap();
        assert!(n > 0, "EOF after {} bytes", got.len());
        got.extend_from_slice(&room[..n]);
    }
    let wire = records * (HEADER_LEN + MAX_PLAINTEXT + 1 + TAG_LEN);
    assert!(st.moved >= wire, "the records went through the kept start");
    assert!(st.moved <= 2 * wire, "{} bytes moved for {wire}", st.moved);
    // Large reads again: the rest arrives exactly, through the direct path.
    max.store(usize::MAX, Ordering::SeqCst);
    st.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, data(total, 9));
    st.shutdown().await.unwrap();
    server.await.unwrap();
}

#[test]
fn the_exporter_matches_rfc_8446_derivation_for_each_suite() {
    // Cross-checked against rustls in the tests above for AES-128-GCM; here the other
    // suites' hashes are exercised (lengths and determinism).
    use rustls::crypto::ring::cipher_suite::*;
    for suite in [
        TLS13_AES_128_GCM_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
    ] {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        tls13_exporter(suite, &[1; 48], EXPORTER_LABEL, &mut a).unwrap();
        tls13_exporter(suite, &[1; 48], BIND_EXPORTER_LABEL, &mut b).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; 32]);
    }
}

/// Framed batches (`poll_write_framed`) reach a rustls peer intact and in order with what
/// was sealed before them (a KeyUpdate of ours, a normal write), and are sealed where they
/// lie: `poll_write` copied only the normal writes' bytes into the send buffer.
#[tokio::test]
async fn framed_batches_are_sealed_in_place_in_order_with_other_records() {
    let (c, s) = tcp_pair().await;
    let connector = TlsConnector::from(tls::client_config().unwrap());
    let per = crate::CELLS_PER_RECORD;
    let batches = [1, per, per + 1, 128, 3 * per + 5];
    let mut want = Vec::new();
    let mut framed_batches = Vec::new();
    for (i, &cells) in batches.iter().enumerate() {
        let plain = data(cells * chive_cell::CELL_LEN, i as u8);
        let mut framed = Vec::new();
        for record in plain.chunks(per * chive_cell::CELL_LEN) {
            framed.resize(framed.len() + crate::RECORD_HEAD, 0);
            framed.extend_from_slice(record);
            framed.resize(framed.len() + crate::RECORD_TAIL, 0);
        }
        want.extend_from_slice(&plain);
        want.extend_from_slice(&[i as u8; 10]);
        framed_batches.push(framed);
    }
    let total = want.len();
    let client = tokio::spawn(async move {
        let mut tls = connector
            .connect(tls::server_name("127.0.0.1:1".parse().unwrap()), c)
            .await
            .unwrap();
        let mut got = vec![0u8; total];
        tls.read_exact(&mut got).await.unwrap();
        got
    });
    let cfg = tls::server_config().unwrap();
    let (mut stream, _, _) = accept(s, &cfg).await.unwrap();
    for (i, mut framed) in framed_batches.into_iter().enumerate() {
        if i % 2 == 1 {
            // Waits in the send buffer: it must leave before the batch.
            stream.send_key_update(false).unwrap();
        }
        let mut st = FramedWrite::default();
        let plain = per * chive_cell::CELL_LEN;
        std::future::poll_fn(|cx| stream.poll_write_framed(cx, &mut framed, plain, &mut st))
            .await
            .unwrap();
        stream.write_all(&[i as u8; 10]).await.unwrap();
    }
    stream.flush().await.unwrap();
    assert_eq!(client.await.unwrap(), want);
    assert_eq!(stream.sealed_copied, 10 * batches.len());
    // Memory per busy connection: the send buffer held only the small records, never a
    // batch (sealed by copy, it grows to the batch's size and is kept).
    assert!(stream.wbuf.capacity() < 1024, "{}", stream.wbuf.capacity());
}

/// A peer's KeyUpdate asking for ours, read while a framed batch is half-written (the socket
/// full), must not put our answering KeyUpdate between the batch's records: the answer is
/// sealed after the batch's records and leaves after the batch, so the peer reads everything.
#[tokio::test]
async fn a_key_update_answered_mid_framed_batch_waits_for_the_batch_end() {
    let (c, s) = tcp_pair().await;
    let connector = TlsConnector::from(tls::client_config().unwrap());
    let per = crate::CELLS_PER_RECORD;
    let cell = chive_cell::CELL_LEN;
    // Larger than both sockets' buffers, so the write stops part-way while the peer waits.
    let cells = 40_000;
    let plain = data(cells * cell, 7);
    let mut framed = Vec::new();
    for record in plain.chunks(per * cell) {
        framed.resize(framed.len() + crate::RECORD_HEAD, 0);
        framed.extend_from_slice(record);
        framed.resize(framed.len() + crate::RECORD_TAIL, 0);
    }
    let mut want = plain.clone();
    want.extend_from_slice(b"after");
    let total = want.len();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (read_tx, read_rx) = tokio::sync::oneshot::channel::<()>();
    let client = tokio::spawn(async move {
        let mut tls = connector
            .connect(tls::server_name("127.0.0.1:1".parse().unwrap()), c)
            .await
            .unwrap();
        tls.write_all(&data(1000, 1)).await.unwrap();
        // rustls's KeyUpdate asks for the peer's in return.
        tls.get_mut().1.refresh_traffic_keys().unwrap();
        tls.write_all(&data(1000, 2)).await.unwrap();
        tls.flush().await.unwrap();
        // Read part of what was written: room in the socket, so an answer written too early
        // would reach the wire mid-batch.
        let mut got = vec![0u8; total];
        let early = 2_000_000;
        tls.read_exact(&mut got[..early]).await.unwrap();
        read_tx.send(()).unwrap();
        go_rx.await.unwrap();
        tls.read_exact(&mut got[early..]).await.map(|_| got)
    });
    let cfg = tls::server_config().unwrap();
    let (mut stream, _, _) = accept(s, &cfg).await.unwrap();
    let mut st = FramedWrite::default();
    let plain_len = per * cell;
    let first = std::future::poll_fn(|cx| {
        Poll::Ready(stream.poll_write_framed(cx, &mut framed, plain_len, &mut st))
    })
    .await;
    assert!(
        first.is_pending(),
        "the batch must stop part-way for this test"
    );
    read_rx.await.unwrap();
    // Let the kernel move what the peer made room for and tell the runtime the socket is
    // writable again.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut got = vec![0u8; 2000];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..1000], &data(1000, 1)[..]);
    assert_eq!(&got[1000..], &data(1000, 2)[..]);
    go_tx.send(()).unwrap();
    std::future::poll_fn(|cx| stream.poll_write_framed(cx, &mut framed, plain_len, &mut st))
        .await
        .unwrap();
    stream.write_all(b"after").await.unwrap();
    stream.flush().await.unwrap();
    let got = client
        .await
        .unwrap()
        .expect("the peer reads the batch and what follows");
    assert!(got == want, "bytes differ");
}
