//! Relay cells that end at the client, handed over a read batch at a time
//! (`Core::handle_cells_wire`, what the node's driver calls): a run of one circuit's cells is
//! taken with one channel and circuit lookup, its DATA cells delivered with one stream lookup
//! per run of one stream. Checked here: the same batches give the same result as handing each
//! cell to `handle_cell_wire` — the events (stream bytes included), the cells the client sends
//! back (circuit SENDMEs, END, XOFF...), the counters — with a cell in mid-run that is not DATA,
//! two circuits and two streams interleaved, a circuit SENDME falling due mid-run, a stream
//! going over its window, DATA for a stream that is gone, and a cell no hop recognizes.

use std::time::Instant;

use chive_cell::{
    parse_relay, relay_payload, Cell, CellCommand, CircId, Connected, End, EndReason, Extend2,
    Extended2, RelayCommand, CELL_LEN, PAYLOAD_LEN,
};
use chive_core::{ChannelId, CircKey, Core, CoreConfig, CoreStats, Event};
use chive_crypto::relay::RelayHopCrypto;

use crate::common::{self, drain, PlayedRelay};

/// A client core in front of a relay the test plays, A; circuits are one hop (A is the exit)
/// or two (A extends to B, a relay the test also plays). The test holds each hop's side of each
/// circuit.
struct Client {
    core: Core,
    relay: PlayedRelay,
    /// B: its keys (its channel is A's, which the test plays).
    second: PlayedRelay,
    now: Instant,
    circs: Vec<(CircKey, CircId, Vec<RelayHopCrypto>)>,
}

impl Client {
    fn new(now: Instant) -> Client {
        let mut core = Core::new(CoreConfig::default(), [7; 32]);
        let relay = PlayedRelay::facing(&mut core, ChannelId(1), 5, 9200, now);
        let mut elsewhere = Core::new(CoreConfig::default(), [8; 32]);
        let second = PlayedRelay::facing(&mut elsewhere, ChannelId(1), 6, 9201, now);
        Client {
            core,
            relay,
            second,
            now,
            circs: Vec::new(),
        }
    }

    /// A circuit of `hops` (1 or 2), built; its index in `circs`.
    fn build(&mut self, hops: usize) -> usize {
        let path = [self.relay.hop.clone(), self.second.hop.clone()];
        let key = self.core.launch_circuit(path[..hops].to_vec(), self.now);
        let (id, body) = self.relay.take_create2(&mut self.core, self.now);
        let km = self.relay.answer(&mut self.core, id, &body, None, self.now);
        let mut crypto = vec![RelayHopCrypto::new(&km)];
        if hops == 2 {
            // A reads the EXTEND2, B answers its CREATE2, A sends the EXTENDED2 back.
            let cells = drain(&mut self.core, self.relay.chan, self.now);
            let mut p = cells.last().expect("an EXTEND2").payload;
            assert!(crypto[0].decrypt_forward(&mut p));
            let msg = parse_relay(&p).unwrap();
            assert_eq!(msg.command, RelayCommand::EXTEND2);
            let ext = Extend2::decode(msg.data).unwrap();
            let b = &mut self.second;
            let (reply, km) =
                common::answer_create2(&mut b.rng, &b.hop, &b.ntor, &ext.create2, None);
            crypto.push(RelayHopCrypto::new(&km));
            let body = Extended2 { handshake: reply }.encode().unwrap();
            self.circs.push((key, id, crypto));
            let c = self.circs.len() - 1;
            let wire = self.cell(c, 0, RelayCommand::EXTENDED2, 0, &body);
            let mut scratch = common::blank_cell();
            self.core
                .handle_cell_wire(self.relay.chan, &wire, &mut scratch, self.now);
        } else {
            self.circs.push((key, id, crypto));
        }
        let built = Event::CircuitBuilt { circ: key };
        assert!(std::iter::from_fn(|| self.core.poll_event()).any(|e| e == built));
        self.circs.len() - 1
    }

    /// A stream on circuit `c`, connected; its stream id.
    fn stream(&mut self, c: usize) -> u16 {
        let key = self.circs[c].0;
        self.core
            .open_stream(key, "127.0.0.1", 80, self.now)
            .unwrap();
        let cells = drain(&mut self.core, self.relay.chan, self.now);
        let hops = &mut self.circs[c].2;
        let mut p = cells.last().expect("a BEGIN").payload;
        let last = hops.len() - 1;
        for (i, hop) in hops.iter_mut().enumerate() {
            assert_eq!(hop.decrypt_forward(&mut p), i == last);
        }
        let begin = parse_relay(&p).unwrap();
        assert_eq!(begin.command, RelayCommand::BEGIN);
        let sid = begin.stream_id;
        let body = Connected { addr: None, ttl: 0 }.encode();
        let wire = self.cell(c, last, RelayCommand::CONNECTED, sid, &body);
        let mut scratch = common::blank_cell();
        self.core
            .handle_cell_wire(self.relay.chan, &wire, &mut scratch, self.now);
        sid
    }

    /// Hop `hop`'s cell `cmd` on circuit `c` toward the client, as wire bytes: made by that
    /// hop, a layer added by each hop before it.
    fn cell(
        &mut self,
        c: usize,
        hop: usize,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
    ) -> [u8; CELL_LEN] {
        let (_, id, hops) = &mut self.circs[c];
        let mut payload = relay_payload(cmd, sid, body).unwrap();
        hops[hop].originate_backward(&mut payload);
        for h in hops[..hop].iter_mut().rev() {
            h.encrypt_backward(&mut payload);
        }
        common::wire_of(&Cell::from_payload(*id, CellCommand::RELAY, payload))
    }
}

/// One cell of a scenario.
#[derive(Clone)]
enum Spec {
    /// From circuit `.0`'s last hop: command, stream id, body.
    Exit(usize, RelayCommand, u16, Vec<u8>),
    /// From circuit `.0`'s first hop (circuit 0 has two).
    First(usize, RelayCommand),
    /// A cell of circuit 1 that no hop recognizes.
    Bad,
}

/// What the client did: its counters (but `origin_runs`), its events, the cells it sent.
#[derive(Debug, PartialEq)]
struct Outcome {
    stats: CoreStats,
    events: Vec<Event>,
    /// Wire bytes of each.
    sent: Vec<[u8; CELL_LEN]>,
}

fn outcome(c: &mut Client) -> Outcome {
    let mut stats = c.core.stats();
    stats.origin_runs = 0;
    let mut events: Vec<Event> = std::iter::from_fn(|| c.core.poll_event()).collect();
    // A closed circuit closes its streams in its stream map's order (std's HashMap, seeded per
    // map: two identical cores differ): consecutive StreamClosed events are compared as a set.
    for run in events.chunk_by_mut(|a, b| {
        matches!(a, Event::StreamClosed { .. }) && matches!(b, Event::StreamClosed { .. })
    }) {
        run.sort_by_key(|e| format!("{e:?}"));
    }
    Outcome {
        stats,
        events,
        sent: drain(&mut c.core, c.relay.chan, c.now)
            .iter()
            .map(common::wire_of)
            .collect(),
    }
}

/// Two identical clients with circuits 0 (two hops) and 1 (one hop), streams 0 and 1 on
/// circuit 0 and stream 2 on circuit 1; `batches` (built from the stream ids) handed to one cell by cell and to the
/// other whole. Both must end the same; returns the whole-batch client's run count and
/// outcome.
fn same_both_ways(batches: impl Fn(&[u16]) -> Vec<Vec<Spec>>) -> (u64, Outcome) {
    let now = Instant::now();
    let mut one = Client::new(now);
    let mut whole = Client::new(now);
    let mut wires = Vec::new();
    for c in [&mut one, &mut whole] {
        let (a, b) = (c.build(2), c.build(1));
        let sids = [c.stream(a), c.stream(a), c.stream(b)];
        drain(&mut c.core, c.relay.chan, now);
        while c.core.poll_event().is_some() {}
        let mut bytes = Vec::new();
        for batch in batches(&sids) {
            let mut wire = Vec::new();
            for spec in batch {
                let cell = match spec {
                    Spec::Exit(circ, cmd, sid, body) => {
                        let last = c.circs[circ].2.len() - 1;
                        c.cell(circ, last, cmd, sid, &body)
                    }
                    Spec::First(circ, cmd) => c.cell(circ, 0, cmd, 0, &[]),
                    Spec::Bad => {
                        // Circuit 1's id, a payload its layer does not recognize.
                        let mut cell = c.cell(1, 0, RelayCommand::DROP, 0, &[]);
                        cell[CELL_LEN - PAYLOAD_LEN + 7] ^= 0x40;
                        cell
                    }
                };
                wire.extend_from_slice(&cell);
            }
            bytes.push(wire);
        }
        wires.push(bytes);
    }
    assert_eq!(wires[0], wires[1], "the clients are identical");
    let runs_before = whole.core.stats().origin_runs;
    let mut scratch = common::blank_cell();
    for batch in &wires[0] {
        for wire in batch.chunks_exact(CELL_LEN) {
            let wire: &[u8; CELL_LEN] = wire.try_into().unwrap();
            one.core
                .handle_cell_wire(one.relay.chan, wire, &mut scratch, now);
        }
        whole
            .core
            .handle_cells_wire(whole.relay.chan, batch, &mut scratch, now);
    }
    assert_eq!(one.core.stats().origin_runs, 0, "cell by cell: no runs");
    let (one, whole_out) = (outcome(&mut one), outcome(&mut whole));
    assert_eq!(one, whole_out);
    (whole.core.stats().origin_runs - runs_before, whole_out)
}

fn data(c: usize, sid: u16, n: usize, salt: u8) -> Vec<Spec> {
    (0..n)
        .map(|i| {
            Spec::Exit(
                c,
                RelayCommand::DATA,
                sid,
                vec![salt ^ i as u8; 1 + i % 498],
            )
        })
        .collect()
}

fn writes(out: &Outcome) -> usize {
    out.events
        .iter()
        .filter_map(|e| match e {
            Event::StreamWrite { data, .. } => Some(data.len()),
            _ => None,
        })
        .sum()
}

#[test]
fn a_run_of_data_is_delivered_as_cell_by_cell_with_one_run_per_batch() {
    // 250 DATA cells on one stream in two reads: circuit SENDMEs fall due at the 100th and
    // 200th cells, in mid-run.
    let (runs, out) = same_both_ways(|s| {
        let cells = data(0, s[0], 250, 1);
        vec![cells[..130].to_vec(), cells[130..].to_vec()]
    });
    let bytes: usize = (0..250).map(|i| 1 + i % 498).sum();
    assert_eq!(writes(&out), bytes);
    assert_eq!(out.sent.len(), 2, "two circuit SENDMEs: {:?}", out.sent);
    // A run per read, and one more after each SENDME ends one.
    assert_eq!(runs, 4);
}

#[test]
fn other_commands_circuits_and_streams_in_mid_run_take_their_own_path() {
    let (runs, out) = same_both_ways(|s| {
        let mut batch = data(0, s[0], 3, 1);
        // The other stream of the circuit, then the other circuit, then back.
        batch.extend(data(0, s[1], 2, 2));
        batch.extend(data(1, s[2], 2, 3));
        batch.extend(data(0, s[0], 2, 4));
        // A DROP (not DATA) in mid-run, an END for stream 1, then DATA for it (crossing the
        // END: dropped), a DROP.
        batch.push(Spec::Exit(0, RelayCommand::DROP, 0, vec![]));
        batch.extend(data(0, s[0], 2, 5));
        let end = End {
            reason: EndReason::DONE,
        }
        .encode();
        batch.push(Spec::Exit(0, RelayCommand::END, s[1], end));
        batch.extend(data(0, s[1], 3, 6));
        batch.push(Spec::Exit(0, RelayCommand::DROP, 0, vec![]));
        batch.extend(data(0, s[0], 2, 7));
        vec![batch]
    });
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, Event::StreamClosed { .. })));
    let delivered: usize = [3, 2, 2, 2, 2, 2]
        .iter()
        .map(|&n| (0..n).map(|i| 1 + i % 498).sum::<usize>())
        .sum();
    assert_eq!(writes(&out), delivered, "the DATA after the END is dropped");
    // A run ends at a change of circuit and after a cell that is not DATA; a change of
    // stream stays in the run: [0: s0 s1] [1] [0: s0 DROP] [0: s0 END] [0: s1 DROP] [0: s0].
    assert_eq!(runs, 6);
}

#[test]
fn a_cell_no_hop_recognizes_closes_its_circuit_mid_run() {
    let (_, out) = same_both_ways(|s| {
        let mut batch = data(1, s[2], 3, 1);
        batch.push(Spec::Bad);
        // The circuit is gone: its later cells are dropped; circuit 0 carries on.
        batch.extend(data(1, s[2], 3, 2));
        batch.extend(data(0, s[0], 3, 3));
        vec![batch]
    });
    assert_eq!(out.stats.circuits_killed, 1);
    assert!(out
        .events
        .iter()
        .any(|e| matches!(e, Event::CircuitClosed { .. })));
    assert_eq!(writes(&out), 2 * (1 + 2 + 3));
}

#[test]
fn a_stream_over_its_window_closes_mid_run() {
    // The stream window is 500 cells and nothing is flushed: the 501st closes the stream
    // (END sent), the rest are dropped, and stream 0 on the same circuit carries on.
    let (_, out) = same_both_ways(|s| {
        let mut batch = data(0, s[1], 503, 1);
        batch.extend(data(0, s[0], 4, 2));
        vec![batch[..260].to_vec(), batch[260..].to_vec()]
    });
    let closed = out
        .events
        .iter()
        .filter(|e| matches!(e, Event::StreamClosed { .. }))
        .count();
    assert_eq!(closed, 1, "{:?}", out.events.len());
    // Five circuit SENDMEs (507 DATA cells) and the END.
    assert_eq!(out.sent.len(), 6);
}

#[test]
fn a_cell_from_a_hop_before_the_exit_closes_its_circuit_mid_run() {
    // Circuit 0 has two hops: DATA (or anything but a path command) from its first hop is
    // a protocol violation at the client; the cell takes one layer off, not two.
    let (_, out) = same_both_ways(|s| {
        let mut batch = data(0, s[0], 3, 1);
        batch.push(Spec::First(0, RelayCommand::DATA));
        batch.extend(data(0, s[0], 3, 2));
        batch.extend(data(1, s[2], 2, 3));
        vec![batch]
    });
    assert_eq!(out.stats.circuits_killed, 1);
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::CircuitClosed { reason, .. } if reason.contains("not the exit")
    )));
    // The three cells before it, none of circuit 0's after it, circuit 1's two.
    assert_eq!(writes(&out), (1 + 2 + 3) + (1 + 2));
}
