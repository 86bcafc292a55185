//! Heap per circuit, measured: this binary's global allocator counts the live bytes each thread
//! allocated ([`crate::alloc_count`]), and a core's heap is what dropping it frees. R (a guard or
//! middle: a circuit passing through) and X (the exit, one open stream per circuit) carry `N`
//! circuits; their heap minus that of the same cores with no circuits, over `N`, is the heap per
//! circuit. The bounds pin what the relay holds for an idle circuit and for one that carried a
//! burst and drained: a queue that emptied must not keep its buffer.
//!
//! Measured when written (session 12): relay 2353 B, exit 2836 B per idle circuit; before,
//! 7247 and 5585 (each queue kept a 4-cell buffer after its handshake cells left, and the
//! circuit map stored 2.3 KB circuits inline with its free slots), and a circuit that had
//! carried a 40-cell burst kept 32.5 KB more.

use std::time::Duration;

use chive_core::{Core, CoreConfig};

use crate::alloc_count::live_bytes;
use crate::common::Path;

/// Circuits per measurement: enough that a map's growth slack averages out.
const N: usize = 96;

/// Heap bytes a core frees when dropped (all of it: nothing in a core is shared).
fn heap_of(core: Core) -> usize {
    let before = live_bytes();
    drop(core);
    usize::try_from(before - live_bytes()).expect("dropping a core frees memory")
}

fn drain_events(p: &mut Path) {
    while p.r.core.poll_event().is_some() {}
    while p.x.core.poll_event().is_some() {}
}

/// (R's heap, X's heap) with `n` circuits (each with a stream); `burst` DROP cells per circuit
/// queued at R toward X and then carried (so each queue held cells and drained).
fn heaps(n: usize, burst: usize) -> (usize, usize) {
    let mut p = Path::new(CoreConfig::default());
    // One circuit first, so per-channel structures exist in both measurements.
    let mut circs = vec![p.circuit_with_stream().0];
    for _ in 0..n {
        circs.push(p.circuit_with_stream().0);
    }
    if burst > 0 {
        for c in circs.iter_mut() {
            p.flood_x(c, burst);
        }
        p.r_to_x();
    }
    // Past the queue sweep: emptied queues that grew give their buffers back.
    p.now += Duration::from_secs(2);
    p.r.core.handle_timeout(p.now);
    p.x.core.handle_timeout(p.now);
    drain_events(&mut p);
    let Path { r, x, .. } = p;
    (heap_of(r.core), heap_of(x.core))
}

#[test]
fn heap_per_idle_circuit_is_bounded() {
    let (r0, x0) = heaps(0, 0);
    let (r, x) = heaps(N, 0);
    let per_r = (r - r0) / N;
    let per_x = (x - x0) / N;
    eprintln!("heap per idle circuit: relay {per_r} B, exit {per_x} B (N = {N})");
    assert!(per_r <= 2_600, "relay holds {per_r} B per idle circuit");
    assert!(
        per_x <= 3_100,
        "exit holds {per_x} B per idle circuit with a stream"
    );
}

#[test]
fn a_drained_queue_gives_its_buffer_back() {
    let (r0, _) = heaps(N, 0);
    let (r, _) = heaps(N, 40);
    let per = (r.saturating_sub(r0)) / N;
    eprintln!("heap per circuit after a 40-cell burst drained: relay +{per} B over idle");
    assert!(
        per <= 256,
        "a drained circuit keeps {per} B more than an idle one"
    );
}
