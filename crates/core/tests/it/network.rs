//! A whole overlay in memory: one client core and three relay cores, cells
//! moved between them by the test, simulated time. Exercises circuit
//! building (ntor, EXTEND2), tor1 crypto, streams, SENDME windows and the
//! handling of bad input, deterministically.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, EndReason};
use chive_core::cc::{CcKind, VegasParams};
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event, HopSpec, RelayKeys, StreamHandle};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::{IdentityKey, IdentityKeypair};
use rand::rngs::StdRng;
use rand::SeedableRng;

const CLIENT: usize = 0;

/// What an exit's "server" does with a stream's bytes.
#[derive(Clone, Copy)]
enum Server {
    /// Send every byte back.
    Echo,
}

struct Net {
    nodes: Vec<Core>,
    identities: Vec<Option<IdentityKey>>,
    hops: Vec<HopSpec>,
    /// (node, chan) → (peer node, peer chan)
    links: HashMap<(usize, ChannelId), (usize, ChannelId)>,
    next_chan: u64,
    now: Instant,
    /// Bytes the client received per stream.
    received: HashMap<StreamHandle, Vec<u8>>,
    events: Vec<(usize, Event)>,
    server: Server,
    /// Cells per channel per step the "network" carries (a write budget).
    budget: usize,
    /// Exit streams awaiting their echo, in order.
    echo: VecDeque<(usize, StreamHandle, Vec<u8>)>,
    /// Channels with cells waiting.
    writable: BTreeSet<(usize, ChannelId)>,
    /// Bytes the exits wrote to their servers.
    exit_received: Vec<u8>,
}

impl Net {
    fn new(circwindow: u32) -> Net {
        Net::with_cc(circwindow, CcKind::Fixed)
    }

    fn with_cc(circwindow: u32, cc: CcKind) -> Net {
        let mut rng = StdRng::seed_from_u64(7);
        let mut nodes = vec![Core::new(
            CoreConfig {
                circwindow,
                congestion_control: cc,
                ..CoreConfig::default()
            },
            [1; 32],
        )];
        let mut identities = vec![None];
        let mut hops = Vec::new();
        for i in 0..3u8 {
            let id = IdentityKeypair::generate(&mut rng).public();
            let ntor = NtorSecretKey::generate(&mut rng);
            hops.push(HopSpec {
                identity: id,
                ntor_key: ntor.public(),
                addr: SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(i))),
            });
            nodes.push(Core::new(
                CoreConfig {
                    circwindow,
                    congestion_control: cc,
                    relay: Some(RelayKeys { identity: id, ntor }),
                    exit: true,
                    ..CoreConfig::default()
                },
                [i + 2; 32],
            ));
            identities.push(Some(id));
        }
        Net {
            nodes,
            identities,
            hops,
            links: HashMap::new(),
            next_chan: 1,
            now: Instant::now(),
            received: HashMap::new(),
            events: Vec::new(),
            server: Server::Echo,
            budget: 32,
            echo: VecDeque::new(),
            writable: BTreeSet::new(),
            exit_received: Vec::new(),
        }
    }

    fn node_of(&self, id: &IdentityKey) -> usize {
        self.identities
            .iter()
            .position(|i| i.as_ref() == Some(id))
            .unwrap()
    }

    fn connect(&mut self, from: usize, to: usize) {
        let (a, b) = (ChannelId(self.next_chan), ChannelId(self.next_chan + 1));
        self.next_chan += 2;
        self.links.insert((from, a), (to, b));
        self.links.insert((to, b), (from, a));
        let from_id = self.identities[from];
        let to_id = self.identities[to];
        self.nodes[from].channel_opened(a, to_id, true, self.now);
        self.nodes[to].channel_opened(b, from_id, false, self.now);
    }

    /// One round: every node's events, then every channel's cells, then time.
    fn step(&mut self) -> bool {
        let mut busy = false;
        for n in 0..self.nodes.len() {
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
        // Every channel with cells gets `budget` cells per step: a socket that
        // drains at a fixed rate.
        let mut deliveries = Vec::new();
        let mut chans: Vec<(usize, ChannelId)> = self.writable.iter().copied().collect();
        chans.sort();
        for (n, chan) in chans {
            let mut out = Vec::new();
            self.nodes[n].poll_transmit(chan, self.budget, self.now, &mut out);
            if !self.nodes[n].has_pending(chan) {
                self.writable.remove(&(n, chan));
            }
            if !out.is_empty() {
                deliveries.push((n, chan, out));
            }
        }
        for (n, chan, cells) in deliveries {
            busy = true;
            if let Some(&(peer, pchan)) = self.links.get(&(n, chan)) {
                for cell in cells {
                    self.nodes[peer].handle_cell(pchan, cell, self.now);
                }
            }
        }
        self.now += Duration::from_millis(1);
        busy
    }

    fn on_event(&mut self, n: usize, ev: Event) {
        match ev {
            Event::Connect { identity, .. } => {
                let to = self.node_of(&identity);
                self.connect(n, to);
            }
            Event::ExitConnect { stream, .. } => {
                let addr = SocketAddr::from(([127, 0, 0, 1], 80));
                self.nodes[n].exit_connected(stream, addr, self.now);
            }
            Event::StreamWrite { stream, data } => {
                if n == CLIENT {
                    self.received
                        .entry(stream)
                        .or_default()
                        .extend_from_slice(&data);
                } else {
                    self.exit_received.extend_from_slice(&data);
                    match self.server {
                        Server::Echo => self.echo.push_back((n, stream, data)),
                    }
                }
                self.nodes[n].stream_flushed(stream, 1, self.now);
            }
            other => self.events.push((n, other)),
        }
    }

    fn run(&mut self, max_steps: usize) {
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

    fn build(&mut self) -> CircKey {
        let circ = self.nodes[CLIENT].launch_circuit(self.hops.clone(), self.now);
        self.run(1000);
        assert!(
            self.events
                .iter()
                .any(|(n, e)| *n == CLIENT && *e == Event::CircuitBuilt { circ }),
            "circuit not built: {:?}",
            self.events
        );
        circ
    }

    fn open(&mut self, circ: CircKey) -> StreamHandle {
        let s = self.nodes[CLIENT]
            .open_stream(circ, "127.0.0.1", 80, self.now)
            .unwrap();
        self.run(1000);
        assert!(
            self.events.iter().any(|(n, e)| *n == CLIENT
                && matches!(e, Event::StreamConnected { stream, .. } if *stream == s)),
            "stream not connected: {:?}",
            self.events
        );
        s
    }

    fn credit_events(&mut self) -> usize {
        self.events
            .iter()
            .filter(|(n, e)| *n == CLIENT && matches!(e, Event::StreamReadCredit { .. }))
            .count()
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Send `total` bytes through the echo exit and get them back byte-exact.
fn echo_roundtrip(circwindow: u32, total: usize) {
    echo_roundtrip_on(Net::new(circwindow), circwindow, total);
}

fn echo_roundtrip_on(mut net: Net, circwindow: u32, total: usize) {
    let circ = net.build();
    let s = net.open(circ);
    let data = pattern(total);
    // Feed the client's stream respecting its read credit, like the driver does.
    let mut sent = 0;
    let mut credit = 0usize;
    let mut seen_credit = 0;
    for _ in 0..200_000 {
        for (n, e) in net.events.iter().skip(seen_credit) {
            if *n == CLIENT {
                if let Event::StreamReadCredit { stream, bytes } = e {
                    if *stream == s {
                        credit += bytes;
                    }
                }
            }
        }
        seen_credit = net.events.len();
        if sent < total && credit > 0 {
            let n = credit.min(total - sent).min(4096);
            net.nodes[CLIENT].stream_data(s, &data[sent..sent + n], net.now);
            sent += n;
            credit -= n;
        }
        net.step();
        if net.received.get(&s).map_or(0, |r| r.len()) >= total {
            break;
        }
    }
    assert!(net.credit_events() > 0);
    let got = net.received.get(&s).cloned().unwrap_or_default();
    assert_eq!(
        got.len(),
        total,
        "circwindow {circwindow}: got {} of {total} bytes",
        got.len()
    );
    assert!(got == data, "circwindow {circwindow}: bytes differ");
    assert_eq!(
        net.nodes
            .iter()
            .map(|n| n.stats().circuits_killed)
            .sum::<u64>(),
        0
    );
}

#[test]
fn three_hop_echo_default_window() {
    echo_roundtrip(1000, 600_000);
}

#[test]
fn three_hop_echo_window_101() {
    // 101 is where Tor's authenticated SENDMEs break; here it must just work.
    echo_roundtrip(101, 300_000);
}

#[test]
fn three_hop_echo_window_100() {
    echo_roundtrip(100, 200_000);
}

#[test]
fn stream_end_is_delivered_after_data() {
    let mut net = Net::new(1000);
    let circ = net.build();
    let s = net.open(circ);
    net.nodes[CLIENT].stream_data(s, b"hello", net.now);
    net.nodes[CLIENT].stream_eof(s, net.now);
    net.run(1000);
    // The exit wrote "hello" to its server, then saw the END (tor-spec: END
    // closes the stream in both directions, so the echo is not sent back).
    assert_eq!(net.exit_received, b"hello");
    assert!(net.events.iter().any(|(n, e)| *n != CLIENT
        && matches!(
            e,
            Event::StreamClosed {
                reason: EndReason::DONE,
                ..
            }
        )));
    assert_eq!(net.nodes[CLIENT].stats().streams, 0);
    assert_eq!(net.nodes[3].stats().streams, 0);
}

#[test]
fn closing_one_circuit_leaves_the_other_working() {
    let mut net = Net::new(1000);
    let good = net.build();
    let bad = net.build();
    let s = net.open(good);
    let (&(_, client_chan), _) = net.links.iter().find(|((n, _), _)| *n == CLIENT).unwrap();
    // A relay cell for an id the client never allocated is dropped quietly.
    let junk = Cell::new(0x1234_5678, CellCommand::RELAY, &[0xAB; 509]).unwrap();
    net.nodes[CLIENT].handle_cell(client_chan, junk, net.now);
    net.nodes[CLIENT].close_circuit(bad, net.now);
    net.run(1000);
    assert!(!net.nodes[CLIENT].circuit_is_open(bad));
    net.nodes[CLIENT].stream_data(s, b"still alive", net.now);
    net.run(1000);
    assert_eq!(
        net.received.get(&s).map(|v| v.as_slice()),
        Some(&b"still alive"[..])
    );
    // DESTROY travelled the whole path: every relay forgot the closed circuit.
    for n in 1..4 {
        assert_eq!(
            net.nodes[n].stats().circuits,
            1,
            "relay {n} still holds the closed circuit"
        );
    }
}

#[test]
fn tampered_relay_cell_kills_only_its_circuit() {
    let mut net = Net::new(1000);
    let a = net.build();
    let b = net.build();
    let sa = net.open(a);
    let sb = net.open(b);
    // Intercept one step: take the client's next cells on its guard channel and
    // flip a byte in the cell that belongs to circuit b.
    net.nodes[CLIENT].stream_data(sa, b"for a", net.now);
    net.nodes[CLIENT].stream_data(sb, b"for b", net.now);
    let (&(_, client_chan), &(guard, guard_chan)) =
        net.links.iter().find(|((n, _), _)| *n == CLIENT).unwrap();
    let mut out = Vec::new();
    while let Some(_c) = net.nodes[CLIENT].poll_ready_channel() {}
    net.nodes[CLIENT].poll_transmit(client_chan, 100, net.now, &mut out);
    assert_eq!(out.len(), 2);
    // The second cell queued belongs to b (streams were fed in order a, b and
    // round-robin keeps their order for one cell each).
    out[1].payload[100] ^= 0x01;
    for cell in out {
        net.nodes[guard].handle_cell(guard_chan, cell, net.now);
    }
    net.run(1000);
    assert_eq!(
        net.received.get(&sa).map(|v| v.as_slice()),
        Some(&b"for a"[..])
    );
    assert!(!net.received.contains_key(&sb));
    assert!(net.nodes[CLIENT].circuit_is_open(a));
    assert!(
        !net.nodes[CLIENT].circuit_is_open(b),
        "tampered circuit must be closed"
    );
    assert!(
        net.events
            .iter()
            .any(|(n, e)| *n == CLIENT
                && matches!(e, Event::CircuitClosed { circ, .. } if *circ == b))
    );
}

/// `cc_alg=2` on every node: the same bytes come back, every authenticated SENDME verifies
/// (no circuit killed) while Vegas resizes the window.
#[test]
fn three_hop_echo_vegas() {
    let net = Net::with_cc(1000, CcKind::Vegas(VegasParams::default()));
    echo_roundtrip_on(net, 1000, 3 * 1024 * 1024);
}

/// The cause the client sees when circuit `circ` closed.
fn close_cause(net: &Net, circ: CircKey) -> (chive_core::CloseCause, usize) {
    net.events
        .iter()
        .find_map(|(n, e)| match e {
            Event::CircuitClosed {
                circ: c,
                cause,
                hops,
                ..
            } if *n == CLIENT && *c == circ => Some((*cause, *hops)),
            _ => None,
        })
        .expect("the client reported no CircuitClosed")
}

/// An exit dies: the middle's link to it closes, the middle sends DESTROY (CHANNEL_CLOSED)
/// back, the guard passes it on, and the client learns that reason (not which hop), with the
/// stream closed. The client's own link to the guard closing is a lost link instead.
#[test]
fn a_dead_hop_reaches_the_client_as_destroy_and_a_dead_guard_as_a_lost_link() {
    use chive_cell::DestroyReason;
    use chive_core::CloseCause;
    let mut net = Net::new(1000);
    let circ = net.build();
    let s = net.open(circ);
    // Node 2 is the middle, node 3 the exit: the middle's channel to the exit goes.
    let (&(_, chan), _) = net
        .links
        .iter()
        .find(|((n, _), (peer, _))| *n == 2 && *peer == 3)
        .unwrap();
    net.nodes[2].channel_closed(chan, net.now);
    net.run(1000);
    assert!(!net.nodes[CLIENT].circuit_is_open(circ));
    assert_eq!(
        close_cause(&net, circ),
        (CloseCause::Destroyed(DestroyReason::CHANNEL_CLOSED), 3)
    );
    assert!(net.events.iter().any(|(n, e)| *n == CLIENT
        && matches!(e, Event::StreamClosed { stream, reason } if *stream == s && *reason == EndReason::DESTROY)));
    // A second circuit; now the client's link to the guard closes.
    let mut net = Net::new(1000);
    let circ = net.build();
    let (&(_, client_chan), _) = net.links.iter().find(|((n, _), _)| *n == CLIENT).unwrap();
    net.nodes[CLIENT].channel_closed(client_chan, net.now);
    net.run(10);
    assert_eq!(close_cause(&net, circ), (CloseCause::LinkLost, 3));
}
