//! The node state machine: channels, circuits, queues, streams.
//!
//! [`Core`] is one type; its `impl` is spread over this module's files, one concern each:
//! - `config`, `event`: what the driver passes in at start ([`CoreConfig`]) and what it must
//!   act on ([`Event`]);
//! - `channel`: links to neighbours: opening and closing, the one canonical channel per peer,
//!   DESTROY cells (which bypass circuit queues), circuit ids;
//! - `circuit`: a circuit's state: its two ends, its two queues, its role (relay or origin);
//! - `queue`: the send path: circuit queues, the per-channel scheduler, `poll_transmit`, and the
//!   limits on queues (per circuit, the packaging high-water mark);
//! - `oom`: `MaxMemInQueues` and the OOM handler (kill the circuits with the oldest cells);
//! - `dos`: the DoS defences at the core's inputs (circuit creation per address, client
//!   connections per address); the per-address state is `crate::dos`;
//! - `build`: CREATE2 / CREATED2, EXTEND2 / EXTENDED2 and TRUNCATE at a relay, and building
//!   origin circuits hop by hop;
//! - `cc_negotiate`: the per-circuit congestion-control agreement in the ntor v3 handshake
//!   (the client asks in CREATE2, the last hop answers in CREATED2);
//! - `relay`: relay cells: RELAY_EARLY accounting, the crypto layer, dispatch of cells
//!   recognized here, originating relay cells at either end;
//! - `stream`: edge streams at both ends: DATA, END, SENDME, packaging and read credit;
//! - `exit`, `client`: the exit's and the client's side of opening streams and resolving;
//! - `teardown`: closing circuits (DESTROY received, protocol violations, limits);
//! - `inspect`: counters, per-cell timing samples, per-circuit stats, the debug dump.
//!
//! Only `mod.rs` owns [`Core`]'s fields; the other files reach them as its children.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use chive_cell::{Cell, CellCommand, CircId, DestroyReason, VarCell, CELL_LEN};
use chive_crypto::IdentityKey;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tracing::debug;

use crate::cc::CcKind;
use crate::dos::DosGuard;
use crate::idmap::{LocalMap, LocalSet};
use crate::sched::QueueId;
use crate::sched::SchedulerKind;
use crate::{ChannelId, CircKey, StreamHandle};

mod build;
mod cc_negotiate;
mod channel;
mod circ_ids;
mod circuit;
mod client;
mod client_hold;
mod config;
mod dos;
mod event;
mod exit;
mod inspect;
mod onion;
mod oom;
mod origin_run;
mod path;
mod queue;
mod relay;
mod relay_run;
mod stream;
mod switch;
mod switch_report;
mod teardown;

pub use build::MAX_PATH_LEN;
pub use cc_negotiate::CcAgreementStats;
pub use client_hold::{HoldStats, MIN_PAUSE_CELLS, RELEASE_CREDIT, RELEASE_TICK};
pub use config::{CoreConfig, HopSpec, RelayKeys};
pub use event::{CloseCause, CoreError, Event, STREAM_WRITE_MAX_CELLS};
pub use inspect::{CellSample, CircuitStat, CoreStats};
pub use onion::OnionRelayStats;
pub use oom::{
    max_mem_in_queues_auto, DEFAULT_MAX_MEM_IN_QUEUES, MIN_MAX_MEM_IN_QUEUES, OOM_RETAIN_PERCENT,
};
pub use queue::CELL_MEM_COST;
pub use stream::STREAM_BUFFER_TARGET;
pub use switch::SWITCH_IDLE_CLOSE;
pub use switch_report::{
    SwitchHold, SwitchMode, SwitchOutcome, SwitchRecord, SwitchSettings, SwitchStats,
    PROBE_AHEAD_EVERY, PROBE_FRESH,
};

use channel::Channel;
use circuit::{queue_id, Circuit, Role, Side};

/// The sans-IO node. See the crate docs.
pub struct Core {
    cfg: CoreConfig,
    rng: StdRng,
    channels: LocalMap<ChannelId, Channel>,
    chan_by_identity: HashMap<IdentityKey, ChannelId>,
    /// Circuits waiting for a channel to this identity.
    waiting_for_channel: HashMap<IdentityKey, Vec<CircKey>>,
    /// Boxed: a `Circuit` is ~2.3 KB (mostly its relay crypto), and a map stores entries
    /// inline, so its free slots (up to half after a resize) would each cost that much.
    circuits: LocalMap<CircKey, Box<Circuit>>,
    /// Stream handle → (circuit, stream id).
    streams: LocalMap<StreamHandle, (CircKey, u16)>,
    next_key: u64,
    next_handle: u64,
    events: VecDeque<Event>,
    ready: VecDeque<ChannelId>,
    ready_set: LocalSet<ChannelId>,
    stats: CoreStats,
    sample_counter: u64,
    cell_samples: VecDeque<CellSample>,
    /// Queues that emptied holding a grown buffer, with when to free it (`queue.rs`).
    emptied_queues: VecDeque<(Instant, QueueId)>,
    /// Bytes the driver reported holding for all channels (counted against `MaxMemInQueues`).
    driver_bytes: usize,
    /// Per-address state of the DoS defences.
    dos: DosGuard,
    /// Circuit switching (paper 003): switches in progress, switch connections, counters.
    sw: switch::SwitchState,
    /// Congestion-control agreement counters (`cc_negotiate.rs`).
    cc_agreement: cc_negotiate::CcAgreementStats,
    /// Circuit switching, path variant: linked sets at the client and the exit (`path.rs`).
    path: path::PathTables,
    /// Introduction and rendezvous tables, joined circuits, service circuits (`onion.rs`).
    onion: onion::OnionTables,
    /// `PerClientQueueCells`: client cells held at this entry (`client_hold.rs`).
    hold: client_hold::HoldTables,
    /// Whether a consensus has set `congestion_control` (until then a relay agrees to a
    /// client's congestion-control request with default parameters: `cc_negotiate.rs`).
    cc_from_consensus: bool,
}

impl Core {
    /// A new node. `seed` feeds the core's CSPRNG (handshakes, circuit ids); pass
    /// fresh OS randomness in production and a fixed seed in tests.
    pub fn new(cfg: CoreConfig, seed: [u8; 32]) -> Self {
        let dos = DosGuard::new(cfg.dos);
        Core {
            cfg,
            rng: StdRng::from_seed(seed),
            channels: LocalMap::default(),
            chan_by_identity: HashMap::new(),
            waiting_for_channel: HashMap::new(),
            circuits: LocalMap::default(),
            streams: LocalMap::default(),
            next_key: 1,
            next_handle: 1,
            events: VecDeque::new(),
            ready: VecDeque::new(),
            ready_set: LocalSet::default(),
            stats: CoreStats::default(),
            sample_counter: 0,
            cell_samples: VecDeque::new(),
            emptied_queues: VecDeque::new(),
            driver_bytes: 0,
            dos,
            sw: switch::SwitchState::default(),
            cc_agreement: Default::default(),
            path: path::PathTables::default(),
            onion: Default::default(),
            hold: Default::default(),
            cc_from_consensus: false,
        }
    }

    /// Current counters.
    pub fn stats(&self) -> CoreStats {
        CoreStats {
            circuits: self.circuits.len(),
            streams: self.streams.len(),
            mem_in_queues: self.mem_in_queues(),
            ..self.stats
        }
    }

    /// This relay's identity, if it is one.
    pub fn identity(&self) -> Option<IdentityKey> {
        self.cfg.relay.as_ref().map(|r| r.identity)
    }

    /// The scheduling policy in use.
    pub fn scheduler(&self) -> SchedulerKind {
        self.cfg.scheduler
    }

    /// Change every channel's scheduling policy at runtime (SIGHUP). Circuits
    /// keep their queues; queues with cells are re-activated in the new policy.
    pub fn set_scheduler(&mut self, kind: SchedulerKind, now: Instant) {
        self.cfg.scheduler = kind;
        for (&chan, ch) in self.channels.iter_mut() {
            let mut sched = kind.build();
            for (&id, &key) in &ch.circ_ids {
                let Some(circ) = self.circuits.get(&key) else {
                    continue;
                };
                for (side, q) in [(Side::Prev, &circ.q_prev), (Side::Next, &circ.q_next)] {
                    if q.len() > 0 && circ.endpoint(side) == Some((chan, id)) {
                        sched.activate(queue_id(key, side), now);
                    }
                }
            }
            ch.sched = sched;
        }
    }

    /// Change the circuit window for circuits created from now on (a new consensus).
    pub fn set_circwindow(&mut self, circwindow: u32) {
        self.cfg.circwindow = circwindow.clamp(100, 1000);
    }

    /// This node's own circuit window (a relay's `CircuitWindow` option), overriding the
    /// consensus `circwindow` for circuits created from now on; `None` follows the consensus.
    pub fn set_circwindow_override(&mut self, window: Option<u32>) {
        self.cfg.circwindow_override = window.map(|w| w.clamp(100, 1000));
    }

    /// The congestion-control policy from a consensus's `cc_alg`: what this node asks for on
    /// the circuits it builds from now on, and what it agrees to when a client asks
    /// (`cc_negotiate.rs`). Circuits already open keep what they agreed on.
    pub fn set_congestion_control(&mut self, kind: CcKind) {
        self.cfg.congestion_control = kind;
        self.cc_from_consensus = true;
    }

    /// The congestion-control policy new circuits get.
    pub fn congestion_control(&self) -> CcKind {
        self.cfg.congestion_control
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest time [`Core::handle_timeout`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.circuits
            .values()
            .filter_map(|c| match &c.role {
                Role::Origin {
                    built: false,
                    deadline,
                    ..
                } => Some(*deadline),
                _ => None,
            })
            .chain(self.sw_next_deadline())
            .chain(self.path_next_deadline())
            .chain(self.queue_sweep_deadline())
            .chain(self.hold_next_deadline())
            .min()
    }

    /// Time passed: close origin circuits that did not build in time, free the buffers of
    /// queues that stayed empty.
    pub fn handle_timeout(&mut self, now: Instant) {
        let expired: Vec<CircKey> = self
            .circuits
            .iter()
            .filter_map(|(k, c)| match &c.role {
                Role::Origin {
                    built: false,
                    deadline,
                    ..
                } if *deadline <= now => Some(*k),
                _ => None,
            })
            .collect();
        for key in expired {
            self.close_circuit_inner(key, DestroyReason::TIMEOUT, None, now, "build timed out");
        }
        self.sw_handle_timeout(now);
        self.path_handle_timeout(now);
        self.sweep_emptied_queues(now);
        self.hold_handle_timeout(now);
    }

    /// A variable-length cell after the link handshake: padding is ignored,
    /// anything else is logged and ignored (a newer peer may send more).
    pub fn handle_var_cell(&mut self, chan: ChannelId, cell: VarCell, _now: Instant) {
        if cell.command != CellCommand::VPADDING {
            debug!(?chan, command = %cell.command, "ignoring variable cell after handshake");
        }
    }

    /// A fixed cell arrived on `chan`, as its 514 wire bytes (`wire`): a relay cell this relay
    /// passes on is copied once, from the read buffer into its slot in the circuit queue it
    /// leaves by, and its onion layer is applied there; the slot's bytes are what the send
    /// path copies into the outgoing batch. Every other cell is decoded into `scratch` (a
    /// reused buffer) and takes [`Core::handle_cell_mut`]'s path. A variable-length command
    /// byte is the caller's error: the cell is dropped.
    pub fn handle_cell_wire(
        &mut self,
        chan: ChannelId,
        wire: &[u8; CELL_LEN],
        scratch: &mut Cell,
        now: Instant,
    ) {
        let relay = matches!(
            CellCommand(wire[4]),
            CellCommand::RELAY | CellCommand::RELAY_EARLY
        );
        if relay
            && self.sw.ends.is_empty()
            && self.channels.contains_key(&chan)
            && self.relay_wire(chan, wire, now)
        {
            return;
        }
        if scratch.decode_from(wire).is_ok() {
            self.handle_cell_mut(chan, scratch, now);
        }
    }

    /// A fixed cell arrived on `chan`, by reference: the driver decodes each cell into one
    /// reused buffer, and a relay cell passed on is then copied once, into its circuit queue
    /// (by value through [`Core::handle_cell`] it was moved four more times). Cells of a
    /// circuit being switched and other commands take [`Core::handle_cell`]'s path with a copy.
    pub fn handle_cell_mut(&mut self, chan: ChannelId, cell: &mut Cell, now: Instant) {
        let relay = matches!(cell.command, CellCommand::RELAY | CellCommand::RELAY_EARLY);
        if !relay || !self.sw.ends.is_empty() {
            return self.handle_cell(chan, cell.clone(), now);
        }
        self.stats.cells_received += 1;
        if self.channels.contains_key(&chan) {
            self.on_relay(chan, cell, now);
        }
    }

    /// A fixed cell arrived on `chan`.
    pub fn handle_cell(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        self.stats.cells_received += 1;
        if !self.channels.contains_key(&chan) {
            return;
        }
        // Cells on the ids of a circuit being switched go to the switching code first.
        let mut cell = if self.sw.ends.is_empty() {
            cell
        } else {
            match self.sw_intercept(chan, cell, now) {
                Some(cell) => cell,
                None => return,
            }
        };
        match cell.command {
            CellCommand::RELAY | CellCommand::RELAY_EARLY => self.on_relay(chan, &mut cell, now),
            CellCommand::CREATE2 => self.on_create2(chan, cell, now),
            CellCommand::CREATED2 => self.on_created2(chan, cell, now),
            CellCommand::DESTROY => self.on_destroy(chan, cell, now),
            CellCommand::PADDING => {}
            CellCommand::SWITCH_CONN => self.on_switch_conn(chan, cell, now),
            CellCommand::SWITCH => self.on_switch_marker(chan, cell, now),
            other => {
                debug!(?chan, command = %other, "ignoring unexpected cell");
            }
        }
    }

    fn lookup(&self, chan: ChannelId, circ_id: CircId) -> Option<CircKey> {
        self.channels.get(&chan)?.circ_ids.lookup(circ_id)
    }

    fn alloc_key(&mut self) -> CircKey {
        let key = CircKey(self.next_key);
        self.next_key += 1;
        key
    }
}
