//! A whole overlay in memory, shared by the multi-node tests (`network`, `switching`,
//! `path_switching`, `onion`): endpoint cores (clients, onion services) and relay cores, links
//! with a per-step write budget and a delay, simulated time (1 ms per step). Nothing runs by
//! itself: a test steps the network and reads what the cores did.
//!
//! Each step: due timers, every node's events (answered as a driver would: `Connect` opens a
//! link, an exit "connects" every stream to 127.0.0.1:80, a relay's stream bytes are echoed back,
//! an endpoint's are recorded with its read credit), then every writable channel writes up to
//! its link's budget into the link's pipe, then the cells whose delay has passed arrive.
//! Everything else a core reports lands in `events`.
//!
//! Unlike `common.rs` (a hand-driven path that controls single cells) the cores here talk to
//! each other; a test forges a cell by handing it to a core itself.
//!
//! A test file names its own setup `type Net = Sim;` with a local trait for its short forms
//! (`Net::new`, `build`, `open`…), so test bodies read `net.nodes[E].congested(c, net.now)`.

// Each test file uses part of this module.
#![allow(dead_code)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chive_cell::Cell;
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event, HopSpec, RelayKeys, StreamHandle};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::{IdentityKey, IdentityKeypair};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// One direction of a link: what `(node, chan)` writes goes to `peer`'s `pchan`.
pub struct Link {
    pub peer: usize,
    pub pchan: ChannelId,
    /// Cells the link carries per step.
    pub budget: usize,
    /// Steps a cell spends on the wire.
    pub delay: u64,
    /// Cells on the wire: (step they arrive, cell).
    pub pipe: VecDeque<(u64, Cell)>,
    /// Drop everything written (a peer that never answers).
    pub blackhole: bool,
    /// Circuit ids of the cells written, in order (for tests that forge cells).
    pub ids: Vec<u32>,
}

/// A link's shape: cells per step and steps of delay.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub budget: usize,
    pub delay: u64,
}

/// The overlay: `nodes[..endpoints]` are endpoints, the rest relays (relay `i` is node
/// `endpoints + i`, reached through `hops[i]`).
pub struct Sim {
    pub nodes: Vec<Core>,
    pub identities: Vec<Option<IdentityKey>>,
    pub hops: Vec<HopSpec>,
    endpoints: usize,
    pub links: BTreeMap<(usize, ChannelId), Link>,
    next_chan: u64,
    pub step_no: u64,
    pub now: Instant,
    /// What the cores reported that the network did not answer itself.
    pub events: Vec<(usize, Event)>,
    writable: BTreeSet<(usize, ChannelId)>,
    /// Bytes each endpoint's streams received.
    pub received: HashMap<(usize, StreamHandle), Vec<u8>>,
    /// Read credit granted per endpoint stream and not yet used.
    pub credit: HashMap<(usize, StreamHandle), usize>,
    /// Read credit granted per endpoint stream in all.
    pub credit_total: HashMap<(usize, StreamHandle), usize>,
    /// Bytes the exits' "servers" received (and echo).
    pub exit_received: Vec<u8>,
    echo: VecDeque<(usize, StreamHandle, Vec<u8>)>,
    /// The shape of every link but `slow`.
    pub shape: Shape,
    /// (from, to, shape): the (non-switch) links from `from` to `to` get this shape.
    pub slow: Option<(usize, usize, Shape)>,
    /// Answer ConnectSwitch with a failure.
    pub fail_switch_connect: bool,
    /// Switch connections lose everything the peer writes (it never answers).
    pub mute_switch_peer: bool,
    /// Leave ConnectSwitch unanswered in `events` (the test opens the connection later with
    /// `connect(.., true)`).
    pub defer_switch_connect: bool,
    /// Upload only: an exit keeps what arrives under this stream of node 0 instead of echoing
    /// it (so nothing flows back to the client).
    pub upload_only: Option<StreamHandle>,
    /// Keys and onion-service material for tests (seeded).
    pub rng: StdRng,
}

impl Sim {
    /// `endpoints` (client, service…) with their configs, then `relays` relays with
    /// `relay_cfg(i)` plus keys drawn from `seed`; node `n`'s core seed is `[n + 1; 32]`.
    /// Links carry 32 cells a step, no delay, until a test sets `shape` / `slow`.
    pub fn overlay(
        seed: u64,
        endpoints: Vec<CoreConfig>,
        relays: usize,
        relay_cfg: impl Fn(usize) -> CoreConfig,
    ) -> Sim {
        // SIM_DEBUG=1 prints the cores' logs (the reasons of closed circuits).
        if std::env::var("SIM_DEBUG").is_ok() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("info")
                .with_test_writer()
                .try_init();
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let n_end = endpoints.len();
        let mut nodes: Vec<Core> = endpoints
            .into_iter()
            .enumerate()
            .map(|(n, cfg)| Core::new(cfg, [n as u8 + 1; 32]))
            .collect();
        let mut identities = vec![None; n_end];
        let mut hops = Vec::new();
        for i in 0..relays {
            let id = IdentityKeypair::generate(&mut rng).public();
            let ntor = NtorSecretKey::generate(&mut rng);
            hops.push(HopSpec {
                identity: id,
                ntor_key: ntor.public(),
                addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
            });
            let cfg = CoreConfig {
                relay: Some(RelayKeys { identity: id, ntor }),
                ..relay_cfg(i)
            };
            nodes.push(Core::new(cfg, [(n_end + i) as u8 + 1; 32]));
            identities.push(Some(id));
        }
        Sim {
            nodes,
            identities,
            hops,
            endpoints: n_end,
            links: BTreeMap::new(),
            next_chan: 1,
            step_no: 0,
            now: Instant::now(),
            events: Vec::new(),
            writable: BTreeSet::new(),
            received: HashMap::new(),
            credit: HashMap::new(),
            credit_total: HashMap::new(),
            exit_received: Vec::new(),
            upload_only: None,
            echo: VecDeque::new(),
            shape: Shape {
                budget: 32,
                delay: 0,
            },
            slow: None,
            fail_switch_connect: false,
            mute_switch_peer: false,
            defer_switch_connect: false,
            rng,
        }
    }

    /// The node with identity `id`.
    pub fn node_of(&self, id: &IdentityKey) -> usize {
        self.identities
            .iter()
            .position(|i| i.as_ref() == Some(id))
            .unwrap()
    }

    /// A link from `from` to `to` (a switch connection if `switch`); returns (from's channel,
    /// to's channel).
    pub fn connect(&mut self, from: usize, to: usize, switch: bool) -> (ChannelId, ChannelId) {
        let (a, b) = (ChannelId(self.next_chan), ChannelId(self.next_chan + 1));
        self.next_chan += 2;
        let shape = match self.slow {
            Some((f, t, s)) if (f, t) == (from, to) && !switch => s,
            _ => self.shape,
        };
        for (n, c, p, pc) in [(from, a, to, b), (to, b, from, a)] {
            self.links.insert(
                (n, c),
                Link {
                    peer: p,
                    pchan: pc,
                    budget: shape.budget,
                    delay: shape.delay,
                    pipe: VecDeque::new(),
                    blackhole: switch && n == to && self.mute_switch_peer,
                    ids: Vec::new(),
                },
            );
        }
        let (from_id, to_id) = (self.identities[from], self.identities[to]);
        if switch {
            self.nodes[from].switch_channel_opened(a, to_id.unwrap(), self.now);
        } else {
            self.nodes[from].channel_opened(a, to_id, true, self.now);
        }
        self.nodes[to].channel_opened(b, from_id, false, self.now);
        (a, b)
    }

    /// Sets the per-step write budget of node `from`'s link towards node `to`, per triple.
    pub fn set_budgets(&mut self, budgets: &[(usize, usize, usize)]) {
        for &(from, to, budget) in budgets {
            let chan = self.chan(from, to);
            self.links.get_mut(&(from, chan)).unwrap().budget = budget;
        }
    }

    /// `node` writes `2 * rate` cells a step over channels `a` and `b` together, shared and
    /// work-conserving: `b` its half if it has that much waiting, or up to all of it while `a`
    /// has nothing waiting; `a` the rest (an entry's write rate shared by two clients).
    pub fn share_rate(&mut self, node: usize, a: ChannelId, b: ChannelId, rate: usize) {
        let b_waiting = self.nodes[node].channel_queued(b);
        let b_share = if self.nodes[node].channel_queued(a) > 0 {
            b_waiting.min(rate)
        } else {
            b_waiting.min(2 * rate)
        };
        self.links.get_mut(&(node, a)).unwrap().budget = 2 * rate - b_share;
        self.links.get_mut(&(node, b)).unwrap().budget = b_share;
    }

    /// `from`'s first channel to `to`.
    pub fn chan(&self, from: usize, to: usize) -> ChannelId {
        self.links
            .iter()
            .find(|((n, _), l)| *n == from && l.peer == to)
            .map(|((_, c), _)| *c)
            .unwrap()
    }

    /// Drop everything `from` writes to `to` from now on.
    pub fn blackhole(&mut self, from: usize, to: usize) {
        for ((n, _), l) in self.links.iter_mut() {
            if *n == from && l.peer == to {
                l.blackhole = true;
                l.pipe.clear();
            }
        }
    }

    /// One step; returns whether anything moved.
    pub fn step(&mut self) -> bool {
        let mut busy = false;
        for n in 0..self.nodes.len() {
            if self.nodes[n].next_deadline().is_some_and(|d| d <= self.now) {
                self.nodes[n].handle_timeout(self.now);
            }
            while let Some(ev) = self.nodes[n].poll_event() {
                busy = true;
                self.on_event(n, ev);
            }
        }
        while let Some((n, stream, data)) = self.echo.pop_front() {
            self.nodes[n].stream_data(stream, &data, self.now);
        }
        for n in 0..self.nodes.len() {
            while let Some(c) = self.nodes[n].poll_ready_channel() {
                self.writable.insert((n, c));
            }
        }
        let chans: Vec<(usize, ChannelId)> = self.writable.iter().copied().collect();
        for (n, chan) in chans {
            let Some(link) = self.links.get_mut(&(n, chan)) else {
                self.writable.remove(&(n, chan));
                continue;
            };
            let mut out = Vec::new();
            self.nodes[n].poll_transmit(chan, link.budget, self.now, &mut out);
            if !self.nodes[n].has_pending(chan) {
                self.writable.remove(&(n, chan));
            }
            if !link.blackhole {
                for cell in out {
                    busy = true;
                    link.ids.push(cell.circ_id);
                    link.pipe.push_back((self.step_no + link.delay, cell));
                }
            }
        }
        for (&(_, _), link) in self.links.iter_mut() {
            if !link.pipe.is_empty() {
                busy = true;
            }
            // As the node's driver hands cells over: the wire bytes of what arrived together,
            // so relayed cells take the in-place path, a run of one circuit's at once
            // (`handle_cells_wire`).
            let mut batch = Vec::new();
            while link.pipe.front().is_some_and(|(t, _)| *t <= self.step_no) {
                let cell = link.pipe.pop_front().unwrap().1;
                batch.extend_from_slice(&common::wire_of(&cell));
            }
            let mut scratch = common::blank_cell();
            self.nodes[link.peer].handle_cells_wire(link.pchan, &batch, &mut scratch, self.now);
        }
        self.step_no += 1;
        self.now += Duration::from_millis(1);
        busy
    }

    fn on_event(&mut self, n: usize, ev: Event) {
        match ev {
            Event::Connect { identity, .. } => {
                let to = self.node_of(&identity);
                self.connect(n, to, false);
            }
            Event::ConnectSwitch { .. } if self.defer_switch_connect => self.events.push((n, ev)),
            Event::ConnectSwitch { identity } => {
                if self.fail_switch_connect {
                    self.nodes[n].switch_connect_failed(identity, self.now);
                } else {
                    let to = self.node_of(&identity);
                    self.connect(n, to, true);
                }
            }
            Event::ExitConnect { stream, .. } => {
                let addr = SocketAddr::from(([127, 0, 0, 1], 80));
                self.nodes[n].exit_connected(stream, addr, self.now);
            }
            Event::StreamWrite {
                stream,
                data,
                cells,
            } => {
                if n < self.endpoints {
                    self.received
                        .entry((n, stream))
                        .or_default()
                        .extend_from_slice(&data);
                } else if let Some(up) = self.upload_only {
                    // Upload only: keep what the exit got under the client's stream.
                    self.received
                        .entry((0, up))
                        .or_default()
                        .extend_from_slice(&data);
                } else {
                    self.exit_received.extend_from_slice(&data);
                    self.echo.push_back((n, stream, data));
                }
                self.nodes[n].stream_flushed(stream, cells, self.now);
            }
            Event::StreamReadCredit { stream, bytes } if n < self.endpoints => {
                *self.credit.entry((n, stream)).or_default() += bytes;
                *self.credit_total.entry((n, stream)).or_default() += bytes;
            }
            Event::CloseChannel { chan, .. } => {
                self.nodes[n].channel_closed(chan, self.now);
            }
            other => self.events.push((n, other)),
        }
    }

    /// A server behind exit `node` that sends without end: fill all `bytes` of a read credit
    /// for `stream` at once, with zeros.
    pub fn fill_credit(&mut self, node: usize, stream: StreamHandle, bytes: usize) {
        const CHUNK: [u8; 16 * 1024] = [0; 16 * 1024];
        let mut left = bytes;
        while left > 0 {
            let k = left.min(CHUNK.len());
            self.nodes[node].stream_data(stream, &CHUNK[..k], self.now);
            left -= k;
        }
    }

    /// Step until nothing moved for 4 steps in a row, or `max_steps`.
    pub fn run(&mut self, max_steps: usize) {
        let mut idle = 0;
        for _ in 0..max_steps {
            if self.step() {
                idle = 0;
            } else {
                idle += 1;
                if idle > 3 {
                    return;
                }
            }
        }
    }

    /// Step `steps` times whether or not anything moves (timers).
    pub fn idle(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// Node `node` builds a circuit through relays `relays` (indices into `hops`), running up
    /// to `max_steps`; panics if it is not built.
    pub fn build_through(&mut self, node: usize, relays: &[usize], max_steps: usize) -> CircKey {
        let path = relays.iter().map(|&r| self.hops[r].clone()).collect();
        let circ = self.nodes[node].launch_circuit(path, self.now);
        self.run(max_steps);
        assert!(
            self.events
                .iter()
                .any(|(n, e)| *n == node && *e == Event::CircuitBuilt { circ }),
            "circuit not built: {:?}",
            self.events
        );
        circ
    }

    /// Node `node` opens a stream to 127.0.0.1:80 on `circ`, running up to `max_steps`.
    pub fn open_on(&mut self, node: usize, circ: CircKey, max_steps: usize) -> StreamHandle {
        let s = self.nodes[node]
            .open_stream(circ, "127.0.0.1", 80, self.now)
            .unwrap();
        self.run(max_steps);
        s
    }

    /// Whether stream `s` of node `n` was reported connected.
    pub fn connected(&self, n: usize, s: StreamHandle) -> bool {
        self.events.iter().any(|(node, e)| {
            *node == n && matches!(e, Event::StreamConnected { stream, .. } if *stream == s)
        })
    }

    /// Whether node `n` reported `circ` closed.
    pub fn closed(&self, n: usize, circ: CircKey) -> bool {
        self.events.iter().any(|(node, e)| {
            *node == n && matches!(e, Event::CircuitClosed { circ: c, .. } if *c == circ)
        })
    }

    /// Circuits killed on every node.
    pub fn killed(&self) -> u64 {
        self.nodes.iter().map(|n| n.stats().circuits_killed).sum()
    }

    /// The bytes node `n`'s stream `s` received.
    pub fn got(&self, n: usize, s: StreamHandle) -> &[u8] {
        self.received.get(&(n, s)).map_or(&[], Vec::as_slice)
    }

    /// Whether each of node `n`'s streams received at least as many bytes as it sent.
    pub fn echoed(&self, n: usize, streams: &[(StreamHandle, Vec<u8>)]) -> bool {
        streams
            .iter()
            .all(|(s, d)| self.got(n, *s).len() >= d.len())
    }

    /// Feed node `node`'s streams their bytes as read credit allows (4 KiB a stream a step at
    /// most), stepping, until every byte is sent and `done` holds, or `steps` ran out; `at(step,
    /// sim)` runs before each step. Returns whether it finished.
    pub fn feed(
        &mut self,
        node: usize,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        mut at: impl FnMut(usize, &mut Sim),
        done: impl Fn(&Sim) -> bool,
    ) -> bool {
        let mut sent = vec![0usize; streams.len()];
        for i in 0..steps {
            at(i, self);
            for (j, (s, data)) in streams.iter().enumerate() {
                let credit = self.credit.entry((node, *s)).or_default();
                if sent[j] < data.len() && *credit > 0 {
                    let n = (*credit).min(data.len() - sent[j]).min(4096);
                    *credit -= n;
                    self.nodes[node].stream_data(*s, &data[sent[j]..sent[j] + n], self.now);
                    sent[j] += n;
                }
            }
            self.step();
            if sent.iter().zip(streams).all(|(k, (_, d))| *k == d.len()) && done(self) {
                return true;
            }
        }
        false
    }

    /// Feed node `n`'s streams (see `feed`) until each got its bytes back or `steps` ran out.
    pub fn echo_transfer(
        &mut self,
        n: usize,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        at: impl FnMut(usize, &mut Sim),
    ) -> bool {
        self.feed(n, streams, steps, at, |sim| sim.echoed(n, streams))
    }

    /// Each of node `n`'s streams got its own bytes back, exactly and in order.
    pub fn assert_echo(&self, n: usize, streams: &[(StreamHandle, Vec<u8>)]) {
        if std::env::var("SIM_DEBUG").is_ok() {
            for (i, node) in self.nodes.iter().enumerate() {
                eprintln!("node {i}: {:?} {:?}", node.stats(), node.switch_stats());
            }
        }
        for (s, data) in streams {
            let got = self.got(n, *s);
            assert_eq!(got.len(), data.len(), "stream {s:?}: length");
            assert!(
                got == data,
                "stream {s:?}: bytes differ or are out of order"
            );
        }
    }
}

/// Bytes 0, 1, … 250, 0, 1, … xor `salt`.
pub fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}
