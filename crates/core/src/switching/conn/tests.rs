use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::*;

const T: Duration = Duration::from_secs(2);

/// What travels on one connection in one direction for the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Cell(u32),
    Marker(SwitchMarker),
}

/// Feed a connection's items to a receiving end; returns the cells delivered, in order.
fn deliver_old(
    q: &mut VecDeque<Item>,
    hb: &mut HoldBack<u32>,
    out: &mut Vec<u32>,
) -> Result<(), ConnViolation> {
    while let Some(i) = q.pop_front() {
        match i {
            Item::Cell(c) => {
                hb.on_old_cell()?;
                out.push(c);
            }
            Item::Marker(m) => out.extend(hb.on_marker(m)?),
        }
    }
    Ok(())
}

#[test]
fn both_directions_move_in_order_when_the_new_connection_is_faster() {
    let now = Instant::now();
    let (mut c1_fwd, mut c1_back, mut c2_fwd, mut c2_back) = (
        VecDeque::new(),
        VecDeque::new(),
        VecDeque::new(),
        VecDeque::new(),
    );
    // Before the switch: 5 forward and 3 backward cells on C1, all delivered.
    let (mut fwd_out, mut back_out) = (Vec::new(), Vec::new());
    fwd_out.extend(1..=5);
    back_out.extend(101..=103);
    let mut mover: MoverSwitch<u32> = MoverSwitch::new(0, 3, 100, now, T);
    let (mut peer, ack) = PeerSwitch::<u32>::accept(0, 5, 100, now, T);
    // While the ACK travels, both keep using C1.
    c1_fwd.extend([Item::Cell(6), Item::Cell(7)]);
    c1_back.push_back(Item::Cell(104));
    let AckOutcome::CutOver(marker) = mover.on_ack(ack, 7).unwrap() else {
        panic!("accepted");
    };
    assert_eq!(marker, SwitchMarker { seq: 0, cells: 7 });
    c1_fwd.push_back(Item::Marker(marker));
    c2_fwd.extend((8..=12).map(Item::Cell));
    // C2 is fast: its cells reach the peer first and are held.
    for i in c2_fwd.drain(..) {
        let Item::Cell(c) = i else { unreachable!() };
        assert_eq!(peer.on_new_cell(c).unwrap(), None);
    }
    assert_eq!(peer.fwd.held(), 5);
    // The backward cell still on C1 is the peer's 4th.
    let mut peer_back_marker = None;
    while let Some(i) = c1_fwd.pop_front() {
        match i {
            Item::Cell(c) => {
                peer.on_old_cell().unwrap();
                fwd_out.push(c);
            }
            Item::Marker(m) => {
                let (released, own) = peer.on_marker(m, 4).unwrap();
                fwd_out.extend(released);
                peer_back_marker = Some(own);
            }
        }
    }
    assert_eq!(fwd_out, (1..=12).collect::<Vec<_>>());
    assert_eq!(peer.state(), PeerState::Moved);
    // The peer cuts over its direction: marker behind cell 104 on C1, then C2.
    c1_back.push_back(Item::Marker(peer_back_marker.unwrap()));
    c2_back.extend((105..=107).map(Item::Cell));
    for i in c2_back.drain(..) {
        let Item::Cell(c) = i else { unreachable!() };
        assert_eq!(mover.on_new_cell(c).unwrap(), None, "held");
    }
    assert!(!mover.is_complete());
    deliver_old(&mut c1_back, mover.backward(), &mut back_out).unwrap();
    assert_eq!(back_out, (101..=107).collect::<Vec<_>>());
    assert!(mover.is_complete());
    // After the markers, C2 cells pass straight through.
    assert_eq!(mover.on_new_cell(108).unwrap(), Some(108));
    assert_eq!(peer.on_new_cell(13).unwrap(), Some(13));
    assert_eq!(mover.next_deadline(), None);
    assert_eq!(peer.next_deadline(), None);
}

#[test]
fn a_refused_switch_stays_on_the_old_connection() {
    let now = Instant::now();
    let mut mover: MoverSwitch<u32> = MoverSwitch::new(3, 0, 10, now, T);
    let busy = SwitchAck {
        seq: 3,
        status: SwitchStatus::BUSY,
    };
    assert_eq!(
        mover.on_ack(busy, 9),
        Ok(AckOutcome::Refused(SwitchStatus::BUSY))
    );
    assert_eq!(mover.state(), MoverState::Abandoned);
    assert!(mover.on_new_cell(1).is_err(), "nothing may come on C2");
    let unknown = SwitchAck {
        seq: 3,
        status: SwitchStatus(77),
    };
    let mut m2: MoverSwitch<u32> = MoverSwitch::new(3, 0, 10, now, T);
    assert!(matches!(m2.on_ack(unknown, 0), Ok(AckOutcome::Refused(_))));
}

#[test]
fn timeouts_abandon_without_loss() {
    let now = Instant::now();
    let mut mover: MoverSwitch<u32> = MoverSwitch::new(0, 0, 10, now, T);
    assert_eq!(mover.next_deadline(), Some(now + T));
    assert!(!mover.handle_timeout(now + T - Duration::from_millis(1)));
    assert!(mover.handle_timeout(now + T), "give up: DESTROY the new id");
    assert!(!mover.handle_timeout(now + T + T), "once");
    // The ACK crossed the DESTROY: ignored.
    let ack = SwitchAck {
        seq: 0,
        status: SwitchStatus::ACCEPTED,
    };
    assert_eq!(mover.on_ack(ack, 5), Ok(AckOutcome::Late));
    // The peer, on the DESTROY, forgets the reservation; nothing was held.
    let (mut peer, _) = PeerSwitch::<u32>::accept(0, 0, 10, now, T);
    assert_eq!(peer.cancel(), Some(PeerDrop::Cancel));
    assert_eq!(peer.cancel(), None);
    assert!(peer.on_new_cell(1).is_err());
    // A reservation whose marker never comes, with cells held: the circuit must close.
    let (mut peer, _) = PeerSwitch::<u32>::accept(0, 0, 10, now, T);
    peer.on_new_cell(1).unwrap();
    assert_eq!(
        peer.handle_timeout(now + T - Duration::from_millis(1)),
        None
    );
    assert_eq!(peer.handle_timeout(now + T), Some(PeerDrop::CloseCircuit));
    assert!(matches!(
        peer.on_marker(SwitchMarker { seq: 0, cells: 0 }, 0),
        Err(ConnViolation::Unexpected(_))
    ));
}

#[test]
fn hostile_markers_and_acks_are_violations() {
    let now = Instant::now();
    // Wrong switch number, wrong count.
    let mut hb: HoldBack<u32> = HoldBack::new(2, 10, 4);
    assert_eq!(
        hb.on_marker(SwitchMarker { seq: 1, cells: 10 }),
        Err(ConnViolation::WrongSeq {
            expected: 2,
            got: 1
        })
    );
    assert_eq!(
        hb.on_marker(SwitchMarker { seq: 2, cells: 9 }),
        Err(ConnViolation::WrongCount {
            claimed: 9,
            received: 10
        })
    );
    hb.on_old_cell().unwrap();
    // Too many held.
    for c in 0..4 {
        assert_eq!(hb.on_new_cell(c), Ok(None));
    }
    assert_eq!(hb.on_new_cell(4), Err(ConnViolation::TooManyHeld(4)));
    assert_eq!(
        hb.on_marker(SwitchMarker { seq: 2, cells: 11 }),
        Ok(vec![0, 1, 2, 3])
    );
    // A replayed marker, or a cell on the old connection after it.
    assert_eq!(
        hb.on_marker(SwitchMarker { seq: 2, cells: 11 }),
        Err(ConnViolation::AfterMarker)
    );
    assert_eq!(hb.on_old_cell(), Err(ConnViolation::AfterMarker));
    // Acknowledgements: wrong number, twice.
    let mut mover: MoverSwitch<u32> = MoverSwitch::new(5, 0, 4, now, T);
    let ack = |seq| SwitchAck {
        seq,
        status: SwitchStatus::ACCEPTED,
    };
    assert!(matches!(
        mover.on_ack(ack(4), 0),
        Err(ConnViolation::WrongSeq { .. })
    ));
    assert!(matches!(
        mover.on_ack(ack(5), 0),
        Ok(AckOutcome::CutOver(_))
    ));
    assert!(matches!(
        mover.on_ack(ack(5), 0),
        Err(ConnViolation::Unexpected(_))
    ));
    // Backward cells on C2 before the mover cut over.
    let mut early: MoverSwitch<u32> = MoverSwitch::new(0, 0, 4, now, T);
    assert!(matches!(
        early.on_new_cell(1),
        Err(ConnViolation::Unexpected(_))
    ));
    // A second marker at the peer.
    let (mut peer, _) = PeerSwitch::<u32>::accept(0, 0, 4, now, T);
    peer.on_marker(SwitchMarker { seq: 0, cells: 0 }, 0)
        .unwrap();
    assert!(peer
        .on_marker(SwitchMarker { seq: 0, cells: 0 }, 0)
        .is_err());
    assert_eq!(
        peer.cancel(),
        None,
        "a DESTROY after the move is an ordinary DESTROY"
    );
}
