//! Target `split_handoff`: the split-direction hand-off (chive-core's [`SplitChannel`]): the
//! order of cells and HANDOFF markers on a channel's two connections, as the relay that reads
//! both (A, the channel's initiator) or the one that writes the second (B) sees them.

use std::collections::VecDeque;
use std::time::Instant;

use chive_cell::{AnyCell, Bind, Cell, CellCommand, Handoff, VarCell};
use chive_core::split::{
    Conn, Refusal, SecondaryDown, SplitChannel, SplitConfig, Violation, MAX_PENDING,
    MAX_REORDER_ITEMS,
};

/// The channel's bind token (any value: the target does not check BIND bodies, `relay_msg`
/// does).
const TOKEN: [u8; 32] = [7; 32];

/// A data cell numbered `n` (the number rides in the circuit id, so order is checkable).
fn data_cell(n: u32) -> AnyCell {
    AnyCell::Fixed(Cell::new(n, CellCommand::RELAY, b"x").expect("RELAY is a fixed command"))
}

/// The BIND a new second connection starts with, carrying B's next marker number.
fn bind_cell(seq: u32) -> AnyCell {
    AnyCell::Var(VarCell {
        circ_id: 0,
        command: CellCommand::BIND,
        payload: Bind {
            token: TOKEN,
            seq: Some(seq),
        }
        .encode(),
    })
}

fn handoff_cell(payload: Vec<u8>) -> AnyCell {
    AnyCell::Var(VarCell {
        circ_id: 0,
        command: CellCommand::HANDOFF,
        payload,
    })
}

/// A reading channel (we opened the first connection) with the peer's second one attached.
fn reader(now: Instant) -> SplitChannel {
    let mut ch = SplitChannel::new(true, true, TOKEN, &SplitConfig::default(), now);
    assert!(ch.open());
    assert!(ch.bind_matches(&TOKEN));
    assert!(ch.attach_peer_second(Some(0)));
    ch
}

/// First byte, bit 0: an honest peer (1: the fuzzer picks only when the peer writes, switches
/// or loses its second connection, and how the two connections interleave) or a hostile one (0:
/// the fuzzer picks every item); bit 1 (hostile only): we are the writing side (B) instead of
/// the reader. Properties: no panic; a reader delivers each connection's cells in the order
/// they arrived, each once, holds at most [`MAX_REORDER_ITEMS`]; with an honest peer that lost
/// nothing, every cell is delivered in the peer's order and nothing is refused; after a loss
/// the cells delivered are a prefix of the peer's, and a refusal is the loss itself.
pub fn split_handoff(data: &[u8]) {
    let Some((&mode, ops)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        honest(ops);
    } else if mode & 2 == 0 {
        hostile_reader(ops);
    } else {
        hostile_writer(ops);
    }
}

fn honest(ops: &[u8]) {
    let now = Instant::now();
    let mut a = reader(now);
    let mut b = chive_core::split::Sender::default();
    // What B wrote on each connection and has not arrived yet.
    let mut pipes: [VecDeque<AnyCell>; 2] = [VecDeque::new(), VecDeque::new()];
    let mut sent = 0u32;
    let mut delivered: Vec<u32> = Vec::new();
    let mut second_up = true;
    // A has attached B's current second connection (read its BIND).
    let mut attached = true;
    let mut lost_any = false;
    let mut out = Vec::new();
    let idx = |c: Conn| usize::from(c == Conn::Secondary);

    // One item from a connection to A. A BIND (the first item of a re-opened second
    // connection) attaches it; an honest one is refused only when A already keeps
    // MAX_PENDING bound connections waiting for the primary (a primary lagging that many
    // retries behind: A closes the new connection, a documented limit), which ends the run.
    let deliver = |a: &mut SplitChannel,
                   pipes: &mut [VecDeque<AnyCell>; 2],
                   attached: &mut bool,
                   conn: Conn,
                   out: &mut Vec<AnyCell>|
     -> Option<Result<Option<Conn>, Refusal>> {
        let cell = pipes[idx(conn)].pop_front()?;
        if let AnyCell::Var(v) = &cell {
            if v.command == CellCommand::BIND {
                let bind = Bind::decode(&v.payload).expect("the target's own BIND");
                if !a.attach_peer_second(bind.seq) {
                    assert_eq!(
                        a.pending_binds(),
                        MAX_PENDING,
                        "honest BIND (seq {:?}) refused",
                        bind.seq
                    );
                    // (OneWay never comes from a reader: it stands for "A closed it".)
                    return Some(Err(Refusal::OneWay));
                }
                *attached = true;
                return Some(Ok(None));
            }
        }
        Some(a.receive(conn, cell, out))
    };

    for &op in ops {
        let result = match op % 6 {
            // B writes a cell on its current connection.
            0 => {
                let conn = b.current();
                if conn == Conn::Secondary && !second_up {
                    continue;
                }
                pipes[idx(conn)].push_back(data_cell(sent));
                b.sent(1);
                sent += 1;
                None
            }
            // B switches connections (only while both are up).
            1 => {
                if !second_up {
                    continue;
                }
                let leaving = b.current();
                let h = b.switch();
                pipes[idx(leaving)].push_back(handoff_cell(h.encode()));
                None
            }
            2 => deliver(&mut a, &mut pipes, &mut attached, Conn::Primary, &mut out),
            3 => deliver(&mut a, &mut pipes, &mut attached, Conn::Secondary, &mut out),
            // The second connection goes down: closed cleanly (everything on it arrives first)
            // or failed (what is still on the way is lost).
            4 | 5 => {
                if !second_up {
                    // B opens a new second connection (as after its retry): its BIND carries
                    // B's next marker number. A reads it whenever the fuzzer delivers it, maybe
                    // long before the old connection's markers on the primary, maybe after the
                    // marker switching onto it.
                    pipes[1].push_back(bind_cell(b.next_seq()));
                    second_up = true;
                    attached = false;
                    continue;
                }
                let mut r = None;
                if op % 6 == 4 {
                    while let Some(res) =
                        deliver(&mut a, &mut pipes, &mut attached, Conn::Secondary, &mut out)
                    {
                        if res.is_err() {
                            r = Some(res);
                            break;
                        }
                    }
                } else {
                    // Lost with it: what B wrote there (a BIND A never read attaches nothing).
                    lost_any |= pipes[1].iter().any(|c| c.command() != CellCommand::BIND);
                    pipes[1].clear();
                }
                second_up = false;
                if r.is_none() {
                    if b.current() == Conn::Secondary {
                        let h = b.recover();
                        // Its first item on the primary from now on (what B wrote there
                        // earlier is ahead of it).
                        pipes[0].push_back(handoff_cell(h.encode()));
                    }
                    // A notices only a connection it attached.
                    if std::mem::take(&mut attached) {
                        r = match a.secondary_down(now, &mut out) {
                            SecondaryDown::Released(res) => Some(res.map_err(Refusal::Violation)),
                            other => panic!("a reading channel answered {other:?}"),
                        };
                    }
                }
                r
            }
            _ => unreachable!(),
        };
        collect(&mut out, &mut delivered);
        check_prefix(&delivered, sent);
        if let Some(Err(Refusal::OneWay)) = result {
            return;
        }
        if let Some(Err(e)) = result {
            assert!(lost_any, "honest peer refused without a loss: {e:?}");
            assert!(
                matches!(
                    e,
                    Refusal::Violation(Violation::Lost(_) | Violation::Protocol(_))
                ),
                "a loss reported as {e:?}"
            );
            return;
        }
        assert!(a.held() <= MAX_REORDER_ITEMS);
    }
    // Everything still on the way arrives (primary first, then the second connection, then
    // the primary again: any order must do).
    for conn in [
        Conn::Primary,
        Conn::Secondary,
        Conn::Primary,
        Conn::Secondary,
    ] {
        while let Some(res) = deliver(&mut a, &mut pipes, &mut attached, conn, &mut out) {
            collect(&mut out, &mut delivered);
            check_prefix(&delivered, sent);
            if res == Err(Refusal::OneWay) {
                return;
            }
            if let Err(e) = res {
                assert!(lost_any, "honest peer refused without a loss: {e:?}");
                return;
            }
        }
    }
    if !lost_any {
        assert_eq!(delivered.len(), sent as usize, "cells left held back");
    }
}

fn collect(out: &mut Vec<AnyCell>, delivered: &mut Vec<u32>) {
    delivered.extend(out.drain(..).map(|c| c.circ_id()));
}

/// Cells delivered so far are exactly 0, 1, 2, ... (the peer's order, each once).
fn check_prefix(delivered: &[u32], sent: u32) {
    assert!(
        delivered.len() <= sent as usize,
        "more cells than were sent"
    );
    for (i, &n) in delivered.iter().enumerate() {
        assert_eq!(n as usize, i, "cell delivered out of order or twice");
    }
}

/// The fuzzer writes both connections. Op byte: bits 0-1 what (cell, HANDOFF from the next 13
/// input bytes, second connection down, re-attach), bit 2 which connection.
fn hostile_reader(ops: &[u8]) {
    let now = Instant::now();
    let mut a = reader(now);
    // Cells are numbered per connection: (conn << 31) | n.
    let mut next = [0u32; 2];
    let mut last_delivered: [Option<u32>; 2] = [None, None];
    let mut out = Vec::new();
    let mut rest = ops;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        let conn = if op & 4 == 0 {
            Conn::Primary
        } else {
            Conn::Secondary
        };
        let ci = usize::from(conn == Conn::Secondary);
        let result = match op & 3 {
            0 => {
                let n = next[ci] | (u32::from(ci == 1) << 31);
                next[ci] += 1;
                a.receive(conn, data_cell(n), &mut out)
                    .map(drop)
                    .map_err(|e| format!("{e:?}"))
            }
            1 => {
                let take = rest.len().min(Handoff::LEN);
                let (body, tail) = rest.split_at(take);
                rest = tail;
                a.receive(conn, handoff_cell(body.to_vec()), &mut out)
                    .map(drop)
                    .map_err(|e| format!("{e:?}"))
            }
            2 => match a.secondary_down(now, &mut out) {
                SecondaryDown::Released(r) => r.map(drop).map_err(|e| format!("{e:?}")),
                other => panic!("a reading channel answered {other:?}"),
            },
            _ => {
                // A BIND: its sequence number from the next 4 input bytes (an earlier
                // version's BIND, without one, if fewer remain).
                let seq = rest
                    .get(..4)
                    .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")));
                rest = rest.get(4..).unwrap_or_default();
                let _ = a.attach_peer_second(seq);
                Ok(())
            }
        };
        for c in out.drain(..) {
            let id = c.circ_id();
            let (ci, n) = ((id >> 31) as usize, id & !(1 << 31));
            assert!(
                last_delivered[ci].map_or(n == 0, |l| n == l + 1),
                "connection {ci}: cell {n} delivered after {:?}",
                last_delivered[ci]
            );
            last_delivered[ci] = Some(n);
        }
        assert!(a.held() <= MAX_REORDER_ITEMS);
        if result.is_err() {
            return; // the driver closes the channel
        }
    }
}

/// We are B (we accepted the first connection and write the second): the peer may only write
/// plain cells on the first. Op byte: bit 0 which connection, bit 1 a HANDOFF instead of a cell.
fn hostile_writer(ops: &[u8]) {
    let now = Instant::now();
    let mut b = SplitChannel::new(true, false, TOKEN, &SplitConfig::default(), now);
    assert!(b.may_be_bound());
    assert!(b.open());
    let mut out = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let conn = if op & 1 == 0 {
            Conn::Primary
        } else {
            Conn::Secondary
        };
        let cell = if op & 2 == 0 {
            data_cell(i as u32)
        } else {
            handoff_cell(vec![op; Handoff::LEN])
        };
        let bad = conn == Conn::Secondary || op & 2 != 0;
        match b.receive(conn, cell, &mut out) {
            Ok(None) => {
                assert!(!bad, "writing side accepted {op:#x}");
                assert_eq!(out.pop().map(|c| c.circ_id()), Some(i as u32));
            }
            Ok(Some(c)) => panic!("writing side switched to {c:?}"),
            Err(Refusal::OneWay) => assert_eq!(conn, Conn::Secondary),
            Err(Refusal::Violation(_)) => assert!(bad),
        }
        assert_eq!(b.held(), 0);
        assert!(out.is_empty());
    }
}
