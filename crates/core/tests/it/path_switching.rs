//! Circuit switching, path variant (paper 003 section 4.3.2, issue 16), through real cores: a
//! client, two entries E1 / E2, two middles M1 / M2 and one exit X in memory, links with a
//! per-step write budget and a delay, simulated time (1 ms per step). The client's home
//! circuit A = E1, M1, X is linked to a spare B = E2, M2, X; E1's connection to M1 is slow.
//! E1's congestion report makes the client move its upload to B; cells on B overtake older
//! cells still crawling through A, and the exit must put them back in order. Then the
//! failures: no confirmation (fallback with resend), a dead spare, the home circuit gone.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chive_cell::Cell;
use chive_core::{
    ChannelId, CircKey, Core, CoreConfig, Event, HopSpec, RelayKeys, SchedulerKind, StreamHandle,
    SwitchMode, SwitchOutcome, SwitchSettings,
};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::{IdentityKey, IdentityKeypair};
use rand::rngs::StdRng;
use rand::SeedableRng;

const CLIENT: usize = 0;
const E1: usize = 1;
const M1: usize = 2;
const E2: usize = 3;
const M2: usize = 4;
const X: usize = 5;

struct Link {
    peer: usize,
    pchan: ChannelId,
    budget: usize,
    delay: u64,
    pipe: VecDeque<(u64, Cell)>,
    /// Drop everything written.
    blackhole: bool,
}

struct Net {
    nodes: Vec<Core>,
    identities: Vec<Option<IdentityKey>>,
    hops: Vec<HopSpec>,
    links: HashMap<(usize, ChannelId), Link>,
    next_chan: u64,
    step_no: u64,
    now: Instant,
    received: HashMap<StreamHandle, Vec<u8>>,
    credit: HashMap<StreamHandle, usize>,
    events: Vec<(usize, Event)>,
    echo: VecDeque<(usize, StreamHandle, Vec<u8>)>,
    writable: BTreeSet<(usize, ChannelId)>,
    /// Upload only: the exit keeps what arrives (under this client stream) instead of echoing.
    upload_only: Option<StreamHandle>,
}

impl Net {
    fn new() -> Net {
        if std::env::var("SW_DEBUG").is_ok() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("info")
                .with_test_writer()
                .try_init();
        }
        let mut rng = StdRng::seed_from_u64(29);
        let mut nodes = vec![Core::new(CoreConfig::default(), [1; 32])];
        let mut identities = vec![None];
        let mut hops = Vec::new();
        for i in 0..5u8 {
            let id = IdentityKeypair::generate(&mut rng).public();
            let ntor = NtorSecretKey::generate(&mut rng);
            hops.push(HopSpec {
                identity: id,
                ntor_key: ntor.public(),
                addr: SocketAddr::from(([127, 0, 0, 1], 9100 + u16::from(i))),
            });
            let mut core = Core::new(
                CoreConfig {
                    relay: Some(RelayKeys { identity: id, ntor }),
                    exit: true,
                    scheduler: SchedulerKind::Ewma { halflife: 30.0 },
                    ..CoreConfig::default()
                },
                [i + 2; 32],
            );
            core.set_switching(SwitchSettings {
                mode: SwitchMode::Path,
                timeout: Duration::from_millis(2000),
                ..SwitchSettings::default()
            });
            nodes.push(core);
            identities.push(Some(id));
        }
        Net {
            nodes,
            identities,
            hops,
            links: HashMap::new(),
            next_chan: 1,
            step_no: 0,
            now: Instant::now(),
            received: HashMap::new(),
            credit: HashMap::new(),
            events: Vec::new(),
            echo: VecDeque::new(),
            writable: BTreeSet::new(),
            upload_only: None,
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
        // E1 -> M1 is the slow, congested connection.
        let (budget, delay) = if (from, to) == (E1, M1) {
            (2, 30)
        } else {
            (32, 2)
        };
        for (n, c, p, pc) in [(from, a, to, b), (to, b, from, a)] {
            self.links.insert(
                (n, c),
                Link {
                    peer: p,
                    pchan: pc,
                    budget,
                    delay,
                    pipe: VecDeque::new(),
                    blackhole: false,
                },
            );
        }
        let (from_id, to_id) = (self.identities[from], self.identities[to]);
        self.nodes[from].channel_opened(a, to_id, true, self.now);
        self.nodes[to].channel_opened(b, from_id, false, self.now);
    }

    fn chan(&self, from: usize, to: usize) -> ChannelId {
        self.links
            .iter()
            .find(|((n, _), l)| *n == from && l.peer == to)
            .map(|((_, c), _)| *c)
            .unwrap()
    }

    /// Drop everything `from` writes to `to` from now on.
    fn blackhole(&mut self, from: usize, to: usize) {
        for ((n, _), l) in self.links.iter_mut() {
            if *n == from && l.peer == to {
                l.blackhole = true;
                l.pipe.clear();
            }
        }
    }

    fn step(&mut self) -> bool {
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
                    link.pipe.push_back((self.step_no + link.delay, cell));
                }
            }
        }
        let keys: Vec<(usize, ChannelId)> = self.links.keys().copied().collect();
        for k in keys {
            let link = self.links.get_mut(&k).unwrap();
            let (peer, pchan) = (link.peer, link.pchan);
            let mut arrived = Vec::new();
            while link.pipe.front().is_some_and(|(t, _)| *t <= self.step_no) {
                arrived.push(link.pipe.pop_front().unwrap().1);
            }
            if !link.pipe.is_empty() {
                busy = true;
            }
            for cell in arrived {
                busy = true;
                self.nodes[peer].handle_cell(pchan, cell, self.now);
            }
        }
        self.step_no += 1;
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
                } else if let Some(up) = self.upload_only {
                    self.received
                        .entry(up)
                        .or_default()
                        .extend_from_slice(&data);
                } else {
                    self.echo.push_back((n, stream, data));
                }
                self.nodes[n].stream_flushed(stream, 1, self.now);
            }
            Event::StreamReadCredit { stream, bytes } if n == CLIENT => {
                *self.credit.entry(stream).or_default() += bytes;
            }
            Event::CloseChannel { chan, .. } => {
                self.nodes[n].channel_closed(chan, self.now);
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

    fn idle(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
        }
    }

    fn build(&mut self, path: [usize; 3]) -> CircKey {
        let hops = path.iter().map(|n| self.hops[n - 1].clone()).collect();
        let circ = self.nodes[CLIENT].launch_circuit(hops, self.now);
        self.run(5000);
        assert!(
            self.events
                .iter()
                .any(|(n, e)| *n == CLIENT && *e == Event::CircuitBuilt { circ }),
            "circuit not built"
        );
        circ
    }

    /// Home A = E1, M1, X linked to spare B = E2, M2, X; one stream opened on A.
    fn linked(&mut self) -> (CircKey, CircKey, StreamHandle) {
        let a = self.build([E1, M1, X]);
        self.nodes[CLIENT].path_link(a, self.now).unwrap();
        let b = self.build([E2, M2, X]);
        self.nodes[CLIENT].path_add_spare(a, b, self.now).unwrap();
        self.run(5000);
        assert_eq!(self.nodes[CLIENT].path_set_of(a), Some(Some(b)));
        assert_eq!(self.nodes[CLIENT].path_current_leg(a), Some(a));
        let s = self.nodes[CLIENT]
            .open_stream(a, "127.0.0.1", 80, self.now)
            .unwrap();
        self.run(5000);
        (a, b, s)
    }

    /// Feed each stream its bytes as read credit allows, stepping, until every echo came back
    /// or `steps` ran out; `at(step, net)` runs before each step.
    fn transfer(
        &mut self,
        streams: &[(StreamHandle, Vec<u8>)],
        steps: usize,
        mut at: impl FnMut(usize, &mut Net),
    ) {
        let mut sent = vec![0usize; streams.len()];
        for i in 0..steps {
            at(i, self);
            for (j, (s, data)) in streams.iter().enumerate() {
                let credit = self.credit.entry(*s).or_default();
                if sent[j] < data.len() && *credit > 0 {
                    let n = (*credit).min(data.len() - sent[j]).min(4096);
                    *credit -= n;
                    self.nodes[CLIENT].stream_data(*s, &data[sent[j]..sent[j] + n], self.now);
                    sent[j] += n;
                }
            }
            self.step();
            let done = streams
                .iter()
                .all(|(s, d)| self.received.get(s).map_or(0, |r| r.len()) >= d.len());
            if done {
                return;
            }
        }
    }

    fn killed(&self) -> u64 {
        self.nodes.iter().map(|n| n.stats().circuits_killed).sum()
    }

    fn assert_exact(&self, streams: &[(StreamHandle, Vec<u8>)]) {
        if std::env::var("SW_DEBUG").is_ok() {
            for (n, node) in self.nodes.iter().enumerate() {
                eprintln!("node {n}: {:?} {:?}", node.stats(), node.switch_stats());
            }
        }
        for (s, data) in streams {
            let got = self.received.get(s).cloned().unwrap_or_default();
            assert_eq!(got.len(), data.len(), "stream {s:?}: length");
            assert!(
                got == *data,
                "stream {s:?}: bytes differ or are out of order"
            );
        }
    }

    /// E1 reports its connection to M1 congested (as its detector would).
    fn congest_e1(&mut self) -> Option<CircKey> {
        let c = self.chan(E1, M1);
        self.nodes[E1].congested(c, 0.0, self.now)
    }
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ salt).collect()
}

#[test]
fn upload_moves_to_the_spare_and_the_exit_restores_order() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(1_000_000, 0))];
    let mut chosen = None;
    net.transfer(&streams, 300_000, |i, net| {
        if i == 400 {
            chosen = net.congest_e1();
        }
    });
    assert!(chosen.is_some(), "E1 told no client");
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    let c = net.nodes[CLIENT].switch_stats();
    let e1 = net.nodes[E1].switch_stats();
    let x = net.nodes[X].switch_stats();
    assert_eq!(e1.congested_sent, 1, "{e1:?}");
    assert_eq!(
        (c.congested_received, c.triggered, c.switches, c.timed_out),
        (1, 1, 1, 0),
        "{c:?}"
    );
    assert_eq!(
        c.cells_resent + c.cells_lost + c.violations + x.violations,
        0
    );
    // B is fast, A slow: cells on B overtook older ones on A, and the exit held them.
    assert!(x.path_out_of_order > 0, "no reordering exercised: {x:?}");
    assert_eq!(x.path_duplicates, 0);
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(
        (rec.outcome, rec.mode),
        (SwitchOutcome::Switched, SwitchMode::Path)
    );
    assert_eq!(rec.circ, a);
    assert!(rec.ended >= rec.triggered);
    let last_old = rec.last_old.expect("cells went on A before the switch");
    assert!(
        last_old <= rec.triggered && last_old <= rec.ended,
        "{rec:?}"
    );
    assert!(
        rec.ended - rec.triggered < Duration::from_millis(50),
        "{rec:?}"
    );
}

#[test]
fn congestion_on_the_spare_moves_the_upload_back() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    // E1 reported 0.5 s before E2: with a 0.3 s memory the client goes back to A.
    let settings = net.nodes[CLIENT].switching();
    net.nodes[CLIENT].set_switching(SwitchSettings {
        leg_avoid: Duration::from_millis(300),
        ..settings
    });
    let streams = vec![(s, pattern(2_000_000, 3))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 800 {
            let c = net.chan(E2, M2);
            net.nodes[E2].congested(c, 0.0, net.now);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
    assert_ne!(a, b);
    assert_eq!(net.nodes[CLIENT].switch_stats().switches, 2);
}

/// Both entries report congestion 1.2 s apart: going back to A, whose entry is still full,
/// would only queue the switch behind its backlog (the first lab run's timeouts). Within
/// `leg_avoid` (10 s) the client stays on B; afterwards it may go back.
#[test]
fn both_legs_congested_the_client_stays() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(2_000_000, 3))];
    let mut leg_after_e2 = None;
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 1500 {
            let c = net.chan(E2, M2);
            assert!(net.nodes[E2].congested(c, 0.0, net.now).is_some());
        }
        if i == 1600 {
            leg_after_e2 = net.nodes[CLIENT].path_current_leg(a);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.killed(), 0);
    assert_eq!(leg_after_e2, Some(b), "the client stayed on B");
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!(
        (
            c.congested_received,
            c.congested_ignored,
            c.switches,
            c.timed_out
        ),
        (2, 1, 1, 0),
        "{c:?}"
    );
}

/// After the move to B, the exit's stream-level SENDMEs for the moved stream come back on B
/// once the switch is final (the client acknowledged the confirmation): with A's way back to
/// the client cut 100 ms after the confirmation, the upload (several stream windows after the
/// cut) still completes. Sent on A, they would be lost and the stream would stall.
#[test]
fn stream_sendmes_follow_the_upload_to_the_new_leg() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    net.upload_only = Some(s);
    let streams = vec![(s, pattern(4_000_000, 5))];
    let mut confirmed_at = None;
    let mut cut_at = None;
    net.transfer(&streams, 60_000, |i, net| {
        if i == 300 {
            assert!(net.congest_e1().is_some());
        }
        if confirmed_at.is_none() && net.nodes[CLIENT].switch_stats().switches == 1 {
            confirmed_at = Some(i);
        }
        if cut_at.is_none() && confirmed_at.is_some_and(|c| i == c + 100) {
            net.blackhole(E1, CLIENT);
            cut_at = Some(i);
        }
    });
    assert!(
        cut_at.is_some(),
        "no confirmed switch, or the upload ended first"
    );
    net.run(20_000);
    net.assert_exact(&streams);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(b));
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.switches, c.timed_out), (1, 0), "{c:?}");
    assert_eq!(net.nodes[X].switch_stats().violations, 0);
}

#[test]
fn no_confirmation_falls_back_to_the_old_leg_and_resends() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    // B's way back is cut: the exit sees the switch, its SWITCH_CONFIRM never arrives.
    net.blackhole(M2, E2);
    let streams = vec![(s, pattern(1_500_000, 7))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    let x = net.nodes[X].switch_stats();
    assert_eq!((c.switches, c.timed_out), (0, 1), "{c:?}");
    assert!(c.cells_resent > 0, "{c:?}");
    // The cells sent on B arrived there too: the exit dropped the second copies.
    assert!(x.path_duplicates > 0, "{x:?}");
    assert_eq!(c.cells_lost + x.violations, 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
    // The abandoned spare is closed.
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(None));
    assert!(net.events.contains(&(
        CLIENT,
        Event::CircuitClosed {
            circ: b,
            reason: "spare leg abandoned after a failed switch".into(),
            cause: chive_core::CloseCause::Local,
            hops: 3,
        }
    )));
    let rec = net.nodes[CLIENT].poll_switch_record().expect("a record");
    assert_eq!(rec.outcome, SwitchOutcome::TimedOut);
    assert!(rec.ended - rec.triggered >= Duration::from_millis(2000));
}

#[test]
fn a_dead_spare_loses_nothing() {
    let mut net = Net::new();
    let (a, _b, s) = net.linked();
    // Nothing gets through B at all any more.
    net.blackhole(E2, M2);
    net.blackhole(M2, E2);
    let streams = vec![(s, pattern(1_500_000, 9))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.switches, c.timed_out, c.cells_lost), (0, 1, 0), "{c:?}");
    assert_eq!(net.nodes[X].switch_stats().path_duplicates, 0);
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
}

#[test]
fn the_spare_closing_mid_switch_falls_back_at_once() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    net.blackhole(M2, E2);
    let streams = vec![(s, pattern(1_500_000, 11))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 600 {
            // Before the 2 s timeout: the client closes B (as when its link fails).
            net.nodes[CLIENT].close_circuit(b, net.now);
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.timed_out, c.failed, c.cells_lost), (0, 1, 0), "{c:?}");
    assert_eq!(net.nodes[CLIENT].path_current_leg(a), Some(a));
}

#[test]
fn the_home_circuit_gone_ends_the_stream_cleanly() {
    let mut net = Net::new();
    let (a, b, s) = net.linked();
    let streams = vec![(s, pattern(2_000_000, 13))];
    net.transfer(&streams, 3000, |i, net| {
        if i == 300 {
            net.congest_e1();
        }
        if i == 2000 {
            // The client's link to E1 fails: A is gone.
            let c = net.chan(CLIENT, E1);
            net.nodes[CLIENT].channel_closed(c, net.now);
        }
    });
    net.run(20_000);
    // The stream is closed (the SOCKS side sees it), not left hanging, and B went with A.
    assert!(
        net.events.iter().any(|(n, e)| *n == CLIENT
            && matches!(e, Event::StreamClosed { stream, .. } if *stream == s)),
        "no StreamClosed for the stream"
    );
    assert_eq!(net.nodes[CLIENT].path_set_of(a), None);
    assert!(
        net.events
            .iter()
            .any(|(n, e)| *n == CLIENT
                && matches!(e, Event::CircuitClosed { circ, .. } if *circ == b))
    );
    assert_eq!(net.nodes[CLIENT].stats().circuits, 0);
}

#[test]
fn congestion_without_a_spare_is_ignored() {
    let mut net = Net::new();
    let a = net.build([E1, M1, X]);
    let s = net.nodes[CLIENT]
        .open_stream(a, "127.0.0.1", 80, net.now)
        .unwrap();
    net.run(5000);
    let streams = vec![(s, pattern(200_000, 17))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 200 {
            net.congest_e1();
        }
    });
    net.run(20_000);
    net.assert_exact(&streams);
    let c = net.nodes[CLIENT].switch_stats();
    assert_eq!((c.congested_received, c.triggered, c.switches), (1, 0, 0));
    assert_eq!(net.killed(), 0);
}

#[test]
fn an_exit_with_path_switching_off_never_links() {
    let mut net = Net::new();
    net.nodes[X].set_switching(SwitchSettings::default());
    let a = net.build([E1, M1, X]);
    net.nodes[CLIENT].path_link(a, net.now).unwrap();
    let b = net.build([E2, M2, X]);
    net.nodes[CLIENT].path_add_spare(a, b, net.now).unwrap();
    net.run(5000);
    let s = net.nodes[CLIENT]
        .open_stream(a, "127.0.0.1", 80, net.now)
        .unwrap();
    net.run(5000);
    let streams = vec![(s, pattern(100_000, 19))];
    net.transfer(&streams, 300_000, |i, net| {
        if i == 200 {
            net.congest_e1();
        }
    });
    net.assert_exact(&streams);
    // No LINKED: the spare never joined, nothing moved; after the build timeout it is closed.
    assert_eq!(net.nodes[CLIENT].switch_stats().triggered, 0);
    net.idle(31_000);
    assert_eq!(net.nodes[CLIENT].path_set_of(a), Some(None));
    assert_eq!(net.killed(), 0);
}
