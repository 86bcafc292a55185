//! Circuit switching, path variant (paper 003 section 4.3.2, issue 16), through real cores: a
//! client, two entries E1 / E2, two middles M1 / M2 and one exit X in memory, links with a
//! per-step write budget and a delay, simulated time (1 ms per step). The client's home
//! circuit A = E1, M1, X is linked to a spare B = E2, M2, X; E1's connection to M1 is slow.
//! E1's congestion report makes the client move its upload to B; cells on B overtake older
//! cells still crawling through A, and the exit must put them back in order. Then the
//! failures: no confirmation (fallback with resend), a dead spare, the home circuit gone.

use std::time::Duration;

use chive_core::cc::{CcKind, VegasParams};
use chive_core::{
    CircKey, CoreConfig, Event, SchedulerKind, StreamHandle, SwitchMode, SwitchOutcome,
    SwitchRecord, SwitchSettings,
};

use crate::sim::{pattern, Shape, Sim};

pub(crate) const CLIENT: usize = 0;
pub(crate) const E1: usize = 1;
pub(crate) const M1: usize = 2;
pub(crate) const E2: usize = 3;
pub(crate) const M2: usize = 4;
pub(crate) const X: usize = 5;

/// A client and five relays (all exits, EWMA, path switching on); links of 32 cells a step and
/// 2 steps of delay, E1 -> M1 the slow, congested connection (2 cells a step, 30 steps).
pub(crate) type Net = Sim;

pub(crate) trait PathSwitching {
    fn new() -> Self;
    /// The same network with `cc_alg = 2` (Vegas) on every node: streams use XON/XOFF.
    fn vegas() -> Self;
    /// A circuit through the nodes `path`.
    fn build(&mut self, path: [usize; 3]) -> CircKey;
    fn linked(&mut self) -> (CircKey, CircKey, StreamHandle);
    fn transfer(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        at: impl FnMut(usize, &mut Net),
    );
    fn assert_exact(&self, streams: &[(StreamHandle, Vec<u8>)]);
    fn congest_e1(&mut self) -> Option<CircKey>;
    fn congested_upload(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        congest_at: usize,
    ) -> Option<CircKey>;
    fn switched_upload(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        congest_at: usize,
        a: CircKey,
        b: CircKey,
    );
}

/// A client and five relays (all exits, EWMA, path switching on), `cc` on every node.
pub(crate) fn path_net(cc: CcKind) -> Net {
    let mut sim = Sim::overlay(
        29,
        vec![CoreConfig {
            congestion_control: cc,
            ..CoreConfig::default()
        }],
        5,
        |_| CoreConfig {
            exit: true,
            scheduler: SchedulerKind::Ewma { halflife: 30.0 },
            congestion_control: cc,
            ..CoreConfig::default()
        },
    );

    for core in &mut sim.nodes[1..] {
        core.set_switching(SwitchSettings {
            mode: SwitchMode::Path,
            timeout: Duration::from_millis(2000),
            ..SwitchSettings::default()
        });
    }
    // These tests drive the switch itself on the report alone; measuring the other leg first
    // (LEG_PROBE) is path_probe.rs's.
    let client = sim.nodes[0].switching();
    sim.nodes[0].set_switching(SwitchSettings {
        probe_legs: false,
        ..client
    });
    sim.shape = Shape {
        budget: 32,
        delay: 2,
    };
    sim.slow = Some((
        E1,
        M1,
        Shape {
            budget: 2,
            delay: 30,
        },
    ));
    sim
}

impl PathSwitching for Net {
    fn new() -> Self {
        path_net(CcKind::Fixed)
    }

    fn vegas() -> Self {
        path_net(CcKind::Vegas(VegasParams::default()))
    }

    fn build(&mut self, path: [usize; 3]) -> CircKey {
        let relays = path.map(|n| n - 1);
        self.build_through(CLIENT, &relays, 5000)
    }

    /// Home A = E1, M1, X linked to spare B = E2, M2, X; one stream opened on A.
    fn linked(&mut self) -> (CircKey, CircKey, StreamHandle) {
        let a = self.build([E1, M1, X]);
        self.nodes[CLIENT].path_link(a, self.now).unwrap();
        let b = self.build([E2, M2, X]);
        let now = self.now;
        self.nodes[CLIENT].path_add_spare(a, b, now).unwrap();
        self.run(5000);
        assert_eq!(self.nodes[CLIENT].path_set_of(a), Some(Some(b)));
        assert_eq!(self.nodes[CLIENT].path_current_leg(a), Some(a));
        let s = self.open_on(CLIENT, a, 5000);
        (a, b, s)
    }

    /// Feed the client's streams, stepping, until every echo came back or `steps` ran out;
    /// `at(step, net)` runs before each step.
    fn transfer(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        at: impl FnMut(usize, &mut Net),
    ) {
        self.echo_transfer(CLIENT, streams, steps, at);
    }

    fn assert_exact(&self, streams: &[(StreamHandle, Vec<u8>)]) {
        self.assert_echo(CLIENT, streams);
    }

    /// E1 reports its connection to M1 congested (as its detector would).
    fn congest_e1(&mut self) -> Option<CircKey> {
        let c = self.chan(E1, M1);
        let now = self.now;
        self.nodes[E1].congested(c, 0.0, now)
    }

    /// Upload `streams`, E1 reporting congestion at step `congest_at`, and let the network
    /// settle: every byte arrives once, in order. Returns the circuit E1 told its client of
    /// (`None`: none, or the upload ended before `congest_at`).
    fn congested_upload(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        congest_at: usize,
    ) -> Option<CircKey> {
        let mut told = None;
        self.transfer(streams, 300_000, |i, net| {
            if i == congest_at {
                told = net.congest_e1();
            }
        });
        self.run(20_000);
        self.assert_exact(streams);
        told
    }

    /// [`PathSwitching::congested_upload`], and E1 told the client, no circuit was killed,
    /// and the upload ended on the spare `b` of home circuit `a`.
    fn switched_upload(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        congest_at: usize,
        a: CircKey,
        b: CircKey,
    ) {
        let told = self.congested_upload(streams, congest_at);
        assert!(told.is_some(), "E1 told no client");
        assert_eq!(self.killed(), 0);
        assert_eq!(self.nodes[CLIENT].path_current_leg(a), Some(b));
    }
}

#[test]
fn upload_moves_to_the_spare_and_the_exit_restores_order() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    net.switched_upload(&[(s, pattern(1_000_000, 0))], 400, a, b);
    let c = net.nodes[CLIENT].switch_stats();
    let e1 = net.nodes[E1].switch_stats();
    let x = net.nodes[X].switch_stats();
    assert_eq!(e1.congested_sent, 1, "{e1:?}");
    assert_eq!(
        (c.congested_received, c.triggered, c.switches, c.timed_out),
        (1, 1, 1, 0),
        "{c:?}"
    );
    assert_eq!(
        c.cells_resent + c.cells_lost + c.violations + x.violations,
        0
    );
    // B is fast, A slow: cells on B overtook older ones on A, and the exit held them.
    assert!(x.path_out_of_order > 0, "no reordering exercised: {x:?}");
    assert_eq!(x.path_duplicates, 0);
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(
        (rec.outcome, rec.mode),
        (SwitchOutcome::Switched, SwitchMode::Path)
    );
    assert_eq!(rec.circ, a);
    assert!(rec.ended >= rec.triggered);
    let last_old = rec.last_old.expect("cells went on A before the switch");
    assert!(
        last_old <= rec.triggered && last_old <= rec.ended,
        "{rec:?}"
    );
    assert!(
        rec.ended - rec.triggered < Duration::from_millis(50),
        "{rec:?}"
    );
}

/// The switch is optimistic (data follows the SWITCH before any confirmation), and under
/// fixed windows the moved stream keeps a 500-cell stream window per leg: once the upload has
/// filled the slow leg A (E1 -> M1 carries 2 cells a step), A's window is used up, and yet the
/// first cell goes on B the moment CONGESTED arrives, without a stream SENDME (with the one
/// window the legs shared before, it waited for the next SENDME from A's backlog: `held_by`
/// was `StreamWindow`). Both legs then have cells of the stream in flight at once (more than
/// one window), the exit holds B's out of order, and every byte arrives once, in order.
#[test]
fn a_switch_with_the_old_legs_stream_window_used_up_goes_at_once() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(3_000_000, 3))];
    let mut at_report = None;
    let mut both = 0;
    net.transfer(&streams, 300_000, |i, net| {
        let client = &net.nodes[CLIENT];
        let (on_a, on_b) = (
            client.stream_leg_in_flight(s, a),
            client.stream_leg_in_flight(s, b),
        );
        if i == 1000 {
            at_report = on_a.zip(on_b);
            assert!(net.congest_e1().is_some());
        }
        both = both.max(on_a.unwrap_or(0) + on_b.unwrap_or(0));
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    assert_eq!(
        at_report,
        Some((500, 0)),
        "A's window used up at the report"
    );
    assert!(both > 500, "never more than one window in flight: {both}");
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(rec.outcome, SwitchOutcome::Switched);
    assert_eq!(rec.held_by, None, "{rec:?}");
    assert_eq!(rec.ended, rec.triggered, "{rec:?}");
    let x = net.nodes[X].switch_stats();
    assert_eq!((x.violations, x.path_duplicates), (0, 0), "{x:?}");
    assert!(x.path_out_of_order > 0, "no reordering exercised: {x:?}");
}

/// The same switch with congestion control (`cc_alg = 2`, as tor runs and conflux requires):
/// streams use XON/XOFF and each leg has its own congestion window, so the first cell goes on
/// B the moment CONGESTED arrives; the exit still delivers every byte once, in order.
#[test]
fn with_congestion_control_the_first_cell_goes_at_once() {
    let mut net = Net::vegas();
    let (a, b, s) = net.linked();
    net.switched_upload(&[(s, pattern(3_000_000, 3))], 1000, a, b);
    let x = net.nodes[X].switch_stats();
    assert_eq!((x.violations, x.path_duplicates), (0, 0), "{x:?}");
    assert!(x.path_out_of_order > 0, "no reordering exercised: {x:?}");
    // The peak the exit held at once is recorded, and stayed inside the hard window.
    assert!(
        x.path_out_of_order_peak > 0 && x.path_out_of_order_peak < 2048,
        "{x:?}"
    );
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(rec.outcome, SwitchOutcome::Switched);
    assert_eq!(rec.held_by, None, "{rec:?}");
    assert_eq!(rec.ended, rec.triggered, "{rec:?}");
}

/// The exit's out-of-order bound under congestion control: E1's link stops altogether for
/// 15 s right after the switch, so the cells on A (seq below everything on B) do not arrive,
/// and B, with its own congestion window and XON/XOFF streams, would run ahead without end
/// (each of its cells only buffered at the exit, each acknowledged). The exit withholds B's
/// circuit SENDMEs from 1000 buffered cells on, B stops within its window, nothing trips the
/// set's bound (1000 + 2 × 2000 + 256), and when A flows again every byte arrives once, in
/// order. Without the withholding the buffer passed the old 2048-cell limit and the set closed.
#[test]
fn a_stalled_old_leg_with_congestion_control_never_trips_the_bound() {
    let mut net = Net::vegas();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(8_000_000, 5))];
    let e1 = net.chan(E1, M1);
    net.transfer(&streams, 400_000, |i, net| {
        if i == 1000 {
            net.links.get_mut(&(E1, e1)).unwrap().budget = 0;
            assert!(net.congest_e1().is_some());
        }
        if i == 16_000 {
            net.links.get_mut(&(E1, e1)).unwrap().budget = 2;
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    let x = net.nodes[X].switch_stats();
    let bound = chive_core::switching::PathLimits::default().max_buffered(2);
    assert_eq!(x.violations, 0, "{x:?}");
    assert!(x.path_sendmes_withheld > 0, "never withheld: {x:?}");
    assert!(
        x.path_out_of_order_peak >= 1000 && x.path_out_of_order_peak < bound,
        "{x:?}"
    );
}

/// E2 reports congestion 0.5 s after the move to B (with a 0.3 s `leg_avoid` A is not
/// avoided any more). A's slow link left it with the heavier round trip, so the client stays
/// on B (`lighter_leg_only`); with the rule off it goes back to A on the report alone.
#[test]
fn congestion_on_the_spare_moves_the_upload_back_only_onto_a_lighter_leg() {
    for lighter_only in [true, false] {
        let (a, b, legs) = spare_congested(lighter_only);
        let expect = if lighter_only { b } else { a };
        assert_eq!(legs, (Some(expect), if lighter_only { 1 } else { 2 }));
        assert_ne!(a, b);
    }
}

/// `spare_congested`'s run: returns A, B, and the leg in use at the end with the switches
/// made.
fn spare_congested(lighter_only: bool) -> (CircKey, CircKey, (Option<CircKey>, u64)) {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let settings = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        leg_avoid: Duration::from_millis(300),
        lighter_leg_only: lighter_only,
        ..settings
    });
    let streams = vec![(s, pattern(2_000_000, 3))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 800 {
            let c = net.chan(E2, M2);
            net.nodes[E2].congested(c, 0.0, net.now);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!(c.congested_ignored, u64::from(lighter_only), "{c:?}");
    (a, b, (net.nodes[CLIENT].path_current_leg(a), c.switches))
}

/// The spare's path is the slow one (E2 -> M2), so its round trip, measured at its LINK, is
/// already above the home's: E1's congestion report does not move the upload onto it.
#[test]
fn the_client_does_not_move_onto_a_heavier_leg() {
    let mut net = Net::new();
    net.slow = Some((
        E2,
        M2,
        Shape {
            budget: 2,
            delay: 30,
        },
    ));
    let (a, b, s) = net.linked();
    let told = net.congested_upload(&[(s, pattern(3_000_000, 4))], 40);
    assert!(told.is_some());
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
    assert_ne!(a, b);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!(
        (c.congested_received, c.congested_ignored, c.switches),
        (1, 1, 0),
        "{c:?}"
    );
}

/// Both entries report congestion 1.2 s apart: going back to A, whose entry is still full,
/// would only queue the switch behind its backlog (the first lab run's timeouts). Within
/// `leg_avoid` (10 s) the client stays on B; afterwards it may go back.
#[test]
fn both_legs_congested_the_client_stays() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(2_000_000, 3))];
    let mut leg_after_e2 = None;
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 1500 {
            let c = net.chan(E2, M2);
            assert!(net.nodes[E2].congested(c, 0.0, net.now).is_some());
        }
        if i == 1600 {
            leg_after_e2 = net.nodes[CLIENT].path_current_leg(a);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(leg_after_e2, Some(b), "the client stayed on B");
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!(
        (
            c.congested_received,
            c.congested_ignored,
            c.switches,
            c.timed_out
        ),
        (2, 1, 1, 0),
        "{c:?}"
    );
}

/// After the move to B, the exit's stream-level SENDMEs for the moved stream come back on B
/// once the switch is final (the client acknowledged the confirmation): with A's way back to
/// the client cut 100 ms after the confirmation, the upload (several stream windows after the
/// cut) still completes. Sent on A, they would be lost and the stream would stall.
#[test]
fn stream_sendmes_follow_the_upload_to_the_new_leg() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    net.upload_only = Some(s);
    let streams = vec![(s, pattern(4_000_000, 5))];
    let mut confirmed_at = None;
    let mut cut_at = None;
    net.transfer(&streams, 60_000, |i, net| {
        if i == 300 {
            assert!(net.congest_e1().is_some());
        }
        if confirmed_at.is_none() && net.nodes[CLIENT].switch_stats().switches == 1 {
            confirmed_at = Some(i);
        }
        if cut_at.is_none() && confirmed_at.is_some_and(|c| i == c + 100) {
            net.blackhole(E1, CLIENT);
            cut_at = Some(i);
        }
    });
    assert!(
        cut_at.is_some(),
        "no confirmed switch, or the upload ended first"
    );
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.switches, c.timed_out), (1, 0), "{c:?}");
    assert_eq!(net.nodes[X].switch_stats().violations, 0);
}

#[test]
fn no_confirmation_falls_back_to_the_old_leg_and_resends() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    // B's way back is cut: the exit sees the switch, its SWITCH_CONFIRM never arrives.
    net.blackhole(M2, E2);
    net.congested_upload(&[(s, pattern(1_500_000, 7))], 300);
    let c = net.nodes[CLIENT].switch_stats();
    let x = net.nodes[X].switch_stats();
    assert_eq!((c.switches, c.timed_out), (0, 1), "{c:?}");
    assert!(c.cells_resent > 0, "{c:?}");
    // The cells sent on B arrived there too: the exit dropped the second copies.
    assert!(x.path_duplicates > 0, "{x:?}");
    assert_eq!(c.cells_lost + x.violations, 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
    // The abandoned spare is closed.
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(None));
    assert!(net.events.contains(&(
        CLIENT,
        Event::CircuitClosed {
            circ: b,
            reason: "spare leg abandoned after a failed switch".into(),
            cause: chive_core::CloseCause::Local,
            hops: 3,
        }
    )));
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(rec.outcome, SwitchOutcome::TimedOut);
    assert!(rec.ended - rec.triggered >= Duration::from_millis(2000));
}

#[test]
fn a_dead_spare_loses_nothing() {
    let mut net = Net::new();
    let (a, _b, s) = net.linked();
    // Nothing gets through B at all any more.
    net.blackhole(E2, M2);
    net.blackhole(M2, E2);
    net.congested_upload(&[(s, pattern(1_500_000, 9))], 300);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.switches, c.timed_out, c.cells_lost), (0, 1, 0), "{c:?}");
    assert_eq!(net.nodes[X].switch_stats().path_duplicates, 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
}

#[test]
fn the_spare_closing_mid_switch_falls_back_at_once() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    net.blackhole(M2, E2);
    let streams = vec![(s, pattern(1_500_000, 11))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 600 {
            // Before the 2 s timeout: the client closes B (as when its link fails).
            net.nodes[CLIENT].close_circuit(b, net.now);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.timed_out, c.failed, c.cells_lost), (0, 1, 0), "{c:?}");
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
}

#[test]
fn the_home_circuit_gone_ends_the_stream_cleanly() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(2_000_000, 13))];
    net.transfer(&streams, 3000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 2000 {
            // The client's link to E1 fails: A is gone.
            let c = net.chan(CLIENT, E1);
            net.nodes[CLIENT].channel_closed(c, net.now);
        }
    });
    net.run(20_000);
    // The stream is closed (the SOCKS side sees it), not left hanging, and B went with A.
    assert!(
        net.events.iter().any(|(n, e)| *n == CLIENT
            && matches!(e, Event::StreamClosed { stream, .. } if *stream == s)),
        "no StreamClosed for the stream"
    );
    assert_eq!(net.nodes[CLIENT].path_set_of(a), None);
    assert!(
        net.events
            .iter()
            .any(|(n, e)| *n == CLIENT
                && matches!(e, Event::CircuitClosed { circ, .. } if *circ == b))
    );
    assert_eq!(net.nodes[CLIENT].stats().circuits, 0);
}

#[test]
fn congestion_without_a_spare_is_ignored() {
    let mut net = Net::new();
    let a = net.build([E1, M1, X]);
    let s = net.nodes[CLIENT]
        .open_stream(a, "127.0.0.1", 80, net.now)
        .unwrap();
    net.run(5000);
    net.congested_upload(&[(s, pattern(200_000, 17))], 200);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.congested_received, c.triggered, c.switches), (1, 0, 0));
    assert_eq!(net.killed(), 0);
}

#[test]
fn an_exit_with_path_switching_off_never_links() {
    let mut net = Net::new();
    net.nodes[X].set_switching(SwitchSettings::default());
    let a = net.build([E1, M1, X]);
    net.nodes[CLIENT].path_link(a, net.now).unwrap();
    let b = net.build([E2, M2, X]);
    net.nodes[CLIENT].path_add_spare(a, b, net.now).unwrap();
    net.run(5000);
    let s = net.nodes[CLIENT]
        .open_stream(a, "127.0.0.1", 80, net.now)
        .unwrap();
    net.run(5000);
    let streams = vec![(s, pattern(100_000, 19))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 200 {
            net.congest_e1();
        }
    });
    net.assert_exact(&streams);
    // No LINKED: the spare never joined, nothing moved; after the build timeout it is closed.
    assert_eq!(net.nodes[CLIENT].switch_stats().triggered, 0);
    net.idle(31_000);
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(None));
    assert_eq!(net.killed(), 0);
}

/// Every link from `from` to `to` delays what is written from now on by `steps` (1 ms each).
fn set_delay(net: &mut Net, from: usize, to: usize, steps: u64) {
    for ((n, _), l) in net.links.iter_mut() {
        if *n == from && l.peer == to {
            l.delay = steps;
        }
    }
}

/// A loaded network (the lab diagnosis in docs/protocol.md, "Path variant"): both legs' way back takes long, so the
/// home's SENDMEs measure a round trip near a second, and the exit's SWITCH_CONFIRM on B comes
/// 2.5 s after the SWITCH. With the timeout fixed at the 2 s floor (`timeout_rtt_factor` 0)
/// the switch times out while its confirmation is on its way; with the timeout following the
/// measured round trip (4 × ~0.9 s) it waits and completes. Returns the client's counters and
/// its switch record.
fn late_confirmation(factor: u32, lose_it: bool) -> (chive_core::SwitchStats, SwitchRecord) {
    let mut net = Net::new();
    let settings = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        timeout: Duration::from_millis(2000),
        timeout_rtt_factor: factor,
        ..settings
    });
    let (a, b, s) = net.linked();
    set_delay(&mut net, M1, E1, 800);
    set_delay(&mut net, M2, E2, 2500);
    if lose_it {
        net.blackhole(M2, E2);
    }
    let streams = vec![(s, pattern(1_500_000, 13))];
    net.transfer(&streams, 400_000, |i, net| {
        if i == 3000 {
            // A's SENDMEs have measured its round trip by now.
            assert!(net.congest_e1().is_some());
        }
    });
    net.run(40_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!(
        (c.cells_lost, net.nodes[X].switch_stats().violations),
        (0, 0)
    );
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    let leg = net.nodes[CLIENT].path_current_leg(a);
    assert_eq!(
        leg,
        Some(if rec.outcome == SwitchOutcome::Switched {
            b
        } else {
            a
        })
    );
    (c, rec)
}

#[test]
fn a_late_confirmation_completes_the_switch_when_the_timeout_follows_the_round_trip() {
    let (c, rec) = late_confirmation(4, false);
    assert_eq!(
        (c.switches, c.timed_out, c.cells_resent),
        (1, 0, 0),
        "{c:?}"
    );
    assert_eq!(rec.outcome, SwitchOutcome::Switched);
    let (wait, timeout) = (rec.confirm_wait.unwrap(), rec.confirm_timeout.unwrap());
    assert!(wait > Duration::from_millis(2500), "{rec:?}");
    assert!(timeout > wait, "{rec:?}");
}

#[test]
fn a_late_confirmation_times_out_with_a_fixed_timeout() {
    let (c, rec) = late_confirmation(0, false);
    assert_eq!((c.switches, c.timed_out), (0, 1), "{c:?}");
    assert!(c.cells_resent > 0);
    assert_eq!(rec.outcome, SwitchOutcome::TimedOut);
    assert_eq!(rec.confirm_timeout, Some(Duration::from_millis(2000)));
}

/// The same loaded network, but B loses the confirmation: the switch still falls back, after
/// the adapted timeout (4 × the measured round trip, above the 2 s floor), and nothing is lost.
#[test]
fn a_lost_confirmation_falls_back_after_the_adapted_timeout() {
    let (c, rec) = late_confirmation(4, true);
    assert_eq!((c.switches, c.timed_out), (0, 1), "{c:?}");
    assert!(c.cells_resent > 0);
    assert_eq!(rec.outcome, SwitchOutcome::TimedOut);
    let (wait, timeout) = (rec.confirm_wait.unwrap(), rec.confirm_timeout.unwrap());
    assert!(timeout > Duration::from_millis(2500), "{rec:?}");
    assert!(timeout <= chive_core::switching::MAX_RTT_CONFIRM_TIMEOUT);
    assert!(
        wait >= timeout && wait < timeout + Duration::from_millis(50),
        "{rec:?}"
    );
}
