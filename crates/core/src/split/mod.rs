//! Split-direction overlay connections (paper 002, issue 6): the pure parts.
//!
//! A channel between relays A and B starts as one bidirectional connection (the *primary*,
//! opened by A). If both announced the SPLIT_DIRECTION link feature, B may open a *secondary*
//! connection to A, bind it to the channel (BIND cell with the primary's TLS-exported token) and
//! write all its cells there, so each TCP connection carries data one way only and its ACKs are
//! never piggybacked on data (the paper's fix). A keeps writing on the primary. Every switch of
//! B's writing connection is marked by a HANDOFF cell, so A delivers B's cells to the core in
//! exactly the order B sent them. Protocol: docs/protocol.md, "Split-direction connections".
//!
//! This module holds the deterministic logic, tested without IO:
//! - [`Reorder`]: A's side; merges the two connections' cells back into B's order.
//! - [`Sender`]: B's side; which connection it writes on and the HANDOFF markers.
//! - [`BulkDetector`]: B's "dynamic" policy (split under bidirectional bulk, merge when idle).
//! - [`SplitChannel`] (assign.rs): the assignment policy over those, per channel: when to open a
//!   second connection, binding, merging, retrying, and which connection the channel writes on.
//!
//! The IO driver (chive-node) owns the sockets, reports what happened with `now`, and carries out
//! what these return (markers to write, connections to open or close, readers to pause).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::{AnyCell, Handoff};

mod assign;
#[cfg(test)]
mod reattach_tests;

pub use assign::{Refusal, SecondaryDown, SplitChannel, BIND_WAIT, SPLIT_RETRY};

/// How long both directions must carry bulk traffic before "dynamic" splits a channel.
pub const SPLIT_SUSTAIN: Duration = Duration::from_secs(3);
/// Items (cells and markers) a channel may hold back for reordering before the peer is judged
/// hostile and the channel closed. Readers are paused well before this (see [`HOLD_CELLS`]), so
/// an honest peer never comes close: at most `HOLD_CELLS` plus the driver's input queue.
pub const MAX_REORDER_ITEMS: usize = 16_384;
/// A connection whose cells are being held back stops being read once this many wait.
pub const HOLD_CELLS: usize = 1024;

/// A reorder queue that drained keeps a buffer of up to this many items; a larger one is freed.
const RELEASE_ABOVE: usize = 64;

/// The `SplitDirection` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitMode {
    /// Do not announce the feature: one bidirectional connection per channel, as before.
    #[default]
    Off,
    /// Announce it; as the first connection's responder, open the second connection at once.
    Always,
    /// Announce it; open the second connection only while both directions carry bulk traffic.
    Dynamic,
}

impl SplitMode {
    /// Parse the config value ("off", "always", "dynamic").
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SplitMode::Off),
            "always" => Ok(SplitMode::Always),
            "dynamic" => Ok(SplitMode::Dynamic),
            other => Err(format!(
                "{other:?} is not one of \"off\", \"always\", \"dynamic\""
            )),
        }
    }
}

/// Split-direction settings of a relay.
#[derive(Clone, Copy, Debug)]
pub struct SplitConfig {
    /// Mode.
    pub mode: SplitMode,
    /// Bytes per second, per direction, that count as bulk ("dynamic").
    pub threshold: u64,
    /// How long a split channel may stay below bulk before "dynamic" closes the second
    /// connection.
    pub idle: Duration,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            mode: SplitMode::Off,
            threshold: 200_000,
            idle: Duration::from_secs(30),
        }
    }
}

/// One of a channel's two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conn {
    /// The channel's first connection, opened by A (the channel's initiator).
    Primary,
    /// The second connection, opened by B and written only by B.
    Secondary,
}

impl Conn {
    /// The other connection.
    pub fn other(self) -> Conn {
        match self {
            Conn::Primary => Conn::Secondary,
            Conn::Secondary => Conn::Primary,
        }
    }

    fn idx(self) -> usize {
        match self {
            Conn::Primary => 0,
            Conn::Secondary => 1,
        }
    }
}

/// What arrived on a connection, for [`Reorder`].
// Cells stay inline (no allocation per cell, as in the driver's input queue); markers are rare.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Item {
    /// A cell for the core.
    Cell(AnyCell),
    /// A HANDOFF marker.
    Handoff(Handoff),
}

/// The peer broke the hand-off rules; the channel must close.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Violation {
    /// Too many cells held back waiting for a marker.
    #[error("peer made us hold back more than {0} cells for reordering")]
    Overflow(usize),
    /// A marker with the wrong sequence number.
    #[error("HANDOFF seq {got}, expected {expected}")]
    Sequence {
        /// What we expected.
        expected: u32,
        /// What came.
        got: u32,
    },
    /// A marker whose cell count does not match what arrived.
    #[error("HANDOFF says {claimed} cells on the connection it leaves, {got} arrived")]
    Count {
        /// The marker's count.
        claimed: u64,
        /// Cells received.
        got: u64,
    },
    /// The connection in use failed and cells written on it never arrived.
    #[error("second connection failed with {0} of the peer's cells lost")]
    Lost(u64),
    /// Anything else that cannot happen with an honest peer.
    #[error("{0}")]
    Protocol(&'static str),
}

/// A's side of a split channel: delivers the peer's cells in the peer's order.
///
/// The peer writes on one connection at a time (`current`), and marks each switch with a
/// HANDOFF as its last item on the connection it leaves. Items from the current connection are
/// delivered at once; items from the other are held until the marker is read. If the current
/// connection fails, the peer instead sends a *recovery* marker as its first item on the other
/// connection, carrying how many cells it wrote on the failed one: if they all arrived, delivery
/// continues there; if not, the loss is reported (circuits cannot survive a lost cell).
///
/// **Re-attached second connections.** A new second connection's BIND carries `start`, the
/// sequence number of the marker that will switch the peer onto it. If the primary lags, A may
/// still have markers of the *previous* second connection to read when the new one is bound;
/// the new connection's items are then kept apart ([`Reorder::attach_secondary`] returns with
/// them *pending*) until A has read every marker before `start`, and only then take the
/// secondary's place. At most [`MAX_PENDING`] bound connections wait so; their items count
/// against the same hold-back limit. Conversely, if A reads the marker `start` before the new
/// connection's BIND (the BIND's TCP connection is slower than the primary), the switch leads
/// into a secondary that is not bound yet: A waits for the BIND instead of calling it a
/// violation.
#[derive(Debug)]
pub struct Reorder {
    current: Conn,
    /// Number of the next expected marker.
    epoch: u32,
    /// Cells delivered from `current` since the last switch.
    delivered: u64,
    queues: [VecDeque<Item>; 2],
    /// No more items will come on this connection.
    dead: [bool; 2],
    /// We switched onto the secondary while the one we had was dead, and no BIND told us which
    /// connection that stretch is on: its BIND may still come.
    unbound_stretch: bool,
    /// Second connections bound before their first marker, oldest first; the newest is the one
    /// attached now (only it can still receive items).
    pending: VecDeque<Pending>,
    limit: usize,
}

/// Bound second connections a [`Reorder`] keeps apart, waiting for the primary's markers.
/// One is the honest case of a primary lagging one retry behind; each further one means it
/// lags another `SPLIT_RETRY` (10 s).
pub const MAX_PENDING: usize = 3;

/// A second connection bound before A reached its first marker.
#[derive(Debug)]
struct Pending {
    /// The sequence number of the marker that switches the peer onto it.
    start: u32,
    items: VecDeque<Item>,
    dead: bool,
}

impl Default for Reorder {
    fn default() -> Self {
        Self::new(MAX_REORDER_ITEMS)
    }
}

/// Whether sequence number `a` comes before `b` (wrapping, as the peer's counter does).
fn seq_before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

impl Reorder {
    /// A fresh channel: the peer writes on the primary; at most `limit` items held back.
    pub fn new(limit: usize) -> Self {
        Reorder {
            current: Conn::Primary,
            epoch: 0,
            delivered: 0,
            queues: [VecDeque::new(), VecDeque::new()],
            dead: [false, false],
            unbound_stretch: false,
            pending: VecDeque::new(),
            limit,
        }
    }

    /// The connection the peer's cells are being delivered from.
    pub fn current(&self) -> Conn {
        self.current
    }

    /// Items held back from `conn` (for the secondary: also those of bound connections still
    /// waiting for their first marker).
    pub fn queued(&self, conn: Conn) -> usize {
        let pending = match conn {
            Conn::Primary => 0,
            Conn::Secondary => self.pending.iter().map(|p| p.items.len()).sum(),
        };
        self.queues[conn.idx()].len() + pending
    }

    /// Bound second connections waiting for the primary's markers before their own.
    pub fn pending_binds(&self) -> usize {
        self.pending.len()
    }

    /// Items of `conn` that cannot be delivered before something else arrives (the connection
    /// is not the current one, or they belong to a bound connection not reached yet): its reader
    /// should pause once there are [`HOLD_CELLS`] of them.
    pub fn held_back(&self, conn: Conn) -> usize {
        let mut n = self.queued(conn);
        if conn == self.current {
            n -= self.queues[conn.idx()].len();
        }
        n
    }

    /// Attach a new secondary connection whose BIND said the peer's switch onto it will be
    /// marker `start` (`None`: an earlier version's BIND, taken to mean the next marker).
    /// The caller attaches one at a time: the previous one has been reported
    /// [closed](Self::closed). False if the connection cannot be taken (the peer is not
    /// honest, or lags more than [`MAX_PENDING`] connections behind); the caller closes it.
    pub fn attach_secondary(&mut self, start: Option<u32>) -> bool {
        let s = Conn::Secondary.idx();
        let start = start.unwrap_or(match self.current {
            // An earlier version's BIND: as before, the next marker, or the one just read.
            Conn::Primary => self.epoch,
            Conn::Secondary => self.epoch.wrapping_sub(1),
        });
        if let Some(last) = self.pending.back() {
            // Still waiting for an earlier one's markers: this one must come later in the
            // peer's sequence. A dead one the peer never switched to (it wrote nothing there;
            // the peer did not want it after all) is replaced.
            if last.dead && last.items.is_empty() && last.start == start {
                self.pending.pop_back();
            } else if !last.dead || !seq_before(last.start, start) {
                return false;
            }
        }
        if self.pending.is_empty() && start == self.epoch {
            // Every earlier marker is read: the next one switches onto this connection. An
            // old secondary's leftovers could never be delivered now.
            if self.current != Conn::Primary || !self.queues[s].is_empty() {
                return false;
            }
            self.dead[s] = false;
            self.unbound_stretch = false;
            return true;
        }
        if self.pending.is_empty() && start.wrapping_add(1) == self.epoch {
            // We already read the marker switching onto it, before its BIND: onto a dead
            // secondary (an earlier one failed), or onto none yet (the channel's first).
            let fresh = self.unbound_stretch || !self.dead[s];
            if self.current != Conn::Secondary || !self.queues[s].is_empty() || !fresh {
                return false;
            }
            self.dead[s] = false;
            self.unbound_stretch = false;
            return true;
        }
        if !seq_before(self.epoch, start) || self.pending.len() >= MAX_PENDING {
            return false;
        }
        // Markers of an earlier connection are still to come on the primary.
        self.pending.push_back(Pending {
            start,
            items: VecDeque::new(),
            dead: false,
        });
        true
    }

    /// The fast path of [`Reorder::push`] for a cell (not a marker) from `conn`: if it would
    /// be delivered at once and alone (it comes on the current connection, nothing is held
    /// back, the connection is not given up, no re-attached connection waits), count it as
    /// delivered and return true; the caller delivers it. Otherwise change nothing and return
    /// false (use `push`).
    pub fn pass(&mut self, conn: Conn) -> bool {
        // A re-attached second connection waiting for the old one's markers holds its cells
        // apart (`pending`): then only `push` knows where a cell belongs.
        let direct = conn == self.current
            && !self.dead[conn.idx()]
            && self.pending.is_empty()
            && self.queues.iter().all(VecDeque::is_empty);
        if direct {
            self.delivered += 1;
        }
        direct
    }

    /// An item arrived on `conn`; cells now deliverable are appended to `out` in order.
    pub fn push(
        &mut self,
        conn: Conn,
        item: Item,
        out: &mut Vec<AnyCell>,
    ) -> Result<(), Violation> {
        let waiting = self.pending.back().filter(|_| conn == Conn::Secondary);
        if waiting.map_or(self.dead[conn.idx()], |p| p.dead) {
            return Err(Violation::Protocol(
                "item on a connection the peer already gave up",
            ));
        }
        if self.queued(Conn::Primary) + self.queued(Conn::Secondary) >= self.limit {
            return Err(Violation::Overflow(self.limit));
        }
        match self.pending.back_mut() {
            Some(p) if conn == Conn::Secondary => p.items.push_back(item),
            _ => self.queues[conn.idx()].push_back(item),
        }
        let r = self.drain(out);
        self.release_drained();
        r
    }

    /// `conn` closed or failed: nothing more comes on it.
    pub fn closed(&mut self, conn: Conn, out: &mut Vec<AnyCell>) -> Result<(), Violation> {
        match self.pending.back_mut() {
            Some(p) if conn == Conn::Secondary => p.dead = true,
            _ => self.dead[conn.idx()] = true,
        }
        // The secondary closed while we are in a stretch on it that gave us nothing: either
        // the peer was on it with nothing written (its recovery marker follows on the
        // primary), or it had left it (that marker was read before the close) and switched
        // onto a new connection whose BIND we have not read yet.
        if conn == Conn::Secondary
            && self.current == Conn::Secondary
            && self.delivered == 0
            && self.queues[conn.idx()].is_empty()
            && self.pending.is_empty()
        {
            self.unbound_stretch = true;
        }
        let r = self.drain(out);
        self.release_drained();
        r
    }

    /// Bytes the held-back items' buffers take: their capacity, not only the items in them
    /// (a buffer that grew to hold a burst keeps its room until it is released), for the
    /// memory the driver reports against `MaxMemInQueues`.
    pub fn held_bytes(&self) -> usize {
        let room = self.queues.iter().map(VecDeque::capacity).sum::<usize>()
            + self
                .pending
                .iter()
                .map(|p| p.items.capacity())
                .sum::<usize>();
        room * std::mem::size_of::<Item>()
    }

    /// Free the buffer of a connection's queue that drained after holding more than
    /// [`RELEASE_ABOVE`] items: holding back is rare (around a hand-off), so the room is not
    /// kept for the next time.
    fn release_drained(&mut self) {
        for q in &mut self.queues {
            if q.is_empty() && q.capacity() > RELEASE_ABOVE {
                *q = VecDeque::new();
            }
        }
    }

    fn switch(&mut self) {
        self.current = self.current.other();
        self.epoch = self.epoch.wrapping_add(1);
        self.delivered = 0;
        let s = Conn::Secondary.idx();
        // Onto a dead secondary with nothing of it left: unless its recovery marker follows,
        // the peer switched onto a new connection whose BIND we have not read yet.
        self.unbound_stretch = self.current == Conn::Secondary
            && self.dead[s]
            && self.queues[s].is_empty()
            && self.pending.is_empty();
    }

    /// The oldest pending connection takes the secondary's place once every marker before its
    /// first has been read.
    fn promote(&mut self) -> Result<(), Violation> {
        let Some(p) = self.pending.front() else {
            return Ok(());
        };
        if p.start != self.epoch {
            return Ok(());
        }
        let s = Conn::Secondary.idx();
        if self.current != Conn::Primary {
            return Err(Violation::Protocol(
                "BIND names a switch the peer made while on its second connection",
            ));
        }
        if !self.queues[s].is_empty() {
            return Err(Violation::Protocol(
                "cells left on a second connection the peer replaced",
            ));
        }
        if let Some(p) = self.pending.pop_front() {
            self.queues[s] = p.items;
            self.dead[s] = p.dead;
        }
        Ok(())
    }

    fn drain(&mut self, out: &mut Vec<AnyCell>) -> Result<(), Violation> {
        loop {
            self.promote()?;
            let cur = self.current.idx();
            if let Some(item) = self.queues[cur].pop_front() {
                match item {
                    Item::Cell(c) => {
                        self.delivered += 1;
                        out.push(c);
                    }
                    Item::Handoff(h) => {
                        if h.is_recovery() {
                            return Err(Violation::Protocol(
                                "recovery HANDOFF on the connection being left",
                            ));
                        }
                        self.check(h)?;
                        self.switch();
                    }
                }
                continue;
            }
            // Nothing more from the current connection for now. A recovery marker at the head
            // of the other one means the peer gave the current one up.
            let oth = self.current.other().idx();
            match self.queues[oth].front() {
                Some(Item::Handoff(h)) if h.is_recovery() => {
                    let h = *h;
                    if h.seq != self.epoch {
                        return Err(Violation::Sequence {
                            expected: self.epoch,
                            got: h.seq,
                        });
                    }
                    if self.delivered > h.cells {
                        return Err(Violation::Count {
                            claimed: h.cells,
                            got: self.delivered,
                        });
                    }
                    if self.delivered < h.cells {
                        if self.dead[cur] {
                            return Err(Violation::Lost(h.cells - self.delivered));
                        }
                        // The rest may still be on its way on the current connection.
                        return Ok(());
                    }
                    self.queues[oth].pop_front();
                    // The peer will never write on the abandoned connection again.
                    self.dead[cur] = true;
                    self.switch();
                }
                // Held until the BIND of the connection the peer switched onto comes (the
                // hold-back limit still applies).
                Some(_) if self.dead[cur] && self.unbound_stretch => return Ok(()),
                Some(_) if self.dead[cur] => {
                    return Err(Violation::Protocol(
                        "peer resumed on the other connection without a recovery HANDOFF",
                    ))
                }
                _ => return Ok(()),
            }
        }
    }

    fn check(&self, h: Handoff) -> Result<(), Violation> {
        if h.seq != self.epoch {
            return Err(Violation::Sequence {
                expected: self.epoch,
                got: h.seq,
            });
        }
        if h.cells != self.delivered {
            return Err(Violation::Count {
                claimed: h.cells,
                got: self.delivered,
            });
        }
        Ok(())
    }
}

/// B's side of a split channel: which connection it writes on, and its markers.
#[derive(Debug, Default)]
pub struct Sender {
    current: Option<Conn>,
    seq: u32,
    cells: u64,
}

impl Sender {
    /// The connection B writes on now.
    pub fn current(&self) -> Conn {
        self.current.unwrap_or(Conn::Primary)
    }

    /// `n` cells were handed to the current connection's writer.
    pub fn sent(&mut self, n: usize) {
        self.cells += n as u64;
    }

    /// The sequence number of the next marker: what a BIND for a new second connection carries
    /// (the switch onto it will be this marker).
    pub fn next_seq(&self) -> u32 {
        self.seq
    }

    /// Switch normally: returns the marker to write as the *last* item on the connection being
    /// left; every later cell goes on the other one.
    pub fn switch(&mut self) -> Handoff {
        self.next(0)
    }

    /// The current connection failed: returns the recovery marker to write as the *first* item
    /// on the other connection, which is used from now on.
    pub fn recover(&mut self) -> Handoff {
        self.next(Handoff::RECOVERY)
    }

    fn next(&mut self, flags: u8) -> Handoff {
        let h = Handoff {
            seq: self.seq,
            cells: self.cells,
            flags,
        };
        self.seq = self.seq.wrapping_add(1);
        self.cells = 0;
        self.current = Some(self.current().other());
        h
    }
}

/// What [`BulkDetector::observe`] advises.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep things as they are.
    Stay,
    /// Open the second connection.
    Split,
    /// Close it and go back to one connection.
    Merge,
}

/// "dynamic" mode: split when both directions carried more than `threshold` bytes/s over every
/// measurement window for [`SPLIT_SUSTAIN`]; merge when, for `idle`, they did not.
#[derive(Debug)]
pub struct BulkDetector {
    threshold: u64,
    idle: Duration,
    /// Start of the current window and the byte counters then.
    window: Option<(Instant, u64, u64)>,
    bulk_since: Option<Instant>,
    quiet_since: Option<Instant>,
}

/// Windows shorter than this are extended (rates over tiny windows are noise).
const WINDOW: Duration = Duration::from_secs(1);

impl BulkDetector {
    /// A detector for these settings.
    pub fn new(threshold: u64, idle: Duration) -> Self {
        BulkDetector {
            threshold,
            idle,
            window: None,
            bulk_since: None,
            quiet_since: None,
        }
    }

    /// Feed the channel's cumulative byte counters (read, written) at `now`; `split` says
    /// whether the channel is split now.
    pub fn observe(
        &mut self,
        now: Instant,
        bytes_in: u64,
        bytes_out: u64,
        split: bool,
    ) -> Decision {
        let Some((start, in0, out0)) = self.window else {
            self.window = Some((now, bytes_in, bytes_out));
            return Decision::Stay;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed < WINDOW {
            return Decision::Stay;
        }
        self.window = Some((now, bytes_in, bytes_out));
        let secs = elapsed.as_secs_f64();
        let rate_in = bytes_in.saturating_sub(in0) as f64 / secs;
        let rate_out = bytes_out.saturating_sub(out0) as f64 / secs;
        let bulk = rate_in > self.threshold as f64 && rate_out > self.threshold as f64;
        if bulk {
            self.quiet_since = None;
            let since = *self.bulk_since.get_or_insert(start);
            if !split && now.saturating_duration_since(since) >= SPLIT_SUSTAIN {
                return Decision::Split;
            }
        } else {
            self.bulk_since = None;
            let since = *self.quiet_since.get_or_insert(start);
            if split && now.saturating_duration_since(since) >= self.idle {
                return Decision::Merge;
            }
        }
        Decision::Stay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_cell::{Cell, CellCommand};

    fn cell(n: u32) -> Item {
        Item::Cell(AnyCell::Fixed(
            Cell::new(n, CellCommand::RELAY, &n.to_be_bytes()).unwrap(),
        ))
    }
    fn marker(seq: u32, cells: u64) -> Item {
        Item::Handoff(Handoff {
            seq,
            cells,
            flags: 0,
        })
    }
    fn recovery(seq: u32, cells: u64) -> Item {
        Item::Handoff(Handoff {
            seq,
            cells,
            flags: Handoff::RECOVERY,
        })
    }
    fn ids(out: &[AnyCell]) -> Vec<u32> {
        out.iter().map(|c| c.circ_id()).collect()
    }

    /// What the peer wrote, per connection, as (connection, item) in its own order, from a
    /// [`Sender`] driving a scripted sequence of cells and switches.
    enum Step {
        Cells(u32),
        Switch,
        Recover,
    }
    fn script(steps: &[Step]) -> (Vec<Item>, Vec<Item>, u32) {
        let mut s = Sender::default();
        let (mut p, mut q) = (Vec::new(), Vec::new());
        let mut n = 0;
        for step in steps {
            match step {
                Step::Cells(k) => {
                    for _ in 0..*k {
                        n += 1;
                        let target = if s.current() == Conn::Primary {
                            &mut p
                        } else {
                            &mut q
                        };
                        target.push(cell(n));
                        s.sent(1);
                    }
                }
                Step::Switch => {
                    let old = s.current();
                    let h = s.switch();
                    let target = if old == Conn::Primary { &mut p } else { &mut q };
                    target.push(Item::Handoff(h));
                }
                Step::Recover => {
                    let h = s.recover();
                    let target = if s.current() == Conn::Primary {
                        &mut p
                    } else {
                        &mut q
                    };
                    target.push(Item::Handoff(h));
                }
            }
        }
        (p, q, n)
    }

    /// The reorder buffer counts for its room while it holds cells, and a buffer that grew for
    /// a burst is freed once it drains.
    #[test]
    fn held_room_is_counted_and_a_drained_burst_buffer_is_freed() {
        let (p, q, n) = script(&[Step::Cells(2), Step::Switch, Step::Cells(200)]);
        let mut r = Reorder::new(MAX_REORDER_ITEMS);
        let mut out = Vec::new();
        // The secondary's 200 cells arrive before the primary's marker: all held back.
        for item in q {
            r.push(Conn::Secondary, item, &mut out).unwrap();
        }
        assert_eq!(r.queued(Conn::Secondary), 200);
        let room = r.held_bytes();
        assert!(room >= 200 * std::mem::size_of::<Item>(), "{room}");
        for item in p {
            r.push(Conn::Primary, item, &mut out).unwrap();
        }
        assert_eq!(ids(&out), (1..=n).collect::<Vec<_>>());
        assert!(
            r.held_bytes() <= 2 * RELEASE_ABOVE * std::mem::size_of::<Item>(),
            "the 200-item buffer was freed, small ones may stay: {}",
            r.held_bytes()
        );
    }

    /// Every interleaving of two sequences (as choice bitmasks) delivers 1..=n in order.
    #[test]
    fn all_interleavings_deliver_in_sender_order() {
        let plans: Vec<Vec<Step>> = vec![
            vec![Step::Cells(3), Step::Switch, Step::Cells(3)],
            vec![
                Step::Cells(2),
                Step::Switch,
                Step::Cells(2),
                Step::Switch,
                Step::Cells(2),
            ],
            vec![
                Step::Switch,
                Step::Cells(2),
                Step::Switch,
                Step::Switch,
                Step::Cells(1),
                Step::Switch,
                Step::Cells(2),
            ],
        ];
        for plan in &plans {
            let (p, q, n) = script(plan);
            let (lp, lq) = (p.len(), q.len());
            let total = lp + lq;
            let mut tried = 0;
            // Each bitmask with exactly lq ones is one interleaving.
            for mask in 0u32..(1 << total) {
                if mask.count_ones() as usize != lq {
                    continue;
                }
                tried += 1;
                let (p2, q2, _) = script(plan);
                let (mut pi, mut qi) = (p2.into_iter(), q2.into_iter());
                let mut r = Reorder::default();
                let mut out = Vec::new();
                for bit in 0..total {
                    let (conn, item) = if mask & (1 << bit) != 0 {
                        (Conn::Secondary, qi.next().unwrap())
                    } else {
                        (Conn::Primary, pi.next().unwrap())
                    };
                    r.push(conn, item, &mut out).unwrap();
                }
                assert_eq!(ids(&out), (1..=n).collect::<Vec<_>>(), "mask {mask:b}");
            }
            assert!(tried > 1);
        }
    }

    #[test]
    fn secondary_cells_wait_for_the_marker() {
        let mut r = Reorder::default();
        let mut out = Vec::new();
        r.push(Conn::Primary, cell(1), &mut out).unwrap();
        // B switched, but its marker is still behind cell 2 on the primary.
        r.push(Conn::Secondary, cell(3), &mut out).unwrap();
        r.push(Conn::Secondary, cell(4), &mut out).unwrap();
        assert_eq!(ids(&out), [1]);
        assert_eq!(r.queued(Conn::Secondary), 2);
        r.push(Conn::Primary, cell(2), &mut out).unwrap();
        assert_eq!(ids(&out), [1, 2]);
        r.push(Conn::Primary, marker(0, 2), &mut out).unwrap();
        assert_eq!(ids(&out), [1, 2, 3, 4]);
        assert_eq!(r.current(), Conn::Secondary);
        r.push(Conn::Secondary, cell(5), &mut out).unwrap();
        assert_eq!(ids(&out), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn bad_markers_are_violations() {
        let mut out = Vec::new();
        let mut r = Reorder::default();
        r.push(Conn::Primary, cell(1), &mut out).unwrap();
        assert_eq!(
            r.push(Conn::Primary, marker(0, 5), &mut out),
            Err(Violation::Count { claimed: 5, got: 1 })
        );
        let mut r = Reorder::default();
        assert_eq!(
            r.push(Conn::Primary, marker(7, 0), &mut out),
            Err(Violation::Sequence {
                expected: 0,
                got: 7
            })
        );
        let mut r = Reorder::default();
        assert!(matches!(
            r.push(Conn::Primary, recovery(0, 0), &mut out),
            Err(Violation::Protocol(_))
        ));
    }

    #[test]
    fn holding_back_too_much_is_an_overflow() {
        let mut r = Reorder::new(4);
        let mut out = Vec::new();
        for i in 0..4 {
            r.push(Conn::Secondary, cell(i), &mut out).unwrap();
        }
        assert_eq!(
            r.push(Conn::Secondary, cell(9), &mut out),
            Err(Violation::Overflow(4))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn failed_secondary_recovers_when_nothing_was_lost() {
        // B: switch to S, 3 cells on S, S fails, recovery on P, 2 more cells on P.
        let (p, q, _) = script(&[
            Step::Cells(1),
            Step::Switch,
            Step::Cells(3),
            Step::Recover,
            Step::Cells(2),
        ]);
        let mut r = Reorder::default();
        let mut out = Vec::new();
        let mut p = p.into_iter();
        // Cell 1 and the marker on P.
        r.push(Conn::Primary, p.next().unwrap(), &mut out).unwrap();
        r.push(Conn::Primary, p.next().unwrap(), &mut out).unwrap();
        // The recovery marker and cells 5, 6 arrive on P before S's cells: held back.
        for item in p {
            r.push(Conn::Primary, item, &mut out).unwrap();
        }
        assert_eq!(ids(&out), [1]);
        for item in q {
            r.push(Conn::Secondary, item, &mut out).unwrap();
        }
        // All 3 of S's cells arrived, so the recovery applies before S is even seen to close.
        assert_eq!(ids(&out), [1, 2, 3, 4, 5, 6]);
        assert_eq!(r.current(), Conn::Primary);
        r.closed(Conn::Secondary, &mut out).unwrap();
        // A later secondary can attach.
        assert!(r.attach_secondary(Some(2)));
    }

    #[test]
    fn failed_secondary_with_lost_cells_is_reported() {
        let (p, q, _) = script(&[Step::Switch, Step::Cells(3), Step::Recover, Step::Cells(1)]);
        let mut r = Reorder::default();
        let mut out = Vec::new();
        for item in p {
            r.push(Conn::Primary, item, &mut out).unwrap();
        }
        // Only the first of S's three cells arrived before S failed.
        let mut q = q.into_iter();
        r.push(Conn::Secondary, q.next().unwrap(), &mut out)
            .unwrap();
        assert_eq!(ids(&out), [1]);
        assert_eq!(r.closed(Conn::Secondary, &mut out), Err(Violation::Lost(2)));
    }

    #[test]
    fn resuming_without_recovery_after_a_failure_is_a_violation() {
        let mut r = Reorder::default();
        let mut out = Vec::new();
        r.push(Conn::Primary, marker(0, 0), &mut out).unwrap();
        r.push(Conn::Secondary, cell(1), &mut out).unwrap();
        r.closed(Conn::Secondary, &mut out).unwrap();
        assert!(matches!(
            r.push(Conn::Primary, cell(2), &mut out),
            Err(Violation::Protocol(_))
        ));
        // And nothing may come on a connection after it closed.
        let mut r = Reorder::default();
        r.closed(Conn::Secondary, &mut out).unwrap();
        assert!(r.push(Conn::Secondary, cell(1), &mut out).is_err());
    }

    #[test]
    fn sender_numbers_markers_and_counts_cells() {
        let mut s = Sender::default();
        assert_eq!(s.current(), Conn::Primary);
        s.sent(5);
        assert_eq!(
            s.switch(),
            Handoff {
                seq: 0,
                cells: 5,
                flags: 0
            }
        );
        assert_eq!(s.current(), Conn::Secondary);
        s.sent(2);
        let h = s.recover();
        assert_eq!((h.seq, h.cells, h.is_recovery()), (1, 2, true));
        assert_eq!(s.current(), Conn::Primary);
    }

    #[test]
    fn detector_splits_after_sustained_bulk_and_merges_after_idle() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut d = BulkDetector::new(1000, Duration::from_secs(2));
        assert_eq!(d.observe(s(0), 0, 0, false), Decision::Stay);
        // Bulk only one way: never splits.
        assert_eq!(d.observe(s(1), 5000, 0, false), Decision::Stay);
        assert_eq!(d.observe(s(5), 25000, 10, false), Decision::Stay);
        // Both ways for 3 s.
        assert_eq!(d.observe(s(6), 30000, 5000, false), Decision::Stay);
        assert_eq!(d.observe(s(7), 35000, 10000, false), Decision::Stay);
        // Half a window later nothing is measured.
        assert_eq!(
            d.observe(s(7) + Duration::from_millis(500), 90000, 90000, false),
            Decision::Stay
        );
        assert_eq!(d.observe(s(8), 100000, 100000, false), Decision::Split);
        // Split; still bulk: stay. Then quiet: merge after 2 s of quiet.
        assert_eq!(d.observe(s(9), 200000, 200000, true), Decision::Stay);
        assert_eq!(d.observe(s(10), 200100, 200100, true), Decision::Stay);
        assert_eq!(d.observe(s(11), 200200, 200200, true), Decision::Merge);
    }
}
