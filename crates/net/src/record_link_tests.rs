//! Links on the own record layer (`RecordLayer::Own`): against each other and against rustls
//! links (the wire is TLS 1.3 either way), the peer's first cells right after the handshake,
//! clean shutdown, and a tampered record closing only its own link.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::test_proxy::{tampering_proxy, Towards};

fn with_layer(cfg: &LinkConfig, layer: RecordLayer) -> LinkConfig {
    LinkConfig {
        identity: cfg.identity.clone(),
        features: cfg.features,
        socket_buffer: cfg.socket_buffer,
        unsent_limit: cfg.unsent_limit,
        unsent_rtt_rate: cfg.unsent_rtt_rate,
        congestion_control: cfg.congestion_control.clone(),
        record_layer: layer,
    }
}

/// A relay on `relay` records and its listener's results.
async fn relay_on(
    relay: RecordLayer,
) -> (
    SocketAddr,
    IdentityKey,
    mpsc::UnboundedReceiver<Result<Link, LinkError>>,
) {
    let (r_cfg, r_id) = relay_cfg(0);
    let (addr, rx) = serve(Arc::new(with_layer(&r_cfg, relay))).await;
    (addr, r_id, rx)
}

async fn pair_on(relay: RecordLayer, client: RecordLayer) -> (Link, Link) {
    let (addr, r_id, mut rx) = relay_on(relay).await;
    let c = connect(addr, Some(r_id), &with_layer(&client_cfg(0), client))
        .await
        .unwrap();
    (c, next(&mut rx).await.unwrap())
}

#[tokio::test]
async fn own_record_layer_links_carry_cells_both_ways_with_either_peer() {
    use RecordLayer::{Own, Rustls};
    for (relay, client) in [(Own, Own), (Own, Rustls), (Rustls, Own)] {
        // The link handshake itself checks the exporters agree (AUTHENTICATE signs it).
        let (c, r) = pair_on(relay, client).await;
        assert_eq!(
            (c.own_records(), r.own_records()),
            (client == Own, relay == Own)
        );
        assert_eq!(c.bind_token(), r.bind_token());
        assert_eq!(
            c.tls_suite(),
            Some(rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256)
        );
        both_ways(c, r, 5000).await;
    }
}

#[tokio::test]
async fn own_record_layer_clean_shutdown_gives_eof() {
    let (c, r) = pair_on(RecordLayer::Own, RecordLayer::Own).await;
    let (_c_r, mut c_w) = c.split(LinkLimits::default());
    let (mut r_r, _r_w) = r.split(LinkLimits::default());
    c_w.write_cells(&[numbered_cell(1)]).await.unwrap();
    c_w.shutdown().await.unwrap();
    assert!(matches!(
        r_r.read_cell().await.unwrap(),
        Some(AnyCell::Fixed(_))
    ));
    assert!(r_r.read_cell().await.unwrap().is_none());
}

#[tokio::test]
async fn own_record_layer_keeps_cells_sent_with_the_handshake() {
    // As `cells_right_after_handshake_are_kept`, with the relay on its own records: the
    // initiator's first records may arrive in the read that brings its TLS Finished.
    let (addr, _, mut rx) = relay_on(RecordLayer::Own).await;
    cells_with_handshake_are_kept(addr, &mut rx, |link| assert!(link.own_records())).await;
}

#[tokio::test]
async fn a_tampered_record_closes_its_link_only() {
    let (addr, r_id, mut rx) = relay_on(RecordLayer::Own).await;
    let client = with_layer(&client_cfg(0), RecordLayer::Rustls);
    // A healthy link to the same relay.
    let good_c = connect(addr, Some(r_id), &client).await.unwrap();
    let good_r = next(&mut rx).await.unwrap();
    // A link through a proxy that flips a bit once asked to.
    let flip = Arc::new(AtomicBool::new(false));
    let proxy = tampering_proxy(addr, flip.clone(), Towards::Server, 40, 0x04).await;
    let bad_c = connect(proxy, Some(r_id), &client).await.unwrap();
    let bad_r = next(&mut rx).await.unwrap();
    let (_bc_r, mut bc_w) = bad_c.split(LinkLimits::default());
    let (mut br_r, _br_w) = bad_r.split(LinkLimits::default());
    flip.store(true, Ordering::SeqCst);
    let cells: Vec<Cell> = (0..20).map(numbered_cell).collect();
    bc_w.write_cells(&cells).await.unwrap();
    let err = loop {
        match br_r.read_cell().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("EOF instead of an error"),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("failed authentication"), "{err}");
    // The other link is unaffected.
    let (gc_r, gc_w) = good_c.split(LinkLimits::default());
    let (gr_r, gr_w) = good_r.split(LinkLimits::default());
    let one = tokio::spawn(send_and_check(gc_w, gr_r, 2000));
    let two = tokio::spawn(send_and_check(gr_w, gc_r, 2000));
    one.await.unwrap();
    two.await.unwrap();
}

/// Cells `from..to` encoded with room for their records ([`LinkWriter::write_framed`]).
fn framed_cells(from: u32, to: u32) -> Vec<u8> {
    let cells: Vec<Cell> = (from..to).map(numbered_cell).collect();
    let mut framed = Vec::new();
    for record in cells.chunks(crate::CELLS_PER_RECORD) {
        framed.resize(framed.len() + crate::RECORD_HEAD, 0);
        record.iter().for_each(|c| c.encode_into(&mut framed));
        framed.resize(framed.len() + crate::RECORD_TAIL, 0);
    }
    assert_eq!(framed.len(), crate::framed_len((to - from) as usize));
    framed
}

/// A [`DirectWriter`]'s batches seal exactly what the writer's would (the peer's reader opens
/// the same cells) and stay in order with the writer's writes: after a keepalive-like write
/// and a KeyUpdate that wait in the send buffer, and across a batch the socket takes only
/// part of, whose sealed rest the writer finishes without sealing it again. A rustls link
/// gives no direct handle.
#[tokio::test]
async fn direct_batches_are_sealed_as_the_writers_in_order_with_them() {
    let (c, _r) = pair_on(RecordLayer::Own, RecordLayer::Rustls).await;
    assert!(c.split(LinkLimits::default()).1.direct().is_none());
    let (c, r) = pair_on(RecordLayer::Own, RecordLayer::Own).await;
    let (_c_r, mut w) = c.split(LinkLimits::default());
    let (mut rd, _r_w) = r.split(LinkLimits::default());
    let direct = w.direct().expect("an own-records link");
    // Larger than both sockets' buffers on loopback: the socket takes only part of it.
    let big = 20_000;
    let total = 1 + 40 + 100 + big + 7 + 31;
    let reader = tokio::spawn(async move {
        for i in 0..total {
            match rd.read_cell().await.unwrap() {
                Some(AnyCell::Fixed(c)) => {
                    let want = numbered_cell(i);
                    assert_eq!((c.circ_id, c.payload), (want.circ_id, want.payload));
                }
                other => panic!("cell {i}: got {other:?}"),
            }
        }
        rd
    });
    // A writer's write, then a direct batch behind it.
    w.write_cells(&[numbered_cell(0)]).await.unwrap();
    let mut next = 1;
    let mut batch = |n: u32| {
        let b = (framed_cells(next, next + n), n as usize);
        next += n;
        b
    };
    let (mut b, n) = batch(40);
    let mut progress = FramedProgress::default();
    assert!(direct.try_write_framed(&mut b, n, &mut progress).unwrap());
    // A KeyUpdate waits in the send buffer: it leaves first, the batch under the new key.
    w.force_key_update();
    let (mut b, n) = batch(100);
    let mut progress = FramedProgress::default();
    assert!(direct.try_write_framed(&mut b, n, &mut progress).unwrap());
    // Part of a large batch: sealed, the rest to the writer.
    let (mut b, n) = batch(big);
    let mut progress = FramedProgress::default();
    assert!(!direct.try_write_framed(&mut b, n, &mut progress).unwrap());
    assert!(progress.sealed(), "the batch must stop part-way, sealed");
    // Nothing overtakes it: the writer finishes it before its own next batch.
    w.write_framed_from(&mut b, n, false, progress)
        .await
        .unwrap();
    let (mut b, n) = batch(7);
    w.write_framed(&mut b, n, false).await.unwrap();
    // And the direct path again behind that.
    let (mut b, n) = batch(31);
    let mut progress = FramedProgress::default();
    let done = direct.try_write_framed(&mut b, n, &mut progress).unwrap();
    if !done {
        w.write_framed_from(&mut b, n, false, progress)
            .await
            .unwrap();
    }
    assert_eq!(next, total);
    reader.await.unwrap();
    // A batch of the wrong size is refused before anything is sealed.
    let mut progress = FramedProgress::default();
    let mut short = vec![0u8; 100];
    assert!(direct
        .try_write_framed(&mut short, 1, &mut progress)
        .is_err());
    assert!(!progress.sealed());
}
