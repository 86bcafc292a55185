//! Several circuits on one simulated bottleneck, on a virtual clock (test support).
//!
//! The torperf setting of paper 004: backlogged circuits (the background downloads) share a
//! FIFO bottleneck with circuits that fetch a file, pause, and fetch again. Each circuit edge
//! packages whenever its [`CircuitWindow`] allows and it has data; cells of all circuits
//! leave the bottleneck in the order they were sent, `rate` cells per second, then take
//! `one_way` to the receiver, whose SENDME for every 100th cell takes `one_way` back. A fetch
//! starts at the client with a BEGIN (`one_way` to the edge), whose CONNECTED (one cell, through
//! the bottleneck) lets the client send the request (`one_way` again); the fetch time runs
//! from the BEGIN to the last cell's arrival (torperf's time to last byte on an open circuit).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::flow::{CircuitWindow, CIRCUIT_SENDME_INCREMENT};

/// What a circuit's edge has to send.
#[derive(Clone, Copy, Debug)]
pub(super) enum Load {
    /// Always more (a large download).
    Backlogged,
    /// `cells` per fetch, then a pause of `pause` after the last cell arrived, from `start`;
    /// with `fresh` every fetch on a new circuit (a new window from `CcKind`'s policy).
    Fetches {
        cells: u64,
        pause: Duration,
        start: Duration,
        fresh: Option<super::CcKind>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Event {
    /// SENDME for the flow's cell number `n` arrives at its edge.
    Sendme { flow: usize, n: u64 },
    /// A fetch's request reaches the edge: `cells` more to send.
    Request { flow: usize },
    /// The client opens a stream for the next fetch (a BEGIN to the edge).
    Ask { flow: usize },
    /// The BEGIN reaches the edge, which answers CONNECTED (one cell through the queue).
    Begin { flow: usize },
    /// The CONNECTED reaches the client, which sends the request.
    Connected { flow: usize },
}

/// What one run measured.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Per flow: the fetch times (request to last cell), for `Fetches` flows.
    pub fetch_times: Vec<Vec<Duration>>,
    /// Per flow: cells delivered before the end.
    pub delivered: Vec<u64>,
    /// Queueing delay of every cell that entered the bottleneck (time waiting for service).
    pub queue_delays: Vec<Duration>,
    /// After every SENDME: when, which flow, its window then.
    pub cwnds: Vec<(Duration, usize, u32)>,
}

struct Flow {
    window: CircuitWindow,
    load: Load,
    sent: u64,
    /// Cells the edge may still send (for `Fetches`).
    pending: u64,
    /// When the current fetch was asked for.
    asked: Duration,
}

fn digest(flow: usize, n: u64) -> [u8; 20] {
    let mut d = [0u8; 20];
    d[..8].copy_from_slice(&n.to_be_bytes());
    d[8..16].copy_from_slice(&(flow as u64).to_be_bytes());
    d
}

/// Run `flows` (a window and a load each) over one bottleneck of `rate` cells/s with
/// `one_way` delay for `duration`.
pub(super) fn run(
    flows: Vec<(CircuitWindow, Load)>,
    rate: f64,
    one_way: Duration,
    duration: Duration,
) -> Outcome {
    let base = Instant::now();
    let service = Duration::from_secs_f64(1.0 / rate);
    let mut events: BinaryHeap<Reverse<(Duration, Event)>> = BinaryHeap::new();
    let mut fl: Vec<Flow> = flows
        .into_iter()
        .enumerate()
        .map(|(i, (window, load))| {
            if let Load::Fetches { start, .. } = load {
                events.push(Reverse((start, Event::Ask { flow: i })));
            }
            Flow {
                window,
                load,
                sent: 0,
                pending: 0,
                asked: Duration::ZERO,
            }
        })
        .collect();
    let mut out = Outcome {
        fetch_times: vec![Vec::new(); fl.len()],
        delivered: vec![0; fl.len()],
        queue_delays: Vec::new(),
        cwnds: Vec::new(),
    };
    let mut bottleneck_free = Duration::ZERO;
    let mut now = Duration::ZERO;
    loop {
        // Every edge packages what its window and its data allow, in flow order.
        for (i, f) in fl.iter_mut().enumerate() {
            loop {
                let has_data = match f.load {
                    Load::Backlogged => true,
                    Load::Fetches { .. } => f.pending > 0,
                };
                if !has_data || !f.window.can_package() {
                    break;
                }
                f.sent += 1;
                f.window.on_data_sent(digest(i, f.sent), base + now);
                let start = bottleneck_free.max(now);
                out.queue_delays.push(start - now);
                bottleneck_free = start + service;
                let arrives = bottleneck_free + one_way;
                if arrives <= duration {
                    out.delivered[i] += 1;
                }
                if f.sent.is_multiple_of(u64::from(CIRCUIT_SENDME_INCREMENT)) {
                    events.push(Reverse((
                        arrives + one_way,
                        Event::Sendme { flow: i, n: f.sent },
                    )));
                }
                if let Load::Fetches { pause, .. } = f.load {
                    f.pending -= 1;
                    if f.pending == 0 {
                        out.fetch_times[i].push(arrives - f.asked);
                        events.push(Reverse((arrives + pause, Event::Ask { flow: i })));
                    }
                }
            }
        }
        let Some(Reverse((at, ev))) = events.pop() else {
            return out;
        };
        if at > duration {
            // Fetches still running at the end are not counted.
            return out;
        }
        now = at;
        match ev {
            Event::Sendme { flow, n } => {
                fl[flow]
                    .window
                    .on_sendme(Some(digest(flow, n)), base + now)
                    .expect("the simulated receiver echoes the right digest");
                out.cwnds.push((now, flow, fl[flow].window.cwnd()));
            }
            Event::Ask { flow } => {
                fl[flow].asked = now;
                if let Load::Fetches {
                    fresh: Some(kind), ..
                } = fl[flow].load
                {
                    fl[flow].window = CircuitWindow::with_policy(kind.build(1000));
                    fl[flow].sent = 0;
                }
                events.push(Reverse((now + one_way, Event::Begin { flow })));
            }
            Event::Begin { flow } => {
                let start = bottleneck_free.max(now);
                out.queue_delays.push(start - now);
                bottleneck_free = start + service;
                events.push(Reverse((
                    bottleneck_free + one_way,
                    Event::Connected { flow },
                )));
            }
            Event::Connected { flow } => {
                events.push(Reverse((now + one_way, Event::Request { flow })));
            }
            Event::Request { flow } => {
                if let Load::Fetches { cells, .. } = fl[flow].load {
                    fl[flow].pending = cells;
                }
            }
        }
    }
}

/// The median of `v` (which must not be empty).
pub(super) fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[s.len() / 2]
}

/// The `q` quantile (0..=1) of `v` (which must not be empty).
pub(super) fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * q).round() as usize]
}
