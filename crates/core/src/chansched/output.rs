//! Output accounting: what each connection's writer holds, and the one place cells leave the
//! core for a writer ([`SendCtx::transmit_up_to`]).

use std::collections::VecDeque;
use std::time::Instant;

use chive_cell::CELL_LEN;

use super::{BatchClass, CellSource, ConnId, SendConfig};
use crate::idmap::LocalMap;
use crate::{CellSample, ChannelId};

/// A batch of cells for one connection's writer.
#[derive(Debug)]
pub struct Transmit {
    /// The channel the cells belong to.
    pub chan: ChannelId,
    /// The connection to write them on.
    pub conn: ConnId,
    /// The cells' wire bytes, in order: `cells` fixed cells of 514 bytes, encoded by the core
    /// straight from their queues ([`crate::Core::poll_transmit_wire`]), for the writer to hand
    /// to TLS as they are.
    pub bytes: Vec<u8>,
    /// How many cells `bytes` holds.
    pub cells: usize,
    /// How the batch may draw on the write bucket.
    pub class: BatchClass,
    /// The room left around the cells in `bytes` for the writer's records, if any
    /// ([`SendPath::set_framing`](super::SendPath::set_framing)).
    pub framing: Option<WireFraming>,
    /// Whether the batch's cells count as unpaid until the writer reports them paid
    /// ([`SendPath::paid`](super::SendPath::paid)): the send path was paced when it made the
    /// batch. The writer pays and reports exactly the batches made so, even if the write rate
    /// changes while they travel.
    pub paced: bool,
}

/// Room a connection's writer wants around the cells of a batch, so that its record layer can
/// seal the batch where it lies instead of copying it into a record buffer: `head` bytes
/// before and `tail` bytes after every run of `cells_per_record` cells (the last run may be
/// shorter). The send path leaves the room as zeros and knows nothing of what goes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireFraming {
    /// Bytes before each record's cells.
    pub head: usize,
    /// Bytes after them.
    pub tail: usize,
    /// Cells per record (at least 1).
    pub cells_per_record: usize,
}

impl WireFraming {
    /// Bytes of a framed batch of `cells` cells.
    pub fn framed_len(&self, cells: usize) -> usize {
        cells * CELL_LEN + cells.div_ceil(self.cells_per_record.max(1)) * (self.head + self.tail)
    }
}

/// A batch being filled: the cells' bytes, with the room of `framing` around each record's.
struct BatchOut {
    bytes: Vec<u8>,
    framing: Option<WireFraming>,
    /// Cells in the record being filled (0: none open).
    in_record: usize,
}

impl BatchOut {
    fn new(framing: Option<WireFraming>, cells: usize) -> Self {
        let len = match framing {
            Some(f) => f.framed_len(cells),
            None => cells * CELL_LEN,
        };
        BatchOut {
            bytes: Vec::with_capacity(len),
            framing,
            in_record: 0,
        }
    }

    /// Take up to `max` of `chan`'s cells from `src` (fewer if that would pass the end of
    /// the open record); how many came.
    fn take(
        &mut self,
        src: &mut dyn CellSource,
        chan: ChannelId,
        max: usize,
        now: Instant,
    ) -> usize {
        let Some(f) = self.framing else {
            return src.poll_transmit(chan, max, now, &mut self.bytes);
        };
        let per = f.cells_per_record.max(1);
        let opened = self.in_record == 0;
        if opened {
            self.bytes.resize(self.bytes.len() + f.head, 0);
        }
        let n = src.poll_transmit(chan, max.min(per - self.in_record), now, &mut self.bytes);
        if n == 0 && opened {
            self.bytes.truncate(self.bytes.len() - f.head);
            return 0;
        }
        self.in_record += n;
        if self.in_record == per {
            self.close();
        }
        n
    }

    /// End the open record, if any.
    fn close(&mut self) {
        if let (Some(f), true) = (self.framing, self.in_record > 0) {
            self.bytes.resize(self.bytes.len() + f.tail, 0);
            self.in_record = 0;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.close();
        self.bytes
    }
}

/// Counters of the send path, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Episodes in which a channel had cells waiting while its connection was full
    /// (counted once per episode, not per attempt).
    pub outbuf_full_events: u64,
    /// Cells sent in quiet batches.
    pub quiet_cells: u64,
}

/// One connection's writer, as the send path sees it.
#[derive(Debug)]
pub(super) struct ConnOutput {
    /// The channel it carries.
    chan: ChannelId,
    /// Cells handed to the writer and not yet written.
    pub(super) in_flight: usize,
    /// Of those, cells still waiting for write-bucket tokens: what a shared bound counts, so
    /// that a connection blocked on a slow receiver's socket does not hold up the others.
    pub(super) unpaid: usize,
    /// Batches handed to the writer, oldest first: their size and sampled cells.
    batches: VecDeque<(usize, Vec<CellSample>)>,
}

impl ConnOutput {
    fn new(chan: ChannelId) -> Self {
        ConnOutput {
            chan,
            in_flight: 0,
            unpaid: 0,
            batches: VecDeque::new(),
        }
    }
}

/// One channel, as the send path sees it.
#[derive(Debug)]
struct ChanOutput {
    /// The connection its cells go on.
    writes_on: ConnId,
    /// Its connection is full and cells are waiting (an episode, counted once).
    blocked: bool,
    /// Its connections besides the first (whose id is the channel's), so that per-channel totals
    /// and removal do not scan every connection of the relay.
    extra: Vec<ConnId>,
}

/// Per-connection and per-channel output state, the batches decided and not yet taken by the
/// driver, and the counters.
#[derive(Default)]
pub(super) struct OutputAccounts {
    conns: LocalMap<ConnId, ConnOutput>,
    chans: LocalMap<ChannelId, ChanOutput>,
    pub(super) transmits: VecDeque<Transmit>,
    pub(super) stats: SendStats,
    /// Room to leave around the cells of every batch ([`super::SendPath::set_framing`]).
    pub(super) framing: Option<WireFraming>,
}

impl OutputAccounts {
    pub(super) fn add_channel(&mut self, chan: ChannelId) {
        self.conns.insert(chan, ConnOutput::new(chan));
        self.chans.insert(
            chan,
            ChanOutput {
                writes_on: chan,
                blocked: false,
                extra: Vec::new(),
            },
        );
    }

    pub(super) fn remove_channel(&mut self, chan: ChannelId) {
        self.conns.remove(&chan);
        if let Some(ch) = self.chans.remove(&chan) {
            for conn in ch.extra {
                self.conns.remove(&conn);
            }
        }
    }

    pub(super) fn attach_conn(&mut self, chan: ChannelId, conn: ConnId) {
        let Some(ch) = self.chans.get_mut(&chan) else {
            return;
        };
        ch.writes_on = conn;
        if conn != chan && !ch.extra.contains(&conn) {
            ch.extra.push(conn);
        }
        self.conns.insert(conn, ConnOutput::new(chan));
    }

    pub(super) fn detach_conn(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let chan = c.chan;
        if conn == chan {
            // A channel's first connection goes only with the channel.
            return;
        }
        self.conns.remove(&conn);
        if let Some(ch) = self.chans.get_mut(&chan) {
            ch.extra.retain(|c| *c != conn);
            if ch.writes_on == conn {
                ch.writes_on = chan;
            }
        }
    }

    pub(super) fn channel_of(&self, conn: ConnId) -> Option<ChannelId> {
        self.conns.get(&conn).map(|c| c.chan)
    }

    /// Returns false if `conn` is unknown.
    pub(super) fn paid(&mut self, conn: ConnId, cells: usize) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        c.unpaid = c.unpaid.saturating_sub(cells);
        true
    }

    /// The connection's channel and the written batch's samples; `None` if `conn` is unknown.
    pub(super) fn written(
        &mut self,
        conn: ConnId,
        cells: usize,
    ) -> Option<(ChannelId, Vec<CellSample>)> {
        let c = self.conns.get_mut(&conn)?;
        c.in_flight = c.in_flight.saturating_sub(cells);
        // The writer reports whole batches, in order.
        let samples = c.batches.pop_front().map(|(_, s)| s).unwrap_or_default();
        Some((c.chan, samples))
    }

    pub(super) fn chan_total(&self, chan: ChannelId, f: impl Fn(&ConnOutput) -> usize) -> usize {
        let Some(ch) = self.chans.get(&chan) else {
            return 0;
        };
        std::iter::once(&chan)
            .chain(&ch.extra)
            .filter_map(|conn| self.conns.get(conn))
            .map(f)
            .sum()
    }

    pub(super) fn blocked(&self, chan: ChannelId) -> bool {
        self.chans.get(&chan).is_some_and(|c| c.blocked)
    }
}

/// What a [`super::ChannelScheduler`] hook sees: the settings, the output accounts, the core's
/// cells and the time of the call.
pub struct SendCtx<'a> {
    cfg: &'a SendConfig,
    outbuf: usize,
    accounts: &'a mut OutputAccounts,
    src: &'a mut dyn CellSource,
    now: Instant,
}

impl<'a> SendCtx<'a> {
    pub(super) fn new(
        cfg: &'a SendConfig,
        outbuf: usize,
        accounts: &'a mut OutputAccounts,
        src: &'a mut dyn CellSource,
        now: Instant,
    ) -> Self {
        SendCtx {
            cfg,
            outbuf,
            accounts,
            src,
            now,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &SendConfig {
        self.cfg
    }

    /// The output bound in force ([`super::SendPath::outbuf`]): `OutbufCells`, stretched by
    /// the measured reaction latency under a write rate.
    pub fn outbuf(&self) -> usize {
        self.outbuf
    }

    /// The time of this call.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Whether `chan` is a channel of the send path (not closed).
    pub fn knows(&self, chan: ChannelId) -> bool {
        self.accounts.chans.contains_key(&chan)
    }

    /// Whether `chan` has cells waiting in the core.
    pub fn has_pending(&self, chan: ChannelId) -> bool {
        self.src.has_pending(chan)
    }

    /// How deserving `chan`'s next cell is (lower first); `None` if nothing waits or the
    /// circuit scheduler does not rank.
    pub fn priority(&self, chan: ChannelId) -> Option<f64> {
        self.src.channel_priority(chan, self.now)
    }

    /// Whether `chan` is a client's channel ([`super::CellSource::is_client_channel`]).
    pub fn is_client(&self, chan: ChannelId) -> bool {
        self.src.is_client_channel(chan)
    }

    /// Whether the circuit scheduler ranks circuits.
    pub fn ranks_circuits(&self) -> bool {
        self.src.ranks_circuits()
    }

    /// Unpaid cells over all connections.
    pub fn unpaid_total(&self) -> usize {
        self.accounts.conns.values().map(|c| c.unpaid).sum()
    }

    /// Cells the connection `chan` writes on may still take under the bound in force
    /// ([`SendCtx::outbuf`]); 0 for an unknown channel.
    pub fn room(&self, chan: ChannelId) -> usize {
        self.write_conn(chan)
            .map_or(0, |c| self.outbuf.saturating_sub(c.in_flight))
    }

    fn write_conn(&self, chan: ChannelId) -> Option<&ConnOutput> {
        let ch = self.accounts.chans.get(&chan)?;
        self.accounts.conns.get(&ch.writes_on)
    }

    /// Move up to `limit` of `chan`'s cells to the connection it writes on, as one batch of
    /// `class`, while that connection has room: the bound in force ([`SendCtx::outbuf`]) in
    /// flight, twice that for a
    /// [`BatchClass::Quiet`] batch. Returns how many cells moved.
    ///
    /// A quiet batch takes cells only while the channel's next circuit is quiet, one at a time
    /// (the circuit scheduler may turn to a bulk circuit after any cell). A full connection
    /// with cells waiting starts a blocked episode (counted once, until room appears).
    pub fn transmit_up_to(&mut self, chan: ChannelId, limit: usize, class: BatchClass) -> usize {
        let (src, now) = (&mut *self.src, self.now);
        let Some(ch) = self.accounts.chans.get_mut(&chan) else {
            return 0;
        };
        let conn_id = ch.writes_on;
        let Some(conn) = self.accounts.conns.get_mut(&conn_id) else {
            return 0;
        };
        let bound = match class {
            BatchClass::Quiet { .. } => 2 * self.outbuf,
            _ => self.outbuf,
        };
        let room = bound.saturating_sub(conn.in_flight);
        if room == 0 {
            if !ch.blocked && src.has_pending(chan) {
                ch.blocked = true;
                self.accounts.stats.outbuf_full_events += 1;
            }
            return 0;
        }
        ch.blocked = false;
        let room = room.min(limit);
        let framing = self.accounts.framing;
        let mut out = BatchOut::new(framing, room.min(64));
        let n = match class {
            BatchClass::Quiet { below } => {
                let mut n = 0;
                while n < room
                    && src.channel_priority(chan, now).is_some_and(|p| p < below)
                    && out.take(src, chan, 1, now) == 1
                {
                    n += 1;
                }
                n
            }
            _ => {
                let mut n = 0;
                while n < room {
                    let k = out.take(src, chan, room - n, now);
                    n += k;
                    // Without framing one call takes all it can; with it, a call stops at the
                    // end of a record, and a call that took nothing means no more cells.
                    if k == 0 || framing.is_none() {
                        break;
                    }
                }
                n
            }
        };
        let bytes = out.finish();
        if n == 0 {
            return 0;
        }
        conn.in_flight += n;
        if self.cfg.paced {
            conn.unpaid += n;
        }
        let mut samples = Vec::new();
        while let Some(s) = src.poll_cell_sample() {
            samples.push(s);
        }
        conn.batches.push_back((n, samples));
        if let BatchClass::Quiet { .. } = class {
            self.accounts.stats.quiet_cells += n as u64;
        }
        self.accounts.transmits.push_back(Transmit {
            chan,
            conn: conn_id,
            bytes,
            cells: n,
            class,
            framing,
            paced: self.cfg.paced,
        });
        n
    }
}
