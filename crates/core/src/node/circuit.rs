//! A circuit's state: its ends on two channels, one cell queue toward each, and its role: a
//! relay circuit passing through, or an origin circuit this node builds.

use std::time::Instant;

use chive_cell::{CircId, Create2};
use chive_crypto::relay::{ClientCircuitCrypto, RelayHopCrypto};
use chive_crypto::IdentityKey;

use crate::sched::QueueId;
use crate::{ChannelId, CircKey};

use super::cc_negotiate::HopHandshake;
use super::config::HopSpec;
use super::queue::CellQueue;
use super::stream::Edge;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    /// Toward the client (relay circuits only).
    Prev,
    /// Toward the exit (a relay's next hop, or a client's guard).
    Next,
}

pub(super) fn queue_id(key: CircKey, side: Side) -> QueueId {
    QueueId(key.0 << 1 | matches!(side, Side::Next) as u64)
}

pub(super) fn queue_of(q: QueueId) -> (CircKey, Side) {
    (
        CircKey(q.0 >> 1),
        if q.0 & 1 == 1 { Side::Next } else { Side::Prev },
    )
}

// Origin circuits carry the whole path's crypto; there are few of them (a
// client's own), so the size difference with relay circuits does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Role {
    /// A circuit through this relay. `edge` is Some when this relay is its last hop
    /// and streams have been opened on it.
    Relay {
        crypto: RelayHopCrypto,
        edge: Option<Edge>,
        /// An EXTEND2 waiting for its channel (the CREATE2 body to send).
        pending_extend: Option<(IdentityKey, Create2)>,
        /// EXTEND2 sent on; waiting for CREATED2.
        extending: bool,
    },
    /// A circuit this node builds.
    Origin {
        crypto: ClientCircuitCrypto,
        path: Vec<HopSpec>,
        handshake: Option<HopHandshake>,
        built: bool,
        edge: Edge,
        deadline: Instant,
    },
}

pub(super) struct Circuit {
    pub(super) prev: Option<(ChannelId, CircId)>,
    pub(super) next: Option<(ChannelId, CircId)>,
    pub(super) q_prev: CellQueue,
    pub(super) q_next: CellQueue,
    /// Cells this circuit handed to its channels (both directions).
    pub(super) cells_sent: u64,
    /// Relay cells per direction on the current connections (circuit switching's markers).
    pub(super) sw: super::switch::SwCounts,
    pub(super) role: Role,
    pub(super) relay_early_seen: u8,
    /// KH of the handshake with this relay (relay circuits) or with the last hop built
    /// (origin circuits): what ESTABLISH_INTRO's HANDSHAKE_AUTH is keyed with.
    pub(super) kh: [u8; 20],
    /// Whether this circuit's ends agreed on congestion control (Vegas) in its last hop's
    /// handshake (`cc_negotiate.rs`); fixed window if not, and for ntor v1 circuits. A bool,
    /// not the parameters: each end packages with its own.
    pub(super) vegas: bool,
}

impl Circuit {
    pub(super) fn queue(&mut self, side: Side) -> &mut CellQueue {
        match side {
            Side::Prev => &mut self.q_prev,
            Side::Next => &mut self.q_next,
        }
    }
    /// Cells queued toward `side`.
    pub(super) fn queue_len(&self, side: Side) -> usize {
        match side {
            Side::Prev => self.q_prev.len(),
            Side::Next => self.q_next.len(),
        }
    }
    pub(super) fn endpoint(&self, side: Side) -> Option<(ChannelId, CircId)> {
        match side {
            Side::Prev => self.prev,
            Side::Next => self.next,
        }
    }
    pub(super) fn edge(&self) -> Option<&Edge> {
        match &self.role {
            Role::Relay { edge, .. } => edge.as_ref(),
            Role::Origin { edge, .. } => Some(edge),
        }
    }
    pub(super) fn edge_mut(&mut self) -> Option<&mut Edge> {
        match &mut self.role {
            Role::Relay { edge, .. } => edge.as_mut(),
            Role::Origin { edge, .. } => Some(edge),
        }
    }
    /// The side edge data leaves on: backward at an exit, forward at a client.
    pub(super) fn edge_out_side(&self) -> Side {
        match self.role {
            Role::Relay { .. } => Side::Prev,
            Role::Origin { .. } => Side::Next,
        }
    }
    pub(super) fn is_origin(&self) -> bool {
        matches!(self.role, Role::Origin { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes that make up a circuit's heap (a `Circuit` lives inline in the core's map):
    /// printed for the record (`--nocapture`), bounded so growth is a decision.
    #[test]
    fn circuit_size_audit() {
        use std::mem::size_of;
        let sizes = [
            ("Circuit", size_of::<Circuit>()),
            ("Role", size_of::<Role>()),
            ("RelayHopCrypto", size_of::<RelayHopCrypto>()),
            ("ClientCircuitCrypto", size_of::<ClientCircuitCrypto>()),
            ("Edge", size_of::<Edge>()),
            ("CellQueue", size_of::<CellQueue>()),
            ("Create2", size_of::<Create2>()),
            ("SwCounts", size_of::<super::super::switch::SwCounts>()),
        ];
        for (name, n) in sizes {
            eprintln!("size_of::<{name}>() = {n}");
        }
        assert!(size_of::<Circuit>() <= 2304, "{sizes:?}");
    }
}
