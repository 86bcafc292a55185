//! Link tests over loopback: real TLS, real handshakes, and hand-crafted misbehaving peers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chive_cell::{
    AnyCell, Authenticate, Cell, CellCommand, LinkFeatures, VarCell, Versions, PAYLOAD_LEN,
};
use chive_crypto::{IdentityKey, IdentityKeypair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::handshake::{auth_message, Role, EXPORTER_LABEL, EXPORTER_LEN};
use crate::*;

fn keypair() -> Arc<IdentityKeypair> {
    Arc::new(IdentityKeypair::generate(&mut rand::thread_rng()))
}

fn relay_cfg(features: u64) -> (Arc<LinkConfig>, IdentityKey) {
    let id = keypair();
    let public = id.public();
    let cfg = LinkConfig {
        identity: Some(id),
        ..client_cfg(features)
    };
    (Arc::new(cfg), public)
}

fn client_cfg(features: u64) -> LinkConfig {
    LinkConfig {
        identity: None,
        features: FeatureSet(features),
        socket_buffer: None,
        unsent_limit: None,
        unsent_rtt_rate: None,
        congestion_control: None,
        record_layer: Default::default(),
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A listener whose accept loop hands every handshake result to the returned channel, running
/// each handshake in its own task (as a relay does).
async fn serve(
    cfg: Arc<LinkConfig>,
) -> (SocketAddr, mpsc::UnboundedReceiver<Result<Link, LinkError>>) {
    let listener = LinkListener::bind(loopback(), cfg).await.unwrap();
    let addr = listener.local_addr();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok(accepting) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(accepting.handshake().await);
            });
        }
    });
    (addr, rx)
}

/// Both ends of a link between a client offering `client_features` and a relay offering
/// `relay_features` (client end first).
async fn pair(relay_features: u64, client_features: u64) -> (Link, Link) {
    let (r_cfg, r_id) = relay_cfg(relay_features);
    let (addr, mut rx) = serve(r_cfg).await;
    let c = connect(addr, Some(r_id), &client_cfg(client_features))
        .await
        .unwrap();
    (c, next(&mut rx).await.unwrap())
}

async fn next(
    rx: &mut mpsc::UnboundedReceiver<Result<Link, LinkError>>,
) -> Result<Link, LinkError> {
    tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .unwrap()
        .unwrap()
}

fn var(command: CellCommand, payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    VarCell {
        circ_id: 0,
        command,
        payload,
    }
    .encode_into(&mut out)
    .unwrap();
    out
}

/// What an initiator sends after TLS: VERSIONS (1), LINK_FEATURES (none) and an AUTHENTICATE
/// carrying `authenticate`.
fn handshake_wire(authenticate: Vec<u8>) -> Vec<u8> {
    let mut wire = var(
        CellCommand::VERSIONS,
        Versions { versions: vec![1] }.encode(),
    );
    wire.extend(var(
        CellCommand::LINK_FEATURES,
        LinkFeatures { features: 0 }.encode(),
    ));
    wire.extend(var(CellCommand::AUTHENTICATE, authenticate));
    wire
}

/// A TLS session to `addr` with no link handshake yet, plus its exporter value.
async fn raw_tls(
    addr: SocketAddr,
) -> (
    tokio_rustls::client::TlsStream<TcpStream>,
    [u8; EXPORTER_LEN],
) {
    let connector = tokio_rustls::TlsConnector::from(tls::client_config().unwrap());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(tls::server_name(addr), tcp)
        .await
        .unwrap();
    let exporter = tls
        .get_ref()
        .1
        .export_keying_material([0u8; EXPORTER_LEN], EXPORTER_LABEL, None)
        .unwrap();
    (tls, exporter)
}

#[tokio::test]
async fn relays_authenticate_each_other() {
    let (a_cfg, a_id) = relay_cfg(0);
    let (b_cfg, b_id) = relay_cfg(0);
    let (addr, mut rx) = serve(a_cfg).await;
    let at_b = connect(addr, Some(a_id), &b_cfg).await.unwrap();
    let at_a = next(&mut rx).await.unwrap();
    assert_eq!(at_b.peer_identity, Some(a_id));
    assert_eq!(at_a.peer_identity, Some(b_id));
    assert_eq!((at_a.version, at_b.version), (1, 1));
    assert_eq!(at_b.peer_addr, addr);
    // Both ends prefer AES-128-GCM (tls.rs, LINK_SUITES).
    let aes128 = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    assert_eq!(at_a.tls_suite(), Some(aes128));
    assert_eq!(at_b.tls_suite(), Some(aes128));
}

#[tokio::test]
async fn bind_tokens_match_per_session_and_differ_across_sessions() {
    let (a_cfg, a_id) = relay_cfg(SPLIT_DIRECTION);
    let (b_cfg, _) = relay_cfg(SPLIT_DIRECTION);
    let (addr, mut rx) = serve(a_cfg).await;
    let first_b = connect(addr, Some(a_id), &b_cfg).await.unwrap();
    let first_a = next(&mut rx).await.unwrap();
    let second_b = connect(addr, Some(a_id), &b_cfg).await.unwrap();
    let second_a = next(&mut rx).await.unwrap();
    // Both ends of one TLS session derive the same token...
    assert_eq!(first_a.bind_token(), first_b.bind_token());
    assert_eq!(second_a.bind_token(), second_b.bind_token());
    // ...and another session (same two relays) a different one.
    assert_ne!(first_a.bind_token(), second_a.bind_token());
    assert_ne!(first_a.bind_token(), [0u8; 32]);
    assert!(first_a.features.contains(SPLIT_DIRECTION));
}

#[tokio::test]
async fn client_is_anonymous_and_wrong_identity_is_rejected() {
    let (r_cfg, r_id) = relay_cfg(0);
    let (addr, mut rx) = serve(r_cfg).await;

    // Without an expected identity the client still learns who it reached.
    let at_client = connect(addr, None, &client_cfg(0)).await.unwrap();
    let at_relay = next(&mut rx).await.unwrap();
    assert_eq!(at_client.peer_identity, Some(r_id));
    assert_eq!(at_relay.peer_identity, None);

    let other = keypair().public();
    match connect(addr, Some(other), &client_cfg(0)).await {
        Err(LinkError::IdentityMismatch { expected, got }) => {
            assert_eq!(expected, other);
            assert_eq!(got, Some(r_id));
        }
        other => panic!("expected IdentityMismatch, got {other:?}"),
    }
}

#[tokio::test]
async fn features_are_intersected() {
    let (r_cfg, r_id) = relay_cfg(0b11);
    let (addr, mut rx) = serve(r_cfg).await;
    let c = connect(addr, Some(r_id), &client_cfg(0b01)).await.unwrap();
    let r = next(&mut rx).await.unwrap();
    assert_eq!(
        (c.features, r.features),
        (FeatureSet(0b01), FeatureSet(0b01))
    );
    assert!(c.features.contains(0b01) && !c.features.contains(0b10));

    // A peer without any features works and gets none.
    let c = connect(addr, Some(r_id), &client_cfg(0)).await.unwrap();
    let r = next(&mut rx).await.unwrap();
    assert_eq!(
        (c.features, r.features),
        (FeatureSet::EMPTY, FeatureSet::EMPTY)
    );
}

fn numbered_cell(i: u32) -> Cell {
    // Distinct, position-dependent bytes in every cell, so loss, duplication, reordering or
    // corruption all show.
    let mut payload = [0u8; PAYLOAD_LEN];
    for (j, b) in payload.iter_mut().enumerate() {
        *b = (i as usize).wrapping_mul(31).wrapping_add(j * 7) as u8;
    }
    Cell {
        circ_id: i,
        command: CellCommand::RELAY,
        payload,
    }
}

async fn send_and_check(mut w: LinkWriter, mut r: LinkReader, n: u32) {
    let writer = tokio::spawn(async move {
        let mut i = 0;
        let mut batch = 1;
        while i < n {
            // Batches of varying size, as the scheduler would produce; every other one comes
            // encoded already, as the driver's batches do (`write_wire`).
            let cells: Vec<Cell> = (i..(i + batch).min(n)).map(numbered_cell).collect();
            if batch % 2 == 0 {
                let mut wire = Vec::new();
                cells.iter().for_each(|c| c.encode_into(&mut wire));
                w.write_wire(&wire).await.unwrap();
            } else {
                w.write_cells(&cells).await.unwrap();
            }
            i += cells.len() as u32;
            batch = batch % 97 + 1;
        }
        w
    });
    for i in 0..n {
        match r.read_cell().await.unwrap() {
            Some(AnyCell::Fixed(c)) => {
                let want = numbered_cell(i);
                assert_eq!(c.circ_id, want.circ_id);
                assert_eq!(c.command, want.command);
                assert_eq!(c.payload, want.payload, "cell {i}");
            }
            other => panic!("cell {i}: got {other:?}"),
        }
    }
    let mut w = writer.await.unwrap();
    w.shutdown().await.unwrap();
}

/// [`send_and_check`] `n` cells each way over `c` and `r` at once.
async fn both_ways(c: Link, r: Link, n: u32) {
    let (c_r, c_w) = c.split(LinkLimits::default());
    let (r_r, r_w) = r.split(LinkLimits::default());
    let one = tokio::spawn(send_and_check(c_w, r_r, n));
    let two = tokio::spawn(send_and_check(r_w, c_r, n));
    one.await.unwrap();
    two.await.unwrap();
}

#[tokio::test]
async fn ten_thousand_cells_each_way() {
    let (c, r) = pair(0, 0).await;
    both_ways(c, r, 10_000).await;
}

#[tokio::test]
async fn read_cell_batch_cuts_whole_cells_in_order_up_to_max_then_eof() {
    let (c, r) = pair(0, 0).await;
    let (_c_r, mut c_w) = c.split(LinkLimits::default());
    let (mut r_r, _r_w) = r.split(LinkLimits::default());
    let n = 3000u32;
    let vpad = VarCell {
        circ_id: 0,
        command: CellCommand::VPADDING,
        payload: vec![5; 777],
    };
    let sent_var = vpad.clone();
    let writer = tokio::spawn(async move {
        for start in (0..n).step_by(500) {
            let cells: Vec<Cell> = (start..start + 500).map(numbered_cell).collect();
            c_w.write_cells(&cells).await.unwrap();
            c_w.write_var_cell(&sent_var).await.unwrap();
        }
        c_w.shutdown().await.unwrap();
    });
    // With a pool, as the node's reader uses it: batches of many cells are handed over.
    let pool = BatchPool::new(2);
    let (mut wire, mut cells, mut calls) = (Vec::new(), 0, 0);
    while let Some((batch, k)) = r_r.read_cell_batch(50, Some(&pool)).await.unwrap() {
        assert!((1..=50).contains(&k), "batch of {k}, max 50");
        // Whole cells only: the batch decodes to exactly k cells.
        let mut rest = &batch[..];
        for _ in 0..k {
            let (_, used) = chive_cell::decode_cell(rest).unwrap().unwrap();
            rest = &rest[used..];
        }
        assert!(rest.is_empty(), "{} bytes of a partial cell", rest.len());
        wire.extend_from_slice(&batch);
        cells += k;
        calls += 1;
    }
    writer.await.unwrap();
    assert_eq!(cells, n as usize + 6);
    assert!(calls >= cells / 50, "{calls} calls");
    let mut rest = &wire[..];
    let mut fixed = 0u32;
    while let Some((cell, used)) = chive_cell::decode_cell(rest).unwrap() {
        match cell {
            AnyCell::Fixed(c) => {
                assert_eq!(c.payload, numbered_cell(fixed).payload, "cell {fixed}");
                fixed += 1;
            }
            AnyCell::Var(v) => {
                assert_eq!(v, vpad);
                assert_eq!(fixed % 500, 0, "var cell in order");
            }
        }
        rest = &rest[used..];
    }
    assert_eq!((fixed, rest.len()), (n, 0));
    // `max` 0 is an empty batch, not a read or an EOF.
    let (empty, none) = r_r.read_cell_batch(0, None).await.unwrap().unwrap();
    assert_eq!((empty.len(), none), (0, 0));
}

#[tokio::test]
async fn clean_shutdown_gives_eof() {
    let (c, r) = pair(0, 0).await;
    let (_c_r, mut c_w) = c.split(LinkLimits::default());
    let (mut r_r, _r_w) = r.split(LinkLimits::default());
    let vpad = VarCell {
        circ_id: 0,
        command: CellCommand::VPADDING,
        payload: vec![9; 1000],
    };
    c_w.write_var_cell(&vpad).await.unwrap();
    c_w.shutdown().await.unwrap();
    match r_r.read_cell().await.unwrap() {
        Some(AnyCell::Var(v)) => assert_eq!(v, vpad),
        other => panic!("got {other:?}"),
    }
    assert!(r_r.read_cell().await.unwrap().is_none());
}

/// A hand-made initiator to `addr` puts its handshake and three cells in one write; the
/// responder's link (from `rx`), after `check`, must read those three cells first.
async fn cells_with_handshake_are_kept(
    addr: SocketAddr,
    rx: &mut mpsc::UnboundedReceiver<Result<Link, LinkError>>,
    check: impl FnOnce(&Link),
) {
    let (mut tls, exporter) = raw_tls(addr).await;
    let mut wire = handshake::our_cells(Role::Initiator, &client_cfg(0), &exporter).unwrap();
    for i in 1..=3 {
        numbered_cell(i).encode_into(&mut wire);
    }
    tls.write_all(&wire).await.unwrap();
    tls.flush().await.unwrap();
    let link = next(rx).await.unwrap();
    check(&link);
    let (mut r, _w) = link.split(LinkLimits::default());
    for i in 1..=3 {
        match r.read_cell().await.unwrap() {
            Some(AnyCell::Fixed(c)) => assert_eq!(c.payload, numbered_cell(i).payload),
            other => panic!("got {other:?}"),
        }
    }
}

#[tokio::test]
async fn cells_right_after_handshake_are_kept() {
    // The responder's handshake reads them all in one go and must hand the extra cells to the
    // reader.
    let (r_cfg, _) = relay_cfg(0);
    let (addr, mut rx) = serve(r_cfg).await;
    cells_with_handshake_are_kept(addr, &mut rx, |link| assert_eq!(link.peer_identity, None)).await;
}

/// Hand-made initiators that misbehave; each must fail on the relay with the expected error.
#[tokio::test]
async fn bad_peers_fail_and_listener_keeps_accepting() {
    let (r_cfg, r_id) = relay_cfg(0);
    let (addr, mut rx) = serve(r_cfg).await;

    // 1. Not TLS at all.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::Tls(_)), "{err}");
    drop(tcp);

    // 2. Closes in the middle of the TLS handshake (a ClientHello record header, then nothing).
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    drop(tcp);
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::Tls(_) | LinkError::Io(_)), "{err}");

    // 3. Closes in the middle of the link handshake (after VERSIONS).
    let (mut tls, _) = raw_tls(addr).await;
    tls.write_all(&var(
        CellCommand::VERSIONS,
        Versions { versions: vec![1] }.encode(),
    ))
    .await
    .unwrap();
    tls.shutdown().await.unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::Protocol(_)), "{err}");

    // 4. No common version.
    let (mut tls, _) = raw_tls(addr).await;
    tls.write_all(&var(
        CellCommand::VERSIONS,
        Versions {
            versions: vec![2, 3],
        }
        .encode(),
    ))
    .await
    .unwrap();
    tls.flush().await.unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::NoCommonVersion), "{err}");
    drop(tls);

    // 5. Too many versions.
    let (mut tls, _) = raw_tls(addr).await;
    let many = Versions {
        versions: (1..=17).collect(),
    };
    tls.write_all(&var(CellCommand::VERSIONS, many.encode()))
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::Protocol(_)), "{err}");
    drop(tls);

    // 6. A fixed cell where VERSIONS belongs.
    let (mut tls, _) = raw_tls(addr).await;
    let mut wire = Vec::new();
    numbered_cell(5).encode_into(&mut wire);
    tls.write_all(&wire).await.unwrap();
    tls.flush().await.unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert!(matches!(err, LinkError::Protocol(_)), "{err}");
    drop(tls);

    // 7. Bad AUTHENTICATE: a valid signature, but made with the responder's role byte (a
    //    reflection attempt), then a signature that is plain garbage, then a truncated body.
    let id = keypair();
    let sig_wrong_role =
        |exporter: &[u8; EXPORTER_LEN]| id.sign(&auth_message(Role::Responder, exporter)).0;
    for case in 0..3 {
        let (mut tls, exporter) = raw_tls(addr).await;
        let payload = match case {
            0 => Authenticate {
                identity: *id.public().as_bytes(),
                signature: sig_wrong_role(&exporter),
            }
            .encode(),
            1 => Authenticate {
                identity: *id.public().as_bytes(),
                signature: [0x55; 64],
            }
            .encode(),
            _ => vec![1; 50],
        };
        let wire = handshake_wire(payload);
        tls.write_all(&wire).await.unwrap();
        tls.flush().await.unwrap();
        let err = next(&mut rx).await.unwrap_err();
        assert!(
            matches!(err, LinkError::BadAuthentication),
            "case {case}: {err}"
        );
    }

    // 8. The same message correctly signed (initiator role) is accepted: the cases above failed
    //    for the reason tested, and the listener still serves honest peers.
    let (mut tls, exporter) = raw_tls(addr).await;
    let sig = id.sign(&auth_message(Role::Initiator, &exporter)).0;
    let wire = handshake_wire(
        Authenticate {
            identity: *id.public().as_bytes(),
            signature: sig,
        }
        .encode(),
    );
    tls.write_all(&wire).await.unwrap();
    tls.flush().await.unwrap();
    assert_eq!(
        next(&mut rx).await.unwrap().peer_identity,
        Some(id.public())
    );

    let c = connect(addr, Some(r_id), &client_cfg(0)).await.unwrap();
    assert_eq!(c.peer_identity, Some(r_id));
    assert!(next(&mut rx).await.is_ok());
}

/// A hand-made responder sending `auth` as its AUTHENTICATE payload (given the exporter).
async fn fake_responder(
    auth: impl FnOnce(&[u8; EXPORTER_LEN]) -> Vec<u8> + Send + 'static,
) -> SocketAddr {
    let tcp = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls::server_config().unwrap());
    tokio::spawn(async move {
        let (sock, _) = tcp.accept().await.unwrap();
        let mut tls = acceptor.accept(sock).await.unwrap();
        let exporter = tls
            .get_ref()
            .1
            .export_keying_material([0u8; EXPORTER_LEN], EXPORTER_LABEL, None)
            .unwrap();
        let wire = handshake_wire(auth(&exporter));
        let _ = tls.write_all(&wire).await;
        let _ = tls.flush().await;
        // Keep the connection open until the initiator gives up.
        let mut sink = [0u8; 1024];
        while let Ok(n) = tls.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    addr
}

/// A responder that authenticates as `id`, signing with `role`'s role byte.
async fn responder_signing_as(id: &Arc<IdentityKeypair>, role: Role) -> SocketAddr {
    let id = id.clone();
    fake_responder(move |exp| {
        Authenticate {
            identity: *id.public().as_bytes(),
            signature: id.sign(&auth_message(role, exp)).0,
        }
        .encode()
    })
    .await
}

#[tokio::test]
async fn initiator_rejects_bad_responders() {
    // Signed with the initiator's role byte: a reflected initiator signature must not pass.
    let id = keypair();
    let addr = responder_signing_as(&id, Role::Initiator).await;
    let err = connect(addr, None, &client_cfg(0)).await.unwrap_err();
    assert!(matches!(err, LinkError::BadAuthentication), "{err}");

    // A responder that does not authenticate at all.
    let addr = fake_responder(|_| Vec::new()).await;
    let err = connect(addr, None, &client_cfg(0)).await.unwrap_err();
    assert!(matches!(err, LinkError::BadAuthentication), "{err}");
    let addr = fake_responder(|_| Vec::new()).await;
    let err = connect(addr, Some(id.public()), &client_cfg(0))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LinkError::IdentityMismatch { got: None, .. }),
        "{err}"
    );

    // Control: the correct role byte is accepted.
    let addr = responder_signing_as(&id, Role::Responder).await;
    let link = connect(addr, Some(id.public()), &client_cfg(0))
        .await
        .unwrap();
    assert_eq!(link.peer_identity, Some(id.public()));
}

#[tokio::test]
async fn listener_requires_identity() {
    let err = LinkListener::bind(loopback(), Arc::new(client_cfg(0)))
        .await
        .unwrap_err();
    assert!(matches!(err, LinkError::Config(_)), "{err}");
}

/// A peer that connects and sends nothing is dropped when the handshake's time is up
/// (`handshake()` allows [`HANDSHAKE_TIMEOUT`]; a shorter limit keeps the test in real time).
#[tokio::test]
async fn silent_peer_times_out() {
    let (r_cfg, _) = relay_cfg(0);
    let listener = LinkListener::bind(loopback(), r_cfg).await.unwrap();
    let _tcp = TcpStream::connect(listener.local_addr()).await.unwrap();
    let accepting = listener.accept().await.unwrap();
    let limit = Duration::from_millis(200);
    let start = tokio::time::Instant::now();
    let err = accepting.handshake_within(limit).await.unwrap_err();
    assert!(matches!(err, LinkError::Timeout), "{err}");
    assert!(start.elapsed() >= limit);
}

#[tokio::test]
async fn write_bucket_paces_a_link() {
    let (c, r) = pair(0, 0).await;
    // 200 cells ≈ 103 kB through a 200 kB/s bucket with a 20 kB burst: at least ~0.4 s.
    let bucket = Arc::new(TokenBucket::new(200_000, 20_000));
    let (_c_r, mut c_w) = c.split(LinkLimits {
        read_bucket: None,
        write_bucket: Some(bucket),
    });
    let (mut r_r, _r_w) = r.split(LinkLimits::default());
    let start = std::time::Instant::now();
    let cells: Vec<Cell> = (0..200).map(numbered_cell).collect();
    c_w.write_cells(&cells).await.unwrap();
    for i in 0..200 {
        assert!(
            matches!(r_r.read_cell().await.unwrap(), Some(AnyCell::Fixed(c)) if c.circ_id == i)
        );
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(380), "{took:?}");
    assert!(took <= Duration::from_millis(1500), "{took:?}");
}

/// Constrained link sockets use segments that fit the window several times over, on both
/// ends of the connection (the connecting socket's option and the listener's, inherited by
/// the accepted socket and advertised in its SYN-ACK). Loopback's own MSS (65483) with a
/// 10 kB buffer left relay links waiting on zero-window probes for seconds.
#[tokio::test]
async fn constrained_sockets_use_segments_the_window_can_hold() {
    assert_eq!(crate::link::constrained_mss(10_000), 1250);
    assert_eq!(crate::link::constrained_mss(2048), 536);
    assert_eq!(crate::link::constrained_mss(262_144), 1460);
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listener = crate::link::new_socket(loopback, Some(10_000)).unwrap();
    listener.bind(loopback).unwrap();
    let listener = listener.listen(8).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = crate::link::new_socket(addr, Some(10_000))
        .unwrap()
        .connect(addr)
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    for (end, sock) in [("connecting", &client), ("accepted", &server)] {
        let mss = socket2::SockRef::from(sock).tcp_mss().unwrap();
        assert!(mss <= 1250, "{end} socket's MSS is {mss}");
    }
    // A peer that sets nothing still gets the listener's segment size (from the SYN-ACK).
    let plain = TcpStream::connect(addr).await.unwrap();
    let mss = socket2::SockRef::from(&plain).tcp_mss().unwrap();
    assert!(mss <= 1250, "peer of a constrained listener: MSS {mss}");
    // Unconstrained sockets keep the kernel's choice (loopback: far above Ethernet's).
    let open = tokio::net::TcpListener::bind(loopback).await.unwrap();
    let plain = TcpStream::connect(open.local_addr().unwrap())
        .await
        .unwrap();
    let mss = socket2::SockRef::from(&plain).tcp_mss().unwrap();
    assert!(mss > 1460, "unconstrained loopback MSS {mss}");
}

/// With an unsent limit a link socket stops taking writes once that much waits unsent (here:
/// the peer reads nothing, so nothing beyond its small receive window can leave), even with a
/// large send buffer; without one, the kernel takes up to the whole send buffer. Both ends of
/// a link get the option.
#[tokio::test]
async fn unsent_limit_keeps_the_backlog_out_of_the_kernel() {
    async fn accepted_before_blocking(limit: Option<u32>) -> usize {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let listener = crate::link::new_socket(loopback, Some(8192)).unwrap();
        listener.bind(loopback).unwrap();
        let listener = listener.listen(8).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = crate::link::new_socket(addr, Some(1 << 20))
            .unwrap()
            .connect(addr)
            .await
            .unwrap();
        let (_silent_peer, _) = listener.accept().await.unwrap();
        crate::link::limit_unsent(&client, limit).unwrap();
        if let Some(bytes) = limit {
            let set = socket2::SockRef::from(&client).tcp_notsent_lowat().unwrap();
            assert_eq!(set, bytes);
        }
        let chunk = vec![0u8; 4096];
        let mut accepted = 0;
        // Whatever the kernel takes without blocking, waiting briefly for writability so
        // in-flight data can reach the peer's window first.
        while let Ok(Ok(())) =
            tokio::time::timeout(Duration::from_millis(200), client.writable()).await
        {
            match client.try_write(&chunk) {
                Ok(n) => accepted += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("write failed: {e}"),
            }
        }
        accepted
    }
    let limited = accepted_before_blocking(Some(4096)).await;
    let unlimited = accepted_before_blocking(None).await;
    assert!(limited < 128 * 1024, "limited socket took {limited} bytes");
    assert!(
        unlimited > 4 * limited,
        "unlimited {unlimited} vs limited {limited}"
    );
}

/// A link socket takes the configured congestion control (both the unsent limit and the
/// algorithm come from one helper used on connected and accepted sockets alike); an
/// algorithm the kernel lacks is a configuration error naming it.
#[tokio::test]
async fn link_sockets_take_the_configured_congestion_control() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let in_use = |sock: &TcpStream| {
        let name = socket2::SockRef::from(sock).tcp_congestion().unwrap();
        String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
    };
    // Something other than the system default, so the test shows the option took effect.
    let wanted = if in_use(&client) == "reno" {
        "cubic"
    } else {
        "reno"
    };
    let mut cfg = client_cfg(0);
    cfg.congestion_control = Some(wanted.into());
    cfg.unsent_limit = Some(8192);
    for sock in [&client, &server] {
        crate::link::tune_link_socket(sock, &cfg).unwrap();
        assert_eq!(in_use(sock), wanted);
        let r = socket2::SockRef::from(sock);
        assert_eq!(r.tcp_notsent_lowat().unwrap(), 8192);
    }
    // Under a rate the limit grows with the connection's round trip (here a probe that
    // says 30 µs: 8192 + 2 × 10 GB/s × 30 µs).
    cfg.unsent_rtt_rate = Some(crate::UnsentPerRtt {
        rate: 10_000_000_000,
        max: 1 << 20,
        probe: |_| Some(std::time::Duration::from_micros(30)),
    });
    for sock in [&client, &server] {
        crate::link::tune_link_socket(sock, &cfg).unwrap();
        let set = socket2::SockRef::from(sock).tcp_notsent_lowat().unwrap();
        assert_eq!(set, 8192 + 600_000);
    }
    crate::check_congestion_control("reno").unwrap();
    let err = crate::check_congestion_control("no-such-cc").unwrap_err();
    assert!(err.to_string().contains("no-such-cc"), "{err}");
}

#[test]
fn the_rate_scaled_unsent_limit_adds_two_round_trips_of_the_rate() {
    use crate::rtt_scaled_unsent as scaled;
    use std::time::Duration;
    const MAX: u32 = 65_536;
    // Loopback-like round trips add next to nothing; 60 ms at 500 kB/s adds 60 kB.
    assert_eq!(scaled(5000, 500_000, MAX, None), 5000);
    assert_eq!(
        scaled(5000, 500_000, MAX, Some(Duration::from_micros(50))),
        5050
    );
    assert_eq!(
        scaled(5000, 500_000, MAX, Some(Duration::from_millis(60))),
        65_000
    );
    // Never past the maximum (a rate gets no more unsent bytes than no rate), whatever the
    // rate or round trip; never below the base.
    assert_eq!(
        scaled(5000, 500_000, MAX, Some(Duration::from_millis(61))),
        MAX
    );
    assert_eq!(
        scaled(5000, u64::MAX, MAX, Some(Duration::from_secs(10))),
        MAX
    );
    assert_eq!(
        scaled(100_000, 1, MAX, Some(Duration::from_secs(1))),
        100_000
    );
}

#[path = "record_link_tests.rs"]
mod record_link;
