//! The own record layer against rustls itself: our sealer → a rustls connection reads it,
//! rustls writes → our opener reads it, with key updates both ways, tampering, truncation and
//! close_notify. The handshake runs in memory between a rustls unbuffered connection (ours,
//! turned into secrets + `KernelConnection` as a link would) and a buffered one (the peer).

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::client::UnbufferedClientConnection;
use rustls::kernel::KernelConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::{ClientConnection, Connection, ExtractedSecrets, ServerConnection};

use super::*;
use crate::tls;

/// Our end after the handshake: the extracted secrets and the key schedule.
enum Kernel {
    Client(KernelConnection<rustls::client::ClientConnectionData>),
    Server(KernelConnection<rustls::server::ServerConnectionData>),
}

impl Kernel {
    fn update_tx(&mut self) -> (u64, ConnectionTrafficSecrets) {
        match self {
            Kernel::Client(k) => k.update_tx_secret().unwrap(),
            Kernel::Server(k) => k.update_tx_secret().unwrap(),
        }
    }
    fn update_rx(&mut self) -> (u64, ConnectionTrafficSecrets) {
        match self {
            Kernel::Client(k) => k.update_rx_secret().unwrap(),
            Kernel::Server(k) => k.update_rx_secret().unwrap(),
        }
    }
}

/// Feed `wire` to the buffered peer and process it.
fn peer_receive(peer: &mut Connection, wire: &[u8]) -> Result<rustls::IoState, rustls::Error> {
    let mut rd = wire;
    let mut state = None;
    while !rd.is_empty() {
        peer.read_tls(&mut rd).unwrap();
        state = Some(peer.process_new_packets()?);
    }
    match state {
        Some(s) => Ok(s),
        None => peer.process_new_packets(),
    }
}

/// Feed `wire` to the peer one record at a time, reading its plaintext after each (rustls
/// bounds the plaintext it holds unread).
fn deliver(peer: &mut Connection, wire: &[u8], got: &mut Vec<u8>) {
    let mut rest = wire;
    while !rest.is_empty() {
        let len = record_len(rest).unwrap().unwrap();
        peer_receive(peer, &rest[..len]).unwrap();
        got.extend(peer_read(peer));
        rest = &rest[len..];
    }
}

/// Everything the peer has to send.
fn peer_send(peer: &mut Connection) -> Vec<u8> {
    let mut wire = Vec::new();
    while peer.wants_write() {
        peer.write_tls(&mut wire).unwrap();
    }
    wire
}

/// Drive an unbuffered connection (`$ours`) through the handshake against `$peer`; returns
/// the bytes the peer sent past the handshake (none in these tests).
macro_rules! drive {
    ($ours:expr, $peer:expr) => {
        'hs: {
            let ours = &mut $ours;
            let peer: &mut Connection = $peer;
            let mut incoming: Vec<u8> = Vec::new();
            let mut outgoing = vec![0u8; 64 * 1024];
            let mut out_len = 0;
            for _ in 0..100 {
                incoming.extend(peer_send(peer));
                let status = ours.process_tls_records(&mut incoming);
                let discard = status.discard;
                let mut done = false;
                match status.state.unwrap() {
                    ConnectionState::EncodeTlsData(mut st) => {
                        out_len += st.encode(&mut outgoing[out_len..]).unwrap();
                    }
                    ConnectionState::TransmitTlsData(st) => {
                        peer_receive(peer, &outgoing[..out_len]).unwrap();
                        out_len = 0;
                        st.done();
                    }
                    ConnectionState::BlockedHandshake => {}
                    ConnectionState::WriteTraffic(_) => done = true,
                    _ => panic!("unexpected state during the handshake"),
                }
                incoming.drain(..discard);
                if done {
                    assert!(!peer.is_handshaking());
                    break 'hs incoming;
                }
            }
            panic!("handshake did not finish");
        }
    };
}

/// Configs as a link uses them, with secret extraction allowed.
fn configs() -> (Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>) {
    let mut c = (*tls::client_config().unwrap()).clone();
    c.enable_secret_extraction = true;
    let mut s = (*tls::server_config().unwrap()).clone();
    s.enable_secret_extraction = true;
    (Arc::new(c), Arc::new(s))
}

/// A finished handshake: our sealer/opener and key schedule, the rustls peer.
struct Pair {
    sealer: RecordSealer,
    opener: RecordOpener,
    kernel: Kernel,
    peer: Connection,
}

fn pair(we_are_client: bool) -> Pair {
    let (cc, sc) = configs();
    let name = tls::server_name("127.0.0.1:1".parse().unwrap());
    let (secrets, kernel, mut peer): (ExtractedSecrets, Kernel, Connection);
    if we_are_client {
        let mut ours = UnbufferedClientConnection::new(cc, name).unwrap();
        let mut p = Connection::Server(ServerConnection::new(sc).unwrap());
        let rest: Vec<u8> = drive!(ours, &mut p);
        assert!(rest.is_empty());
        let (s, k) = ours.dangerous_into_kernel_connection().unwrap();
        (secrets, kernel, peer) = (s, Kernel::Client(k), p);
    } else {
        let mut ours = UnbufferedServerConnection::new(sc).unwrap();
        let mut p = Connection::Client(ClientConnection::new(cc, name).unwrap());
        let rest: Vec<u8> = drive!(ours, &mut p);
        assert!(rest.is_empty());
        let (s, k) = ours.dangerous_into_kernel_connection().unwrap();
        (secrets, kernel, peer) = (s, Kernel::Server(k), p);
    }
    assert!(matches!(
        secrets.tx.1,
        ConnectionTrafficSecrets::Aes128Gcm { .. }
    ));
    let sealer = RecordSealer::new(secrets.tx.0, &secrets.tx.1).unwrap();
    let opener = RecordOpener::new(secrets.rx.0, &secrets.rx.1).unwrap();
    // Nothing the peer still has to say about the handshake.
    peer.process_new_packets().unwrap();
    assert!(!peer.wants_write());
    Pair {
        sealer,
        opener,
        kernel,
        peer,
    }
}

/// Deterministic test data.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Everything the peer can read now.
fn peer_read(peer: &mut Connection) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match peer.reader().read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("peer read: {e}"),
        }
    }
    got
}

/// Open every whole record in `wire` (dropping them), collecting application data; stops at a
/// non-data event and returns it with the bytes left.
fn open_all(
    opener: &mut RecordOpener,
    wire: &mut Vec<u8>,
    got: &mut Vec<u8>,
) -> Result<Option<Opened>, RecordError> {
    loop {
        match opener.open(wire)? {
            None => return Ok(None),
            Some((len, Opened::Data(range))) => {
                got.extend_from_slice(&wire[range]);
                wire.drain(..len);
            }
            Some((len, other)) => {
                wire.drain(..len);
                return Ok(Some(other));
            }
        }
    }
}

#[test]
fn our_sealer_to_rustls_many_records_both_roles() {
    for we_are_client in [true, false] {
        let mut p = pair(we_are_client);
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut wire = Vec::new();
        // Sizes around the record limit and tiny ones: 800 records in all.
        for i in 0..200usize {
            for len in [1 + i % 7, MAX_PLAINTEXT, MAX_PLAINTEXT + 1 + i] {
                let chunk = data(len, i as u8);
                p.sealer.seal_app_data(&chunk, &mut wire).unwrap();
                sent.extend_from_slice(&chunk);
            }
            deliver(&mut p.peer, &wire, &mut got);
            wire.clear();
        }
        assert_eq!(p.sealer.seq(), 800);
        assert_eq!(got, sent);
    }
}

#[test]
fn rustls_to_our_opener_many_records_both_roles() {
    for we_are_client in [true, false] {
        let mut p = pair(we_are_client);
        let sent = data(3_000_000, 7);
        let mut wire = Vec::new();
        let mut got = Vec::new();
        for chunk in sent.chunks(50_000) {
            p.peer.writer().write_all(chunk).unwrap();
            wire.extend(peer_send(&mut p.peer));
            // Feed in odd-sized pieces so records arrive split.
            assert_eq!(open_all(&mut p.opener, &mut wire, &mut got).unwrap(), None);
        }
        assert!(wire.is_empty());
        assert_eq!(got, sent);
        assert!(p.opener.seq() >= 3_000_000 / MAX_PLAINTEXT as u64);
    }
}

#[test]
fn records_arriving_byte_by_byte_open_once_whole() {
    let mut p = pair(true);
    p.peer.writer().write_all(&data(40_000, 1)).unwrap();
    let all = peer_send(&mut p.peer);
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for &b in &all {
        buf.push(b);
        open_all(&mut p.opener, &mut buf, &mut got).unwrap();
    }
    assert!(buf.is_empty());
    assert_eq!(got, data(40_000, 1));
}

#[test]
fn rustls_key_update_mid_stream_is_followed_and_answered() {
    for we_are_client in [true, false] {
        let mut p = pair(we_are_client);
        let mut got = Vec::new();
        let mut wire = Vec::new();
        for round in 0..3u8 {
            p.peer.writer().write_all(&data(20_000, round)).unwrap();
            // rustls sends KeyUpdate(update_requested) and switches its sending key.
            p.peer.refresh_traffic_keys().unwrap();
            p.peer
                .writer()
                .write_all(&data(30_000, round + 100))
                .unwrap();
            wire.extend(peer_send(&mut p.peer));
            let ev = open_all(&mut p.opener, &mut wire, &mut got).unwrap();
            assert_eq!(
                ev,
                Some(Opened::KeyUpdate {
                    update_requested: true
                })
            );
            // Another record before the new key is refused, not opened under the old one.
            assert!(p.opener.open(&mut wire.clone()).is_err());
            let (seq, secrets) = p.kernel.update_rx();
            p.opener.rekey(seq, &secrets).unwrap();
            assert_eq!(open_all(&mut p.opener, &mut wire, &mut got).unwrap(), None);
            assert!(wire.is_empty());
            // Our answer: a KeyUpdate under the old key, then data under the new one.
            let mut out = Vec::new();
            p.sealer.seal_key_update(false, &mut out).unwrap();
            let (seq, secrets) = p.kernel.update_tx();
            p.sealer.rekey(seq, &secrets).unwrap();
            p.sealer
                .seal_app_data(&data(5000, round), &mut out)
                .unwrap();
            peer_receive(&mut p.peer, &out).unwrap();
            assert_eq!(peer_read(&mut p.peer), data(5000, round));
        }
        let mut want = Vec::new();
        for round in 0..3u8 {
            want.extend(data(20_000, round));
            want.extend(data(30_000, round + 100));
        }
        assert_eq!(got, want);
    }
}

#[test]
fn our_key_updates_are_followed_by_rustls() {
    let mut p = pair(false);
    let mut sent = Vec::new();
    let mut got = Vec::new();
    for round in 0..5u8 {
        let mut out = Vec::new();
        let chunk = data(40_000, round);
        p.sealer.seal_app_data(&chunk, &mut out).unwrap();
        sent.extend_from_slice(&chunk);
        p.sealer.seal_key_update(false, &mut out).unwrap();
        let (seq, secrets) = p.kernel.update_tx();
        assert_eq!(seq, 0);
        p.sealer.rekey(seq, &secrets).unwrap();
        deliver(&mut p.peer, &out, &mut got);
    }
    let mut out = Vec::new();
    p.sealer.seal_app_data(b"after", &mut out).unwrap();
    sent.extend_from_slice(b"after");
    deliver(&mut p.peer, &out, &mut got);
    assert_eq!(got, sent);
    // rustls did not answer (update_requested = 0 everywhere).
    assert!(!p.peer.wants_write());
}

#[test]
fn a_tampered_record_fails_authentication_and_nothing_is_returned() {
    let mut p = pair(true);
    p.peer.writer().write_all(&data(1000, 3)).unwrap();
    p.peer.writer().write_all(&data(1000, 4)).unwrap();
    let mut wire = peer_send(&mut p.peer);
    let first = record_len(&wire).unwrap().unwrap();
    // Every byte position of the first record: header bytes are checked or bound by the
    // additional data, body and tag by the AEAD.
    for at in [3usize, 4, 5, 100, first - 1] {
        let mut bad = wire.clone();
        bad[at] ^= 0x40;
        let err = p.opener.open(&mut bad);
        assert!(err.is_err(), "flip at {at} passed");
        assert_eq!(
            p.opener.seq(),
            0,
            "a failed record must not advance the sequence"
        );
    }
    let err = {
        let mut bad = wire.clone();
        bad[50] ^= 1;
        p.opener.open(&mut bad).unwrap_err()
    };
    assert_eq!(err, RecordError::BadRecordMac(0));
    assert_eq!(err.alert(), Some(alert::BAD_RECORD_MAC));
    // The untouched records still open in order.
    let mut got = Vec::new();
    open_all(&mut p.opener, &mut wire, &mut got).unwrap();
    assert_eq!(got, [data(1000, 3), data(1000, 4)].concat());
}

#[test]
fn a_record_out_of_order_or_replayed_fails() {
    let mut p = pair(true);
    p.peer.writer().write_all(b"one").unwrap();
    let one = peer_send(&mut p.peer);
    p.peer.writer().write_all(b"two").unwrap();
    let two = peer_send(&mut p.peer);
    assert_eq!(
        p.opener.open(&mut two.clone()).unwrap_err(),
        RecordError::BadRecordMac(0)
    );
    let mut buf = one.clone();
    assert!(matches!(
        p.opener.open(&mut buf),
        Ok(Some((_, Opened::Data(_))))
    ));
    assert_eq!(
        p.opener.open(&mut one.clone()).unwrap_err(),
        RecordError::BadRecordMac(1)
    );
}

#[test]
fn truncated_and_oversized_records() {
    let mut p = pair(true);
    p.peer.writer().write_all(&data(5000, 9)).unwrap();
    let wire = peer_send(&mut p.peer);
    // Every prefix of a record is "not yet".
    for cut in 0..wire.len() {
        let mut part = wire[..cut].to_vec();
        assert_eq!(p.opener.open(&mut part).unwrap(), None, "prefix {cut}");
    }
    assert_eq!(p.opener.seq(), 0);
    // A length over 2^14 + 256 is refused from the header alone.
    let mut big = vec![23, 3, 3, 0x41, 0x01];
    assert_eq!(
        p.opener.open(&mut big).unwrap_err(),
        RecordError::Overflow(0x4101)
    );
    assert_eq!(
        RecordError::Overflow(0x4101).alert(),
        Some(alert::RECORD_OVERFLOW)
    );
    // Too short to hold a tag and a content type.
    assert_eq!(
        p.opener.open(&mut [23, 3, 3, 0, 16]).unwrap_err(),
        RecordError::TooShort(16)
    );
    // A plaintext record type, or TLS 1.0's version.
    assert!(matches!(
        p.opener.open(&mut [22, 3, 3, 0, 40]),
        Err(RecordError::BadHeader { ty: 22, .. })
    ));
    assert!(matches!(
        p.opener.open(&mut [23, 3, 1, 0, 40]),
        Err(RecordError::BadHeader {
            version: 0x0301,
            ..
        })
    ));
    // A record truncated and the next one's bytes following: the length field decides, the
    // tag fails.
    let mut spliced = wire[..wire.len() - 1].to_vec();
    spliced.extend_from_slice(&[0; 100]);
    assert_eq!(
        p.opener.open(&mut spliced).unwrap_err(),
        RecordError::BadRecordMac(0)
    );
}

#[test]
fn close_notify_both_ways() {
    let mut p = pair(true);
    p.peer.writer().write_all(b"last cells").unwrap();
    p.peer.send_close_notify();
    let mut wire = peer_send(&mut p.peer);
    let mut got = Vec::new();
    assert_eq!(
        open_all(&mut p.opener, &mut wire, &mut got).unwrap(),
        Some(Opened::CloseNotify)
    );
    assert_eq!(got, b"last cells");

    let mut out = Vec::new();
    p.sealer.seal_app_data(b"ours", &mut out).unwrap();
    p.sealer.seal_alert(alert::CLOSE_NOTIFY, &mut out).unwrap();
    let state = peer_receive(&mut p.peer, &out).unwrap();
    assert!(state.peer_has_closed());
    assert_eq!(peer_read(&mut p.peer), b"ours");
}

#[test]
fn a_fatal_alert_from_rustls_is_an_error_with_its_name() {
    let mut p = pair(false);
    let mut out = Vec::new();
    p.sealer.seal_app_data(b"x", &mut out).unwrap();
    let last = out.len() - 1;
    out[last] ^= 1;
    // rustls refuses our tampered record and answers with a sealed bad_record_mac.
    assert!(peer_receive(&mut p.peer, &out).is_err());
    let mut wire = peer_send(&mut p.peer);
    let err = open_all(&mut p.opener, &mut wire, &mut Vec::new()).unwrap_err();
    assert_eq!(err, RecordError::PeerAlert(alert::BAD_RECORD_MAC));
    assert!(err.to_string().contains("bad_record_mac"), "{err}");
    assert_eq!(err.alert(), None);
}

#[test]
fn our_fatal_alert_reaches_rustls() {
    let mut p = pair(true);
    let mut out = Vec::new();
    p.sealer.seal_alert(alert::DECODE_ERROR, &mut out).unwrap();
    let err = peer_receive(&mut p.peer, &out).unwrap_err();
    assert!(
        matches!(err, rustls::Error::AlertReceived(d) if d == rustls::AlertDescription::DecodeError),
        "{err:?}"
    );
}

#[test]
fn the_sealer_refuses_past_the_key_limit() {
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
        iv: rustls::crypto::cipher::Iv::new([1u8; 12]),
    };
    let mut s = RecordSealer::new((1 << 24) - 2, &secrets).unwrap();
    assert!(s.needs_key_update());
    let mut out = Vec::new();
    s.seal_app_data(b"a", &mut out).unwrap();
    s.seal_app_data(b"b", &mut out).unwrap();
    assert_eq!(
        s.seal_app_data(b"c", &mut out).unwrap_err(),
        RecordError::KeyExhausted(1 << 24)
    );
    assert!(!RecordSealer::new(0, &secrets).unwrap().needs_key_update());
}

#[test]
fn the_opener_never_panics_on_random_records() {
    use rand::{Rng, SeedableRng};
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
        iv: rustls::crypto::cipher::Iv::new([1u8; 12]),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(20);
    let mut sealer = RecordSealer::new(0, &secrets).unwrap();
    for _ in 0..2000 {
        // Valid records of random inner content (type and padding chosen by the test).
        let len = rng.gen_range(0..64);
        let mut inner: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        inner.extend(std::iter::repeat_n(0, rng.gen_range(0..4)));
        let mut out = Vec::new();
        sealer
            .seal(rng.gen_range(20..25), &inner, &mut out)
            .unwrap();
        let mut opener = RecordOpener::new(sealer.seq() - 1, &secrets).unwrap();
        let _ = opener.open(&mut out);
        // And random bytes.
        let mut junk: Vec<u8> = (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect();
        if rng.gen() {
            let k = junk.len().min(3);
            junk[..k].copy_from_slice(&[23, 3, 3][..k]);
        }
        let _ = opener.open(&mut junk);
    }
}

#[test]
fn open_into_packs_the_plaintext_of_consecutive_records_with_a_keyupdate_between() {
    for we_are_client in [true, false] {
        let mut p = pair(we_are_client);
        let sent = [data(MAX_PLAINTEXT, 1), data(1, 2), data(5000, 3)];
        let mut wire = Vec::new();
        p.peer.writer().write_all(&sent[0]).unwrap();
        p.peer.writer().write_all(&sent[1]).unwrap();
        wire.extend(peer_send(&mut p.peer));
        p.peer.refresh_traffic_keys().unwrap();
        p.peer.writer().write_all(&sent[2]).unwrap();
        wire.extend(peer_send(&mut p.peer));
        let (mut to, mut at) = (0, 0);
        while let Some((len, opened)) = p.opener.open_into(&mut wire, to, at).unwrap() {
            at += len;
            match opened {
                Opened::Data(range) => {
                    assert_eq!(
                        range.start, to,
                        "each record's plaintext right after the last"
                    );
                    to = range.end;
                }
                Opened::KeyUpdate { .. } => {
                    let (seq, secrets) = p.kernel.update_rx();
                    p.opener.rekey(seq, &secrets).unwrap();
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(at, wire.len());
        assert_eq!(&wire[..to], &sent.concat()[..]);
        // A plaintext position past its record is refused, and a changed record fails.
        let mut p = pair(we_are_client);
        p.peer.writer().write_all(&sent[2]).unwrap();
        let mut wire = peer_send(&mut p.peer);
        assert!(p.opener.open_into(&mut wire, 1, 0).is_err());
        wire[40] ^= 1;
        assert_eq!(
            p.opener.open_into(&mut wire, 0, 0),
            Err(RecordError::BadRecordMac(0))
        );
    }
}

/// A batch laid out as the send path frames it (`crate::framed_len`): `cells` 514-byte cells
/// of `seed`'s data with the room for a record around every `CELLS_PER_RECORD` of them; and
/// the cells' bytes back to back.
fn framed_batch(cells: usize, seed: u8) -> (Vec<u8>, Vec<u8>) {
    let plain = data(cells * chive_cell::CELL_LEN, seed);
    let mut framed = Vec::new();
    for record in plain.chunks(crate::CELLS_PER_RECORD * chive_cell::CELL_LEN) {
        framed.resize(framed.len() + crate::RECORD_HEAD, 0xee);
        framed.extend_from_slice(record);
        framed.resize(framed.len() + crate::RECORD_TAIL, 0xee);
    }
    assert_eq!(framed.len(), crate::framed_len(cells));
    (framed, plain)
}

/// Framed batches sealed where they lie are records rustls reads: one per
/// `CELLS_PER_RECORD` cells (the last one shorter), in order with records sealed the usual way.
#[test]
fn framed_batches_sealed_in_place_are_read_by_rustls() {
    for we_are_client in [true, false] {
        let mut p = pair(we_are_client);
        let (mut sent, mut got, mut wire) = (Vec::new(), Vec::new(), Vec::new());
        let mut records = 0;
        let per = crate::CELLS_PER_RECORD;
        for (i, cells) in [1, per - 1, per, per + 1, 2 * per, 3 * per + 7, 128]
            .into_iter()
            .enumerate()
        {
            let (mut framed, plain) = framed_batch(cells, i as u8);
            p.sealer
                .seal_framed(&mut framed, per * chive_cell::CELL_LEN)
                .unwrap();
            records += cells.div_ceil(per) as u64;
            wire.extend_from_slice(&framed);
            sent.extend_from_slice(&plain);
            // A record sealed by copy between framed ones.
            p.sealer.seal_app_data(&[i as u8; 3], &mut wire).unwrap();
            records += 1;
            sent.extend_from_slice(&[i as u8; 3]);
        }
        deliver(&mut p.peer, &wire, &mut got);
        assert_eq!(got, sent);
        assert_eq!(p.sealer.seq(), records);
    }
}

/// A framed batch whose end cannot hold a record, or a record size over the limit, is refused
/// before anything of that record is sealed.
#[test]
fn framed_layouts_that_do_not_fit_are_refused() {
    let mut p = pair(true);
    let mut short = vec![0u8; RECORD_OVERHEAD];
    assert!(p.sealer.seal_framed(&mut short, 514).is_err());
    let mut one = vec![0u8; RECORD_OVERHEAD + 1];
    assert!(p.sealer.seal_framed(&mut one, MAX_PLAINTEXT + 1).is_err());
    assert!(p.sealer.seal_framed(&mut one, 0).is_err());
    assert_eq!(p.sealer.seq(), 0);
    p.sealer.seal_framed(&mut one, 514).unwrap();
    assert_eq!(p.sealer.seq(), 1);
}
