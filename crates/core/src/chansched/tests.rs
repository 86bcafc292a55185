//! The send path on a virtual clock, against a fake core whose channels hold queues of cells
//! with a priority each.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, CELL_LEN, PAYLOAD_LEN};

use super::*;
use crate::CircKey;

/// A core stand-in: each channel holds cells, each with the priority its circuit has while it
/// is at the head (`None` = the policy does not rank).
#[derive(Default)]
struct FakeCore {
    queues: HashMap<ChannelId, VecDeque<Option<f64>>>,
    ranks: bool,
    /// Channels in the order their cells left, one entry per cell.
    sent: Vec<ChannelId>,
    samples: VecDeque<CellSample>,
}

impl FakeCore {
    fn ranking() -> Self {
        FakeCore {
            ranks: true,
            ..FakeCore::default()
        }
    }

    fn push(&mut self, chan: ChannelId, cells: usize, priority: Option<f64>) {
        let q = self.queues.entry(chan).or_default();
        for _ in 0..cells {
            q.push_back(priority);
        }
    }

    fn queued(&self, chan: ChannelId) -> usize {
        self.queues.get(&chan).map_or(0, VecDeque::len)
    }
}

impl CellSource for FakeCore {
    fn has_pending(&self, chan: ChannelId) -> bool {
        self.queued(chan) > 0
    }

    fn channel_priority(&self, chan: ChannelId, _now: Instant) -> Option<f64> {
        self.queues.get(&chan)?.front().copied().flatten()
    }

    fn ranks_circuits(&self) -> bool {
        self.ranks
    }

    fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> usize {
        let Some(q) = self.queues.get_mut(&chan) else {
            return 0;
        };
        let mut n = 0;
        while n < max && q.pop_front().is_some() {
            // Every cell is sampled, so batches can be told apart when written.
            self.samples.push_back(CellSample {
                chan,
                circ: CircKey(self.sent.len() as u64),
                queued: now,
                dequeued: now,
                batch_index: out.len() / CELL_LEN,
            });
            Cell {
                circ_id: 1,
                command: CellCommand::RELAY,
                payload: [0; PAYLOAD_LEN],
            }
            .encode_into(out);
            self.sent.push(chan);
            n += 1;
        }
        n
    }

    fn poll_cell_sample(&mut self) -> Option<CellSample> {
        self.samples.pop_front()
    }
}

const A: ChannelId = ChannelId(1);
const B: ChannelId = ChannelId(2);
const C: ChannelId = ChannelId(3);
const D: ChannelId = ChannelId(4);
const OUTBUF: usize = 10;

fn shared(reserve: u64) -> SendConfig {
    SendConfig {
        outbuf_cells: OUTBUF,
        write_rate: 0,
        outbuf_max: Duration::ZERO,
        paced: true,
        kind: ChannelSchedulerKind::SharedRate,
        quiet_reserve: reserve,
        channel_fair_halflife: None,
    }
}

fn direct() -> SendConfig {
    SendConfig {
        outbuf_cells: OUTBUF,
        write_rate: 0,
        outbuf_max: Duration::ZERO,
        paced: false,
        kind: ChannelSchedulerKind::Direct,
        quiet_reserve: 0,
        channel_fair_halflife: None,
    }
}

/// A send path with channels `chans`, each on its own connection.
fn path(cfg: SendConfig, chans: &[ChannelId]) -> SendPath {
    let mut p = SendPath::new(cfg);
    for &c in chans {
        p.add_channel(c);
    }
    p
}

/// The batches decided so far: (channel, connection, cells, class).
fn drain(p: &mut SendPath) -> Vec<(ChannelId, ConnId, usize, BatchClass)> {
    std::iter::from_fn(|| p.poll_transmit())
        .map(|t| {
            assert_eq!(t.bytes.len(), t.cells * CELL_LEN);
            (t.chan, t.conn, t.cells, t.class)
        })
        .collect()
}

fn total_unpaid(p: &SendPath, chans: &[ChannelId]) -> usize {
    chans.iter().map(|c| p.unpaid(*c)).sum()
}

#[test]
fn kind_follows_cross_channel_and_rate() {
    use ChannelSchedulerKind::*;
    assert_eq!(ChannelSchedulerKind::for_rate(true, 1_000), SharedRate);
    assert_eq!(ChannelSchedulerKind::for_rate(true, 0), Direct);
    assert_eq!(ChannelSchedulerKind::for_rate(false, 1_000), Direct);
    assert_eq!(SharedRate.build().name(), "shared-rate");
    assert_eq!(Direct.build().name(), "direct");
}

#[test]
fn direct_fills_each_connection_to_outbuf_and_refills_on_written() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let mut p = path(direct(), &[A, B]);
    core.push(A, 25, None);
    core.push(B, 3, None);
    p.channel_ready(A, &mut core, now);
    p.channel_ready(B, &mut core, now);
    assert_eq!(
        drain(&mut p),
        vec![
            (A, A, OUTBUF, BatchClass::Unranked),
            (B, B, 3, BatchClass::Unranked)
        ]
    );
    assert_eq!(p.in_flight(A), OUTBUF);
    // Unpaced: nothing is counted as unpaid.
    assert_eq!(p.unpaid(A), 0);
    // Full: asking again sends nothing.
    p.channel_ready(A, &mut core, now);
    assert!(drain(&mut p).is_empty());
    // A written batch makes room and sends the next one.
    let samples = p
        .written(A, OUTBUF, &mut core, now)
        .expect("known connection");
    assert_eq!(samples.len(), OUTBUF);
    assert_eq!(drain(&mut p), vec![(A, A, OUTBUF, BatchClass::Unranked)]);
    assert_eq!(core.queued(A), 5);
    // Reports for unknown connections are ignored.
    assert!(p.written(ChannelId(99), 1, &mut core, now).is_none());
}

/// A batch says whether its cells were counted unpaid, so that its writer pays and reports
/// exactly those: batches made while paced stay paced after the send path stops pacing (an
/// unlimited rate, SIGHUP), and their reports still clear what they counted.
#[test]
fn a_batch_carries_whether_it_was_counted_unpaid() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let paced = SendConfig {
        kind: ChannelSchedulerKind::Direct,
        ..shared(0)
    };
    let mut p = path(paced, &[A]);
    core.push(A, 2 * OUTBUF, None);
    p.channel_ready(A, &mut core, now);
    let first: Vec<Transmit> = std::iter::from_fn(|| p.poll_transmit()).collect();
    assert_eq!(first.len(), 1);
    assert!(first[0].paced);
    assert_eq!(p.unpaid(A), OUTBUF);

    p.set_config(direct(), &mut core, now);
    p.written(A, OUTBUF, &mut core, now)
        .expect("known connection");
    let second: Vec<Transmit> = std::iter::from_fn(|| p.poll_transmit()).collect();
    assert_eq!(second.len(), 1);
    assert!(!second[0].paced, "made while unpaced");
    // Only the first batch's cells are unpaid; its report clears them.
    assert_eq!(p.unpaid(A), OUTBUF);
    p.paid(A, first[0].cells, &mut core, now);
    assert_eq!(p.unpaid(A), 0);
}

#[test]
fn blocked_episodes_are_counted_once_each() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let mut p = path(direct(), &[A]);
    core.push(A, 100, None);
    p.channel_ready(A, &mut core, now);
    for _ in 0..5 {
        p.channel_ready(A, &mut core, now);
    }
    assert!(p.blocked(A));
    assert_eq!(p.stats().outbuf_full_events, 1);
    // Room appears (the episode ends), then the connection fills and blocks again.
    p.written(A, OUTBUF, &mut core, now);
    assert!(!p.blocked(A));
    p.channel_ready(A, &mut core, now);
    assert_eq!(p.stats().outbuf_full_events, 2);
    // A full connection with nothing waiting is not blocked.
    let mut idle = FakeCore::default();
    let mut q = path(direct(), &[B]);
    idle.push(B, OUTBUF, None);
    q.channel_ready(B, &mut idle, now);
    q.channel_ready(B, &mut idle, now);
    assert_eq!(q.stats().outbuf_full_events, 0);
}

#[test]
fn shared_rate_respects_one_bound_over_all_connections() {
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    let chans = [A, B, C];
    let mut p = path(shared(0), &chans);
    for c in chans {
        core.push(c, 100, Some(5.0));
        p.channel_ready(c, &mut core, now);
    }
    let batches = drain(&mut p);
    assert_eq!(batches.iter().map(|b| b.2).sum::<usize>(), OUTBUF);
    assert!(batches.iter().all(|b| b.3 == BatchClass::Bulk));
    assert_eq!(total_unpaid(&p, &chans), OUTBUF);
    assert_eq!(p.waiting().len(), 3);
    // Paying for a batch frees budget for exactly that many cells.
    let (first, _, n, _) = batches[0];
    p.paid(first, n, &mut core, now);
    assert_eq!(drain(&mut p).iter().map(|b| b.2).sum::<usize>(), n);
    assert_eq!(total_unpaid(&p, &chans), OUTBUF);
}

#[test]
fn room_goes_to_the_most_deserving_channel_a_half_buffer_at_a_time() {
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    let mut p = path(shared(0), &[A, B, C]);
    // C fills the shared bound with bulk.
    core.push(C, 100, Some(500.0));
    p.channel_ready(C, &mut core, now);
    assert_eq!(
        drain(&mut p),
        vec![(C, C, 5, BatchClass::Bulk), (C, C, 5, BatchClass::Bulk)]
    );
    // A (busy) then B (fresh circuit) arrive while there is no room.
    core.push(A, 100, Some(50.0));
    core.push(B, 3, Some(1.0));
    p.channel_ready(A, &mut core, now);
    p.channel_ready(B, &mut core, now);
    assert!(drain(&mut p).is_empty());
    assert_eq!(p.waiting(), vec![C, A, B]);
    // Half a buffer is paid: B goes first although it arrived last, then A; C waits.
    p.paid(C, 5, &mut core, now);
    assert_eq!(
        drain(&mut p),
        vec![(B, B, 3, BatchClass::Bulk), (A, A, 2, BatchClass::Bulk)]
    );
    assert_eq!(p.waiting(), vec![C, A]);
}

#[test]
fn equals_take_turns() {
    let now = Instant::now();
    let mut core = FakeCore::default(); // round-robin circuits: no priorities, no quiet batches
    let mut p = path(shared(1_000_000), &[A, B, C, D]);
    // D fills the bound; A, B and C then wait, in that order.
    core.push(D, OUTBUF, None);
    p.channel_ready(D, &mut core, now);
    for c in [A, B, C] {
        core.push(c, 100, None);
        p.channel_ready(c, &mut core, now);
    }
    assert_eq!(drain(&mut p).len(), 2);
    assert_eq!(p.waiting(), vec![A, B, C]);
    // Each paid half-buffer goes to the next in turn; a channel that sent goes to the back.
    let mut order = Vec::new();
    for payer in [D, D, A, B, C] {
        p.paid(payer, OUTBUF / 2, &mut core, now);
        for (chan, _, n, class) in drain(&mut p) {
            assert_eq!((n, class), (OUTBUF / 2, BatchClass::Bulk));
            order.push(chan);
        }
    }
    assert_eq!(order, vec![A, B, C, A, B]);
}

#[test]
fn quiet_batches_bypass_the_bound_but_stay_under_twice_it() {
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    // Reserve of 20 cells: circuits with a count below 20 are quiet.
    let reserve = 20 * CELL_LEN as u64;
    let chans = [A, B, C, D];
    let mut p = path(shared(reserve), &chans);
    core.push(A, 1000, Some(900.0));
    p.channel_ready(A, &mut core, now);
    assert_eq!(total_unpaid(&p, &chans), OUTBUF);
    // Quiet B goes at once, outside the full bulk bound.
    core.push(B, 4, Some(3.0));
    p.channel_ready(B, &mut core, now);
    let below = 20.0;
    assert_eq!(drain(&mut p)[2..], [(B, B, 4, BatchClass::Quiet { below })]);
    // Quiet channels together stop at twice the bound.
    core.push(C, 100, Some(3.0));
    core.push(D, 100, Some(3.0));
    p.channel_ready(C, &mut core, now);
    p.channel_ready(D, &mut core, now);
    assert_eq!(drain(&mut p), vec![(C, C, 6, BatchClass::Quiet { below })]);
    assert_eq!(total_unpaid(&p, &chans), 2 * OUTBUF);
    assert_eq!(p.stats().quiet_cells, 10);
}

#[test]
fn a_quiet_batch_ends_where_the_channel_turns_to_bulk() {
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    let mut p = path(shared(20 * CELL_LEN as u64), &[A]);
    core.push(A, 3, Some(2.0));
    core.push(A, 50, Some(400.0));
    p.channel_ready(A, &mut core, now);
    let below = 20.0;
    assert_eq!(
        drain(&mut p),
        vec![
            (A, A, 3, BatchClass::Quiet { below }),
            // The rest is bulk, within what the bound has left.
            (A, A, 5, BatchClass::Bulk),
            (A, A, 2, BatchClass::Bulk),
        ]
    );
}

#[test]
fn a_bulk_batch_is_promoted_while_a_quiet_one_waits_behind_it() {
    let quiet = BatchClass::Quiet { below: 20.0 };
    assert!(quiet.may_spend_reserve(1));
    assert!(BatchClass::Unranked.may_spend_reserve(0));
    assert!(!BatchClass::Bulk.may_spend_reserve(0));
    assert!(BatchClass::Bulk.may_spend_reserve(1));
    // On one connection: bulk, then a quiet batch; the writer counts the quiet one as queued
    // from the moment it is handed over, so the bulk batch ahead of it is promoted.
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    let mut p = path(shared(20 * CELL_LEN as u64), &[A]);
    core.push(A, 4, Some(300.0));
    p.channel_ready(A, &mut core, now);
    core.push(A, 2, Some(1.0));
    p.channel_ready(A, &mut core, now);
    let classes: Vec<BatchClass> = drain(&mut p).iter().map(|b| b.3).collect();
    assert_eq!(classes, vec![BatchClass::Bulk, quiet]);
    let queued = classes
        .iter()
        .filter(|c| matches!(c, BatchClass::Quiet { .. }))
        .count();
    assert!(classes[0].may_spend_reserve(queued));
}

#[test]
fn round_robin_circuits_get_no_quiet_batches() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let mut p = path(shared(20 * CELL_LEN as u64), &[A]);
    core.push(A, 3, None);
    p.channel_ready(A, &mut core, now);
    assert_eq!(drain(&mut p), vec![(A, A, 3, BatchClass::Bulk)]);
}

#[test]
fn a_split_channel_writes_on_its_second_connection() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let mut p = path(direct(), &[A]);
    core.push(A, 100, None);
    p.channel_ready(A, &mut core, now);
    let second = ChannelId(77);
    p.attach_conn(A, second);
    assert_eq!(p.channel_of(second), Some(A));
    p.channel_ready(A, &mut core, now);
    assert_eq!(
        drain(&mut p),
        vec![
            (A, A, OUTBUF, BatchClass::Unranked),
            (A, second, OUTBUF, BatchClass::Unranked)
        ]
    );
    assert_eq!(p.in_flight(A), 2 * OUTBUF);
    // The second connection fails: its cells no longer count, writing goes back to the first
    // (full until its batch is written).
    p.detach_conn(second);
    assert_eq!(p.channel_of(second), None);
    assert_eq!(p.in_flight(A), OUTBUF);
    p.channel_ready(A, &mut core, now);
    assert!(drain(&mut p).is_empty());
    p.written(A, OUTBUF, &mut core, now);
    assert_eq!(drain(&mut p), vec![(A, A, OUTBUF, BatchClass::Unranked)]);
    // A channel's first connection is not detached on its own.
    p.detach_conn(A);
    assert_eq!(p.channel_of(A), Some(A));
}

/// Channels A and B under the shared policy, 100 cells each queued with equal priority, both
/// ready and their first batches taken: the shared room is in flight.
fn a_and_b_sharing_the_room() -> (Instant, FakeCore, SendPath) {
    let now = Instant::now();
    let mut core = FakeCore::ranking();
    let mut p = path(shared(0), &[A, B]);
    core.push(A, 100, Some(5.0));
    core.push(B, 100, Some(5.0));
    p.channel_ready(A, &mut core, now);
    p.channel_ready(B, &mut core, now);
    drain(&mut p);
    (now, core, p)
}

#[test]
fn a_lost_connection_frees_shared_room_at_settle() {
    let (now, mut core, mut p) = a_and_b_sharing_the_room();
    // A closes with its cells unpaid: B gets the room when the driver settles.
    p.remove_channel(A);
    assert_eq!(p.waiting(), vec![B]);
    p.settle(&mut core, now);
    let sent: usize = drain(&mut p).iter().map(|b| b.2).sum();
    assert_eq!(total_unpaid(&p, &[A, B]), OUTBUF);
    assert!(sent > 0);
    // Its late reports are ignored.
    p.paid(A, 5, &mut core, now);
    assert!(drain(&mut p).is_empty());
}

#[test]
fn switching_policy_keeps_waiting_channels_moving() {
    let (now, mut core, mut p) = a_and_b_sharing_the_room();
    // B has nothing in flight; without the hand-over no Written would ever wake it.
    assert_eq!(p.in_flight(B), 0);
    p.set_config(direct(), &mut core, now);
    assert_eq!(p.policy_name(), "direct");
    assert_eq!(drain(&mut p), vec![(B, B, OUTBUF, BatchClass::Unranked)]);
}

/// Whatever peers do (cells arriving on any channel at any rate, writers slow to pay or write,
/// connections coming and going), cells held by writers stay bounded: `OutbufCells` unpaid
/// bulk, twice that with quiet batches, over all connections and on each.
#[test]
fn memory_stays_bounded_under_any_sequence() {
    let t0 = Instant::now();
    let chans = [A, B, C, D];
    for reserve in [0, 20 * CELL_LEN as u64] {
        let mut core = FakeCore::ranking();
        let mut p = path(shared(reserve), &chans);
        // Batches handed out and not yet paid / written, per connection, oldest first.
        let mut unpaid: HashMap<ConnId, VecDeque<usize>> = HashMap::new();
        let mut unwritten: HashMap<ConnId, VecDeque<usize>> = HashMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for step in 0..20_000u32 {
            let now = t0 + std::time::Duration::from_micros(step as u64 * 100);
            let chan = chans[next(4) as usize];
            match next(4) {
                0 => {
                    let prio = if next(3) == 0 { 1.0 } else { 1000.0 };
                    core.push(chan, next(200) as usize, Some(prio));
                    p.channel_ready(chan, &mut core, now);
                }
                1 => {
                    if let Some(n) = unpaid.get_mut(&chan).and_then(VecDeque::pop_front) {
                        p.paid(chan, n, &mut core, now);
                    }
                }
                2 => {
                    // Written only once paid, as a paced writer does.
                    let paid = unwritten.get(&chan).map_or(0, VecDeque::len)
                        > unpaid.get(&chan).map_or(0, VecDeque::len);
                    if paid {
                        if let Some(n) = unwritten.get_mut(&chan).and_then(VecDeque::pop_front) {
                            p.written(chan, n, &mut core, now);
                        }
                    }
                }
                _ => p.settle(&mut core, now),
            }
            for (_, conn, n, _) in drain(&mut p) {
                unpaid.entry(conn).or_default().push_back(n);
                unwritten.entry(conn).or_default().push_back(n);
            }
            let total = total_unpaid(&p, &chans);
            let cap = if reserve > 0 { 2 * OUTBUF } else { OUTBUF };
            assert!(total <= cap, "step {step}: {total} unpaid");
            for c in chans {
                assert!(
                    p.in_flight(c) <= cap,
                    "step {step}: {c:?} holds {}",
                    p.in_flight(c)
                );
                assert_eq!(
                    p.unpaid(c),
                    unpaid.get(&c).map_or(0, |q| q.iter().sum::<usize>())
                );
            }
        }
        assert!(
            core.sent.len() > 2_000,
            "only {} cells moved",
            core.sent.len()
        );
    }
}

/// A batch written in the middle of a driver wake-up frees room at once but sends nothing
/// until the driver asks, after the wake-up's other inputs: the cells queued before and after
/// the report leave as one batch (a client's SENDMEs for a whole read in one link write).
/// `written` sends what is queued at the report, so the same steps give two batches.
#[test]
fn room_freed_mid_wake_up_sends_the_wake_ups_cells_as_one_batch() {
    let now = Instant::now();
    let batches = |in_turn: bool| {
        let mut core = FakeCore::default();
        let mut p = SendPath::new(direct());
        p.add_channel(A);
        core.push(A, 2, None);
        p.channel_ready(A, &mut core, now);
        assert_eq!(p.poll_transmit().map(|t| t.cells), Some(2));
        // The wake-up: an input queues a cell, the writer reports its batch, another input
        // queues two more; then the driver schedules the channels it was told of.
        core.push(A, 1, None);
        let mut sizes = Vec::new();
        if in_turn {
            assert!(p.written_in_turn(A, 2).is_some());
            assert!(
                p.poll_transmit().is_none(),
                "nothing sent before the driver asks"
            );
        } else {
            p.written(A, 2, &mut core, now);
        }
        sizes.extend(std::iter::from_fn(|| p.poll_transmit().map(|t| t.cells)));
        core.push(A, 2, None);
        p.channel_ready(A, &mut core, now);
        assert_eq!(p.schedule_room_freed(&mut core, now), in_turn);
        assert!(!p.schedule_room_freed(&mut core, now), "each channel once");
        sizes.extend(std::iter::from_fn(|| p.poll_transmit().map(|t| t.cells)));
        assert_eq!(p.in_flight(A), 3);
        sizes
    };
    assert_eq!(batches(true), [3]);
    assert_eq!(batches(false), [1, 2]);
}

/// A channel closed after its batch was reported written is not scheduled for it.
#[test]
fn a_closed_channel_is_not_scheduled_for_room_freed_before() {
    let now = Instant::now();
    let mut core = FakeCore::default();
    let mut p = SendPath::new(direct());
    p.add_channel(A);
    core.push(A, 2, None);
    p.channel_ready(A, &mut core, now);
    p.poll_transmit();
    core.push(A, 1, None);
    p.written_in_turn(A, 2);
    p.remove_channel(A);
    assert!(!p.schedule_room_freed(&mut core, now));
    assert!(p.poll_transmit().is_none());
}
