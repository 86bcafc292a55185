//! Liveness of every scheduler under the core's usage pattern: a queue with
//! cells is never lost from the rotation, whatever the order of arrivals,
//! transmissions, drains and circuit closes. Drives each policy exactly as
//! `Core::poll_transmit` does (pick → pop → cell_sent → deactivate when empty).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chive_core::sched::{QueueId, SchedulerKind};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// `n` cells arrive at queue `q`.
    Arrive { q: u8, n: u8 },
    /// The channel can take `n` cells.
    Transmit { n: u8 },
    /// Queue `q`'s circuit closes.
    Close { q: u8 },
    /// Time passes.
    Wait { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, 1u8..20).prop_map(|(q, n)| Op::Arrive { q, n }),
        4 => (1u8..40).prop_map(|n| Op::Transmit { n }),
        1 => (0u8..12).prop_map(|q| Op::Close { q }),
        2 => (0u16..5000).prop_map(|ms| Op::Wait { ms }),
    ]
}

fn check(kind: SchedulerKind, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sched = kind.build();
    let mut queued: HashMap<u64, usize> = HashMap::new();
    // Ids are recycled after a close, as circuit keys are not, but queue ids of a
    // new circuit can collide with a forgotten one in spirit: use generations.
    let mut generation: HashMap<u8, u64> = HashMap::new();
    let id = |q: u8, g: u64| QueueId(((g << 8) | u64::from(q)) << 1 | 1);
    let mut now = Instant::now();
    let transmit = |sched: &mut Box<dyn chive_core::CircuitScheduler>,
                    queued: &mut HashMap<u64, usize>,
                    n: usize,
                    now: Instant|
     -> Result<(), TestCaseError> {
        for _ in 0..n {
            let total: usize = queued.values().sum();
            let Some(q) = sched.pick(now) else {
                prop_assert_eq!(total, 0, "{} lost a queue with cells", kind.label());
                return Ok(());
            };
            let left = queued.get_mut(&q.0);
            prop_assert!(
                left.as_ref().is_some_and(|l| **l > 0),
                "picked an empty or unknown queue"
            );
            let left = left.unwrap();
            *left -= 1;
            let empty = *left == 0;
            sched.cell_sent(q, now);
            if empty {
                queued.remove(&q.0);
                sched.deactivate(q);
            }
        }
        Ok(())
    };
    for op in ops {
        match *op {
            Op::Arrive { q, n } => {
                let g = *generation.entry(q).or_insert(0);
                let e = queued.entry(id(q, g).0).or_insert(0);
                if *e == 0 {
                    sched.activate(id(q, g), now);
                }
                *e += usize::from(n);
            }
            Op::Transmit { n } => transmit(&mut sched, &mut queued, usize::from(n), now)?,
            Op::Close { q } => {
                let g = generation.entry(q).or_insert(0);
                let qid = id(q, *g);
                queued.remove(&qid.0);
                sched.deactivate(qid);
                sched.forget(qid);
                *g += 1;
            }
            Op::Wait { ms } => now += Duration::from_millis(u64::from(ms)),
        }
    }
    // Drain: every remaining cell must come out.
    let total: usize = queued.values().sum();
    transmit(&mut sched, &mut queued, total, now)?;
    prop_assert!(
        queued.is_empty(),
        "{}: cells left after draining: {:?}",
        kind.label(),
        queued
    );
    prop_assert_eq!(sched.active_len(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn round_robin_never_loses_a_queue(ops in prop::collection::vec(op(), 1..300)) {
        check(SchedulerKind::RoundRobin, &ops)?;
    }

    #[test]
    fn ewma_never_loses_a_queue(ops in prop::collection::vec(op(), 1..300), h in 0.05f64..60.0) {
        check(SchedulerKind::Ewma { halflife: h }, &ops)?;
    }

    #[test]
    fn ewma_direct_never_loses_a_queue(ops in prop::collection::vec(op(), 1..200), h in 0.05f64..60.0) {
        check(SchedulerKind::EwmaDirect { halflife: h }, &ops)?;
    }
}
