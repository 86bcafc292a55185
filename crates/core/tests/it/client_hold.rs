//! `PerClientQueueCells` (`node/client_hold.rs`) on the in-memory overlay: a client spreading a
//! download over 50 circuits and a one-circuit client share an entry E and a middle M (exit
//! X). E writes to each client at the same rate (a fair write share, as `ChannelFairness`
//! gives them at a rate-limited entry) and reads from M only 10 % faster than it writes in
//! all (the default `ReadRateMargin`), so what does not fit at E waits at M, where EWMA cannot
//! tell clients apart. Also: held cells go on in order, and a hostile client cannot make the
//! held queue grow without bound.

use chive_cell::{Cell, CellCommand};
use chive_core::cc::{CcKind, VegasParams};
use chive_core::{CoreConfig, Event, StreamHandle, MIN_PAUSE_CELLS};

use crate::sim::{pattern, Sim};

const GAMER: usize = 0;
const SINGLE: usize = 1;
/// Node indices of the relays (relay `i` is node `2 + i`).
const E: usize = 2;
const M: usize = 3;
const X: usize = 4;
const PATH: [usize; 3] = [0, 1, 2];
/// Cells a step E writes to each client while both wait (to one alone: twice that), and
/// reads from M in all (10 % over its write rate).
const CLIENT_RATE: usize = 5;
const READ_RATE: usize = 11;

fn overlay(cap: usize) -> Sim {
    overlay_cc(cap, CcKind::Fixed)
}

fn overlay_cc(cap: usize, cc: CcKind) -> Sim {
    let cfg = || CoreConfig {
        congestion_control: cc,
        ..CoreConfig::default()
    };
    let relay = move |i: usize| CoreConfig {
        exit: i == 2,
        client_queue_cap: if i == 0 { cap } else { 0 },
        congestion_control: cc,
        ..CoreConfig::default()
    };
    Sim::overlay(18, vec![cfg(), cfg()], 3, relay)
}

/// The exit's "servers" send without end: every read credit X grants is filled at once.
fn serve(sim: &mut Sim) {
    for (n, ev) in std::mem::take(&mut sim.events) {
        match ev {
            Event::StreamReadCredit { stream, bytes } if n == X => {
                sim.fill_credit(X, stream, bytes);
            }
            other => sim.events.push((n, other)),
        }
    }
}

struct Outcome {
    /// Bytes each client received after the warm-up.
    gamer: usize,
    single: usize,
    /// Most cells queued at M toward E after the warm-up (the gamer's excess, if any).
    middle_max: usize,
    /// Most cells queued at E toward the gamer after the warm-up.
    entry_max: usize,
    steps: usize,
}

impl Outcome {
    fn ratio(&self) -> f64 {
        self.gamer as f64 / self.single as f64
    }

    /// What the bound `cap` promises: the two clients get the same share (within 20 %), and
    /// little is in flight: M holds a few batches, E the cap and what one release brings.
    fn assert_bounded(&self, cap: usize) {
        assert!(
            (0.8..=1.2).contains(&self.ratio()),
            "share with the bound: x{:.2}",
            self.ratio()
        );
        assert!(
            self.middle_max <= 500,
            "queued at M toward E: {}",
            self.middle_max
        );
        assert!(
            self.entry_max <= cap + 500,
            "queued at E toward the gamer: {}",
            self.entry_max
        );
    }
}

/// 50 download circuits for the gamer, one for the single client, `warmup` + `window` steps
/// of 1 ms; `cap` = E's `PerClientQueueCells` (0 = off).
fn gaming(cap: usize, cc: CcKind, warmup: usize, window: usize) -> (Sim, Outcome) {
    let mut sim = overlay_cc(cap, cc);
    let mut streams: Vec<(usize, StreamHandle)> = Vec::new();
    for _ in 0..50 {
        let c = sim.build_through(GAMER, &PATH, 2000);
        streams.push((GAMER, sim.open_on(GAMER, c, 2000)));
    }
    let c = sim.build_through(SINGLE, &PATH, 2000);
    streams.push((SINGLE, sim.open_on(SINGLE, c, 2000)));
    for (n, s) in &streams {
        assert!(sim.connected(*n, *s), "stream {s:?} of {n} not connected");
    }
    sim.set_budgets(&[
        (E, GAMER, CLIENT_RATE),
        (E, SINGLE, CLIENT_RATE),
        (M, E, READ_RATE),
    ]);
    let (m_to_e, e_to_gamer, e_to_single) =
        (sim.chan(M, E), sim.chan(E, GAMER), sim.chan(E, SINGLE));
    let mut out = Outcome {
        gamer: 0,
        single: 0,
        middle_max: 0,
        entry_max: 0,
        steps: window,
    };
    for step in 0..warmup + window {
        serve(&mut sim);
        // E's write rate is shared and work-conserving: the single client's share (half) if it
        // has that much waiting, the rest to the gamer.
        sim.share_rate(E, e_to_gamer, e_to_single, CLIENT_RATE);
        sim.step();
        for ((n, _), data) in sim.received.iter_mut() {
            if step >= warmup {
                match *n {
                    GAMER => out.gamer += data.len(),
                    _ => out.single += data.len(),
                }
            }
            data.clear();
        }
        if std::env::var("HOLD_TRACE").is_ok() && step % 500 == 0 {
            eprintln!(
                "step {step}: M->E {} E->gamer {} E->single {} held {} got {} / {}",
                sim.nodes[M].channel_queued(m_to_e),
                sim.nodes[E].channel_queued(e_to_gamer),
                sim.nodes[E].channel_queued(e_to_single),
                sim.nodes[E].held_cells(e_to_gamer),
                out.gamer,
                out.single
            );
        }
        if step >= warmup {
            out.middle_max = out.middle_max.max(sim.nodes[M].channel_queued(m_to_e));
            out.entry_max = out.entry_max.max(sim.nodes[E].channel_queued(e_to_gamer));
        }
    }
    // The per-channel counts add up to the core's count of queued cells.
    let e = &sim.nodes[E];
    let per_channel: usize = [e_to_gamer, e_to_single, sim.chan(E, M)]
        .iter()
        .map(|c| e.channel_queued(*c))
        .sum();
    assert_eq!(per_channel, e.stats().queued_cells);
    eprintln!(
        "{} cap {cap}: gamer {} B single {} B (x{:.2}), most queued at M toward E {}, at E toward \
         the gamer {}, held {:?}",
        if cc == CcKind::Fixed {
            "fixed"
        } else {
            "vegas"
        },
        out.gamer,
        out.single,
        out.ratio(),
        out.middle_max,
        out.entry_max,
        sim.nodes[E].hold_stats()
    );
    (sim, out)
}

/// Without the bound the gamer's 50 windows wait at M, where EWMA serves its 50 circuits
/// before the single client's one: it gets many times the single client's goodput. With it,
/// the gamer's credit waits at E as held SENDMEs: little waits at M, the two clients get the
/// same share, and the gamer still gets its full rate.
#[test]
fn a_fifty_circuit_client_gets_no_larger_share_and_parks_nothing_upstream() {
    const CAP: usize = 1000;
    let (warmup, window) = (5_000, 8_000);
    let (sim, off) = gaming(0, CcKind::Fixed, warmup, window);
    assert_eq!(sim.killed(), 0);
    assert!(
        off.ratio() > 3.0,
        "the gaming this guards against: x{:.2}",
        off.ratio()
    );
    assert!(
        off.middle_max > 5_000,
        "the gamer's windows wait at M: {}",
        off.middle_max
    );

    let (sim, on) = gaming(CAP, CcKind::Fixed, warmup, window);
    assert_eq!(sim.killed(), 0);
    on.assert_bounded(CAP);
    let full = 2 * CLIENT_RATE * on.steps * chive_cell::RELAY_DATA_LEN;
    assert!(
        (on.gamer + on.single) * 10 >= full * 9,
        "E's write rate is used: {} + {} of {full}",
        on.gamer,
        on.single
    );
    let held = sim.nodes[E].hold_stats();
    assert!(held.held_total > 100, "{held:?}");
    assert!(held.released_total + held.held_now as u64 == held.held_total);
    assert_eq!((held.read_pauses, held.circuits_killed), (0, 0));
}

/// A client uploading on circuits whose answers fill its queue at E past the cap: its DATA is
/// held at E and let go later, and every stream's bytes still come back exact and in order.
#[test]
fn held_cells_are_passed_on_in_order() {
    let mut sim = overlay(64);
    let mut streams = Vec::new();
    for k in 0..4u8 {
        let c = sim.build_through(GAMER, &PATH, 2000);
        let s = sim.open_on(GAMER, c, 2000);
        streams.push((s, pattern(300_000, k)));
    }
    let chan = sim.chan(E, GAMER);
    sim.links.get_mut(&(E, chan)).unwrap().budget = 3;
    assert!(sim.echo_transfer(GAMER, &streams, 400_000, |_, _| {}));
    sim.assert_echo(GAMER, &streams);
    // The last SENDMEs held go with the release timer.
    sim.idle(300);
    assert_eq!(sim.killed(), 0);
    let held = sim.nodes[E].hold_stats();
    eprintln!("{held:?}");
    assert!(held.held_total > 1000, "uploads were held: {held:?}");
    assert_eq!(held.held_now, 0);
    assert_eq!(held.released_total, held.held_total);
}

/// A client that stops reading (nothing leaves E toward it) and sends relay cells as fast as
/// it likes on its busy circuits: every cell is held, the channel asks to be read no more
/// once the cap's worth is held, a circuit holding more than `max_circuit_queue` is killed, and
/// the held cells count against `MaxMemInQueues`.
#[test]
fn a_hostile_client_cannot_grow_the_held_queue_without_bound() {
    let cap = 200;
    let mut sim = overlay(cap);
    let mut circs = Vec::new();
    for _ in 0..3 {
        let c = sim.build_through(GAMER, &PATH, 2000);
        circs.push((c, sim.open_on(GAMER, c, 2000)));
    }
    let e_chan = sim.chan(E, GAMER);
    let g_chan = sim.chan(GAMER, E);
    sim.links.get_mut(&(E, e_chan)).unwrap().budget = 0;
    for _ in 0..500 {
        serve(&mut sim);
        sim.step();
    }
    let queued = sim.nodes[E].channel_queued(e_chan);
    assert!(queued > cap, "the client's queue at E: {queued}");
    // The circuit ids the client used on its link to E.
    let mut ids: Vec<u32> = sim.links[&(GAMER, g_chan)].ids.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    let mem_before = sim.nodes[E].stats().mem_in_queues;
    let limit = CoreConfig::default().max_circuit_queue;
    let mut paused_at = None;
    for i in 0..limit + 10 {
        let cell = Cell::new(ids[0], CellCommand::RELAY, &[7; 100]).unwrap();
        sim.nodes[E].handle_cell(e_chan, cell, sim.now);
        let held = sim.nodes[E].held_cells(e_chan);
        assert!(held <= limit, "held {held} on one circuit");
        if paused_at.is_none() && sim.nodes[E].read_paused(e_chan) {
            paused_at = Some(i + 1);
            assert!(sim.nodes[E].stats().mem_in_queues > mem_before);
        }
    }
    assert_eq!(
        paused_at,
        Some(cap.max(MIN_PAUSE_CELLS)),
        "reading pauses at the bound"
    );
    let stats = sim.nodes[E].hold_stats();
    assert_eq!(stats.circuits_killed, 1, "{stats:?}");
    assert_eq!(
        sim.nodes[E].held_cells(e_chan),
        0,
        "the killed circuit's cells went with it"
    );
    assert!(!sim.nodes[E].read_paused(e_chan), "reading resumes");
    assert!(sim.nodes[E].stats().mem_in_queues <= mem_before);
    // The client's other two circuits were not touched.
    assert_eq!(sim.nodes[E].stats().circuits, 2);
}

/// The same with congestion control (Vegas, `cc_alg=2`): circuit SENDMEs only, windows that
/// follow the queueing delay.
#[test]
fn with_vegas_too() {
    const CAP: usize = 1000;
    let vegas = CcKind::Vegas(VegasParams::default());
    let (sim, off) = gaming(0, vegas, 5_000, 8_000);
    assert_eq!(sim.killed(), 0);
    assert!(off.ratio() > 3.0, "the gaming: x{:.2}", off.ratio());
    let (sim, on) = gaming(CAP, vegas, 5_000, 8_000);
    assert_eq!(sim.killed(), 0);
    on.assert_bounded(CAP);
}
