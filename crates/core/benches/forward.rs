//! A middle relay's CPU cost per forwarded cell through the real sans-IO core (issue 3, paper
//! 000's measure), for round-robin, EWMA (H = 30 s) and EWMA-direct at 10 … 10 000 circuits.
//!
//! Setup (untimed): a client core C, a middle relay core M and a next relay core X, wired in
//! memory; C builds N two-hop circuits C → M → X with real CREATE2 / EXTEND2 / ntor, the bench
//! shuttling cells between the cores until every circuit reports built. A probe then sends one
//! relay cell per circuit into M to learn the circuit id M uses toward X, and DEPTH = 4 cells per
//! circuit are queued at M.
//!
//! One iteration is one cell of M's forwarding work, as the relay driver does it: the cell arrives
//! on the channel from C (`Core::handle_cell`: channel and circuit-id lookup, the circuit's
//! AES-CTR layer removed, the `recognized` check, the cell queued toward X, its scheduler queue
//! activated, the channel marked ready), plus 1/32 of a write batch: once every 32 cells `now`
//! advances by 32 µs (the driver reads the clock once per wake-up), the ready channels are
//! drained (`poll_ready_channel`) and `poll_transmit(chan, 32, now, ..)` on the channel toward X
//! lets the scheduler pick 32 cells. The cells that left are given back their id on C's channel
//! (a small multiplicative hash map, a few ns) and fed again, so every circuit keeps 4 cells
//! queued (minus those in flight). No TLS, no syscalls, no cell encoding: only the core.
//!
//! Payloads are random bytes re-fed as they come out; they are not valid for M's layer, so M
//! forwards them, exactly the middle-relay path: after decryption `recognized` is zero with
//! probability 2^-16 (then one SHA-1 over the payload, amortised < 0.1 ns per cell) and the
//! 4-byte digest must also match (2^-32), so a false "recognized" has probability 2^-48 per cell
//! (~3e-7 over a run of ~85 M cells), as for real traffic through a Tor middle relay. The payload
//! cannot be chosen to rule it out, because the bench does not know M's keystream. If it ever
//! happened the circuit would most likely be killed; each run checks that M killed no circuit and
//! that every circuit got cells out (no stall: a middle relay has no circuit window, the queues
//! stay far below `max_circuit_queue` and `max_mem_in_queues`, and no SENDME is involved).
//!
//! Compare with `benches/sched.rs`, group `sched-cached-time` (same queue depth, batch and clock
//! policy, the scheduler alone on a mock channel): the scheduler is the difference between the
//! policies here, the rest (lookups, AES, queues) is the same for all of them. EWMA-direct runs
//! only up to 1 000 circuits: it decays every count and scans every queue per cell, O(N).
//!
//! Context. Quiet 2-core AMD EPYC (session 4), ns per forwarded cell, rr / ewma (ratio):
//! 153 / 161 (1.05) at 10 circuits, 160 / 167 (1.05) at 100, 186 / 194 (1.04) at 1 000,
//! 275 / 297 (1.08) at 10 000; ewma-direct 249 ns, 1.18 µs, 10.6 µs (linear). The
//! sched-cached-time mock on the same machine: rr 43–49 ns and ewma 50–59 ns up to 1 000 circuits,
//! 136 / 191 ns at 10 000. Before the core's own-id maps moved from SipHash to a cheap hasher
//! (`idmap.rs`) the same loop cost 210 / 225 ns at 10 circuits and 230 / 242 ns at 1 000. `perf`
//! on a loaded run put the scheduler's own methods at ~0.1% (rr) and ~1–2% (ewma) of the loop;
//! the rest is AES (~25–30%), map lookups, copying 514-byte cells in and out of the queues
//! (grows with N: cache misses on 20 MB of queued cells at 10 000) and this harness (~5–10%).
//!
//! Run: `cargo bench -p chive-benches --bench forward`

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, CircId, PAYLOAD_LEN};
use chive_core::{ChannelId, Core, CoreConfig, Event, HopSpec, RelayKeys, SchedulerKind};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::{IdentityKey, IdentityKeypair};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;

/// Cells per circuit queue at M (as in sched.rs).
const DEPTH: usize = 4;
/// Cells per write batch (as in sched.rs and the driver's write tick).
const WRITE_BATCH: usize = 32;

const CLIENT: usize = 0;
const MIDDLE: usize = 1;
const NEXT: usize = 2;

/// Multiplicative hash for the bench's own id map (circuit ids are random u32s), so that the
/// harness adds little to the measured time.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap = HashMap<CircId, CircId, BuildHasherDefault<IdHasher>>;

/// Three cores in memory and the channels between them.
struct Overlay {
    nodes: [Core; 3],
    identities: [Option<IdentityKey>; 3],
    /// (node, chan) → (peer node, peer chan).
    links: HashMap<(usize, ChannelId), (usize, ChannelId)>,
    next_chan: u64,
    start: Instant,
    now: Instant,
}

impl Overlay {
    fn new(rng: &mut StdRng) -> (Overlay, Vec<HopSpec>) {
        let mut relay = |seed: u8, port: u16| {
            let identity = IdentityKeypair::generate(&mut *rng).public();
            let ntor = NtorSecretKey::generate(&mut *rng);
            let hop = HopSpec {
                identity,
                ntor_key: ntor.public(),
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            };
            let core = Core::new(
                CoreConfig {
                    relay: Some(RelayKeys { identity, ntor }),
                    ..CoreConfig::default()
                },
                [seed; 32],
            );
            (core, hop)
        };
        let (middle, m_hop) = relay(2, 9001);
        let (next, x_hop) = relay(3, 9002);
        let start = Instant::now();
        let overlay = Overlay {
            identities: [None, Some(m_hop.identity), Some(x_hop.identity)],
            nodes: [Core::new(CoreConfig::default(), [1; 32]), middle, next],
            links: HashMap::new(),
            next_chan: 1,
            start,
            now: start,
        };
        (overlay, vec![m_hop, x_hop])
    }

    fn connect(&mut self, from: usize, to: usize) {
        let (a, b) = (ChannelId(self.next_chan), ChannelId(self.next_chan + 1));
        self.next_chan += 2;
        self.links.insert((from, a), (to, b));
        self.links.insert((to, b), (from, a));
        let (from_id, to_id) = (self.identities[from], self.identities[to]);
        self.nodes[from].channel_opened(a, to_id, true, self.now);
        self.nodes[to].channel_opened(b, from_id, false, self.now);
    }

    /// The channel `from` uses toward `to`.
    fn chan(&self, from: usize, to: usize) -> ChannelId {
        match self
            .links
            .iter()
            .find(|((n, _), (p, _))| *n == from && *p == to)
        {
            Some(((_, c), _)) => *c,
            None => panic!("setup: no channel from node {from} to node {to}"),
        }
    }

    /// Shuttle events and cells until `circuits` circuits are built at the client. Returns the
    /// circuit ids the client used on its channel to M, in order of first appearance.
    fn build(&mut self, circuits: usize) -> Vec<CircId> {
        let mut built = 0;
        let mut client_ids = Vec::with_capacity(circuits);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        while built < circuits {
            let mut progress = false;
            for n in 0..3 {
                while let Some(ev) = self.nodes[n].poll_event() {
                    progress = true;
                    match ev {
                        Event::Connect { identity, .. } => {
                            let Some(to) =
                                self.identities.iter().position(|i| *i == Some(identity))
                            else {
                                panic!("setup: connect to an unknown relay");
                            };
                            self.connect(n, to);
                        }
                        Event::CircuitBuilt { .. } => built += 1,
                        Event::CircuitClosed { circ, reason, .. } => {
                            panic!("setup: circuit {circ:?} closed: {reason}")
                        }
                        other => panic!("setup: unexpected event at node {n}: {other:?}"),
                    }
                }
            }
            for n in 0..3 {
                while let Some(chan) = self.nodes[n].poll_ready_channel() {
                    let Some(&(peer, pchan)) = self.links.get(&(n, chan)) else {
                        panic!("setup: node {n} has cells for an unlinked channel");
                    };
                    loop {
                        out.clear();
                        self.nodes[n].poll_transmit(chan, 1024, self.now, &mut out);
                        if out.is_empty() {
                            break;
                        }
                        progress = true;
                        for cell in out.drain(..) {
                            if n == CLIENT && seen.insert(cell.circ_id) {
                                client_ids.push(cell.circ_id);
                            }
                            self.nodes[peer].handle_cell(pchan, cell, self.now);
                        }
                    }
                }
            }
            self.now += Duration::from_millis(1);
            assert!(
                progress,
                "setup: stalled with {built} of {circuits} circuits built"
            );
        }
        assert_eq!(
            client_ids.len(),
            circuits,
            "setup: the client used an unexpected number of circuit ids"
        );
        client_ids
    }
}

/// The middle relay forwarding cells for `circuits` circuits, with its feed.
struct Forward {
    overlay: Overlay,
    /// M's channels: from C, toward X.
    from_c: ChannelId,
    to_x: ChannelId,
    /// M's id toward X → C's id toward M, per circuit.
    back: IdMap,
    /// Cells waiting to arrive at M (ids on C's channel).
    inbox: VecDeque<Cell>,
    out: Vec<Cell>,
    micros: u64,
}

impl Forward {
    fn new(circuits: usize) -> Forward {
        let mut rng = StdRng::seed_from_u64(3);
        let (mut overlay, path) = Overlay::new(&mut rng);
        for _ in 0..circuits {
            let now = overlay.now;
            overlay.nodes[CLIENT].launch_circuit(path.clone(), now);
        }
        let client_ids = overlay.build(circuits);
        let from_c = overlay.chan(MIDDLE, CLIENT);
        let to_x = overlay.chan(MIDDLE, NEXT);
        assert_eq!(overlay.nodes[MIDDLE].stats().circuits, circuits);
        assert_eq!(overlay.nodes[NEXT].stats().circuits, circuits);
        let mut payload = [0u8; PAYLOAD_LEN];
        rng.fill(&mut payload[..]);
        let now = overlay.now;
        let m = &mut overlay.nodes[MIDDLE];
        let relay = |id| Cell::from_payload(id, CellCommand::RELAY, payload);
        // Probe: one cell per circuit, alone, tells which id M forwards it on.
        let mut back = IdMap::default();
        let mut out = Vec::with_capacity(WRITE_BATCH);
        for &id in &client_ids {
            m.handle_cell(from_c, relay(id), now);
            while m.poll_ready_channel().is_some() {}
            out.clear();
            m.poll_transmit(to_x, WRITE_BATCH, now, &mut out);
            assert_eq!(out.len(), 1, "setup: probe cell for {id:#x} not forwarded");
            assert!(
                back.insert(out[0].circ_id, id).is_none(),
                "setup: two circuits share an id toward X"
            );
        }
        // Fill: DEPTH cells queued per circuit.
        for _ in 0..DEPTH {
            for &id in &client_ids {
                m.handle_cell(from_c, relay(id), now);
            }
        }
        while m.poll_ready_channel().is_some() {}
        assert_eq!(m.stats().queued_cells, circuits * DEPTH);
        Forward {
            from_c,
            to_x,
            back,
            inbox: VecDeque::with_capacity(WRITE_BATCH),
            out,
            micros: 0,
            overlay,
        }
    }

    fn middle(&mut self) -> &mut Core {
        &mut self.overlay.nodes[MIDDLE]
    }

    /// Forward one cell through M.
    #[inline]
    fn step(&mut self) {
        if self.inbox.is_empty() {
            self.write();
        }
        let Some(cell) = self.inbox.pop_front() else {
            panic!("no cell to feed: the middle relay stopped forwarding");
        };
        let (from_c, now) = (self.from_c, self.overlay.now);
        self.middle().handle_cell(from_c, cell, now);
    }

    /// One write event: the clock is read, the scheduler moves a batch toward X, and those cells
    /// are sent again from C.
    fn write(&mut self) {
        self.micros += WRITE_BATCH as u64;
        let now = self.overlay.start + Duration::from_micros(self.micros);
        self.overlay.now = now;
        let to_x = self.to_x;
        let m = &mut self.overlay.nodes[MIDDLE];
        while m.poll_ready_channel().is_some() {}
        let moved = m.poll_transmit(to_x, WRITE_BATCH, now, &mut self.out);
        if moved != WRITE_BATCH {
            panic!("middle relay moved {moved} of {WRITE_BATCH} cells: stalled");
        }
        for mut cell in self.out.drain(..) {
            let Some(&id) = self.back.get(&cell.circ_id) else {
                panic!("middle relay sent a cell on unknown id {:#x}", cell.circ_id);
            };
            cell.circ_id = id;
            self.inbox.push_back(cell);
        }
    }

    /// Cells each circuit has sent so far at M, by circuit.
    fn sent_per_circuit(&self) -> Vec<u64> {
        self.overlay.nodes[MIDDLE]
            .circuit_stats(self.overlay.now)
            .iter()
            .map(|c| c.cells_sent)
            .collect()
    }

    /// Run `cells` cells and check that every circuit forwarded some and none was killed.
    fn check_flow(&mut self, cells: usize, what: &str) {
        let before = self.sent_per_circuit();
        for _ in 0..cells {
            self.step();
        }
        let m = &self.overlay.nodes[MIDDLE];
        let stats = m.stats();
        assert_eq!(
            stats.circuits_killed, 0,
            "{what}: the middle relay killed a circuit"
        );
        assert_eq!(
            stats.circuits,
            before.len(),
            "{what}: a circuit disappeared"
        );
        let after = self.sent_per_circuit();
        let idle = before.iter().zip(&after).filter(|(b, a)| a <= b).count();
        assert_eq!(idle, 0, "{what}: {idle} circuits forwarded no cell");
    }
}

fn bench_forward(c: &mut Criterion) {
    let mut group = c.benchmark_group("forward");
    group.throughput(Throughput::Elements(1));
    for circuits in [10usize, 100, 1_000, 10_000] {
        // Built on first use, so that a filtered run skips the setup of sizes it does not run.
        let mut fwd: Option<Forward> = None;
        for (name, kind) in common::SCHEDULERS {
            if matches!(kind, SchedulerKind::EwmaDirect { .. }) && circuits > 1_000 {
                continue;
            }
            // Cells M had transmitted when this policy took over (None: filtered out).
            let mut before: Option<u64> = None;
            group.bench_with_input(BenchmarkId::new(name, circuits), &circuits, |b, &n| {
                let fwd = fwd.get_or_insert_with(|| {
                    let setup = Instant::now();
                    let fwd = Forward::new(n);
                    let secs = setup.elapsed().as_secs_f64();
                    eprintln!("forward: {n} circuits built in {secs:.1} s");
                    fwd
                });
                if before.is_none() {
                    // Every queue with cells is re-activated in the new policy (fresh EWMA
                    // counts); then every queue sends and is refilled at least twice.
                    let now = fwd.overlay.now;
                    fwd.middle().set_scheduler(kind, now);
                    fwd.check_flow(n * DEPTH * 2, "warm-up");
                    before = Some(fwd.middle().stats().cells_transmitted);
                }
                b.iter(|| fwd.step())
            });
            if let (Some(fwd), Some(before)) = (fwd.as_mut(), before) {
                let moved = fwd.middle().stats().cells_transmitted - before;
                // After the measurement: still no circuit killed or stalled.
                fwd.check_flow(circuits * DEPTH * 2, name);
                eprintln!(
                    "forward/{name}/{circuits}: {moved} cells forwarded, all circuits flowing"
                );
                black_box(fwd.inbox.len());
            }
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = bench_forward
}
criterion_main!(benches);
