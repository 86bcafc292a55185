//! A read batch handed over whole (`Core::handle_cells_wire`, what the node's driver calls): a
//! run of one circuit's relayed cells is passed on with one channel and circuit lookup, and
//! everything else takes the per-cell path. Checked here: the same batches give the same
//! result as handing each cell to `handle_cell_wire` — the cells each side receives, byte for
//! byte, the counters, the events — with a cell recognized at the relay inside a run, several
//! circuits interleaved, both directions, a queue going over `max_circuit_queue` mid-run and
//! `MaxMemInQueues` reached mid-run; and a run costs one lookup (`relay_runs`). On the send
//! side, `poll_transmit` serves a queue the scheduler picks again without looking its circuit
//! up again: the cells leave in the order one-cell calls give (a pick per cell).

use crate::common::{self, drain, Path, R_CLIENT, R_TO_X};

use chive_cell::{Cell, RelayCommand, CELL_LEN};
use chive_core::{ChannelId, CoreConfig, CoreStats, Event, SchedulerKind, CELL_MEM_COST};

/// One step of a scenario: cells handed to R on a channel in one read.
type Batch = (ChannelId, Vec<u8>);

/// The cells' wire bytes, back to back (one read batch).
fn batch_of(cells: &[Cell]) -> Vec<u8> {
    cells.iter().flat_map(common::wire_of).collect()
}

/// The variant of an event (its fields hold instants of the path it came from).
fn kind(e: &Event) -> String {
    let s = format!("{e:?}");
    s.split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// What R did with the batches: its counters (but `relay_runs`), the cells it has for X and
/// for the client, its events.
#[derive(Debug, PartialEq)]
struct Outcome {
    stats: CoreStats,
    /// Wire bytes, back to back.
    to_x: Vec<u8>,
    to_client: Vec<u8>,
    events: Vec<String>,
}

fn outcome(p: &mut Path) -> Outcome {
    let mut stats = p.r.core.stats();
    stats.relay_runs = 0;
    let now = p.now;
    let to_x = batch_of(&drain(&mut p.r.core, R_TO_X, now));
    let to_client = batch_of(&drain(&mut p.r.core, R_CLIENT, now));
    let mut events = Vec::new();
    while let Some(e) = p.r.core.poll_event() {
        events.push(kind(&e));
    }
    Outcome {
        stats,
        to_x,
        to_client,
        events,
    }
}

/// Run `scenario` (which sets up a path and returns the batches for R) twice on identical
/// paths: once handing R each cell alone, once each batch whole. Both must end the same;
/// returns the whole-batch path's run count and outcome.
fn same_both_ways(
    cfg: impl Fn() -> CoreConfig,
    scenario: impl Fn(&mut Path) -> Vec<Batch>,
) -> (u64, Outcome) {
    let mut one = Path::new(cfg());
    let mut whole = Path::new(cfg());
    let batches = scenario(&mut one);
    assert_eq!(scenario(&mut whole), batches, "the paths are identical");
    let mut scratch = common::blank_cell();
    let runs_before = whole.r.core.stats().relay_runs;
    for (chan, bytes) in &batches {
        for wire in bytes.chunks_exact(CELL_LEN) {
            let wire: &[u8; CELL_LEN] = wire.try_into().unwrap();
            one.r
                .core
                .handle_cell_wire(*chan, wire, &mut scratch, one.now);
        }
        whole
            .r
            .core
            .handle_cells_wire(*chan, bytes, &mut scratch, whole.now);
    }
    let runs = whole.r.core.stats().relay_runs - runs_before;
    let (a, b) = (outcome(&mut one), outcome(&mut whole));
    assert_eq!(a, b, "per cell and per batch differ");
    (runs, b)
}

/// `n` DATA cells for X on `circ`.
fn data_for_x(circ: &mut common::Circ, n: usize, tag: u8) -> Vec<Cell> {
    (0..n)
        .map(|i| {
            let body = vec![tag ^ i as u8; 20 + i % 400];
            common::relay_cell(circ, 1, RelayCommand::DATA, 1, &body, false)
        })
        .collect()
}

#[test]
fn a_batch_ends_as_cell_by_cell_and_a_run_is_one_lookup() {
    let (runs, out) = same_both_ways(CoreConfig::default, |p| {
        let (mut a, sa) = p.circuit_with_stream();
        let (mut b, _) = p.circuit_with_stream();
        // Forward: a run of A, a cell for R inside A's cells, B, A again.
        let mut fwd = data_for_x(&mut a, 30, 1);
        fwd.push(common::relay_cell(
            &mut a,
            0,
            RelayCommand::DROP,
            0,
            b"for R",
            false,
        ));
        fwd.extend(data_for_x(&mut a, 10, 2));
        fwd.extend(data_for_x(&mut b, 7, 3));
        fwd.extend(data_for_x(&mut a, 5, 4));
        // Backward: X's answer on A, as X sends it.
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        let now = p.now;
        p.x.core.stream_data(sa, &data, now);
        let back = drain(&mut p.x.core, common::X_FROM_R, now);
        assert!(back.len() >= 40, "X sent {} cells", back.len());
        vec![(R_CLIENT, batch_of(&fwd)), (R_TO_X, batch_of(&back))]
    });
    // A's 30 (the DROP ends the run as the 31st), A's 10, B's 7, A's 5, X's cells on A.
    assert_eq!(runs, 5, "one lookup per run");
    assert_eq!(
        out.to_x.len(),
        52 * CELL_LEN,
        "every cell but the DROP passed on"
    );
    assert!(out.to_client.len() >= 40 * CELL_LEN);
}

/// Cells on a circuit that ends at R (a one-hop circuit: R is its last hop, as the exit is
/// for a client's uploads and SENDMEs) are not passed on: `relay_run` sends them down the
/// per-cell path without `origin_run` looking the circuit up again. They end as cell by cell:
/// R answers each BEGIN (it is no exit) and takes the DROP, around a run of A's cells.
#[test]
fn cells_for_a_circuit_ending_here_end_as_cell_by_cell() {
    let (runs, out) = same_both_ways(CoreConfig::default, |p| {
        let mut one_hop = p.create();
        let (mut a, _) = p.circuit_with_stream();
        let mut fwd: Vec<Cell> = (1..=6)
            .map(|sid| {
                common::relay_cell(
                    &mut one_hop,
                    0,
                    RelayCommand::BEGIN,
                    sid,
                    b"example.com:80\0",
                    false,
                )
            })
            .collect();
        fwd.extend(data_for_x(&mut a, 4, 1));
        fwd.push(common::relay_cell(
            &mut one_hop,
            0,
            RelayCommand::DROP,
            0,
            b"",
            false,
        ));
        vec![(R_CLIENT, batch_of(&fwd))]
    });
    assert_eq!(runs, 1, "A's cells are the only run passed on");
    assert_eq!(out.stats.origin_runs, 0);
    assert_eq!(out.stats.circuits, 2, "{:?}", out.stats);
    assert_eq!(out.to_x.len(), 4 * CELL_LEN);
    assert_eq!(out.to_client.len(), 6 * CELL_LEN, "an END per BEGIN");
}

#[test]
fn a_queue_over_its_limit_mid_run_kills_as_cell_by_cell() {
    let cfg = || CoreConfig {
        max_circuit_queue: 12,
        ..CoreConfig::default()
    };
    let (runs, out) = same_both_ways(cfg, |p| {
        let (mut a, _) = p.circuit_with_stream();
        let (mut b, _) = p.circuit_with_stream();
        let mut fwd = data_for_x(&mut a, 20, 1);
        fwd.extend(data_for_x(&mut b, 5, 2));
        vec![(R_CLIENT, batch_of(&fwd))]
    });
    // A's run ends at its 13th cell (killed); its last 7 find no circuit, cell by cell.
    assert_eq!(runs, 2);
    assert_eq!(out.stats.circuits_killed, 1);
    assert_eq!(out.stats.circuits, 1, "B lives on");
}

#[test]
fn the_memory_limit_reached_mid_run_acts_as_cell_by_cell() {
    // Room for 40 cells: A's queue grows 4, 8, 16, 32, 64; the growth to 64 crosses it.
    let cfg = || CoreConfig {
        max_mem_in_queues: 40 * CELL_MEM_COST,
        ..CoreConfig::default()
    };
    let (runs, out) = same_both_ways(cfg, |p| {
        let (mut a, _) = p.circuit_with_stream();
        let (mut b, _) = p.circuit_with_stream();
        let mut fwd = data_for_x(&mut b, 3, 1);
        fwd.extend(data_for_x(&mut a, 45, 2));
        fwd.extend(data_for_x(&mut b, 3, 3));
        vec![(R_CLIENT, batch_of(&fwd))]
    });
    // B's 3; A's run ends at its 33rd cell (its buffer grows to 64: over the limit, the OOM
    // handler frees A); A's last 12 find no circuit, cell by cell; B's 3.
    assert_eq!(runs, 3);
    assert_eq!(out.stats.oom_circuits_killed, 1, "{:?}", out.stats);
    assert_eq!(out.stats.circuits, 1, "B lives on");
}

/// R's cells for X, drained in calls of up to `max` cells.
fn drain_by(p: &mut Path, max: usize) -> Vec<u8> {
    let mut wire = Vec::new();
    while p.r.core.poll_transmit_wire(R_TO_X, max, p.now, &mut wire) > 0 {}
    wire
}

/// A's history, then B, A and C queued together: EWMA serves the quiet B and C first, several
/// cells of one in a row at times, then A's. Drained in one call per batch, the order is the
/// one-cell calls' (every pick made, the same picks).
#[test]
fn a_queue_picked_again_sends_as_one_cell_calls_do() {
    for scheduler in [
        SchedulerKind::Ewma { halflife: 30.0 },
        SchedulerKind::RoundRobin,
    ] {
        let cfg = || CoreConfig {
            scheduler,
            ..CoreConfig::default()
        };
        let run = |max: usize| {
            let mut p = Path::new(cfg());
            let (mut a, _) = p.circuit_with_stream();
            let (mut b, _) = p.circuit_with_stream();
            let (mut c, _) = p.circuit_with_stream();
            drain_by(&mut p, max);
            let mut scratch = common::blank_cell();
            let now = p.now;
            let history = batch_of(&data_for_x(&mut a, 30, 1));
            p.r.core
                .handle_cells_wire(R_CLIENT, &history, &mut scratch, now);
            let mut out = drain_by(&mut p, max);
            let mut mixed = data_for_x(&mut b, 6, 2);
            mixed.extend(data_for_x(&mut a, 10, 3));
            mixed.extend(data_for_x(&mut c, 9, 4));
            p.r.core
                .handle_cells_wire(R_CLIENT, &batch_of(&mixed), &mut scratch, now);
            out.extend(drain_by(&mut p, max));
            out
        };
        let whole = run(1024);
        assert_eq!(whole.len(), 55 * CELL_LEN);
        assert_eq!(whole, run(1), "{scheduler:?}");
        if matches!(scheduler, SchedulerKind::Ewma { .. }) {
            // The second drain: some circuit sent twice in a row, then another one.
            let ids: Vec<&[u8]> = whole[30 * CELL_LEN..]
                .chunks(CELL_LEN)
                .map(|c| &c[..4])
                .collect();
            let repeat = ids.windows(2).position(|w| w[0] == w[1]);
            assert!(
                repeat.is_some_and(|i| ids[i..].windows(2).any(|w| w[0] != w[1])),
                "no repeated pick before a switch"
            );
        }
    }
}
