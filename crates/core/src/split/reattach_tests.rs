//! A second connection re-attached while the primary lags (the `split_handoff` fuzzer's
//! `reattach_before_old_markers`): the BIND's sequence number keeps the new connection's cells
//! apart until the old connection's markers are read, whatever order the two connections'
//! items, the close of the old one and the BIND of the new one arrive in.

use chive_cell::{AnyCell, Cell, CellCommand, Handoff};

use super::{Conn, Item, Reorder, Sender, Violation, MAX_PENDING};

/// What A sees on the secondary "slot": items, the old connection closing, a new BIND.
// Test-only and short-lived: the cell stays inline, as in `Item`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ev {
    Item(Item),
    Close,
    Bind(u32),
}

fn cell(n: u32) -> Item {
    Item::Cell(AnyCell::Fixed(
        Cell::new(n, CellCommand::RELAY, &n.to_be_bytes()).unwrap(),
    ))
}

/// A handoff marker with no cells counted on the connection being left.
fn marker(seq: u32, flags: u8) -> Item {
    Item::Handoff(Handoff {
        seq,
        cells: 0,
        flags,
    })
}

fn ids(out: &[AnyCell]) -> Vec<u32> {
    out.iter().map(|c| c.circ_id()).collect()
}

/// B's steps.
#[derive(Clone, Copy)]
enum Step {
    Cells(u32),
    Switch,
    /// The second connection goes down after everything on it arrived; B recovers on the
    /// primary if it was writing there.
    Down,
    /// B opens a new second connection (BIND with its next marker number) and switches to it.
    Reopen,
}

/// What B writes on the primary and, in A's order of events, on the secondary slot.
fn script(steps: &[Step]) -> (Vec<Ev>, Vec<Ev>, u32) {
    let mut b = Sender::default();
    let (mut p, mut s) = (Vec::new(), Vec::new());
    let mut n = 0;
    for step in steps {
        match *step {
            Step::Cells(k) => {
                for _ in 0..k {
                    n += 1;
                    let target = match b.current() {
                        Conn::Primary => &mut p,
                        Conn::Secondary => &mut s,
                    };
                    target.push(Ev::Item(cell(n)));
                    b.sent(1);
                }
            }
            Step::Switch => {
                let leaving = b.current();
                let h = Item::Handoff(b.switch());
                match leaving {
                    Conn::Primary => p.push(Ev::Item(h)),
                    Conn::Secondary => s.push(Ev::Item(h)),
                }
            }
            Step::Down => {
                s.push(Ev::Close);
                if b.current() == Conn::Secondary {
                    p.push(Ev::Item(Item::Handoff(b.recover())));
                }
            }
            Step::Reopen => {
                s.push(Ev::Bind(b.next_seq()));
                p.push(Ev::Item(Item::Handoff(b.switch())));
            }
        }
    }
    (p, s, n)
}

fn apply(r: &mut Reorder, conn: Conn, ev: Ev, out: &mut Vec<AnyCell>) -> Result<(), Violation> {
    apply_with(r, conn, ev, out, false)
}

/// `apply`; with `fast`, a cell goes through the receive fast path (`Reorder::pass`) first,
/// as the driver's reader does, and only falls back to `push` when `pass` declines.
fn apply_with(
    r: &mut Reorder,
    conn: Conn,
    ev: Ev,
    out: &mut Vec<AnyCell>,
    fast: bool,
) -> Result<(), Violation> {
    match ev {
        Ev::Item(Item::Cell(c)) if fast && r.pass(conn) => {
            out.push(c);
            Ok(())
        }
        Ev::Item(item) => r.push(conn, item, out),
        Ev::Close => r.closed(Conn::Secondary, out),
        Ev::Bind(seq) => {
            assert!(
                r.attach_secondary(Some(seq)),
                "honest BIND {seq} refused: {r:?}"
            );
            Ok(())
        }
    }
}

/// Every interleaving of the primary's items with the secondary slot's events delivers B's
/// cells in B's order, each once, with nothing left held back.
fn every_interleaving(plan: &[Step]) -> usize {
    let (p, s, n) = script(plan);
    let (lp, ls) = (p.len(), s.len());
    let total = lp + ls;
    let mut tried = 0;
    for (mask, fast) in (0u64..(1 << total)).flat_map(|m| [(m, false), (m, true)]) {
        if mask.count_ones() as usize != ls {
            continue;
        }
        tried += usize::from(!fast);
        let (p2, s2, _) = script(plan);
        let (mut pi, mut si) = (p2.into_iter(), s2.into_iter());
        let mut r = Reorder::default();
        // The first second connection, bound at once.
        assert!(r.attach_secondary(Some(0)));
        let mut out = Vec::new();
        for bit in 0..total {
            let (conn, ev) = if mask & (1 << bit) != 0 {
                (Conn::Secondary, si.next().unwrap())
            } else {
                (Conn::Primary, pi.next().unwrap())
            };
            if let Err(e) = apply_with(&mut r, conn, ev, &mut out, fast) {
                panic!(
                    "mask {mask:b} (fast path {fast}): {e} after {:?}",
                    ids(&out)
                );
            }
        }
        assert_eq!(
            ids(&out),
            (1..=n).collect::<Vec<_>>(),
            "mask {mask:b}, fast path {fast}"
        );
        assert_eq!(r.queued(Conn::Primary) + r.queued(Conn::Secondary), 0);
        assert_eq!(r.pending_binds(), 0);
    }
    tried
}

#[test]
fn a_second_connection_reattached_before_the_old_markers_keeps_every_order() {
    use Step::*;
    // The fuzzer's case: switch, the second connection fails (recovery on the primary), a new
    // one is bound; in some interleavings A reads its BIND and cells before either marker.
    assert_eq!(
        every_interleaving(&[Cells(1), Switch, Down, Reopen, Cells(2)]),
        70
    );
    // Cells on the failed connection, on the primary after the recovery, and a merge back.
    assert!(
        every_interleaving(&[
            Cells(1),
            Switch,
            Cells(2),
            Down,
            Cells(1),
            Reopen,
            Cells(2),
            Switch,
            Cells(1),
        ]) > 1000
    );
    // A merged (not failed) connection, then a new one.
    assert!(every_interleaving(&[Switch, Cells(1), Switch, Down, Reopen, Cells(1), Switch]) > 10);
}

#[test]
fn a_primary_lagging_two_retries_behind_keeps_two_connections_pending() {
    use Step::*;
    let plan = [
        Cells(1),
        Switch,
        Cells(1),
        Down,
        Reopen,
        Cells(1),
        Down,
        Reopen,
        Cells(2),
    ];
    let (p, s, n) = script(&plan);
    let mut r = Reorder::default();
    assert!(r.attach_secondary(Some(0)));
    let mut out = Vec::new();
    // The whole secondary slot first: both new connections bound before any marker is read.
    for ev in s {
        apply(&mut r, Conn::Secondary, ev, &mut out).unwrap();
    }
    assert_eq!(r.pending_binds(), 2);
    assert!(out.is_empty());
    assert_eq!(r.held_back(Conn::Secondary), 4);
    for ev in p {
        apply(&mut r, Conn::Primary, ev, &mut out).unwrap();
    }
    assert_eq!(ids(&out), (1..=n).collect::<Vec<_>>());
    assert_eq!(r.pending_binds(), 0);
    assert_eq!(r.current(), Conn::Secondary);
}

#[test]
fn a_marker_read_before_its_bind_waits_for_the_bind() {
    let mut r = Reorder::default();
    let mut out = Vec::new();
    let mut b = Sender::default();
    assert!(r.attach_secondary(Some(0)));
    // B switches, writes one cell on S, S fails, B recovers; A reads it all.
    r.push(Conn::Primary, Item::Handoff(b.switch()), &mut out)
        .unwrap();
    r.push(Conn::Secondary, cell(1), &mut out).unwrap();
    b.sent(1);
    r.closed(Conn::Secondary, &mut out).unwrap();
    r.push(Conn::Primary, Item::Handoff(b.recover()), &mut out)
        .unwrap();
    // B binds a new one, switches to it, writes 2 cells, merges back, writes on P.
    let seq = b.next_seq();
    r.push(Conn::Primary, Item::Handoff(b.switch()), &mut out)
        .unwrap();
    b.sent(2);
    let back = b.switch();
    // A reads P's cell 4 before the new connection's BIND: held, not a violation.
    r.push(Conn::Primary, cell(4), &mut out).unwrap();
    assert_eq!(ids(&out), [1]);
    assert_eq!(r.held_back(Conn::Primary), 1);
    assert!(r.attach_secondary(Some(seq)));
    r.push(Conn::Secondary, cell(2), &mut out).unwrap();
    r.push(Conn::Secondary, cell(3), &mut out).unwrap();
    r.push(Conn::Secondary, Item::Handoff(back), &mut out)
        .unwrap();
    assert_eq!(ids(&out), [1, 2, 3, 4]);
    assert_eq!(r.current(), Conn::Primary);
}

#[test]
fn hostile_binds_are_refused_within_the_limits() {
    let mut out = Vec::new();
    // A BIND for a switch already behind us (the peer was on the primary then).
    let mut r = Reorder::default();
    assert!(r.attach_secondary(Some(0)));
    r.push(Conn::Primary, marker(0, 0), &mut out).unwrap();
    r.closed(Conn::Secondary, &mut out).unwrap();
    r.push(Conn::Primary, marker(1, Handoff::RECOVERY), &mut out)
        .unwrap();
    assert_eq!(r.current(), Conn::Primary);
    assert!(!r.attach_secondary(Some(0)), "a switch long past");
    assert!(!r.attach_secondary(Some(1)), "the recovery's number");
    // Far-future BINDs: at most MAX_PENDING wait, each later than the last.
    let mut r = Reorder::default();
    assert!(r.attach_secondary(Some(0)));
    r.closed(Conn::Secondary, &mut out).unwrap();
    for i in 0..MAX_PENDING as u32 {
        assert!(r.attach_secondary(Some(10 + 2 * i)), "pending {i}");
        if i == 0 {
            assert!(!r.attach_secondary(Some(20)), "one attached at a time");
        }
        r.closed(Conn::Secondary, &mut out).unwrap();
    }
    assert!(!r.attach_secondary(Some(100)), "over MAX_PENDING");
    assert_eq!(r.pending_binds(), MAX_PENDING);
    // A pending connection's cells count against the hold-back limit.
    let mut r = Reorder::new(4);
    assert!(r.attach_secondary(Some(0)));
    r.closed(Conn::Secondary, &mut out).unwrap();
    assert!(r.attach_secondary(Some(5)));
    for i in 0..4 {
        r.push(Conn::Secondary, cell(i), &mut out).unwrap();
    }
    assert_eq!(
        r.push(Conn::Secondary, cell(9), &mut out),
        Err(Violation::Overflow(4))
    );
    // A pending connection reached while the peer claims to be on the secondary.
    let mut r = Reorder::default();
    assert!(r.attach_secondary(Some(0)));
    r.closed(Conn::Secondary, &mut out).unwrap();
    assert!(r.attach_secondary(Some(1)));
    r.push(Conn::Secondary, cell(1), &mut out).unwrap();
    let err = r.push(Conn::Primary, marker(0, 0), &mut out);
    assert!(matches!(err, Err(Violation::Protocol(_))), "{err:?}");
}

#[test]
fn an_earlier_versions_bind_attaches_as_before() {
    let mut out = Vec::new();
    let mut r = Reorder::default();
    // The marker read before the BIND: the BIND is for the stretch just begun.
    r.push(Conn::Primary, marker(0, 0), &mut out).unwrap();
    assert!(r.attach_secondary(None));
    r.push(Conn::Secondary, cell(1), &mut out).unwrap();
    assert_eq!(ids(&out), [1]);
}
