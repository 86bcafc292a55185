//! RELAY_EARLY (tor-spec §5.6): EXTEND2 must come in one, at most eight are accepted per
//! circuit from the client's side, other messages in one are handled like RELAY, one passing
//! through goes on as RELAY_EARLY, and one coming from the exit's side closes the circuit, at a
//! relay and at the client.

use crate::common;

use chive_cell::{CellCommand, DestroyReason, RelayCommand};
use chive_core::{CoreConfig, Event};
use common::{destroys, Path};

/// One more than the RELAY_EARLY cells a circuit may carry (tor-spec's limit is 8).
const TOO_MANY: usize = 9;

#[test]
fn extend2_in_relay_early_builds_the_next_hop() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    assert_eq!(circ.crypto.len(), 2);
    assert_eq!(p.r.core.stats().circuits, 1);
    assert_eq!(p.x.core.stats().circuits, 1);
    // The two hops work: X answers a BEGIN through R.
    p.send_begin_to_x(&mut circ, 1, false);
    assert!(matches!(
        p.x.core.poll_event(),
        Some(Event::ExitConnect { port: 80, .. })
    ));
}

#[test]
fn extend2_in_a_plain_relay_cell_closes_the_circuit() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create();
    p.send_extend2(&mut circ, false);
    assert_eq!(
        destroys(&p.cells_for_client()),
        vec![(circ.id, DestroyReason::PROTOCOL)]
    );
    assert_eq!(p.r.core.stats().circuits, 0);
    assert_eq!(p.r.core.stats().circuits_killed, 1);
    // Nothing went toward X.
    assert_eq!(p.r_to_x(), 0);
}

#[test]
fn eight_relay_early_cells_pass_and_the_ninth_closes_the_circuit() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create();
    // DROP is recognized at R and ignored: only the RELAY_EARLY count changes.
    for i in 1..TOO_MANY {
        p.send(&mut circ, 0, RelayCommand::DROP, 0, &[], true);
        assert_eq!(p.r.core.stats().circuits, 1, "closed after {i} RELAY_EARLY");
        assert!(p.cells_for_client().is_empty());
    }
    // Plain RELAY cells do not count.
    for _ in 0..20 {
        p.send(&mut circ, 0, RelayCommand::DROP, 0, &[], false);
    }
    assert_eq!(p.r.core.stats().circuits, 1);
    p.send(&mut circ, 0, RelayCommand::DROP, 0, &[], true);
    assert_eq!(
        destroys(&p.cells_for_client()),
        vec![(circ.id, DestroyReason::PROTOCOL)]
    );
    assert_eq!(p.r.core.stats().circuits, 0);
    assert_eq!(p.r.core.stats().circuits_killed, 1);
}

#[test]
fn relay_early_limit_counts_cells_passing_through() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    // The EXTEND2 was the first; seven more for X pass R.
    for _ in 2..TOO_MANY {
        p.send(&mut circ, 1, RelayCommand::DROP, 0, &[], true);
    }
    assert_eq!(p.r_to_x(), 7);
    assert_eq!(p.r.core.stats().circuits, 1);
    p.send(&mut circ, 1, RelayCommand::DROP, 0, &[], true);
    assert_eq!(p.r.core.stats().circuits, 0);
    assert_eq!(
        destroys(&p.cells_for_client()),
        vec![(circ.id, DestroyReason::PROTOCOL)]
    );
}

#[test]
fn relay_early_passing_through_stays_relay_early() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    p.send(&mut circ, 1, RelayCommand::DROP, 0, &[], true);
    p.send(&mut circ, 1, RelayCommand::DROP, 0, &[], false);
    let cells = common::drain(&mut p.r.core, common::R_TO_X, p.now);
    let commands: Vec<CellCommand> = cells.iter().map(|c| c.command).collect();
    assert_eq!(commands, [CellCommand::RELAY_EARLY, CellCommand::RELAY]);
}

#[test]
fn other_messages_in_relay_early_are_handled_like_relay() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    // A BEGIN in RELAY_EARLY reaches X and opens a stream there.
    assert_eq!(p.send_begin_to_x(&mut circ, 1, true), 1);
    p.connect_at_x();
    p.x_to_r();
    let msgs = p.read(&mut circ);
    assert_eq!(msgs[0].cmd, RelayCommand::CONNECTED);
    assert_eq!((msgs[0].hop, msgs[0].sid), (1, 1));
    assert_eq!(p.x.core.stats().streams, 1);
}

/// tor-spec §5.6: a node that receives an inbound RELAY_EARLY cell (from the exit's side) MUST
/// close the circuit. Passing one on toward the client would let a relay mark circuits for
/// another relay nearer the client to see (the 2014 relay-early traffic confirmation attack).
#[test]
fn relay_early_from_the_next_hop_closes_the_circuit_at_a_relay() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    p.send_begin_to_x(&mut circ, 1, false);
    p.connect_at_x();
    let mut back = common::drain(&mut p.x.core, common::X_FROM_R, p.now);
    assert_eq!(back.len(), 1, "X sends CONNECTED");
    back[0].command = CellCommand::RELAY_EARLY;
    p.r.core.handle_cell(common::R_TO_X, back.remove(0), p.now);

    assert_eq!(
        p.cells_for_client()
            .iter()
            .map(|c| (c.circ_id, c.command))
            .collect::<Vec<_>>(),
        [(circ.id, CellCommand::DESTROY)],
        "the cell is not passed on; the client gets DESTROY"
    );
    assert_eq!(p.r.core.stats().circuits, 0);
    assert_eq!(p.r.core.stats().circuits_killed, 1);
    assert_eq!(
        destroys(&common::drain(&mut p.r.core, common::R_TO_X, p.now)).len(),
        1
    );
}

/// The same rule at the client: a RELAY_EARLY from its guard closes the circuit.
#[test]
fn relay_early_toward_the_client_closes_the_circuit_at_the_client() {
    use chive_core::{ChannelId, Core};
    let mut r = common::relay(
        1,
        CoreConfig {
            exit: true,
            ..CoreConfig::default()
        },
    );
    let mut client = Core::new(CoreConfig::default(), [9; 32]);
    let now = std::time::Instant::now();
    let chan = ChannelId(1);
    client.channel_opened(chan, Some(r.hop.identity), true, now);
    r.core.channel_opened(chan, None, false, now);
    // Move cells both ways until neither side has any.
    let pump = |client: &mut Core, r: &mut Core| loop {
        let up = common::drain(client, chan, now);
        let down = common::drain(r, chan, now);
        if up.is_empty() && down.is_empty() {
            break;
        }
        up.into_iter().for_each(|c| r.handle_cell(chan, c, now));
        down.into_iter()
            .for_each(|c| client.handle_cell(chan, c, now));
    };
    let circ = client.launch_circuit(vec![r.hop.clone()], now);
    pump(&mut client, &mut r.core);
    assert_eq!(client.poll_event(), Some(Event::CircuitBuilt { circ }));
    client.open_stream(circ, "127.0.0.1", 80, now).unwrap();
    pump(&mut client, &mut r.core);
    let Some(Event::ExitConnect { stream, .. }) = r.core.poll_event() else {
        panic!("the exit did not open the stream");
    };
    r.core
        .exit_connected(stream, ([127, 0, 0, 1], 80).into(), now);
    let mut down = common::drain(&mut r.core, chan, now);
    assert_eq!(down.len(), 1, "the exit sends CONNECTED");
    down[0].command = CellCommand::RELAY_EARLY;
    client.handle_cell(chan, down.remove(0), now);

    let events: Vec<Event> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CircuitClosed { circ: c, .. } if *c == circ)),
        "circuit not closed: {events:?}"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::StreamConnected { .. })));
    assert_eq!(client.stats().circuits, 0);
}
