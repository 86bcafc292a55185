//! Connection-variant switching: one circuit's move from its old connection C1 to a new one C2
//! to the same relay, in order and without loss (docs/protocol.md, "Connection variant").
//!
//! - [`HoldBack`]: one direction's receiving end. Counts the circuit's cells on C1, holds the
//!   ones that arrive on C2 before the sender's SWITCH marker on C1, checks the marker, then
//!   releases them in order. Both ends use one, for the direction they receive.
//! - [`MoverSwitch`]: the side that moves the circuit (the entry): waits for SWITCH_ACK with a
//!   timeout, then cuts over (its SWITCH marker goes on C1, later cells on C2).
//! - [`PeerSwitch`]: the next hop: a reservation made on SWITCH_CONN, completed by the mover's
//!   marker (then it cuts over its own direction), expired after the timeout.
//!
//! "Cells" are the circuit's cells in one direction on one connection since the circuit began
//! using it (the callers count them; the markers carry the sender's count). The checks a relay
//! makes on SWITCH_CONN that need the core's tables (same peer identity, the circuit's previous
//! hop, the next switch number, a free circuit id, [`MAX_PENDING_PER_PEER`]) are the caller's.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::{SwitchAck, SwitchMarker, SwitchStatus};

/// Switches one peer may have pending (reserved, marker not yet read) at a relay; beyond it the
/// relay answers SWITCH_ACK(BUSY).
pub const MAX_PENDING_PER_PEER: usize = 4;

/// The peer broke the switching rules: the caller closes the circuit with a logged protocol
/// error (DESTROY PROTOCOL on both connections).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnViolation {
    /// More cells held back than the limit.
    #[error("more than {0} cells held back waiting for the SWITCH marker")]
    TooManyHeld(usize),
    /// A marker with the wrong switch number.
    #[error("SWITCH marker for switch {got}, expected {expected}")]
    WrongSeq {
        /// Expected switch number.
        expected: u32,
        /// Received.
        got: u32,
    },
    /// The marker's count differs from the cells received on the old connection.
    #[error("SWITCH marker counts {claimed} cells on the old connection, {received} arrived")]
    WrongCount {
        /// The marker's `cells`.
        claimed: u64,
        /// Cells received.
        received: u64,
    },
    /// A second marker, or a cell on the old connection after the marker.
    #[error("cell on the old connection after the SWITCH marker")]
    AfterMarker,
    /// A marker or acknowledgement that no switch expects.
    #[error("unexpected {0}")]
    Unexpected(&'static str),
}

/// One direction's receiving end of a move. See the module documentation.
#[derive(Clone, Debug)]
pub struct HoldBack<T> {
    seq: u32,
    received_on_old: u64,
    marker_seen: bool,
    held: VecDeque<T>,
    limit: usize,
}

impl<T> HoldBack<T> {
    /// For switch `seq`, with `received_on_old` cells of the circuit already received on C1,
    /// holding at most `limit` cells (the per-circuit queue limit).
    pub fn new(seq: u32, received_on_old: u64, limit: usize) -> Self {
        HoldBack {
            seq,
            received_on_old,
            marker_seen: false,
            held: VecDeque::new(),
            limit,
        }
    }

    /// A cell of the circuit arrived on C1 (deliver it as usual).
    pub fn on_old_cell(&mut self) -> Result<(), ConnViolation> {
        if self.marker_seen {
            return Err(ConnViolation::AfterMarker);
        }
        self.received_on_old = self.received_on_old.saturating_add(1);
        Ok(())
    }

    /// A cell of the circuit arrived on C2: returned for delivery once the marker was read,
    /// held (`None`) before.
    pub fn on_new_cell(&mut self, cell: T) -> Result<Option<T>, ConnViolation> {
        if self.marker_seen {
            return Ok(Some(cell));
        }
        if self.held.len() >= self.limit {
            return Err(ConnViolation::TooManyHeld(self.limit));
        }
        self.held.push_back(cell);
        Ok(None)
    }

    /// The sender's SWITCH marker arrived on C1: check it and release the held cells, in order.
    pub fn on_marker(&mut self, marker: SwitchMarker) -> Result<Vec<T>, ConnViolation> {
        if self.marker_seen {
            return Err(ConnViolation::AfterMarker);
        }
        if marker.seq != self.seq {
            return Err(ConnViolation::WrongSeq {
                expected: self.seq,
                got: marker.seq,
            });
        }
        if marker.cells != self.received_on_old {
            return Err(ConnViolation::WrongCount {
                claimed: marker.cells,
                received: self.received_on_old,
            });
        }
        self.marker_seen = true;
        Ok(self.held.drain(..).collect())
    }

    /// Whether the marker was read (this direction is on C2 now).
    pub fn is_complete(&self) -> bool {
        self.marker_seen
    }

    /// Cells held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Where the mover's switch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoverState {
    /// SWITCH_CONN sent; the circuit still sends on C1.
    AwaitingAck {
        /// When the mover gives up.
        deadline: Instant,
    },
    /// Cut over: the circuit sends on C2.
    Moved,
    /// Refused or timed out: the circuit stays on C1.
    Abandoned,
}

/// What a SWITCH_ACK meant to the mover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Queue this marker on C1 as the circuit's last cell there; send later cells on C2.
    CutOver(SwitchMarker),
    /// Refused (busy, disabled, or an unknown status): the circuit stays on C1.
    Refused(SwitchStatus),
    /// For a switch the mover gave up already (its DESTROY crossed the ACK): ignore.
    Late,
}

/// The mover's side of one circuit's move.
#[derive(Clone, Debug)]
pub struct MoverSwitch<T> {
    seq: u32,
    state: MoverState,
    triggered_at: Instant,
    /// The backward direction, received from the peer.
    back: HoldBack<T>,
}

impl<T> MoverSwitch<T> {
    /// Start switch `seq` (send SWITCH_CONN now); `received_on_old` backward cells already
    /// came on C1; wait at most `timeout` from `now` for the acknowledgement.
    pub fn new(
        seq: u32,
        received_on_old: u64,
        hold_limit: usize,
        now: Instant,
        timeout: Duration,
    ) -> Self {
        MoverSwitch {
            seq,
            state: MoverState::AwaitingAck {
                deadline: now + timeout,
            },
            triggered_at: now,
            back: HoldBack::new(seq, received_on_old, hold_limit),
        }
    }

    /// The state.
    pub fn state(&self) -> MoverState {
        self.state
    }

    /// When the switch was started (SWITCH_CONN sent: the timeout counts from here).
    pub fn triggered_at(&self) -> Instant {
        self.triggered_at
    }

    /// When [`MoverSwitch::handle_timeout`] must run.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            MoverState::AwaitingAck { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// SWITCH_ACK arrived on C2; `sent_on_old` is how many of the circuit's cells the mover has
    /// handed to C1 so far (the marker goes right behind them).
    pub fn on_ack(
        &mut self,
        ack: SwitchAck,
        sent_on_old: u64,
    ) -> Result<AckOutcome, ConnViolation> {
        match self.state {
            MoverState::Abandoned => return Ok(AckOutcome::Late),
            MoverState::Moved => return Err(ConnViolation::Unexpected("second SWITCH_ACK")),
            MoverState::AwaitingAck { .. } => {}
        }
        if ack.seq != self.seq {
            return Err(ConnViolation::WrongSeq {
                expected: self.seq,
                got: ack.seq,
            });
        }
        if !ack.status.is_accepted() {
            self.state = MoverState::Abandoned;
            return Ok(AckOutcome::Refused(ack.status));
        }
        self.state = MoverState::Moved;
        Ok(AckOutcome::CutOver(SwitchMarker {
            seq: self.seq,
            cells: sent_on_old,
        }))
    }

    /// Time passed: `true` if the switch was just abandoned (send DESTROY on C2's circuit id;
    /// the circuit never left C1).
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        match self.state {
            MoverState::AwaitingAck { deadline } if now >= deadline => {
                self.state = MoverState::Abandoned;
                true
            }
            _ => false,
        }
    }

    /// The backward direction's hold-back (cells from the peer on C1 and C2, its marker).
    pub fn backward(&mut self) -> &mut HoldBack<T> {
        &mut self.back
    }

    /// A cell from the peer on C2 before the mover cut over: the peer cuts over only after the
    /// mover's marker, so this is a violation; after the cut-over see [`HoldBack::on_new_cell`].
    pub fn on_new_cell(&mut self, cell: T) -> Result<Option<T>, ConnViolation> {
        if self.state != MoverState::Moved {
            return Err(ConnViolation::Unexpected(
                "cell on the new connection before SWITCH",
            ));
        }
        self.back.on_new_cell(cell)
    }

    /// Backward cells held (arrived on C2 before the peer's marker).
    pub fn held_backward(&self) -> usize {
        self.back.held()
    }

    /// Whether both directions are on C2 (the old circuit id may be reused).
    pub fn is_complete(&self) -> bool {
        self.state == MoverState::Moved && self.back.is_complete()
    }
}

/// Where the peer's side stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// SWITCH_ACK(ACCEPTED) sent; waiting for the mover's marker on C1.
    Reserved {
        /// When the reservation expires.
        deadline: Instant,
    },
    /// The mover's marker was read and the peer's own marker queued: both directions moved.
    Moved,
    /// Expired or cancelled.
    Dropped,
}

/// How a reservation ended without a move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerDrop {
    /// Nothing arrived on C2: forget the reservation (DESTROY C2's id); the circuit stays on C1.
    Cancel,
    /// Cells arrived on C2 but the marker never came on C1: cells are missing, close the
    /// circuit (logged).
    CloseCircuit,
}

/// The next hop's side of one circuit's move.
#[derive(Clone, Debug)]
pub struct PeerSwitch<T> {
    seq: u32,
    state: PeerState,
    /// The forward direction, received from the mover.
    fwd: HoldBack<T>,
}

impl<T> PeerSwitch<T> {
    /// Reserve after validating SWITCH_CONN(`seq`) (then send SWITCH_ACK(ACCEPTED));
    /// `received_on_old` forward cells already came on C1.
    pub fn accept(
        seq: u32,
        received_on_old: u64,
        hold_limit: usize,
        now: Instant,
        timeout: Duration,
    ) -> (Self, SwitchAck) {
        let s = PeerSwitch {
            seq,
            state: PeerState::Reserved {
                deadline: now + timeout,
            },
            fwd: HoldBack::new(seq, received_on_old, hold_limit),
        };
        (
            s,
            SwitchAck {
                seq,
                status: SwitchStatus::ACCEPTED,
            },
        )
    }

    /// The state.
    pub fn state(&self) -> PeerState {
        self.state
    }

    /// When [`PeerSwitch::handle_timeout`] must run.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            PeerState::Reserved { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// A forward cell on C1.
    pub fn on_old_cell(&mut self) -> Result<(), ConnViolation> {
        self.fwd.on_old_cell()
    }

    /// A forward cell on C2: held until the marker, then passed through.
    pub fn on_new_cell(&mut self, cell: T) -> Result<Option<T>, ConnViolation> {
        if self.state == PeerState::Dropped {
            return Err(ConnViolation::Unexpected("cell for a dropped switch"));
        }
        self.fwd.on_new_cell(cell)
    }

    /// The mover's marker on C1: check it, release the held cells, and cut over the backward
    /// direction: queue the returned marker on C1 (`sent_on_old` = backward cells handed to C1
    /// so far), then send backward cells on C2.
    pub fn on_marker(
        &mut self,
        marker: SwitchMarker,
        sent_on_old: u64,
    ) -> Result<(Vec<T>, SwitchMarker), ConnViolation> {
        if !matches!(self.state, PeerState::Reserved { .. }) {
            return Err(ConnViolation::Unexpected("SWITCH without a reservation"));
        }
        let released = self.fwd.on_marker(marker)?;
        self.state = PeerState::Moved;
        Ok((
            released,
            SwitchMarker {
                seq: self.seq,
                cells: sent_on_old,
            },
        ))
    }

    /// Forward cells held (arrived on C2 before the mover's marker).
    pub fn held(&self) -> usize {
        self.fwd.held()
    }

    /// The mover sent DESTROY on C2's id (it gave up waiting for the ACK).
    pub fn cancel(&mut self) -> Option<PeerDrop> {
        self.drop_reservation()
    }

    /// Time passed: the reservation expires without the mover's marker.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<PeerDrop> {
        match self.state {
            PeerState::Reserved { deadline } if now >= deadline => self.drop_reservation(),
            _ => None,
        }
    }

    fn drop_reservation(&mut self) -> Option<PeerDrop> {
        if !matches!(self.state, PeerState::Reserved { .. }) {
            return None;
        }
        self.state = PeerState::Dropped;
        Some(if self.fwd.held() == 0 {
            PeerDrop::Cancel
        } else {
            PeerDrop::CloseCircuit
        })
    }
}

#[cfg(test)]
mod tests;
