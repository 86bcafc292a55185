//! Circuit switching, path variant, at the exit, cell by cell (the hand-driven path of
//! `common`): a fake client links circuits through R to the exit X and sends what an honest
//! client would not. Every unexpected or malformed request closes its circuit (or the linked
//! set it names) with a logged protocol error; another circuit through the same relays keeps
//! answering. And the exit's reordering itself, with the arrival order chosen by the test.

use chive_cell::{ConfluxLink, ConfluxSwitch, DestroyReason, RelayCommand, SwitchConfirm};
use chive_core::switching::PathLimits;
use chive_core::{Event, SwitchMode, SwitchSettings, CELL_MEM_COST};

use crate::common::{destroys, Circ, Path};

fn path_exit() -> Path {
    let mut p = Path::new(Default::default());
    p.x.core.set_switching(SwitchSettings {
        mode: SwitchMode::Path,
        ..SwitchSettings::default()
    });
    p
}

fn link_body(nonce: u8) -> Vec<u8> {
    ConfluxLink {
        nonce: [nonce; 32],
        last_seqno_sent: 0,
        last_seqno_recv: 0,
        desired_ux: 0,
    }
    .encode()
}

/// Send `cmd` to X on `circ` and carry it there.
fn to_x(p: &mut Path, circ: &mut Circ, cmd: RelayCommand, sid: u16, body: &[u8]) {
    p.send(circ, 1, cmd, sid, body, false);
    p.r_to_x();
}

/// Carry X's answers back and decrypt those of `circ`.
fn from_x(p: &mut Path, circ: &mut Circ) -> Vec<(RelayCommand, Vec<u8>)> {
    p.x_to_r();
    p.read(circ).into_iter().map(|m| (m.cmd, m.data)).collect()
}

/// Two circuits linked in one set at X (LINKED on each).
fn linked(p: &mut Path) -> (Circ, Circ) {
    let mut a = p.create2();
    let mut b = p.create2();
    for c in [&mut a, &mut b] {
        to_x(p, c, RelayCommand::CONFLUX_LINK, 0, &link_body(1));
        let got = from_x(p, c);
        assert_eq!(got, vec![(RelayCommand::CONFLUX_LINKED, link_body(1))]);
    }
    (a, b)
}

/// Whether X closed `circ` (a DESTROY toward R for its id on R's side is enough: R then
/// destroys toward the client).
fn closed(p: &mut Path, circ: &Circ) -> bool {
    destroyed_ids(p).contains(&circ.id)
}

/// Carry X's answers back: the ids of the circuits R was told to destroy toward the client.
fn destroyed_ids(p: &mut Path) -> Vec<u32> {
    p.x_to_r();
    destroys(&p.cells_for_client())
        .iter()
        .map(|(id, _)| *id)
        .collect()
}

/// Carry X's answers back: both legs `a` and `b` of a set were destroyed for `reason`.
fn assert_set_destroyed(p: &mut Path, a: &Circ, b: &Circ, reason: DestroyReason) {
    p.x_to_r();
    let gone = destroys(&p.cells_for_client());
    assert!(
        gone.contains(&(a.id, reason)) && gone.contains(&(b.id, reason)),
        "{gone:?}"
    );
}

/// X's events so far dropped, circuit `other` (not in the closed set) still answers.
fn assert_other_answers(p: &mut Path, other: &mut Circ) {
    while p.x.core.poll_event().is_some() {}
    assert!(p.x_answers(other, 1), "another circuit stopped answering");
}

/// X's stream writes, in order, from its events.
fn writes(p: &mut Path) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(ev) = p.x.core.poll_event() {
        if let Event::StreamWrite { data, .. } = ev {
            out.extend_from_slice(&data);
        }
    }
    out
}

#[test]
fn the_exit_puts_cells_from_two_legs_back_in_order() {
    let mut p = path_exit();
    let (mut a, mut b) = linked(&mut p);
    // seq 1: BEGIN on A.
    to_x(&mut p, &mut a, RelayCommand::BEGIN, 1, b"127.0.0.1:80\0");
    p.connect_at_x();
    // The client sent seq 2 ("one") on A, then switched: SWITCH(+2) and seq 3 ("two") on B.
    // B's cells arrive first.
    p.send(
        &mut b,
        1,
        RelayCommand::CONFLUX_SWITCH,
        0,
        &ConfluxSwitch { relative_seq: 2 }.encode(),
        false,
    );
    p.send(&mut b, 1, RelayCommand::DATA, 1, b"two", false);
    p.r_to_x();
    assert_eq!(writes(&mut p), b"", "seq 3 delivered before seq 2");
    assert_eq!(p.x.core.switch_stats().path_out_of_order, 1);
    // X confirms the switch on B with the leg's counter after the SWITCH.
    let back = from_x(&mut p, &mut b);
    assert!(
        back.contains(&(
            RelayCommand::SWITCH_CONFIRM,
            SwitchConfirm { seq: 2 }.encode()
        )),
        "{back:?}"
    );
    to_x(&mut p, &mut a, RelayCommand::DATA, 1, b"one");
    assert_eq!(writes(&mut p), b"onetwo");
    // A copy of seq 3 (a fallback's resend) on A is dropped.
    p.send(&mut a, 1, RelayCommand::DATA, 1, b"two", false);
    p.send(&mut a, 1, RelayCommand::DATA, 1, b"three", false);
    p.r_to_x();
    assert_eq!(writes(&mut p), b"three");
    assert_eq!(p.x.core.switch_stats().path_duplicates, 1);
    assert_eq!(p.x.core.stats().circuits_killed, 0);
}

#[test]
fn a_switch_on_an_unlinked_circuit_closes_it_only() {
    let mut p = path_exit();
    let (mut a, _b) = linked(&mut p);
    let mut c = p.create2();
    to_x(
        &mut p,
        &mut c,
        RelayCommand::CONFLUX_SWITCH,
        0,
        &ConfluxSwitch { relative_seq: 1 }.encode(),
    );
    assert!(closed(&mut p, &c));
    assert_eq!(p.x.core.switch_stats().violations, 1);
    assert!(p.x_answers(&mut a, 1), "the linked set stopped answering");
}

#[test]
fn malformed_repeated_or_out_of_range_switches_close_the_set() {
    let bad: [&[(RelayCommand, Vec<u8>)]; 3] = [
        // Malformed: 2 bytes.
        &[(RelayCommand::CONFLUX_SWITCH, vec![0, 1])],
        // Replayed: two SWITCHes with no cell between.
        &[
            (
                RelayCommand::CONFLUX_SWITCH,
                ConfluxSwitch { relative_seq: 0 }.encode(),
            ),
            (
                RelayCommand::CONFLUX_SWITCH,
                ConfluxSwitch { relative_seq: 0 }.encode(),
            ),
        ],
        // Beyond the window (9256 numbers for two legs).
        &[(
            RelayCommand::CONFLUX_SWITCH,
            ConfluxSwitch {
                relative_seq: 10_000,
            }
            .encode(),
        )],
    ];
    for (i, msgs) in bad.iter().enumerate() {
        let mut p = path_exit();
        let (a, mut b) = linked(&mut p);
        let mut other = p.create2();
        for (cmd, body) in msgs.iter() {
            p.send(&mut b, 1, *cmd, 0, body, false);
        }
        p.r_to_x();
        let gone = destroyed_ids(&mut p);
        assert!(
            gone.contains(&a.id) && gone.contains(&b.id),
            "case {i}: set not closed: {gone:?}"
        );
        assert_eq!(p.x.core.switch_stats().violations, 1, "case {i}");
        assert!(
            p.x_answers(&mut other, 1),
            "case {i}: another circuit stopped answering"
        );
    }
}

#[test]
fn a_data_cell_beyond_the_window_closes_the_set() {
    let window = PathLimits::default().window(2);
    let mut p = path_exit();
    let (a, mut b) = linked(&mut p);
    // B jumps to the window's last number; the cell after it is beyond.
    p.send(
        &mut b,
        1,
        RelayCommand::CONFLUX_SWITCH,
        0,
        &ConfluxSwitch {
            relative_seq: window as u32 - 1,
        }
        .encode(),
        false,
    );
    p.send(&mut b, 1, RelayCommand::DATA, 1, b"x", false);
    p.send(&mut b, 1, RelayCommand::DATA, 1, b"y", false);
    p.r_to_x();
    let gone = destroyed_ids(&mut p);
    assert!(gone.contains(&a.id) && gone.contains(&b.id), "{gone:?}");
    assert_eq!(p.x.core.switch_stats().path_out_of_order, 1);
}

/// A set whose stream was opened on A (seq 1) and whose seq 2 never comes: B announces
/// SWITCH(+2), so every cell it carries is buffered. Returns (A, B).
fn stalled_set(p: &mut Path) -> (Circ, Circ) {
    let (mut a, mut b) = linked(p);
    to_x(p, &mut a, RelayCommand::BEGIN, 1, b"127.0.0.1:80\0");
    p.connect_at_x();
    let body = ConfluxSwitch { relative_seq: 2 }.encode();
    p.send(&mut b, 1, RelayCommand::CONFLUX_SWITCH, 0, &body, false);
    (a, b)
}

/// Streams `data_on` spreads its cells over: each stream's own bound (one 500-cell stream
/// window per leg, fixed windows) stays out of the way of the set's (`max_buffered`).
const SPREAD: usize = 8;

/// Send `n` DATA cells on `b`, round robin over streams 1..=SPREAD, carrying them to X and
/// X's answers back every 50; returns how many circuit SENDMEs came back on `b`.
fn data_on(p: &mut Path, b: &mut Circ, n: usize) -> usize {
    spread_on(p, b, n, SPREAD)
}

/// [`data_on`] over streams 1..=`streams`.
fn spread_on(p: &mut Path, b: &mut Circ, n: usize, streams: usize) -> usize {
    let mut sendmes = 0;
    for i in 0..n {
        let sid = 1 + (i % streams) as u16;
        p.send(b, 1, RelayCommand::DATA, sid, &[7; 400], false);
        if i % 50 == 49 || i + 1 == n {
            p.r_to_x();
            p.x_to_r();
            sendmes += p
                .read(b)
                .iter()
                .filter(|m| m.cmd == RelayCommand::SENDME && m.sid == 0)
                .count();
        }
    }
    sendmes
}

/// The exit's guarantee against a hostile sender (docs/protocol.md, "Limits at the receiver"):
/// from 1000 buffered cells on, B's circuit SENDMEs are withheld (an honest client stops
/// within one window); a client that ignores that and keeps sending reaches the bound an
/// honest one cannot cause on one leg (1000 + 2000 + 256 cells, `max_buffered_per_leg`: B is
/// the only leg ahead, so it trips before the set's 1000 + 2 × 2000 + 256) and its set is
/// closed with a logged protocol error. Another circuit through the same relays keeps
/// answering.
#[test]
fn a_client_that_ignores_withheld_sendmes_loses_its_set_only() {
    let limits = PathLimits::default();
    let bound = limits.max_buffered_per_leg() as usize;
    assert!(bound < limits.max_buffered(2) as usize);
    let mut p = path_exit();
    let mut other = p.create2();
    let (a, mut b) = stalled_set(&mut p);
    // Up to the threshold SENDMEs come as usual (cells 100..=900); from the 1000th, none.
    assert_eq!(data_on(&mut p, &mut b, 999), 9);
    assert_eq!(data_on(&mut p, &mut b, bound - 999), 0);
    let x = p.x.core.switch_stats();
    assert_eq!(x.path_out_of_order_peak, bound as u64, "{x:?}");
    assert_eq!(x.path_sendmes_withheld, (bound / 100 - 9) as u64, "{x:?}");
    assert_eq!(x.violations, 0);
    assert!(p.x.core.stats().mem_in_queues >= bound * CELL_MEM_COST);
    one_cell_more_closes_the_set_only(&mut p, &a, &mut b, &mut other);
}

/// One cell more than an honest client can cause, on stream 1 of leg `b`: the set (`a`, `b`)
/// is destroyed with a logged protocol error, its buffer given back, and `other` still answers.
fn one_cell_more_closes_the_set_only(p: &mut Path, a: &Circ, b: &mut Circ, other: &mut Circ) {
    p.send(b, 1, RelayCommand::DATA, 1, &[7; 400], false);
    p.r_to_x();
    assert_set_destroyed(p, a, b, DestroyReason::PROTOCOL);
    assert_eq!(p.x.core.switch_stats().violations, 1);
    assert!(p.x.core.stats().mem_in_queues < 100 * CELL_MEM_COST);
    assert_other_answers(p, other);
}

/// The per-stream bound under fixed windows: the client keeps one 500-cell stream window per
/// leg, so one stream's cells held out of order plus those delivered and unacknowledged stay
/// within 2 × 500 (two legs). B floods stream 1 while A's seq 2 never comes: 1000 cells are
/// held (no violation, far below the set's bound), the 1001st closes the set with a logged
/// protocol error, and another circuit through the same relays keeps answering.
#[test]
fn a_stream_flooded_past_its_legs_windows_closes_its_set_only() {
    let mut p = path_exit();
    let mut other = p.create2();
    let (a, mut b) = stalled_set(&mut p);
    spread_on(&mut p, &mut b, 1000, 1);
    let x = p.x.core.switch_stats();
    assert_eq!((x.violations, x.path_out_of_order_peak), (0, 1000), "{x:?}");
    assert!(1000 < PathLimits::default().max_buffered(2));
    one_cell_more_closes_the_set_only(&mut p, &a, &mut b, &mut other);
}

/// An honest client's view of the same stall: once the gap fills (seq 2 arrives on A), the
/// buffer is delivered and the withheld SENDMEs go out, in order, so B's window refills.
#[test]
fn withheld_sendmes_are_released_when_the_gap_fills() {
    let mut p = path_exit();
    let (mut a, mut b) = stalled_set(&mut p);
    // Cells 100..=900 came below the threshold; 1000..=1500 at or above it.
    assert_eq!(data_on(&mut p, &mut b, 1500), 9);
    assert_eq!(p.x.core.switch_stats().path_sendmes_withheld, 6);
    to_x(&mut p, &mut a, RelayCommand::DATA, 1, b"2");
    p.x_to_r();
    let back: Vec<_> = p
        .read(&mut b)
        .into_iter()
        .filter(|m| m.cmd == RelayCommand::SENDME && m.sid == 0)
        .collect();
    assert_eq!(back.len(), 6, "the withheld SENDMEs are released");
    // And later SENDMEs flow at once again.
    assert_eq!(data_on(&mut p, &mut b, 100), 1);
    let x = p.x.core.switch_stats();
    assert_eq!((x.violations, x.path_sendmes_withheld), (0, 6), "{x:?}");
    assert_eq!(p.x.core.stats().circuits_killed, 0);
}

/// `MaxMemInQueues` sees the out-of-order buffer: over the limit, the set whose buffered
/// cell is the oldest data is closed (every leg, RESOURCELIMIT) and its memory freed; another
/// circuit stays.
#[test]
fn the_oom_handler_counts_and_frees_the_out_of_order_buffer() {
    let mut p = path_exit();
    let mut other = p.create2();
    let (a, mut b) = stalled_set(&mut p);
    data_on(&mut p, &mut b, 300);
    let held = p.x.core.stats().mem_in_queues;
    assert!(held >= 300 * CELL_MEM_COST, "the buffer counts: {held}");
    let now = p.now;
    p.x.core.set_max_mem_in_queues(200 * CELL_MEM_COST, now);
    assert_set_destroyed(&mut p, &a, &b, DestroyReason::RESOURCELIMIT);
    let st = p.x.core.stats();
    assert_eq!(st.oom_circuits_killed, 2, "both legs");
    assert!(st.mem_in_queues < 200 * CELL_MEM_COST, "{st:?}");
    assert_other_answers(&mut p, &mut other);
}

#[test]
fn unexpected_links_close_their_circuit() {
    // A LINK after the circuit carried a stream.
    let mut p = path_exit();
    let mut c = p.create2();
    to_x(&mut p, &mut c, RelayCommand::BEGIN, 1, b"127.0.0.1:80\0");
    to_x(&mut p, &mut c, RelayCommand::CONFLUX_LINK, 0, &link_body(2));
    assert!(closed(&mut p, &c));
    // A LINK repeated on one circuit.
    let mut p = path_exit();
    let mut c = p.create2();
    to_x(&mut p, &mut c, RelayCommand::CONFLUX_LINK, 0, &link_body(2));
    to_x(&mut p, &mut c, RelayCommand::CONFLUX_LINK, 0, &link_body(2));
    assert!(closed(&mut p, &c));
    // A malformed LINK.
    let mut p = path_exit();
    let mut c = p.create2();
    to_x(&mut p, &mut c, RelayCommand::CONFLUX_LINK, 0, &[1, 2, 3]);
    assert!(closed(&mut p, &c));
    // A LINK to a relay that is not the last hop (R, hop 0 of a two-hop circuit).
    let mut p = path_exit();
    p.r.core.set_switching(SwitchSettings {
        mode: SwitchMode::Path,
        ..SwitchSettings::default()
    });
    let mut c = p.create2();
    p.send(
        &mut c,
        0,
        RelayCommand::CONFLUX_LINK,
        0,
        &link_body(2),
        false,
    );
    let cells = p.cells_for_client();
    assert!(destroys(&cells).iter().any(|(id, _)| *id == c.id));
    // A fifth leg.
    let mut p = path_exit();
    let mut legs: Vec<Circ> = (0..5).map(|_| p.create2()).collect();
    for c in legs.iter_mut().take(4) {
        to_x(&mut p, c, RelayCommand::CONFLUX_LINK, 0, &link_body(3));
    }
    to_x(
        &mut p,
        &mut legs[4],
        RelayCommand::CONFLUX_LINK,
        0,
        &link_body(3),
    );
    assert!(closed(&mut p, &legs[4]));
    assert!(p.x_answers(&mut legs[0], 1));
}

#[test]
fn client_side_messages_sent_to_the_exit_close_the_circuit() {
    for cmd in [
        RelayCommand::SWITCH_CONFIRM,
        RelayCommand::CONGESTED,
        RelayCommand::CONFLUX_LINKED,
    ] {
        let mut p = path_exit();
        let (mut a, _b) = linked(&mut p);
        to_x(&mut p, &mut a, cmd, 0, &[0; 8]);
        assert!(closed(&mut p, &a), "{cmd} did not close the circuit");
    }
}

#[test]
fn an_exit_with_switching_off_ignores_link() {
    let mut p = Path::new(Default::default());
    let mut c = p.create2();
    to_x(&mut p, &mut c, RelayCommand::CONFLUX_LINK, 0, &link_body(4));
    assert_eq!(from_x(&mut p, &mut c), vec![]);
    assert!(p.x_answers(&mut c, 1));
}
