//! Target `client_core`: what the client core does with a hostile relay.
//!
//! A real client `Core` with two one-hop paths, each to a relay the target plays on a channel of
//! its own (it answers CREATE2 with ntor or ntor v3 and holds the hop's crypto, as
//! `crates/core/tests/it/path_client.rs` does by hand). Through the honest relay H the client has
//! a built circuit with a connected stream. The fuzzer plays the other relay E: it answers the
//! client's CREATE2s genuinely, with a garbage CREATED2, a DESTROY or not at all; sends raw cells
//! of any command and circuit id; sends any relay message on a circuit it built, encrypted as a
//! relay would (on a stream id of its choosing or one the client opened); and has the client open
//! streams on E's circuits, send data on them, read what E was sent, let time pass (the client's
//! timers) and lose E's channel (the driver then opens a new one when the client asks).
//!
//! Input (missing bytes read as 0): ops until the input ends (at most 512), each a byte
//! `kind % 8` and its arguments: 0 launch a circuit to E (a byte: how E answers: `% 4` = 0
//! genuine, 1 a CREATED2 of the next length byte's bytes, 2 DESTROY, 3 nothing), 1 raw cell from E
//! (a byte whose bit 7 writes one of E's circuit ids into it, a length byte, twice that many
//! bytes of the cell from its start), 2 relay message from E (circuit, command, stream id u16, a
//! byte: bit 0 use the stream id of the n-th stream the client opened instead, then a length byte
//! and the body), 3 the client opens a stream on one of E's circuits, 4 the client's application
//! writes on one of its streams to E (a length byte: 16 times that many bytes), 5 E reads what
//! the client sent it, 6 time (a byte: 25 ms each; the client's timers run), 7 E's channel
//! closes. Launches: at most 12 per input (curve25519 on both sides).
//!
//! Properties: no panic; the client never closes H's channel, H's circuit or its stream for
//! anything E sent; at the end H's circuit still carries DATA both ways exactly.

use std::time::{Duration, Instant};

use chive_cell::{
    parse_relay, relay_payload, Cell, CellCommand, CircExt, CircId, Create2, Created2, Destroy,
    DestroyReason, RelayCommand, PAYLOAD_LEN,
};
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event, HopSpec, StreamHandle};
use chive_crypto::ntor::{self, NtorSecretKey, NTOR_HTYPE};
use chive_crypto::ntor_v3::{self, CIRCUIT_VERIFICATION, NTOR_V3_HTYPE};
use chive_crypto::relay::RelayHopCrypto;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::core_harness::{blank_cell, drain_cells, keys, raw_cell, Input, Played};

/// The client's channel to the honest relay H.
const HONEST: ChannelId = ChannelId(1);
/// The client's first channel to E (each loss moves to the next id).
const FIRST_EVIL: u64 = 10;
/// Launches (CREATE2 answered by the target's ntor) per input.
const MAX_LAUNCHES: usize = 12;

/// The relay's side of one of the client's circuits.
struct Hop {
    key: CircKey,
    id: CircId,
    /// Once the played relay answered its CREATE2 genuinely.
    crypto: Option<RelayHopCrypto>,
}

/// How far an input got, for the tests of the seeds.
#[derive(Debug, Default)]
struct Reached {
    built: usize,
    closed: usize,
    streams_connected: usize,
    evil_bytes_to_app: usize,
    begins_seen: usize,
}

struct World {
    core: Core,
    now: Instant,
    rng: StdRng,
    reached: Reached,
    honest: Hop,
    honest_stream: StreamHandle,
    /// The stream id of the honest stream on H's circuit.
    honest_sid: u16,
    /// What the client's core handed the honest stream's application.
    honest_delivered: Vec<u8>,
    evil_hop: HopSpec,
    evil_ntor: NtorSecretKey,
    evil_chan: Option<ChannelId>,
    next_evil_chan: u64,
    evil: Vec<Hop>,
    /// Streams the client opened on E's circuits: handle, circuit and the id E saw in BEGIN.
    evil_streams: Vec<(StreamHandle, CircKey, Option<u16>)>,
    launches: usize,
}

/// The played relay's answer to a CREATE2 body; `None` if it does not parse.
fn answer(
    rng: &mut StdRng,
    hop: &HopSpec,
    ntor: &NtorSecretKey,
    body: &[u8],
) -> Option<(Vec<u8>, RelayHopCrypto)> {
    let create = Create2::decode(body).ok()?;
    if create.handshake_type == NTOR_HTYPE {
        let (reply, km) =
            ntor::server_handshake(rng, &hop.identity.ntor_id(), ntor, &create.handshake).ok()?;
        return Some((reply.to_vec(), RelayHopCrypto::new(&km)));
    }
    if create.handshake_type != NTOR_V3_HTYPE {
        return None;
    }
    let opened = ntor_v3::server_open(
        rng,
        hop.identity.as_bytes(),
        ntor,
        &create.handshake,
        CIRCUIT_VERIFICATION,
    )
    .ok()?;
    let asked = CircExt::decode_list(&opened.message)
        .map(|l| l.contains(&CircExt::CcRequest))
        .unwrap_or(false);
    let reply: &[CircExt] = if asked {
        &[CircExt::CcResponse { sendme_inc: 100 }]
    } else {
        &[]
    };
    let (reply, km) = opened.finish(&CircExt::encode_list(reply).ok()?).ok()?;
    Some((reply, RelayHopCrypto::new(&km)))
}

impl World {
    fn new() -> World {
        let now = Instant::now();
        let mut core = Core::new(CoreConfig::default(), [9; 32]);
        let (h_hop, h_ntor) = keys(Played::Honest);
        let (evil_hop, evil_ntor) = keys(Played::Hostile);
        core.channel_opened(HONEST, Some(h_hop.identity), true, now);
        let mut rng = StdRng::seed_from_u64(5);
        // H's circuit, built.
        let key = core.launch_circuit(vec![h_hop.clone()], now);
        let cells = drain_cells(&mut core, HONEST, now);
        let create = cells
            .iter()
            .find(|c| c.command == CellCommand::CREATE2)
            .expect("the client sends H a CREATE2");
        let (reply, crypto) =
            answer(&mut rng, &h_hop, &h_ntor, &create.payload).expect("H answers the CREATE2");
        let created = Created2 { handshake: reply }
            .encode()
            .expect("a CREATED2 body");
        let id = create.circ_id;
        core.handle_cell(
            HONEST,
            Cell::new(id, CellCommand::CREATED2, &created).expect("a CREATED2 cell"),
            now,
        );
        let mut w = World {
            core,
            now,
            rng,
            reached: Reached::default(),
            honest: Hop {
                key,
                id,
                crypto: Some(crypto),
            },
            honest_stream: StreamHandle(0),
            honest_sid: 0,
            honest_delivered: Vec::new(),
            evil_hop,
            evil_ntor,
            evil_chan: None,
            next_evil_chan: FIRST_EVIL,
            evil: Vec::new(),
            evil_streams: Vec::new(),
            launches: 0,
        };
        w.pump_events();
        assert!(w.core.circuit_is_open(key), "H's circuit is built");
        // Its stream, connected.
        w.honest_stream = w
            .core
            .open_stream(key, "example.com", 80, w.now)
            .expect("a stream on H's circuit");
        let begins = w.read_honest();
        w.honest_sid = match begins.first() {
            Some((cmd, sid, _)) if *cmd == RelayCommand::BEGIN => *sid,
            _ => panic!("the client sent H no BEGIN: {begins:?}"),
        };
        w.honest_send(RelayCommand::CONNECTED, &[]);
        w.pump_events();
        w.reached = Reached::default();
        w
    }

    /// The relay messages the client sent H since the last call (DESTROYs on H's circuit fail
    /// the target).
    fn read_honest(&mut self) -> Vec<(RelayCommand, u16, Vec<u8>)> {
        let mut out = Vec::new();
        for cell in drain_cells(&mut self.core, HONEST, self.now) {
            if cell.circ_id != self.honest.id {
                continue;
            }
            assert_ne!(
                cell.command,
                CellCommand::DESTROY,
                "the client destroyed H's circuit"
            );
            let Some(crypto) = self.honest.crypto.as_mut() else {
                continue;
            };
            let mut p: [u8; PAYLOAD_LEN] = cell.payload;
            assert!(
                crypto.decrypt_forward(&mut p),
                "H recognizes the client's cells"
            );
            let m = parse_relay(&p).expect("the client sends well-formed relay cells");
            out.push((m.command, m.stream_id, m.data.to_vec()));
        }
        out
    }

    /// H sends `cmd` on the honest stream.
    fn honest_send(&mut self, cmd: RelayCommand, body: &[u8]) {
        let mut payload = relay_payload(cmd, self.honest_sid, body).expect("a small message");
        if let Some(crypto) = self.honest.crypto.as_mut() {
            crypto.originate_backward(&mut payload);
        }
        let cell = Cell::from_payload(self.honest.id, CellCommand::RELAY, payload);
        self.core.handle_cell(HONEST, cell, self.now);
    }

    fn evil_chan(&mut self) -> ChannelId {
        if let Some(c) = self.evil_chan {
            return c;
        }
        let c = ChannelId(self.next_evil_chan);
        self.next_evil_chan += 1;
        self.core
            .channel_opened(c, Some(self.evil_hop.identity), true, self.now);
        self.evil_chan = Some(c);
        c
    }

    /// Run the client's events as its driver would.
    fn pump_events(&mut self) {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::CloseChannel { chan, reason } => {
                    assert_ne!(chan, HONEST, "the client closes H's channel: {reason}");
                    self.core.channel_closed(chan, self.now);
                    if self.evil_chan == Some(chan) {
                        self.evil_chan = None;
                    }
                }
                Event::Connect { identity, .. } => {
                    assert_eq!(identity, self.evil_hop.identity, "a link to H exists");
                    self.evil_chan();
                }
                Event::CircuitBuilt { .. } => self.reached.built += 1,
                Event::CircuitClosed { circ, reason, .. } => {
                    assert_ne!(
                        circ, self.honest.key,
                        "the client closed H's circuit: {reason}"
                    );
                    self.reached.closed += 1;
                    self.evil.retain(|h| h.key != circ);
                    self.evil_streams.retain(|s| s.1 != circ);
                }
                Event::StreamConnected { .. } => self.reached.streams_connected += 1,
                Event::StreamWrite {
                    stream,
                    data,
                    cells,
                } => {
                    if stream == self.honest_stream {
                        self.honest_delivered.extend_from_slice(&data);
                    } else {
                        self.reached.evil_bytes_to_app += data.len();
                    }
                    self.core.stream_flushed(stream, cells, self.now);
                }
                Event::StreamClosed { stream, reason } => {
                    assert_ne!(
                        stream, self.honest_stream,
                        "the client closed H's stream: {reason:?}"
                    );
                    self.evil_streams.retain(|s| s.0 != stream);
                }
                _ => {}
            }
        }
    }

    /// E reads what the client sent it: the answers to its circuits' cells, the stream ids of
    /// their BEGINs.
    fn evil_read(&mut self) {
        let Some(chan) = self.evil_chan else {
            return;
        };
        for cell in drain_cells(&mut self.core, chan, self.now) {
            let Some(hop) = self.evil.iter_mut().find(|h| h.id == cell.circ_id) else {
                continue;
            };
            let Some(crypto) = hop.crypto.as_mut() else {
                continue;
            };
            if cell.command != CellCommand::RELAY && cell.command != CellCommand::RELAY_EARLY {
                continue;
            }
            let mut p: [u8; PAYLOAD_LEN] = cell.payload;
            if !crypto.decrypt_forward(&mut p) {
                continue;
            }
            let Ok(m) = parse_relay(&p) else {
                continue;
            };
            if m.command == RelayCommand::BEGIN {
                self.reached.begins_seen += 1;
                let key = hop.key;
                if let Some(s) = self
                    .evil_streams
                    .iter_mut()
                    .find(|s| s.1 == key && s.2.is_none())
                {
                    s.2 = Some(m.stream_id);
                }
            }
        }
    }

    fn launch(&mut self, how: u8, input: &mut Input) {
        let garbage_len = usize::from(input.u8());
        let garbage = input.bytes(garbage_len).to_vec();
        if self.launches == MAX_LAUNCHES {
            return;
        }
        self.launches += 1;
        let chan = self.evil_chan();
        let key = self
            .core
            .launch_circuit(vec![self.evil_hop.clone()], self.now);
        self.pump_events();
        let cells = drain_cells(&mut self.core, chan, self.now);
        let Some(create) = cells.iter().find(|c| c.command == CellCommand::CREATE2) else {
            return;
        };
        let id = create.circ_id;
        let mut hop = Hop {
            key,
            id,
            crypto: None,
        };
        let reply = match how % 4 {
            0 => match answer(
                &mut self.rng,
                &self.evil_hop,
                &self.evil_ntor,
                &create.payload,
            ) {
                Some((reply, crypto)) => {
                    hop.crypto = Some(crypto);
                    Created2 { handshake: reply }
                        .encode()
                        .ok()
                        .and_then(|b| Cell::new(id, CellCommand::CREATED2, &b).ok())
                }
                None => None,
            },
            1 => Cell::new(
                id,
                CellCommand::CREATED2,
                &garbage[..garbage.len().min(PAYLOAD_LEN)],
            )
            .ok(),
            2 => Cell::new(
                id,
                CellCommand::DESTROY,
                &Destroy {
                    reason: DestroyReason::PROTOCOL,
                }
                .encode(),
            )
            .ok(),
            _ => None,
        };
        if let Some(cell) = reply {
            self.core.handle_cell(chan, cell, self.now);
        }
        self.evil.push(hop);
    }

    fn step(&mut self, input: &mut Input) {
        match input.u8() % 8 {
            0 => {
                let how = input.u8();
                self.launch(how, input);
            }
            1 => {
                let chan = self.evil_chan();
                let ids: Vec<u32> = self.evil.iter().map(|h| h.id).collect();
                let wire = raw_cell(input, &ids);
                let mut scratch = blank_cell();
                self.core
                    .handle_cells_wire(chan, &wire, &mut scratch, self.now);
            }
            2 => {
                let k = usize::from(input.u8());
                let cmd = RelayCommand(input.u8());
                let mut sid = input.u16();
                let flags = input.u8();
                let len = usize::from(input.u8());
                let body = input.bytes(len).to_vec();
                if flags & 1 != 0 {
                    let seen: Vec<u16> = self.evil_streams.iter().filter_map(|s| s.2).collect();
                    if let Some(&s) = seen.get(usize::from(sid) % seen.len().max(1)) {
                        sid = s;
                    }
                }
                let Some(chan) = self.evil_chan else {
                    return;
                };
                let n = self.evil.len();
                let Some(hop) = self.evil.get_mut(k % n.max(1)) else {
                    return;
                };
                let Some(crypto) = hop.crypto.as_mut() else {
                    return;
                };
                let Ok(mut payload) = relay_payload(cmd, sid, &body) else {
                    return;
                };
                crypto.originate_backward(&mut payload);
                let cell = Cell::from_payload(hop.id, CellCommand::RELAY, payload);
                self.core.handle_cell(chan, cell, self.now);
            }
            3 => {
                let k = usize::from(input.u8());
                let n = self.evil.len();
                if let Some(hop) = self.evil.get(k % n.max(1)) {
                    let key = hop.key;
                    if let Ok(s) = self.core.open_stream(key, "example.com", 80, self.now) {
                        self.evil_streams.push((s, key, None));
                    }
                }
            }
            4 => {
                let k = usize::from(input.u8());
                let len = usize::from(input.u8()) * 16;
                let n = self.evil_streams.len();
                if let Some(&(s, _, _)) = self.evil_streams.get(k % n.max(1)) {
                    self.core.stream_data(s, &vec![0x42; len], self.now);
                }
            }
            5 => self.evil_read(),
            6 => {
                self.now += Duration::from_millis(25 * u64::from(input.u8()));
                self.core.handle_timeout(self.now);
            }
            _ => {
                if let Some(chan) = self.evil_chan.take() {
                    self.core.channel_closed(chan, self.now);
                }
            }
        }
        self.pump_events();
        // H reads what comes (nothing but what its stream is owed, unless something went wrong).
        self.read_honest();
    }

    /// H's circuit carries DATA both ways.
    fn check_honest(&mut self) {
        self.pump_events();
        self.read_honest();
        assert!(
            self.core.circuit_is_open(self.honest.key),
            "H's circuit is open"
        );
        self.honest_delivered.clear();
        self.honest_send(RelayCommand::DATA, b"from the exit");
        self.pump_events();
        assert_eq!(
            self.honest_delivered, b"from the exit",
            "H's DATA reached the client's application"
        );
        self.core
            .stream_data(self.honest_stream, b"from the app", self.now);
        self.pump_events();
        let got = self.read_honest();
        assert!(
            got.iter().any(|(cmd, sid, data)| *cmd == RelayCommand::DATA
                && *sid == self.honest_sid
                && data == b"from the app"),
            "the application's DATA reached H: {got:?}"
        );
    }
}

/// The fuzz target.
pub fn client_core(data: &[u8]) {
    run(data);
}

fn run(data: &[u8]) -> Reached {
    let mut input = Input::new(data);
    let mut world = World::new();
    let mut ops = 0;
    while !input.done() && ops < 512 {
        world.step(&mut input);
        ops += 1;
    }
    world.check_honest();
    world.reached
}

/// Seed inputs: E's answers and messages, honest and not (the op encoding above).
pub(crate) fn seeds() -> Vec<(String, Vec<u8>)> {
    // launch, E answers genuinely
    let built: &[u8] = &[0, 0, 0];
    let mut stream = built.to_vec();
    // the client opens a stream on it; E reads the BEGIN, answers CONNECTED and DATA on its
    // stream id, the application writes 32 bytes, E reads
    stream.extend_from_slice(&[3, 0, 5]);
    stream.extend_from_slice(&[2, 0, RelayCommand::CONNECTED.0, 0, 0, 1, 0]);
    stream.extend_from_slice(&[2, 0, RelayCommand::DATA.0, 0, 0, 1, 5]);
    stream.extend_from_slice(b"hello");
    stream.extend_from_slice(&[4, 0, 2, 5]);

    let mut garbage = vec![0u8, 1, 10];
    garbage.extend_from_slice(&[0, 0x40, 1, 2, 3, 4, 5, 6, 7, 8]);

    // no answer: the build times out after 30 s (6 × 255 × 25 ms)
    let mut timeout = vec![0u8, 3, 0];
    for _ in 0..6 {
        timeout.extend_from_slice(&[6, 255]);
    }

    // raw cells from E: a RELAY on its circuit that nobody can read, an unasked CREATED2, a
    // VERSIONS, a DESTROY of the circuit
    let mut raw = built.to_vec();
    for (target, cmd) in [(0x80u8, 3u8), (0x80, 11), (0, 7), (0x80, 4)] {
        raw.extend_from_slice(&[1, target, 8, 0, 0, 0, 1, cmd, 0xab, 0xcd, 0xef]);
        raw.extend_from_slice(&[0; 8]);
    }

    // relay messages no exit should send: EXTENDED2 unasked, TRUNCATED, a SENDME with a bad
    // body, DATA and END for streams that do not exist, CONFLUX_LINKED unasked; then E's channel
    // is lost and the client builds again
    let mut odd = built.to_vec();
    for (cmd, body) in [
        (RelayCommand::EXTENDED2.0, &[0u8, 64][..]),
        (RelayCommand::TRUNCATED.0, &[9][..]),
        (RelayCommand::SENDME.0, &[1, 0, 20, 7][..]),
        (RelayCommand::DATA.0, &b"nobody"[..]),
        (RelayCommand::END.0, &[6][..]),
        (RelayCommand::CONFLUX_LINKED.0, &[0; 8][..]),
    ] {
        odd.extend_from_slice(&[2, 0, cmd, 0, 9, 0, body.len() as u8]);
        odd.extend_from_slice(body);
    }
    odd.extend_from_slice(&[7, 0, 0, 0, 5]);

    vec![
        ("nothing".into(), vec![5]),
        ("built-stream-both-ways".into(), stream),
        ("garbage-created2".into(), garbage),
        ("destroy-answer".into(), vec![0, 2, 0]),
        ("build-timeout".into(), timeout),
        ("raw-cells".into(), raw),
        ("odd-relay-messages".into(), odd),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reached(name: &str) -> Reached {
        let (_, input) = seeds()
            .into_iter()
            .find(|(n, _)| n == name)
            .expect("a seed of that name");
        run(&input)
    }

    #[test]
    fn the_seeds_reach_what_they_were_written_for() {
        let r = reached("built-stream-both-ways");
        assert_eq!(
            (r.built, r.begins_seen, r.streams_connected),
            (1, 1, 1),
            "{r:?}"
        );
        assert_eq!(
            r.evil_bytes_to_app, 5,
            "E's DATA reached the application: {r:?}"
        );
        for name in ["garbage-created2", "destroy-answer", "build-timeout"] {
            let r = reached(name);
            assert_eq!((r.built, r.closed), (0, 1), "{name}: {r:?}");
        }
        let r = reached("raw-cells");
        assert_eq!(
            (r.built, r.closed),
            (1, 1),
            "the garbage RELAY closes it: {r:?}"
        );
        let r = reached("odd-relay-messages");
        assert_eq!(r.built, 2, "built again after the channel loss: {r:?}");
        assert!(r.closed >= 1, "{r:?}");
    }
}
