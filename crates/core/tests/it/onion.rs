//! Onion services through real cores: a client, a service and four relays in memory, cells
//! moved by the test on a virtual clock. The service registers an introduction point, the
//! client waits at a rendezvous point and introduces itself, the service joins it there, and a
//! stream flows through the end-to-end virtual hop byte for byte. Then the bad cases: an
//! INTRODUCE that does not decrypt, a replayed one, an ESTABLISH_INTRO made for another
//! circuit.

use std::net::SocketAddr;

use chive_cell::RelayCommand;
use chive_core::onion::{ClientRendezvous, IntroduceError, OnionServiceIntro};
use chive_core::{CircKey, Core, CoreConfig, CoreError, Event, StreamHandle, MAX_PATH_LEN};
use chive_crypto::{IdentityKeypair, OnionAddress};

use crate::sim::{pattern, Sim};

const CLIENT: usize = 0;
const SERVICE: usize = 1;
/// Relays: node index = 2 + relay index.
const GUARD_C: usize = 0;
const INTRO: usize = 1;
const REND: usize = 2;
const GUARD_S: usize = 3;

/// A client, a service and four relays (no exits), links of 32 cells a step, no delay.
type Net = Sim;

trait Onion {
    fn new() -> Self;
    fn relay(&mut self, i: usize) -> &mut Core;
    /// Node `node` builds a circuit through `relays`.
    fn build(&mut self, node: usize, relays: &[usize]) -> CircKey;
    /// The onion messages node `n` got on `circ` (taken out of the event list).
    fn take_onion(&mut self, n: usize, circ: CircKey) -> Vec<(RelayCommand, Vec<u8>)>;
    /// Node `n` sends an onion message on `circ`, and the network runs.
    fn send(&mut self, n: usize, circ: CircKey, cmd: RelayCommand, body: &[u8]);
    /// Feed `data` into stream `s` of node `n` within its read credit, running the network.
    fn feed_until(&mut self, n: usize, s: StreamHandle, data: &[u8], until: impl Fn(&Net) -> bool);
}

impl Onion for Net {
    fn new() -> Self {
        let endpoints = vec![CoreConfig::default(), CoreConfig::default()];
        Sim::overlay(19, endpoints, 4, |_| CoreConfig::default())
    }

    fn relay(&mut self, i: usize) -> &mut Core {
        &mut self.nodes[2 + i]
    }

    fn build(&mut self, node: usize, relays: &[usize]) -> CircKey {
        self.build_through(node, relays, 5000)
    }

    fn take_onion(&mut self, n: usize, circ: CircKey) -> Vec<(RelayCommand, Vec<u8>)> {
        let mut got = Vec::new();
        self.events.retain(|(node, e)| match e {
            Event::OnionMessage {
                circ: c,
                command,
                body,
            } if *node == n && *c == circ => {
                got.push((*command, body.clone()));
                false
            }
            _ => true,
        });
        got
    }

    fn send(&mut self, n: usize, circ: CircKey, cmd: RelayCommand, body: &[u8]) {
        let now = self.now;
        self.nodes[n]
            .send_onion_message(circ, cmd, body, now)
            .unwrap();
        self.run(5000);
    }

    fn feed_until(&mut self, n: usize, s: StreamHandle, data: &[u8], until: impl Fn(&Net) -> bool) {
        let streams = [(s, data.to_vec())];
        let done = self.feed(n, &streams, 200_000, |_, _| {}, until);
        assert!(done, "transfer did not finish");
    }
}

/// Node `node`'s circuit through `relays`: built at once, or (`cannibalise`, as a predicted
/// internal circuit) built without its last relay and then extended to it with
/// `Core::extend_circuit`.
fn circuit_to(net: &mut Net, node: usize, relays: &[usize], cannibalise: bool) -> CircKey {
    if !cannibalise {
        return net.build(node, relays);
    }
    let (last, prefix) = relays.split_last().unwrap();
    let circ = net.build(node, prefix);
    net.events
        .retain(|(n, e)| !(*n == node && *e == Event::CircuitBuilt { circ }));
    let hop = net.hops[*last].clone();
    let now = net.now;
    net.nodes[node].extend_circuit(circ, hop, now).unwrap();
    assert!(
        !net.nodes[node].circuit_is_open(circ),
        "open while extending"
    );
    net.run(5000);
    assert!(
        net.events
            .iter()
            .any(|(n, e)| *n == node && *e == Event::CircuitBuilt { circ }),
        "extension not built: {:?}",
        net.events
    );
    circ
}

/// A service with one introduction point registered at relay INTRO: (intro keys, circuit).
fn service_online(net: &mut Net) -> (OnionServiceIntro, CircKey) {
    let id = IdentityKeypair::generate(&mut net.rng);
    let addr = OnionAddress::from_key(id.public());
    let intro = OnionServiceIntro::generate(&mut net.rng, addr.subcredential(), 64);
    let circ = net.build(SERVICE, &[GUARD_S, INTRO]);
    let kh = net.nodes[SERVICE].last_hop_kh(circ).unwrap();
    net.send(
        SERVICE,
        circ,
        RelayCommand::ESTABLISH_INTRO,
        &intro.establish_intro(&kh),
    );
    let got = net.take_onion(SERVICE, circ);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, RelayCommand::INTRO_ESTABLISHED);
    assert_eq!(net.relay(INTRO).onion_relay_stats().intro_circuits, 1);
    (intro, circ)
}

/// The client's rendezvous circuit waiting at REND, and its introduction circuit to INTRO
/// with INTRODUCE1 sent and acknowledged. Returns (connection, rend circ, INTRODUCE1 body).
fn client_introduces(
    net: &mut Net,
    intro: &OnionServiceIntro,
    tamper: bool,
    cannibalise: bool,
) -> (ClientRendezvous, CircKey, Vec<u8>) {
    let mut conn = ClientRendezvous::new(&mut net.rng, intro.public());
    let rend = circuit_to(net, CLIENT, &[GUARD_C, REND], cannibalise);
    net.send(
        CLIENT,
        rend,
        RelayCommand::ESTABLISH_RENDEZVOUS,
        &conn.establish_rendezvous(),
    );
    let got = net.take_onion(CLIENT, rend);
    assert_eq!(got[0].0, RelayCommand::RENDEZVOUS_ESTABLISHED);

    let ic = circuit_to(net, CLIENT, &[GUARD_C, INTRO], cannibalise);
    let rp = net.hops[REND].clone();
    let mut intro1 = conn.introduce1(&mut net.rng, &rp).unwrap();
    if tamper {
        let i = intro1.len() - 50;
        intro1[i] ^= 0x80;
    }
    net.send(CLIENT, ic, RelayCommand::INTRODUCE1, &intro1);
    let got = net.take_onion(CLIENT, ic);
    assert_eq!(got[0].0, RelayCommand::INTRODUCE_ACK);
    conn.on_introduce_ack(&got[0].1).unwrap();
    (conn, rend, intro1)
}

#[test]
fn a_stream_through_an_onion_service_is_byte_exact() {
    byte_exact(false);
}

#[test]
fn a_stream_through_cannibalised_circuits_is_byte_exact() {
    // Every circuit to a point is a shorter circuit extended by one hop, as the client's and
    // the service's predicted internal circuits are.
    byte_exact(true);
}

fn byte_exact(cannibalise: bool) {
    let mut net = Net::new();
    let (mut intro, intro_circ) = service_online(&mut net);
    let (mut conn, rend, _) = client_introduces(&mut net, &intro, false, cannibalise);

    // The service gets INTRODUCE2, accepts it, builds to the rendezvous point.
    let got = net.take_onion(SERVICE, intro_circ);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, RelayCommand::INTRODUCE2);
    let acc = intro.on_introduce2(&mut net.rng, &got[0].1).unwrap();
    assert_eq!(acc.rendezvous_point.identity, net.hops[REND].identity);
    let svc_rend = circuit_to(&mut net, SERVICE, &[GUARD_S, INTRO, REND], cannibalise);
    let (cmd, body) = &acc.rendezvous1;
    net.nodes[SERVICE]
        .send_onion_message(svc_rend, *cmd, body, net.now)
        .unwrap();
    net.nodes[SERVICE]
        .attach_virtual_hop(svc_rend, &acc.keys, true)
        .unwrap();
    net.run(5000);
    assert_eq!(net.relay(REND).onion_relay_stats().rend_joined, 1);

    // The client gets RENDEZVOUS2 and attaches its end of the virtual hop.
    let got = net.take_onion(CLIENT, rend);
    assert_eq!(got[0].0, RelayCommand::RENDEZVOUS2);
    let keys = conn.on_rendezvous2(&got[0].1).unwrap();
    net.nodes[CLIENT]
        .attach_virtual_hop(rend, &keys, false)
        .unwrap();
    // A joined circuit (virtual hop) is never extended.
    let hop = net.hops[GUARD_S].clone();
    assert_eq!(
        net.nodes[CLIENT].extend_circuit(rend, hop, net.now),
        Err(CoreError::CircuitNotOpen)
    );

    // A stream to virtual port 80.
    let cs = net.nodes[CLIENT]
        .open_stream(rend, "service.onion", 80, net.now)
        .unwrap();
    net.run(5000);
    let req = net
        .events
        .iter()
        .find_map(|(n, e)| match e {
            Event::OnionStreamRequest { circ, stream, port } if *n == SERVICE => {
                Some((*circ, *stream, *port))
            }
            _ => None,
        })
        .expect("the service was asked for a stream");
    assert_eq!((req.0, req.2), (svc_rend, 80));
    let ss = req.1;
    net.nodes[SERVICE].exit_connected(ss, SocketAddr::from(([127, 0, 0, 1], 8080)), net.now);
    net.run(5000);
    assert!(net.events.iter().any(|(n, e)| *n == CLIENT
        && matches!(e, Event::StreamConnected { stream, addr: None } if *stream == cs)));

    // Request up, 300 KB down (many circuit and stream SENDMEs through the virtual hop).
    let request = pattern(3000, 0);
    net.feed_until(CLIENT, cs, &request, |net| {
        net.got(SERVICE, ss).len() >= 3000
    });
    assert!(net.received[&(SERVICE, ss)] == request);
    let page = pattern(300_000, 0);
    net.feed_until(SERVICE, ss, &page, |net| {
        net.got(CLIENT, cs).len() >= 300_000
    });
    assert!(net.received[&(CLIENT, cs)] == page, "bytes differ");
    assert_eq!(
        net.nodes
            .iter()
            .map(|n| n.stats().circuits_killed)
            .sum::<u64>(),
        0
    );
    assert_eq!(intro.stats.accepted, 1);

    // Closing the client's circuit tears down the service's partner circuit at the RP.
    net.nodes[CLIENT].close_circuit(rend, net.now);
    net.run(5000);
    assert!(
        net.closed(SERVICE, svc_rend),
        "service circuit outlived its partner"
    );
}

#[test]
fn an_introduce_that_does_not_decrypt_is_dropped_and_counted() {
    let mut net = Net::new();
    let (mut intro, intro_circ) = service_online(&mut net);
    let (_conn, _rend, _) = client_introduces(&mut net, &intro, true, false);
    let got = net.take_onion(SERVICE, intro_circ);
    assert_eq!(got[0].0, RelayCommand::INTRODUCE2);
    assert_eq!(
        intro.on_introduce2(&mut net.rng, &got[0].1).err(),
        Some(IntroduceError::Undecryptable)
    );
    assert_eq!(intro.stats.undecryptable, 1);
    assert_eq!(intro.stats.accepted, 0);
    // The intro circuit stays up for the next client.
    assert!(net.nodes[SERVICE].circuit_is_open(intro_circ));
}

#[test]
fn a_replayed_introduce_is_detected() {
    let mut net = Net::new();
    let (mut intro, intro_circ) = service_online(&mut net);
    let (_conn, _rend, intro1) = client_introduces(&mut net, &intro, false, false);
    // Someone who saw the INTRODUCE1 sends it again on a circuit of its own.
    let ic = net.build(CLIENT, &[GUARD_C, INTRO]);
    net.send(CLIENT, ic, RelayCommand::INTRODUCE1, &intro1);
    let got = net.take_onion(SERVICE, intro_circ);
    assert_eq!(got.len(), 2);
    assert!(intro.on_introduce2(&mut net.rng, &got[0].1).is_ok());
    assert_eq!(
        intro.on_introduce2(&mut net.rng, &got[1].1).err(),
        Some(IntroduceError::Replayed)
    );
    assert_eq!(intro.stats.replayed, 1);
}

#[test]
fn establish_intro_made_for_another_circuit_is_refused() {
    let mut net = Net::new();
    let id = IdentityKeypair::generate(&mut net.rng);
    let addr = OnionAddress::from_key(id.public());
    let intro = OnionServiceIntro::generate(&mut net.rng, addr.subcredential(), 64);
    let a = net.build(SERVICE, &[GUARD_S, INTRO]);
    let b = net.build(SERVICE, &[GUARD_S, INTRO]);
    let kh_a = net.nodes[SERVICE].last_hop_kh(a).unwrap();
    assert_ne!(Some(kh_a), net.nodes[SERVICE].last_hop_kh(b));
    // Made (and signed) for circuit a, sent on b: the intro point closes b.
    net.send(
        SERVICE,
        b,
        RelayCommand::ESTABLISH_INTRO,
        &intro.establish_intro(&kh_a),
    );
    assert!(net.closed(SERVICE, b));
    assert!(net.take_onion(SERVICE, b).is_empty());
    assert_eq!(net.relay(INTRO).onion_relay_stats().intro_circuits, 0);
    // An INTRODUCE1 for it finds no service.
    let mut conn = ClientRendezvous::new(&mut net.rng, intro.public());
    let ic = net.build(CLIENT, &[GUARD_C, INTRO]);
    let rp = net.hops[REND].clone();
    let intro1 = conn.introduce1(&mut net.rng, &rp).unwrap();
    net.send(CLIENT, ic, RelayCommand::INTRODUCE1, &intro1);
    let got = net.take_onion(CLIENT, ic);
    assert!(conn.on_introduce_ack(&got[0].1).is_err());
    assert_eq!(net.relay(INTRO).onion_relay_stats().intro_refused, 1);
}

#[test]
fn only_built_clean_circuits_are_extended() {
    let mut net = Net::new();
    let now = net.now;
    let hop = |net: &Net, r: usize| net.hops[r].clone();
    // Unknown, and not built yet.
    let h = hop(&net, REND);
    let first = hop(&net, GUARD_C);
    let building = net.nodes[CLIENT].launch_circuit(vec![first], now);
    assert_eq!(
        net.nodes[CLIENT].extend_circuit(building, h.clone(), now),
        Err(CoreError::CircuitNotOpen)
    );
    net.nodes[CLIENT].close_circuit(building, now);
    assert_eq!(
        net.nodes[CLIENT].extend_circuit(building, h.clone(), now),
        Err(CoreError::NoSuchCircuit)
    );
    // With a stream: refused, and the circuit stays as it was.
    let used = net.build(CLIENT, &[GUARD_C]);
    net.nodes[CLIENT]
        .open_stream(used, "127.0.0.1", 80, now)
        .unwrap();
    assert_eq!(
        net.nodes[CLIENT].extend_circuit(used, h.clone(), now),
        Err(CoreError::CircuitNotOpen)
    );
    assert!(net.nodes[CLIENT].circuit_is_open(used));
    // Clean: extended hop by hop up to MAX_PATH_LEN (the relays allow 8 RELAY_EARLY cells).
    let c = net.build(CLIENT, &[GUARD_C]);
    for i in 1..MAX_PATH_LEN {
        let next = hop(&net, [INTRO, REND, GUARD_S, GUARD_C][i % 4]);
        net.events.clear();
        net.nodes[CLIENT].extend_circuit(c, next, net.now).unwrap();
        net.run(5000);
        assert!(
            net.nodes[CLIENT].circuit_is_open(c),
            "hop {} not added",
            i + 1
        );
    }
    assert_eq!(
        net.nodes[CLIENT].extend_circuit(c, h, net.now),
        Err(CoreError::CircuitNotOpen)
    );
    assert_eq!(
        net.nodes
            .iter()
            .map(|n| n.stats().circuits_killed)
            .sum::<u64>(),
        0
    );
}
