//! Path-variant switching: sequencing across the legs of a linked set (paper 003 section 4.3.2,
//! with conflux's sequence numbers from Tor's proposal 329).
//!
//! A client links two circuits to the same exit (through different entries and middles); both
//! ends then number the *multiplexed* relay cells (those with a stream id: BEGIN, DATA, END,
//! CONNECTED, RESOLVE, RESOLVED) with one absolute sequence number per direction, starting at 1.
//! Numbers never travel with the cells: a circuit delivers in order, so each end counts the
//! cells per leg, and a CONFLUX_SWITCH message, sent first on the leg a sender moves to,
//! carries the relative jump `(highest number sent on any leg) − (last number sent on this
//! leg)` (prop 329, 2.6).
//!
//! - [`PathSender`]: assigns numbers, produces the SWITCH, and keeps a copy of every cell sent
//!   on the new leg until the receiver confirms the switch (SWITCH_CONFIRM, chive's own). If no
//!   confirmation arrives within the timeout, or the new leg closes first, it falls back: the
//!   old leg gets a SWITCH and the kept cells again, under their original numbers. If the old
//!   leg is gone too, the stream fails (the caller gives the SOCKS application a clean error).
//! - [`PathReceiver`]: per-leg counters, an out-of-order buffer with a hard window, in-order
//!   delivery, and exactly-once delivery: a number already delivered or buffered is dropped (a
//!   fallback re-sends cells that may have arrived on the abandoned leg as well).
//!
//! Against a hostile peer: the receiver accepts numbers only inside
//! `[next to deliver, next to deliver + window)` ([`PathLimits::window`]) and buffers at most
//! [`PathLimits::max_buffered`] cells; it tells its caller when to withhold a leg's circuit
//! SENDMEs ([`PathReceiver::withholds`]), which keeps an honest sender below that bound
//! whatever its congestion window does. A number beyond the window, a buffer beyond the
//! bound, a SWITCH that jumps a leg beyond the window, two SWITCHes in a row
//! on one leg, a cell or SWITCH on a leg that is not linked, or a counter overflow is a
//! [`SeqViolation`] (the caller closes the set with a logged protocol error). The sender refuses
//! a confirmation for a number it never sent. Both sides are pure state: no IO, time passed in.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::CircKey;

/// Most legs a linked set may have (the paper uses two: the circuit and one spare).
pub const MAX_LEGS: usize = 4;

/// Limits of one linked set.
///
/// The receiver's out-of-order buffer is bounded without trusting the sender to be slow:
/// while the buffer holds `withhold_above` cells or more, the receiver withholds the circuit
/// SENDMEs of every leg that is *ahead* (its last number is beyond the next one to deliver,
/// so what it carries can only be buffered). An honest sender then stops on that leg within
/// one congestion window: it can send at most `window` cells past the last SENDME it got, and
/// never more than [`PathLimits::max_leg_window`]. So an honest set's buffer stays below
/// `withhold_above + legs × max_leg_window` (+ the few multiplexed cells no window covers:
/// BEGIN, END, RESOLVE), and more than [`PathLimits::max_buffered`] is a sender that ignored
/// its window: a violation. Numbers are accepted up to [`PathLimits::window`] ahead (the
/// buffer plus what may still be in flight on the legs). docs/protocol.md, "Limits at the
/// receiver", has the argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathLimits {
    /// Buffered cells from which the receiver withholds circuit SENDMEs on the legs that are
    /// ahead. Default 1000 (one fixed circuit window, ~0.5 MB): in the lab's loaded runs the
    /// buffer peaked far below it, so honest reordering is not slowed.
    pub withhold_above: u64,
    /// The largest window (cells in flight without a SENDME) a leg's sender may have: the
    /// congestion-control limit, 2000 ([`crate::cc::CC_CWND_LIMIT`]; fixed windows stay
    /// within 1000).
    pub max_leg_window: u64,
    /// Multiplexed cells outside every window (BEGIN, END, RESOLVE) an honest sender may add
    /// while a leg is stalled. Default 256.
    pub unwindowed_slack: u64,
    /// Cells the sender keeps for a possible fallback before it stops sending (default 1000,
    /// one circuit window: the circuit would block there anyway).
    pub max_unconfirmed: usize,
    /// How long a switch waits for its confirmation, counted from the SWITCH going out. The
    /// client's core sets it from the set's measured round trip ([`confirm_timeout`]); a
    /// change applies to a switch already waiting too.
    pub confirm_timeout: Duration,
}

impl Default for PathLimits {
    fn default() -> Self {
        PathLimits {
            withhold_above: 1000,
            max_leg_window: u64::from(crate::cc::CC_CWND_LIMIT),
            unwindowed_slack: 256,
            max_unconfirmed: 1000,
            confirm_timeout: Duration::from_secs(2),
        }
    }
}

impl PathLimits {
    /// Most cells a set with `legs` legs may hold out of order: `withhold_above + legs ×
    /// max_leg_window + unwindowed_slack` (2 legs: 5256 cells, about 2.7 MB). One more is a
    /// violation.
    pub fn max_buffered(&self, legs: usize) -> u64 {
        let legs = legs as u64;
        self.withhold_above
            .saturating_add(legs.saturating_mul(self.max_leg_window))
            .saturating_add(self.unwindowed_slack)
    }

    /// Most cells one leg's arrivals may hold out of order: `withhold_above + max_leg_window +
    /// unwindowed_slack` (3256). A leg's held cells got their circuit SENDMEs only while the
    /// whole buffer was below `withhold_above` (so fewer than that many of them), and once
    /// its SENDMEs are withheld an honest sender adds at most one leg window (plus the
    /// unwindowed BEGIN/END/RESOLVE) on it. Tighter than [`PathLimits::max_buffered`] as soon
    /// as a set has two legs: one leg flooding trips it at 3257 cells, not 5257.
    pub fn max_buffered_per_leg(&self) -> u64 {
        self.max_buffered(1)
    }

    /// How far beyond the next number to deliver a number may be: the buffer plus one window
    /// per leg still in flight (the cells that fill the gap).
    pub fn window(&self, legs: usize) -> u64 {
        self.max_buffered(legs)
            .saturating_add((legs as u64).saturating_mul(self.max_leg_window))
    }
}

/// Longest confirmation timeout the round trip can make (a leg that does not answer in a
/// minute is gone in practice); a larger `SwitchTimeoutMsec` floor still wins.
pub const MAX_RTT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);

/// The confirmation timeout of a path switch: `max(floor, factor × rtt)` (Tor-style: a fixed
/// floor, and a multiple of the measured round trip above it), the multiple capped at
/// [`MAX_RTT_CONFIRM_TIMEOUT`]. `rtt` None (nothing measured yet) or `factor` 0 gives the
/// floor. The timeout only has to tell a late confirmation from a leg that dropped it (a leg
/// that closes is noticed at once): under load the SWITCH waits behind the entry's backlog,
/// so a fixed 2 s timed out switches whose confirmation was on its way.
pub fn confirm_timeout(floor: Duration, factor: u32, rtt: Option<Duration>) -> Duration {
    match rtt {
        Some(rtt) if factor > 0 => {
            floor.max(rtt.saturating_mul(factor).min(MAX_RTT_CONFIRM_TIMEOUT))
        }
        _ => floor,
    }
}

/// The shortest a client waits for a probe's answer before it takes the other leg as heavier
/// (a round trip through three relays on loopback is a few ms; 20 ms keeps a scheduling hiccup
/// from deciding).
pub const PROBE_MIN_WAIT: Duration = Duration::from_millis(20);

/// Round trips measured on the legs of a linked set (client side): LINK → LINKED, SWITCH →
/// SWITCH_CONFIRM, and circuit SENDMEs (each acknowledged cell's round trip). Per leg a
/// smoothed value (gain 1/8, as TCP's SRTT) and the latest sample; [`SetRtt::estimate`] is
/// the larger of the two over every leg. Every leg, not only the one switched to: a spare
/// that has been idle since its LINK carries an idle network's round trip, while the leg
/// being left shows what the backlog costs now, and the SWITCH meets the same kind of backlog
/// at the other entry.
#[derive(Clone, Debug, Default)]
pub struct SetRtt {
    /// (leg, smoothed, latest).
    legs: Vec<(CircKey, Duration, Duration)>,
    /// Legs measured by more than their LINK: a circuit SENDME, a switch's confirmation or a
    /// probe (a LINK → LINKED round trip is the idle network's).
    loaded: Vec<CircKey>,
}

impl SetRtt {
    /// A round trip measured on `leg` while it carried data (a circuit SENDME, SWITCH →
    /// SWITCH_CONFIRM).
    pub fn sample(&mut self, leg: CircKey, rtt: Duration) {
        self.link_sample(leg, rtt);
        if !self.loaded.contains(&leg) && self.loaded.len() < MAX_LEGS * 2 {
            self.loaded.push(leg);
        }
    }

    /// A LINK → LINKED round trip on `leg` (the network idle for this leg).
    pub fn link_sample(&mut self, leg: CircKey, rtt: Duration) {
        if let Some(e) = self.legs.iter_mut().find(|(c, _, _)| *c == leg) {
            e.1 = (e.1 * 7 + rtt) / 8;
            e.2 = rtt;
        } else if self.legs.len() < MAX_LEGS * 2 {
            self.legs.push((leg, rtt, rtt));
        }
    }

    /// A probe's round trip on `leg`, which carried no data lately: it replaces the leg's
    /// estimate (smoothed and latest), since the samples from when the leg last carried data,
    /// or from its LINK, describe another load.
    pub fn probed(&mut self, leg: CircKey, rtt: Duration) {
        self.sample(leg, rtt);
        if let Some(e) = self.legs.iter_mut().find(|(c, _, _)| *c == leg) {
            e.1 = rtt;
            e.2 = rtt;
        }
    }

    /// The round trip `leg` costs now, as far as measured: the larger of its smoothed value and
    /// its latest sample (a congestion report says the load is rising, and the smoothed value
    /// lags).
    pub fn now(&self, leg: CircKey) -> Option<Duration> {
        self.legs
            .iter()
            .find(|(c, _, _)| *c == leg)
            .map(|e| e.1.max(e.2))
    }

    /// `leg` is gone: forget it.
    pub fn leg_closed(&mut self, leg: CircKey) {
        self.legs.retain(|(c, _, _)| *c != leg);
        self.loaded.retain(|c| *c != leg);
    }

    /// The smoothed round trip of `leg`.
    pub fn smoothed(&self, leg: CircKey) -> Option<Duration> {
        self.legs.iter().find(|(c, _, _)| *c == leg).map(|e| e.1)
    }

    /// Whether leg `to` measures heavier than leg `from`: its smoothed round trip is more
    /// than 10 % above `from`'s. Unmeasured legs are not heavier. The caller has a congestion
    /// report for `from` (the evidence that `from` is loaded now), so a tie does not keep it
    /// there: in the lab the first reports came before any SENDME, with both legs measured
    /// only at their LINK, idle and equal. The samples of a leg not in use are those from when
    /// it last carried data (or its LINK): a leg left because it was loaded keeps that load in
    /// its estimate, so the client does not go back while the leg it is on measures lighter.
    pub fn heavier(&self, to: CircKey, from: CircKey) -> bool {
        match (self.smoothed(to), self.smoothed(from)) {
            (Some(t), Some(f)) => t.as_secs_f64() > f.as_secs_f64() * 1.1,
            _ => false,
        }
    }

    /// How long a probe on the other leg may take and still show it lighter than `from`:
    /// 1.1 × `from`'s [`SetRtt::now`], at least [`PROBE_MIN_WAIT`] and at most
    /// [`MAX_RTT_CONFIRM_TIMEOUT`]. None while `from` has no measurement but its LINK's: that
    /// is the idle network's round trip, while the congestion report says `from` is loaded
    /// now (in the lab the first reports came before any SENDME, and a probe compared with
    /// the LINK's 30 ms never answered in time).
    pub fn probe_wait(&self, from: CircKey) -> Option<Duration> {
        if !self.loaded.contains(&from) {
            return None;
        }
        let f = self.now(from)?;
        Some(
            f.mul_f64(1.1)
                .clamp(PROBE_MIN_WAIT, MAX_RTT_CONFIRM_TIMEOUT),
        )
    }

    /// Whether `to` measures heavier than `from` now ([`SetRtt::now`] of each, the 10 %
    /// margin of [`SetRtt::heavier`]): the comparison a probe's answer decides (`to` just
    /// probed, `from` carrying the upload). Unmeasured legs are not heavier.
    pub fn heavier_now(&self, to: CircKey, from: CircKey) -> bool {
        match (self.now(to), self.now(from)) {
            (Some(t), Some(f)) => t.as_secs_f64() > f.as_secs_f64() * 1.1,
            _ => false,
        }
    }

    /// The round trip a switch's confirmation should be given: the largest smoothed or
    /// latest sample over the set's legs (None before any sample).
    pub fn estimate(&self) -> Option<Duration> {
        self.legs.iter().map(|(_, s, l)| (*s).max(*l)).max()
    }
}

/// The peer broke the sequencing rules; the caller closes the linked set (every leg) with a
/// logged protocol error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SeqViolation {
    /// A cell, SWITCH or confirmation on a circuit that is not a leg of this set.
    #[error("sequencing message on circuit {0:?}, which is not a linked leg")]
    NotALeg(CircKey),
    /// A number at or beyond the out-of-order window.
    #[error("sequence number {seq} beyond the window (next expected {next}, window {window})")]
    BeyondWindow {
        /// The offending absolute number.
        seq: u64,
        /// The next number to deliver.
        next: u64,
        /// The window.
        window: u64,
    },
    /// More cells buffered out of order than an honest sender can cause (it ignored the
    /// withheld SENDMEs).
    #[error("{buffered} cells out of order, more than the {limit} an honest sender can cause")]
    BufferFull {
        /// Cells buffered.
        buffered: u64,
        /// [`PathLimits::max_buffered`] for the set's legs.
        limit: u64,
    },
    /// More cells of one leg buffered out of order than an honest sender can put there
    /// ([`PathLimits::max_buffered_per_leg`]).
    #[error("{held} cells of one leg held out of order, more than the {limit} an honest sender can cause on one leg")]
    LegBufferFull {
        /// Cells of that leg buffered.
        held: u64,
        /// The per-leg limit.
        limit: u64,
    },
    /// Two SWITCHes on one leg without a multiplexed cell between them.
    #[error("two SWITCH messages in a row on one leg")]
    RepeatedSwitch,
    /// A leg's counter would overflow.
    #[error("sequence number overflow")]
    Overflow,
    /// A confirmation names a number never sent.
    #[error("confirmation of sequence number {seq}, but only {sent} were sent")]
    ConfirmsUnsent {
        /// Confirmed number.
        seq: u64,
        /// Highest number sent.
        sent: u64,
    },
}

/// A leg could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LegError {
    /// Already a leg.
    #[error("circuit is already a leg of this set")]
    Duplicate,
    /// [`MAX_LEGS`] reached.
    #[error("a linked set has at most {MAX_LEGS} legs")]
    TooMany,
}

/// A CONFLUX_SWITCH to send on `leg`, right before the cell it comes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchMsg {
    /// The leg switched to.
    pub leg: CircKey,
    /// CONFLUX_SWITCH's `SeqNum`.
    pub relative_seq: u32,
}

/// A switch the sender cannot make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// Not a leg of this set.
    #[error("not a leg of this set")]
    NotALeg,
    /// Already the current leg.
    #[error("already sending on that leg")]
    AlreadyCurrent,
    /// An earlier switch is announced and not confirmed yet (one at a time keeps the kept
    /// cells in one run of numbers).
    #[error("the previous switch is not confirmed yet")]
    Unconfirmed,
}

/// Where to send the next multiplexed cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The leg.
    pub leg: CircKey,
    /// Its absolute number (for metrics and tests; it is not sent).
    pub seq: u64,
    /// Send this CONFLUX_SWITCH on `leg` first: the first cell after a switch.
    pub switch: Option<SwitchMsg>,
}

/// The sender cannot send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// `max_unconfirmed` cells are kept waiting for a confirmation: stop reading the stream
    /// until [`PathSender::on_confirm`] or the fallback.
    #[error("waiting for the switch to be confirmed")]
    Blocked,
    /// No leg is left (the stream has failed).
    #[error("no leg left")]
    NoLeg,
    /// The relative number would not fit in 32 bits (2^32 cells since the leg last sent); the
    /// caller closes the set.
    #[error("relative sequence number does not fit in 32 bits")]
    TooFar,
}

/// What a confirmation meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// The pending switch is confirmed; the kept cells are released.
    Confirmed {
        /// When [`PathSender::switch_to`] was called (the trigger), for the switch-time metric.
        triggered_at: Instant,
    },
    /// For a switch already confirmed or abandoned (a fallback raced with it): ignored.
    Stale,
}

/// The pending switch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback<T> {
    /// Back to the old leg: send `switch` there (if any), then `cells` in order. Their numbers
    /// are the original ones; the receiver drops whichever copy comes second. With no kept
    /// cells there is nothing to resend and the next [`PathSender::send`] announces the leg.
    Resend {
        /// The SWITCH to send first, when there are cells to resend.
        switch: Option<SwitchMsg>,
        /// The kept cells, oldest first, with their numbers.
        cells: Vec<(u64, T)>,
        /// The leg given up (the caller may close it).
        abandoned: CircKey,
    },
    /// No leg to fall back to: the stream fails (the SOCKS application gets a clean error);
    /// `unconfirmed` cells may not have arrived.
    Failed {
        /// Cells whose arrival is unknown.
        unconfirmed: usize,
    },
}

#[derive(Clone, Debug)]
struct Pending<T> {
    to: CircKey,
    from: CircKey,
    triggered_at: Instant,
    /// Set when the SWITCH went out (with the first cell on `to`): the new leg's counter
    /// after the SWITCH, and when it went out (the deadline is that plus the timeout).
    announced: Option<(u64, Instant)>,
    /// Cells sent on `to` since the switch, consecutive numbers, oldest first.
    kept: VecDeque<(u64, T)>,
}

/// The sending end of a linked set (the client for uploads; the exit for downloads). `T` is
/// whatever the caller needs to send a cell again (e.g. the relay message).
///
/// A switch is announced lazily: [`PathSender::switch_to`] only changes the leg, and the
/// CONFLUX_SWITCH goes out with the first cell on it ([`Outgoing::switch`]). So every SWITCH
/// is followed by a cell, which lets the receiver treat two in a row as a violation, and an
/// idle stream never waits for a confirmation.
#[derive(Clone, Debug)]
pub struct PathSender<T> {
    limits: PathLimits,
    /// Each leg with the last number sent on it.
    legs: Vec<(CircKey, u64)>,
    current: Option<CircKey>,
    /// The current leg needs a SWITCH before its next cell.
    announce: bool,
    /// Highest number sent on any leg.
    sent: u64,
    pending: Option<Pending<T>>,
}

impl<T: Clone> PathSender<T> {
    /// A set whose first leg is `first`, sending there (no SWITCH needed: both ends start
    /// every leg at 0).
    pub fn new(first: CircKey, limits: PathLimits) -> Self {
        PathSender {
            limits,
            legs: vec![(first, 0)],
            current: Some(first),
            announce: false,
            sent: 0,
            pending: None,
        }
    }

    /// Link another leg (after its LINKED arrived).
    pub fn add_leg(&mut self, circ: CircKey) -> Result<(), LegError> {
        if self.legs.iter().any(|(c, _)| *c == circ) {
            return Err(LegError::Duplicate);
        }
        if self.legs.len() >= MAX_LEGS {
            return Err(LegError::TooMany);
        }
        self.legs.push((circ, 0));
        Ok(())
    }

    /// The leg cells go on now.
    pub fn current(&self) -> Option<CircKey> {
        self.current
    }

    /// The legs, in the order they were added.
    pub fn legs(&self) -> impl Iterator<Item = CircKey> + '_ {
        self.legs.iter().map(|(c, _)| *c)
    }

    /// The last number sent on `leg` (0: nothing yet; None: not a leg).
    pub fn last_sent_on(&self, leg: CircKey) -> Option<u64> {
        self.legs.iter().find(|(c, _)| *c == leg).map(|(_, n)| *n)
    }

    /// Whether [`PathSender::switch_to`] would refuse with [`SwitchError::Unconfirmed`]: a
    /// switch went out (its SWITCH with a cell) and is not confirmed yet.
    pub fn switch_announced(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.announced.is_some())
    }

    /// Whether a switch waits for its confirmation.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether [`PathSender::send`] would refuse with [`SendError::Blocked`].
    pub fn is_blocked(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.kept.len() >= self.limits.max_unconfirmed.max(1))
    }

    /// Highest number sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// When [`PathSender::handle_timeout`] must run next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.announced_at()
            .map(|at| at + self.limits.confirm_timeout)
    }

    /// When the pending switch's SWITCH went out, if it did.
    pub fn announced_at(&self) -> Option<Instant> {
        self.pending
            .as_ref()
            .and_then(|p| p.announced.map(|(_, at)| at))
    }

    /// The confirmation timeout in force.
    pub fn confirm_timeout(&self) -> Duration {
        self.limits.confirm_timeout
    }

    /// Change the confirmation timeout. It applies to the switch waiting now as well (its
    /// deadline is its announcement plus the timeout): a round trip measured while it waits
    /// moves its deadline.
    pub fn set_confirm_timeout(&mut self, timeout: Duration) {
        self.limits.confirm_timeout = timeout;
    }

    fn leg_mut(&mut self, circ: CircKey) -> Option<&mut (CircKey, u64)> {
        self.legs.iter_mut().find(|(c, _)| *c == circ)
    }

    /// Number the next multiplexed cell and say where it goes (and whether a SWITCH must
    /// precede it); keeps a copy while a switch is unconfirmed.
    pub fn send(&mut self, now: Instant, cell: &T) -> Result<Outgoing, SendError> {
        let leg = self.current.ok_or(SendError::NoLeg)?;
        if let Some(p) = &self.pending {
            // At least one cell may go: it carries the SWITCH that starts the confirmation
            // timer, so a limit of 0 cannot stall a switch forever.
            if p.kept.len() >= self.limits.max_unconfirmed.max(1) {
                return Err(SendError::Blocked);
            }
        }
        let sent = self.sent;
        let mut switch = None;
        if self.announce {
            let entry = self.leg_mut(leg).ok_or(SendError::NoLeg)?;
            let gap = sent.checked_sub(entry.1).ok_or(SendError::TooFar)?;
            let relative_seq = u32::try_from(gap).map_err(|_| SendError::TooFar)?;
            entry.1 = sent;
            switch = Some(SwitchMsg { leg, relative_seq });
            self.announce = false;
            if let Some(p) = &mut self.pending {
                if p.to == leg {
                    p.announced = Some((sent, now));
                }
            }
        }
        // 2^64 cells cannot be sent in practice; saturating keeps this panic-free.
        let seq = sent.saturating_add(1);
        self.sent = seq;
        if let Some(entry) = self.leg_mut(leg) {
            entry.1 = seq;
        }
        if let Some(p) = &mut self.pending {
            p.kept.push_back((seq, cell.clone()));
        }
        Ok(Outgoing { leg, seq, switch })
    }

    /// Move to `to` (the entry reported congestion). The SWITCH goes out with the next cell.
    /// A switch not announced yet (no cell since) may be redirected; an announced one must be
    /// confirmed or fall back first.
    pub fn switch_to(&mut self, to: CircKey, now: Instant) -> Result<(), SwitchError> {
        let from = match &self.pending {
            Some(p) if p.announced.is_some() => return Err(SwitchError::Unconfirmed),
            Some(p) => p.from,
            None => self.current.ok_or(SwitchError::NotALeg)?,
        };
        if !self.legs.iter().any(|(c, _)| *c == to) {
            return Err(SwitchError::NotALeg);
        }
        if Some(to) == self.current {
            return Err(SwitchError::AlreadyCurrent);
        }
        self.current = Some(to);
        if to == from {
            // Redirected back before anything was announced: nothing changed on the wire.
            self.pending = None;
            self.announce = false;
            return Ok(());
        }
        self.announce = true;
        self.pending = Some(Pending {
            to,
            from,
            triggered_at: now,
            announced: None,
            kept: VecDeque::new(),
        });
        Ok(())
    }

    /// A SWITCH_CONFIRM arrived on `leg`, naming the number the receiver's counter for that
    /// leg reached with the SWITCH.
    pub fn on_confirm(&mut self, leg: CircKey, seq: u64) -> Result<ConfirmOutcome, SeqViolation> {
        if !self.legs.iter().any(|(c, _)| *c == leg) {
            return Err(SeqViolation::NotALeg(leg));
        }
        if seq > self.sent {
            return Err(SeqViolation::ConfirmsUnsent {
                seq,
                sent: self.sent,
            });
        }
        match &self.pending {
            Some(p) if p.to == leg && p.announced.map(|(base, _)| base) == Some(seq) => {
                let triggered_at = p.triggered_at;
                self.pending = None;
                Ok(ConfirmOutcome::Confirmed { triggered_at })
            }
            _ => Ok(ConfirmOutcome::Stale),
        }
    }

    /// Time passed: a switch unconfirmed past its deadline falls back.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Fallback<T>> {
        match self.next_deadline() {
            Some(deadline) if now >= deadline => self.fall_back(),
            _ => None,
        }
    }

    /// A leg closed. Returns the fallback if it was the unconfirmed new leg, or
    /// [`Fallback::Failed`] if it was the leg cells were going on with nothing to fall back to.
    pub fn leg_closed(&mut self, circ: CircKey) -> Option<Fallback<T>> {
        if !self.legs.iter().any(|(c, _)| *c == circ) {
            return None;
        }
        let outcome = match &self.pending {
            Some(p) if p.to == circ => self.fall_back(),
            Some(p) if p.from == circ && p.announced.is_none() => {
                // The old leg went before the new one carried anything: simply stay switched.
                self.pending = None;
                None
            }
            _ if self.current == Some(circ) => {
                let unconfirmed = self.pending.take().map_or(0, |p| p.kept.len());
                self.current = None;
                Some(Fallback::Failed { unconfirmed })
            }
            _ => None,
        };
        self.legs.retain(|(c, _)| *c != circ);
        outcome
    }

    fn fall_back(&mut self) -> Option<Fallback<T>> {
        let p = self.pending.take()?;
        let sent = self.sent;
        let Some(from) = self.legs.iter_mut().find(|(c, _)| *c == p.from) else {
            self.current = None;
            self.announce = false;
            return Some(Fallback::Failed {
                unconfirmed: p.kept.len(),
            });
        };
        self.current = Some(p.from);
        let Some(&(first, _)) = p.kept.front() else {
            // Nothing went on the new leg: announce the old one lazily, like any switch.
            self.announce = true;
            return Some(Fallback::Resend {
                switch: None,
                cells: Vec::new(),
                abandoned: p.to,
            });
        };
        // The kept cells are first..=sent; the old leg last sent before `first`.
        let gap = first.checked_sub(1).and_then(|f| f.checked_sub(from.1));
        let Some(relative_seq) = gap.and_then(|g| u32::try_from(g).ok()) else {
            self.current = None;
            self.announce = false;
            return Some(Fallback::Failed {
                unconfirmed: p.kept.len(),
            });
        };
        from.1 = sent;
        self.announce = false;
        Some(Fallback::Resend {
            switch: Some(SwitchMsg {
                leg: p.from,
                relative_seq,
            }),
            cells: p.kept.into_iter().collect(),
            abandoned: p.to,
        })
    }
}

/// The receiving end of a linked set (the exit for uploads).
#[derive(Clone, Debug)]
pub struct PathReceiver<T> {
    limits: PathLimits,
    /// Each leg: last number received on it, and whether its last message was a SWITCH.
    legs: Vec<RecvLeg>,
    /// The next number to deliver.
    next: u64,
    /// Buffered cells by number, each with the leg it came on.
    out_of_order: BTreeMap<u64, (CircKey, T)>,
    ready: VecDeque<T>,
    /// Confirmations to send: (leg, number), at most one per leg (the newest).
    confirms: Vec<(CircKey, u64)>,
    duplicates: u64,
}

#[derive(Clone, Copy, Debug)]
struct RecvLeg {
    circ: CircKey,
    last: u64,
    just_switched: bool,
    /// Cells that came on this leg and are buffered out of order.
    held: u64,
}

/// What happened to a received cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Delivered or buffered; poll [`PathReceiver::poll_deliver`].
    Accepted,
    /// Its number was delivered or buffered already: dropped.
    Duplicate,
}

impl<T> PathReceiver<T> {
    /// A set whose first leg is `first`.
    pub fn new(first: CircKey, limits: PathLimits) -> Self {
        PathReceiver {
            limits,
            legs: vec![RecvLeg {
                circ: first,
                last: 0,
                just_switched: false,
                held: 0,
            }],
            next: 1,
            out_of_order: BTreeMap::new(),
            ready: VecDeque::new(),
            confirms: Vec::new(),
            duplicates: 0,
        }
    }

    /// Link another leg (on LINK).
    pub fn add_leg(&mut self, circ: CircKey) -> Result<(), LegError> {
        if self.legs.iter().any(|l| l.circ == circ) {
            return Err(LegError::Duplicate);
        }
        if self.legs.len() >= MAX_LEGS {
            return Err(LegError::TooMany);
        }
        self.legs.push(RecvLeg {
            circ,
            last: 0,
            just_switched: false,
            held: 0,
        });
        Ok(())
    }

    /// A leg closed. Cells it had delivered stay delivered; a gap it leaves is filled by the
    /// sender's fallback or the set fails when the caller's timers say so.
    pub fn leg_closed(&mut self, circ: CircKey) {
        self.legs.retain(|l| l.circ != circ);
        self.confirms.retain(|(c, _)| *c != circ);
    }

    /// Number of legs.
    pub fn legs(&self) -> usize {
        self.legs.len()
    }

    /// Cells buffered out of order.
    pub fn buffered(&self) -> usize {
        self.out_of_order.len()
    }

    /// Duplicates dropped so far.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The next number to deliver.
    pub fn next_expected(&self) -> u64 {
        self.next
    }

    fn window(&self) -> u64 {
        self.limits.window(self.legs.len())
    }

    fn window_end(&self) -> u64 {
        self.next.saturating_add(self.window())
    }

    /// Whether the circuit SENDMEs of leg `circ` are to be withheld now: the buffer holds
    /// [`PathLimits::withhold_above`] cells or more and `circ` is ahead (its last number is
    /// beyond the next to deliver, so its cells can only be buffered). A leg that holds the
    /// gap is never held back: its missing cells were sent already and need no SENDME.
    pub fn withholds(&self, circ: CircKey) -> bool {
        self.out_of_order.len() as u64 >= self.limits.withhold_above
            && self
                .legs
                .iter()
                .any(|l| l.circ == circ && l.last >= self.next)
    }

    /// The cells buffered out of order (in number order).
    pub fn buffered_cells(&self) -> impl Iterator<Item = &T> {
        self.out_of_order.values().map(|(_, c)| c)
    }

    /// Cells that came on `circ` and are buffered out of order.
    pub fn held_on(&self, circ: CircKey) -> u64 {
        self.legs
            .iter()
            .find(|l| l.circ == circ)
            .map_or(0, |l| l.held)
    }

    fn leg_mut(&mut self, circ: CircKey) -> Result<&mut RecvLeg, SeqViolation> {
        self.legs
            .iter_mut()
            .find(|l| l.circ == circ)
            .ok_or(SeqViolation::NotALeg(circ))
    }

    /// A CONFLUX_SWITCH arrived on `circ`.
    pub fn on_switch(&mut self, circ: CircKey, relative_seq: u32) -> Result<(), SeqViolation> {
        let (next, window, end) = (self.next, self.window(), self.window_end());
        let leg = self.leg_mut(circ)?;
        if leg.just_switched {
            return Err(SeqViolation::RepeatedSwitch);
        }
        let last = leg
            .last
            .checked_add(u64::from(relative_seq))
            .ok_or(SeqViolation::Overflow)?;
        // The leg's next cell would be last + 1: it must fit the window.
        if last.saturating_add(1) >= end {
            return Err(SeqViolation::BeyondWindow {
                seq: last.saturating_add(1),
                next,
                window,
            });
        }
        leg.last = last;
        leg.just_switched = true;
        self.confirms.retain(|(c, _)| *c != circ);
        self.confirms.push((circ, last));
        Ok(())
    }

    /// A multiplexed cell arrived on `circ`.
    pub fn on_cell(&mut self, circ: CircKey, cell: T) -> Result<Arrival, SeqViolation> {
        let (next, window, end) = (self.next, self.window(), self.window_end());
        let limit = self.limits.max_buffered(self.legs.len());
        let buffered = self.out_of_order.len() as u64;
        let leg = self.leg_mut(circ)?;
        let seq = leg.last.checked_add(1).ok_or(SeqViolation::Overflow)?;
        if seq >= end {
            return Err(SeqViolation::BeyondWindow { seq, next, window });
        }
        leg.last = seq;
        leg.just_switched = false;
        if seq < self.next || self.out_of_order.contains_key(&seq) {
            self.duplicates += 1;
            return Ok(Arrival::Duplicate);
        }
        if seq != self.next && buffered >= limit {
            return Err(SeqViolation::BufferFull {
                buffered: buffered + 1,
                limit,
            });
        }
        if seq != self.next {
            let per_leg = self.limits.max_buffered_per_leg();
            let leg = self.leg_mut(circ)?;
            if leg.held >= per_leg {
                return Err(SeqViolation::LegBufferFull {
                    held: leg.held + 1,
                    limit: per_leg,
                });
            }
            leg.held += 1;
        }
        self.out_of_order.insert(seq, (circ, cell));
        while let Some((leg, c)) = self.out_of_order.remove(&self.next) {
            // The cell that arrived in turn was never counted as held.
            if self.next != seq {
                if let Some(l) = self.legs.iter_mut().find(|l| l.circ == leg) {
                    l.held = l.held.saturating_sub(1);
                }
            }
            self.ready.push_back(c);
            self.next += 1;
        }
        Ok(Arrival::Accepted)
    }

    /// The next cell in order, if it is here.
    pub fn poll_deliver(&mut self) -> Option<T> {
        self.ready.pop_front()
    }

    /// A SWITCH_CONFIRM to send: (leg, number).
    pub fn poll_confirm(&mut self) -> Option<(CircKey, u64)> {
        if self.confirms.is_empty() {
            None
        } else {
            Some(self.confirms.remove(0))
        }
    }
}

#[cfg(test)]
mod tests;
