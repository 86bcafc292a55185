//! Cost per scheduled cell of the circuit schedulers (issue 3): round-robin, EWMA (scale factor,
//! sorted ring + indexed heap) and EWMA-direct (decay everything, linear scan) at 10 … 10 000
//! active circuits.
//!
//! One iteration is the core's per-cell work in `poll_transmit`: `pick` → pop a real 514-byte
//! cell from that circuit's queue → push it into the channel's output `Vec` → `cell_sent` →
//! deactivate if the queue drained. Every 32 cells (one write event) the output is "written":
//! its cells arrive again at the queues they came from, activating queues that were empty, so
//! the number of queued cells stays constant. Group `sched`: `now` advances by 1 µs per cell
//! (worst case for EWMA: a fresh scale value per cell). Group `sched-cached-time`: `now` advances
//! by 32 µs once per write event, as the real driver reads the clock once per wake-up (the
//! paper's cached-time fix), so EWMA's scale value is computed once per batch.
//! The scheduler is used through `Box<dyn CircuitScheduler>`, as the core holds it.
//!
//! Run: `cargo bench -p chive-benches --bench sched`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, PAYLOAD_LEN};
use chive_core::sched::{CircuitScheduler, QueueId, SchedulerKind};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

mod common;

/// Cells per circuit queue at the start.
const DEPTH: usize = 4;
/// Cells per write event.
const WRITE_BATCH: usize = 32;

struct Channel {
    sched: Box<dyn CircuitScheduler>,
    queues: Vec<VecDeque<Cell>>,
    out: Vec<Cell>,
    out_from: Vec<usize>,
    start: Instant,
    micros: u64,
    /// Advance time once per write event instead of once per cell.
    cached_time: bool,
}

/// Queue ids shaped like the core's (circuit key << 1 | direction).
fn qid(i: usize) -> QueueId {
    QueueId((i as u64) << 1 | 1)
}

impl Channel {
    fn new(kind: SchedulerKind, circuits: usize, cached_time: bool) -> Channel {
        let start = Instant::now();
        let mut sched = kind.build();
        let mut queues = Vec::with_capacity(circuits);
        for i in 0..circuits {
            let mut q = VecDeque::with_capacity(DEPTH + 1);
            for j in 0..DEPTH {
                let mut payload = [0u8; PAYLOAD_LEN];
                payload[0] = j as u8;
                payload[1..9].copy_from_slice(&(i as u64).to_be_bytes());
                q.push_back(Cell::from_payload(
                    i as u32 + 1,
                    CellCommand::RELAY,
                    payload,
                ));
            }
            queues.push(q);
            sched.activate(qid(i), start);
        }
        let mut ch = Channel {
            sched,
            queues,
            out: Vec::with_capacity(WRITE_BATCH),
            out_from: Vec::with_capacity(WRITE_BATCH),
            start,
            micros: 0,
            cached_time,
        };
        // Warm up: every queue has sent and been refilled at least once (capped, so that
        // EWMA-direct at 10 000 circuits does not take minutes).
        for _ in 0..(circuits * DEPTH * 2).min(40_000) {
            ch.step();
        }
        ch
    }

    /// Schedule one cell.
    #[inline]
    fn step(&mut self) {
        if !self.cached_time {
            self.micros += 1;
        } else if self.out.is_empty() {
            self.micros += WRITE_BATCH as u64;
        }
        let now = self.start + Duration::from_micros(self.micros);
        let Some(q) = self.sched.pick(now) else {
            panic!("no active queue: the benchmark keeps cells queued");
        };
        let i = (q.0 >> 1) as usize;
        let queue = &mut self.queues[i];
        let Some(cell) = queue.pop_front() else {
            panic!("scheduler picked an empty queue");
        };
        let drained = queue.is_empty();
        self.out.push(cell);
        self.out_from.push(i);
        self.sched.cell_sent(q, now);
        if drained {
            self.sched.deactivate(q);
        }
        if self.out.len() >= WRITE_BATCH {
            self.write(now);
        }
    }

    /// The socket took the output: its cells arrive again at their queues.
    fn write(&mut self, now: Instant) {
        for (cell, i) in self.out.drain(..).zip(self.out_from.drain(..)) {
            let queue = &mut self.queues[i];
            black_box(&cell);
            queue.push_back(cell);
            if queue.len() == 1 {
                self.sched.activate(qid(i), now);
            }
        }
    }
}

fn bench_sched(c: &mut Criterion) {
    for (group_name, cached_time) in [("sched", false), ("sched-cached-time", true)] {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(1));
        for circuits in [10usize, 100, 1_000, 10_000] {
            for (name, kind) in common::SCHEDULERS {
                let mut ch = Channel::new(kind, circuits, cached_time);
                group.bench_with_input(BenchmarkId::new(name, circuits), &circuits, |b, _| {
                    b.iter(|| ch.step())
                });
                black_box(ch.out.len());
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = bench_sched
}
criterion_main!(benches);
