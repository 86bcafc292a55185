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

mod rtt;
pub use rtt::{confirm_timeout, SetRtt, MAX_RTT_CONFIRM_TIMEOUT, PROBE_MIN_WAIT};

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
    /// Switches that may be announced and unconfirmed at once (at least 1, the default).
    /// Striping sets more (`SwitchStripeMoves`): a switch superseded by a later one before
    /// its confirmation is *released* (its kept cells dropped; [`PathSender::switch_to`]),
    /// so each leg's share is not held up by the other leg's confirmation round trip.
    pub max_moves: usize,
}

impl Default for PathLimits {
    fn default() -> Self {
        PathLimits {
            withhold_above: 1000,
            max_leg_window: u64::from(crate::cc::CC_CWND_LIMIT),
            unwindowed_slack: 256,
            max_unconfirmed: 1000,
            confirm_timeout: Duration::from_secs(2),
            max_moves: 1,
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
    /// A released switch (superseded before its confirmation, `max_moves` > 1) is
    /// confirmed: nothing was kept for it; only the metrics and the slot change.
    Released(Released),
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

/// A switch announced and then superseded by a later one before its confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The leg switched to (its confirmation comes there).
    pub to: CircKey,
    /// The leg it left.
    pub from: CircKey,
    /// The new leg's counter after its SWITCH (what the confirmation names).
    pub base: u64,
    /// When [`PathSender::switch_to`] was called.
    pub triggered_at: Instant,
    /// When its SWITCH went out (its deadline is that plus the timeout).
    pub announced_at: Instant,
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
    /// Switches superseded before their confirmation, oldest first (fewer than `max_moves`).
    released: VecDeque<Released>,
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
            released: VecDeque::new(),
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

    /// Whether [`PathSender::switch_to`] may move now: no announced switch waits, or fewer
    /// than `max_moves` do (the latest would be released).
    pub fn may_switch(&self) -> bool {
        !self.switch_announced() || self.released.len() + 1 < self.limits.max_moves.max(1)
    }

    /// Switches released and not confirmed yet.
    pub fn released(&self) -> usize {
        self.released.len()
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
            .into_iter()
            .chain(self.released.iter().map(|r| r.announced_at))
            .min()
            .map(|at| at + self.limits.confirm_timeout)
    }

    /// Time passed: the released switches unconfirmed past their deadline, oldest first,
    /// which stop counting against `max_moves`. Nothing was kept for them: the caller decides
    /// whether their leg is slow (it still acknowledges cells) or gone.
    pub fn expire_released(&mut self, now: Instant) -> Vec<Released> {
        let timeout = self.limits.confirm_timeout;
        let mut out = Vec::new();
        self.released.retain(|r| {
            let due = now >= r.announced_at + timeout;
            if due {
                out.push(*r);
            }
            !due
        });
        out
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
    /// confirmed or fall back first, unless `max_moves` allows more: then it is released
    /// (its kept cells dropped, its confirmation still awaited for the slot) and the new
    /// switch falls back, if it must, to the leg the released one went to, which carried
    /// every number before the new switch's first.
    pub fn switch_to(&mut self, to: CircKey, now: Instant) -> Result<(), SwitchError> {
        let announced = self.switch_announced();
        if announced && !self.may_switch() {
            return Err(SwitchError::Unconfirmed);
        }
        let from = match &self.pending {
            Some(p) if p.announced.is_none() => p.from,
            _ => self.current.ok_or(SwitchError::NotALeg)?,
        };
        if !self.legs.iter().any(|(c, _)| *c == to) {
            return Err(SwitchError::NotALeg);
        }
        if Some(to) == self.current {
            return Err(SwitchError::AlreadyCurrent);
        }
        if announced {
            if let Some(Pending {
                to: rto,
                from: rfrom,
                triggered_at,
                announced: Some((base, at)),
                ..
            }) = self.pending.take()
            {
                self.released.push_back(Released {
                    to: rto,
                    from: rfrom,
                    base,
                    triggered_at,
                    announced_at: at,
                });
            }
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
            _ => {
                let i = self
                    .released
                    .iter()
                    .position(|r| r.to == leg && r.base == seq);
                Ok(i.and_then(|i| self.released.remove(i))
                    .map_or(ConfirmOutcome::Stale, ConfirmOutcome::Released))
            }
        }
    }

    /// Time passed: the pending switch unconfirmed past its deadline falls back.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Fallback<T>> {
        // The pending switch's own deadline (released ones: `expire_released`).
        match self
            .announced_at()
            .map(|at| at + self.limits.confirm_timeout)
        {
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
        // A released switch onto it can no longer be confirmed (the caller judges the cells
        // charged to that leg, as for any closing leg).
        self.released.retain(|r| r.to != circ);
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
