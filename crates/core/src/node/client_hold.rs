//! A per-client bound at the entry (`PerClientQueueCells`, issue 18: EWMA gaming).
//!
//! A client that spreads one download over many circuits keeps one window in flight per
//! circuit. Where the entry's write toward the client is the bottleneck, what does not fit in
//! the entry's queue parks *upstream* of it: in the middles' queues, the TCP connections into
//! the entry and its shared read bucket, where no scheduler ranks clients, so other clients'
//! cells (web fetches) wait behind it. This module moves that credit to the entry: on a
//! client's channel ([`Core::channel_is_client`]) the core counts the cells queued here toward
//! the channel; once they pass the cap, a relay cell the client sends on one of its circuits
//! that has cells queued here is *held* (for a download: the client's SENDMEs to the exit; the
//! entry cannot read them, it only delays passing them on), so the exit's window stops
//! refilling and the client's excess waits here as a few held cells instead of as data in
//! the middles. Held cells are let go as the queue drains, like a window: each released cell
//! is taken to bring [`RELEASE_CREDIT`] cells back (a SENDME's worth), and cells are let go
//! while the queue plus what released cells are still expected to bring stays below the cap;
//! every cell arriving toward the client counts one off. A tick ([`RELEASE_TICK`]) in which
//! nothing arrived forgets what is expected (the guess was wrong: an upload, a finished
//! stream), so nothing waits forever.
//!
//! Order: once a circuit has a held cell every later cell of it from the client is held
//! behind it, and held cells are passed on in arrival order through the same path as any
//! relay cell (RELAY_EARLY accounting, the tor1 layer), so nothing is reordered or dropped
//! within a circuit. Bounds: a circuit may hold at most `max_circuit_queue` cells (more is a
//! client ignoring flow control: the circuit is killed, as for its queues); held cells count
//! against `MaxMemInQueues` (their buffers' room, at [`super::CELL_MEM_COST`] a cell) and
//! their age makes their circuit an OOM victim like a queued cell; a channel holding the
//! cap's worth of cells (at least [`MIN_PAUSE_CELLS`]) asks the driver to stop reading it
//! ([`Core::read_paused`]: TCP back-pressure to that client only) until half is let go.
//!
//! What an honest client pays: only a client that itself keeps more than the cap queued at its
//! entry is held, and only on circuits with cells queued toward it. One downloading on a
//! single circuit stays below the cap (one circuit window). One that uploads on a circuit
//! while its own downloads fill the cap sees that circuit's upload wait until its queue here
//! drains below the cap: the client is receiving at its full share meanwhile, so it loses
//! latency on that upload, not throughput. A circuit with nothing queued toward the client
//! (a pure upload, another download's idle circuit) is never held.
//!
//! What is in flight (`ClientCircuitWindow`, session 19). The queue alone misses what a client
//! has set moving *before* anything waits here: each new stream of a download may be sent a
//! whole window (500 cells) before its first SENDME, so a client opening 200 circuits has
//! ~100 000 cells in flight at once, parked in the middles' queues (shared with other clients,
//! ranked per circuit), and the entry holds nothing until they arrive. With a window `W` set,
//! the first relay cell the client sends on a circuit that owes nothing (passed on or let go)
//! makes it *owe* `W` cells toward this entry (the cell may be a BEGIN); each later one adds
//! what arrived on the circuit since the client's previous cell, at most [`OWED_CREDIT`] (a
//! SENDME re-opens what it acknowledges), never past `W` less the circuit's cells queued
//! here. Each cell arriving toward the client counts one off, and a circuit on which nothing
//! arrived and nothing was sent for [`OWED_FORGET`] owes nothing (it was an EXTEND2, a small
//! fetch, an upload). (Session 19 reset the debt to `W` on every cell: a busy circuit then
//! owed a window whatever arrived, and a client with more than `cap / W` busy circuits
//! crawled, its SENDMEs held behind debts only the idle rule paid off.) The bound is then
//! on the queue *plus* what the client's circuits owe, and while a client is past it, its
//! relay cells on *any* of its circuits are held (new circuits' EXTEND2s and BEGINs included)
//! and let go in turn as arrivals pay the debt off. A one-circuit client owes at most `W`, so
//! it is never held; a client with more than `cap / W` circuits busy at once shares that
//! in-flight total between them.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::Cell;
use tracing::debug;

use crate::idmap::LocalMap;
use crate::{ChannelId, CircKey};

use super::queue::CELL_MEM_COST;
use super::Core;

/// Cells one released cell is expected to bring back toward the client: a SENDME's worth
/// (a circuit SENDME lets the exit send 100 more cells, a stream SENDME 50). Released cells
/// are limited so that the queue plus what they are still expected to bring stays below the
/// cap: letting go faster would send the credit out before its data arrives, and the data
/// would wait upstream again (on the in-memory overlay, releasing one held cell per 8 cells
/// sent left 2 700 cells waiting at the middle and the gamer 1.5x ahead).
pub const RELEASE_CREDIT: usize = 50;

/// A tick in which no cell arrived toward a client forgets what its released cells were
/// expected to bring, and lets held cells go if its queue is below the cap.
pub const RELEASE_TICK: Duration = Duration::from_millis(10);

/// A channel stops being read when it holds this many cells or the cap, whichever is more.
pub const MIN_PAUSE_CELLS: usize = 1024;

/// A circuit that owes a window and got no cell toward the client since the client's latest
/// cell on it owes nothing after this long ([`crate::CoreConfig::client_circuit_window`]):
/// longer than a reply takes through a loaded path.
pub const OWED_FORGET: Duration = Duration::from_millis(1000);

/// A circuit on which cells arrived since the client's latest cell owes nothing once none
/// arrived for this long: the answer to a request (an EXTENDED2, a CONNECTED, a small fetch)
/// is over, or what was in flight has arrived. Short, so a client building circuits beside
/// its downloads waits little past its bound.
pub const OWED_IDLE: Duration = Duration::from_millis(100);

/// The most a client's cell on a circuit that already owes is taken to let the exit send
/// (it is charged what arrived on the circuit since the client's previous cell, up to this):
/// what one SENDME can re-open under fixed windows (a circuit SENDME, 100 cells; a stream
/// SENDME 50). With congestion control (`cc_alg=2`) a circuit SENDME acknowledges 100 cells
/// and Vegas may also grow the window (by `cwnd_inc` once per round trip, or by up to the
/// window per round trip in slow start), so there a growing circuit is charged less than it
/// may be sent; the window `W` caps every circuit's charge either way.
pub const OWED_CREDIT: usize = crate::flow::CIRCUIT_SENDME_INCREMENT as usize;

/// How often owed circuits are checked for [`OWED_FORGET`] and [`OWED_IDLE`].
const OWED_SWEEP: Duration = Duration::from_millis(20);

/// What one client circuit may still have in flight toward this entry.
struct Owed {
    chan: ChannelId,
    cells: usize,
    /// The last cell from the client or toward it on this circuit.
    at: Instant,
    /// Whether a cell arrived toward the client since the client's latest cell.
    answered: bool,
    /// Cells that arrived toward the client since the client's latest cell passed on.
    since: usize,
    /// Cells that arrived toward the client on this circuit since it was first charged.
    arrived: usize,
}

struct HeldCell {
    cell: Cell,
    at: Instant,
}

/// One client channel's held cells.
struct ChanHold {
    /// Circuits with held cells, in the order they are let go (one cell each in turn).
    circs: VecDeque<CircKey>,
    /// Cells held on this channel.
    cells: usize,
    /// Cells the released cells are still expected to bring toward the client.
    expected: usize,
    /// Whether the driver should not read the channel ([`Core::read_paused`]).
    paused: bool,
    /// When the timer next lets a cell go.
    next_tick: Instant,
    /// Whether a cell arrived toward the client since the last tick.
    arrived: bool,
}

/// One circuit's held cells, oldest first, and the channel they came on.
struct CircHold {
    chan: ChannelId,
    cells: VecDeque<HeldCell>,
}

/// What the per-client bound holds now and has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldStats {
    /// Cells held now, over all client channels.
    pub held_now: usize,
    /// Cells held since start.
    pub held_total: u64,
    /// Held cells passed on since start.
    pub released_total: u64,
    /// Times a channel's reading was paused (its held cells reached the bound).
    pub read_pauses: u64,
    /// Cells all client circuits owe now (in flight toward this entry, estimated).
    pub owed_now: usize,
    /// Circuits killed for holding more than `max_circuit_queue` cells.
    pub circuits_killed: u64,
}

/// The held cells of every client channel (owned by their circuits: a closed circuit's go).
#[derive(Default)]
pub(super) struct HoldTables {
    chans: LocalMap<ChannelId, ChanHold>,
    circs: LocalMap<CircKey, CircHold>,
    /// Client circuits that may have cells in flight toward this entry.
    owed: LocalMap<CircKey, Owed>,
    /// Cells each client channel's circuits owe (the sum of its [`Owed`]; no entry = 0).
    owed_chans: LocalMap<ChannelId, usize>,
    /// When owed circuits are next checked for [`OWED_FORGET`].
    next_sweep: Option<Instant>,
    /// Room of all held cells' buffers, in cells (counted against `MaxMemInQueues`).
    buffer_cells: usize,
    stats: HoldStats,
}

impl Core {
    /// Set `PerClientQueueCells` (0 = off); turning it off lets every held cell go at once.
    pub fn set_client_queue_cap(&mut self, cells: usize, now: Instant) {
        self.cfg.client_queue_cap = cells;
        if cells == 0 {
            let chans: Vec<ChannelId> = self.hold.chans.keys().copied().collect();
            for chan in chans {
                while self.release_one(chan, now) {}
            }
        }
    }

    /// `PerClientQueueCells` in force (0 = off).
    pub fn client_queue_cap(&self) -> usize {
        self.cfg.client_queue_cap
    }

    /// Whether the driver should stop reading `chan`: the client's held cells reached their
    /// bound (see the module docs). Cells already read are still handed in (and held).
    pub fn read_paused(&self, chan: ChannelId) -> bool {
        self.hold.chans.get(&chan).is_some_and(|h| h.paused)
    }

    /// Cells queued at this node toward `chan` (all circuits, both directions).
    pub fn channel_queued(&self, chan: ChannelId) -> usize {
        self.channels.get(&chan).map_or(0, |c| c.queued)
    }

    /// Set `ClientCircuitWindow` (0 = off: only what is queued here counts); turning it off
    /// forgets what circuits owe.
    pub fn set_client_circuit_window(&mut self, cells: usize, now: Instant) {
        self.cfg.client_circuit_window = cells;
        if cells == 0 {
            self.hold.owed.clear();
            self.hold.owed_chans.clear();
            self.hold.next_sweep = None;
            let chans: Vec<ChannelId> = self.hold.chans.keys().copied().collect();
            for chan in chans {
                self.release_ready(chan, now);
            }
        }
    }

    /// `ClientCircuitWindow` in force (0 = off).
    pub fn client_circuit_window(&self) -> usize {
        self.cfg.client_circuit_window
    }

    /// Cells `chan`'s client's circuits owe now (estimated in flight toward this entry).
    pub fn owed_cells(&self, chan: ChannelId) -> usize {
        self.hold.owed_chans.get(&chan).copied().unwrap_or(0)
    }

    /// Cells held now for `chan`'s client.
    pub fn held_cells(&self, chan: ChannelId) -> usize {
        self.hold.chans.get(&chan).map_or(0, |h| h.cells)
    }

    /// The per-client bound's counters.
    pub fn hold_stats(&self) -> HoldStats {
        HoldStats {
            held_now: self.hold.chans.values().map(|h| h.cells).sum(),
            owed_now: self.hold.owed_chans.values().sum(),
            ..self.hold.stats
        }
    }

    /// A relay cell from `chan` on `key`: hold it (true) if the circuit already holds cells,
    /// or if it comes from a client whose queue here (plus what its circuits owe) is past the
    /// cap, on a circuit with cells queued toward it (any of its circuits when
    /// `client_circuit_window` is on). A client's cell passed on makes its circuit owe a window.
    /// The cell came with id `circ_id`; `cell` builds it, called only if it is held.
    pub(super) fn hold_upstream(
        &mut self,
        chan: ChannelId,
        key: CircKey,
        circ_id: chive_cell::CircId,
        cell: impl FnOnce() -> Cell,
        now: Instant,
    ) -> bool {
        let cap = self.cfg.client_queue_cap;
        let holding = self.hold.circs.contains_key(&key);
        if !holding {
            if cap == 0 {
                return false;
            }
            let Some(ch) = self.channels.get(&chan) else {
                return false;
            };
            if !ch.client {
                return false;
            }
            let Some(circ) = self.circuits.get(&key) else {
                return false;
            };
            let from_client = circ.prev == Some((chan, circ_id)) && !circ.is_origin();
            if !from_client {
                return false;
            }
            let expected = self.hold.chans.get(&chan).map_or(0, |h| h.expected);
            let owed = self.owed_cells(chan);
            let window = self.cfg.client_circuit_window;
            let over = ch.queued + expected + owed > cap;
            if !over || (window == 0 && circ.q_prev.len() == 0) {
                self.owe_window(chan, key, now);
                return false;
            }
        }
        let limit = self.cfg.max_circuit_queue;
        let h = self.hold.circs.entry(key).or_insert_with(|| CircHold {
            chan,
            cells: VecDeque::new(),
        });
        if h.chan != chan {
            // Held cells came on another channel (cannot happen for a client's circuit):
            // pass this one on rather than mix channels.
            return false;
        }
        if h.cells.len() >= limit {
            self.hold.stats.circuits_killed += 1;
            self.kill(
                key,
                "held upstream cells over the circuit queue limit (client ignores flow control)",
                now,
            );
            return true;
        }
        let cap_before = h.cells.capacity();
        h.cells.push_back(HeldCell {
            cell: cell(),
            at: now,
        });
        self.hold.buffer_cells += h.cells.capacity() - cap_before;
        let first = h.cells.len() == 1;
        let ch = self
            .hold
            .chans
            .entry(chan)
            .or_insert_with(|| ChanHold::new(now));
        if first {
            ch.circs.push_back(key);
        }
        ch.cells += 1;
        self.hold.stats.held_total += 1;
        if !ch.paused && ch.cells >= cap.max(MIN_PAUSE_CELLS) {
            ch.paused = true;
            self.hold.stats.read_pauses += 1;
            debug!(
                ?chan,
                held = ch.cells,
                "client channel: held cells at their bound, reading paused"
            );
        }
        self.check_mem_in_queues(now);
        true
    }

    /// Cells left toward `chan`: let held cells go as the queue allows.
    pub(super) fn hold_after_transmit(&mut self, chan: ChannelId, now: Instant) {
        if self.hold.chans.contains_key(&chan) {
            self.release_ready(chan, now);
        }
    }

    /// A cell of `key` was queued toward `chan` (called only while some channel holds,
    /// expects or is owed cells).
    pub(super) fn hold_arrival(&mut self, chan: ChannelId, key: CircKey, now: Instant) {
        if let Some(h) = self.hold.chans.get_mut(&chan) {
            h.expected = h.expected.saturating_sub(1);
            h.arrived = true;
        }
        // Only with ClientCircuitWindow on does anything owe: no lookup per arrival otherwise.
        if self.hold.owed.is_empty() {
            return;
        }
        if let Some(o) = self.hold.owed.get_mut(&key) {
            if o.chan == chan {
                o.at = now;
                o.answered = true;
                o.since += 1;
                o.arrived = o.arrived.saturating_add(1);
                if o.cells > 0 {
                    o.cells -= 1;
                    self.hold.owe(chan, -1);
                }
            }
        }
    }

    /// The client on `chan` sent a relay cell on `key` that goes on now (with
    /// `client_circuit_window` on). The entry cannot read it, so it charges the most such a
    /// cell can let the exit send: on a circuit that owes nothing yet (new, or forgotten) a
    /// whole window (the cell may be a BEGIN); on one that already owes, [`OWED_CREDIT`] more
    /// (a SENDME: a busy circuit's cells are mostly SENDMEs, and the window charged when it
    /// started still stands for its first BEGIN). Never more than the window less what of
    /// the circuit already waits here (counted in the queue).
    fn owe_window(&mut self, chan: ChannelId, key: CircKey, now: Instant) {
        if self.cfg.client_circuit_window == 0 {
            return;
        }
        let queued_here = self.circuits.get(&key).map_or(0, |c| c.q_prev.len());
        let window = self.cfg.client_circuit_window.saturating_sub(queued_here);
        let fresh = !self.hold.owed.contains_key(&key);
        let o = self.hold.owed.entry(key).or_insert(Owed {
            chan,
            cells: 0,
            at: now,
            answered: false,
            since: 0,
            arrived: 0,
        });
        if o.chan != chan {
            return;
        }
        o.at = now;
        o.answered = false;
        let owes = if fresh {
            window
        } else {
            o.cells.saturating_add(o.since.min(OWED_CREDIT)).min(window)
        };
        o.since = 0;
        let delta = owes as isize - o.cells as isize;
        o.cells = owes;
        self.hold.owe(chan, delta);
        if self.hold.next_sweep.is_none() {
            self.hold.next_sweep = Some(now + OWED_SWEEP);
        }
    }

    /// Forget what circuits owe that were not answered within [`OWED_FORGET`] or on which
    /// nothing arrived for [`OWED_IDLE`]. A circuit with held cells that has already been
    /// sent a whole window is idle because of the hold (its SENDMEs wait here), not because
    /// its transfer is over: its debt is forgotten but the circuit stays known, so its held
    /// cells are charged as a busy circuit's when let go (a whole window each would let four
    /// such circuits, their SENDMEs answered by nothing, fill the bound until
    /// [`OWED_FORGET`]). One that has not (a circuit being built, a first window) is
    /// forgotten: its next cell may be the BEGIN and is charged a window again.
    fn sweep_owed(&mut self, now: Instant) {
        match self.hold.next_sweep {
            Some(at) if at <= now => {}
            _ => return,
        }
        let window = self.cfg.client_circuit_window;
        let owed_chans = &mut self.hold.owed_chans;
        let held = &self.hold.circs;
        self.hold.owed.retain(|key, o| {
            let keep = if o.answered { OWED_IDLE } else { OWED_FORGET };
            if o.at + keep > now {
                return true;
            }
            if let Some(total) = owed_chans.get_mut(&o.chan) {
                *total -= o.cells;
                if *total == 0 {
                    owed_chans.remove(&o.chan);
                }
            }
            o.cells = 0;
            o.arrived >= window && held.contains_key(key)
        });
        self.hold.next_sweep = (!self.hold.owed.is_empty()).then(|| now + OWED_SWEEP);
    }

    /// Let `chan`'s held cells go while its queue plus what released cells are expected to
    /// bring stays below the cap.
    fn release_ready(&mut self, chan: ChannelId, now: Instant) {
        let cap = self.cfg.client_queue_cap;
        loop {
            let queued = self.channel_queued(chan);
            let Some(h) = self.hold.chans.get_mut(&chan) else {
                return;
            };
            let owed = self.hold.owed_chans.get(&chan).copied().unwrap_or(0);
            if h.cells == 0 || queued + h.expected + owed >= cap {
                return;
            }
            if self.cfg.client_circuit_window == 0 {
                // With the window on, the released cell's circuit owes a window instead.
                h.expected += RELEASE_CREDIT;
            }
            if !self.release_one(chan, now) {
                return;
            }
        }
    }

    /// Let go of `chan`'s next held cell (round robin over its circuits, each in order).
    /// Returns whether one went.
    fn release_one(&mut self, chan: ChannelId, now: Instant) -> bool {
        let Some(h) = self.hold.chans.get_mut(&chan) else {
            return false;
        };
        let Some(key) = h.circs.pop_front() else {
            return false;
        };
        let Some(ch_circ) = self.hold.circs.get_mut(&key) else {
            return true;
        };
        let cap_before = ch_circ.cells.capacity();
        let Some(mut held) = ch_circ.cells.pop_front() else {
            self.hold.circs.remove(&key);
            return true;
        };
        let left = ch_circ.cells.len();
        if left == 0 {
            self.hold.buffer_cells -= cap_before;
            self.hold.circs.remove(&key);
        } else {
            self.hold.buffer_cells -= cap_before - ch_circ.cells.capacity();
            h.circs.push_back(key);
        }
        h.cells -= 1;
        if h.paused && h.cells <= self.cfg.client_queue_cap.max(MIN_PAUSE_CELLS) / 2 {
            h.paused = false;
        }
        self.hold.stats.released_total += 1;
        self.owe_window(chan, key, now);
        self.relay_in(chan, key, &mut held.cell, now);
        true
    }

    /// The circuit `key` is gone: its held cells go with it.
    pub(super) fn hold_circuit_gone(&mut self, key: CircKey) {
        if let Some(o) = self.hold.owed.remove(&key) {
            self.hold.owe(o.chan, -(o.cells as isize));
        }
        let Some(gone) = self.hold.circs.remove(&key) else {
            return;
        };
        self.hold.buffer_cells -= gone.cells.capacity();
        if let Some(h) = self.hold.chans.get_mut(&gone.chan) {
            h.circs.retain(|k| *k != key);
            h.cells -= gone.cells.len();
            if h.paused && h.cells <= self.cfg.client_queue_cap.max(MIN_PAUSE_CELLS) / 2 {
                h.paused = false;
            }
            if h.cells == 0 && h.expected == 0 {
                self.hold.chans.remove(&gone.chan);
            }
        }
    }

    /// When the release timer next has work.
    pub(super) fn hold_next_deadline(&self) -> Option<Instant> {
        self.hold
            .chans
            .values()
            .map(|h| h.next_tick)
            .chain(self.hold.next_sweep)
            .min()
    }

    /// The release timer: a client channel to which nothing arrived for a [`RELEASE_TICK`]
    /// forgets what it expected and lets held cells go if its queue allows; a channel that
    /// holds nothing and expects nothing is forgotten.
    pub(super) fn hold_handle_timeout(&mut self, now: Instant) {
        self.sweep_owed(now);
        let due: Vec<ChannelId> = self
            .hold
            .chans
            .iter()
            .filter(|(_, h)| h.next_tick <= now)
            .map(|(c, _)| *c)
            .collect();
        for chan in due {
            let Some(h) = self.hold.chans.get_mut(&chan) else {
                continue;
            };
            h.next_tick = now + RELEASE_TICK;
            if !std::mem::replace(&mut h.arrived, false) {
                h.expected = 0;
            }
            if h.cells == 0 && h.expected == 0 {
                self.hold.chans.remove(&chan);
                continue;
            }
            self.release_ready(chan, now);
        }
    }

    /// Whether [`Core::hold_upstream`] could hold or count a relay cell of circuit `key` that
    /// arrived on a channel (`client`: a client's) from the circuit's previous hop
    /// (`from_prev`). False means it returns false and changes nothing for such a cell, so a
    /// run of them may skip it (`relay_run.rs`).
    pub(super) fn hold_may_take(&self, key: CircKey, client: bool, from_prev: bool) -> bool {
        self.hold.circs.contains_key(&key)
            || (self.cfg.client_queue_cap != 0 && client && from_prev)
    }

    /// Bytes the held cells' buffers take (counted against `MaxMemInQueues`).
    pub(super) fn held_mem(&self) -> usize {
        self.hold.buffer_cells.saturating_mul(CELL_MEM_COST)
    }

    /// When `key`'s oldest held cell arrived and the bytes its held cells take (the OOM
    /// handler ranks its victims by their oldest cell, held or queued).
    pub(super) fn held_oldest(&self, key: CircKey) -> Option<(Instant, usize)> {
        let h = self.hold.circs.get(&key)?;
        Some((h.cells.front()?.at, h.cells.capacity() * CELL_MEM_COST))
    }
}

impl ChanHold {
    fn new(now: Instant) -> Self {
        ChanHold {
            circs: VecDeque::new(),
            cells: 0,
            expected: 0,
            paused: false,
            next_tick: now + RELEASE_TICK,
            arrived: false,
        }
    }
}

impl HoldTables {
    /// Whether any client channel holds, expects or is owed cells (the send path's cheap
    /// check).
    pub(super) fn has_channels(&self) -> bool {
        !self.chans.is_empty() || !self.owed.is_empty()
    }

    /// Add `delta` to what `chan`'s circuits owe (an entry only while it is not zero).
    fn owe(&mut self, chan: ChannelId, delta: isize) {
        let total = self.owed_chans.entry(chan).or_insert(0);
        *total = total.saturating_add_signed(delta);
        if *total == 0 {
            self.owed_chans.remove(&chan);
        }
    }
}
