//! Connections and split-direction channels: which connections make up a channel, binding a
//! peer's second connection, opening and merging ours. The policy is
//! [`chive_core::split::SplitChannel`]'s; this is its IO.

use std::sync::atomic::Ordering;
use std::time::Instant;

use chive_cell::{decode_cell, AnyCell, Bind, CellCommand, VarCell, CELL_LEN};
use chive_core::split::{
    Conn, Decision, Refusal, SecondaryDown, SplitChannel, SplitMode, Violation,
};
use chive_core::ChannelId;
use chive_net::SPLIT_DIRECTION;
use tracing::{debug, info, warn};

use super::tasks::spawn_conn;
use super::{hex_peer, ChanIo, ConnHandles, ConnIo, Driver, Input, LinkUp};

/// Capacity (cells) of the receive buffer [`Driver::on_cell`] keeps between cells.
const RECV_SCRATCH_KEEP: usize = 16;

/// Connections and split-direction channels (the policy; the ordering rules are in split.rs).
impl Driver {
    /// Hand the core the cells kept from connections it no longer asks to leave unread.
    pub(super) fn resume_reads(&mut self, now: Instant) {
        if self.stalled.is_empty() {
            return;
        }
        let conns: Vec<ChannelId> = self.stalled.keys().copied().collect();
        for conn in conns {
            while !self.core.read_paused(conn) {
                let Some((bytes, credit)) = self.stalled.get_mut(&conn).and_then(|q| q.pop_front())
                else {
                    break;
                };
                self.on_cells(conn, &bytes, now);
                drop(credit);
            }
            if self.stalled.get(&conn).is_some_and(|q| q.is_empty()) {
                self.stalled.remove(&conn);
            }
        }
    }

    /// Which channel a connection belongs to, and as which of its connections.
    pub(super) fn locate(&self, conn: ChannelId) -> Option<(ChannelId, Conn)> {
        if self.chans.contains_key(&conn) {
            return Some((conn, Conn::Primary));
        }
        self.secondaries
            .get(&conn)
            .map(|chan| (*chan, Conn::Secondary))
    }

    /// Forget a channel's connections (the caller closes them and tells the core).
    pub(super) fn remove_channel(&mut self, chan: ChannelId) -> Option<ChanIo> {
        let io = self.chans.remove(&chan)?;
        if let Some(s) = &io.secondary {
            self.secondaries.remove(&s.id);
        }
        self.send.remove_channel(chan);
        self.switching.forget(chan);
        Some(io)
    }

    pub(super) fn link_up(&mut self, up: LinkUp, now: Instant) {
        let LinkUp {
            chan,
            peer,
            initiator,
            addr,
            features,
            bind_token,
            fd,
            conn,
        } = up;
        self.switching.link_fd(chan, fd);
        let split_ok = features.contains(SPLIT_DIRECTION) && peer.is_some();
        let split = SplitChannel::new(split_ok, initiator, bind_token, &self.split, now);
        // An accepted link that negotiated the feature may be another channel's second
        // connection; its first cell (BIND or not) tells, so the core waits for it.
        let wait_for_bind = split.may_be_bound();
        if let Some(p) = peer {
            info!(?chan, peer = %p, initiator, split = split_ok, "relay link up");
        }
        self.chans.insert(
            chan,
            ChanIo {
                primary: ConnIo::new(chan, conn),
                secondary: None,
                peer,
                initiator,
                split,
                addr: (!initiator).then_some(addr.ip()),
                reported: 0,
                held_cells: 0,
                held_since: None,
            },
        );
        self.send.add_channel(chan);
        if !wait_for_bind {
            self.open_channel(chan, now);
        }
    }

    /// Tell the core about a channel.
    fn open_channel(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if !io.split.open() {
            return;
        }
        let (peer, initiator) = (io.peer, io.initiator);
        if self.switch_link_opened(chan, peer, now) {
            return;
        }
        self.core.channel_opened(chan, peer, initiator, now);
        self.tell_addr(chan, now);
        if self.split.mode == SplitMode::Always {
            self.start_split(chan, now);
        }
    }

    fn deliver(&mut self, chan: ChannelId, cell: AnyCell, now: Instant) {
        match cell {
            AnyCell::Fixed(cell) => self.core.handle_cell(chan, cell, now),
            AnyCell::Var(cell) => self.core.handle_var_cell(chan, cell, now),
        }
    }

    /// The whole cells a link reader read on `conn` (wire bytes, in order): each is decoded
    /// here and handed on, so a relayed cell goes from the read buffer to the core without
    /// passing through a batch of decoded cells.
    pub(super) fn on_cells(&mut self, conn: ChannelId, bytes: &[u8], now: Instant) {
        let mut rest = bytes;
        while !rest.is_empty() {
            // The fixed cells that go straight to the core, handed over together: the core
            // passes on a run of one circuit's cells with one lookup (`handle_cells_wire`).
            if let Some((chan, n)) = self.direct_fixed_run(conn, rest) {
                let (direct, tail) = rest.split_at(n * CELL_LEN);
                self.core
                    .handle_cells_wire(chan, direct, &mut self.cell_scratch, now);
                rest = tail;
                continue;
            }
            // A fixed cell (every cell a relay passes on): handed to the core as its wire
            // bytes, which a relay copies once, into its circuit queue (`handle_cell_wire`).
            if let Some((cell, tail)) = rest
                .split_first_chunk::<CELL_LEN>()
                .filter(|(c, _)| !CellCommand(c[4]).is_variable())
            {
                rest = tail;
                if !self.on_fixed_cell(conn, cell, now) {
                    return self.conn_down(conn, "undecodable cell bytes", now);
                }
                continue;
            }
            match decode_cell(rest) {
                Ok(Some((cell, used))) => {
                    rest = rest.get(used..).unwrap_or_default();
                    self.on_cell(conn, cell, now);
                }
                // The reader cuts whole cells with the same framing, so this is a bug; the
                // connection is closed rather than trusted further.
                Ok(None) | Err(_) => {
                    warn!(
                        ?conn,
                        left = rest.len(),
                        "undecodable bytes from a link reader"
                    );
                    return self.conn_down(conn, "undecodable cell bytes", now);
                }
            }
        }
    }

    /// How many of the cells at the start of `bytes` take `on_fixed_cell`'s fast path (fixed,
    /// not PADDING, the channel open, nothing held back, the split direct), counted by the
    /// split as that path counts them; the first that does not is left for the per-cell path
    /// (a split that refuses a cell directly changes nothing, so it may be asked again).
    /// Returns the channel and the count, `None` if there are none.
    fn direct_fixed_run(&mut self, conn: ChannelId, bytes: &[u8]) -> Option<(ChannelId, usize)> {
        let (chan, which) = self.locate(conn)?;
        let io = self.chans.get_mut(&chan)?;
        if !io.split.is_open() || io.held_cells != 0 {
            return None;
        }
        let n = bytes
            .chunks_exact(CELL_LEN)
            .take_while(|c| {
                let command = CellCommand(c[4]);
                !command.is_variable()
                    && command != CellCommand::PADDING
                    && io.split.receive_direct_fixed(which)
            })
            .count();
        (n > 0).then_some((chan, n))
    }

    /// `on_cell` for the fixed cell `wire`: its wire bytes to the core in the common case
    /// (`receive_direct`'s), otherwise decoded (into the reused `cell_scratch`) into
    /// `on_cell`'s path. False if it does not decode (the connection is then closed).
    fn on_fixed_cell(&mut self, conn: ChannelId, wire: &[u8; CELL_LEN], now: Instant) -> bool {
        if CellCommand(wire[4]) == CellCommand::PADDING {
            return true;
        }
        let Some((chan, which)) = self.locate(conn) else {
            return true;
        };
        let Some(io) = self.chans.get_mut(&chan) else {
            return true;
        };
        // The same test as `on_cell`'s fast path (after the channel is open).
        if io.split.is_open() && io.held_cells == 0 && io.split.receive_direct_fixed(which) {
            self.core
                .handle_cell_wire(chan, wire, &mut self.cell_scratch, now);
            return true;
        }
        if self.cell_scratch.decode_from(wire).is_err() {
            return false;
        }
        self.on_cell(conn, AnyCell::Fixed(self.cell_scratch.clone()), now);
        true
    }

    pub(super) fn on_cell(&mut self, conn: ChannelId, cell: AnyCell, now: Instant) {
        // A keepalive (`LinkKeepalive`) only proves the peer alive, which reading it did. It is
        // no part of the channel's cell order: a split channel's HANDOFF counts exclude it, and
        // it may arrive on a write-only second connection.
        if matches!(&cell, AnyCell::Fixed(c) if c.command == CellCommand::PADDING) {
            return;
        }
        let Some((chan, which)) = self.locate(conn) else {
            return;
        };
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if !io.split.is_open() {
            if let AnyCell::Var(v) = &cell {
                if v.command == CellCommand::BIND {
                    return self.bind(chan, &v.payload);
                }
            }
            self.open_channel(chan, now);
        }
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        // The common case (nothing held back, no marker): straight to the core, as
        // `receive` + `after_receive` would deliver it, without the moves through `out`.
        if io.held_cells == 0 && io.split.receive_direct(which, &cell) {
            return self.deliver(chan, cell, now);
        }
        // A reused buffer: a fresh Vec here was one allocation per relayed cell.
        let mut out = std::mem::take(&mut self.recv_scratch);
        let result = match io.split.receive(which, cell, &mut out) {
            Ok(switched) => Ok(switched),
            Err(Refusal::Violation(v)) => Err(v),
            Err(Refusal::OneWay) => {
                warn!(?chan, "peer wrote on our one-way connection; dropping it");
                self.recv_scratch = out;
                return self.secondary_down(chan, "peer wrote on a one-way connection", now);
            }
        };
        self.after_receive(chan, &mut out, result, now);
        // Keep a small buffer only (a hand-off may release many held-back cells at once).
        if out.capacity() <= RECV_SCRATCH_KEEP {
            self.recv_scratch = out;
        }
    }

    /// Deliver what the split state released, log switches, close on violations, pause readers.
    fn after_receive(
        &mut self,
        chan: ChannelId,
        out: &mut Vec<AnyCell>,
        result: Result<Option<Conn>, Violation>,
        now: Instant,
    ) {
        for cell in out.drain(..) {
            self.deliver(chan, cell, now);
        }
        if self
            .chans
            .get(&chan)
            .is_some_and(|io| io.split.held() != io.held_cells)
        {
            self.report_buffered(chan, now);
        }
        let switched = match result {
            Ok(switched) => switched,
            Err(v) => return self.split_violation(chan, v, now),
        };
        if let Some(after) = switched {
            let peer = hex_peer(self.chans.get(&chan).and_then(|io| io.peer));
            match after {
                Conn::Secondary => {
                    info!(?chan, %peer, "channel went split: peer writes on its own connection")
                }
                Conn::Primary => {
                    info!(?chan, %peer, "channel back to one connection: peer writes on ours again")
                }
            }
        }
        self.update_holds(chan);
    }

    /// Pause reading a connection whose cells pile up waiting for a HANDOFF on the other;
    /// resume once they can flow.
    fn update_holds(&mut self, chan: ChannelId) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let Some(wants) = io.split.holds() else {
            return;
        };
        for (which, want) in wants {
            if let Some(c) = io.conn_mut(which) {
                if c.held != want {
                    c.held = want;
                    let _ = c.h.hold.send(want);
                }
            }
        }
    }

    fn split_violation(&mut self, chan: ChannelId, v: Violation, now: Instant) {
        warn!(?chan, reason = %v, "closing split channel: peer broke the hand-off rules");
        if let Some(io) = self.remove_channel(chan) {
            io.close();
        }
        self.core.channel_closed(chan, now);
    }

    /// The first cell of accepted link `conn` was a BIND: attach it to the channel it names.
    fn bind(&mut self, conn: ChannelId, payload: &[u8]) {
        let Some(x) = self.chans.remove(&conn) else {
            return;
        };
        // Whatever comes of it, the link is no channel of its own: nothing was sent on it.
        self.send.remove_channel(conn);
        let refuse = |x: ChanIo, why: &str| {
            warn!(?conn, peer = %hex_peer(x.peer), why, "refusing BIND");
            x.close();
        };
        let Ok(bind) = Bind::decode(payload) else {
            return refuse(x, "malformed BIND");
        };
        let target = self.chans.iter_mut().find(|(_, io)| {
            io.peer == x.peer && io.secondary.is_none() && io.split.bind_matches(&bind.token)
        });
        let Some((&chan, io)) = target else {
            return refuse(x, "no channel of ours with that peer and token");
        };
        if !io.split.attach_peer_second(bind.seq) {
            return refuse(x, "out of step with the channel's hand-off markers");
        }
        io.secondary = Some(x.primary);
        self.secondaries.insert(conn, chan);
        info!(?chan, ?conn, peer = %hex_peer(io.peer), "second connection bound to channel");
    }

    /// A channel's second connection closed or failed.
    pub(super) fn secondary_down(&mut self, chan: ChannelId, why: &str, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if let Some(s) = io.secondary.take() {
            self.secondaries.remove(&s.id);
            self.send.detach_conn(s.id);
            s.close();
        }
        let mut out = Vec::new();
        match io.split.secondary_down(now, &mut out) {
            SecondaryDown::Nothing => {}
            SecondaryDown::Released(result) => {
                debug!(?chan, %why, "peer's second connection closed");
                self.after_receive(chan, &mut out, result, now);
            }
            SecondaryDown::Resume { recover } => {
                if let Some(h) = recover {
                    io.primary.send_var(CellCommand::HANDOFF, h.encode());
                    info!(?chan, %why, "channel back to one connection: second connection failed");
                }
                self.transmit(chan, now);
            }
        }
    }

    /// Our second connection for `chan` is ready: switch our writing to it.
    pub(super) fn split_up(
        &mut self,
        chan: ChannelId,
        conn_id: ChannelId,
        conn: ConnHandles,
        now: Instant,
    ) {
        let Some(io) = self.chans.get_mut(&chan) else {
            conn.reader.abort();
            return;
        };
        let Some(h) = io.split.second_up() else {
            // Not wanted any more (merged, failed, or one is already there).
            conn.reader.abort();
            return;
        };
        // The marker goes behind every cell already handed to the first connection's writer.
        io.primary.send_var(CellCommand::HANDOFF, h.encode());
        io.secondary = Some(ConnIo::new(conn_id, conn));
        self.secondaries.insert(conn_id, chan);
        self.send.attach_conn(chan, conn_id);
        info!(?chan, peer = %hex_peer(io.peer), "channel went split: we write on our own connection");
        self.transmit(chan, now);
    }

    /// Open our second connection for `chan` if it is eligible and none is open or opening.
    fn start_split(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let Some(peer) = io.peer else {
            return;
        };
        let Some(token) = io.split.wants_second(now) else {
            return;
        };
        let seq = io.split.bind_seq();
        // The peer's ORPort comes from the consensus, as for any relay link.
        let Some(addr) = self.relay_addrs.get(&peer).copied() else {
            return;
        };
        io.split.opening();
        let conn_id = ChannelId(self.next_chan.fetch_add(1, Ordering::Relaxed));
        let cfg = self.cfg.link.clone();
        let limits = self.cfg.limits.clone();
        let liveness = self.cfg.liveness;
        let tx = self.tx.clone();
        debug!(?chan, %addr, "opening second connection");
        tokio::spawn(async move {
            let opened = async {
                let link = chive_net::connect(addr, Some(peer), &cfg)
                    .await
                    .map_err(|e| e.to_string())?;
                if !link.features.contains(SPLIT_DIRECTION) {
                    return Err("peer did not offer split-direction on it".to_string());
                }
                let (reader, mut writer) = link.split(limits);
                let bind = VarCell {
                    circ_id: 0,
                    command: CellCommand::BIND,
                    payload: Bind { token, seq }.encode(),
                };
                writer
                    .write_var_cell(&bind)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((reader, writer))
            }
            .await;
            match opened {
                Ok((reader, writer)) => {
                    let conn = spawn_conn(conn_id, reader, writer, liveness, tx.clone());
                    let _ = tx
                        .send(Input::SplitUp {
                            chan,
                            conn_id,
                            conn,
                        })
                        .await;
                }
                Err(why) => {
                    let _ = tx.send(Input::SplitFailed { chan, why }).await;
                }
            }
        });
    }

    /// "dynamic": go back to one connection (marker on the second, which then closes).
    fn merge(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if io.secondary.is_none() {
            return;
        }
        let Some(h) = io.split.merge() else {
            return;
        };
        let Some(s) = io.secondary.take() else {
            return;
        };
        s.send_var(CellCommand::HANDOFF, h.encode());
        self.secondaries.remove(&s.id);
        self.send.detach_conn(s.id);
        s.close();
        info!(?chan, peer = %hex_peer(io.peer), "channel back to one connection: second connection idle");
        self.transmit(chan, now);
    }

    /// Periodic split-direction work: silent accepted links become channels; "always" retries;
    /// "dynamic" measures and decides.
    pub(super) fn split_tick(&mut self, now: Instant) {
        let silent: Vec<ChannelId> = self
            .chans
            .iter()
            .filter(|(_, io)| io.split.bind_wait_over(now))
            .map(|(c, _)| *c)
            .collect();
        for chan in silent {
            self.open_channel(chan, now);
        }
        if self.split.mode == SplitMode::Off {
            return;
        }
        let mut split = Vec::new();
        let mut merge = Vec::new();
        for (chan, io) in self.chans.iter_mut() {
            match io.split.tick(self.split.mode, now) {
                Decision::Split => split.push(*chan),
                Decision::Merge => merge.push(*chan),
                Decision::Stay => {}
            }
        }
        for chan in split {
            self.start_split(chan, now);
        }
        for chan in merge {
            self.merge(chan, now);
        }
    }
}
