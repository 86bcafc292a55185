//! A hand-driven path for tests that need to control single cells: a fake client that speaks
//! CREATE2 / EXTEND2 (ntor) and tor1 relay crypto itself, in front of two real relay cores,
//! R (the client's first hop) and X (R's next hop, an exit).
//!
//! Unlike `network.rs`, nothing moves by itself: a test decides which cells each core sees
//! (RELAY or RELAY_EARLY, cells beyond any window, TRUNCATE) and when a channel drains, then
//! reads exactly what the cores sent. Time is a virtual clock: `now` is passed in.

// Each test file uses part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Instant;

use chive_cell::{
    parse_relay, relay_payload, Cell, CellCommand, CircExt, CircId, Create2, Created2, Destroy,
    DestroyReason, Extend2, Extended2, LinkSpec, RelayCommand, CELL_LEN,
};
use chive_core::{ChannelId, Core, CoreConfig, Event, HopSpec, RelayKeys, StreamHandle};
use chive_crypto::ntor::{self, KeyMaterial, NtorClientState, NtorSecretKey, NTOR_HTYPE};
use chive_crypto::ntor_v3::{self, CIRCUIT_VERIFICATION, NTOR_V3_HTYPE};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto};
use chive_crypto::IdentityKeypair;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// R's channel from the client (the client opened it; no identity).
pub const R_CLIENT: ChannelId = ChannelId(1);
/// R's channel to X (R opened it).
pub const R_TO_X: ChannelId = ChannelId(2);
/// X's channel from R.
pub const X_FROM_R: ChannelId = ChannelId(1);

/// A relay core and how to reach it.
pub struct Relay {
    pub core: Core,
    pub hop: HopSpec,
}

/// A relay core with `cfg` and keys derived from `seed`.
pub fn relay(seed: u8, cfg: CoreConfig) -> Relay {
    let mut rng = StdRng::seed_from_u64(u64::from(seed));
    let identity = IdentityKeypair::generate(&mut rng).public();
    let ntor = NtorSecretKey::generate(&mut rng);
    let hop = HopSpec {
        identity,
        ntor_key: ntor.public(),
        addr: SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(seed))),
    };
    let core = Core::new(
        CoreConfig {
            relay: Some(RelayKeys { identity, ntor }),
            ..cfg
        },
        [seed; 32],
    );
    Relay { core, hop }
}

/// The client's end of one circuit: its id on the client's channel and one crypto layer per hop.
pub struct Circ {
    pub id: CircId,
    pub crypto: ClientCircuitCrypto,
}

/// A relay message the client decrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// The hop that sent it (0 = R).
    pub hop: usize,
    pub cmd: RelayCommand,
    pub sid: u16,
    pub data: Vec<u8>,
}

/// The fake client, R and X, with the channels client–R and R–X open.
pub struct Path {
    pub r: Relay,
    pub x: Relay,
    pub now: Instant,
    rng: StdRng,
    next_circ_id: u32,
}

impl Path {
    /// R configured with `r_cfg`, X an exit with default limits.
    pub fn new(r_cfg: CoreConfig) -> Path {
        let mut r = relay(1, r_cfg);
        let mut x = relay(
            2,
            CoreConfig {
                exit: true,
                ..CoreConfig::default()
            },
        );
        let now = Instant::now();
        r.core.channel_opened(R_CLIENT, None, false, now);
        r.core
            .channel_opened(R_TO_X, Some(x.hop.identity), true, now);
        x.core
            .channel_opened(X_FROM_R, Some(r.hop.identity), false, now);
        Path {
            r,
            x,
            now,
            rng: StdRng::seed_from_u64(99),
            next_circ_id: 1,
        }
    }

    /// Send CREATE2 to R for a fresh circuit id; returns the id and the handshake state.
    pub fn send_create(&mut self) -> (CircId, NtorClientState) {
        // The client opened the channel: its ids have the high bit set.
        let id = 0x8000_0000 | self.next_circ_id;
        self.next_circ_id += 1;
        let (cell, state) = create2_cell(&mut self.rng, &self.r, id);
        self.r.core.handle_cell(R_CLIENT, cell, self.now);
        (id, state)
    }

    /// A one-hop circuit to R.
    pub fn create(&mut self) -> Circ {
        let (id, state) = self.send_create();
        let cells = self.cells_for_client();
        let [created] = cells.as_slice() else {
            panic!("expected one CREATED2, got {cells:?}");
        };
        assert_eq!(
            (created.circ_id, created.command),
            (id, CellCommand::CREATED2)
        );
        let reply = Created2::decode(&created.payload).unwrap();
        let km = ntor::client_finish(state, &reply.handshake).unwrap();
        let mut crypto = ClientCircuitCrypto::new();
        crypto.push_hop(ClientHopCrypto::new(&km));
        Circ { id, crypto }
    }

    /// A one-hop circuit to R handshaken with ntor v3, asking for congestion control if
    /// `ask_cc`; returns it and whether R agreed.
    pub fn create_v3(&mut self, ask_cc: bool) -> (Circ, bool) {
        let id = 0x8000_0000 | self.next_circ_id;
        self.next_circ_id += 1;
        let exts: &[CircExt] = if ask_cc { &[CircExt::CcRequest] } else { &[] };
        let msg = CircExt::encode_list(exts).unwrap();
        let (cell, state) = create2_v3_cell(&mut self.rng, &self.r, id, &msg);
        self.r.core.handle_cell(R_CLIENT, cell, self.now);
        let cells = self.cells_for_client();
        let [created] = cells.as_slice() else {
            panic!("expected one CREATED2, got {cells:?}");
        };
        assert_eq!(created.command, CellCommand::CREATED2, "{created:?}");
        let reply = Created2::decode(&created.payload).unwrap();
        let (msg, km) = ntor_v3::client_finish(state, &reply.handshake).unwrap();
        let agreed = CircExt::decode_list(&msg)
            .unwrap()
            .contains(&CircExt::CcResponse { sendme_inc: 100 });
        let mut crypto = ClientCircuitCrypto::new();
        crypto.push_hop(ClientHopCrypto::new(&km));
        (Circ { id, crypto }, agreed)
    }

    /// A two-hop circuit client → R → X (EXTEND2 in a RELAY_EARLY cell).
    pub fn create2(&mut self) -> Circ {
        let mut circ = self.create();
        let state = self.send_extend2(&mut circ, true);
        self.finish_extend(&mut circ, state);
        circ
    }

    /// Carry R's CREATE2 to X and X's CREATED2 back, then add X's layer to `circ` from R's
    /// EXTENDED2.
    pub fn finish_extend(&mut self, circ: &mut Circ, state: NtorClientState) {
        assert_eq!(self.r_to_x(), 1, "R sends one CREATE2 to X");
        self.x_to_r();
        let msgs = self.read(circ);
        let [msg @ Msg { hop: 0, .. }] = msgs.as_slice() else {
            panic!("expected EXTENDED2 from R, got {msgs:?}");
        };
        Path::add_hop(circ, state, msg);
    }

    /// Ask R to extend `circ` to X, in a RELAY_EARLY cell if `early`.
    pub fn send_extend2(&mut self, circ: &mut Circ, early: bool) -> NtorClientState {
        let x = self.x.hop.clone();
        self.send_extend2_to(circ, 0, &x, early)
    }

    /// Ask hop `via` of `circ` to extend it to `target`, in a RELAY_EARLY cell if `early`.
    pub fn send_extend2_to(
        &mut self,
        circ: &mut Circ,
        via: usize,
        target: &HopSpec,
        early: bool,
    ) -> NtorClientState {
        let (state, onionskin) =
            ntor::client_create(&mut self.rng, &target.identity.ntor_id(), &target.ntor_key);
        let SocketAddr::V4(addr) = target.addr else {
            unreachable!("test relays listen on IPv4")
        };
        let body = Extend2 {
            link_specifiers: vec![
                LinkSpec::Ed25519Id(*target.identity.as_bytes()),
                LinkSpec::Ipv4(addr),
            ],
            create2: Create2 {
                handshake_type: NTOR_HTYPE,
                handshake: onionskin.to_vec(),
            },
        }
        .encode()
        .unwrap();
        self.send(circ, via, RelayCommand::EXTEND2, 0, &body, early);
        state
    }

    /// Add a hop to `circ` from the EXTENDED2 in `msg`.
    pub fn add_hop(circ: &mut Circ, state: NtorClientState, msg: &Msg) {
        assert_eq!(msg.cmd, RelayCommand::EXTENDED2, "not EXTENDED2: {msg:?}");
        let reply = Extended2::decode(&msg.data).unwrap();
        let km = ntor::client_finish(state, &reply.handshake).unwrap();
        circ.crypto.push_hop(ClientHopCrypto::new(&km));
    }

    /// Encrypt a relay message for hop `hop` of `circ` and hand it to R.
    pub fn send(
        &mut self,
        circ: &mut Circ,
        hop: usize,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        early: bool,
    ) {
        let cell = relay_cell(circ, hop, cmd, sid, body, early);
        self.r.core.handle_cell(R_CLIENT, cell, self.now);
    }

    /// [`Path::send`] with the cell handed to R as its wire bytes, as the node's driver does.
    pub fn send_wire(
        &mut self,
        circ: &mut Circ,
        hop: usize,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
    ) {
        let cell = relay_cell(circ, hop, cmd, sid, body, false);
        let mut scratch = blank_cell();
        self.r
            .core
            .handle_cell_wire(R_CLIENT, &wire_of(&cell), &mut scratch, self.now);
    }

    /// Every cell R has for the client.
    pub fn cells_for_client(&mut self) -> Vec<Cell> {
        drain(&mut self.r.core, R_CLIENT, self.now)
    }

    /// Move every cell R has for X to X; returns how many.
    pub fn r_to_x(&mut self) -> usize {
        let now = self.now;
        carry(&mut self.r.core, R_TO_X, &mut self.x.core, X_FROM_R, now)
    }

    /// Move every cell X has for R to R; returns how many.
    pub fn x_to_r(&mut self) -> usize {
        let now = self.now;
        carry(&mut self.x.core, X_FROM_R, &mut self.r.core, R_TO_X, now)
    }

    /// A two-hop circuit through R to X with stream 1 connected at X; X's handle for it.
    pub fn circuit_with_stream(&mut self) -> (Circ, StreamHandle) {
        let mut circ = self.create2();
        self.send_begin_to_x(&mut circ, 1, false);
        let stream = loop {
            match self.x.core.poll_event() {
                Some(Event::ExitConnect { stream, .. }) => break stream,
                Some(_) => {}
                None => panic!("X opened no stream"),
            }
        };
        let now = self.now;
        self.x
            .core
            .exit_connected(stream, ([127, 0, 0, 1], 80).into(), now);
        self.x_to_r();
        let msgs = self.read(&mut circ);
        assert!(
            msgs.iter().any(|m| m.cmd == RelayCommand::CONNECTED),
            "no CONNECTED: {msgs:?}"
        );
        (circ, stream)
    }

    /// Send X (hop 1 of `circ`) a BEGIN to 127.0.0.1:80 on stream `sid` and carry R's cells to
    /// X; returns how many R sent.
    pub fn send_begin_to_x(&mut self, circ: &mut Circ, sid: u16, early: bool) -> usize {
        self.send(circ, 1, RelayCommand::BEGIN, sid, b"127.0.0.1:80\0", early);
        self.r_to_x()
    }

    /// Whether X still carries a circuit that answers: a BEGIN through it opens a stream.
    pub fn x_answers(&mut self, circ: &mut Circ, sid: u16) -> bool {
        self.send_begin_to_x(circ, sid, false);
        matches!(self.x.core.poll_event(), Some(Event::ExitConnect { .. }))
    }

    /// X's exit connects the stream a BEGIN to port 80 asked for (its CONNECTED is then queued
    /// toward R); panics if X did not open one.
    pub fn connect_at_x(&mut self) {
        let stream = match self.x.core.poll_event() {
            Some(Event::ExitConnect {
                stream, port: 80, ..
            }) => stream,
            other => panic!("X did not open the stream: {other:?}"),
        };
        self.x
            .core
            .exit_connected(stream, ([127, 0, 0, 1], 80).into(), self.now);
    }

    /// Send `n` DROP cells for X on `circ`; R queues them toward X, whose channel does not
    /// drain until a test moves its cells.
    pub fn flood_x(&mut self, circ: &mut Circ, n: usize) {
        for _ in 0..n {
            self.send(circ, 1, RelayCommand::DROP, 0, &[], false);
        }
    }

    /// Drain R's cells for the client and decrypt those of `circ` (all must be relay cells).
    pub fn read(&mut self, circ: &mut Circ) -> Vec<Msg> {
        let id = circ.id;
        self.cells_for_client()
            .iter()
            .filter(|c| c.circ_id == id)
            .map(|c| open(circ, c))
            .collect()
    }
}

/// Move every cell `from` has on its channel `out` to `to`, arriving on `to`'s channel `inp`;
/// returns how many.
fn carry(from: &mut Core, out: ChannelId, to: &mut Core, inp: ChannelId, now: Instant) -> usize {
    let cells = drain(from, out, now);
    let n = cells.len();
    // As the driver hands cells over: their wire bytes, all at once (`handle_cells_wire`: a
    // relayed cell is copied into its queue slot, a run of one circuit's with one lookup,
    // others decoded into `scratch`); the tests that call `handle_cell` directly keep the
    // by-value entry covered, `relay_wire.rs` the per-cell one.
    let batch: Vec<u8> = cells.iter().flat_map(wire_of).collect();
    let mut scratch = blank_cell();
    to.handle_cells_wire(inp, &batch, &mut scratch, now);
    n
}

/// `cell`'s 514 wire bytes.
pub fn wire_of(cell: &Cell) -> [u8; CELL_LEN] {
    let mut wire = [0; CELL_LEN];
    cell.write_wire(&mut wire);
    wire
}

/// A cell to decode into (`handle_cell_wire`'s scratch).
pub fn blank_cell() -> Cell {
    Cell::new(0, CellCommand::PADDING, &[]).expect("an empty PADDING cell")
}

/// A test playing a relay (identity `hop`, onion key `ntor`) answers a client core's CREATE2
/// of either ntor version. For ntor v3 the answer's extensions are `exts` if given (raw bytes,
/// possibly hostile), else what a chive relay that supports congestion control answers.
pub fn answer_create2(
    rng: &mut StdRng,
    hop: &HopSpec,
    ntor: &NtorSecretKey,
    create: &Create2,
    exts: Option<&[u8]>,
) -> (Vec<u8>, KeyMaterial) {
    if create.handshake_type == NTOR_HTYPE {
        let (reply, km) =
            ntor::server_handshake(rng, &hop.identity.ntor_id(), ntor, &create.handshake).unwrap();
        return (reply.to_vec(), km);
    }
    assert_eq!(create.handshake_type, NTOR_V3_HTYPE);
    let opened = ntor_v3::server_open(
        rng,
        hop.identity.as_bytes(),
        ntor,
        &create.handshake,
        CIRCUIT_VERIFICATION,
    )
    .unwrap();
    let answer = match exts {
        Some(raw) => raw.to_vec(),
        None => {
            let asked = CircExt::decode_list(&opened.message)
                .unwrap()
                .contains(&CircExt::CcRequest);
            let reply: &[CircExt] = if asked {
                &[CircExt::CcResponse { sendme_inc: 100 }]
            } else {
                &[]
            };
            CircExt::encode_list(reply).unwrap()
        }
    };
    opened.finish(&answer).unwrap()
}

/// A relay the test plays behind a real core (a client's first hop, or the hop after a real
/// relay): its identity and onion key and the rng its handshakes use. The core sends it cells
/// on one channel; the test reads them with [`drain`] and answers by hand.
pub struct PlayedRelay {
    pub hop: HopSpec,
    pub ntor: NtorSecretKey,
    pub rng: StdRng,
    /// The client's channel to it.
    pub chan: ChannelId,
}

impl PlayedRelay {
    /// The played relay (keys from `seed`) at 127.0.0.1:`port`, with `core`'s channel `chan`
    /// to it opened at `now` (`core` opened it and knows the relay's identity).
    pub fn facing(
        core: &mut Core,
        chan: ChannelId,
        seed: u64,
        port: u16,
        now: Instant,
    ) -> PlayedRelay {
        let mut rng = StdRng::seed_from_u64(seed);
        let identity = IdentityKeypair::generate(&mut rng).public();
        let ntor = NtorSecretKey::generate(&mut rng);
        let hop = HopSpec {
            identity,
            ntor_key: ntor.public(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        core.channel_opened(chan, Some(identity), true, now);
        PlayedRelay {
            hop,
            ntor,
            rng,
            chan,
        }
    }

    /// The CREATE2 `core` sent the played relay (panics if none): its circuit id and body.
    /// The other cells drained with it are dropped.
    pub fn take_create2(&self, core: &mut Core, now: Instant) -> (CircId, Create2) {
        let cells = drain(core, self.chan, now);
        let create = cells
            .iter()
            .find(|c| c.command == CellCommand::CREATE2)
            .unwrap_or_else(|| panic!("a CREATE2 expected: {cells:?}"));
        (create.circ_id, Create2::decode(&create.payload).unwrap())
    }

    /// Answer CREATE2 `create` of circuit `id` with a CREATED2 (extensions `exts` as in
    /// [`answer_create2`]) and hand it to `core`; returns the hop's key material.
    pub fn answer(
        &mut self,
        core: &mut Core,
        id: CircId,
        create: &Create2,
        exts: Option<&[u8]>,
        now: Instant,
    ) -> KeyMaterial {
        let (reply, km) = answer_create2(&mut self.rng, &self.hop, &self.ntor, create, exts);
        let created = Created2 { handshake: reply }.encode().unwrap();
        let cell = Cell::new(id, CellCommand::CREATED2, &created).unwrap();
        core.handle_cell(self.chan, cell, now);
        km
    }
}

/// A CREATE2 cell for circuit `id` with a fresh ntor onionskin for `relay`, and the client's
/// handshake state.
pub fn create2_cell(rng: &mut StdRng, relay: &Relay, id: CircId) -> (Cell, NtorClientState) {
    let (state, onionskin) =
        ntor::client_create(rng, &relay.hop.identity.ntor_id(), &relay.hop.ntor_key);
    let body = Create2 {
        handshake_type: NTOR_HTYPE,
        handshake: onionskin.to_vec(),
    }
    .encode()
    .unwrap();
    (Cell::new(id, CellCommand::CREATE2, &body).unwrap(), state)
}

/// A CREATE2 cell for `relay` with an ntor v3 handshake carrying `msg` (a `CircExt` list, or
/// any bytes a test wants the relay to read), and the client's handshake state.
pub fn create2_v3_cell(
    rng: &mut StdRng,
    relay: &Relay,
    id: CircId,
    msg: &[u8],
) -> (Cell, ntor_v3::NtorV3ClientState) {
    let (state, handshake) = ntor_v3::client_create(
        rng,
        relay.hop.identity.as_bytes(),
        &relay.hop.ntor_key,
        msg,
        CIRCUIT_VERIFICATION,
    );
    let body = Create2 {
        handshake_type: NTOR_V3_HTYPE,
        handshake,
    }
    .encode()
    .unwrap();
    (Cell::new(id, CellCommand::CREATE2, &body).unwrap(), state)
}

/// A relay cell carrying `cmd` for hop `hop` of `circ`, as RELAY_EARLY if `early`.
pub fn relay_cell(
    circ: &mut Circ,
    hop: usize,
    cmd: RelayCommand,
    sid: u16,
    body: &[u8],
    early: bool,
) -> Cell {
    let mut payload = relay_payload(cmd, sid, body).unwrap();
    circ.crypto.encrypt_to(hop, &mut payload).unwrap();
    let command = if early {
        CellCommand::RELAY_EARLY
    } else {
        CellCommand::RELAY
    };
    Cell::from_payload(circ.id, command, payload)
}

/// Decrypt a relay cell of `circ`; panics if no hop recognizes it.
pub fn open(circ: &mut Circ, cell: &Cell) -> Msg {
    assert_eq!(
        cell.command,
        CellCommand::RELAY,
        "not a relay cell: {cell:?}"
    );
    let mut payload = cell.payload;
    let (hop, _) = circ
        .crypto
        .decrypt_from_any(&mut payload)
        .expect("no hop recognized the cell");
    let view = parse_relay(&payload).unwrap();
    Msg {
        hop,
        cmd: view.command,
        sid: view.stream_id,
        data: view.data.to_vec(),
    }
}

/// Every cell `core` has for `chan`, as a driver with unlimited room would take them: as the
/// node's driver does, their wire bytes (`poll_transmit_wire`), decoded again here.
pub fn drain(core: &mut Core, chan: ChannelId, now: Instant) -> Vec<Cell> {
    let mut wire = Vec::new();
    let mut n = 0;
    loop {
        let got = core.poll_transmit_wire(chan, 1024, now, &mut wire);
        if got == 0 {
            break;
        }
        n += got;
    }
    assert_eq!(
        wire.len(),
        n * CELL_LEN,
        "one fixed cell per transmitted cell"
    );
    wire.chunks(CELL_LEN)
        .map(|c| Cell::decode(c).expect("poll_transmit_wire writes whole fixed cells"))
        .collect()
}

/// The DESTROY cells among `cells`, as (circuit id, reason).
pub fn destroys(cells: &[Cell]) -> Vec<(CircId, DestroyReason)> {
    cells
        .iter()
        .filter(|c| c.command == CellCommand::DESTROY)
        .map(|c| (c.circ_id, Destroy::decode(&c.payload).unwrap().reason))
        .collect()
}
