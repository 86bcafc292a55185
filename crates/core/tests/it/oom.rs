//! `MaxMemInQueues` and the OOM handler (`node/oom.rs`): over the limit, the circuits whose
//! oldest queued cell is oldest die first (DESTROY with RESOURCELIMIT), until at most 90 % of
//! the limit is in use; bytes the driver reports for a channel count too, and a channel whose
//! buffered bytes are the oldest data is closed. Time is virtual: each flood happens at a
//! chosen `now`.
//!
//! What counts for a circuit queue is its buffer's capacity, not only the cells in it: a
//! `VecDeque` of these cells starts at 4 and doubles (4, 8, 16, 32, 64), so the floods below
//! use lengths whose capacity is known, and the limits (`limit(107)`: 90 % is 96.3 cells) are
//! chosen against those capacities.

use crate::common;

use std::time::{Duration, Instant};

use chive_cell::DestroyReason;
use chive_core::{CoreConfig, Event, CELL_MEM_COST};
use common::{destroys, drain, Circ, Path, R_CLIENT, R_TO_X, X_FROM_R};

/// A limit of `cells` queued cells, in bytes.
fn limit(cells: usize) -> CoreConfig {
    CoreConfig {
        max_mem_in_queues: cells * CELL_MEM_COST,
        ..CoreConfig::default()
    }
}

/// At `at` seconds after the path's start, send `n` DROP cells for X on `circ`; R queues them
/// toward X, whose channel does not drain.
fn flood_at(p: &mut Path, start: Instant, at: u64, circ: &mut Circ, n: usize) {
    p.now = start + Duration::from_secs(at);
    p.flood_x(circ, n);
}

/// Hand everything R has for X to X; returns the DESTROYs among it and how many cells.
fn deliver_to_x(p: &mut Path) -> (Vec<(u32, DestroyReason)>, usize) {
    let to_x = drain(&mut p.r.core, R_TO_X, p.now);
    let d = destroys(&to_x);
    let n = to_x.len();
    for cell in to_x {
        p.x.core.handle_cell(X_FROM_R, cell, p.now);
    }
    (d, n)
}

/// The circuit holding the oldest cell dies, not the longest one, and not the one whose cell
/// crossed the limit; below the limit nothing happens; the counters say what was freed.
#[test]
fn oom_kills_the_circuit_whose_oldest_cell_is_oldest() {
    let mut p = Path::new(limit(107));
    let start = p.now;
    let mut a = p.create2();
    let mut b = p.create2();
    let mut c = p.create2();
    flood_at(&mut p, start, 1, &mut b, 16);
    flood_at(&mut p, start, 2, &mut a, 64);
    flood_at(&mut p, start, 3, &mut c, 16);
    let stats = p.r.core.stats();
    assert_eq!(stats.queue_buffer_cells, 96);
    assert_eq!(stats.mem_in_queues, 96 * CELL_MEM_COST);
    assert_eq!(
        (stats.circuits_killed, stats.oom_circuits_killed),
        (0, 0),
        "below the limit nothing dies"
    );

    // c's 17th cell doubles its buffer to 32: 112 cells' room, over the limit.
    flood_at(&mut p, start, 4, &mut c, 1);
    let stats = p.r.core.stats();
    assert_eq!((stats.circuits, stats.oom_circuits_killed), (2, 1));
    assert_eq!(stats.circuits_killed, 1);
    assert_eq!(stats.oom_bytes_freed, (16 * CELL_MEM_COST) as u64);
    assert_eq!(stats.queued_cells, 64 + 17);
    assert_eq!(stats.mem_in_queues, 96 * CELL_MEM_COST);
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(b.id, DestroyReason::RESOURCELIMIT)]
    );

    // X learns of b's death with the same reason, and every cell of a and c arrives.
    let (d, n) = deliver_to_x(&mut p);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].1, DestroyReason::RESOURCELIMIT);
    assert_eq!(n, 1 + 64 + 17);
    assert_eq!(p.x.core.stats().circuits, 2);
    assert!(p.x_answers(&mut a, 1));
    assert!(p.x_answers(&mut c, 1));
    assert_eq!(p.r.core.stats().oom_circuits_killed, 1, "no further kill");
}

/// The handler frees down to 90 % of the limit, taking circuits oldest first, and stops there.
#[test]
fn oom_frees_down_to_ninety_percent_oldest_first() {
    let mut p = Path::new(limit(107));
    let start = p.now;
    let mut circs: Vec<Circ> = (0..4).map(|_| p.create2()).collect();
    // Oldest first: 8, 8, 64, 16 (96 cells' room), then one more cell on the last doubles its
    // buffer (112): 15.7 cells' room must go, so the two oldest die and 96 remain.
    for (i, n) in [8, 8, 64, 16].into_iter().enumerate() {
        flood_at(&mut p, start, i as u64 + 1, &mut circs[i], n);
    }
    assert_eq!(p.r.core.stats().oom_circuits_killed, 0);
    flood_at(&mut p, start, 5, &mut circs[3], 1);
    let stats = p.r.core.stats();
    assert_eq!((stats.oom_circuits_killed, stats.circuits), (2, 2));
    assert_eq!(stats.queued_cells, 64 + 17);
    assert_eq!(
        stats.mem_in_queues,
        96 * CELL_MEM_COST,
        "just under 90 %: the handler stops"
    );
    assert_eq!(stats.oom_bytes_freed, (16 * CELL_MEM_COST) as u64);
    let mut killed: Vec<u32> = destroys(&p.cells_for_client())
        .into_iter()
        .map(|(id, r)| {
            assert_eq!(r, DestroyReason::RESOURCELIMIT);
            id
        })
        .collect();
    killed.sort_unstable();
    assert_eq!(killed, [circs[0].id, circs[1].id]);
}

/// Age is the oldest cell still queued: a circuit that drains stays young even if it started
/// sending first, so the stuck one dies.
#[test]
fn a_draining_circuit_is_younger_than_a_stuck_one() {
    let mut p = Path::new(limit(107));
    let start = p.now;
    let mut busy = p.create2();
    let mut stuck = p.create2();
    flood_at(&mut p, start, 1, &mut busy, 32);
    flood_at(&mut p, start, 2, &mut stuck, 32);
    // R's link to X drains at 3 s (the sweep frees the drained buffers a second later); then
    // stuck queues more, and busy after it.
    p.now = start + Duration::from_secs(3);
    deliver_to_x(&mut p);
    p.now = start + Duration::from_secs(4);
    p.r.core.handle_timeout(p.now);
    assert_eq!(p.r.core.stats().mem_in_queues, 0);
    flood_at(&mut p, start, 5, &mut stuck, 40);
    flood_at(&mut p, start, 6, &mut busy, 60);
    // busy's 33rd cell made 128 cells' room: stuck's oldest is from 5 s, busy's from 6 s.
    let stats = p.r.core.stats();
    assert_eq!(stats.oom_circuits_killed, 1);
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(stuck.id, DestroyReason::RESOURCELIMIT)]
    );
    assert_eq!(stats.queued_cells, 60);
    deliver_to_x(&mut p);
    assert!(p.x_answers(&mut busy, 1));
}

/// Bytes the driver holds for a channel count against the limit, leave the count when the
/// channel closes, and a channel whose buffer holds the oldest data is closed by the handler
/// (with its circuits) before younger circuits are touched.
#[test]
fn driver_buffers_count_and_the_oldest_buffer_is_closed() {
    let mut p = Path::new(limit(100));
    let start = p.now;
    let mut a = p.create2();
    flood_at(&mut p, start, 2, &mut a, 32);
    // The driver holds 45 cells' worth for the client channel since 1 s.
    let since = Some(start + Duration::from_secs(1));
    p.r.core
        .channel_buffered(R_CLIENT, 45 * CELL_MEM_COST, since, p.now);
    assert_eq!(p.r.core.stats().mem_in_queues, 77 * CELL_MEM_COST);
    assert_eq!(p.r.core.stats().oom_circuits_killed, 0);
    // A report replaces the previous one: 70 cells' worth reaches the limit.
    p.r.core
        .channel_buffered(R_CLIENT, 70 * CELL_MEM_COST, since, p.now);
    let stats = p.r.core.stats();
    assert_eq!(stats.oom_channels_closed, 1);
    assert_eq!(stats.oom_circuits_killed, 1, "a went with its channel");
    assert_eq!(stats.oom_bytes_freed, (102 * CELL_MEM_COST) as u64);
    assert_eq!(stats.mem_in_queues, 0);
    assert!(matches!(
        p.r.core.poll_event(),
        Some(Event::CloseChannel { chan: R_CLIENT, .. })
    ));
    let (d, _) = deliver_to_x(&mut p);
    assert_eq!(d.len(), 1, "X hears that a is gone");
}

/// A young driver buffer is left alone while an older circuit can be killed; its bytes leave
/// the count when its channel closes.
#[test]
fn a_young_driver_buffer_is_kept_and_leaves_with_its_channel() {
    let mut p = Path::new(limit(100));
    let start = p.now;
    let mut a = p.create2();
    let mut b = p.create2();
    flood_at(&mut p, start, 1, &mut a, 16);
    flood_at(&mut p, start, 2, &mut b, 16);
    p.now = start + Duration::from_secs(3);
    p.r.core
        .channel_buffered(R_TO_X, 70 * CELL_MEM_COST, None, p.now);
    let stats = p.r.core.stats();
    assert_eq!(
        (stats.oom_circuits_killed, stats.oom_channels_closed),
        (1, 0)
    );
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(a.id, DestroyReason::RESOURCELIMIT)]
    );
    assert_eq!(stats.mem_in_queues, 86 * CELL_MEM_COST);
    assert!(p.r.core.poll_event().is_none(), "no channel closed");
    p.r.core.channel_closed(R_TO_X, p.now);
    assert_eq!(p.r.core.stats().mem_in_queues, 0);
    let _ = b;
}

/// A queue's buffer counts for what it can hold, not for the cells in it: a burst that drained
/// still counts until its buffer is released (the sweep, `QUEUE_RELEASE_AFTER` later). Over the
/// limit, the handler first gives back the room no cell uses (the drained buffer, and a buffer
/// far larger than its queue), and kills nobody when that is enough.
#[test]
fn queue_capacity_counts_and_the_handler_compacts_before_killing() {
    let mut p = Path::new(limit(100));
    let start = p.now;
    let mut a = p.create2();
    let mut b = p.create2();
    flood_at(&mut p, start, 1, &mut a, 64);
    deliver_to_x(&mut p);
    let stats = p.r.core.stats();
    assert_eq!(stats.queued_cells, 0);
    assert_eq!(
        stats.mem_in_queues,
        64 * CELL_MEM_COST,
        "a's drained 64-cell buffer still counts"
    );

    // b's burst doubles its buffer to 64 at its 33rd cell: 128 cells' room for 33 cells.
    flood_at(&mut p, start, 2, &mut b, 40);
    let stats = p.r.core.stats();
    assert_eq!(
        (stats.oom_circuits_killed, stats.circuits),
        (0, 2),
        "freeing a's empty buffer was enough"
    );
    assert_eq!(stats.oom_bytes_freed, (64 * CELL_MEM_COST) as u64);
    assert_eq!(stats.queued_cells, 40);
    assert_eq!(stats.mem_in_queues, 64 * CELL_MEM_COST);

    // b drains but for 2 cells (its buffer keeps 64), then a bursts again to 64: the handler
    // shrinks b's buffer to its 2 cells, again without a kill.
    p.now = start + Duration::from_secs(3);
    deliver_to_x(&mut p);
    flood_at(&mut p, start, 3, &mut b, 2);
    flood_at(&mut p, start, 4, &mut a, 64);
    let stats = p.r.core.stats();
    assert_eq!(stats.oom_circuits_killed, 0);
    assert_eq!(stats.queued_cells, 66);
    assert!(
        stats.queue_buffer_cells <= 64 + 4,
        "b's buffer shrank: {} cells' room",
        stats.queue_buffer_cells
    );
    assert!(destroys(&p.cells_for_client()).is_empty());

    // Drained and idle past the release delay: the sweep frees both buffers.
    deliver_to_x(&mut p);
    p.now = start + Duration::from_secs(10);
    p.r.core.handle_timeout(p.now);
    assert_eq!(p.r.core.stats().mem_in_queues, 0);
    assert!(p.x_answers(&mut a, 1));
    assert!(p.x_answers(&mut b, 2));
}
