//! Circuit switching, connection variant (paper 003, issue 16), wired into the core: the entry
//! (the *mover*) moves its heaviest circuit off a congested connection C1 onto a second
//! connection C2 to the same next hop (the *peer*), in order and without a lost cell.
//! Protocol: docs/protocol.md, "Circuit switching"; the per-circuit state machines are
//! [`crate::switching::conn`]; this file holds the tables that connect them to channels,
//! circuit ids and queues.
//!
//! - The driver's detector reports a congested connection ([`Core::congested`]); the core picks
//!   the heaviest circuit it is the entry of and sends SWITCH_CONN on the peer's *switch
//!   connection* (one per peer, opened on demand with [`Event::ConnectSwitch`], never the
//!   canonical channel new circuits use, and never switched from).
//! - Every endpoint of a circuit in a switch is in `ends` (old and new); `handle_cell` routes
//!   cells on them here first ([`Core::sw_intercept`]), so held cells, acknowledgements and
//!   DESTROYs on the new id never reach the ordinary paths before the markers allow it.
//! - Counters (`SwCounts`) give the relay cells of each circuit per direction on its current
//!   connection: the markers carry them and the receiver checks them.
//! - Submodules: `trigger` (the detector's report and the choice of the circuit, both modes),
//!   `handover` (cells on a circuit in a switch: interception, markers, SWITCH_CONN).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use chive_cell::{
    Cell, CellCommand, CircId, DestroyReason, SwitchAck, SwitchConn, SwitchMarker, SwitchStatus,
};
use chive_crypto::IdentityKey;
use tracing::{debug, info, warn};

use crate::idmap::{LocalMap, LocalSet};
use crate::switching::{AckOutcome, ConnViolation, MoverSwitch, PeerDrop, PeerSwitch};
use crate::{ChannelId, CircKey};

mod handover;
mod trigger;

use super::switch_report::{SwitchMode, SwitchOutcome, SwitchRecord, SwitchSettings, SwitchStats};

use super::circuit::{queue_id, Role, Side};
use super::event::Event;
use super::Core;

/// How long after a failed connection opened ahead the entry waits before opening one ahead to
/// that peer again (a switch that needs one still opens it at once).
const PREOPEN_BACKOFF: Duration = Duration::from_secs(30);

/// Switch records waiting for the driver beyond this are dropped (bounded memory).
const MAX_PENDING_RECORDS: usize = 1000;

/// A switch connection that carried no circuit and no switch in progress for this long is
/// closed (the mover's side; opened ahead at α, it may never be used, and its circuits end).
/// A later switch to that peer opens a new one.
pub const SWITCH_IDLE_CLOSE: Duration = Duration::from_secs(60);

/// How often the mover looks for idle switch connections while it has one: a connection is
/// closed between [`SWITCH_IDLE_CLOSE`] and that plus this after it became idle.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// Relay cells of one circuit per direction on its current connection in that direction.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SwCounts {
    /// Handed to the channel toward [prev, next].
    pub(super) sent: [u64; 2],
    /// Received from [prev, next].
    pub(super) recv: [u64; 2],
}

fn ix(side: Side) -> usize {
    match side {
        Side::Prev => 0,
        Side::Next => 1,
    }
}

/// Whether a cell is one the markers count.
pub(super) fn counted(command: CellCommand) -> bool {
    command == CellCommand::RELAY || command == CellCommand::RELAY_EARLY
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// The circuit's id on C1.
    Old,
    /// Its id on C2.
    New,
}

enum Spare {
    /// Being opened; circuits (and the connection they leave) waiting for it.
    Opening(Vec<(CircKey, ChannelId, Instant)>),
    Open(ChannelId),
}

struct Mover {
    ms: MoverSwitch<Cell>,
    /// When the detector fired (the switch-time metric starts here). The SWITCH_ACK timeout
    /// runs from SWITCH_CONN going out (`ms`), not from here: a switch that waited for its
    /// connection to open must not spend its timeout on the handshake.
    triggered: Instant,
    /// When the circuit's last cell left on the old connection.
    last_old: Option<Instant>,
    old: (ChannelId, CircId),
    new: (ChannelId, CircId),
}

struct Peer {
    ps: PeerSwitch<Cell>,
    old: (ChannelId, CircId),
    new: (ChannelId, CircId),
}

/// The core's switching tables. See the module documentation.
#[derive(Default)]
pub(super) struct SwitchState {
    settings: SwitchSettings,
    /// Per next hop: the switch connection (mover side).
    spare: HashMap<IdentityKey, Spare>,
    /// Next hops whose switch connection, opened ahead, failed: not opened ahead again before
    /// the given time ([`PREOPEN_BACKOFF`]), so an unreachable peer is not dialled every sample.
    preopen_failed: HashMap<IdentityKey, Instant>,
    /// Channels opened as switch connections (never canonical, never switched from).
    switch_chans: LocalSet<ChannelId>,
    /// Switch connections found idle (no circuit, no switch in progress) at the last check,
    /// and since when.
    idle_since: HashMap<ChannelId, Instant>,
    /// The next look for idle switch connections (while there is one).
    idle_check_at: Option<Instant>,
    /// Per next hop with a switch connection: SWITCH_CONN → SWITCH_ACK round trips (smoothed
    /// with gain 1/8, latest). The ACK timeout of the next switch to that peer is
    /// `confirm_timeout(SwitchTimeoutMsec, SwitchTimeoutRttFactor, max of the two)`.
    ack_rtt: HashMap<IdentityKey, (Duration, Duration)>,
    movers: LocalMap<CircKey, Mover>,
    peers: LocalMap<CircKey, Peer>,
    /// Every endpoint of a circuit in a switch.
    pub(super) ends: HashMap<(ChannelId, CircId), (CircKey, End)>,
    /// Moved circuits whose first cell on the new connection has not left yet:
    /// (trigger time, old channel, new channel, last cell on the old one).
    pub(super) first_cell: LocalMap<CircKey, (Instant, ChannelId, ChannelId, Option<Instant>)>,
    /// The next switch number per circuit (both roles).
    seq: LocalMap<CircKey, u32>,
    stats: SwitchStats,
    records: VecDeque<SwitchRecord>,
}

impl SwitchState {
    pub(super) fn settings(&self) -> SwitchSettings {
        self.settings
    }

    pub(super) fn stats_mut(&mut self) -> &mut SwitchStats {
        &mut self.stats
    }

    pub(super) fn push_record(&mut self, r: SwitchRecord) {
        self.record(r);
    }

    fn record(&mut self, r: SwitchRecord) {
        if self.records.len() < MAX_PENDING_RECORDS {
            self.records.push_back(r);
        }
    }

    /// Whether `cell_left` has anything to track.
    pub(super) fn tracking(&self) -> bool {
        !self.first_cell.is_empty() || !self.movers.is_empty()
    }

    /// Called by `poll_transmit` for a cell of `key` leaving on `chan`: the switch-time figure.
    pub(super) fn cell_left(&mut self, key: CircKey, chan: ChannelId, now: Instant) {
        if let Some(m) = self.movers.get_mut(&key) {
            if m.old.0 == chan {
                m.last_old = Some(now);
            }
        }
        if let Some(&(triggered, from, to, last_old)) = self.first_cell.get(&key) {
            if to == chan {
                self.first_cell.remove(&key);
                self.stats.switches += 1;
                self.record(SwitchRecord {
                    circ: key,
                    from,
                    to: Some(to),
                    triggered,
                    ended: now,
                    last_old,
                    outcome: SwitchOutcome::Switched,
                    mode: SwitchMode::Connection,
                    confirm_wait: None,
                    confirm_timeout: None,
                    held_by: None,
                });
            }
        }
    }
}

impl Core {
    /// Set the switching mode and timeout (relay option over consensus parameter).
    pub fn set_switching(&mut self, settings: SwitchSettings) {
        self.sw.settings = settings;
    }

    /// The switching settings in force.
    pub fn switching(&self) -> SwitchSettings {
        self.sw.settings
    }

    /// Switching counters.
    pub fn switch_stats(&self) -> SwitchStats {
        self.sw.stats
    }

    /// The next finished switch this node started (for the metrics' `switch` record).
    pub fn poll_switch_record(&mut self) -> Option<SwitchRecord> {
        self.sw.records.pop_front()
    }

    /// Whether `chan` is a switch connection (the driver samples only the others).
    pub fn is_switch_channel(&self, chan: ChannelId) -> bool {
        self.sw.switch_chans.contains(&chan)
    }

    /// Whether this node is the entry of a circuit on relay channel `chan`: the connections a
    /// driver runs a congestion detector on (connection mode only).
    pub fn may_switch_from(&self, chan: ChannelId) -> bool {
        if self.sw.settings.mode == SwitchMode::Off || self.is_switch_channel(chan) {
            return false;
        }
        let Some(ch) = self.channels.get(&chan) else {
            return false;
        };
        ch.peer.is_some()
            && ch
                .circ_ids
                .iter()
                .any(|(&id, key)| self.is_entry_circuit(*key, chan, id))
    }

    /// handshake as `chan`: it becomes a channel to `peer` that new circuits do not use.
    pub fn switch_channel_opened(&mut self, chan: ChannelId, peer: IdentityKey, now: Instant) {
        self.channels
            .insert(chan, self.new_channel(Some(peer), true));
        self.sw.switch_chans.insert(chan);
        self.sw.idle_check_at.get_or_insert(now + IDLE_CHECK);
        let waiting = match self.sw.spare.insert(peer, Spare::Open(chan)) {
            Some(Spare::Opening(w)) => w,
            _ => Vec::new(),
        };
        for (key, c1, triggered) in waiting {
            self.send_switch_conn(key, c1, chan, triggered, now);
        }
    }

    /// Opening the switch connection to `peer` failed: its waiting circuits stay where they are.
    pub fn switch_connect_failed(&mut self, peer: IdentityKey, now: Instant) {
        if let Some(Spare::Opening(waiting)) = self.sw.spare.remove(&peer) {
            if waiting.is_empty() {
                // Opened ahead: no switch waited for it.
                self.sw.preopen_failed.retain(|_, until| *until > now);
                self.sw.preopen_failed.insert(peer, now + PREOPEN_BACKOFF);
            }
            for (key, c1, triggered) in waiting {
                self.sw.stats.failed += 1;
                self.sw.record(SwitchRecord {
                    circ: key,
                    from: c1,
                    to: None,
                    triggered,
                    ended: now,
                    last_old: None,
                    outcome: SwitchOutcome::Failed,
                    mode: SwitchMode::Connection,
                    confirm_wait: None,
                    confirm_timeout: None,
                    held_by: None,
                });
            }
        }
    }

    /// Step 1 of the protocol: SWITCH_CONN(seq, X) on C2 with a fresh id Y.
    fn send_switch_conn(
        &mut self,
        key: CircKey,
        c1: ChannelId,
        c2: ChannelId,
        triggered: Instant,
        now: Instant,
    ) {
        let Some(circ) = self.circuits.get(&key) else {
            return;
        };
        let Some((c, x)) = circ.next else { return };
        if c != c1 || self.sw.movers.contains_key(&key) {
            return;
        }
        let received_on_old = circ.sw.recv[ix(Side::Next)];
        let Some(y) = self.alloc_switch_id(c2) else {
            return;
        };
        let seq = self.sw.seq.get(&key).copied().unwrap_or(0);
        let rtt = self
            .channels
            .get(&c2)
            .and_then(|c| c.peer)
            .and_then(|p| self.sw.ack_rtt.get(&p))
            .map(|(smoothed, latest)| (*smoothed).max(*latest));
        let timeout = crate::switching::confirm_timeout(
            self.sw.settings.timeout,
            self.sw.settings.timeout_rtt_factor,
            rtt,
        );
        let body = SwitchConn {
            seq,
            old_circ_id: x,
        }
        .encode();
        let Ok(cell) = Cell::new(y, CellCommand::SWITCH_CONN, &body) else {
            return;
        };
        let ms = MoverSwitch::new(
            seq,
            received_on_old,
            self.cfg.max_circuit_queue,
            now,
            timeout,
        );
        self.sw.ends.insert((c1, x), (key, End::Old));
        self.sw.ends.insert((c2, y), (key, End::New));
        self.sw.movers.insert(
            key,
            Mover {
                ms,
                triggered,
                last_old: None,
                old: (c1, x),
                new: (c2, y),
            },
        );
        debug!(?key, seq, old = x, new = y, "SWITCH_CONN sent");
        self.push_urgent(c2, cell);
    }

    fn alloc_switch_id(&mut self, chan: ChannelId) -> Option<CircId> {
        for _ in 0..8 {
            let id = self.alloc_circ_id(chan)?;
            if !self.sw.ends.contains_key(&(chan, id)) {
                return Some(id);
            }
        }
        None
    }

    fn push_urgent(&mut self, chan: ChannelId, cell: Cell) {
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.urgent.push_back(cell);
            self.mark_ready(chan);
        }
    }

    fn send_marker(&mut self, chan: ChannelId, id: CircId, marker: SwitchMarker) {
        if let Ok(cell) = Cell::new(id, CellCommand::SWITCH, &marker.encode()) {
            self.push_urgent(chan, cell);
        }
    }

    /// Move one direction of `key` to `new`: its queue leaves the old channel's scheduler and
    /// joins the new one's; the new id maps to the circuit.
    fn rebind(&mut self, key: CircKey, side: Side, new: (ChannelId, CircId), now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let old = circ.endpoint(side);
        match side {
            Side::Prev => circ.prev = Some(new),
            Side::Next => circ.next = Some(new),
        }
        circ.sw.sent[ix(side)] = 0;
        circ.queue(side).set_circ_id(new.1);
        let len = circ.queue(side).len();
        let queued = len > 0;
        let q = queue_id(key, side);
        if let Some((c1, _)) = old {
            if let Some(ch) = self.channels.get_mut(&c1) {
                ch.queued = ch.queued.saturating_sub(len);
                ch.sched.deactivate(q);
                ch.sched.forget(q);
            }
        }
        if let Some(ch) = self.channels.get_mut(&new.0) {
            ch.queued += len;
            ch.circ_ids.insert(new.1, key);
            if queued {
                ch.sched.activate(q, now);
            }
        }
        if queued {
            self.mark_ready(new.0);
        }
    }

    /// A switch rule broken: the circuit closes with a logged protocol error.
    fn sw_violation(&mut self, key: CircKey, why: &dyn std::fmt::Display, now: Instant) {
        self.sw.stats.violations += 1;
        self.kill(key, &format!("circuit switching: {why}"), now);
    }

    /// The mover gives up before the cut-over (refused, timed out, connection failed).
    fn end_mover(&mut self, key: CircKey, outcome: SwitchOutcome, now: Instant) {
        let Some(m) = self.sw.movers.remove(&key) else {
            return;
        };
        self.sw.ends.remove(&m.old);
        self.sw.ends.remove(&m.new);
        match outcome {
            SwitchOutcome::Refused => self.sw.stats.refused += 1,
            SwitchOutcome::TimedOut => self.sw.stats.timed_out += 1,
            SwitchOutcome::Failed => self.sw.stats.failed += 1,
            SwitchOutcome::Switched => {}
        }
        self.sw.record(SwitchRecord {
            circ: key,
            from: m.old.0,
            to: Some(m.new.0),
            triggered: m.triggered,
            ended: now,
            last_old: None,
            outcome,
            mode: SwitchMode::Connection,
            confirm_wait: None,
            confirm_timeout: None,
            held_by: None,
        });
    }

    fn sw_forget_state(&mut self, key: CircKey) {
        if let Some(m) = self.sw.movers.remove(&key) {
            self.sw.ends.remove(&m.old);
            self.sw.ends.remove(&m.new);
        }
        if let Some(p) = self.sw.peers.remove(&key) {
            self.sw.ends.remove(&p.old);
            self.sw.ends.remove(&p.new);
        }
    }

    /// A circuit is closing: forget its switch and return the endpoints it still holds besides
    /// `prev` and `next` (they get a DESTROY too).
    pub(super) fn sw_circuit_closing(&mut self, key: CircKey) -> Vec<(ChannelId, CircId)> {
        self.sw.seq.remove(&key);
        self.sw.first_cell.remove(&key);
        if self.sw.ends.is_empty() {
            return Vec::new();
        }
        let (prev, next) = self
            .circuits
            .get(&key)
            .map_or((None, None), |c| (c.prev, c.next));
        let mut extra = Vec::new();
        let mut ends = Vec::new();
        if let Some(m) = self.sw.movers.get(&key) {
            ends.extend([m.old, m.new]);
        }
        if let Some(p) = self.sw.peers.get(&key) {
            ends.extend([p.old, p.new]);
        }
        let lost = self.held_of(key)
            + self
                .sw
                .movers
                .get(&key)
                .map_or(0, |m| m.ms.held_backward() as u64);
        self.sw.stats.cells_lost += lost;
        for e in ends {
            if Some(e) != prev && Some(e) != next {
                if let Some(ch) = self.channels.get_mut(&e.0) {
                    ch.circ_ids.remove(&e.1);
                }
                extra.push(e);
            }
        }
        self.sw_forget_state(key);
        extra
    }

    /// `chan` is closing: switches that needed it end; a switch connection is forgotten.
    pub(super) fn sw_channel_closed(&mut self, chan: ChannelId, now: Instant) {
        if self.sw.switch_chans.remove(&chan) {
            self.sw.idle_since.remove(&chan);
            if let Some(peer) = self.channels.get(&chan).and_then(|c| c.peer) {
                self.sw.ack_rtt.remove(&peer);
            }
            self.sw
                .spare
                .retain(|_, s| !matches!(s, Spare::Open(c) if *c == chan));
        }
        if self.sw.ends.is_empty() {
            return;
        }
        let movers: Vec<CircKey> = self
            .sw
            .movers
            .iter()
            .filter(|(_, m)| m.new.0 == chan && m.ms.state() != crate::switching::MoverState::Moved)
            .map(|(k, _)| *k)
            .collect();
        for key in movers {
            self.end_mover(key, SwitchOutcome::Failed, now);
        }
        let peers: Vec<CircKey> = self
            .sw
            .peers
            .iter()
            .filter(|(_, p)| p.new.0 == chan)
            .map(|(k, _)| *k)
            .collect();
        for key in peers {
            let held = self.held_of(key);
            if held == 0 {
                self.sw_forget_state(key);
            } else {
                self.sw.stats.cells_lost += held;
                self.sw_violation(key, &"new connection closed with cells held", now);
            }
        }
    }

    /// The earliest switch deadline (a mover waiting for SWITCH_ACK, the idle check).
    pub(super) fn sw_next_deadline(&self) -> Option<Instant> {
        self.sw
            .movers
            .values()
            .filter_map(|m| m.ms.next_deadline())
            .chain(self.sw.idle_check_at)
            .min()
    }

    /// Whether switch connection `chan` carries nothing: no circuit, no switch in progress
    /// (an end in `ends`, a circuit whose first cell there has not left), nothing queued.
    fn switch_channel_idle(&self, chan: ChannelId) -> bool {
        let Some(ch) = self.channels.get(&chan) else {
            return false;
        };
        ch.circ_ids.is_empty()
            && ch.urgent.is_empty()
            && !self.sw.ends.keys().any(|(c, _)| *c == chan)
            && !self.sw.first_cell.values().any(|f| f.2 == chan)
    }

    /// The idle check: close the switch connections idle since the check
    /// [`SWITCH_IDLE_CLOSE`] ago or earlier; schedule the next check while one is left.
    fn sw_close_idle(&mut self, now: Instant) {
        self.sw.idle_check_at = None;
        let chans: Vec<ChannelId> = self.sw.switch_chans.iter().copied().collect();
        for chan in chans {
            if !self.switch_channel_idle(chan) {
                self.sw.idle_since.remove(&chan);
                continue;
            }
            let since = *self.sw.idle_since.entry(chan).or_insert(now);
            if now.saturating_duration_since(since) < SWITCH_IDLE_CLOSE {
                continue;
            }
            info!(
                ?chan,
                idle_s = now.saturating_duration_since(since).as_secs(),
                "closing the idle switch connection"
            );
            self.sw.stats.idle_closed += 1;
            self.channel_closed(chan, now);
            self.events.push_back(Event::CloseChannel {
                chan,
                reason: "switch connection idle".to_string(),
            });
        }
        if !self.sw.switch_chans.is_empty() {
            self.sw.idle_check_at = Some(now + IDLE_CHECK);
        }
    }

    /// Time passed: movers without an acknowledgement give up (DESTROY on the new id cancels
    /// the peer's reservation) and their circuits stay on C1. The peer keeps a reservation
    /// until the marker, a DESTROY on the new id, or a connection closes: its acknowledgement
    /// may be in flight while a timer would run, and cells behind a marker on a congested C1
    /// may take long; a hostile mover holds at most `MAX_PENDING_PER_PEER` reservations of at
    /// most `max_circuit_queue` cells each.
    pub(super) fn sw_handle_timeout(&mut self, now: Instant) {
        if self.sw.idle_check_at.is_some_and(|t| t <= now) {
            self.sw_close_idle(now);
        }
        let expired: Vec<CircKey> = self
            .sw
            .movers
            .iter_mut()
            .filter_map(|(k, m)| m.ms.handle_timeout(now).then_some(*k))
            .collect();
        for key in expired {
            if let Some(m) = self.sw.movers.get(&key) {
                let new = m.new;
                warn!(
                    ?key,
                    "no SWITCH_ACK in time: circuit stays on its connection"
                );
                self.send_destroy(new.0, new.1, DestroyReason::TIMEOUT);
            }
            self.end_mover(key, SwitchOutcome::TimedOut, now);
        }
    }
}

/// The channel a peer's held cells are released on (its new connection).
fn cell_chan(sw: &SwitchState, key: CircKey) -> ChannelId {
    sw.peers.get(&key).map_or(ChannelId(0), |p| p.new.0)
}
