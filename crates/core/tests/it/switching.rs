//! Circuit switching, connection variant (paper 003, issue 16), through real cores: a client,
//! an entry E, a middle M and an exit X in memory, links with a per-step write budget and a
//! delay, simulated time. The entry moves a circuit from its congested connection to M onto a
//! switch connection during a transfer; every byte arrives once and in order both ways. Then
//! every hostile or failed switch: each closes at most its own circuit, the rest keeps flowing.

use std::time::Duration;

use chive_cell::{Cell, CellCommand, Destroy, DestroyReason, SwitchConn, SwitchMarker};
use chive_core::{
    ChannelId, CircKey, CoreConfig, SchedulerKind, StreamHandle, SwitchMode, SwitchOutcome,
    SwitchSettings, SWITCH_IDLE_CLOSE,
};

use crate::sim::{pattern, Link, Shape, Sim};

const CLIENT: usize = 0;
const E: usize = 1;
const M: usize = 2;
const X: usize = 3;

/// A client, E, M and X (relays 0, 1, 2, all exits, EWMA); links of 32 cells a step and 2 steps
/// of delay, E's first connection to M 4 cells a step and 20 steps.
type Net = Sim;

trait Switching {
    fn new(modes: [SwitchMode; 3]) -> Self;
    /// A circuit client, E, M, X.
    fn build(&mut self) -> CircKey;
    fn open(&mut self, circ: CircKey) -> StreamHandle;
    fn transfer(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        at: impl FnMut(usize, &mut Net),
    );
    fn e_to_m(&self) -> (ChannelId, ChannelId);
    fn assert_exact(&self, streams: &[(StreamHandle, Vec<u8>)]);
}

impl Switching for Net {
    fn new(modes: [SwitchMode; 3]) -> Self {
        let mut sim = Sim::overlay(11, vec![CoreConfig::default()], 3, |_| CoreConfig {
            exit: true,
            scheduler: SchedulerKind::Ewma { halflife: 30.0 },
            ..CoreConfig::default()
        });
        for (i, mode) in modes.into_iter().enumerate() {
            sim.nodes[1 + i].set_switching(SwitchSettings {
                mode,
                timeout: Duration::from_millis(2000),
                ..SwitchSettings::default()
            });
        }
        sim.shape = Shape {
            budget: 32,
            delay: 2,
        };
        sim.slow = Some((
            E,
            M,
            Shape {
                budget: 4,
                delay: 20,
            },
        ));
        sim
    }

    fn build(&mut self) -> CircKey {
        self.build_through(CLIENT, &[0, 1, 2], 2000)
    }

    fn open(&mut self, circ: CircKey) -> StreamHandle {
        self.open_on(CLIENT, circ, 2000)
    }

    fn transfer(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        at: impl FnMut(usize, &mut Net),
    ) {
        self.echo_transfer(CLIENT, streams, steps, at);
    }

    fn e_to_m(&self) -> (ChannelId, ChannelId) {
        let ((_, c), l) = self
            .links
            .iter()
            .filter(|((n, c), l)| *n == E && l.peer == M && !self.nodes[E].is_switch_channel(*c))
            .min_by_key(|((_, c), _)| c.0)
            .unwrap();
        (*c, l.pchan)
    }

    fn assert_exact(&self, streams: &[(StreamHandle, Vec<u8>)]) {
        if std::env::var("SIM_DEBUG").is_ok() {
            for n in 0..4 {
                eprintln!("node {n}: {}", self.nodes[n].debug_dump(self.now));
            }
            for ((n, c), l) in &self.links {
                eprintln!(
                    "link {n} {c:?} -> {} pipe {} cells {}",
                    l.peer,
                    l.pipe.len(),
                    l.ids.len()
                );
            }
        }
        self.assert_echo(CLIENT, streams);
    }
}

const ALL: [SwitchMode; 3] = [SwitchMode::Connection; 3];

/// Two circuits share E's slow connection to M; a bulk echo on one, a trickle on the other.
fn two_circuits(net: &mut Net, bulk: usize) -> Vec<(StreamHandle, Vec<u8>)> {
    let a = net.build();
    let b = net.build();
    let sa = net.open(a);
    let sb = net.open(b);
    vec![(sa, pattern(bulk, 0)), (sb, pattern(20_000, 0x5a))]
}

#[test]
fn switch_during_transfer_delivers_every_byte_once_in_order() {
    let mut net = Net::new(ALL);
    let streams = two_circuits(&mut net, 1_500_000);
    let (c1, _) = net.e_to_m();
    let mut chosen = None;
    net.transfer(&streams, 200_000, |i, net| {
        if i == 300 {
            chosen = net.nodes[E].congested(c1, 0.0, net.now);
        }
    });
    assert!(chosen.is_some(), "the entry chose no circuit to move");
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let e = net.nodes[E].switch_stats();
    let m = net.nodes[M].switch_stats();
    assert_eq!((e.triggered, e.switches, e.completed), (1, 1, 1), "{e:?}");
    assert_eq!(m.accepted, 1, "{m:?}");
    assert_eq!(e.cells_lost + m.cells_lost, 0);
    assert_eq!(e.violations + m.violations, 0);
    // The slow old connection made the hold-back necessary in both directions.
    assert!(m.cells_held > 0 && e.cells_held > 0, "{e:?} {m:?}");
    let rec = net.nodes[E].poll_switch_record().expect("a switch record");
    assert_eq!(rec.outcome, SwitchOutcome::Switched);
    assert_eq!(rec.from, c1);
    assert!(rec.ended > rec.triggered);
    // The paper's switch time: the circuit's last cell on C1 to its first on C2.
    let last_old = rec.last_old.expect("cells left on C1 during the switch");
    assert!(
        last_old >= rec.triggered && last_old <= rec.ended,
        "{rec:?}"
    );
    // The moved circuit's cells really went on the switch connection, both ways.
    let sw: Vec<&Link> = net
        .links
        .iter()
        .filter(|((n, c), _)| *n == E && net.nodes[E].is_switch_channel(*c))
        .map(|(_, l)| l)
        .collect();
    assert_eq!(sw.len(), 1);
    assert!(sw[0].ids.len() > 100, "few cells on the switch connection");
    let back = &net.links[&(M, sw[0].pchan)];
    assert!(
        back.ids.len() > 100,
        "few backward cells on the switch connection"
    );
    // The bulk circuit moved (highest EWMA count), the trickle stayed.
    assert_eq!(
        net.nodes[E].congested(c1, 0.0, net.now),
        None,
        "one circuit left on C1"
    );
}

#[test]
fn a_second_switch_reuses_the_switch_connection() {
    let mut net = Net::new(ALL);
    let a = net.build();
    let b = net.build();
    let c = net.build();
    let streams: Vec<(StreamHandle, Vec<u8>)> = [a, b, c]
        .iter()
        .enumerate()
        .map(|(i, &k)| (net.open(k), pattern(300_000, i as u8)))
        .collect();
    let (c1, _) = net.e_to_m();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 200 || i == 400 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
    });
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[E].switch_stats().completed, 2);
    let switch_links = net
        .links
        .keys()
        .filter(|(n, c)| *n == E && net.nodes[E].is_switch_channel(*c))
        .count();
    assert_eq!(switch_links, 1, "one switch connection per peer");
}

/// Issue 16, the first lab run: once the bulk circuit had moved, the old connection (still
/// full of its bytes) kept triggering and the entry moved 5- and 7-cell circuits. A circuit
/// whose EWMA count plus queued cells is below `min_share` of the connection's load stays.
#[test]
fn light_circuits_stay_after_the_bulk_one_moved() {
    let mut net = Net::new(ALL);
    let bulk = net.build();
    let light1 = net.build();
    let light2 = net.build();
    let streams = vec![
        (net.open(bulk), pattern(1_500_000, 0)),
        (net.open(light1), pattern(2_000, 1)),
        (net.open(light2), pattern(3_000, 2)),
    ];
    let (c1, _) = net.e_to_m();
    // The detector's estimate when it fires: 64 KB queued (128 cells).
    let load = 65_536.0;
    let mut chosen = Vec::new();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 300 {
            chosen.push(net.nodes[E].congested(c1, load, net.now));
        }
    });
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(chosen, [Some(bulk)], "the bulk circuit moves");
    // The old connection is reported congested again, twice: the light circuits stay.
    for _ in 0..2 {
        assert_eq!(
            net.nodes[E].congested(c1, load, net.now),
            None,
            "light circuits stay on the old connection"
        );
        net.run(100);
    }
    let e = net.nodes[E].switch_stats();
    assert_eq!((e.triggered, e.completed), (1, 1), "{e:?}");
    // With the share test off (the paper's rule: always the heaviest), the same congestion
    // report moves a light circuit: the test above is what keeps it.
    let settings = net.nodes[E].switching();
    net.nodes[E].set_switching(SwitchSettings {
        min_share_milli: 0,
        ..settings
    });
    let moved = net.nodes[E].congested(c1, load, net.now);
    assert!(
        moved == Some(light1) || moved == Some(light2),
        "share 0 moves a light circuit: {moved:?}"
    );
    net.run(5000);
    assert_eq!(net.killed(), 0);
}

#[test]
fn no_switch_when_off_or_alone() {
    let mut net = Net::new([SwitchMode::Off; 3]);
    let a = net.build();
    let _b = net.build();
    let (c1, _) = net.e_to_m();
    assert_eq!(net.nodes[E].congested(c1, 0.0, net.now), None, "mode off");
    let mut net = Net::new(ALL);
    let _a = net.build();
    let (c1, _) = net.e_to_m();
    assert_eq!(
        net.nodes[E].congested(c1, 0.0, net.now),
        None,
        "a lone circuit"
    );
    // M is not the entry of anything: its connections never switch.
    let mut net2 = Net::new(ALL);
    let _ = net2.build();
    let _ = net2.build();
    let m_to_x = *net2
        .links
        .keys()
        .find(|(n, c)| *n == M && net2.links[&(*n, *c)].peer == X)
        .unwrap();
    assert_eq!(net2.nodes[M].congested(m_to_x.1, 0.0, net2.now), None);
    let _ = a;
}

#[test]
fn a_next_hop_with_switching_off_refuses_and_nothing_is_lost() {
    let mut net = Net::new([
        SwitchMode::Connection,
        SwitchMode::Off,
        SwitchMode::Connection,
    ]);
    let streams = two_circuits(&mut net, 400_000);
    let (c1, _) = net.e_to_m();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 100 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
    });
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let e = net.nodes[E].switch_stats();
    assert_eq!((e.refused, e.switches), (1, 0), "{e:?}");
    let rec = net.nodes[E].poll_switch_record().unwrap();
    assert_eq!(rec.outcome, SwitchOutcome::Refused);
}

#[test]
fn no_ack_in_time_falls_back_to_the_old_connection() {
    let mut net = Net::new(ALL);
    // M's answers on the switch connection never arrive.
    net.mute_switch_peer = true;
    let streams = two_circuits(&mut net, 400_000);
    let (c1, _) = net.e_to_m();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 100 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
    });
    net.idle(3000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let e = net.nodes[E].switch_stats();
    assert_eq!((e.timed_out, e.switches), (1, 0), "{e:?}");
    assert_eq!(
        net.nodes[E].poll_switch_record().unwrap().outcome,
        SwitchOutcome::TimedOut
    );
    // The DESTROY on the new id cancelled M's reservation; the circuit stayed on C1.
    assert_eq!(net.nodes[M].switch_stats().accepted, 0);
}

#[test]
fn switch_connection_that_cannot_open_leaves_the_circuit() {
    let mut net = Net::new(ALL);
    net.fail_switch_connect = true;
    let streams = two_circuits(&mut net, 200_000);
    let (c1, _) = net.e_to_m();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 50 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
    });
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[E].switch_stats().failed, 1);
}

// ---- hostile requests: forged cells injected at M ----

fn switch_conn(id: u32, seq: u32, old: u32) -> Cell {
    Cell::new(
        id,
        CellCommand::SWITCH_CONN,
        &SwitchConn {
            seq,
            old_circ_id: old,
        }
        .encode(),
    )
    .unwrap()
}

/// Two circuits built, streams open; a second plain channel from E to M for forged requests.
/// Returns (net, streams, M's end of C1, M's end of the extra channel, the circuit ids E used
/// on C1).
#[allow(clippy::type_complexity)]
fn hostile_setup() -> (
    Net,
    Vec<(StreamHandle, Vec<u8>)>,
    ChannelId,
    ChannelId,
    Vec<u32>,
) {
    let mut net = Net::new(ALL);
    let streams = two_circuits(&mut net, 50_000);
    let (c1, m_c1) = net.e_to_m();
    let mut ids: Vec<u32> = net.links[&(E, c1)].ids.clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "two circuits on C1");
    let (_, m_c2) = net.connect(E, M, false);
    (net, streams, m_c1, m_c2, ids)
}

/// DESTROY cells node `n` has waiting on `chan`, with their reasons (taken off its queue).
fn destroys(net: &mut Net, n: usize, chan: ChannelId) -> Vec<(u32, DestroyReason)> {
    let mut out = Vec::new();
    let now = net.now;
    net.nodes[n].poll_transmit(chan, 1000, now, &mut out);
    out.iter()
        .filter(|c| c.command == CellCommand::DESTROY)
        .map(|c| (c.circ_id, Destroy::decode(&c.payload).unwrap().reason))
        .collect()
}

fn finish_and_check(net: &mut Net, streams: &[(StreamHandle, Vec<u8>)], killed: u64) {
    net.transfer(streams, 100_000, |_, _| {});
    assert_eq!(net.killed(), killed, "circuits killed");
}

#[test]
fn hostile_requests_are_refused_and_others_keep_flowing() {
    // Unknown circuit, malformed, from a client, from the next hop: refused with DESTROY on
    // the new id, no circuit closed, both streams finish.
    let (mut net, streams, _m_c1, m_c2, ids) = hostile_setup();
    let now = net.now;
    let before = net.nodes[M].switch_stats().violations;
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0101, 0, 0x7777_7777), now);
    let bad = Cell::new(0x8000_0102, CellCommand::SWITCH_CONN, &[0, 0, 0]).unwrap();
    net.nodes[M].handle_cell(m_c2, bad, now);
    assert_eq!(net.nodes[M].switch_stats().violations, before + 2);
    assert_eq!(
        destroys(&mut net, M, m_c2),
        vec![
            (0x8000_0101, DestroyReason::PROTOCOL),
            (0x8000_0102, DestroyReason::PROTOCOL)
        ]
    );
    // From the client, at E: a client has no identity, so it may never move a circuit.
    let client_chan = *net
        .links
        .iter()
        .find(|((n, _), l)| *n == E && l.peer == CLIENT)
        .unwrap()
        .0;
    let ids_client: Vec<u32> = net.links[&(CLIENT, net.links[&client_chan].pchan)]
        .ids
        .clone();
    net.nodes[E].handle_cell(client_chan.1, switch_conn(0x101, 0, ids_client[0]), now);
    assert_eq!(net.nodes[E].switch_stats().violations, 1);
    // From the next hop: X names the circuit's id on the M–X channel.
    let (&(_, x_chan), _) = net
        .links
        .iter()
        .find(|((n, _), l)| *n == X && l.peer == M)
        .unwrap();
    let m_x = net.links[&(X, x_chan)].pchan;
    let mx_ids = net.links[&(M, m_x)].ids.clone();
    net.nodes[M].handle_cell(m_x, switch_conn(0x0000_0201, 0, mx_ids[0]), now);
    assert_eq!(net.nodes[M].switch_stats().violations, before + 3);
    finish_and_check(&mut net, &streams, 0);
    net.assert_exact(&streams);
    let _ = ids;
}

#[test]
fn replayed_or_concurrent_requests_close_only_their_circuit() {
    // A request for a real circuit while one is pending: that circuit closes; the other
    // circuit's stream finishes.
    let (mut net, _streams, _m_c1, m_c2, ids) = hostile_setup();
    let now = net.now;
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0301, 0, ids[0]), now);
    assert_eq!(net.nodes[M].switch_stats().violations, 0, "first is valid");
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0302, 0, ids[0]), now);
    assert_eq!(net.nodes[M].switch_stats().violations, 1);
    assert_eq!(net.nodes[M].stats().circuits_killed, 1);
    // A skipped switch number (replay of an old one looks the same: not the next number).
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0303, 5, ids[1]), now);
    assert_eq!(net.nodes[M].stats().circuits_killed, 2);
}

#[test]
fn replayed_request_after_a_switch_closes_the_circuit() {
    let mut net = Net::new(ALL);
    let streams = two_circuits(&mut net, 300_000);
    let (c1, _) = net.e_to_m();
    net.transfer(&streams, 200_000, |i, net| {
        if i == 100 {
            net.nodes[E].congested(c1, 0.0, net.now).unwrap();
        }
    });
    net.run(3000);
    net.assert_exact(&streams);
    assert_eq!(net.nodes[M].switch_stats().accepted, 1);
    // Replay the SWITCH_CONN E sent: its first cell on the switch connection, same id, same
    // body. The id is the moved circuit's now: the circuit closes.
    let (_, l) = net
        .links
        .iter()
        .find(|((n, c), _)| *n == E && net.nodes[E].is_switch_channel(*c))
        .unwrap();
    let (m_sw, y) = (l.pchan, l.ids[0]);
    let x = net.links[&(E, c1)].ids[0];
    let now = net.now;
    net.nodes[M].handle_cell(m_sw, switch_conn(y, 0, x), now);
    assert_eq!(net.nodes[M].stats().circuits_killed, 1);
    assert_eq!(net.nodes[M].stats().circuits, 1, "the other circuit lives");
}

#[test]
fn too_many_pending_requests_are_refused() {
    let mut net = Net::new(ALL);
    let circs: Vec<CircKey> = (0..6).map(|_| net.build()).collect();
    let (c1, _m_c1) = net.e_to_m();
    // Make every circuit send a cell so its id shows on C1.
    for &c in &circs {
        let _ = net.open(c);
    }
    let mut ids: Vec<u32> = net.links[&(E, c1)].ids.clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6);
    let (_, m_c2) = net.connect(E, M, false);
    let now = net.now;
    for (i, &id) in ids.iter().enumerate() {
        net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0400 + i as u32, 0, id), now);
    }
    let m = net.nodes[M].switch_stats();
    assert_eq!(m.violations, 2, "{m:?}");
    assert_eq!(net.nodes[M].stats().circuits_killed, 0);
}

#[test]
fn unexpected_or_wrong_markers_close_their_circuit() {
    let (mut net, streams, m_c1, m_c2, ids) = hostile_setup();
    let now = net.now;
    // A SWITCH without an accepted switch.
    let marker = |id: u32, seq: u32, cells: u64| {
        Cell::new(
            id,
            CellCommand::SWITCH,
            &SwitchMarker { seq, cells }.encode(),
        )
        .unwrap()
    };
    net.nodes[M].handle_cell(m_c1, marker(ids[0], 0, 0), now);
    assert_eq!(net.nodes[M].stats().circuits_killed, 1);
    // An accepted switch, then a marker with a wrong count.
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0501, 0, ids[1]), now);
    net.nodes[M].handle_cell(m_c1, marker(ids[1], 0, 999_999), now);
    assert_eq!(net.nodes[M].stats().circuits_killed, 2);
    // Other relays' circuits are fine; nothing is left of the two at M.
    assert_eq!(net.nodes[M].stats().circuits, 0);
    let _ = streams;
    // A DESTROY on a reserved new id cancels, it never closes the circuit.
    let (mut net, streams, _m_c1, m_c2, ids) = hostile_setup();
    let now = net.now;
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0601, 0, ids[0]), now);
    let d = Cell::new(
        0x8000_0601,
        CellCommand::DESTROY,
        &Destroy {
            reason: DestroyReason::TIMEOUT,
        }
        .encode(),
    )
    .unwrap();
    net.nodes[M].handle_cell(m_c2, d, now);
    assert_eq!(net.nodes[M].stats().circuits, 2);
    // ... and the switch number was not used up: a fresh request is accepted.
    net.nodes[M].handle_cell(m_c2, switch_conn(0x8000_0602, 0, ids[0]), now);
    assert_eq!(net.nodes[M].switch_stats().violations, 0);
    let d2 = Cell::new(
        0x8000_0602,
        CellCommand::DESTROY,
        &Destroy {
            reason: DestroyReason::TIMEOUT,
        }
        .encode(),
    )
    .unwrap();
    net.nodes[M].handle_cell(m_c2, d2, now);
    finish_and_check(&mut net, &streams, 0);
    net.assert_exact(&streams);
}

/// Congestion building (the detector at or above α) opens the switch connection ahead, once per
/// peer; the switch that follows finds it open and sends SWITCH_CONN at once. Nothing is opened
/// ahead with switching off or in path mode, for a lone circuit, or from a switch connection.
#[test]
fn congestion_building_opens_the_switch_connection_ahead() {
    let count_switch_links = |net: &Net| {
        net.links
            .keys()
            .filter(|(n, c)| *n == E && net.nodes[E].is_switch_channel(*c))
            .count()
    };
    for mode in [SwitchMode::Off, SwitchMode::Path] {
        let mut net = Net::new([mode, SwitchMode::Connection, SwitchMode::Connection]);
        let _streams = two_circuits(&mut net, 10_000);
        let (c1, _) = net.e_to_m();
        assert!(!net.nodes[E].congestion_building(c1, net.now), "{mode:?}");
    }
    let mut net = Net::new(ALL);
    let lone = net.build();
    let _s = net.open(lone);
    let (c1, _) = net.e_to_m();
    assert!(
        !net.nodes[E].congestion_building(c1, net.now),
        "a lone circuit"
    );
    let streams = {
        let b = net.build();
        vec![
            (_s, pattern(1_000_000, 1)),
            (net.open(b), pattern(20_000, 2)),
        ]
    };
    assert!(net.nodes[E].congestion_building(c1, net.now));
    assert!(
        !net.nodes[E].congestion_building(c1, net.now),
        "once per peer"
    );
    net.run(100);
    assert_eq!(count_switch_links(&net), 1, "opened ahead");
    let sw = net
        .links
        .keys()
        .find(|(n, c)| *n == E && net.nodes[E].is_switch_channel(*c))
        .map(|(_, c)| *c)
        .unwrap();
    assert!(
        !net.nodes[E].congestion_building(sw, net.now),
        "a switch connection"
    );
    assert!(
        !net.nodes[E].congestion_building(c1, net.now),
        "already open"
    );
    let mut chosen = None;
    net.transfer(&streams, 200_000, |i, net| {
        if i == 300 {
            chosen = net.nodes[E].congested(c1, 0.0, net.now);
            // SWITCH_CONN went on the open connection in the same call.
            let link = net.links.get(&(E, sw)).unwrap();
            assert!(net.nodes[E].has_pending(sw) || !link.pipe.is_empty());
        }
    });
    assert!(chosen.is_some());
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(count_switch_links(&net), 1, "no second connection");
    let e = net.nodes[E].switch_stats();
    assert_eq!((e.switches, e.completed, e.timed_out), (1, 1, 0), "{e:?}");
}

/// The SWITCH_ACK timeout counts from SWITCH_CONN going out, not from the trigger: in session
/// 14's kept lab run the first switch of each repetition waited 1.6 s for its connection's
/// handshake and timed out 0.4 s after its SWITCH_CONN left. Here the connection opens 800 ms
/// after the trigger with a 500 ms timeout; the switch completes, and its switch time still
/// counts from the trigger.
#[test]
fn ack_timeout_counts_from_the_switch_conn_not_the_trigger() {
    let mut net = Net::new(ALL);
    let settings = net.nodes[E].switching();
    net.nodes[E].set_switching(SwitchSettings {
        timeout: Duration::from_millis(500),
        ..settings
    });
    net.defer_switch_connect = true;
    let streams = two_circuits(&mut net, 3_000_000);
    let (c1, _) = net.e_to_m();
    let mut triggered_at = None;
    net.transfer(&streams, 200_000, |i, net| {
        if i == 100 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
            triggered_at = Some(net.now);
        }
        if i == 900 {
            let asked = net
                .events
                .iter()
                .any(|(n, e)| *n == E && matches!(e, chive_core::Event::ConnectSwitch { .. }));
            assert!(asked, "the entry asked for the switch connection");
            let _ = net.connect(E, M, true);
        }
    });
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    let e = net.nodes[E].switch_stats();
    assert_eq!((e.switches, e.timed_out), (1, 0), "{e:?}");
    let rec = net.nodes[E].poll_switch_record().expect("a switch record");
    assert_eq!(rec.outcome, SwitchOutcome::Switched);
    assert_eq!(Some(rec.triggered), triggered_at);
    assert!(
        rec.ended.duration_since(rec.triggered) >= Duration::from_millis(800),
        "switch time counts from the trigger: {rec:?}"
    );
}

/// A switch connection opened ahead that no switch used is closed after `SWITCH_IDLE_CLOSE`
/// (not before); one carrying a moved circuit stays while the circuit lives and is closed a
/// minute after it ended. The circuits left on C1 keep working.
#[test]
fn idle_switch_connections_are_closed() {
    let switch_links = |net: &Net| -> Vec<ChannelId> {
        net.links
            .keys()
            .filter(|(n, c)| *n == E && net.nodes[E].is_switch_channel(*c))
            .map(|(_, c)| *c)
            .collect()
    };
    let idle = SWITCH_IDLE_CLOSE.as_millis() as usize;
    // Opened ahead, never used.
    let mut net = Net::new(ALL);
    let streams = two_circuits(&mut net, 20_000);
    let (c1, _) = net.e_to_m();
    assert!(net.nodes[E].congestion_building(c1, net.now));
    net.run(100);
    assert_eq!(switch_links(&net).len(), 1, "opened ahead");
    net.idle(idle - 1000);
    assert_eq!(switch_links(&net).len(), 1, "still open before a minute");
    net.idle(7000);
    assert!(switch_links(&net).is_empty(), "closed after a minute idle");
    assert_eq!(net.nodes[E].switch_stats().idle_closed, 1);
    // C1's circuits are untouched; a new congestion report opens a new one.
    net.transfer(&streams, 200_000, |_, _| {});
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);

    // Carrying a moved circuit: kept while it lives, closed a minute after it ended.
    let mut net = Net::new(ALL);
    let a = net.build();
    let b = net.build();
    let streams = vec![
        (net.open(a), pattern(600_000, 0)),
        (net.open(b), pattern(20_000, 0x5a)),
    ];
    let (c1, _) = net.e_to_m();
    let mut chosen = None;
    net.transfer(&streams, 200_000, |i, net| {
        if i == 200 {
            chosen = net.nodes[E].congested(c1, 0.0, net.now);
        }
    });
    net.run(5000);
    net.assert_exact(&streams);
    assert_eq!(chosen, Some(a), "the bulk circuit moved");
    assert_eq!(net.nodes[E].switch_stats().completed, 1);
    net.idle(idle + 7000);
    assert_eq!(switch_links(&net).len(), 1, "a circuit lives on it");
    let now = net.now;
    net.nodes[CLIENT].close_circuit(a, now);
    net.run(1000);
    net.idle(idle + 7000);
    assert!(
        switch_links(&net).is_empty(),
        "closed after its circuit ended"
    );
    assert_eq!(net.nodes[E].switch_stats().idle_closed, 1);
    assert_eq!(net.killed(), 0);
}

/// The ACK timeout follows the SWITCH_CONN → SWITCH_ACK round trips measured to that peer
/// (`max(SwitchTimeoutMsec, SwitchTimeoutRttFactor × RTT)`): in session 14's kept run a
/// SWITCH_CONN queued on the switch connection behind a moved circuit's bytes and its ACK came
/// after the fixed 2 s. Here a first ACK takes ~0.4 s (under the 0.5 s floor), a second ~0.9
/// s: factor 3 waits for it, factor 0 (the fixed floor) times out. Returns E's counters.
fn slow_second_ack(factor: u32) -> chive_core::SwitchStats {
    let mut net = Net::new(ALL);
    let settings = net.nodes[E].switching();
    net.nodes[E].set_switching(SwitchSettings {
        timeout: Duration::from_millis(500),
        timeout_rtt_factor: factor,
        min_share_milli: 0,
        ..settings
    });
    let circs: Vec<CircKey> = (0..3).map(|_| net.build()).collect();
    let streams: Vec<(StreamHandle, Vec<u8>)> = circs
        .iter()
        .enumerate()
        .map(|(i, &k)| (net.open(k), pattern(600_000, i as u8)))
        .collect();
    let (c1, _) = net.e_to_m();
    assert!(net.nodes[E].congestion_building(c1, net.now));
    net.run(50);
    let set_back_delay = |net: &mut Net, d: u64| {
        let sw: Vec<ChannelId> = net
            .links
            .iter()
            .filter(|((n, _), l)| *n == M && l.peer == E && net.nodes[E].is_switch_channel(l.pchan))
            .map(|((_, c), _)| *c)
            .collect();
        assert_eq!(sw.len(), 1);
        net.links.get_mut(&(M, sw[0])).unwrap().delay = d;
    };
    set_back_delay(&mut net, 400);
    net.transfer(&streams, 400_000, |i, net| {
        if i == 100 {
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
        if i == 1000 {
            set_back_delay(net, 900);
            assert!(net.nodes[E].congested(c1, 0.0, net.now).is_some());
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    net.nodes[E].switch_stats()
}

#[test]
fn ack_timeout_follows_the_measured_round_trip() {
    let e = slow_second_ack(3);
    assert_eq!((e.triggered, e.completed, e.timed_out), (2, 2, 0), "{e:?}");
    let e = slow_second_ack(0);
    assert_eq!((e.triggered, e.completed, e.timed_out), (2, 1, 1), "{e:?}");
}
