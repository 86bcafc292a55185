//! Late wake-ups on a virtual clock: two bulk channels under one write rate, writers that pay
//! from a shared token bucket as soon as it allows, and reports (paid, written) that reach the
//! send path `L` late. With the fixed 10 ms bound the goodput collapses to bound / L; with the
//! bound stretched by the measured latency it stays near the rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, CELL_LEN, PAYLOAD_LEN};

use super::*;
use crate::bucket::{Draw, TokenBucketState};

/// Channels with endless bulk cells (no ranking, no samples).
struct Bulk;

impl CellSource for Bulk {
    fn has_pending(&self, _chan: ChannelId) -> bool {
        true
    }

    fn channel_priority(&self, _chan: ChannelId, _now: Instant) -> Option<f64> {
        None
    }

    fn ranks_circuits(&self) -> bool {
        false
    }

    fn poll_transmit(
        &mut self,
        _chan: ChannelId,
        max: usize,
        _now: Instant,
        out: &mut Vec<u8>,
    ) -> usize {
        for _ in 0..max {
            Cell {
                circ_id: 1,
                command: CellCommand::RELAY,
                payload: [0; PAYLOAD_LEN],
            }
            .encode_into(out);
        }
        max
    }

    fn poll_cell_sample(&mut self) -> Option<CellSample> {
        None
    }
}

const RATE: u64 = 500_000;
/// The relay's default at 500 kB/s: 10 ms of the rate.
const BASE: usize = (RATE / 100) as usize / CELL_LEN;
const TICK: Duration = Duration::from_micros(250);
const WARMUP: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(6);
const CHANS: [ChannelId; 2] = [ChannelId(1), ChannelId(2)];

/// How late each report arrives.
#[derive(Clone, Copy, Debug)]
enum Lateness {
    /// Always this late.
    Fixed(Duration),
    /// Exponentially distributed with this mean (most reports early, some very late).
    Exponential(Duration),
}

/// A report on its way to the send path.
struct Report {
    due: Instant,
    conn: ConnId,
    cells: usize,
    paid_at: Instant,
}

/// The share of the rate the two channels' writers paid for after the warm-up, and the bound
/// in force at the end.
fn goodput_share(kind: ChannelSchedulerKind, late: Lateness, outbuf_max: Duration) -> (f64, usize) {
    let t0 = Instant::now();
    let mut bucket = TokenBucketState::new(RATE, RATE, t0);
    // Start empty, as under saturation.
    assert!(bucket.try_take(RATE as usize, Draw::Quiet, t0).is_ok());
    let cfg = SendConfig {
        outbuf_cells: BASE,
        write_rate: RATE,
        outbuf_max,
        paced: true,
        kind,
        quiet_reserve: 0,
        channel_fair_halflife: None,
    };
    let mut p = SendPath::new(cfg);
    let mut src = Bulk;
    for c in CHANS {
        p.add_channel(c);
    }
    let mut writers: Vec<VecDeque<usize>> = vec![VecDeque::new(); CHANS.len()];
    let mut reports: Vec<VecDeque<Report>> = (0..CHANS.len()).map(|_| VecDeque::new()).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut paid = 0usize;
    let take = |p: &mut SendPath, writers: &mut Vec<VecDeque<usize>>| {
        while let Some(t) = p.poll_transmit() {
            let i = CHANS
                .iter()
                .position(|c| *c == t.conn)
                .expect("known connection");
            writers[i].push_back(t.cells);
        }
    };
    for c in CHANS {
        p.channel_ready(c, &mut src, t0);
    }
    take(&mut p, &mut writers);
    let mut now = t0;
    let mut tick = 0u64;
    while now < t0 + RUN {
        now += TICK;
        // Reports due, each connection's in order.
        for (i, q) in reports.iter_mut().enumerate() {
            while q.front().is_some_and(|r| r.due <= now) {
                let Some(r) = q.pop_front() else { break };
                p.paid_report(r.conn, r.cells, now - r.paid_at, &mut src, now);
                p.written(CHANS[i], r.cells, &mut src, now);
                take(&mut p, &mut writers);
            }
        }
        // Whatever the latency, the cells handed over stay under the cap (200 ms of the rate).
        let in_flight: usize = CHANS.iter().map(|c| p.in_flight(*c)).sum();
        assert!(in_flight <= 2 * 195, "{in_flight} cells in flight");
        // Writers pay first come, first served (they take turns at who asks first).
        tick += 1;
        for k in 0..CHANS.len() {
            let i = (k + tick as usize) % CHANS.len();
            while let Some(&n) = writers[i].front() {
                if bucket.try_take(n * CELL_LEN, Draw::Quiet, now).is_err() {
                    break;
                }
                writers[i].pop_front();
                if now >= t0 + WARMUP {
                    paid += n;
                }
                let lag = match late {
                    Lateness::Fixed(d) => d,
                    Lateness::Exponential(mean) => {
                        // xorshift64*: deterministic.
                        rng ^= rng >> 12;
                        rng ^= rng << 25;
                        rng ^= rng >> 27;
                        let u = (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64
                            / (1u64 << 53) as f64;
                        mean.mul_f64(-(1.0 - u).ln())
                    }
                };
                let last = reports[i].back().map_or(now, |r| r.due);
                reports[i].push_back(Report {
                    due: (now + lag).max(last),
                    conn: CHANS[i],
                    cells: n,
                    paid_at: now,
                });
            }
        }
    }
    let share = (paid * CELL_LEN) as f64 / (RATE as f64 * (RUN - WARMUP).as_secs_f64());
    (share, p.outbuf())
}

const MS: Duration = Duration::from_millis(1);

fn table(kind: ChannelSchedulerKind) -> Vec<(String, f64, f64, usize)> {
    let mut rows = Vec::new();
    for ms in [0u32, 5, 20, 50] {
        for late in [Lateness::Fixed(ms * MS), Lateness::Exponential(ms * MS)] {
            if ms == 0 && matches!(late, Lateness::Exponential(_)) {
                continue;
            }
            let (fixed, _) = goodput_share(kind, late, Duration::ZERO);
            let (stretched, bound) = goodput_share(kind, late, DEFAULT_OUTBUF_MAX);
            println!(
                "{kind:?} {late:?}: fixed bound {fixed:.3}, stretched {stretched:.3} (bound {bound} cells)"
            );
            rows.push((format!("{late:?}"), fixed, stretched, bound));
        }
    }
    rows
}

/// `collapsed`: the fixed bound's share at 50 ms must be below it (SharedRate: 9 cells per
/// report round trip over both channels; Direct: 9 per channel).
fn check(rows: &[(String, f64, f64, usize)], collapsed: f64) {
    // On time, both keep the rate.
    let (_, fixed0, stretched0, bound0) = &rows[0];
    assert!(*fixed0 > 0.97 && *stretched0 > 0.97, "{rows:?}");
    assert_eq!(*bound0, BASE, "no latency, no stretch");
    for (late, fixed, stretched, bound) in rows {
        assert!(
            *bound <= 195,
            "capped at 200 ms of the rate: {late} {bound}"
        );
        assert!(
            *stretched >= 0.93,
            "the stretched bound keeps the rate: {late} {stretched:.3}"
        );
        assert!(
            stretched + 0.01 >= *fixed,
            "{late}: {stretched:.3} < {fixed:.3}"
        );
    }
    let (late, fixed50, _, _) = rows.iter().find(|r| r.0 == "Fixed(50ms)").expect("row");
    assert!(*fixed50 < collapsed, "{late}: {fixed50:.3}");
}

#[test]
fn shared_rate_keeps_the_rate_when_reports_come_late() {
    check(&table(ChannelSchedulerKind::SharedRate), 0.25);
}

#[test]
fn direct_paced_keeps_the_rate_when_reports_come_late() {
    check(&table(ChannelSchedulerKind::Direct), 0.5);
}

#[test]
fn the_bound_comes_back_down_when_reports_are_on_time_again() {
    let t0 = Instant::now();
    let cfg = SendConfig {
        outbuf_cells: BASE,
        write_rate: RATE,
        outbuf_max: DEFAULT_OUTBUF_MAX,
        paced: true,
        kind: ChannelSchedulerKind::SharedRate,
        quiet_reserve: 0,
        channel_fair_halflife: None,
    };
    let mut p = SendPath::new(cfg);
    let mut src = Bulk;
    p.add_channel(CHANS[0]);
    for i in 0..50u32 {
        let now = t0 + i * 100 * MS;
        p.paid_report(CHANS[0], 0, 40 * MS, &mut src, now);
    }
    assert!(p.outbuf() > 3 * BASE, "{}", p.outbuf());
    for i in 50..150u32 {
        let now = t0 + i * 100 * MS;
        p.paid_report(CHANS[0], 0, Duration::ZERO, &mut src, now);
    }
    assert_eq!(p.outbuf(), BASE);
    // Unpaced (no write rate): never stretched.
    let mut q = SendPath::new(SendConfig::default());
    q.add_channel(CHANS[0]);
    let now = t0;
    q.paid_report(CHANS[0], 0, 500 * MS, &mut src, now);
    assert_eq!(q.outbuf(), SendConfig::default().outbuf_cells);
}
