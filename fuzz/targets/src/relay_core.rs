//! Target `relay_core`: what the sans-IO relay core does with cells from a hostile client.
//!
//! Two real relay cores, R and the exit X, linked by one channel as the node's driver links
//! them (cells move as wire bytes, `handle_cells_wire`; time is a virtual clock). An honest
//! client builds a two-hop circuit through R to X on a channel of its own and opens a stream at
//! X. Then the fuzzer plays a client on other channels to R: it sends raw cells of any command
//! and circuit id, builds circuits (ntor or ntor v3, asking for congestion control or not),
//! extends them to X, sends any relay message to either hop encrypted as a real client would
//! (RELAY or RELAY_EARLY), has X's streams connect, fail or send data, lets time pass, drains or
//! leaves its channel's cells, and closes its channel.
//!
//! Input (missing bytes read as 0): a flags byte (bit 0: R's limits are tight: 50 cells per
//! circuit queue, 300 cells' worth of `MaxMemInQueues`, 3 circuits per channel, the per-client
//! hold at 120 cells with a 50-cell in-flight estimate; bit 1: both relays do path switching,
//! so X answers CONFLUX_LINK and reorders linked legs), then ops until the input ends (at most
//! 512), each a byte `kind % 9` and its arguments:
//! 0 raw cell (a byte whose bit 7 writes one of the client's circuit ids into the cell, a
//! length byte, then twice that many bytes of the 514-byte cell from its start: circuit id,
//! command, payload; the rest zero), 1 create (a byte: bit 0 ntor v3, bit 1 ask for congestion
//! control), 2 extend to X (circuit, a byte: bit 0 RELAY_EARLY), 3 relay message (circuit, hop,
//! command, stream id u16, a byte: bit 0 RELAY_EARLY, then a length byte and the body), 4 carry
//! R ⇄ X (a byte: bit i connects the i-th waiting exit stream, else it fails), 5 exit data (a
//! stream, a length byte: X's stream sends 16 times that many bytes), 6 time (a byte: 25 ms
//! each; both cores' timers run), 7 the client reads its channel, 8 it closes its channel (the
//! next op opens a new one). Creates and extends together: at most 12 per input (each is
//! curve25519 work on both sides, which would otherwise take most of a run).
//!
//! Properties: no panic; R never closes its channel to X nor the honest client's, and X never
//! its channel from R, because of what one client sent; R's `mem_in_queues` never exceeds
//! `MaxMemInQueues`; at the end the honest circuit was not destroyed and still carries data both
//! ways (DATA from the client reaches X's stream exactly, DATA from X's stream reaches the
//! client).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chive_cell::{
    parse_relay, relay_payload, Cell, CellCommand, CircExt, CircId, ConfluxLink, ConfluxSwitch,
    Create2, Created2, EndReason, Extend2, Extended2, LinkSpec, RelayCommand, PAYLOAD_LEN,
};
use chive_core::{
    ChannelId, Core, CoreConfig, Event, HopSpec, RelayKeys, StreamHandle, SwitchMode,
    SwitchSettings, CELL_MEM_COST,
};
use chive_crypto::ntor::{self, NTOR_HTYPE};
use chive_crypto::ntor_v3::{self, CIRCUIT_VERIFICATION, NTOR_V3_HTYPE};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::core_harness::{blank_cell, cells, drain_wire, keys, raw_cell, Input, Played};

/// R's channel from the honest client.
const HONEST: ChannelId = ChannelId(1);
/// R's channel to X.
const R_TO_X: ChannelId = ChannelId(2);
/// X's channel from R.
const X_FROM_R: ChannelId = ChannelId(1);
/// The first hostile channel's id at R (each close moves to the next).
const FIRST_HOSTILE: u64 = 10;
/// Hostile circuits the fuzzer can name at once.
const MAX_HOSTILE_CIRCUITS: usize = 6;
/// Handshakes (CREATE2, EXTEND2) the fuzzer's client may make in one input.
const MAX_HANDSHAKES: usize = 12;

/// One relay core and how to reach it.
struct Relay {
    core: Core,
    hop: HopSpec,
}

/// A relay core playing `who` (its keys from [`keys`], its core's seed from its role).
fn relay(who: Played, cfg: CoreConfig) -> Relay {
    let seed = who as u8 + 1;
    let (hop, ntor) = keys(who);
    let core = Core::new(
        CoreConfig {
            relay: Some(RelayKeys {
                identity: hop.identity,
                ntor,
            }),
            ..cfg
        },
        [seed; 32],
    );
    Relay { core, hop }
}

/// A client's end of one circuit.
struct Circ {
    id: CircId,
    crypto: ClientCircuitCrypto,
}

/// A stream X opened, as the driver sees it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExitStream {
    Waiting(StreamHandle),
    Open(StreamHandle),
}

/// How far an input got, for the tests of the seeds (a seed that stops reaching what it was
/// written for would still pass the target).
#[derive(Debug, Default)]
struct Reached {
    hostile_circuits: usize,
    extended: usize,
    exit_connects: usize,
    hostile_written: usize,
    cells_to_hostile: usize,
    /// CONFLUX_LINKED answers the hostile client decrypted.
    linked: usize,
    circuits_killed_at_r: u64,
}

struct World {
    reached: Reached,
    r: Relay,
    x: Relay,
    now: Instant,
    rng: StdRng,
    max_mem: usize,
    honest: Circ,
    honest_stream: Option<StreamHandle>,
    /// What X wrote to the honest stream's socket.
    honest_written: Vec<u8>,
    /// Whether R sent the honest client a DESTROY for its circuit.
    honest_destroyed: bool,
    hostile_chan: Option<ChannelId>,
    next_hostile_chan: u64,
    hostile: Vec<Circ>,
    next_circ_id: u32,
    /// Handshakes the fuzzer's client made ([`MAX_HANDSHAKES`]).
    handshakes: usize,
    exit_streams: Vec<ExitStream>,
}

fn relay_cell(
    circ: &mut Circ,
    hop: usize,
    cmd: RelayCommand,
    sid: u16,
    body: &[u8],
    early: bool,
) -> Option<Cell> {
    let mut payload = relay_payload(cmd, sid, body).ok()?;
    circ.crypto.encrypt_to(hop, &mut payload).ok()?;
    let command = if early {
        CellCommand::RELAY_EARLY
    } else {
        CellCommand::RELAY
    };
    Some(Cell::from_payload(circ.id, command, payload))
}

impl World {
    fn new(flags: u8) -> World {
        let tight = flags & 1 != 0;
        let mut cfg = CoreConfig::default();
        let mut max_mem = cfg.max_mem_in_queues;
        if tight {
            max_mem = 300 * CELL_MEM_COST;
            cfg = CoreConfig {
                max_circuit_queue: 50,
                max_mem_in_queues: max_mem,
                max_circuits_per_channel: 3,
                client_queue_cap: 120,
                client_circuit_window: 50,
                ..cfg
            };
        }
        let mut r = relay(Played::Relay, cfg);
        let mut x = relay(
            Played::Exit,
            CoreConfig {
                exit: true,
                ..CoreConfig::default()
            },
        );
        let now = Instant::now();
        if flags & 2 != 0 {
            for core in [&mut r.core, &mut x.core] {
                core.set_switching(SwitchSettings {
                    mode: SwitchMode::Path,
                    ..SwitchSettings::default()
                });
            }
        }
        r.core.channel_opened(HONEST, None, false, now);
        r.core
            .channel_opened(R_TO_X, Some(x.hop.identity), true, now);
        x.core
            .channel_opened(X_FROM_R, Some(r.hop.identity), false, now);
        let mut w = World {
            reached: Reached::default(),
            r,
            x,
            now,
            rng: StdRng::seed_from_u64(7),
            max_mem,
            honest: Circ {
                id: 0x8000_0001,
                crypto: ClientCircuitCrypto::new(),
            },
            honest_stream: None,
            honest_written: Vec::new(),
            honest_destroyed: false,
            hostile_chan: None,
            next_hostile_chan: FIRST_HOSTILE,
            hostile: Vec::new(),
            next_circ_id: 1,
            handshakes: 0,
            exit_streams: Vec::new(),
        };
        w.honest_setup();
        // Count only what the fuzzer's client reaches.
        w.reached = Reached::default();
        w
    }

    /// The honest client's circuit through R to X with stream 1 connected at X.
    fn honest_setup(&mut self) {
        let id = self.honest.id;
        let crypto = self
            .create(HONEST, id, false, false)
            .expect("R answers the honest CREATE2");
        let mut circ = Circ { id, crypto };
        assert!(
            self.extend(HONEST, &mut circ, true),
            "the honest circuit reaches X"
        );
        let begin = relay_cell(
            &mut circ,
            1,
            RelayCommand::BEGIN,
            1,
            b"127.0.0.1:80\0",
            false,
        )
        .expect("a BEGIN cell");
        self.honest = circ;
        self.r.core.handle_cell(HONEST, begin, self.now);
        self.carry();
        let Some(ExitStream::Waiting(stream)) = self.exit_streams.pop() else {
            panic!("X opened no stream for the honest BEGIN");
        };
        self.x
            .core
            .exit_connected(stream, ([127, 0, 0, 1], 80).into(), self.now);
        self.honest_stream = Some(stream);
        self.carry();
        let got = self.honest_read();
        assert!(
            got.iter().any(|(cmd, _)| *cmd == RelayCommand::CONNECTED),
            "the honest stream connected"
        );
    }

    /// Send CREATE2 for circuit `id` on `chan` and finish the handshake from R's answer;
    /// `None` if R refused.
    fn create(
        &mut self,
        chan: ChannelId,
        id: CircId,
        v3: bool,
        ask_cc: bool,
    ) -> Option<ClientCircuitCrypto> {
        let identity = self.r.hop.identity;
        let key = self.r.hop.ntor_key;
        let mut crypto = ClientCircuitCrypto::new();
        if v3 {
            let exts: &[CircExt] = if ask_cc { &[CircExt::CcRequest] } else { &[] };
            let msg = CircExt::encode_list(exts).expect("a small extension list");
            let (state, handshake) = ntor_v3::client_create(
                &mut self.rng,
                identity.as_bytes(),
                &key,
                &msg,
                CIRCUIT_VERIFICATION,
            );
            let body = Create2 {
                handshake_type: NTOR_V3_HTYPE,
                handshake,
            }
            .encode()
            .expect("a CREATE2 body");
            let cell = Cell::new(id, CellCommand::CREATE2, &body).expect("a CREATE2 cell");
            self.r.core.handle_cell(chan, cell, self.now);
            let reply = self.take_created(chan, id)?;
            let (_msg, km) = ntor_v3::client_finish(state, &reply).ok()?;
            crypto.push_hop(ClientHopCrypto::new(&km));
        } else {
            let (state, onionskin) = ntor::client_create(&mut self.rng, &identity.ntor_id(), &key);
            let body = Create2 {
                handshake_type: NTOR_HTYPE,
                handshake: onionskin.to_vec(),
            }
            .encode()
            .expect("a CREATE2 body");
            let cell = Cell::new(id, CellCommand::CREATE2, &body).expect("a CREATE2 cell");
            self.r.core.handle_cell(chan, cell, self.now);
            let reply = self.take_created(chan, id)?;
            let km = ntor::client_finish(state, &reply).ok()?;
            crypto.push_hop(ClientHopCrypto::new(&km));
        }
        Some(crypto)
    }

    /// R's CREATED2 handshake for circuit `id` on `chan`, if it answered with one.
    fn take_created(&mut self, chan: ChannelId, id: CircId) -> Option<Vec<u8>> {
        let wire = drain_wire(&mut self.r.core, chan, self.now);
        self.pump_events();
        let created = cells(&wire)
            .find(|c| c.circ_id == id && c.command == CellCommand::CREATED2)
            .and_then(|c| Created2::decode(&c.payload).ok())
            .map(|c| c.handshake);
        created
    }

    /// Extend `circ` (one hop, on `chan`) to X; whether X's layer was added.
    fn extend(&mut self, chan: ChannelId, circ: &mut Circ, early: bool) -> bool {
        if circ.crypto.len() != 1 {
            return false;
        }
        let x = self.x.hop.clone();
        let (state, onionskin) =
            ntor::client_create(&mut self.rng, &x.identity.ntor_id(), &x.ntor_key);
        let SocketAddr::V4(addr) = x.addr else {
            unreachable!("X listens on IPv4")
        };
        let body = Extend2 {
            link_specifiers: vec![
                LinkSpec::Ed25519Id(*x.identity.as_bytes()),
                LinkSpec::Ipv4(addr),
            ],
            create2: Create2 {
                handshake_type: NTOR_HTYPE,
                handshake: onionskin.to_vec(),
            },
        }
        .encode()
        .expect("an EXTEND2 body");
        let Some(cell) = relay_cell(circ, 0, RelayCommand::EXTEND2, 0, &body, early) else {
            return false;
        };
        self.r.core.handle_cell(chan, cell, self.now);
        self.carry();
        let wire = drain_wire(&mut self.r.core, chan, self.now);
        for cell in cells(&wire).filter(|c| c.circ_id == circ.id && c.command == CellCommand::RELAY)
        {
            let mut payload = cell.payload;
            if let Some((0, _)) = circ.crypto.decrypt_from_any(&mut payload) {
                let Ok(view) = parse_relay(&payload) else {
                    continue;
                };
                if view.command == RelayCommand::EXTENDED2 {
                    let Ok(reply) = Extended2::decode(view.data) else {
                        return false;
                    };
                    let Ok(km) = ntor::client_finish(state, &reply.handshake) else {
                        return false;
                    };
                    circ.crypto.push_hop(ClientHopCrypto::new(&km));
                    self.reached.extended += 1;
                    return true;
                }
            }
        }
        false
    }

    /// The open hostile channel, opening one if there is none.
    fn hostile_chan(&mut self) -> ChannelId {
        if let Some(c) = self.hostile_chan {
            return c;
        }
        let c = ChannelId(self.next_hostile_chan);
        self.next_hostile_chan += 1;
        self.r.core.channel_opened(c, None, false, self.now);
        self.hostile_chan = Some(c);
        c
    }

    /// Move every cell each way between R and X, twice (answers to answers), running the
    /// events between; X's new exit streams wait (see [`World::answer_exits`]).
    fn carry(&mut self) {
        let mut scratch = blank_cell();
        for _ in 0..2 {
            let up = drain_wire(&mut self.r.core, R_TO_X, self.now);
            self.x
                .core
                .handle_cells_wire(X_FROM_R, &up, &mut scratch, self.now);
            self.pump_events();
            let down = drain_wire(&mut self.x.core, X_FROM_R, self.now);
            self.r
                .core
                .handle_cells_wire(R_TO_X, &down, &mut scratch, self.now);
            self.pump_events();
        }
    }

    /// Answer X's waiting exit streams: bit i of `connect` connects the i-th, else it fails.
    fn answer_exits(&mut self, connect: u8) {
        let mut bit = 0;
        for s in self.exit_streams.iter_mut() {
            if let ExitStream::Waiting(h) = *s {
                if connect & (1 << (bit % 8)) != 0 {
                    self.x
                        .core
                        .exit_connected(h, ([127, 0, 0, 1], 80).into(), self.now);
                    *s = ExitStream::Open(h);
                } else {
                    self.x
                        .core
                        .exit_failed(h, EndReason::CONNECTREFUSED, self.now);
                }
                bit += 1;
            }
        }
        self.exit_streams
            .retain(|s| matches!(s, ExitStream::Open(_)));
        self.pump_events();
    }

    /// Run both cores' events as the driver would.
    fn pump_events(&mut self) {
        while let Some(ev) = self.r.core.poll_event() {
            if let Event::CloseChannel { chan, reason } = ev {
                assert!(
                    chan != R_TO_X && chan != HONEST,
                    "R closes {chan:?}, shared with the honest client, for a hostile client: {reason}"
                );
                self.r.core.channel_closed(chan, self.now);
                if self.hostile_chan == Some(chan) {
                    self.hostile_chan = None;
                    self.hostile.clear();
                }
            }
        }
        while let Some(ev) = self.x.core.poll_event() {
            match ev {
                Event::CloseChannel { chan, reason } => {
                    panic!("X closes {chan:?}, R's channel, for a hostile client: {reason}")
                }
                Event::ExitConnect { stream, .. } => {
                    self.reached.exit_connects += 1;
                    if self.exit_streams.len() < 16 {
                        self.exit_streams.push(ExitStream::Waiting(stream));
                    } else {
                        self.x
                            .core
                            .exit_failed(stream, EndReason::RESOURCELIMIT, self.now);
                    }
                }
                Event::StreamWrite {
                    stream,
                    data,
                    cells,
                } => {
                    if Some(stream) == self.honest_stream {
                        self.honest_written.extend_from_slice(&data);
                    } else {
                        self.reached.hostile_written += data.len();
                    }
                    self.x.core.stream_flushed(stream, cells, self.now);
                }
                Event::StreamClosed { stream, .. } => {
                    self.exit_streams.retain(|s| {
                        *s != ExitStream::Open(stream) && *s != ExitStream::Waiting(stream)
                    });
                }
                _ => {}
            }
        }
    }

    /// Drain R's cells for the honest client: note a DESTROY of its circuit, decrypt the rest.
    fn honest_read(&mut self) -> Vec<(RelayCommand, Vec<u8>)> {
        let wire = drain_wire(&mut self.r.core, HONEST, self.now);
        let mut out = Vec::new();
        for cell in cells(&wire) {
            if cell.circ_id != self.honest.id {
                continue;
            }
            if cell.command == CellCommand::DESTROY {
                self.honest_destroyed = true;
                continue;
            }
            let mut payload: [u8; PAYLOAD_LEN] = cell.payload;
            if self.honest.crypto.decrypt_from_any(&mut payload).is_some() {
                if let Ok(view) = parse_relay(&payload) {
                    out.push((view.command, view.data.to_vec()));
                }
            }
        }
        out
    }

    /// The hostile client reads what R sent it: its circuits' relay cells are decrypted (so
    /// their layers stay in step) and CONFLUX_LINKED answers counted.
    fn hostile_read(&mut self, wire: &[u8]) {
        for cell in cells(wire) {
            self.reached.cells_to_hostile += 1;
            let Some(circ) = self.hostile.iter_mut().find(|c| c.id == cell.circ_id) else {
                continue;
            };
            if cell.command != CellCommand::RELAY {
                continue;
            }
            let mut payload: [u8; PAYLOAD_LEN] = cell.payload;
            if circ.crypto.decrypt_from_any(&mut payload).is_some() {
                if let Ok(view) = parse_relay(&payload) {
                    if view.command == RelayCommand::CONFLUX_LINKED {
                        self.reached.linked += 1;
                    }
                }
            }
        }
    }

    /// Whether the fuzzer's client may make one more handshake (CREATE2 or EXTEND2): each
    /// costs both sides' curve25519 work, which would otherwise take most of a run.
    fn spend_handshake(&mut self) -> bool {
        if self.handshakes == MAX_HANDSHAKES {
            return false;
        }
        self.handshakes += 1;
        true
    }

    fn check_memory(&self) {
        let mem = self.r.core.stats().mem_in_queues;
        assert!(
            mem <= self.max_mem,
            "R holds {mem} bytes in its queues, over MaxMemInQueues {}",
            self.max_mem
        );
    }

    fn step(&mut self, input: &mut Input) {
        match input.u8() % 9 {
            0 => {
                let chan = self.hostile_chan();
                let ids: Vec<u32> = self.hostile.iter().map(|c| c.id).collect();
                let wire = raw_cell(input, &ids);
                let mut scratch = blank_cell();
                self.r
                    .core
                    .handle_cells_wire(chan, &wire, &mut scratch, self.now);
            }
            1 => {
                let how = input.u8();
                if !self.spend_handshake() {
                    return;
                }
                let chan = self.hostile_chan();
                let id = 0x8000_0000 | (self.next_circ_id & 0x7fff_ffff);
                self.next_circ_id = self.next_circ_id.wrapping_add(1);
                if let Some(crypto) = self.create(chan, id, how & 1 != 0, how & 2 != 0) {
                    if self.hostile.len() == MAX_HOSTILE_CIRCUITS {
                        self.hostile.remove(0);
                    }
                    self.hostile.push(Circ { id, crypto });
                    self.reached.hostile_circuits += 1;
                }
            }
            2 => {
                let k = usize::from(input.u8());
                let early = input.u8() & 1 != 0;
                if self.hostile.is_empty() || !self.spend_handshake() {
                    return;
                }
                let chan = self.hostile_chan();
                let i = k % self.hostile.len();
                let mut circ = self.hostile.swap_remove(i);
                self.extend(chan, &mut circ, early);
                self.hostile.push(circ);
            }
            3 => {
                let k = usize::from(input.u8());
                let hop = usize::from(input.u8());
                let cmd = RelayCommand(input.u8());
                let sid = input.u16();
                let early = input.u8() & 1 != 0;
                let len = usize::from(input.u8());
                let body = input.bytes(len).to_vec();
                if self.hostile.is_empty() {
                    return;
                }
                let chan = self.hostile_chan();
                let n = self.hostile.len();
                let circ = &mut self.hostile[k % n];
                let hop = hop % circ.crypto.len().max(1);
                if let Some(cell) = relay_cell(circ, hop, cmd, sid, &body, early) {
                    self.r.core.handle_cell(chan, cell, self.now);
                }
            }
            4 => {
                let connect = input.u8();
                self.carry();
                self.answer_exits(connect);
                self.carry();
            }
            5 => {
                let k = usize::from(input.u8());
                let len = usize::from(input.u8()) * 16;
                let open: Vec<StreamHandle> = self
                    .exit_streams
                    .iter()
                    .filter_map(|s| match s {
                        ExitStream::Open(h) => Some(*h),
                        ExitStream::Waiting(_) => None,
                    })
                    .collect();
                if let Some(&h) = open.get(k % open.len().max(1)) {
                    let data = vec![0x5a; len];
                    self.x.core.stream_data(h, &data, self.now);
                }
            }
            6 => {
                self.now += Duration::from_millis(25 * u64::from(input.u8()));
                self.r.core.handle_timeout(self.now);
                self.x.core.handle_timeout(self.now);
                self.pump_events();
            }
            7 => {
                if let Some(chan) = self.hostile_chan {
                    let wire = drain_wire(&mut self.r.core, chan, self.now);
                    self.hostile_read(&wire);
                }
            }
            _ => {
                if let Some(chan) = self.hostile_chan.take() {
                    self.r.core.channel_closed(chan, self.now);
                    self.hostile.clear();
                }
            }
        }
        self.pump_events();
        // The honest client reads what comes (nothing, unless something went wrong).
        self.honest_read();
        self.check_memory();
    }

    /// The honest circuit carries a DATA cell each way.
    fn check_honest(&mut self) {
        self.carry();
        self.honest_read();
        assert!(!self.honest_destroyed, "R destroyed the honest circuit");
        let up = b"still here";
        let cell =
            relay_cell(&mut self.honest, 1, RelayCommand::DATA, 1, up, false).expect("a DATA cell");
        self.honest_written.clear();
        self.r.core.handle_cell(HONEST, cell, self.now);
        self.carry();
        assert_eq!(
            self.honest_written, up,
            "the honest client's DATA reached X's stream"
        );
        let stream = self.honest_stream.expect("set up");
        self.x.core.stream_data(stream, b"and answering", self.now);
        self.carry();
        let got = self.honest_read();
        assert!(!self.honest_destroyed, "R destroyed the honest circuit");
        assert!(
            got.iter()
                .any(|(cmd, data)| *cmd == RelayCommand::DATA && data == b"and answering"),
            "X's DATA reached the honest client: {got:?}"
        );
    }
}

/// The fuzz target.
pub fn relay_core(data: &[u8]) {
    run(data);
}

fn run(data: &[u8]) -> Reached {
    let mut input = Input::new(data);
    let flags = input.u8();
    let mut world = World::new(flags);
    // Each op costs at least one byte; a cap keeps a long input's run short.
    let mut ops = 0;
    while !input.done() && ops < 512 {
        world.step(&mut input);
        ops += 1;
    }
    world.check_honest();
    world.reached.circuits_killed_at_r = world.r.core.stats().circuits_killed;
    world.reached
}

/// Seed inputs: op sequences a client could send, honest and not (the op encoding above).
pub(crate) fn seeds() -> Vec<(String, Vec<u8>)> {
    let begin = b"127.0.0.1:80\0";
    // create (ntor), extend to X in RELAY_EARLY
    let built: &[u8] = &[1, 0, 2, 0, 1];
    // a relay message on circuit 0 to hop 1: BEGIN on stream 5
    let mut begin_op = vec![3, 0, 1, RelayCommand::BEGIN.0, 0, 5, 0, begin.len() as u8];
    begin_op.extend_from_slice(begin);
    let mut stream_both_ways = vec![0u8];
    stream_both_ways.extend_from_slice(built);
    stream_both_ways.extend_from_slice(&begin_op);
    // carry, connect every waiting stream; X sends 160 bytes on it; carry; drain
    stream_both_ways.extend_from_slice(&[4, 0xff, 5, 0, 10, 4, 0, 7]);
    // then the client's DATA to X on the stream, and an END
    stream_both_ways.extend_from_slice(&[
        3,
        0,
        1,
        RelayCommand::DATA.0,
        0,
        5,
        0,
        3,
        b'a',
        b'b',
        b'c',
    ]);
    stream_both_ways.extend_from_slice(&[3, 0, 1, RelayCommand::END.0, 0, 5, 0, 1, 6, 4, 0]);

    // tight limits: a circuit floods DROP cells toward X that nobody carries, time passes
    let mut flood = vec![1u8];
    flood.extend_from_slice(built);
    for _ in 0..80 {
        flood.extend_from_slice(&[3, 0, 1, RelayCommand::DROP.0, 0, 0, 0, 0]);
    }
    flood.extend_from_slice(&[6, 40, 4, 0]);

    // ntor v3 asking for congestion control; a stream whose exit sends without reading
    // SENDMEs back
    let mut cc = vec![0u8, 1, 3, 2, 0, 1];
    cc.extend_from_slice(&begin_op);
    cc.extend_from_slice(&[4, 0xff]);
    for _ in 0..12 {
        cc.extend_from_slice(&[5, 0, 255, 4, 0]);
    }
    cc.extend_from_slice(&[7, 6, 200]);

    // raw cells: CREATE_FAST, a garbage CREATE2, a RELAY on a circuit that exists, VERSIONS,
    // a DESTROY of the circuit, then the same id again
    let mut raw = vec![0u8, 1, 0];
    for (target, cmd) in [(0u8, 5u8), (0, 10), (0x80, 3), (0, 7), (0x80, 4), (0x80, 3)] {
        // 16 bytes: circuit id 9 (replaced by the circuit's if `target`), command, body
        raw.extend_from_slice(&[0, target, 8, 0, 0, 0, 9, cmd, 0xab, 0xcd, 0xef]);
        raw.extend_from_slice(&[0; 8]);
    }
    raw.extend_from_slice(&[7]);

    // EXTEND2 with a garbage body and to an unknown relay, a second EXTEND2 on a built
    // circuit, a RELAY_EARLY DATA to X, a close of the channel and a new one
    let mut odd = vec![0u8];
    odd.extend_from_slice(built);
    odd.extend_from_slice(&[3, 0, 0, RelayCommand::EXTEND2.0, 0, 0, 1, 4, 1, 2, 3, 4]);
    odd.extend_from_slice(&[
        2,
        0,
        1,
        3,
        0,
        1,
        RelayCommand::DATA.0,
        0,
        1,
        1,
        1,
        b'x',
        4,
        0,
    ]);
    odd.extend_from_slice(&[8, 1, 0, 0, 0, 6, 255, 6, 255]);

    // both relays switch paths: two circuits linked at X (CONFLUX_LINK on each), a stream on
    // the first, a CONFLUX_SWITCH and DATA on the second, X's data back, a drain
    let link = ConfluxLink {
        nonce: [7; 32],
        last_seqno_sent: 0,
        last_seqno_recv: 0,
        desired_ux: 0,
    }
    .encode();
    let mut conflux = vec![2u8];
    conflux.extend_from_slice(built);
    conflux.extend_from_slice(&[1, 0, 2, 1, 1]);
    for k in 0..2u8 {
        conflux.extend_from_slice(&[
            3,
            k,
            1,
            RelayCommand::CONFLUX_LINK.0,
            0,
            0,
            0,
            link.len() as u8,
        ]);
        conflux.extend_from_slice(&link);
    }
    conflux.extend_from_slice(&[4, 0, 7]);
    conflux.extend_from_slice(&begin_op);
    conflux.extend_from_slice(&[4, 0xff]);
    let switch = ConfluxSwitch { relative_seq: 1 }.encode();
    conflux.extend_from_slice(&[
        3,
        1,
        1,
        RelayCommand::CONFLUX_SWITCH.0,
        0,
        0,
        0,
        switch.len() as u8,
    ]);
    conflux.extend_from_slice(&switch);
    conflux.extend_from_slice(&[3, 1, 1, RelayCommand::DATA.0, 0, 5, 0, 2, b'h', b'i']);
    conflux.extend_from_slice(&[4, 0, 5, 0, 20, 4, 0, 7]);

    vec![
        ("nothing".into(), vec![0]),
        ("conflux-linked-legs".into(), conflux),
        ("stream-both-ways".into(), stream_both_ways),
        ("tight-flood".into(), flood),
        ("ntor3-cc-stream".into(), cc),
        ("raw-cells".into(), raw),
        ("odd-requests".into(), odd),
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
        let r = reached("stream-both-ways");
        assert_eq!((r.hostile_circuits, r.extended), (1, 1), "{r:?}");
        // Its BEGIN opened a stream at X, its DATA was written there and X's 160 bytes came
        // back to the hostile client.
        assert_eq!(r.exit_connects, 1, "{r:?}");
        assert_eq!(r.hostile_written, 3, "{r:?}");
        assert!(r.cells_to_hostile >= 1, "{r:?}");

        let r = reached("tight-flood");
        assert!(
            r.circuits_killed_at_r >= 1,
            "the flooding circuit is killed: {r:?}"
        );

        let r = reached("ntor3-cc-stream");
        assert_eq!(
            (r.hostile_circuits, r.extended, r.exit_connects),
            (1, 1, 1),
            "{r:?}"
        );
        assert!(
            r.cells_to_hostile > 12,
            "X's data reached the client: {r:?}"
        );

        let r = reached("conflux-linked-legs");
        assert_eq!((r.hostile_circuits, r.extended), (2, 2), "{r:?}");
        assert_eq!(r.linked, 2, "X linked both legs: {r:?}");
        assert_eq!(r.exit_connects, 1, "{r:?}");
        assert_eq!(
            r.hostile_written, 2,
            "the DATA after the switch reached X's stream: {r:?}"
        );

        let r = reached("raw-cells");
        assert_eq!(r.hostile_circuits, 1, "{r:?}");
        assert!(
            r.circuits_killed_at_r >= 1,
            "the garbage RELAY closes its circuit: {r:?}"
        );
    }
}
