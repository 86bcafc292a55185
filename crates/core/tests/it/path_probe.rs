//! Circuit switching, path variant: the client measures the leg it is not using before it acts
//! on a CONGESTED report (LEG_PROBE, docs/protocol.md "Path variant"). The probe's answer
//! decides against the stale estimate either way; no answer in time means "heavier"; an answer
//! still missing at the next report lets the estimates decide; a probe or answer nobody asked
//! for closes only its circuit. Client side against the fake relay of `path_client`, exit side
//! against the hand-driven path of `common`, and both ends through real cores (`path_switching`'s
//! network, virtual clock).

use std::time::Duration;

use chive_cell::{ConfluxLink, LegProbe, RelayCommand, SwitchConfirm};
use chive_core::cc::CcKind;
use chive_core::{CircKey, SwitchMode, SwitchSettings};

use crate::common::{destroys, Circ, Path};
use crate::path_client::Fake;
use crate::path_switching::{path_net, PathSwitching, CLIENT, E1, E2, M1, M2, X};
use crate::sim::pattern;

/// A linked pair at the fake exit, the upload moved to the spare and back congested there:
/// the home measured only at its LINK (50 ms, stale), the spare while carrying data (its switch
/// confirmed after 60 ms; smoothed with its LINK's 0 ms: 7.5 ms, latest 60 ms). By the
/// estimates the home is heavier. Returns home, spare and, if `probes`, the probe's body sent
/// on the home.
fn congested_spare(f: &mut Fake, probes: bool) -> (CircKey, CircKey, Option<Vec<u8>>) {
    let (home, spare, _) = f.linked();
    let settings = f.core.switching();
    f.core.set_switching(SwitchSettings {
        leg_avoid: Duration::from_millis(1),
        probe_legs: probes,
        ..settings
    });
    let s = f.core.open_stream(home, "127.0.0.1", 80, f.now).unwrap();
    assert_eq!(f.read(home)[0].0, RelayCommand::BEGIN);
    // The home was measured only at its LINK: no probe, the estimates move the upload.
    f.send(home, RelayCommand::CONGESTED, &[0]);
    assert_eq!(f.core.path_current_leg(home), Some(spare));
    f.core.stream_error(s, f.now);
    let got = f.read(spare);
    assert_eq!(got[0].0, RelayCommand::CONFLUX_SWITCH, "{got:?}");
    f.now += Duration::from_millis(60);
    f.send(
        spare,
        RelayCommand::SWITCH_CONFIRM,
        &SwitchConfirm { seq: 1 }.encode(),
    );
    assert_eq!(f.core.switch_stats().switches, 1);
    f.read(spare);
    assert_eq!(f.core.switch_stats().leg_probes, 0);
    f.now += Duration::from_millis(10);
    f.send(spare, RelayCommand::CONGESTED, &[0]);
    let got = f.read(home);
    let probe = if probes {
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, RelayCommand::LEG_PROBE);
        assert_eq!(LegProbe::decode(&got[0].1).unwrap().id, 1);
        // Nothing moves before the answer.
        assert_eq!(f.core.path_current_leg(home), Some(spare));
        Some(got[0].1.clone())
    } else {
        assert!(got.is_empty(), "{got:?}");
        None
    };
    (home, spare, probe)
}

/// The stale estimates say the home is heavier (50 ms against the spare's 7.5 ms smoothed):
/// without probes the client stays on the congested spare. With a probe, an answer within
/// 1.1 × the spare's 60 ms moves the upload back when it arrives; one after that keeps it.
#[test]
fn the_probe_answer_decides() {
    for (after_ms, moves) in [(30, true), (80, false)] {
        let mut f = Fake::new();
        let (home, spare, probe) = congested_spare(&mut f, true);
        f.now += Duration::from_millis(after_ms);
        f.send(home, RelayCommand::LEG_PROBE, &probe.unwrap());
        let expect = if moves { home } else { spare };
        assert_eq!(f.core.path_current_leg(home), Some(expect), "{after_ms} ms");
        let c = f.core.switch_stats();
        assert_eq!(
            (
                c.leg_probes,
                c.leg_probes_late,
                c.congested_ignored,
                c.triggered
            ),
            (1, 0, u64::from(!moves), 1 + u64::from(moves)),
            "{c:?}"
        );
        assert!(!f.closed(spare) && !f.closed(home));
    }
    let mut f = Fake::new();
    let (home, spare, _) = congested_spare(&mut f, false);
    assert_eq!(f.core.path_current_leg(home), Some(spare));
    let c = f.core.switch_stats();
    assert_eq!((c.leg_probes, c.congested_ignored), (0, 1), "{c:?}");
}

/// No answer within 1.1 × the spare's 60 ms: the client stays (the home is at least that
/// slow). The next report, with that probe still unanswered, falls back to the estimates (no
/// second probe; they say stay, counted by the heavier-leg rule); the late answer is accepted
/// and only updates the estimate, and the report after it probes again.
#[test]
fn a_lost_answer_falls_back_to_the_estimates() {
    let mut f = Fake::new();
    let (home, spare, probe) = congested_spare(&mut f, true);
    let deadline = f.core.next_deadline().expect("the probe's deadline");
    assert_eq!(deadline, f.now + Duration::from_millis(66));
    f.now = deadline;
    let now = f.now;
    f.core.handle_timeout(now);
    assert_eq!(f.core.path_current_leg(home), Some(spare));
    let c = f.core.switch_stats();
    assert_eq!(
        (c.leg_probes, c.leg_probes_late, c.congested_ignored),
        (1, 1, 1),
        "{c:?}"
    );
    f.now += Duration::from_millis(100);
    f.send(spare, RelayCommand::CONGESTED, &[0]);
    assert!(f.read(home).is_empty(), "no second probe");
    assert_eq!(f.core.path_current_leg(home), Some(spare));
    let c = f.core.switch_stats();
    assert_eq!((c.leg_probes, c.congested_ignored), (1, 2), "{c:?}");
    f.send(home, RelayCommand::LEG_PROBE, &probe.unwrap());
    assert!(!f.closed(spare) && !f.closed(home));
    assert_eq!(f.core.switch_stats().violations, 0);
    f.now += Duration::from_millis(10);
    f.send(spare, RelayCommand::CONGESTED, &[0]);
    let got = f.read(home);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(LegProbe::decode(&got[0].1).unwrap().id, 2);
}

/// Answers nobody asked for close only their circuit: another id, a probe answer on the leg
/// not probed, a malformed body, an answer when no probe is out.
#[test]
fn unexpected_probe_answers_close_only_that_circuit() {
    // Another id on the probed home: the home (and with it the set) closes.
    let mut f = Fake::new();
    let (home, _, _) = congested_spare(&mut f, true);
    f.send(home, RelayCommand::LEG_PROBE, &LegProbe { id: 9 }.encode());
    assert!(f.closed(home));
    // An answer on the spare, which was not probed: the spare closes (it carried the upload,
    // so the set then follows its rule for a lost current leg).
    let mut f = Fake::new();
    let (_, spare, probe) = congested_spare(&mut f, true);
    f.send(spare, RelayCommand::LEG_PROBE, &probe.unwrap());
    assert!(f.closed(spare));
    assert_eq!(f.core.switch_stats().violations, 1);
    // A malformed answer (7 bytes) on the probed home.
    let mut f = Fake::new();
    let (home, _, probe) = congested_spare(&mut f, true);
    f.send(home, RelayCommand::LEG_PROBE, &probe.unwrap()[..7]);
    assert!(f.closed(home));
    // An answer when no probe is out at all.
    let mut f = Fake::new();
    let (home, spare, _) = f.linked();
    f.send(spare, RelayCommand::LEG_PROBE, &LegProbe { id: 1 }.encode());
    assert!(f.closed(spare));
    assert_eq!(f.core.path_set_of(home), Some(None));
    assert_eq!(f.core.switch_stats().violations, 1);
}

fn path_exit() -> Path {
    let mut p = Path::new(Default::default());
    p.x.core.set_switching(SwitchSettings {
        mode: SwitchMode::Path,
        ..SwitchSettings::default()
    });
    p
}

fn to_x(p: &mut Path, circ: &mut Circ, cmd: RelayCommand, body: &[u8]) {
    p.send(circ, 1, cmd, 0, body, false);
    p.r_to_x();
}

fn from_x(p: &mut Path, circ: &mut Circ) -> Vec<(RelayCommand, Vec<u8>)> {
    p.x_to_r();
    p.read(circ).into_iter().map(|m| (m.cmd, m.data)).collect()
}

fn closed(p: &mut Path, circ: &Circ) -> bool {
    p.x_to_r();
    destroys(&p.cells_for_client())
        .iter()
        .any(|(id, _)| *id == circ.id)
}

/// The exit answers a probe on a linked leg at once with the same body; a probe on a circuit
/// that is not linked, or a malformed one, closes that circuit and nothing else.
#[test]
fn the_exit_answers_probes_on_linked_legs_only() {
    let mut p = path_exit();
    let link = ConfluxLink {
        nonce: [4; 32],
        last_seqno_sent: 0,
        last_seqno_recv: 0,
        desired_ux: 0,
    }
    .encode();
    let mut a = p.create2();
    to_x(&mut p, &mut a, RelayCommand::CONFLUX_LINK, &link);
    assert_eq!(from_x(&mut p, &mut a)[0].0, RelayCommand::CONFLUX_LINKED);
    let body = LegProbe { id: 77 }.encode();
    to_x(&mut p, &mut a, RelayCommand::LEG_PROBE, &body);
    assert_eq!(
        from_x(&mut p, &mut a),
        vec![(RelayCommand::LEG_PROBE, body)]
    );
    assert_eq!(p.x.core.switch_stats().leg_probes_answered, 1);
    // Not linked.
    let mut c = p.create2();
    to_x(
        &mut p,
        &mut c,
        RelayCommand::LEG_PROBE,
        &LegProbe { id: 1 }.encode(),
    );
    assert!(closed(&mut p, &c));
    assert!(p.x_answers(&mut a, 1), "the linked leg stopped answering");
    // Malformed, on a linked leg: that leg closes.
    let mut b = p.create2();
    to_x(&mut p, &mut b, RelayCommand::CONFLUX_LINK, &link);
    assert_eq!(from_x(&mut p, &mut b)[0].0, RelayCommand::CONFLUX_LINKED);
    to_x(&mut p, &mut b, RelayCommand::LEG_PROBE, &[0; 9]);
    assert!(closed(&mut p, &b));
    assert_eq!(p.x.core.switch_stats().violations, 2);
    assert_eq!(p.x.core.switch_stats().leg_probes_answered, 1);
}

/// Home A = E1, M1, X (E1 -> M1 slow and congested) and spare B = E2, M2, X, with E2 -> M2 in
/// each direction set to `link_delay` steps while B links and `now_delay` after: B's estimate
/// (its LINK) describes another load than B's path has when E1 reports congestion. Returns
/// A, B, the leg in use at the end and the client's counters; every byte arrived once.
fn stale_spare(
    probe: u8,
    link_delay: u64,
    now_delay: u64,
) -> (CircKey, CircKey, Option<CircKey>, chive_core::SwitchStats) {
    let mut net = path_net(CcKind::Fixed);
    let settings = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        probe_legs: probe >= 1,
        probe_ahead: probe == 2,
        ..settings
    });
    let set_delay = |net: &mut crate::path_switching::Net, d: u64| {
        for (from, to) in [(E2, M2), (M2, E2)] {
            let c = net.chan(from, to);
            net.links.get_mut(&(from, c)).unwrap().delay = d;
        }
    };
    let a = net.build([E1, M1, X]);
    net.nodes[CLIENT].path_link(a, net.now).unwrap();
    let b = net.build([E2, M2, X]);
    set_delay(&mut net, link_delay);
    let now = net.now;
    net.nodes[CLIENT].path_add_spare(a, b, now).unwrap();
    net.run(10_000);
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(Some(b)));
    set_delay(&mut net, now_delay);
    let s = net.open_on(CLIENT, a, 5000);
    let streams = vec![(s, pattern(1_500_000, 6))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            assert!(net.congest_e1().is_some());
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let x = net.nodes[X].switch_stats();
    assert_eq!(x.violations, 0, "{x:?}");
    if probe < 2 {
        assert_eq!(x.leg_probes_answered, u64::from(probe), "{x:?}");
    }
    (
        a,
        b,
        net.nodes[CLIENT].path_current_leg(a),
        net.nodes[CLIENT].switch_stats(),
    )
}

/// A spare that was idle at its LINK and is slow now (3 s each way on E2 -> M2): the estimate
/// says "lighter" and without probes the upload moves onto it (and the switch times out, its
/// cells re-sent on A); the probe is not answered in time and the upload never leaves A.
#[test]
fn a_probe_keeps_the_upload_off_a_spare_that_got_slow() {
    let (a, _, leg, c) = stale_spare(1, 2, 3000);
    assert_eq!(leg, Some(a), "{c:?}");
    assert_eq!(
        (c.leg_probes, c.leg_probes_late, c.triggered, c.cells_resent),
        (1, 1, 0, 0),
        "{c:?}"
    );
    // Without probes it moves onto the slow spare, the switch times out and re-sends on A.
    let (a, _, leg, c) = stale_spare(0, 2, 3000);
    assert_eq!(leg, Some(a), "{c:?}");
    assert_eq!((c.triggered, c.timed_out), (1, 1), "{c:?}");
    assert!(c.cells_resent > 0, "{c:?}");
}

/// A spare measured slow at its LINK (1 s each way on E2 -> M2) that is fast now: the estimate
/// says "heavier" and without probes the upload stays on the congested A; the probe's answer
/// comes back fast and the upload moves to B.
#[test]
fn a_probe_moves_the_upload_onto_a_spare_that_got_fast() {
    let (_, b, leg, c) = stale_spare(1, 1000, 2);
    assert_eq!(leg, Some(b), "{c:?}");
    assert_eq!(
        (c.leg_probes, c.leg_probes_late, c.switches),
        (1, 0, 1),
        "{c:?}"
    );
    let (a, _, leg, c) = stale_spare(0, 1000, 2);
    assert_eq!(
        leg,
        Some(a),
        "without probes the stale estimate keeps it on A: {c:?}"
    );
    assert_eq!((c.switches, c.congested_ignored), (0, 1), "{c:?}");
}

/// A Vegas upload on A (E1 -> M1 slow) with spare B, the client probing as `probe` says (0:
/// none, 1: at the report, 2: ahead), E1 reporting congestion at step 1000. Returns the
/// client's counters, the exit's answered probes before the report, and the switch record;
/// every byte arrived once, in order, and the upload ended on B.
fn probed_upload(
    probe: u8,
) -> (
    chive_core::SwitchStats,
    u64,
    chive_core::SwitchRecord,
    Duration,
) {
    let mut net = crate::path_switching::Net::vegas();
    let settings = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        probe_legs: probe >= 1,
        probe_ahead: probe == 2,
        ..settings
    });
    let (a, b, s) = net.linked();
    let t0 = net.now;
    let streams = vec![(s, pattern(3_000_000, 7))];
    let mut answered_before = None;
    net.transfer(&streams, 300_000, |i, net| {
        if i == 1000 {
            answered_before = Some(net.nodes[X].switch_stats().leg_probes_answered);
            assert!(net.congest_e1().is_some());
        }
    });
    let took = net.now.duration_since(t0);
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    assert_eq!(net.nodes[X].switch_stats().violations, 0);
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(rec.outcome, chive_core::SwitchOutcome::Switched, "{rec:?}");
    (
        net.nodes[CLIENT].switch_stats(),
        answered_before.expect("the report was sent"),
        rec,
        took,
    )
}

/// Probing ahead (`SwitchLegProbe = 2`): while A carries the upload its circuit SENDMEs send
/// probes of B (at most one per `PROBE_AHEAD_EVERY` of virtual time), the exit answers them,
/// and the report is decided by the last answer at once: with Vegas (no stream window) the
/// first cell goes on B the moment it arrives. Probing at the report waits for the probe's
/// round trip over B first; without probes the estimates decide at once too.
#[test]
fn probed_ahead_a_report_is_decided_at_once() {
    let (c, before, rec, took) = probed_upload(2);
    assert!(before >= 1, "no probe answered before the report: {c:?}");
    assert_eq!(rec.ended, rec.triggered, "{rec:?}");
    assert_eq!((c.switches, c.leg_probes_late), (1, 0), "{c:?}");
    // One probe per second of virtual time at most (the first at once), and they go on
    // after the move (now probing A).
    assert!(c.leg_probes <= 1 + took.as_secs(), "{c:?} in {took:?}");
    assert!(c.leg_probes > before, "no probe after the move: {c:?}");
    let (c1, before1, rec1, _) = probed_upload(1);
    assert_eq!(before1, 0, "probes only at the report: {c1:?}");
    assert_eq!(c1.leg_probes, 1, "{c1:?}");
    assert!(rec1.ended > rec1.triggered, "the probe's wait: {rec1:?}");
    let (c0, before0, rec0, _) = probed_upload(0);
    assert_eq!((before0, c0.leg_probes), (0, 0), "{c0:?}");
    assert_eq!(rec0.ended, rec0.triggered, "{rec0:?}");
}

/// Probing ahead onto a spare that got slow (3 s each way on E2 -> M2): the probe that went
/// out with one of A's SENDMEs is still unanswered when E1 reports, so that probe decides the
/// report (no answer within 1.1 × A's round trip of its sending: B is at least that slow) and
/// the upload never leaves A; nothing moves onto B on its stale LINK estimate, as it does
/// without probes (`a_probe_keeps_the_upload_off_a_spare_that_got_slow`).
#[test]
fn probed_ahead_an_unanswered_probe_keeps_the_upload_off_a_slow_spare() {
    let (a, _, leg, c) = stale_spare(2, 2, 3000);
    assert_eq!(leg, Some(a), "{c:?}");
    assert_eq!(
        (c.triggered, c.timed_out, c.cells_resent),
        (0, 0, 0),
        "{c:?}"
    );
    assert!(c.leg_probes_late >= 1, "{c:?}");
    // And onto a spare that got fast, the ahead probes' answers move the upload.
    let (_, b, leg, c) = stale_spare(2, 1000, 2);
    assert_eq!(leg, Some(b), "{c:?}");
    assert_eq!((c.switches, c.timed_out), (1, 0), "{c:?}");
}
