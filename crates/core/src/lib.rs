//! chive-core: the sans-IO heart of chive.
//!
//! One [`Core`] holds a node's channels, circuits, circuit queues, per-channel
//! schedulers, SENDME windows and streams. It does no IO and reads no clock:
//! the driver (chive-net + the `chive` binary) feeds it input with `now`
//! (`handle_cell`, `channel_opened`, `stream_data`, …) and pulls output
//! (`poll_transmit` for cells, `poll_event` for everything else), so every
//! behaviour can be unit-tested deterministically, as in quinn-proto.
//!
//! The same core serves a relay (circuits passing through, exit streams) and a
//! client (origin circuits it builds, SOCKS streams), as one process of Tor can.
#![forbid(unsafe_code)]

pub mod bucket;
pub mod cc;
pub mod chansched;
pub mod dos;
pub mod flow;
mod idmap;
mod node;
pub mod onion;
pub mod sched;
pub mod split;
pub mod streamflow;
pub mod switching;

pub use idmap::{LocalIdHasher, LocalMap};
pub use node::STREAM_BUFFER_TARGET;
pub use node::{
    max_mem_in_queues_auto, CellSample, CircuitStat, CloseCause, Core, CoreConfig, CoreError,
    CoreStats, Event, HopSpec, OnionRelayStats, RelayKeys, CELL_MEM_COST,
    DEFAULT_MAX_MEM_IN_QUEUES, MAX_PATH_LEN, MIN_MAX_MEM_IN_QUEUES, OOM_RETAIN_PERCENT,
    STREAM_WRITE_MAX_CELLS,
};
pub use node::{CcAgreementStats, HoldStats, MIN_PAUSE_CELLS, RELEASE_CREDIT, RELEASE_TICK};
pub use node::{
    SwitchHold, SwitchMode, SwitchOutcome, SwitchRecord, SwitchSettings, SwitchStats,
    PROBE_AHEAD_EVERY, PROBE_FRESH, SWITCH_IDLE_CLOSE,
};
pub use sched::{CircuitScheduler, QueueId, SchedulerKind};

/// A channel: the logical link to one neighbour. Chosen by the driver, unique per core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u64);

/// A circuit, as the core names it (circuit ids are per channel; this is per node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CircKey(pub u64);

/// A stream endpoint on this node (an exit's TCP connection or a client's SOCKS
/// connection). Allocated by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamHandle(pub u64);
