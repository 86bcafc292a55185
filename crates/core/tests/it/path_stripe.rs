//! `SwitchLegUse = stripe` through real cores (the network of `path_switching.rs`: home A =
//! E1, M1, X with the slow E1 -> M1 connection, spare B = E2, M2, X): the client's upload
//! goes on both legs at once, each cell on the leg with room and the lowest smoothed round
//! trip; the exit restores order. A striped leg that dies with cells of the stream on it ends
//! the stream cleanly (no silent stall).

use chive_core::switching::LegUse;
use chive_core::{CircKey, Event, StreamHandle, SwitchSettings};

use crate::path_switching::{Net, PathSwitching, CLIENT, E1, E2, M1, M2, X};
use crate::sim::pattern;

fn stripe(net: &mut Net) {
    stripe_capped(net, 0);
}

/// Stripe with `SwitchStripeLegCells = cap` (0: none).
fn stripe_capped(net: &mut Net, cap: u32) {
    stripe_moves(net, cap, 1);
}

/// Stripe with `SwitchStripeLegCells = cap` and `SwitchStripeMoves = moves`.
fn stripe_moves(net: &mut Net, cap: u32, moves: u32) {
    let s = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        leg_use: LegUse::Stripe,
        stripe_leg_cells: cap,
        stripe_moves: moves,
        ..s
    });
}

/// Upload `streams`; returns the most cells of stream `s` unacknowledged on A and on B, each
/// at any step (the per-leg peaks), and the most on both legs together at one step.
fn upload_peaks(
    net: &mut Net,
    streams: &[(StreamHandle, Vec<u8>)],
    s: StreamHandle,
    a: CircKey,
    b: CircKey,
) -> (u32, u32, u32) {
    let mut peak = (0, 0, 0);
    net.transfer(streams, 300_000, |_, net| {
        let c = &net.nodes[CLIENT];
        let on_a = c.stream_leg_in_flight(s, a).unwrap_or(0);
        let on_b = c.stream_leg_in_flight(s, b).unwrap_or(0);
        peak = (
            peak.0.max(on_a),
            peak.1.max(on_b),
            peak.2.max(on_a.min(on_b)),
        );
    });
    net.run(20_000);
    peak
}

/// Upload `streams`; returns the most cells of stream `s` unacknowledged on A and on B at
/// one step (the step where both were highest together by their minimum).
fn upload_watching(
    net: &mut Net,
    streams: &[(StreamHandle, Vec<u8>)],
    s: StreamHandle,
    a: CircKey,
    b: CircKey,
) -> (u32, u32) {
    let mut both = (0, 0);
    net.transfer(streams, 300_000, |_, net| {
        let c = &net.nodes[CLIENT];
        let on = (
            c.stream_leg_in_flight(s, a).unwrap_or(0),
            c.stream_leg_in_flight(s, b).unwrap_or(0),
        );
        if on.0.min(on.1) > both.0.min(both.1) {
            both = on;
        }
    });
    net.run(20_000);
    both
}

/// B as narrow as A (2 cells a step from its entry, A's 30-step delay aside): a leg's stream
/// window fills, and the upload needs the other leg too.
fn narrow_b(net: &mut Net) {
    net.set_budgets(&[(E2, M2, 2)]);
}

#[test]
fn striping_keeps_both_legs_loaded_and_the_bytes_arrive_in_order() {
    let mut net = Net::new();
    stripe(&mut net);
    let (a, b, s) = net.linked();
    narrow_b(&mut net);
    let streams = vec![(s, pattern(3_000_000, 21))];
    let both = upload_watching(&mut net, &streams, s, a, b);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    // Both legs carried the stream at the same time, each with a good part of its window.
    assert!(
        both.0 >= 100 && both.1 >= 100,
        "legs not used together: {both:?}"
    );
    let c = net.nodes[CLIENT].switch_stats();
    let x = net.nodes[X].switch_stats();
    assert!(c.stripe_moves >= 2, "{c:?}");
    assert!(c.switches >= 2, "{c:?}");
    assert_eq!((c.timed_out, c.failed, c.cells_lost), (0, 0, 0), "{c:?}");
    assert_eq!((x.violations, x.path_duplicates), (0, 0), "{x:?}");
    assert!(x.path_out_of_order > 0, "no reordering exercised: {x:?}");
}

/// `SwitchStripeLegCells = 80`: no leg ever holds more than 80 of the stream's cells
/// unacknowledged, both legs still carry it at once, and every byte arrives once, in order.
/// Without the cap the same upload parks far more on each leg (the first test's >= 100, and
/// up to the 500-cell window), which is what queues at the entries.
#[test]
fn a_per_leg_cap_bounds_each_legs_share_and_keeps_both_legs_in_use() {
    let mut capped = Net::new();
    stripe_capped(&mut capped, 80);
    let (a, b, s) = capped.linked();
    narrow_b(&mut capped);
    let streams = vec![(s, pattern(2_000_000, 27))];
    let (pa, pb, both) = upload_peaks(&mut capped, &streams, s, a, b);
    capped.assert_exact(&streams);
    assert_eq!(capped.killed(), 0);
    assert!(pa <= 80 && pb <= 80, "cap exceeded: A {pa}, B {pb}");
    assert!(both >= 40, "legs not used together: {both}");
    let c = capped.nodes[CLIENT].switch_stats();
    assert_eq!((c.timed_out, c.failed, c.cells_lost), (0, 0, 0), "{c:?}");
    assert_eq!(capped.nodes[X].switch_stats().violations, 0);

    // The same upload uncapped: some leg goes past 80 (the cap is what bounds it above).
    let mut open = Net::new();
    stripe(&mut open);
    let (a, b, s) = open.linked();
    narrow_b(&mut open);
    let streams = vec![(s, pattern(2_000_000, 27))];
    let (pa, pb, _) = upload_peaks(&mut open, &streams, s, a, b);
    open.assert_exact(&streams);
    assert!(pa.max(pb) > 80, "uncapped peaks A {pa}, B {pb}");
}

/// The same network with the paper's whole-stream move and no congestion report: the
/// upload never leaves A (what striping changes).
#[test]
fn without_striping_the_upload_stays_on_one_leg() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    narrow_b(&mut net);
    let streams = vec![(s, pattern(1_000_000, 22))];
    let both = upload_watching(&mut net, &streams, s, a, b);
    net.assert_exact(&streams);
    assert_eq!(both.0.min(both.1), 0, "{both:?}");
    assert_eq!(net.nodes[CLIENT].switch_stats().stripe_moves, 0);
}

/// Congestion control on (Vegas, XON/XOFF streams: no per-leg stream window): striping by the
/// legs' congestion windows alone still delivers every byte once, in order.
#[test]
fn striping_with_congestion_control_is_exact() {
    let mut net = Net::vegas();
    stripe(&mut net);
    let (_a, _b, s) = net.linked();
    let streams = vec![(s, pattern(2_000_000, 23))];
    net.transfer(&streams, 300_000, |_, _| {});
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let c = net.nodes[CLIENT].switch_stats();
    assert!(c.stripe_moves >= 2, "{c:?}");
    assert_eq!(net.nodes[X].switch_stats().violations, 0);
}

/// A congestion report moves nothing while striping (the scheduler already uses both legs).
#[test]
fn a_congestion_report_while_striping_moves_nothing() {
    let mut net = Net::new();
    stripe(&mut net);
    let (_a, _b, s) = net.linked();
    let streams = vec![(s, pattern(1_000_000, 24))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 400 {
            let c = net.chan(E1, M1);
            net.nodes[E1].congested(c, 0.0, net.now);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.congested_received, c.triggered), (1, 0), "{c:?}");
}

/// The spare dies while cells of the stream are on it: the client cannot know which of them
/// arrived and keeps no copy, so the stream ends cleanly (the application sees it close) and
/// the set with it; nothing waits for a gap forever.
#[test]
fn a_striped_leg_dying_mid_upload_ends_the_stream_cleanly() {
    let mut net = Net::new();
    stripe(&mut net);
    let (a, b, s) = net.linked();
    narrow_b(&mut net);
    let streams = vec![(s, pattern(3_000_000, 25))];
    let mut on_b = None;
    net.transfer(&streams, 20_000, |_, net| {
        let c = &net.nodes[CLIENT];
        if on_b.is_none() && c.stream_leg_in_flight(s, b).unwrap_or(0) >= 50 {
            on_b = c.stream_leg_in_flight(s, b);
            net.nodes[CLIENT].close_circuit(b, net.now);
        }
    });
    net.run(20_000);
    assert!(on_b.is_some(), "B never carried the stream");
    assert!(
        net.events.iter().any(|(n, e)| *n == CLIENT
            && matches!(e, Event::StreamClosed { stream, .. } if *stream == s)),
        "no StreamClosed for the stream"
    );
    assert_eq!(net.nodes[CLIENT].path_set_of(a), None);
    assert_eq!(net.nodes[CLIENT].stats().circuits, 0);
    assert!(net.nodes[CLIENT].switch_stats().failed >= 1);
}

/// A spare that closes before any cell of the stream was charged to it loses nothing: the
/// upload goes on on A alone, byte-exact.
#[test]
fn a_striped_leg_closing_with_nothing_on_it_loses_nothing() {
    let mut net = Net::new();
    stripe(&mut net);
    let (a, b, s) = net.linked();
    net.nodes[CLIENT].close_circuit(b, net.now);
    let streams = vec![(s, pattern(500_000, 26))];
    net.transfer(&streams, 300_000, |_, _| {});
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
}

/// Nothing comes back on B any more (its confirmations and SENDMEs are lost): each switch
/// onto B times out and re-sends its kept cells on A, but B stays linked (a late confirmation
/// is a slow leg while striping, not a dead one); once B's circuit window is used up the
/// scheduler finds no room there, and the upload finishes on A, every byte once, in order.
#[test]
fn a_late_confirmation_while_striping_resends_and_keeps_the_leg() {
    let mut net = Net::new();
    stripe(&mut net);
    let (a, b, s) = net.linked();
    net.blackhole(M2, E2);
    let streams = vec![(s, pattern(1_500_000, 27))];
    net.transfer(&streams, 300_000, |_, _| {});
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let c = net.nodes[CLIENT].switch_stats();
    assert!(c.timed_out >= 1 && c.cells_resent >= 1, "{c:?}");
    assert_eq!(c.cells_lost, 0, "{c:?}");
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(Some(b)));
    assert!(net.nodes[X].switch_stats().path_duplicates >= 1);
}

/// A capped upload with `SwitchStripeMoves = moves`: the steps it took, the per-leg peaks
/// and the client's switch counters; bytes exact, nothing killed.
fn capped_upload(moves: u32, cap: u32) -> (usize, (u32, u32, u32), chive_core::SwitchStats) {
    let mut net = Net::new();
    stripe_moves(&mut net, cap, moves);
    let (a, b, s) = net.linked();
    narrow_b(&mut net);
    let streams = vec![(s, pattern(1_500_000, 28))];
    let mut steps = 0;
    let mut peak = (0, 0, 0);
    net.transfer(&streams, 300_000, |i, net| {
        steps = i;
        let c = &net.nodes[CLIENT];
        let on_a = c.stream_leg_in_flight(s, a).unwrap_or(0);
        let on_b = c.stream_leg_in_flight(s, b).unwrap_or(0);
        peak = (
            peak.0.max(on_a),
            peak.1.max(on_b),
            peak.2.max(on_a.min(on_b)),
        );
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[X].switch_stats().violations, 0);
    (steps, peak, net.nodes[CLIENT].switch_stats())
}

/// `SwitchStripeMoves`: with one move at a time, a leg at its cap waits for the confirmation
/// of the move onto it (which crosses the slow leg's 30-step delay) while the other leg has
/// room; with up to 4 moves unconfirmed the stream goes back at once. The same capped upload
/// then finishes in clearly fewer steps, the cap still holds on every leg, and every byte
/// arrives once, in order, with no move timed out or failed.
#[test]
fn several_unconfirmed_moves_keep_a_capped_stream_from_waiting_on_confirmations() {
    let (one, p1, c1) = capped_upload(1, 60);
    let (four, p4, c4) = capped_upload(4, 60);
    eprintln!("moves 1: {one} steps {p1:?} {c1:?}\nmoves 4: {four} steps {p4:?} {c4:?}");
    assert!(p4.0 <= 60 && p4.1 <= 60, "cap exceeded: {p4:?}");
    assert!(p4.2 >= 30, "legs not used together: {p4:?}");
    for c in [&c1, &c4] {
        assert_eq!((c.timed_out, c.failed, c.cells_lost), (0, 0, 0), "{c:?}");
    }
    assert!(c4.stripe_moves > c1.stripe_moves, "{c1:?} {c4:?}");
    assert!(four * 10 < one * 9, "moves 4: {four} steps, moves 1: {one}");
}

/// `SwitchStripeMoves = 4` and B swallows everything sent on it (E2 -> M2 drops): a move onto
/// B released before its confirmation kept no copy, and nothing comes back on B, so at that
/// move's deadline the client ends the stream cleanly (the application sees it close) rather
/// than leave the exit waiting for a gap forever.
#[test]
fn a_released_move_onto_a_silent_leg_ends_the_stream_cleanly() {
    let mut net = Net::new();
    stripe_moves(&mut net, 60, 4);
    let (a, _b, s) = net.linked();
    net.blackhole(E2, M2);
    let streams = vec![(s, pattern(1_500_000, 29))];
    net.transfer(&streams, 60_000, |_, _| {});
    net.run(20_000);
    assert!(
        net.events.iter().any(|(n, e)| *n == CLIENT
            && matches!(e, Event::StreamClosed { stream, .. } if *stream == s)),
        "no StreamClosed for the stream"
    );
    assert_eq!(net.nodes[CLIENT].path_set_of(a), None);
    let c = net.nodes[CLIENT].switch_stats();
    assert!(c.timed_out >= 1 && c.failed >= 1, "{c:?}");
}
