//! Congestion-triggered circuit switching (paper 003; issue 16): the sans-IO parts.
//!
//! - [`detector`]: the entry relay's per-connection congestion detector (EWMA of output-buffer
//!   occupancy against α and β, refused writes) and the choice of the circuit to move.
//! - [`conn`]: the connection variant's per-circuit hand-over: the mover waits for SWITCH_ACK
//!   (timeout), cuts over with a SWITCH marker on the old connection; each receiving end holds
//!   the new connection's cells until the marker, checks it, and releases them in order.
//! - [`path`]: the path variant's sequencing (conflux-style numbers across a client's linked
//!   circuits): the sender's switch with confirmation and timeout fallback (the timeout a
//!   multiple of the legs' measured round trip, [`path::confirm_timeout`]), the receiver's
//!   bounded out-of-order buffer with exactly-once, in-order delivery.
//! - [`legs`]: how a client's upload uses its legs (`SwitchLegUse`: whole, the paper's; or
//!   stripe, conflux-style over every leg with room), the [`legs::LegScheduler`] hook.
//!
//! The wire formats are in chive-cell (`SwitchConn`, `SwitchAck`, `SwitchMarker`,
//! `ConfluxLink`, `ConfluxSwitch`, `SwitchConfirm`, `Congested`); the protocol is described in
//! docs/protocol.md, "Circuit switching". Not here: wiring these into `Core`'s circuits
//! (`node/switch.rs`, `node/path.rs`), the driver's sampling of sockets, metrics.

pub mod conn;
pub mod detector;
pub mod legs;
pub mod path;

pub use conn::{
    AckOutcome, ConnViolation, HoldBack, MoverState, MoverSwitch, PeerDrop, PeerState, PeerSwitch,
    MAX_PENDING_PER_PEER,
};
pub use detector::{
    circuit_to_move, CongestionDetector, DetectorConfig, DetectorConfigError, Level, Occupancy,
    Sample, Trigger, TriggerReason, DEFAULT_MIN_SHARE,
};
pub use legs::{LegScheduler, LegUse, LegView, MinRtt, MAX_STRIPE_MOVES, MIN_LEG_CELLS};
pub use path::{
    confirm_timeout, Arrival, ConfirmOutcome, Fallback, LegError, Outgoing, PathLimits,
    PathReceiver, PathSender, Released, SendError, SeqViolation, SetRtt, SwitchError, SwitchMsg,
    MAX_RTT_CONFIRM_TIMEOUT, PROBE_MIN_WAIT,
};
