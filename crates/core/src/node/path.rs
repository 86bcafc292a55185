//! Circuit switching, path variant (paper 003 section 4.3.2, issue 16), wired into the core:
//! a client's circuit (the *home* leg, which holds the streams) linked to a spare circuit
//! through another entry and middle to the same exit; the entry's CONGESTED moves the client's
//! sending to the other leg, and the exit puts the client's cells back in order.
//! Protocol: docs/protocol.md, "Path variant"; the sequencing state machines are
//! [`crate::switching::path`]; this file holds the tables that connect them to circuits (the
//! exit's side in `path/exit.rs`, the client's switch decision in `path/switch.rs`, the probe of
//! the other leg in `path/probe.rs`).
//!
//! - Client: [`Core::path_link`] (LINK on a fresh circuit: it becomes a set's home) and
//!   [`Core::path_add_spare`] (LINK on the spare with the same nonce; it joins the sender on
//!   LINKED). Forward multiplexed cells (BEGIN, DATA, END, RESOLVE) of the home's streams go
//!   through the [`PathSender`] ([`Core::path_route`]); the exit's backward stream cells may
//!   come on any leg and apply to the home's streams, circuit-level flow control stays per leg.
//! - Exit: LINK with a new nonce makes a set whose home is that circuit; later LINKs with the
//!   nonce add legs. Multiplexed cells from any leg pass the [`PathReceiver`] and are acted on
//!   in order as the home's; CONFLUX_SWITCH gets a SWITCH_CONFIRM on its leg, which the
//!   client acknowledges (the same message back) once its switch completes. The download
//!   direction is not sequenced: the exit sends on its home leg only, but for stream-level flow
//!   control, which both ends send on their *control leg* (the last leg whose switch is final
//!   at both ends; `Core::path_stream_control_leg`).
//! - Client: a CONGESTED leg, or one a switch onto timed out, is avoided for
//!   `SwitchSettings::leg_avoid`: the client does not switch back onto it before. With
//!   `SwitchSettings::lighter_leg_only` a CONGESTED does not move the upload onto a leg that
//!   measures heavier (smoothed round trip, `SetRtt::heavier`).
//! - Entry: [`Core::congested`] in path mode sends CONGESTED (from hop 1) on the heaviest
//!   circuit whose previous hop is a client (`path_congested`).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use chive_cell::{
    ConfluxLink, ConfluxSwitch, Congested, CongestionReason, DestroyReason, RelayCommand, Sendme,
    SwitchConfirm,
};
use rand::RngCore;
use tracing::{debug, info, warn};

use crate::idmap::LocalMap;
use crate::switching::{
    confirm_timeout, Arrival, ConfirmOutcome, Fallback, PathLimits, PathReceiver, PathSender,
    SendError, SetRtt,
};
use crate::{ChannelId, CircKey};

use super::circuit::Role;
use super::event::CoreError;
#[cfg(doc)]
use super::switch_report::SwitchSettings;
use super::switch_report::{SwitchHold, SwitchMode, SwitchOutcome, SwitchRecord};
use super::Core;

mod exit;
mod probe;
mod stripe;
mod switch;

/// A multiplexed relay message: what the sender keeps for a fallback and the receiver
/// buffers out of order.
type Msg = (RelayCommand, u16, Vec<u8>);

/// Multiplexed cells a client may defer while its sender is blocked (BEGIN and END only:
/// DATA waits in the stream). Beyond it the set fails.
const MAX_DEFERRED: usize = 4096;

/// Whether a relay command is sequenced across the legs (prop 329's multiplexed list).
pub(super) fn multiplexed(cmd: RelayCommand) -> bool {
    matches!(
        cmd,
        RelayCommand::BEGIN
            | RelayCommand::DATA
            | RelayCommand::END
            | RelayCommand::CONNECTED
            | RelayCommand::RESOLVE
            | RelayCommand::RESOLVED
    )
}

/// The relay commands of the path variant (never passed to the stream code).
pub(super) fn is_path_command(cmd: RelayCommand) -> bool {
    matches!(
        cmd,
        RelayCommand::CONFLUX_LINK
            | RelayCommand::CONFLUX_LINKED
            | RelayCommand::CONFLUX_LINKED_ACK
            | RelayCommand::CONFLUX_SWITCH
            | RelayCommand::SWITCH_CONFIRM
            | RelayCommand::CONGESTED
            | RelayCommand::LEG_PROBE
    )
}

struct ClientSet {
    nonce: [u8; 32],
    sender: PathSender<Msg>,
    /// The linked spare.
    spare: Option<CircKey>,
    /// A spare whose LINKED has not come yet, and until when it may take.
    linking: Option<(CircKey, Instant)>,
    /// The switch in progress: CONGESTED's arrival, the channels left and taken, and when the
    /// first cell went on the new leg.
    switch: Option<PendingRecord>,
    /// BEGIN / END cells that could not go while the sender was blocked, in order.
    deferred: VecDeque<Msg>,
    /// When the last multiplexed cell was sent (on any leg).
    last_sent: Option<Instant>,
    /// The leg the client's stream-level flow control goes on: the last leg a switch onto
    /// was confirmed (home at first). Not the pending leg: a switch that falls back would
    /// lose what went on it.
    control: CircKey,
    /// Legs not to switch onto before the given time (their entry reported congestion, or a
    /// switch onto them timed out): see [`SwitchSettings::leg_avoid`].
    avoid: Vec<(CircKey, Instant)>,
    /// Round trips measured on the legs; the sender's confirmation timeout follows them.
    rtt: SetRtt,
    /// LINKs sent and not answered yet (for a LINK → LINKED round trip).
    link_sent: Vec<(CircKey, Instant)>,
    /// The LEG_PROBE out on the other leg, if any (one at a time).
    probe: Option<probe::Probe>,
    /// The last probe id used.
    probe_id: u64,
    /// The last probe answer: its leg and when it came (with `probe_ahead`, a fresh one
    /// decides a report at once).
    probe_answer: Option<(CircKey, Instant)>,
    /// When the last probe went out (with `probe_ahead`, at most one per `PROBE_AHEAD_EVERY`).
    probe_sent: Option<Instant>,
    /// When each leg last gave a round-trip sample (a circuit SENDME, a confirmation): a
    /// released switch past its deadline on a leg heard from since is late, not lost.
    heard: Vec<(CircKey, Instant)>,
}

impl ClientSet {
    fn avoid(&mut self, leg: CircKey, until: Instant, now: Instant) {
        self.avoid.retain(|(l, u)| *l != leg && *u > now);
        self.avoid.push((leg, until));
    }

    fn avoided(&self, leg: CircKey, now: Instant) -> bool {
        self.avoid
            .iter()
            .any(|(l, until)| *l == leg && *until > now)
    }
}

#[derive(Clone, Copy)]
struct PendingRecord {
    triggered: Instant,
    from: ChannelId,
    to: Option<ChannelId>,
    first_cell: Option<Instant>,
    /// When the last cell before the switch went on the old leg.
    last_old: Option<Instant>,
    /// What held the first cell on the new leg right after the switch.
    held_by: Option<SwitchHold>,
}

struct ExitSet {
    home: CircKey,
    /// Where stream-level flow control for the home's streams goes back, and the switch
    /// number that put it there: the last leg whose SWITCH_CONFIRM the client acknowledged
    /// (home at first). Only an acknowledged leg: the client may still fall back from a leg
    /// whose confirmation it has not seen, and what went back on that leg would be lost.
    control: (CircKey, u64),
    /// Confirmations sent and not yet acknowledged, per leg (the latest).
    unacked: Vec<(CircKey, u64)>,
    legs: Vec<CircKey>,
    /// The client's cells, put back in order; each buffered one with its arrival (the OOM
    /// handler's age).
    recv: PathReceiver<(Instant, Msg)>,
    /// Circuit SENDMEs withheld per leg (the digests, oldest first) while the leg was ahead
    /// and the buffer high ([`PathReceiver::withholds`]). One per 100 cells the leg brought
    /// meanwhile, so at most `max_buffered / 100 + 1` per leg before the set closes.
    withheld: Vec<(CircKey, Vec<[u8; 20]>)>,
    /// DATA cells accepted and not yet delivered (held out of order), per stream id: with
    /// what the stream has delivered and not acknowledged, bounded by one stream window per
    /// leg (`path/exit.rs`, `path_exit_stream_bound`).
    pending_data: HashMap<u16, u32>,
    /// The most legs the set has had: the client may have a window's worth of cells charged
    /// to each (also to a leg that closed since, re-sent on another).
    peak_legs: usize,
}

/// The core's path-switching tables. See the module documentation.
#[derive(Default)]
pub(super) struct PathTables {
    /// Client: home leg → its set.
    client: LocalMap<CircKey, ClientSet>,
    /// Client: spare leg (linked or linking) → home.
    client_spare: LocalMap<CircKey, CircKey>,
    /// Exit: sets by id.
    exit: HashMap<u64, ExitSet>,
    /// Exit: nonce → set id. The nonce is a secret: never logged.
    exit_nonce: HashMap<[u8; 32], u64>,
    /// Exit: leg → set id.
    exit_leg: LocalMap<CircKey, u64>,
    /// Exit: cells buffered out of order over every set (counted against `MaxMemInQueues`).
    exit_buffered: usize,
    next_set: u64,
}

impl Core {
    fn path_limits(&self) -> PathLimits {
        let s = self.sw.settings();
        PathLimits {
            confirm_timeout: s.timeout,
            max_moves: if self.path_striping() {
                s.stripe_moves.max(1) as usize
            } else {
                1
            },
            ..PathLimits::default()
        }
    }

    fn first_chan(&self, key: CircKey) -> Option<ChannelId> {
        self.circuits.get(&key)?.next.map(|(c, _)| c)
    }

    fn fresh_origin(&self, key: CircKey) -> Result<(), CoreError> {
        match self.circuits.get(&key).map(|c| &c.role) {
            None => Err(CoreError::NoSuchCircuit),
            Some(Role::Origin {
                built: true, edge, ..
            }) if edge.streams.is_empty() && edge.next_stream_id == 1 => Ok(()),
            Some(_) => Err(CoreError::CircuitNotOpen),
        }
    }

    /// Client, path mode: make the fresh, built circuit `circ` the home leg of a linked set
    /// (CONFLUX_LINK to its last hop). Call before any stream uses it.
    pub fn path_link(&mut self, circ: CircKey, now: Instant) -> Result<(), CoreError> {
        self.fresh_origin(circ)?;
        if self.path.client.contains_key(&circ) || self.path.client_spare.contains_key(&circ) {
            return Err(CoreError::CircuitNotOpen);
        }
        let mut nonce = [0u8; 32];
        self.rng.fill_bytes(&mut nonce);
        let limits = self.path_limits();
        self.path.client.insert(
            circ,
            ClientSet {
                nonce,
                sender: PathSender::new(circ, limits),
                spare: None,
                linking: None,
                switch: None,
                deferred: VecDeque::new(),
                last_sent: None,
                control: circ,
                avoid: Vec::new(),
                rtt: SetRtt::default(),
                link_sent: vec![(circ, now)],
                probe: None,
                probe_id: 0,
                probe_answer: None,
                probe_sent: None,
                heard: Vec::new(),
            },
        );
        self.send_link(circ, nonce, now);
        Ok(())
    }

    /// Client: link the fresh, built circuit `spare` (same exit, another entry and middle)
    /// to `home`'s set. It carries cells once its LINKED arrives; without one within the
    /// circuit build timeout it is closed.
    pub fn path_add_spare(
        &mut self,
        home: CircKey,
        spare: CircKey,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.fresh_origin(spare)?;
        if self.path.client.contains_key(&spare) || self.path.client_spare.contains_key(&spare) {
            return Err(CoreError::CircuitNotOpen);
        }
        let deadline = now + self.cfg.circuit_build_timeout;
        let set = self
            .path
            .client
            .get_mut(&home)
            .ok_or(CoreError::NoSuchCircuit)?;
        if set.spare.is_some() || set.linking.is_some() {
            return Err(CoreError::CircuitNotOpen);
        }
        set.linking = Some((spare, deadline));
        set.link_sent.push((spare, now));
        let nonce = set.nonce;
        self.path.client_spare.insert(spare, home);
        self.send_link(spare, nonce, now);
        Ok(())
    }

    /// Client: whether `circ` is the home leg of a set, and its spare (linked or linking).
    pub fn path_set_of(&self, circ: CircKey) -> Option<Option<CircKey>> {
        let set = self.path.client.get(&circ)?;
        Some(set.spare.or(set.linking.map(|(s, _)| s)))
    }

    /// Client: whether `circ` is some set's spare (linked or linking).
    pub fn path_is_spare(&self, circ: CircKey) -> bool {
        self.path.client_spare.contains_key(&circ)
    }

    /// Client: the leg a home's cells go on now (for tests and logs).
    pub fn path_current_leg(&self, home: CircKey) -> Option<CircKey> {
        self.path.client.get(&home)?.sender.current()
    }

    fn send_link(&mut self, circ: CircKey, nonce: [u8; 32], now: Instant) {
        let body = ConfluxLink {
            nonce,
            last_seqno_sent: 0,
            last_seqno_recv: 0,
            desired_ux: 0,
        }
        .encode();
        self.send_edge(circ, RelayCommand::CONFLUX_LINK, 0, &body, now);
    }

    /// Client, packaging: the leg DATA for `home`'s streams would go on, or None if the
    /// sender is blocked (waiting for a confirmation) or has no leg. Circuits outside a set
    /// package on themselves.
    pub(super) fn path_package_leg(&self, key: CircKey) -> Option<CircKey> {
        match self.path.client.get(&key) {
            None => Some(key),
            Some(set) if set.sender.is_blocked() || !set.deferred.is_empty() => None,
            Some(set) => set.sender.current(),
        }
    }

    /// Client: send a multiplexed message of `home`'s streams through its set. Returns false
    /// if `home` is not a set's home (the caller sends it as usual).
    pub(super) fn path_route(
        &mut self,
        home: CircKey,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        now: Instant,
    ) -> bool {
        let Some(set) = self.path.client.get_mut(&home) else {
            return false;
        };
        let msg = (cmd, sid, body.to_vec());
        if !set.deferred.is_empty() {
            if set.deferred.len() >= MAX_DEFERRED {
                self.path_client_fail(home, "too many cells deferred behind a switch", now);
                return true;
            }
            set.deferred.push_back(msg);
            return true;
        }
        self.path_send_now(home, msg, now);
        true
    }

    fn path_send_now(&mut self, home: CircKey, msg: Msg, now: Instant) {
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        match set.sender.send(now, &msg) {
            Ok(out) => {
                let last_sent = set.last_sent.replace(now);
                if let Some(sw) = out.switch {
                    if let Some(rec) = set.switch.as_mut() {
                        if rec.first_cell.is_none() {
                            rec.first_cell = Some(now);
                            rec.last_old = last_sent;
                        }
                    }
                    let body = ConfluxSwitch {
                        relative_seq: sw.relative_seq,
                    }
                    .encode();
                    self.send_to_exit(sw.leg, RelayCommand::CONFLUX_SWITCH, 0, &body, now);
                }
                let (cmd, sid, body) = msg;
                self.send_to_exit(out.leg, cmd, sid, &body, now);
            }
            Err(SendError::Blocked) => {
                if set.deferred.len() >= MAX_DEFERRED {
                    self.path_client_fail(home, "too many cells deferred behind a switch", now);
                } else {
                    set.deferred.push_back(msg);
                }
            }
            Err(SendError::NoLeg) => self.path_client_fail(home, "no leg left", now),
            Err(SendError::TooFar) => {
                self.path_client_fail(home, "relative sequence number overflow", now)
            }
        }
    }

    /// Send a relay message from the client to `leg`'s last hop, bypassing the set.
    fn send_to_exit(
        &mut self,
        leg: CircKey,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        now: Instant,
    ) {
        let Some(Role::Origin { crypto, .. }) = self.circuits.get(&leg).map(|c| &c.role) else {
            return;
        };
        let last = crypto.len().saturating_sub(1);
        self.send_relay_forward(leg, last, cmd, sid, body, false, now);
    }

    /// Client: after a confirmation or fallback, send what waited and package again.
    fn path_resume(&mut self, home: CircKey, now: Instant) {
        while let Some(set) = self.path.client.get_mut(&home) {
            if set.sender.is_blocked() {
                break;
            }
            let Some(msg) = set.deferred.pop_front() else {
                break;
            };
            self.path_send_now(home, msg, now);
        }
        self.package_all(home, now);
    }

    /// Client: the set cannot go on (no leg, a protocol violation): close the home (its
    /// streams end, the SOCKS applications see their connections closed) and the spare.
    fn path_client_fail(&mut self, home: CircKey, why: &str, now: Instant) {
        warn!(
            ?home,
            reason = why,
            "linked circuits failed; closing their streams"
        );
        self.kill(home, &format!("linked set: {why}"), now);
    }

    /// The home of the set `key` belongs to (client side), if any.
    pub(super) fn path_home_of(&self, key: CircKey) -> Option<CircKey> {
        if self.path.client.contains_key(&key) {
            return Some(key);
        }
        if let Some(h) = self.path.client_spare.get(&key) {
            return Some(*h);
        }
        let id = self.path.exit_leg.get(&key)?;
        self.path.exit.get(id).map(|s| s.home)
    }

    /// Client: a round trip measured on `key` (a circuit SENDME, LINK → LINKED, SWITCH →
    /// SWITCH_CONFIRM). If `key` is a leg of a set, the set's confirmation timeout follows:
    /// `max(SwitchTimeoutMsec, factor × estimate)`, for the switch waiting now too.
    /// `loaded`: measured while the leg carried data (not a LINK → LINKED).
    pub(super) fn path_rtt_sample(
        &mut self,
        key: CircKey,
        rtt: std::time::Duration,
        loaded: bool,
        now: Instant,
    ) {
        let Some(home) = self.path_home_of(key) else {
            return;
        };
        let settings = self.sw.settings();
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        set.heard.retain(|(l, _)| *l != key);
        set.heard.push((key, now));
        if loaded {
            set.rtt.sample(key, rtt);
        } else {
            set.rtt.link_sample(key, rtt);
        }
        let timeout = confirm_timeout(
            settings.timeout,
            settings.timeout_rtt_factor,
            set.rtt.estimate(),
        );
        set.sender.set_confirm_timeout(timeout);
    }

    /// Client: a path message from hop `hop` of `key`.
    pub(super) fn path_client_message(
        &mut self,
        key: CircKey,
        hop: usize,
        last_hop: Option<usize>,
        cmd: RelayCommand,
        data: &[u8],
        now: Instant,
    ) {
        if cmd == RelayCommand::CONGESTED {
            if hop != 0 {
                self.sw.stats_mut().violations += 1;
                return self.kill(
                    key,
                    &format!("CONGESTED from hop {hop}, not the entry"),
                    now,
                );
            }
            if let Err(e) = Congested::decode(data) {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, &format!("malformed CONGESTED: {e}"), now);
            }
            return self.path_on_congested(key, now);
        }
        if Some(hop) != last_hop {
            self.sw.stats_mut().violations += 1;
            return self.kill(key, &format!("{cmd} from hop {hop}, not the exit"), now);
        }
        match cmd {
            RelayCommand::CONFLUX_LINKED => self.path_on_linked(key, data, now),
            RelayCommand::SWITCH_CONFIRM => self.path_on_confirm(key, data, now),
            RelayCommand::LEG_PROBE => self.path_on_probe_answer(key, data, now),
            other => {
                self.sw.stats_mut().violations += 1;
                self.kill(key, &format!("{other} toward the client"), now)
            }
        }
    }

    fn path_on_linked(&mut self, key: CircKey, data: &[u8], now: Instant) {
        let link = match ConfluxLink::decode(data) {
            Ok(l) => l,
            Err(e) => return self.kill(key, &format!("malformed CONFLUX_LINKED: {e}"), now),
        };
        let home = self.path_home_of(key);
        let Some(set) = home.and_then(|h| self.path.client.get_mut(&h)) else {
            return self.kill(key, "CONFLUX_LINKED on a circuit that sent no LINK", now);
        };
        if link.nonce != set.nonce {
            return self.kill(key, "CONFLUX_LINKED with another set's nonce", now);
        }
        let sent = set
            .link_sent
            .iter()
            .position(|(c, _)| *c == key)
            .map(|i| set.link_sent.swap_remove(i).1);
        if let Some(sent) = sent {
            self.path_rtt_sample(key, now.saturating_duration_since(sent), false, now);
        }
        let Some(set) = home.and_then(|h| self.path.client.get_mut(&h)) else {
            return;
        };
        if Some(key) == home {
            debug!(?key, "home leg linked at the exit");
            return;
        }
        match set.linking {
            Some((spare, _)) if spare == key => {
                set.linking = None;
                if set.sender.add_leg(key).is_ok() {
                    set.spare = Some(key);
                    info!(home = ?home, spare = ?key, "spare circuit linked");
                }
            }
            _ => self.kill(key, "CONFLUX_LINKED repeated", now),
        }
    }

    fn path_on_confirm(&mut self, key: CircKey, data: &[u8], now: Instant) {
        let seq = match SwitchConfirm::decode(data) {
            Ok(c) => c.seq,
            Err(e) => {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, &format!("malformed SWITCH_CONFIRM: {e}"), now);
            }
        };
        let Some(home) = self.path_home_of(key) else {
            self.sw.stats_mut().violations += 1;
            return self.kill(key, "SWITCH_CONFIRM on a circuit that is not linked", now);
        };
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        let announced = set.sender.announced_at();
        let timeout = set.sender.confirm_timeout();
        match set.sender.on_confirm(key, seq) {
            Ok(ConfirmOutcome::Confirmed { triggered_at }) => {
                let rec = set.switch.take();
                let wait = announced.map(|at| now.saturating_duration_since(at));
                self.sw.stats_mut().switches += 1;
                self.sw.stats_mut().completed += 1;
                let (from, to, first, last_old) = rec
                    .map_or((ChannelId(0), None, now, None), |r| {
                        (r.from, r.to, r.first_cell.unwrap_or(now), r.last_old)
                    });
                self.sw.push_record(SwitchRecord {
                    circ: home,
                    from,
                    to: to.or(self.first_chan(key)),
                    triggered: rec.map_or(triggered_at, |r| r.triggered),
                    ended: first,
                    last_old,
                    outcome: SwitchOutcome::Switched,
                    mode: SwitchMode::Path,
                    confirm_wait: wait,
                    confirm_timeout: Some(timeout),
                    held_by: rec.and_then(|r| r.held_by),
                });
                debug!(?home, leg = ?key, ?wait, ?timeout, "path switch confirmed");
                if let Some(wait) = wait {
                    self.path_rtt_sample(key, wait, true, now);
                }
                if let Some(set) = self.path.client.get_mut(&home) {
                    set.control = key;
                }
                // Tell the exit this leg is final: its stream-level flow control may come here.
                let body = SwitchConfirm { seq }.encode();
                self.send_to_exit(key, RelayCommand::SWITCH_CONFIRM, 0, &body, now);
                self.path_resume(home, now);
            }
            Ok(ConfirmOutcome::Released(released)) => {
                self.path_stripe_released_confirmed(home, released, seq, timeout, now)
            }
            Ok(ConfirmOutcome::Stale) => {
                info!(?home, leg = ?key, seq, "confirmation of a switch already given up (late)");
            }
            Err(e) => {
                self.sw.stats_mut().violations += 1;
                self.path_client_fail(home, &e.to_string(), now);
            }
        }
    }

    /// Client: time passed (switch confirmations, spares that never linked).
    pub(super) fn path_handle_timeout(&mut self, now: Instant) {
        let homes: Vec<CircKey> = self.path.client.keys().copied().collect();
        for home in homes {
            let Some(set) = self.path.client.get_mut(&home) else {
                continue;
            };
            if let Some((spare, deadline)) = set.linking {
                if deadline <= now {
                    set.linking = None;
                    self.close_circuit_inner(
                        spare,
                        DestroyReason::FINISHED,
                        None,
                        now,
                        "spare circuit not linked in time",
                    );
                    continue;
                }
            }
            self.path_probe_timeout(home, now);
            let Some(set) = self.path.client.get_mut(&home) else {
                continue;
            };
            let expired = set.sender.expire_released(now);
            if !expired.is_empty() {
                self.path_stripe_released_expired(home, expired, now);
            }
            let Some(set) = self.path.client.get_mut(&home) else {
                continue;
            };
            if let Some(fb) = set.sender.handle_timeout(now) {
                self.path_fallback(home, fb, true, now);
            }
        }
    }

    pub(super) fn path_next_deadline(&self) -> Option<Instant> {
        self.path
            .client
            .values()
            .flat_map(|s| {
                [
                    s.sender.next_deadline(),
                    s.linking.map(|(_, d)| d),
                    s.probe.and_then(|p| p.deciding.map(|d| d.deadline)),
                ]
            })
            .flatten()
            .min()
    }

    fn path_fallback(&mut self, home: CircKey, fb: Fallback<Msg>, timed_out: bool, now: Instant) {
        let rec = self
            .path
            .client
            .get_mut(&home)
            .and_then(|s| s.switch.take());
        if timed_out {
            self.sw.stats_mut().timed_out += 1;
        } else {
            self.sw.stats_mut().failed += 1;
        }
        let timeout = self
            .path
            .client
            .get(&home)
            .map(|s| s.sender.confirm_timeout());
        let wait = rec
            .and_then(|r| r.first_cell)
            .map(|at| now.saturating_duration_since(at));
        if let Some(r) = rec {
            self.sw.push_record(SwitchRecord {
                circ: home,
                from: r.from,
                to: r.to,
                triggered: r.triggered,
                ended: now,
                last_old: None,
                outcome: if timed_out {
                    SwitchOutcome::TimedOut
                } else {
                    SwitchOutcome::Failed
                },
                mode: SwitchMode::Path,
                confirm_wait: wait,
                confirm_timeout: timeout,
                held_by: r.held_by,
            });
        }
        match fb {
            Fallback::Resend {
                switch,
                cells,
                abandoned,
            } => {
                // Striping keeps a leg whose confirmation is late: under load that is a slow
                // leg, not a dead one (a closed leg goes through `path_circuit_gone`), and the
                // kept cells re-sent here arrive at the exit once whichever copy is first.
                let keep =
                    timed_out && self.path_striping() && self.circuits.contains_key(&abandoned);
                if timed_out && !keep {
                    let until = now + self.sw.settings().leg_avoid;
                    if let Some(set) = self.path.client.get_mut(&home) {
                        set.avoid(abandoned, until, now);
                    }
                }
                warn!(
                    ?home,
                    ?abandoned,
                    resent = cells.len(),
                    timed_out,
                    ?wait,
                    ?timeout,
                    "path switch not confirmed: back to the old leg, resending"
                );
                self.sw.stats_mut().cells_resent += cells.len() as u64;
                if let Some(sw) = switch {
                    let body = ConfluxSwitch {
                        relative_seq: sw.relative_seq,
                    }
                    .encode();
                    self.send_to_exit(sw.leg, RelayCommand::CONFLUX_SWITCH, 0, &body, now);
                    for (_, (cmd, sid, body)) in cells {
                        self.send_to_exit(sw.leg, cmd, sid, &body, now);
                    }
                }
                if let Some(set) = self.path.client.get_mut(&home) {
                    if set.spare == Some(abandoned) && !keep {
                        set.spare = None;
                    }
                    if set.control == abandoned {
                        set.control = set.sender.current().unwrap_or(home);
                    }
                }
                if abandoned != home && !keep && self.circuits.contains_key(&abandoned) {
                    self.close_circuit_inner(
                        abandoned,
                        DestroyReason::FINISHED,
                        None,
                        now,
                        "spare leg abandoned after a failed switch",
                    );
                }
                self.path_resume(home, now);
            }
            Fallback::Failed { unconfirmed } => {
                self.sw.stats_mut().cells_lost += unconfirmed as u64;
                self.path_client_fail(home, "switch failed with no leg to fall back to", now);
            }
        }
    }

    /// A circuit is going (its entry is already out of `circuits`): dissolve or shrink its set.
    pub(super) fn path_circuit_gone(&mut self, key: CircKey, now: Instant) {
        if let Some(set) = self.path.client.remove(&key) {
            if let Some(r) = set.switch.filter(|_| set.sender.is_pending()) {
                self.sw.stats_mut().failed += 1;
                self.sw.push_record(SwitchRecord {
                    circ: key,
                    from: r.from,
                    to: r.to,
                    triggered: r.triggered,
                    ended: now,
                    last_old: None,
                    outcome: SwitchOutcome::Failed,
                    mode: SwitchMode::Path,
                    confirm_wait: r.first_cell.map(|at| now.saturating_duration_since(at)),
                    confirm_timeout: Some(set.sender.confirm_timeout()),
                    held_by: r.held_by,
                });
            }
            for spare in set.spare.into_iter().chain(set.linking.map(|(s, _)| s)) {
                self.path.client_spare.remove(&spare);
                self.close_circuit_inner(
                    spare,
                    DestroyReason::FINISHED,
                    None,
                    now,
                    "its home circuit closed",
                );
            }
            return;
        }
        if let Some(home) = self.path.client_spare.remove(&key) {
            let Some(set) = self.path.client.get_mut(&home) else {
                return;
            };
            if set.linking.is_some_and(|(s, _)| s == key) {
                set.linking = None;
            }
            if set.spare == Some(key) {
                set.spare = None;
            }
            if set.control == key {
                set.control = home;
            }
            set.rtt.leg_closed(key);
            set.heard.retain(|(c, _)| *c != key);
            set.link_sent.retain(|(c, _)| *c != key);
            if set.probe.is_some_and(|p| p.leg == key) {
                set.probe = None;
            }
            let lost = self.path_stripe_leg_loses(home, key);
            if lost > 0 {
                self.sw.stats_mut().failed += 1;
                return self.path_client_fail(
                    home,
                    &format!("a striped leg closed with {lost} of its cells unacknowledged"),
                    now,
                );
            }
            let Some(set) = self.path.client.get_mut(&home) else {
                return;
            };
            if let Some(fb) = set.sender.leg_closed(key) {
                self.path_fallback(home, fb, false, now);
            }
            return;
        }
        if let Some(id) = self.path.exit_leg.remove(&key) {
            let Some(set) = self.path.exit.get_mut(&id) else {
                return;
            };
            if set.home == key {
                self.path_exit_dissolve(id, None, now);
            } else {
                set.legs.retain(|l| *l != key);
                set.recv.leg_closed(key);
                set.unacked.retain(|(l, _)| *l != key);
                set.withheld.retain(|(l, _)| *l != key);
                if set.control.0 == key {
                    set.control.0 = set.home;
                }
            }
        }
    }

    /// A path message recognized at a relay, forward from the client.
    pub(super) fn path_relay_message(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        data: &[u8],
        now: Instant,
    ) {
        match cmd {
            RelayCommand::CONFLUX_LINK => self.path_on_link(key, data, now),
            RelayCommand::CONFLUX_LINKED_ACK => {}
            RelayCommand::CONFLUX_SWITCH => {
                let Some(&id) = self.path.exit_leg.get(&key) else {
                    self.sw.stats_mut().violations += 1;
                    return self.kill(key, "CONFLUX_SWITCH on a circuit that is not linked", now);
                };
                let rel = match ConfluxSwitch::decode(data) {
                    Ok(s) => s.relative_seq,
                    Err(e) => {
                        return self.path_exit_dissolve(
                            id,
                            Some(&format!("malformed CONFLUX_SWITCH: {e}")),
                            now,
                        )
                    }
                };
                let Some(set) = self.path.exit.get_mut(&id) else {
                    return;
                };
                if let Err(e) = set.recv.on_switch(key, rel) {
                    return self.path_exit_dissolve(id, Some(&e.to_string()), now);
                }
                while let Some((leg, seq)) = self
                    .path
                    .exit
                    .get_mut(&id)
                    .and_then(|s| s.recv.poll_confirm())
                {
                    if let Some(set) = self.path.exit.get_mut(&id) {
                        set.unacked.retain(|(l, _)| *l != leg);
                        set.unacked.push((leg, seq));
                    }
                    info!(set = id, ?leg, seq, "CONFLUX_SWITCH arrived: confirming");
                    let body = SwitchConfirm { seq }.encode();
                    self.send_relay_backward(leg, RelayCommand::SWITCH_CONFIRM, 0, &body, now);
                }
            }
            RelayCommand::SWITCH_CONFIRM => self.path_exit_on_ack(key, data, now),
            RelayCommand::LEG_PROBE => self.path_exit_on_probe(key, data, now),
            other => {
                self.sw.stats_mut().violations += 1;
                self.kill(key, &format!("{other} from the client's side"), now)
            }
        }
    }

    /// The leg stream-level flow control (stream SENDME, XON, XOFF) of `home`'s streams goes on:
    /// the leg the data moved to, once the switch onto it is final at both ends (client: the
    /// last leg whose switch the exit confirmed; exit: the last leg whose confirmation the
    /// client acknowledged). Those cells are not sequenced (either end applies them to the
    /// home's streams whichever leg brings them); on the home they would wait behind the
    /// congested entry the data just left, and the sender's stream window with them; on a
    /// leg not yet final they would be lost if the switch fell back. `home` outside a set.
    pub(super) fn path_stream_control_leg(&self, home: CircKey) -> CircKey {
        let leg = if let Some(set) = self.path.client.get(&home) {
            set.control
        } else {
            match self
                .path
                .exit_leg
                .get(&home)
                .and_then(|id| self.path.exit.get(id))
            {
                Some(set) if set.home == home => set.control.0,
                _ => home,
            }
        };
        if self.circuits.contains_key(&leg) {
            leg
        } else {
            home
        }
    }

    /// Entry, path mode: the detector found `chan` congested. Send CONGESTED to the client of
    /// the heaviest circuit on it this relay is the entry of.
    pub(super) fn path_congested(
        &mut self,
        chan: ChannelId,
        occupancy_bytes: f64,
        now: Instant,
    ) -> Option<CircKey> {
        let key = self.heaviest_entry_circuit(chan, occupancy_bytes, now, |_| false)?;
        let body = Congested {
            reason: CongestionReason::OVERFULL,
        }
        .encode();
        self.send_relay_backward(key, RelayCommand::CONGESTED, 0, &body, now);
        self.sw.stats_mut().congested_sent += 1;
        self.sw.stats_mut().triggered += 1;
        // The circuit id on the client's link: the client logs the same id on its trigger.
        let circ_id = self
            .circuits
            .get(&key)
            .and_then(|c| c.prev)
            .map(|(_, id)| id);
        info!(
            ?key,
            ?chan,
            ?circ_id,
            "connection congested: told the heaviest circuit's client"
        );
        Some(key)
    }
}
