//! Target `record_handover`: the own record layer's hand-over from rustls's TLS handshake to
//! chive's `RecordStream` (`LinkRecordLayer = own`), against a scripted rustls peer, through
//! `chive_net::fuzzing::handover`.
//!
//! Input (missing bytes read as 0): flags (bit 0: we are the TLS server; bit 1: a server peer
//! sends half-RTT data; bit 2: the stream is cut), the peer's script (count % 9, then two bytes
//! per op: kind % 4 = data of `arg * 61` bytes, KeyUpdate, close_notify, fatal alert), the wire's
//! read sizes and our read sizes (count % 5, u16 each), changes (count % 9, a u16 offset whose
//! top bit means "after the peer's handshake bytes", then the XOR byte), the cut (u16 after the
//! handshake, if flagged), our writes after EOF (count % 4, u16 each), then bytes appended to the
//! stream.
//!
//! Properties: no panic and no hang; what we read is a prefix of what the peer sent (no forged
//! bytes); an unchanged stream delivers all of it, ends as the peer ended it (EOF, or the error
//! its alert causes), and what we write then reaches the peer exactly (KeyUpdate answers
//! included); a stream changed after the handshake delivers exactly the data of the records
//! before the first change.

use chive_net::fuzzing::{handover, Change, HandoverScript, PeerOp, ReadEnd};

/// The fuzz target.
pub fn record_handover(data: &[u8]) {
    let script = parse(data);
    let r = handover(script);
    assert!(
        !r.hung,
        "the record stream pended or looped on a wire that never pends"
    );
    assert!(
        r.sent.starts_with(&r.delivered),
        "delivered bytes the peer did not send"
    );
    let handshake_failed = matches!(r.read_end, ReadEnd::HandshakeFailed(_));
    // The data of every record that ends at or before `at`.
    let before = |at: usize| {
        r.marks
            .iter()
            .filter(|(end, _)| *end <= at)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    };
    match r.first_change {
        None => {
            // rustls hands over right after its handshake's last record, so whatever follows
            // in the same read is the record layer's.
            assert!(
                !handshake_failed,
                "unchanged handshake failed: {:?}",
                r.read_end
            );
            assert_eq!(
                r.delivered, r.sent,
                "the unchanged stream delivers everything"
            );
            if r.ended_with_alert {
                assert!(
                    matches!(r.read_end, ReadEnd::Failed(_)),
                    "the peer's alert ends the read side with an error, not {:?}",
                    r.read_end
                );
            } else {
                assert_eq!(r.read_end, ReadEnd::Eof, "unchanged stream");
                assert!(r.write_ok, "our writes after EOF failed");
                assert!(!r.peer_failed, "the peer refused what we sent");
                assert_eq!(r.peer_received, r.written, "the peer reads what we wrote");
            }
        }
        Some(at) if r.handshake_end.is_some_and(|hs| at >= hs) => {
            assert!(!handshake_failed, "a change after the handshake failed it");
            assert_eq!(
                r.delivered.len(),
                before(at),
                "a change at {at} (handshake ended at {:?}): the records before it, and only those",
                r.handshake_end
            );
        }
        // A change inside the handshake: rustls refuses it or (a record header's ignored
        // version field) goes on; either way only the prefix property above.
        Some(_) => {}
    }
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn sizes(&mut self, most: u8) -> Vec<usize> {
        let n = self.u8() % most;
        (0..n).map(|_| usize::from(self.u16())).collect()
    }
}

fn parse(data: &[u8]) -> HandoverScript {
    let mut b = Bytes(data);
    let flags = b.u8();
    let n_ops = b.u8() % 9;
    let ops = (0..n_ops)
        .map(|_| {
            let (kind, arg) = (b.u8(), b.u8());
            match kind % 4 {
                0 => PeerOp::Data(usize::from(arg) * 61),
                1 => PeerOp::KeyUpdate,
                2 => PeerOp::CloseNotify,
                _ => PeerOp::Alert,
            }
        })
        .collect();
    let wire_reads = b.sizes(5);
    let our_reads = b.sizes(5);
    let n_changes = b.u8() % 9;
    let changes = (0..n_changes)
        .map(|_| {
            let off = b.u16();
            let x = b.u8();
            if off & 0x8000 != 0 {
                Change::AfterHandshake(usize::from(off & 0x7fff), x)
            } else {
                Change::At(usize::from(off), x)
            }
        })
        .collect();
    let cut_after_handshake = (flags & 4 != 0).then(|| usize::from(b.u16()));
    let our_writes = b.sizes(4);
    HandoverScript {
        we_are_server: flags & 1 != 0,
        half_rtt: flags & 2 != 0,
        ops,
        wire_reads,
        our_reads,
        changes,
        cut_after_handshake,
        appended: b.0.to_vec(),
        our_writes,
    }
}

/// The input `parse` reads as `s`.
fn encode(s: &HandoverScript) -> Vec<u8> {
    let mut v = vec![
        u8::from(s.we_are_server)
            | u8::from(s.half_rtt) << 1
            | u8::from(s.cut_after_handshake.is_some()) << 2,
    ];
    v.push(s.ops.len() as u8);
    for op in &s.ops {
        v.extend_from_slice(&match op {
            PeerOp::Data(n) => [0, (n / 61) as u8],
            PeerOp::KeyUpdate => [1, 0],
            PeerOp::CloseNotify => [2, 0],
            PeerOp::Alert => [3, 0],
        });
    }
    let sizes = |v: &mut Vec<u8>, sizes: &[usize]| {
        v.push(sizes.len() as u8);
        for n in sizes {
            v.extend_from_slice(&(*n as u16).to_be_bytes());
        }
    };
    sizes(&mut v, &s.wire_reads);
    sizes(&mut v, &s.our_reads);
    v.push(s.changes.len() as u8);
    for c in &s.changes {
        let (off, x) = match *c {
            Change::At(off, x) => (off as u16, x),
            Change::AfterHandshake(off, x) => (off as u16 | 0x8000, x),
        };
        v.extend_from_slice(&off.to_be_bytes());
        v.push(x);
    }
    if let Some(cut) = s.cut_after_handshake {
        v.extend_from_slice(&(cut as u16).to_be_bytes());
    }
    sizes(&mut v, &s.our_writes);
    v.extend_from_slice(&s.appended);
    v
}

/// Seeds: each side, data in the same read as the handshake's end, half-RTT data, KeyUpdates
/// with our writes after them, an alert, byte-at-a-time reads, a flipped byte after and inside
/// the handshake, a cut, junk after close_notify.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    use PeerOp::*;
    let base = HandoverScript {
        ops: vec![Data(610), Data(61 * 200), CloseNotify],
        ..HandoverScript::default()
    };
    let scripts = [
        ("client-data-close", base.clone()),
        (
            "server-data-with-finished",
            HandoverScript {
                we_are_server: true,
                ops: vec![Data(61), KeyUpdate, Data(6100), CloseNotify],
                our_writes: vec![3000],
                ..base.clone()
            },
        ),
        (
            "client-half-rtt",
            HandoverScript {
                half_rtt: true,
                ops: vec![Data(61), Data(122)],
                ..base.clone()
            },
        ),
        (
            "key-updates-then-writes",
            HandoverScript {
                ops: vec![KeyUpdate, Data(61), KeyUpdate, Data(0)],
                our_writes: vec![20_000, 1],
                ..base.clone()
            },
        ),
        (
            "alert-after-data",
            HandoverScript {
                we_are_server: true,
                ops: vec![Data(305), Alert],
                ..base.clone()
            },
        ),
        (
            "byte-reads",
            HandoverScript {
                ops: vec![Data(61), KeyUpdate, Data(61), CloseNotify],
                wire_reads: vec![1, 7],
                our_reads: vec![1],
                ..base.clone()
            },
        ),
        (
            "flip-after-handshake",
            HandoverScript {
                we_are_server: true,
                changes: vec![Change::AfterHandshake(700, 0x40)],
                ..base.clone()
            },
        ),
        (
            "flip-in-handshake",
            HandoverScript {
                changes: vec![Change::At(200, 1)],
                ..base.clone()
            },
        ),
        (
            "cut-in-second-record",
            HandoverScript {
                cut_after_handshake: Some(1000),
                ..base.clone()
            },
        ),
        (
            "junk-after-close",
            HandoverScript {
                appended: vec![23, 3, 3, 0, 30, 1, 2, 3],
                ..base.clone()
            },
        ),
    ];
    scripts
        .into_iter()
        .map(|(name, s)| (name.to_string(), encode(&s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_back_to_their_scripts() {
        for (name, bytes) in seeds() {
            assert_eq!(encode(&parse(&bytes)), bytes, "{name}");
        }
    }

    fn run(name: &str) -> chive_net::fuzzing::HandoverReport {
        let (_, bytes) = seeds().into_iter().find(|(n, _)| n == name).unwrap();
        record_handover(&bytes);
        handover(parse(&bytes))
    }

    #[test]
    fn seeds_reach_what_they_name() {
        let r = run("server-data-with-finished");
        assert_eq!(r.delivered.len(), 61 + 6100);
        assert_eq!((r.peer_received.len(), r.read_end), (3000, ReadEnd::Eof));
        let r = run("key-updates-then-writes");
        assert_eq!(r.peer_received.len(), 20_001);
        let r = run("client-half-rtt");
        assert_eq!(r.delivered.len(), 61 + 122);
        let r = run("alert-after-data");
        assert_eq!(r.delivered.len(), 305);
        assert!(matches!(r.read_end, ReadEnd::Failed(ref e) if e.contains("alert")));
        let r = run("flip-after-handshake");
        assert_eq!(r.delivered.len(), 610, "the first record only");
        assert!(matches!(r.read_end, ReadEnd::Failed(_)));
        let r = run("flip-in-handshake");
        assert!(matches!(r.read_end, ReadEnd::HandshakeFailed(_)));
        let r = run("cut-in-second-record");
        assert_eq!(r.delivered.len(), 610);
        assert!(matches!(r.read_end, ReadEnd::Failed(_)));
        let r = run("junk-after-close");
        assert_eq!(
            (r.delivered.len(), r.read_end),
            (610 + 12_200, ReadEnd::Eof)
        );
    }
}
