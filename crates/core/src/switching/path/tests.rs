use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::*;

const A: CircKey = CircKey(1);
const B: CircKey = CircKey(2);
const C: CircKey = CircKey(3);

/// What travels on a leg: a SWITCH or a numbered cell (the number is the payload, so the
/// receiver's output can be checked against the sender's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Switch(u32),
    Cell(u64),
}

/// A sender, a receiver and one FIFO per leg (circuits deliver in order), delivered when the
/// test says so.
struct Net {
    tx: PathSender<u64>,
    rx: PathReceiver<u64>,
    wires: Vec<(CircKey, VecDeque<Msg>)>,
    out: Vec<u64>,
    now: Instant,
}

impl Net {
    fn new(limits: PathLimits) -> Net {
        let mut tx = PathSender::new(A, limits);
        let mut rx = PathReceiver::new(A, limits);
        tx.add_leg(B).unwrap();
        rx.add_leg(B).unwrap();
        Net {
            tx,
            rx,
            wires: vec![(A, VecDeque::new()), (B, VecDeque::new())],
            out: Vec::new(),
            now: Instant::now(),
        }
    }

    fn wire(&mut self, leg: CircKey) -> &mut VecDeque<Msg> {
        &mut self.wires.iter_mut().find(|(c, _)| *c == leg).unwrap().1
    }

    /// Send `n` cells; the payload is the number the sender gave each.
    fn send(&mut self, n: usize) {
        for _ in 0..n {
            let next = self.tx.sent() + 1;
            let o = self.tx.send(self.now, &next).unwrap();
            assert_eq!(o.seq, next);
            if let Some(sw) = o.switch {
                assert_eq!(sw.leg, o.leg);
                self.wire(o.leg).push_back(Msg::Switch(sw.relative_seq));
            }
            self.wire(o.leg).push_back(Msg::Cell(o.seq));
        }
    }

    fn resend(&mut self, f: Fallback<u64>) -> CircKey {
        match f {
            Fallback::Resend {
                switch,
                cells,
                abandoned,
            } => {
                let leg = self.tx.current().unwrap();
                if let Some(sw) = switch {
                    assert_eq!(sw.leg, leg);
                    self.wire(leg).push_back(Msg::Switch(sw.relative_seq));
                }
                for (seq, payload) in cells {
                    assert_eq!(seq, payload);
                    self.wire(leg).push_back(Msg::Cell(seq));
                }
                abandoned
            }
            Fallback::Failed { .. } => panic!("expected a resend"),
        }
    }

    /// Deliver up to `n` messages of `leg` to the receiver; returns confirmations produced.
    fn deliver(&mut self, leg: CircKey, n: usize) -> Vec<(CircKey, u64)> {
        let mut confirms = Vec::new();
        for _ in 0..n {
            let Some(m) = self.wire(leg).pop_front() else {
                break;
            };
            match m {
                Msg::Switch(rel) => self.rx.on_switch(leg, rel).unwrap(),
                Msg::Cell(seq) => {
                    self.rx.on_cell(leg, seq).unwrap();
                }
            }
            while let Some(c) = self.rx.poll_confirm() {
                confirms.push(c);
            }
            while let Some(v) = self.rx.poll_deliver() {
                self.out.push(v);
            }
        }
        confirms
    }

    fn expect_out(&self, n: u64) {
        assert_eq!(self.out, (1..=n).collect::<Vec<_>>());
    }
}

#[test]
fn one_leg_delivers_in_order_without_switch() {
    let mut net = Net::new(PathLimits::default());
    net.send(5);
    assert_eq!(net.wire(A).len(), 5, "no SWITCH on the first leg");
    assert!(net.deliver(A, 10).is_empty());
    net.expect_out(5);
    assert!(!net.tx.is_pending());
}

#[test]
fn a_switch_reorders_cells_that_overtake_the_old_leg() {
    let mut net = Net::new(PathLimits::default());
    net.send(10);
    let t_switch = net.now;
    net.tx.switch_to(B, net.now).unwrap();
    assert!(net.tx.next_deadline().is_none(), "not announced yet");
    net.send(10);
    assert_eq!(net.wire(B).front(), Some(&Msg::Switch(10)));
    // The new leg is faster: everything on B arrives first and waits.
    let confirms = net.deliver(B, 100);
    assert_eq!(confirms, vec![(B, 10)]);
    assert!(net.out.is_empty());
    assert_eq!(net.rx.buffered(), 10);
    net.deliver(A, 100);
    net.expect_out(20);
    assert_eq!(net.rx.buffered(), 0);
    assert_eq!(
        net.tx.on_confirm(B, 10),
        Ok(ConfirmOutcome::Confirmed {
            triggered_at: t_switch
        })
    );
    assert!(!net.tx.is_pending());
    assert_eq!(net.tx.on_confirm(B, 10), Ok(ConfirmOutcome::Stale));
    // Switching back: the relative number covers what B carried.
    net.tx.switch_to(A, net.now).unwrap();
    net.send(3);
    assert_eq!(net.wire(A).front(), Some(&Msg::Switch(10)));
    net.deliver(A, 100);
    net.expect_out(23);
}

#[test]
fn missing_confirmation_falls_back_and_the_late_copies_are_dropped() {
    let limits = PathLimits::default();
    let mut net = Net::new(limits);
    net.send(5);
    net.deliver(A, 100);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(3); // 6..8 on B, which stalls
    let deadline = net.tx.next_deadline().unwrap();
    assert_eq!(deadline, net.now + limits.confirm_timeout);
    assert!(net
        .tx
        .handle_timeout(deadline - Duration::from_millis(1))
        .is_none());
    let f = net
        .tx
        .handle_timeout(deadline)
        .expect("fallback at the deadline");
    assert_eq!(net.resend(f), B);
    assert_eq!(net.tx.current(), Some(A));
    assert_eq!(net.wire(A).front(), Some(&Msg::Switch(0)), "A resumes at 6");
    net.deliver(A, 100);
    net.expect_out(8);
    // B's stalled copies arrive after all: dropped, never delivered twice.
    let confirms = net.deliver(B, 100);
    assert_eq!(confirms, vec![(B, 5)]);
    assert_eq!(net.rx.duplicates(), 3);
    net.expect_out(8);
    // A late confirmation for the abandoned switch is stale, not an error.
    assert_eq!(net.tx.on_confirm(B, 5), Ok(ConfirmOutcome::Stale));
    // The stream goes on, on A; and B can be used again with consistent numbers.
    net.send(2);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(2);
    net.deliver(A, 100);
    net.deliver(B, 100);
    net.expect_out(12);
}

#[test]
fn new_leg_closing_falls_back_at_once() {
    let mut net = Net::new(PathLimits::default());
    net.send(2);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(2);
    net.wire(B).clear(); // lost with the circuit
    let f = net.tx.leg_closed(B).expect("fallback");
    net.rx.leg_closed(B);
    net.resend(f);
    net.deliver(A, 100);
    net.expect_out(4);
    assert_eq!(net.tx.switch_to(B, net.now), Err(SwitchError::NotALeg));
}

#[test]
fn fallback_without_the_old_leg_fails_cleanly() {
    let mut net = Net::new(PathLimits::default());
    net.send(2);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(3);
    // The old leg closes while the switch is unconfirmed: nothing to do yet.
    assert_eq!(net.tx.leg_closed(A), None);
    let deadline = net.tx.next_deadline().unwrap();
    assert_eq!(
        net.tx.handle_timeout(deadline),
        Some(Fallback::Failed { unconfirmed: 3 })
    );
    assert_eq!(net.tx.send(net.now, &0), Err(SendError::NoLeg));
    assert_eq!(net.tx.current(), None);
}

#[test]
fn the_current_leg_closing_without_a_switch_fails() {
    let mut net = Net::new(PathLimits::default());
    net.send(2);
    assert_eq!(
        net.tx.leg_closed(A),
        Some(Fallback::Failed { unconfirmed: 0 })
    );
    assert_eq!(net.tx.leg_closed(A), None, "already gone");
    assert_eq!(net.tx.leg_closed(C), None, "never a leg");
}

#[test]
fn idle_switches_announce_nothing_and_may_be_redirected() {
    let mut net = Net::new(PathLimits::default());
    net.send(1);
    net.tx.switch_to(B, net.now).unwrap();
    // Back to A before any cell: nothing was announced, no SWITCH is needed.
    net.tx.switch_to(A, net.now).unwrap();
    assert!(!net.tx.is_pending());
    net.send(1);
    assert_eq!(net.wire(A).len(), 2);
    assert_eq!(
        net.tx.switch_to(A, net.now),
        Err(SwitchError::AlreadyCurrent)
    );
    assert_eq!(net.tx.switch_to(C, net.now), Err(SwitchError::NotALeg));
    net.tx.switch_to(B, net.now).unwrap();
    net.send(1);
    assert_eq!(net.tx.switch_to(A, net.now), Err(SwitchError::Unconfirmed));
    net.deliver(A, 10);
    net.deliver(B, 10);
    net.expect_out(3);
}

#[test]
fn sending_blocks_at_the_unconfirmed_limit() {
    let limits = PathLimits {
        max_unconfirmed: 4,
        ..PathLimits::default()
    };
    let mut net = Net::new(limits);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(4);
    assert_eq!(net.tx.send(net.now, &5), Err(SendError::Blocked));
    let confirms = net.deliver(B, 100);
    assert_eq!(confirms, vec![(B, 0)]);
    assert!(matches!(
        net.tx.on_confirm(B, 0),
        Ok(ConfirmOutcome::Confirmed { .. })
    ));
    net.send(1);
    net.deliver(B, 100);
    net.expect_out(5);
}

#[test]
fn a_zero_limit_still_announces_and_times_out() {
    let limits = PathLimits {
        max_unconfirmed: 0,
        ..PathLimits::default()
    };
    let mut net = Net::new(limits);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(1);
    assert_eq!(net.tx.send(net.now, &2), Err(SendError::Blocked));
    let deadline = net.tx.next_deadline().expect("announced");
    let f = net.tx.handle_timeout(deadline).unwrap();
    net.resend(f);
    net.deliver(A, 10);
    net.expect_out(1);
}

/// The defaults: two legs may buffer 1000 + 2 × 2000 + 256 cells, and numbers may run one
/// more window per leg ahead.
#[test]
fn the_bounds_follow_the_number_of_legs() {
    let l = PathLimits::default();
    assert_eq!(l.max_buffered(2), 5256);
    assert_eq!(l.window(2), 9256);
    assert_eq!(l.max_buffered(4), 9256);
    assert!(l.max_buffered(1) < l.max_buffered(2));
}

/// From `withhold_above` buffered cells on, the legs that are ahead (whose cells can only be
/// buffered) have their SENDMEs withheld; the leg that holds the gap never does, and when the
/// gap fills the withholding ends.
#[test]
fn sendmes_are_withheld_on_the_leg_ahead_while_the_buffer_is_high() {
    let limits = PathLimits {
        withhold_above: 10,
        max_leg_window: 20,
        unwindowed_slack: 0,
        ..PathLimits::default()
    };
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    // 1..=5 are on A (slow); B carries 6.. .
    rx.on_switch(B, 5).unwrap();
    for seq in 6..=14 {
        rx.on_cell(B, seq).unwrap();
        assert!(!rx.withholds(B), "below the threshold at {seq}");
    }
    rx.on_cell(B, 15).unwrap();
    assert_eq!(rx.buffered(), 10);
    assert!(rx.withholds(B));
    assert!(!rx.withholds(A), "A holds the gap");
    assert!(!rx.withholds(C), "not a leg");
    for seq in 1..=4 {
        rx.on_cell(A, seq).unwrap();
    }
    assert!(rx.withholds(B), "the gap (5) is still open");
    rx.on_cell(A, 5).unwrap();
    assert_eq!(rx.buffered(), 0);
    assert!(!rx.withholds(B));
    let out: Vec<u64> = std::iter::from_fn(|| rx.poll_deliver()).collect();
    assert_eq!(out, (1..=15).collect::<Vec<_>>());
    // A leg that announced a jump is ahead too, before its first cell.
    rx.on_switch(A, 20).unwrap();
    for seq in 37..=46 {
        rx.on_cell(A, seq).unwrap();
    }
    assert!(rx.withholds(A) && !rx.withholds(B));
}

/// A sender that ignores the withheld SENDMEs fills the buffer to
/// `withhold_above + legs × max_leg_window + unwindowed_slack`; one more cell is a violation.
/// (Spread over three legs ahead: one leg alone trips its own bound first, see below.) The
/// next number is never refused (it empties the buffer).
#[test]
fn a_buffer_beyond_what_an_honest_sender_can_cause_is_a_violation() {
    const D: CircKey = CircKey(4);
    let limits = PathLimits {
        withhold_above: 10,
        max_leg_window: 20,
        unwindowed_slack: 5,
        ..PathLimits::default()
    };
    assert_eq!(limits.max_buffered(4), 95);
    assert_eq!(limits.max_buffered_per_leg(), 35);
    let fill = |rx: &mut PathReceiver<u64>| {
        for leg in [B, C, D] {
            rx.add_leg(leg).unwrap();
        }
        // B carries 2..=36, C 37..=71, D 72..=96 (25 of its 35): 95 buffered.
        for (leg, from, to) in [(B, 2u64, 36u64), (C, 37, 71), (D, 72, 96)] {
            rx.on_switch(leg, u32::try_from(from - 1).unwrap()).unwrap();
            for seq in from..=to {
                assert_eq!(rx.on_cell(leg, seq), Ok(Arrival::Accepted), "{seq}");
            }
        }
    };
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    fill(&mut rx);
    assert_eq!(rx.buffered(), 95);
    assert_eq!(
        rx.on_cell(D, 97),
        Err(SeqViolation::BufferFull {
            buffered: 96,
            limit: 95
        })
    );
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    fill(&mut rx);
    assert_eq!(rx.on_cell(A, 1), Ok(Arrival::Accepted));
    assert_eq!(std::iter::from_fn(|| rx.poll_deliver()).count(), 96);
}

/// One leg's cells held out of order are bounded on their own: they got circuit SENDMEs only
/// while the whole buffer was below `withhold_above`, then one leg window more at most
/// (`max_buffered_per_leg`, 35 here). The 36th held cell of that leg is a violation although
/// the set's bound (55 for two legs) is far; once the gap fills the count starts again.
#[test]
fn one_legs_cells_held_beyond_its_bound_are_a_violation() {
    let limits = PathLimits {
        withhold_above: 10,
        max_leg_window: 20,
        unwindowed_slack: 5,
        ..PathLimits::default()
    };
    let flood = |rx: &mut PathReceiver<u64>, from: u64| {
        for seq in from..from + 35 {
            assert_eq!(rx.on_cell(B, seq), Ok(Arrival::Accepted), "{seq}");
        }
    };
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    rx.on_switch(B, 1).unwrap();
    flood(&mut rx, 2);
    assert_eq!((rx.held_on(B), rx.held_on(A)), (35, 0));
    assert_eq!(
        rx.on_cell(B, 37),
        Err(SeqViolation::LegBufferFull {
            held: 36,
            limit: 35
        })
    );
    // Honest: the gap fills, B's count drops to 0, and B may run ahead again.
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    rx.on_switch(B, 1).unwrap();
    flood(&mut rx, 2);
    assert_eq!(rx.on_cell(A, 1), Ok(Arrival::Accepted));
    assert_eq!(rx.held_on(B), 0);
    rx.on_switch(A, 35).unwrap();
    rx.on_cell(A, 37).unwrap();
    // B jumps past 38 (still to come on A): 39.. are held again.
    rx.on_switch(B, 2).unwrap();
    flood(&mut rx, 39);
    assert_eq!(rx.held_on(B), 35);
}

#[test]
fn hostile_switches_are_violations() {
    // Window and buffer bound both 100 cells.
    let limits = PathLimits {
        withhold_above: 100,
        max_leg_window: 0,
        unwindowed_slack: 0,
        ..PathLimits::default()
    };
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    assert_eq!(rx.add_leg(B), Err(LegError::Duplicate));
    // A jump past the window.
    assert!(matches!(
        rx.on_switch(B, 100),
        Err(SeqViolation::BeyondWindow { seq: 101, .. })
    ));
    assert!(matches!(
        rx.on_switch(B, u32::MAX),
        Err(SeqViolation::BeyondWindow { .. })
    ));
    // The largest jump inside it is fine; a second SWITCH in a row is not.
    rx.on_switch(B, 99).unwrap();
    assert_eq!(rx.on_switch(B, 0), Err(SeqViolation::RepeatedSwitch));
    // A SWITCH or cell on a circuit that is not a leg.
    assert_eq!(rx.on_switch(C, 0), Err(SeqViolation::NotALeg(C)));
    assert_eq!(rx.on_cell(C, 0), Err(SeqViolation::NotALeg(C)));
    // The window is [1, 101): B's cell 100 is buffered, cell 101 is beyond it.
    assert_eq!(rx.on_cell(B, 100), Ok(Arrival::Accepted));
    assert!(matches!(
        rx.on_cell(B, 101),
        Err(SeqViolation::BeyondWindow {
            seq: 101,
            next: 1,
            ..
        })
    ));
    assert_eq!(rx.buffered(), 1);
    assert_eq!(rx.poll_deliver(), None);
}

#[test]
fn a_hostile_peer_cannot_grow_the_buffer_or_deliver_twice() {
    let limits = PathLimits {
        withhold_above: 64,
        max_leg_window: 0,
        unwindowed_slack: 0,
        ..PathLimits::default()
    };
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    // Leg B claims numbers 2.. while 1 never comes on A: the buffer stops at the window.
    rx.on_switch(B, 1).unwrap();
    let mut accepted = 0;
    for i in 0..1000u64 {
        match rx.on_cell(B, i) {
            Ok(Arrival::Accepted) => accepted += 1,
            Ok(Arrival::Duplicate) => panic!("no duplicate here"),
            Err(SeqViolation::BeyondWindow { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(accepted, 63, "numbers 2..=64: the window is [1, 65)");
    assert!(rx.buffered() <= 64);
    // Replays: B re-announces numbers A already delivered.
    let mut rx: PathReceiver<u64> = PathReceiver::new(A, limits);
    rx.add_leg(B).unwrap();
    for i in 1..=3 {
        rx.on_cell(A, i).unwrap();
    }
    rx.on_switch(B, 0).unwrap();
    for i in 1..=3 {
        assert_eq!(rx.on_cell(B, i), Ok(Arrival::Duplicate));
    }
    let out: Vec<u64> = std::iter::from_fn(|| rx.poll_deliver()).collect();
    assert_eq!(out, vec![1, 2, 3]);
    assert_eq!(rx.duplicates(), 3);
}

#[test]
fn hostile_confirmations() {
    let mut tx: PathSender<u64> = PathSender::new(A, PathLimits::default());
    tx.add_leg(B).unwrap();
    assert_eq!(tx.add_leg(A), Err(LegError::Duplicate));
    tx.add_leg(C).unwrap();
    tx.add_leg(CircKey(4)).unwrap();
    assert_eq!(tx.add_leg(CircKey(5)), Err(LegError::TooMany));
    let now = Instant::now();
    tx.send(now, &1).unwrap();
    assert_eq!(
        tx.on_confirm(B, 2),
        Err(SeqViolation::ConfirmsUnsent { seq: 2, sent: 1 })
    );
    assert_eq!(
        tx.on_confirm(CircKey(9), 0),
        Err(SeqViolation::NotALeg(CircKey(9)))
    );
    assert_eq!(
        tx.on_confirm(B, 1),
        Ok(ConfirmOutcome::Stale),
        "nothing pending"
    );
    tx.switch_to(B, now).unwrap();
    tx.send(now, &2).unwrap();
    // The right leg with the wrong number, or the wrong leg: stale, the switch stays pending.
    assert_eq!(tx.on_confirm(B, 0), Ok(ConfirmOutcome::Stale));
    assert_eq!(tx.on_confirm(C, 1), Ok(ConfirmOutcome::Stale));
    assert!(tx.is_pending());
    assert!(matches!(
        tx.on_confirm(B, 1),
        Ok(ConfirmOutcome::Confirmed { .. })
    ));
}

/// A small deterministic generator (no dependency, same sequence on every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn random_switches_and_deliveries_are_exactly_once_in_order() {
    let (mut fallbacks, mut confirmed, mut duplicates) = (0, 0, 0);
    for seed in 0..200 {
        let mut rng = Lcg(seed);
        let mut net = Net::new(PathLimits::default());
        let mut t = net.now;
        for _ in 0..300 {
            match rng.next(10) {
                0 => {
                    let other = if net.tx.current() == Some(A) { B } else { A };
                    let _ = net.tx.switch_to(other, t);
                }
                1 => {
                    // Time passes: an unconfirmed switch may time out.
                    t += Duration::from_millis(700);
                    if let Some(f) = net.tx.handle_timeout(t) {
                        net.resend(f);
                        fallbacks += 1;
                    }
                }
                2 | 3 => {
                    let leg = if rng.next(2) == 0 { A } else { B };
                    let n = rng.next(5) as usize;
                    for (l, s) in net.deliver(leg, n) {
                        if let ConfirmOutcome::Confirmed { .. } = net.tx.on_confirm(l, s).unwrap() {
                            confirmed += 1;
                        }
                    }
                }
                _ => {
                    net.now = t;
                    match net.tx.send(t, &(net.tx.sent() + 1)) {
                        Ok(o) => {
                            if let Some(sw) = o.switch {
                                net.wire(o.leg).push_back(Msg::Switch(sw.relative_seq));
                            }
                            net.wire(o.leg).push_back(Msg::Cell(o.seq));
                        }
                        Err(SendError::Blocked) => {}
                        Err(e) => panic!("seed {seed}: {e}"),
                    }
                }
            }
        }
        // Drain everything.
        net.deliver(A, usize::MAX);
        net.deliver(B, usize::MAX);
        let sent = net.tx.sent();
        assert_eq!(
            net.out,
            (1..=sent).collect::<Vec<_>>(),
            "seed {seed}: every number once, in order"
        );
        assert!(net.rx.buffered() == 0, "seed {seed}");
        duplicates += net.rx.duplicates();
    }
    // The runs exercised what they are meant to.
    assert!(
        fallbacks > 50 && confirmed > 50 && duplicates > 50,
        "{fallbacks} {confirmed} {duplicates}"
    );
}

#[test]
fn confirm_timeout_is_a_multiple_of_the_round_trip_above_a_floor() {
    let floor = Duration::from_secs(2);
    assert_eq!(confirm_timeout(floor, 4, None), floor, "nothing measured");
    assert_eq!(
        confirm_timeout(floor, 4, Some(Duration::from_millis(100))),
        floor,
        "a fast path keeps the floor"
    );
    assert_eq!(
        confirm_timeout(floor, 4, Some(Duration::from_millis(1500))),
        Duration::from_secs(6)
    );
    assert_eq!(
        confirm_timeout(floor, 0, Some(Duration::from_secs(5))),
        floor
    );
    assert_eq!(
        confirm_timeout(floor, 4, Some(Duration::from_secs(3600))),
        MAX_RTT_CONFIRM_TIMEOUT
    );
    let big = Duration::from_secs(100);
    assert_eq!(confirm_timeout(big, 4, Some(Duration::from_secs(30))), big);
}

#[test]
fn set_rtt_takes_the_slowest_leg_and_its_latest_sample() {
    let mut r = SetRtt::default();
    assert_eq!(r.estimate(), None);
    r.sample(A, Duration::from_millis(200));
    r.sample(B, Duration::from_millis(400));
    assert_eq!(r.estimate(), Some(Duration::from_millis(400)));
    // A's backlog grows: its latest sample counts at once, the smoothed value follows.
    r.sample(A, Duration::from_millis(2000));
    assert_eq!(r.smoothed(A), Some(Duration::from_millis(425)));
    assert_eq!(r.estimate(), Some(Duration::from_millis(2000)));
    r.sample(A, Duration::from_millis(200));
    assert_eq!(
        r.estimate(),
        Some(Duration::from_millis(400)),
        "B's smoothed value"
    );
    r.leg_closed(B);
    assert_eq!(
        r.estimate(),
        Some(Duration::from_micros(396_875)), // (425 × 7 + 200) / 8 ms
        "A's smoothed value"
    );
    r.leg_closed(A);
    assert_eq!(r.estimate(), None);
}

#[test]
fn a_longer_timeout_moves_the_waiting_switchs_deadline() {
    let limits = PathLimits::default();
    let mut net = Net::new(limits);
    net.send(5);
    net.deliver(A, 100);
    net.tx.switch_to(B, net.now).unwrap();
    let announced = net.now;
    net.send(3);
    assert_eq!(net.tx.announced_at(), Some(announced));
    assert_eq!(
        net.tx.next_deadline(),
        Some(announced + limits.confirm_timeout)
    );
    // A round trip measured meanwhile says the confirmation may take longer.
    net.tx.set_confirm_timeout(Duration::from_secs(8));
    assert_eq!(
        net.tx.next_deadline(),
        Some(announced + Duration::from_secs(8))
    );
    assert!(net
        .tx
        .handle_timeout(announced + Duration::from_secs(7))
        .is_none());
    let confirms = net.deliver(B, 100);
    assert_eq!(confirms, vec![(B, 5)]);
    let (leg, seq) = confirms[0];
    assert!(matches!(
        net.tx.on_confirm(leg, seq),
        Ok(ConfirmOutcome::Confirmed { .. })
    ));
    assert_eq!(net.tx.next_deadline(), None);
    net.expect_out(8);
}

/// The lighter-leg rule on round trips fed in order, as SENDMEs would bring them: two idle
/// legs (LINK samples only) tie, and a tie does not hold the client on the reported leg; the
/// way back to a leg left loaded stays closed while the leg in use measures lighter, and opens
/// once that leg grows heavier.
#[test]
fn a_leg_is_heavier_only_when_its_round_trip_is_clearly_higher() {
    let ms = Duration::from_millis;
    let mut rtt = SetRtt::default();
    // Nothing measured: nothing says heavier.
    assert!(!rtt.heavier(B, A));
    rtt.sample(A, ms(80));
    rtt.sample(B, ms(80)); // both LINKs on idle paths
    assert!(!rtt.heavier(B, A) && !rtt.heavier(A, B), "idle legs tie");
    for _ in 0..20 {
        rtt.sample(A, ms(900)); // A loaded
    }
    assert!(!rtt.heavier(B, A), "the idle spare is not heavier");
    assert!(rtt.heavier(A, B), "the loaded leg is");
    // On B now, which loads up to about A's estimate: within 10 %, neither is heavier.
    for _ in 0..40 {
        rtt.sample(B, ms(850));
    }
    assert!(!rtt.heavier(A, B) && !rtt.heavier(B, A));
    // B a little lighter than A was left at: going back to A is vetoed only past 10 %.
    for _ in 0..40 {
        rtt.sample(B, ms(700));
    }
    assert!(rtt.heavier(A, B));
    // B grows heavier than A was left at: A is no longer heavier.
    for _ in 0..40 {
        rtt.sample(B, ms(1500));
    }
    assert!(!rtt.heavier(A, B));
    // A leg closed is forgotten (unmeasured: not heavier).
    rtt.sample(B, ms(100));
    rtt.leg_closed(A);
    assert!(!rtt.heavier(A, B));
}

/// A probe's round trip replaces a leg's estimate (smoothed and latest); `now` is the larger
/// of the two; a probe may take 1.1 × the current leg's `now`, at least `PROBE_MIN_WAIT`, and
/// the answer compares `now` against `now` with the same 10 % margin as `heavier`.
#[test]
fn a_probe_replaces_the_stale_estimate_and_sets_the_wait() {
    let ms = Duration::from_millis;
    let mut rtt = SetRtt::default();
    assert_eq!(
        rtt.probe_wait(A),
        None,
        "unmeasured: nothing to compare with"
    );
    rtt.link_sample(A, ms(100));
    assert_eq!(
        rtt.probe_wait(A),
        None,
        "only its LINK: the idle network's round trip"
    );
    rtt.sample(A, ms(180)); // smoothed 110, latest 180: carried data
    assert_eq!(rtt.now(A), Some(ms(180)));
    assert_eq!(rtt.probe_wait(A), Some(ms(198)));
    rtt.sample(B, ms(900)); // B's stale estimate: heavy
    assert!(rtt.heavier(B, A) && rtt.heavier_now(B, A));
    rtt.probed(B, ms(150));
    assert_eq!(
        (rtt.smoothed(B), rtt.now(B)),
        (Some(ms(150)), Some(ms(150)))
    );
    assert!(!rtt.heavier_now(B, A));
    rtt.probed(B, ms(199));
    assert!(rtt.heavier_now(B, A), "more than 1.1 × 180 ms");
    rtt.probed(C, ms(1)); // a leg first measured by a probe
    assert_eq!(rtt.now(C), Some(ms(1)));
    let mut fast = SetRtt::default();
    fast.sample(A, ms(1));
    assert_eq!(fast.probe_wait(A), Some(PROBE_MIN_WAIT));
}

/// `max_moves` = 3 (striping's `SwitchStripeMoves`): the sender moves A → B → A → B without
/// waiting for a confirmation, each earlier move released; a fourth move waits (the bound);
/// whatever order the legs deliver in, the receiver puts every number out once, in order,
/// and each confirmation is matched to its move.
#[test]
fn released_moves_alternate_legs_without_waiting_and_stay_in_order() {
    let limits = PathLimits {
        max_moves: 3,
        ..PathLimits::default()
    };
    let mut net = Net::new(limits);
    net.send(10);
    for to in [B, A, B] {
        assert!(net.tx.may_switch());
        net.tx.switch_to(to, net.now).unwrap();
        net.send(10);
    }
    assert_eq!(net.tx.released(), 2);
    assert!(!net.tx.may_switch());
    assert_eq!(
        net.tx.switch_to(A, net.now),
        Err(SwitchError::Unconfirmed),
        "a fourth unconfirmed move is beyond the bound"
    );
    // With one move at a time the second move already waits.
    let mut one = Net::new(PathLimits::default());
    one.send(1);
    one.tx.switch_to(B, one.now).unwrap();
    one.send(1);
    assert_eq!(one.tx.switch_to(A, one.now), Err(SwitchError::Unconfirmed));

    // B (cells 11..=20 and 31..=40) arrives before A: held, then released in order.
    let mut confirms = net.deliver(B, 100);
    assert!(net.out.is_empty());
    confirms.extend(net.deliver(A, 100));
    net.expect_out(40);
    assert_eq!(confirms, vec![(B, 10), (B, 30), (A, 20)]);
    let outcomes: Vec<_> = confirms
        .iter()
        .map(|&(leg, seq)| net.tx.on_confirm(leg, seq).unwrap())
        .collect();
    assert!(matches!(
        outcomes[0],
        ConfirmOutcome::Released(Released { from: A, .. })
    ));
    assert!(matches!(outcomes[1], ConfirmOutcome::Confirmed { .. }));
    assert!(matches!(
        outcomes[2],
        ConfirmOutcome::Released(Released { from: B, .. })
    ));
    assert_eq!(net.tx.released(), 0);
    assert!(!net.tx.is_pending());
    assert!(net.tx.may_switch());
    // A confirmation replayed: nothing left to match.
    assert_eq!(net.tx.on_confirm(B, 10), Ok(ConfirmOutcome::Stale));
}

/// A released move unconfirmed at its deadline leaves the sender (its slot frees; the caller
/// judges its leg); the latest move still falls back with its kept cells onto the leg the
/// released move went to, which carried every number before them, and the receiver delivers
/// each number once, in order.
#[test]
fn a_released_move_expires_and_the_latest_still_falls_back_exactly() {
    let limits = PathLimits {
        max_moves: 2,
        ..PathLimits::default()
    };
    let mut net = Net::new(limits);
    net.send(5);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(5);
    let b_announced = net.now;
    net.now += Duration::from_millis(500);
    net.tx.switch_to(A, net.now).unwrap();
    net.send(5);
    assert!(!net.tx.may_switch());
    assert_eq!(
        net.tx.next_deadline(),
        Some(b_announced + limits.confirm_timeout),
        "the released move's deadline comes first"
    );
    net.now = b_announced + limits.confirm_timeout;
    assert!(
        net.tx.handle_timeout(net.now).is_none(),
        "the latest is not due"
    );
    let gone = net.tx.expire_released(net.now);
    assert_eq!(gone.len(), 1);
    assert_eq!((gone[0].to, gone[0].from, gone[0].base), (B, A, 5));
    assert!(net.tx.may_switch());
    // The latest move (onto A, cells 11..=15) falls back to B.
    net.now += Duration::from_millis(500);
    let fb = net.tx.handle_timeout(net.now).unwrap();
    assert_eq!(net.resend(fb), A);
    assert_eq!(net.tx.current(), Some(B));
    net.deliver(A, 100);
    net.deliver(B, 100);
    net.expect_out(15);
    assert_eq!(net.rx.duplicates(), 5, "the resent copies arrived second");
}

/// A closing leg takes its released moves with it (they can no longer be confirmed).
#[test]
fn a_closing_leg_drops_its_released_moves() {
    let limits = PathLimits {
        max_moves: 2,
        ..PathLimits::default()
    };
    let mut net = Net::new(limits);
    net.send(1);
    net.tx.switch_to(B, net.now).unwrap();
    net.send(1);
    net.tx.switch_to(A, net.now).unwrap();
    net.send(1);
    assert_eq!(net.tx.released(), 1);
    assert!(
        net.tx.leg_closed(B).is_none(),
        "A, the latest move's leg, goes on"
    );
    assert_eq!(net.tx.released(), 0);
}
