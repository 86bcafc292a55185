//! A whole overlay in memory (`sim.rs`): one client core and three relay cores, cells moved
//! between them by the test, simulated time. Exercises circuit building (ntor, EXTEND2), tor1
//! crypto, streams, SENDME windows and the handling of bad input, deterministically.

use chive_cell::{Cell, CellCommand, EndReason};
use chive_core::cc::{CcKind, VegasParams};
use chive_core::{CircKey, CoreConfig, Event, StreamHandle};

use crate::sim::{pattern, Sim};

const CLIENT: usize = 0;

/// A client and three exits (all relays exit), links of 32 cells a step, no delay.
type Net = Sim;

trait Echo {
    fn new(circwindow: u32) -> Self;
    fn with_cc(circwindow: u32, cc: CcKind) -> Self;
    /// A circuit through the three relays.
    fn build(&mut self) -> CircKey;
    fn open(&mut self, circ: CircKey) -> StreamHandle;
    /// What the client's stream `s` received, if anything.
    fn received(&self, s: StreamHandle) -> Option<&[u8]>;
}

impl Echo for Net {
    fn new(circwindow: u32) -> Self {
        Net::with_cc(circwindow, CcKind::Fixed)
    }

    fn with_cc(circwindow: u32, cc: CcKind) -> Self {
        let cfg = move |exit| CoreConfig {
            circwindow,
            congestion_control: cc,
            exit,
            ..CoreConfig::default()
        };
        Sim::overlay(7, vec![cfg(false)], 3, |_| cfg(true))
    }

    fn build(&mut self) -> CircKey {
        self.build_through(CLIENT, &[0, 1, 2], 1000)
    }

    fn open(&mut self, circ: CircKey) -> StreamHandle {
        let s = self.open_on(CLIENT, circ, 1000);
        assert!(
            self.connected(CLIENT, s),
            "stream not connected: {:?}",
            self.events
        );
        s
    }

    fn received(&self, s: StreamHandle) -> Option<&[u8]> {
        self.received.get(&(CLIENT, s)).map(Vec::as_slice)
    }
}

/// Send `total` bytes through the echo exit and get them back byte-exact.
fn echo_roundtrip(circwindow: u32, total: usize) {
    echo_roundtrip_on(Net::new(circwindow), circwindow, total);
}

fn echo_roundtrip_on(mut net: Net, circwindow: u32, total: usize) {
    let circ = net.build();
    let s = net.open(circ);
    let streams = [(s, pattern(total, 0))];
    // Feed the client's stream respecting its read credit, like the driver does.
    net.echo_transfer(CLIENT, &streams, 200_000, |_, _| {});
    assert!(net.credit_total.get(&(CLIENT, s)).is_some_and(|&c| c > 0));
    let got = net.got(CLIENT, s);
    assert_eq!(
        got.len(),
        total,
        "circwindow {circwindow}: got {} of {total} bytes",
        got.len()
    );
    assert!(got == streams[0].1, "circwindow {circwindow}: bytes differ");
    assert_eq!(net.killed(), 0);
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
    let client_chan = net.chan(CLIENT, 1);
    // A relay cell for an id the client never allocated is dropped quietly.
    let junk = Cell::new(0x1234_5678, CellCommand::RELAY, &[0xAB; 509]).unwrap();
    net.nodes[CLIENT].handle_cell(client_chan, junk, net.now);
    net.nodes[CLIENT].close_circuit(bad, net.now);
    net.run(1000);
    assert!(!net.nodes[CLIENT].circuit_is_open(bad));
    net.nodes[CLIENT].stream_data(s, b"still alive", net.now);
    net.run(1000);
    assert_eq!(net.received(s), Some(&b"still alive"[..]));
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
    let client_chan = net.chan(CLIENT, 1);
    let (guard, guard_chan) = (1, net.links[&(CLIENT, client_chan)].pchan);
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
    assert_eq!(net.received(sa), Some(&b"for a"[..]));
    assert!(net.received(sb).is_none());
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
    let chan = net.chan(2, 3);
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
    let client_chan = net.chan(CLIENT, 1);
    net.nodes[CLIENT].channel_closed(client_chan, net.now);
    net.run(10);
    assert_eq!(close_cause(&net, circ), (CloseCause::LinkLost, 3));
}
