//! The node state machine: channels, circuits, queues, streams.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use chive_cell::{
    parse_relay, relay_payload, Begin, Cell, CellCommand, CircId, Connected, Create2, Created2,
    Destroy, DestroyReason, End, EndReason, Extend2, Extended2, LinkSpec, RelayCommand, Resolve,
    Resolved, ResolvedAnswer, Sendme, VarCell, PAYLOAD_LEN, RELAY_DATA_LEN,
};
use chive_crypto::ntor::{self, NtorClientState, NtorPublicKey, NtorSecretKey, NTOR_HTYPE};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
use chive_crypto::IdentityKey;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, info, warn};

use crate::flow::{CircuitWindow, StreamWindow};
use crate::idmap::{LocalMap, LocalSet};
use crate::sched::{CircuitScheduler, QueueId, SchedulerKind};
use crate::{ChannelId, CircKey, StreamHandle};

/// Stop packaging edge data into a circuit queue above this many cells (Tor's high-water mark).
const QUEUE_HIGHWATER: usize = 256;
/// Resume packaging once the queue has drained below this.
const QUEUE_LOWWATER: usize = 64;
/// Bytes a stream may have read from its socket but not yet packaged, plus granted credit.
const STREAM_BUFFER_TARGET: usize = 32 * RELAY_DATA_LEN;
/// RELAY_EARLY cells allowed per circuit (tor-spec).
const MAX_RELAY_EARLY: u8 = 8;

/// The keys that make a node a relay.
pub struct RelayKeys {
    /// The relay's Ed25519 identity (public half; the link layer holds the secret).
    pub identity: IdentityKey,
    /// The relay's ntor onion key.
    pub ntor: NtorSecretKey,
}

/// Core configuration. Everything a policy may vary lives here, chosen per node.
pub struct CoreConfig {
    /// Initial circuit package window (`circwindow`, 100..=1000).
    pub circwindow: u32,
    /// Scheduling policy for every channel.
    pub scheduler: SchedulerKind,
    /// A circuit whose queue in one direction grows past this is destroyed (the
    /// peer ignores flow control).
    pub max_circuit_queue: usize,
    /// Circuits a single channel may carry.
    pub max_circuits_per_channel: usize,
    /// All circuit queues together may hold at most this many cells (Tor's
    /// MaxMemInQueues); above it the circuit with the longest queue is killed.
    pub max_queued_cells: usize,
    /// Origin circuits not built within this time are closed.
    pub circuit_build_timeout: Duration,
    /// Relay keys; `None` for a pure client.
    pub relay: Option<RelayKeys>,
    /// Whether this relay opens exit streams (the driver applies the exit policy).
    pub exit: bool,
    /// Sample one cell in this many for per-cell timing (0 = off).
    pub cell_sample_every: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            circwindow: 1000,
            scheduler: SchedulerKind::default(),
            max_circuit_queue: 2500,
            max_circuits_per_channel: 20_000,
            max_queued_cells: 4_000_000,
            circuit_build_timeout: Duration::from_secs(30),
            relay: None,
            exit: false,
            cell_sample_every: 0,
        }
    }
}

/// Where and how to reach one hop of a circuit the client builds.
#[derive(Clone, Debug)]
pub struct HopSpec {
    /// Ed25519 identity (from the consensus).
    pub identity: IdentityKey,
    /// ntor onion key (from the consensus).
    pub ntor_key: NtorPublicKey,
    /// ORPort address.
    pub addr: SocketAddr,
}

/// Errors returned to the driver for requests it made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The circuit does not exist (any more).
    #[error("no such circuit")]
    NoSuchCircuit,
    /// The circuit is not built yet, or is not an origin circuit.
    #[error("circuit is not open")]
    CircuitNotOpen,
    /// Stream ids on this circuit are exhausted.
    #[error("too many streams on circuit")]
    TooManyStreams,
    /// The target could not be encoded (e.g. a host name too long).
    #[error("bad target: {0}")]
    BadTarget(String),
}

/// Output for the driver, in the order it must be acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Open a link to this relay (an extend, or a client circuit's first hop). Answer
    /// with [`Core::channel_opened`] or [`Core::connect_failed`].
    Connect {
        /// ORPort address.
        addr: SocketAddr,
        /// The identity the peer must prove.
        identity: IdentityKey,
    },
    /// Close this channel (its circuits are already gone from the core).
    CloseChannel {
        /// The channel.
        chan: ChannelId,
        /// Why, for the log.
        reason: String,
    },
    /// Exit: open a TCP connection for a new stream; answer with
    /// [`Core::exit_connected`] or [`Core::exit_failed`].
    ExitConnect {
        /// The new stream.
        stream: StreamHandle,
        /// Host name or address literal, as the client sent it.
        host: String,
        /// Port.
        port: u16,
    },
    /// Exit: resolve a name; answer with [`Core::exit_resolved`].
    ExitResolve {
        /// The request.
        stream: StreamHandle,
        /// Host name.
        host: String,
    },
    /// Client: a stream's BEGIN was answered with CONNECTED.
    StreamConnected {
        /// The stream.
        stream: StreamHandle,
        /// Address the exit connected to, if it said.
        addr: Option<IpAddr>,
    },
    /// Client: answers to a RESOLVE.
    Resolved {
        /// The request.
        stream: StreamHandle,
        /// The answers.
        answers: Vec<ResolvedAnswer>,
    },
    /// Write these bytes to the stream's socket, then report with
    /// [`Core::stream_flushed`] (one count per event).
    StreamWrite {
        /// The stream.
        stream: StreamHandle,
        /// At most 498 bytes.
        data: Vec<u8>,
    },
    /// The stream may read this many more bytes from its socket and pass them to
    /// [`Core::stream_data`].
    StreamReadCredit {
        /// The stream.
        stream: StreamHandle,
        /// Bytes.
        bytes: usize,
    },
    /// The stream is finished: flush what was written, then close the socket.
    /// The core has forgotten the handle.
    StreamClosed {
        /// The stream.
        stream: StreamHandle,
        /// The END reason (DONE for a normal close).
        reason: EndReason,
    },
    /// Client: a circuit finished building.
    CircuitBuilt {
        /// The circuit.
        circ: CircKey,
    },
    /// Client: a circuit failed or was closed; its streams were closed too.
    CircuitClosed {
        /// The circuit.
        circ: CircKey,
        /// Why.
        reason: String,
    },
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Circuits currently known.
    pub circuits: usize,
    /// Streams currently open at this node's edges.
    pub streams: usize,
    /// Cells waiting in all circuit queues.
    pub queued_cells: usize,
    /// Cells handed to the driver for sending since start.
    pub cells_transmitted: u64,
    /// Cells received since start.
    pub cells_received: u64,
    /// Circuits closed for a protocol violation or resource limit.
    pub circuits_killed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Toward the client (relay circuits only).
    Prev,
    /// Toward the exit (a relay's next hop, or a client's guard).
    Next,
}

fn queue_id(key: CircKey, side: Side) -> QueueId {
    QueueId(key.0 << 1 | matches!(side, Side::Next) as u64)
}

fn queue_of(q: QueueId) -> (CircKey, Side) {
    (
        CircKey(q.0 >> 1),
        if q.0 & 1 == 1 { Side::Next } else { Side::Prev },
    )
}

struct Channel {
    peer: Option<IdentityKey>,
    /// Whether this node opened the channel (decides the circuit id high bit).
    initiator: bool,
    circ_ids: HashMap<CircId, CircKey>,
    sched: Box<dyn CircuitScheduler>,
    /// DESTROY cells: they bypass circuit queues because their circuit is gone.
    urgent: VecDeque<Cell>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamState {
    /// Client: BEGIN sent. Exit: connecting.
    Connecting,
    Open,
    /// A RESOLVE request (no data flows).
    Resolving,
}

struct Stream {
    handle: StreamHandle,
    state: StreamState,
    window: StreamWindow,
    /// Bytes read from the local socket, not yet packaged.
    pending: VecDeque<u8>,
    /// Read credit granted to the driver and not yet used.
    credit: usize,
    /// Local side finished; send END once `pending` is empty.
    local_eof: bool,
}

impl Stream {
    fn new(handle: StreamHandle, state: StreamState) -> Self {
        Stream {
            handle,
            state,
            window: StreamWindow::default(),
            pending: VecDeque::new(),
            credit: 0,
            local_eof: false,
        }
    }
}

/// State of a circuit's end point (exit or client): windows and streams.
struct Edge {
    window: CircuitWindow,
    streams: HashMap<u16, Stream>,
    next_stream_id: u16,
}

impl Edge {
    fn new(circwindow: u32) -> Self {
        Edge {
            window: CircuitWindow::new(circwindow),
            streams: HashMap::new(),
            next_stream_id: 1,
        }
    }
}

// Origin circuits carry the whole path's crypto; there are few of them (a
// client's own), so the size difference with relay circuits does not matter.
#[allow(clippy::large_enum_variant)]
enum Role {
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
        handshake: Option<NtorClientState>,
        built: bool,
        edge: Edge,
        deadline: Instant,
    },
}

/// One direction of a circuit's cells waiting for their channel, with the
/// enqueue time of sampled cells (instrumentation: per-cell queue delay).
#[derive(Default)]
struct CellQueue {
    cells: VecDeque<Cell>,
    pushed: u64,
    popped: u64,
    /// (sequence number of the cell, when it was queued), oldest first.
    samples: VecDeque<(u64, Instant)>,
}

impl CellQueue {
    fn push(&mut self, cell: Cell, sampled_at: Option<Instant>) {
        if let Some(t) = sampled_at {
            self.samples.push_back((self.pushed, t));
        }
        self.pushed += 1;
        self.cells.push_back(cell);
    }

    /// The next cell, and its enqueue time if it was sampled.
    fn pop(&mut self) -> Option<(Cell, Option<Instant>)> {
        let cell = self.cells.pop_front()?;
        let seq = self.popped;
        self.popped += 1;
        let sampled = match self.samples.front() {
            Some(&(s, t)) if s == seq => {
                self.samples.pop_front();
                Some(t)
            }
            _ => None,
        };
        Some((cell, sampled))
    }

    fn len(&self) -> usize {
        self.cells.len()
    }

    fn clear(&mut self) {
        self.popped += self.cells.len() as u64;
        self.cells.clear();
        self.samples.clear();
    }
}

struct Circuit {
    prev: Option<(ChannelId, CircId)>,
    next: Option<(ChannelId, CircId)>,
    q_prev: CellQueue,
    q_next: CellQueue,
    /// Cells this circuit handed to its channels (both directions).
    cells_sent: u64,
    role: Role,
    relay_early_seen: u8,
}

impl Circuit {
    fn queue(&mut self, side: Side) -> &mut CellQueue {
        match side {
            Side::Prev => &mut self.q_prev,
            Side::Next => &mut self.q_next,
        }
    }
    fn endpoint(&self, side: Side) -> Option<(ChannelId, CircId)> {
        match side {
            Side::Prev => self.prev,
            Side::Next => self.next,
        }
    }
    fn edge_mut(&mut self) -> Option<&mut Edge> {
        match &mut self.role {
            Role::Relay { edge, .. } => edge.as_mut(),
            Role::Origin { edge, .. } => Some(edge),
        }
    }
    /// The side edge data leaves on: backward at an exit, forward at a client.
    fn edge_out_side(&self) -> Side {
        match self.role {
            Role::Relay { .. } => Side::Prev,
            Role::Origin { .. } => Side::Next,
        }
    }
    fn is_origin(&self) -> bool {
        matches!(self.role, Role::Origin { .. })
    }
}

/// The sans-IO node. See the crate docs.
pub struct Core {
    cfg: CoreConfig,
    rng: StdRng,
    channels: LocalMap<ChannelId, Channel>,
    chan_by_identity: HashMap<IdentityKey, ChannelId>,
    /// Circuits waiting for a channel to this identity.
    waiting_for_channel: HashMap<IdentityKey, Vec<CircKey>>,
    circuits: LocalMap<CircKey, Circuit>,
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
}

/// Samples waiting for the driver beyond this are dropped (bounded memory).
const MAX_PENDING_SAMPLES: usize = 10_000;

/// Timing of one sampled cell, from entering its circuit queue to leaving it
/// for the channel's output. The driver adds the time it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellSample {
    /// The channel it left on.
    pub chan: ChannelId,
    /// Its circuit.
    pub circ: CircKey,
    /// When it entered the circuit queue.
    pub queued: Instant,
    /// When the scheduler moved it to the channel's output.
    pub dequeued: Instant,
    /// Its index in the `out` vector of the `poll_transmit` call that moved it.
    pub batch_index: usize,
}

/// Per-circuit figures for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitStat {
    /// The circuit.
    pub circ: CircKey,
    /// Cells it handed to its channels so far.
    pub cells_sent: u64,
    /// Cells waiting in its queues (both directions).
    pub queued: usize,
    /// The scheduler's priority value for its busiest queue, if the policy has one (EWMA count).
    pub priority: Option<f64>,
}

impl Core {
    /// A new node. `seed` feeds the core's CSPRNG (handshakes, circuit ids); pass
    /// fresh OS randomness in production and a fixed seed in tests.
    pub fn new(cfg: CoreConfig, seed: [u8; 32]) -> Self {
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
        }
    }

    /// Next per-cell timing sample (see [`CoreConfig::cell_sample_every`]).
    pub fn poll_cell_sample(&mut self) -> Option<CellSample> {
        self.cell_samples.pop_front()
    }

    /// Per-circuit figures for metrics. `priority` is the largest EWMA count of
    /// the circuit's queues (None under a policy without counts).
    pub fn circuit_stats(&self, now: Instant) -> Vec<CircuitStat> {
        let mut v: Vec<CircuitStat> = self
            .circuits
            .iter()
            .map(|(k, c)| {
                let priority = [(Side::Prev, c.prev), (Side::Next, c.next)]
                    .into_iter()
                    .filter_map(|(side, end)| {
                        let (chan, _) = end?;
                        self.channels
                            .get(&chan)?
                            .sched
                            .ewma_count(queue_id(*k, side), now)
                    })
                    .reduce(f64::max);
                CircuitStat {
                    circ: *k,
                    cells_sent: c.cells_sent,
                    queued: c.q_prev.len() + c.q_next.len(),
                    priority,
                }
            })
            .collect();
        v.sort_by_key(|c| c.circ);
        v
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

    /// The scheduling policy in use.
    pub fn scheduler(&self) -> SchedulerKind {
        self.cfg.scheduler
    }

    /// Change the circuit window for circuits created from now on (a new consensus).
    pub fn set_circwindow(&mut self, circwindow: u32) {
        self.cfg.circwindow = circwindow.clamp(100, 1000);
    }

    /// A human-readable snapshot of every channel and circuit (queues, windows,
    /// streams), for operators debugging a stall (the relay logs it on SIGUSR1).
    pub fn debug_dump(&self, now: Instant) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mut chans: Vec<_> = self.channels.iter().collect();
        chans.sort_by_key(|(c, _)| **c);
        for (id, ch) in chans {
            let _ =
                writeln!(
                out,
                "channel {} peer={} initiator={} circuits={} active_queues={} urgent={} policy={}",
                id.0,
                ch.peer.map(|p| p.to_hex()[..16].to_string()).unwrap_or_else(|| "client".into()),
                ch.initiator,
                ch.circ_ids.len(),
                ch.sched.active_len(),
                ch.urgent.len(),
                ch.sched.name()
            );
        }
        let mut circs: Vec<_> = self.circuits.iter().collect();
        circs.sort_by_key(|(k, _)| **k);
        for (key, c) in circs {
            let kind = match &c.role {
                Role::Relay {
                    extending,
                    pending_extend,
                    ..
                } => {
                    format!(
                        "relay extending={extending} pending_extend={}",
                        pending_extend.is_some()
                    )
                }
                Role::Origin {
                    built,
                    crypto,
                    path,
                    ..
                } => {
                    format!("origin built={built} hops={}/{}", crypto.len(), path.len())
                }
            };
            let prio = |side: Side, end: Option<(ChannelId, CircId)>| {
                end.and_then(|(chan, _)| {
                    self.channels
                        .get(&chan)?
                        .sched
                        .ewma_count(queue_id(*key, side), now)
                })
            };
            let _ = writeln!(
                out,
                "circuit {} {kind} prev={:?} next={:?} q_prev={} q_next={} sent={} ewma_prev={:?} ewma_next={:?}",
                key.0,
                c.prev.map(|(ch, id)| (ch.0, id)),
                c.next.map(|(ch, id)| (ch.0, id)),
                c.q_prev.len(),
                c.q_next.len(),
                c.cells_sent,
                prio(Side::Prev, c.prev),
                prio(Side::Next, c.next),
            );
            let edge = match &c.role {
                Role::Relay { edge, .. } => edge.as_ref(),
                Role::Origin { edge, .. } => Some(edge),
            };
            if let Some(edge) = edge {
                let _ = writeln!(
                    out,
                    "  edge package_window={}",
                    edge.window.package_window()
                );
                for (sid, st) in &edge.streams {
                    let _ = writeln!(
                        out,
                        "  stream {sid} handle={} state={:?} pending={} credit={} eof={} window={:?}",
                        st.handle.0,
                        st.state,
                        st.pending.len(),
                        st.credit,
                        st.local_eof,
                        st.window
                    );
                }
            }
        }
        out
    }

    /// Current counters.
    pub fn stats(&self) -> CoreStats {
        CoreStats {
            circuits: self.circuits.len(),
            streams: self.streams.len(),
            ..self.stats
        }
    }

    /// This relay's identity, if it is one.
    pub fn identity(&self) -> Option<IdentityKey> {
        self.cfg.relay.as_ref().map(|r| r.identity)
    }

    // ----------------------------------------------------------------- channels

    /// A link finished its handshake. `peer` is the authenticated identity (None
    /// for a client); `initiator` is true if this node opened it.
    pub fn channel_opened(
        &mut self,
        chan: ChannelId,
        peer: Option<IdentityKey>,
        initiator: bool,
        now: Instant,
    ) {
        self.channels.insert(
            chan,
            Channel {
                peer,
                initiator,
                circ_ids: HashMap::new(),
                sched: self.cfg.scheduler.build(),
                urgent: VecDeque::new(),
            },
        );
        if let Some(id) = peer {
            // New circuits go on one channel per peer; old ones keep theirs. When both relays
            // opened a channel to each other at the same moment, both must pick the same one,
            // or each would send on its own and every connection would carry data one way
            // (split-direction by accident, with the ACK behaviour of paper 002's fix): prefer
            // the channel opened by the relay with the smaller identity, which both sides
            // agree on; otherwise the newest.
            let me = self.identity();
            let canonical = |c: &Channel| me.is_none_or(|me| c.initiator == (me < id));
            let keep_old = self
                .chan_by_identity
                .get(&id)
                .and_then(|old| self.channels.get(old))
                .zip(self.channels.get(&chan))
                .is_some_and(|(old, new)| canonical(old) && !canonical(new));
            if !keep_old {
                self.chan_by_identity.insert(id, chan);
            }
            if let Some(waiting) = self.waiting_for_channel.remove(&id) {
                for key in waiting {
                    self.attach_to_channel(key, chan, now);
                }
            }
        }
    }

    /// Connecting to `identity` failed: every circuit waiting for it fails.
    pub fn connect_failed(&mut self, identity: IdentityKey, now: Instant) {
        if let Some(waiting) = self.waiting_for_channel.remove(&identity) {
            for key in waiting {
                self.close_circuit_inner(
                    key,
                    DestroyReason::CONNECTFAILED,
                    None,
                    now,
                    "connect failed",
                );
            }
        }
    }

    /// A channel closed (EOF, error, or after [`Event::CloseChannel`]): every
    /// circuit on it goes, and relays tell the other side with DESTROY.
    pub fn channel_closed(&mut self, chan: ChannelId, now: Instant) {
        let Some(ch) = self.channels.remove(&chan) else {
            return;
        };
        if let Some(peer) = ch.peer {
            if self.chan_by_identity.get(&peer) == Some(&chan) {
                self.chan_by_identity.remove(&peer);
            }
        }
        self.ready_set.remove(&chan);
        let keys: Vec<CircKey> = ch.circ_ids.values().copied().collect();
        for key in keys {
            self.close_circuit_inner(
                key,
                DestroyReason::CHANNEL_CLOSED,
                Some(chan),
                now,
                "channel closed",
            );
        }
    }

    /// Next channel that may have cells to send (possibly spurious). The driver
    /// calls [`Core::poll_transmit`] for it when its connection can take cells.
    pub fn poll_ready_channel(&mut self) -> Option<ChannelId> {
        let chan = self.ready.pop_front()?;
        self.ready_set.remove(&chan);
        Some(chan)
    }

    /// Whether `chan` has cells waiting.
    pub fn has_pending(&self, chan: ChannelId) -> bool {
        self.channels
            .get(&chan)
            .is_some_and(|c| !c.urgent.is_empty() || c.sched.active_len() > 0)
    }

    /// How deserving `chan`'s next cell is, for drivers that share one rate limit among
    /// channels (lower goes first): `Some(-1.0)` while link-level cells (DESTROY, CREATED2…)
    /// wait, else the scheduler's [`crate::sched::CircuitScheduler::head_priority`] (the decayed
    /// EWMA count of the circuit it would pick). `None` if nothing waits or the policy does not
    /// rank (round-robin): then the driver serves channels in turn.
    pub fn channel_priority(&self, chan: ChannelId, now: Instant) -> Option<f64> {
        let ch = self.channels.get(&chan)?;
        if !ch.urgent.is_empty() {
            return Some(-1.0);
        }
        ch.sched.head_priority(now)
    }

    /// Move up to `max` cells for `chan` into `out`, choosing circuits with the
    /// channel's scheduler. Returns how many were added. Call when the
    /// connection's output buffer has room, so the choice is made as late as possible.
    pub fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<Cell>,
    ) -> usize {
        let mut sent = 0;
        let mut drained_edges: Vec<CircKey> = Vec::new();
        let Some(ch) = self.channels.get_mut(&chan) else {
            return 0;
        };
        while sent < max {
            if let Some(cell) = ch.urgent.pop_front() {
                out.push(cell);
                sent += 1;
                continue;
            }
            let Some(q) = ch.sched.pick(now) else { break };
            let (key, side) = queue_of(q);
            let Some(circ) = self.circuits.get_mut(&key) else {
                ch.sched.deactivate(q);
                continue;
            };
            let queue = circ.queue(side);
            let Some((cell, sampled)) = queue.pop() else {
                ch.sched.deactivate(q);
                continue;
            };
            let left = queue.len();
            circ.cells_sent += 1;
            if let Some(queued) = sampled {
                if self.cell_samples.len() < MAX_PENDING_SAMPLES {
                    self.cell_samples.push_back(CellSample {
                        chan,
                        circ: key,
                        queued,
                        dequeued: now,
                        batch_index: out.len(),
                    });
                }
            }
            ch.sched.cell_sent(q, now);
            if left == 0 {
                ch.sched.deactivate(q);
            }
            if left == QUEUE_LOWWATER && circ.edge_out_side() == side && circ.edge_mut().is_some() {
                drained_edges.push(key);
            }
            self.stats.queued_cells = self.stats.queued_cells.saturating_sub(1);
            out.push(cell);
            sent += 1;
        }
        self.stats.cells_transmitted += sent as u64;
        for key in drained_edges {
            self.package_all(key, now);
        }
        sent
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
            .min()
    }

    /// Time passed: close origin circuits that did not build in time.
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
    }

    // -------------------------------------------------------------------- input

    /// A variable-length cell after the link handshake: padding is ignored,
    /// anything else is logged and ignored (a newer peer may send more).
    pub fn handle_var_cell(&mut self, chan: ChannelId, cell: VarCell, _now: Instant) {
        if cell.command != CellCommand::VPADDING {
            debug!(?chan, command = %cell.command, "ignoring variable cell after handshake");
        }
    }

    /// A fixed cell arrived on `chan`.
    pub fn handle_cell(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        self.stats.cells_received += 1;
        if !self.channels.contains_key(&chan) {
            return;
        }
        match cell.command {
            CellCommand::RELAY | CellCommand::RELAY_EARLY => self.on_relay(chan, cell, now),
            CellCommand::CREATE2 => self.on_create2(chan, cell, now),
            CellCommand::CREATED2 => self.on_created2(chan, cell, now),
            CellCommand::DESTROY => self.on_destroy(chan, cell, now),
            CellCommand::PADDING => {}
            other => {
                debug!(?chan, command = %other, "ignoring unexpected cell");
            }
        }
    }

    fn lookup(&self, chan: ChannelId, circ_id: CircId) -> Option<CircKey> {
        self.channels.get(&chan)?.circ_ids.get(&circ_id).copied()
    }

    fn on_create2(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let circ_id = cell.circ_id;
        let Some(keys) = self.cfg.relay.as_ref() else {
            warn!(?chan, "CREATE2 sent to a client: refusing");
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        };
        let Some(ch) = self.channels.get(&chan) else {
            return;
        };
        // The channel's initiator uses ids with the high bit set, the responder without.
        let peer_high_bit = !ch.initiator;
        if circ_id == 0 || (circ_id & 0x8000_0000 != 0) != peer_high_bit {
            warn!(
                ?chan,
                circ_id, "CREATE2 with an id from the wrong space: refusing"
            );
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        }
        if ch.circ_ids.contains_key(&circ_id) {
            warn!(?chan, circ_id, "CREATE2 for a circuit id in use: refusing");
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        }
        if ch.circ_ids.len() >= self.cfg.max_circuits_per_channel {
            warn!(?chan, "too many circuits on channel: refusing CREATE2");
            return self.send_destroy(chan, circ_id, DestroyReason::RESOURCELIMIT);
        }
        let create = match Create2::decode(&cell.payload) {
            Ok(c) if c.handshake_type == NTOR_HTYPE => c,
            Ok(c) => {
                warn!(
                    ?chan,
                    htype = c.handshake_type,
                    "unsupported handshake type"
                );
                return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
            }
            Err(e) => {
                warn!(?chan, error = %e, "malformed CREATE2");
                return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
            }
        };
        let id20 = keys.identity.ntor_id();
        let (reply, km) =
            match ntor::server_handshake(&mut self.rng, &id20, &keys.ntor, &create.handshake) {
                Ok(r) => r,
                Err(e) => {
                    warn!(?chan, error = %e, "ntor handshake failed");
                    return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
                }
            };
        let key = self.alloc_key();
        let created = Created2 {
            handshake: reply.to_vec(),
        }
        .encode();
        self.circuits.insert(
            key,
            Circuit {
                prev: Some((chan, circ_id)),
                next: None,
                q_prev: CellQueue::default(),
                q_next: CellQueue::default(),
                cells_sent: 0,
                role: Role::Relay {
                    crypto: RelayHopCrypto::new(&km),
                    edge: None,
                    pending_extend: None,
                    extending: false,
                },
                relay_early_seen: 0,
            },
        );
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.circ_ids.insert(circ_id, key);
        }
        match created.and_then(|body| Cell::new(circ_id, CellCommand::CREATED2, &body)) {
            Ok(cell) => self.enqueue(key, Side::Prev, cell, now),
            Err(e) => self.kill(key, &format!("cannot encode CREATED2: {e}"), now),
        }
    }

    fn on_created2(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            return;
        };
        let created = match Created2::decode(&cell.payload) {
            Ok(c) => c,
            Err(e) => return self.kill(key, &format!("malformed CREATED2: {e}"), now),
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        if circ.next.map(|n| n.0) != Some(chan) {
            return self.kill(key, "CREATED2 from the wrong side", now);
        }
        match &mut circ.role {
            Role::Relay { extending, .. } => {
                if !std::mem::take(extending) {
                    return self.kill(key, "unexpected CREATED2", now);
                }
                let body = Extended2 {
                    handshake: created.handshake,
                }
                .encode();
                match body {
                    Ok(body) => {
                        self.send_relay_backward(key, RelayCommand::EXTENDED2, 0, &body, now)
                    }
                    Err(e) => self.kill(key, &format!("cannot encode EXTENDED2: {e}"), now),
                }
            }
            Role::Origin { .. } => self.origin_hop_done(key, &created.handshake, now),
        }
    }

    fn on_destroy(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            return;
        };
        let reason = Destroy::decode(&cell.payload)
            .map(|d| d.reason)
            .unwrap_or(DestroyReason::NONE);
        debug!(?key, %reason, "DESTROY received");
        let why = format!("destroyed by peer ({reason})");
        self.close_circuit_inner(key, reason, Some(chan), now, &why);
    }

    fn on_relay(&mut self, chan: ChannelId, mut cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            debug!(
                ?chan,
                circ_id = cell.circ_id,
                "relay cell for unknown circuit: dropped"
            );
            return;
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let from_prev = circ.prev.map(|p| p.0) == Some(chan) && !circ.is_origin();
        let early = cell.command == CellCommand::RELAY_EARLY;
        if from_prev && early {
            circ.relay_early_seen += 1;
            if circ.relay_early_seen > MAX_RELAY_EARLY {
                return self.kill(key, "too many RELAY_EARLY cells", now);
            }
        }
        match &mut circ.role {
            Role::Relay { crypto, .. } => {
                if from_prev {
                    if crypto.decrypt_forward(&mut cell.payload) {
                        let digest = crypto.last_forward_digest();
                        self.relay_cell_for_us(key, &cell.payload, digest, early, now);
                    } else if let Some((_, next_id)) = circ.next {
                        cell.circ_id = next_id;
                        self.enqueue(key, Side::Next, cell, now);
                    } else {
                        self.kill(key, "unrecognized relay cell at the last hop", now);
                    }
                } else {
                    crypto.encrypt_backward(&mut cell.payload);
                    if let Some((_, prev_id)) = circ.prev {
                        cell.circ_id = prev_id;
                        self.enqueue(key, Side::Prev, cell, now);
                    }
                }
            }
            Role::Origin { crypto, .. } => match crypto.decrypt_from_any(&mut cell.payload) {
                Some((hop, digest)) => {
                    self.origin_cell_for_us(key, hop, &cell.payload, digest, now)
                }
                None => self.kill(key, "unrecognized relay cell at the client", now),
            },
        }
    }

    /// A forward relay cell recognized at this relay.
    fn relay_cell_for_us(
        &mut self,
        key: CircKey,
        payload: &[u8; PAYLOAD_LEN],
        digest: [u8; 20],
        early: bool,
        now: Instant,
    ) {
        let msg = match parse_relay(payload) {
            Ok(m) => m,
            Err(e) => return self.kill(key, &format!("malformed relay cell: {e}"), now),
        };
        let (cmd, sid, data) = (msg.command, msg.stream_id, msg.data);
        match cmd {
            RelayCommand::EXTEND2 => {
                if !early {
                    return self.kill(key, "EXTEND2 not in a RELAY_EARLY cell", now);
                }
                match Extend2::decode(data) {
                    Ok(ext) => self.on_extend2(key, ext, now),
                    Err(e) => self.kill(key, &format!("malformed EXTEND2: {e}"), now),
                }
            }
            RelayCommand::BEGIN => self.on_begin(key, sid, data, now),
            RelayCommand::RESOLVE => self.on_resolve(key, sid, data, now),
            RelayCommand::DATA => self.edge_data(key, sid, data, digest, now),
            RelayCommand::END => self.edge_end(key, sid, data, now),
            RelayCommand::SENDME => self.edge_sendme(key, sid, data, now),
            RelayCommand::TRUNCATE => self.on_truncate(key, now),
            RelayCommand::DROP => {}
            other => {
                debug!(?key, command = %other, "ignoring relay command");
            }
        }
    }

    /// A backward relay cell recognized at the client, from hop `hop`.
    fn origin_cell_for_us(
        &mut self,
        key: CircKey,
        hop: usize,
        payload: &[u8; PAYLOAD_LEN],
        digest: [u8; 20],
        now: Instant,
    ) {
        let msg = match parse_relay(payload) {
            Ok(m) => m,
            Err(e) => return self.kill(key, &format!("malformed relay cell: {e}"), now),
        };
        let (cmd, sid, data) = (msg.command, msg.stream_id, msg.data);
        let last_hop = self.circuits.get(&key).and_then(|c| match &c.role {
            Role::Origin { crypto, .. } => Some(crypto.len().saturating_sub(1)),
            _ => None,
        });
        match cmd {
            RelayCommand::EXTENDED2 => match Extended2::decode(data) {
                Ok(ext) => self.origin_hop_done(key, &ext.handshake, now),
                Err(e) => self.kill(key, &format!("malformed EXTENDED2: {e}"), now),
            },
            RelayCommand::TRUNCATED => {
                self.close_circuit_inner(key, DestroyReason::FINISHED, None, now, "truncated")
            }
            _ if Some(hop) != last_hop => {
                self.kill(key, &format!("{cmd} from hop {hop}, not the exit"), now)
            }
            RelayCommand::CONNECTED => self.client_connected(key, sid, data, now),
            RelayCommand::RESOLVED => self.client_resolved(key, sid, data, now),
            RelayCommand::DATA => self.edge_data(key, sid, data, digest, now),
            RelayCommand::END => self.edge_end(key, sid, data, now),
            RelayCommand::SENDME => self.edge_sendme(key, sid, data, now),
            RelayCommand::DROP => {}
            other => {
                debug!(?key, command = %other, "ignoring relay command");
            }
        }
    }

    // ----------------------------------------------------------- relay extends

    fn on_extend2(&mut self, key: CircKey, ext: Extend2, now: Instant) {
        let mut ed = None;
        let mut addr = None;
        for spec in &ext.link_specifiers {
            match spec {
                LinkSpec::Ed25519Id(id) => ed = IdentityKey::from_bytes(id).ok(),
                LinkSpec::Ipv4(a) if addr.is_none() => addr = Some(SocketAddr::V4(*a)),
                LinkSpec::Ipv6(a) if addr.is_none() => addr = Some(SocketAddr::V6(*a)),
                _ => {}
            }
        }
        let (Some(identity), Some(addr)) = (ed, addr) else {
            return self.kill(key, "EXTEND2 without an Ed25519 identity and address", now);
        };
        if Some(identity) == self.identity() {
            return self.kill(key, "EXTEND2 to ourselves", now);
        }
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        match &mut circ.role {
            Role::Relay {
                pending_extend,
                extending,
                ..
            } if circ.next.is_none() && pending_extend.is_none() && !*extending => {
                *pending_extend = Some((identity, ext.create2));
            }
            _ => return self.kill(key, "EXTEND2 on a circuit that already extends", now),
        }
        match self.chan_by_identity.get(&identity).copied() {
            Some(chan) => self.attach_to_channel(key, chan, now),
            None => self.wait_for_channel(key, identity, addr),
        }
    }

    fn wait_for_channel(&mut self, key: CircKey, identity: IdentityKey, addr: SocketAddr) {
        let waiting = self.waiting_for_channel.entry(identity).or_default();
        if waiting.is_empty() {
            self.events.push_back(Event::Connect { addr, identity });
        }
        waiting.push(key);
    }

    /// Give circuit `key` an id on `chan` (toward the exit) and send its CREATE2.
    fn attach_to_channel(&mut self, key: CircKey, chan: ChannelId, now: Instant) {
        let Some(circ_id) = self.alloc_circ_id(chan) else {
            return self.kill(key, "no circuit id available", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let create = match &mut circ.role {
            Role::Relay {
                pending_extend,
                extending,
                ..
            } => match pending_extend.take() {
                Some((_, create)) => {
                    *extending = true;
                    create
                }
                None => return,
            },
            Role::Origin {
                path, handshake, ..
            } => {
                let Some(first) = path.first() else { return };
                let (state, onionskin) =
                    ntor::client_create(&mut self.rng, &first.identity.ntor_id(), &first.ntor_key);
                *handshake = Some(state);
                Create2 {
                    handshake_type: NTOR_HTYPE,
                    handshake: onionskin.to_vec(),
                }
            }
        };
        circ.next = Some((chan, circ_id));
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.circ_ids.insert(circ_id, key);
        }
        match create
            .encode()
            .and_then(|b| Cell::new(circ_id, CellCommand::CREATE2, &b))
        {
            Ok(cell) => self.enqueue(key, Side::Next, cell, now),
            Err(e) => self.kill(key, &format!("cannot encode CREATE2: {e}"), now),
        }
    }

    fn on_truncate(&mut self, key: CircKey, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        if let Some((chan, id)) = circ.next.take() {
            let dropped = circ.q_next.len();
            circ.q_next.clear();
            self.stats.queued_cells = self.stats.queued_cells.saturating_sub(dropped);
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.circ_ids.remove(&id);
                ch.sched.deactivate(queue_id(key, Side::Next));
                ch.sched.forget(queue_id(key, Side::Next));
            }
            self.send_destroy(chan, id, DestroyReason::REQUESTED);
        }
        if let Some(Circuit {
            role:
                Role::Relay {
                    pending_extend,
                    extending,
                    ..
                },
            ..
        }) = self.circuits.get_mut(&key)
        {
            *pending_extend = None;
            *extending = false;
        }
        self.send_relay_backward(
            key,
            RelayCommand::TRUNCATED,
            0,
            &[DestroyReason::REQUESTED.0],
            now,
        );
    }

    // ------------------------------------------------------------ origin side

    /// Start building a circuit along `path` (guard first). Emits
    /// [`Event::CircuitBuilt`] or [`Event::CircuitClosed`] later.
    pub fn launch_circuit(&mut self, path: Vec<HopSpec>, now: Instant) -> CircKey {
        let key = self.alloc_key();
        let first = path.first().cloned();
        self.circuits.insert(
            key,
            Circuit {
                prev: None,
                next: None,
                q_prev: CellQueue::default(),
                q_next: CellQueue::default(),
                cells_sent: 0,
                role: Role::Origin {
                    crypto: ClientCircuitCrypto::new(),
                    path,
                    handshake: None,
                    built: false,
                    edge: Edge::new(self.cfg.circwindow),
                    deadline: now + self.cfg.circuit_build_timeout,
                },
                relay_early_seen: 0,
            },
        );
        match first {
            None => self.close_circuit_inner(key, DestroyReason::INTERNAL, None, now, "empty path"),
            Some(hop) => match self.chan_by_identity.get(&hop.identity).copied() {
                Some(chan) => self.attach_to_channel(key, chan, now),
                None => self.wait_for_channel(key, hop.identity, hop.addr),
            },
        }
        key
    }

    /// A CREATED2 or EXTENDED2 answered the pending handshake of an origin circuit.
    fn origin_hop_done(&mut self, key: CircKey, reply: &[u8], now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Role::Origin {
            crypto,
            path,
            handshake,
            built,
            ..
        } = &mut circ.role
        else {
            return;
        };
        let Some(state) = handshake.take() else {
            return self.kill(key, "handshake reply without a handshake", now);
        };
        let km = match ntor::client_finish(state, reply) {
            Ok(km) => km,
            Err(e) => return self.kill(key, &format!("ntor handshake failed: {e}"), now),
        };
        crypto.push_hop(ClientHopCrypto::new(&km));
        let done = crypto.len();
        if done >= path.len() {
            *built = true;
            self.events.push_back(Event::CircuitBuilt { circ: key });
            return;
        }
        let hop = path[done].clone();
        let (state, onionskin) =
            ntor::client_create(&mut self.rng, &hop.identity.ntor_id(), &hop.ntor_key);
        *handshake = Some(state);
        let mut specs = vec![LinkSpec::Ed25519Id(*hop.identity.as_bytes())];
        specs.push(match hop.addr {
            SocketAddr::V4(a) => LinkSpec::Ipv4(a),
            SocketAddr::V6(a) => LinkSpec::Ipv6(a),
        });
        specs.push(LinkSpec::LegacyId(hop.identity.ntor_id()));
        let ext = Extend2 {
            link_specifiers: specs,
            create2: Create2 {
                handshake_type: NTOR_HTYPE,
                handshake: onionskin.to_vec(),
            },
        };
        match ext.encode() {
            Ok(body) => {
                self.send_relay_forward(key, done - 1, RelayCommand::EXTEND2, 0, &body, true, now)
            }
            Err(e) => self.kill(key, &format!("cannot encode EXTEND2: {e}"), now),
        }
    }

    /// Whether an origin circuit is built and usable.
    pub fn circuit_is_open(&self, circ: CircKey) -> bool {
        matches!(
            self.circuits.get(&circ),
            Some(Circuit {
                role: Role::Origin { built: true, .. },
                ..
            })
        )
    }

    /// Number of streams open on a circuit.
    pub fn circuit_streams(&self, circ: CircKey) -> usize {
        match self.circuits.get(&circ).map(|c| &c.role) {
            Some(Role::Origin { edge, .. }) => edge.streams.len(),
            Some(Role::Relay {
                edge: Some(edge), ..
            }) => edge.streams.len(),
            _ => 0,
        }
    }

    /// Open a stream to `host:port` through a built origin circuit. Emits
    /// [`Event::StreamConnected`] or [`Event::StreamClosed`] later.
    pub fn open_stream(
        &mut self,
        circ: CircKey,
        host: &str,
        port: u16,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let body = Begin {
            host: host.to_string(),
            port,
            flags: 0,
        }
        .encode()
        .map_err(|e| CoreError::BadTarget(e.to_string()))?;
        self.new_origin_stream(
            circ,
            RelayCommand::BEGIN,
            &body,
            StreamState::Connecting,
            now,
        )
    }

    /// Ask the exit of a built circuit to resolve `host`. Emits [`Event::Resolved`]
    /// or [`Event::StreamClosed`].
    pub fn resolve(
        &mut self,
        circ: CircKey,
        host: &str,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let body = Resolve {
            host: host.to_string(),
        }
        .encode()
        .map_err(|e| CoreError::BadTarget(e.to_string()))?;
        self.new_origin_stream(
            circ,
            RelayCommand::RESOLVE,
            &body,
            StreamState::Resolving,
            now,
        )
    }

    fn new_origin_stream(
        &mut self,
        circ_key: CircKey,
        cmd: RelayCommand,
        body: &[u8],
        state: StreamState,
        now: Instant,
    ) -> Result<StreamHandle, CoreError> {
        let handle = StreamHandle(self.next_handle);
        let circ = self
            .circuits
            .get_mut(&circ_key)
            .ok_or(CoreError::NoSuchCircuit)?;
        let Role::Origin {
            edge,
            built: true,
            crypto,
            ..
        } = &mut circ.role
        else {
            return Err(CoreError::CircuitNotOpen);
        };
        let last = crypto.len() - 1;
        let sid = (0..u16::MAX)
            .map(|i| edge.next_stream_id.wrapping_add(i))
            .find(|id| *id != 0 && !edge.streams.contains_key(id))
            .ok_or(CoreError::TooManyStreams)?;
        edge.next_stream_id = sid.wrapping_add(1);
        edge.streams.insert(sid, Stream::new(handle, state));
        self.next_handle += 1;
        self.streams.insert(handle, (circ_key, sid));
        self.send_relay_forward(circ_key, last, cmd, sid, body, false, now);
        Ok(handle)
    }

    /// Close an origin circuit (for example when it is too dirty and idle).
    pub fn close_circuit(&mut self, circ: CircKey, now: Instant) {
        self.close_circuit_inner(circ, DestroyReason::FINISHED, None, now, "closed by client");
    }

    fn client_connected(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let addr = Connected::decode(data).ok().and_then(|c| c.addr);
        let Some(stream) = self.stream_mut(key, sid) else {
            return;
        };
        if stream.state != StreamState::Connecting {
            return self.kill(key, "unexpected CONNECTED", now);
        }
        stream.state = StreamState::Open;
        let handle = stream.handle;
        self.events.push_back(Event::StreamConnected {
            stream: handle,
            addr,
        });
        self.grant_credit(key, sid);
    }

    fn client_resolved(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let answers = match Resolved::decode(data) {
            Ok(r) => r.answers,
            Err(e) => return self.kill(key, &format!("malformed RESOLVED: {e}"), now),
        };
        let Some(stream) = self.stream_mut(key, sid) else {
            return;
        };
        if stream.state != StreamState::Resolving {
            return self.kill(key, "unexpected RESOLVED", now);
        }
        let handle = stream.handle;
        self.events.push_back(Event::Resolved {
            stream: handle,
            answers,
        });
        self.remove_stream(key, sid);
    }

    // --------------------------------------------------------------- exit side

    fn exit_edge(&mut self, key: CircKey) -> Option<&mut Edge> {
        let circwindow = self.cfg.circwindow;
        match &mut self.circuits.get_mut(&key)?.role {
            Role::Relay {
                edge,
                extending: false,
                pending_extend: None,
                crypto: _,
            } => Some(edge.get_or_insert_with(|| Edge::new(circwindow))),
            _ => None,
        }
    }

    fn on_begin(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        if sid == 0 {
            return self.kill(key, "BEGIN with stream id 0", now);
        }
        let begin = match Begin::decode(data) {
            Ok(b) => b,
            Err(e) => {
                debug!(?key, error = %e, "malformed BEGIN");
                return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
            }
        };
        if !self.cfg.exit || self.circuits.get(&key).is_some_and(|c| c.next.is_some()) {
            return self.send_end(key, sid, EndReason::EXITPOLICY, now);
        }
        let handle = StreamHandle(self.next_handle);
        let Some(edge) = self.exit_edge(key) else {
            return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
        };
        if edge.streams.contains_key(&sid) {
            return self.kill(key, "BEGIN for a stream id in use", now);
        }
        edge.streams
            .insert(sid, Stream::new(handle, StreamState::Connecting));
        self.next_handle += 1;
        self.streams.insert(handle, (key, sid));
        self.events.push_back(Event::ExitConnect {
            stream: handle,
            host: begin.host,
            port: begin.port,
        });
    }

    fn on_resolve(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let host = match Resolve::decode(data) {
            Ok(r) => r.host,
            Err(_) => return self.send_end(key, sid, EndReason::TORPROTOCOL, now),
        };
        if !self.cfg.exit {
            return self.send_end(key, sid, EndReason::EXITPOLICY, now);
        }
        let handle = StreamHandle(self.next_handle);
        let Some(edge) = self.exit_edge(key) else {
            return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
        };
        if sid == 0 || edge.streams.contains_key(&sid) {
            return self.kill(key, "RESOLVE with a bad stream id", now);
        }
        edge.streams
            .insert(sid, Stream::new(handle, StreamState::Resolving));
        self.next_handle += 1;
        self.streams.insert(handle, (key, sid));
        self.events.push_back(Event::ExitResolve {
            stream: handle,
            host,
        });
    }

    /// Exit: the TCP connection for `stream` is up.
    pub fn exit_connected(&mut self, stream: StreamHandle, addr: SocketAddr, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.state != StreamState::Connecting {
            return;
        }
        s.state = StreamState::Open;
        let body = Connected {
            addr: Some(addr.ip()),
            ttl: 300,
        }
        .encode();
        self.send_relay_backward(key, RelayCommand::CONNECTED, sid, &body, now);
        self.grant_credit(key, sid);
    }

    /// Exit: the TCP connection for `stream` failed (or the policy refused it).
    pub fn exit_failed(&mut self, stream: StreamHandle, reason: EndReason, now: Instant) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        self.send_end(key, sid, reason, now);
    }

    /// Exit: answers for a RESOLVE.
    pub fn exit_resolved(
        &mut self,
        stream: StreamHandle,
        answers: Vec<ResolvedAnswer>,
        now: Instant,
    ) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        match (Resolved { answers }).encode() {
            Ok(body) => self.send_relay_backward(key, RelayCommand::RESOLVED, sid, &body, now),
            Err(_) => self.send_end(key, sid, EndReason::INTERNAL, now),
        }
    }

    // ------------------------------------------------------- edges (both ends)

    /// Bytes read from a stream's local socket (at most the credit granted).
    pub fn stream_data(&mut self, stream: StreamHandle, data: &[u8], now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.credit < data.len() {
            warn!(
                ?stream,
                "stream data beyond granted credit; accepting (driver bug)"
            );
        }
        s.credit = s.credit.saturating_sub(data.len());
        s.pending.extend(data);
        self.package_stream(key, sid, now);
    }

    /// The local socket of `stream` reached EOF: END it after its data.
    pub fn stream_eof(&mut self, stream: StreamHandle, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        s.local_eof = true;
        self.package_stream(key, sid, now);
    }

    /// The local socket of `stream` failed: END it at once, dropping unsent data.
    pub fn stream_error(&mut self, stream: StreamHandle, now: Instant) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        self.send_end(key, sid, EndReason::CONNRESET, now);
    }

    /// `cells` [`Event::StreamWrite`]s of `stream` have been written to its socket.
    pub fn stream_flushed(&mut self, stream: StreamHandle, cells: u32, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        let sendmes = s.window.on_flushed(cells);
        for _ in 0..sendmes {
            self.send_edge(key, RelayCommand::SENDME, sid, &[], now);
        }
    }

    fn stream_mut(&mut self, key: CircKey, sid: u16) -> Option<&mut Stream> {
        self.circuits
            .get_mut(&key)?
            .edge_mut()?
            .streams
            .get_mut(&sid)
    }

    fn remove_stream(&mut self, key: CircKey, sid: u16) -> Option<StreamHandle> {
        let s = self
            .circuits
            .get_mut(&key)?
            .edge_mut()?
            .streams
            .remove(&sid)?;
        self.streams.remove(&s.handle);
        Some(s.handle)
    }

    fn edge_data(&mut self, key: CircKey, sid: u16, data: &[u8], digest: [u8; 20], now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Some(edge) = circ.edge_mut() else {
            return self.kill(key, "DATA on a circuit without streams", now);
        };
        let circuit_sendme = edge.window.on_data_received(digest);
        let outcome = match edge.streams.get_mut(&sid) {
            Some(s) if s.state != StreamState::Resolving => match s.window.on_data_received() {
                Ok(()) => Ok(s.handle),
                Err(e) => Err(e.to_string()),
            },
            // DATA for a stream that just ended crosses our END: not an error.
            _ => Err(String::new()),
        };
        if let Some(d) = circuit_sendme {
            let body = Sendme { digest: Some(d) }.encode();
            self.send_edge(key, RelayCommand::SENDME, 0, &body, now);
        }
        match outcome {
            Ok(handle) => self.events.push_back(Event::StreamWrite {
                stream: handle,
                data: data.to_vec(),
            }),
            Err(e) if e.is_empty() => {}
            Err(e) => {
                warn!(?key, sid, error = %e, "closing stream");
                if let Some(handle) = self.remove_stream(key, sid) {
                    self.events.push_back(Event::StreamClosed {
                        stream: handle,
                        reason: EndReason::TORPROTOCOL,
                    });
                }
                self.send_end(key, sid, EndReason::TORPROTOCOL, now);
            }
        }
    }

    fn edge_end(&mut self, key: CircKey, sid: u16, data: &[u8], _now: Instant) {
        let reason = End::decode(data)
            .map(|e| e.reason)
            .unwrap_or(EndReason::MISC);
        if let Some(handle) = self.remove_stream(key, sid) {
            self.events.push_back(Event::StreamClosed {
                stream: handle,
                reason,
            });
        }
    }

    fn edge_sendme(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return self.kill(key, "SENDME on a circuit without an edge", now);
        };
        if sid == 0 {
            let digest = match Sendme::decode(data) {
                Ok(s) => s.digest,
                Err(e) => return self.kill(key, &format!("malformed SENDME: {e}"), now),
            };
            if let Err(e) = edge.window.on_sendme(digest) {
                return self.kill(key, &e.to_string(), now);
            }
            self.package_all(key, now);
        } else {
            let Some(s) = edge.streams.get_mut(&sid) else {
                return;
            };
            if let Err(e) = s.window.on_sendme() {
                return self.kill(key, &e.to_string(), now);
            }
            self.package_stream(key, sid, now);
        }
    }

    /// Package every stream of an edge circuit that has data waiting.
    fn package_all(&mut self, key: CircKey, now: Instant) {
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return;
        };
        let mut sids: Vec<u16> = edge
            .streams
            .iter()
            .filter(|(_, s)| !s.pending.is_empty() || s.local_eof)
            .map(|(id, _)| *id)
            .collect();
        sids.sort_unstable();
        for sid in sids {
            self.package_stream(key, sid, now);
        }
    }

    /// Turn a stream's pending bytes into DATA cells while the windows and the
    /// circuit queue allow; then END it if the local side is done; then grant more credit.
    fn package_stream(&mut self, key: CircKey, sid: u16, now: Instant) {
        loop {
            let Some(circ) = self.circuits.get_mut(&key) else {
                return;
            };
            let side = circ.edge_out_side();
            let queued = circ.queue(side).len();
            let Some(edge) = circ.edge_mut() else { return };
            let circ_open = edge.window.can_package();
            let Some(s) = edge.streams.get_mut(&sid) else {
                return;
            };
            if s.pending.is_empty() {
                if s.local_eof {
                    self.remove_stream(key, sid);
                    self.send_end(key, sid, EndReason::DONE, now);
                    return;
                }
                break;
            }
            if s.state != StreamState::Open
                || !circ_open
                || !s.window.can_package()
                || queued >= QUEUE_HIGHWATER
            {
                break;
            }
            let n = s.pending.len().min(RELAY_DATA_LEN);
            let chunk: Vec<u8> = s.pending.drain(..n).collect();
            s.window.on_data_sent();
            self.send_edge(key, RelayCommand::DATA, sid, &chunk, now);
        }
        self.grant_credit(key, sid);
    }

    /// Top up a stream's read credit so pending + credit stays near the target.
    fn grant_credit(&mut self, key: CircKey, sid: u16) {
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.state != StreamState::Open || s.local_eof {
            return;
        }
        let have = s.pending.len() + s.credit;
        if have * 2 <= STREAM_BUFFER_TARGET {
            let bytes = STREAM_BUFFER_TARGET - have;
            s.credit += bytes;
            let stream = s.handle;
            self.events
                .push_back(Event::StreamReadCredit { stream, bytes });
        }
    }

    // ------------------------------------------------------------ cell output

    /// Send a relay message from this circuit's edge toward its peer edge.
    fn send_edge(&mut self, key: CircKey, cmd: RelayCommand, sid: u16, body: &[u8], now: Instant) {
        let Some(circ) = self.circuits.get(&key) else {
            return;
        };
        match &circ.role {
            Role::Origin { crypto, .. } => {
                let last = crypto.len().saturating_sub(1);
                self.send_relay_forward(key, last, cmd, sid, body, false, now)
            }
            Role::Relay { .. } => self.send_relay_backward(key, cmd, sid, body, now),
        }
    }

    fn send_end(&mut self, key: CircKey, sid: u16, reason: EndReason, now: Instant) {
        self.send_edge(key, RelayCommand::END, sid, &End { reason }.encode(), now);
    }

    /// Originate a relay cell at this relay, toward the client.
    fn send_relay_backward(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        now: Instant,
    ) {
        let Ok(mut payload) = relay_payload(cmd, sid, body) else {
            return self.kill(key, "relay message too long", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let (Role::Relay { crypto, edge, .. }, Some((_, prev_id))) = (&mut circ.role, circ.prev)
        else {
            return;
        };
        let digest = crypto.originate_backward(&mut payload);
        if cmd == RelayCommand::DATA {
            if let Some(edge) = edge {
                edge.window.on_data_sent(digest);
            }
        }
        let cell = Cell::from_payload(prev_id, CellCommand::RELAY, payload);
        self.enqueue(key, Side::Prev, cell, now);
    }

    /// Originate a relay cell at the client, addressed to hop `hop`.
    #[allow(clippy::too_many_arguments)]
    fn send_relay_forward(
        &mut self,
        key: CircKey,
        hop: usize,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        early: bool,
        now: Instant,
    ) {
        let Ok(mut payload) = relay_payload(cmd, sid, body) else {
            return self.kill(key, "relay message too long", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let (Role::Origin { crypto, edge, .. }, Some((_, next_id))) = (&mut circ.role, circ.next)
        else {
            return;
        };
        let digest = match crypto.encrypt_to(hop, &mut payload) {
            Ok(d) => d,
            Err(_) => return self.kill(key, "no such hop", now),
        };
        if cmd == RelayCommand::DATA {
            edge.window.on_data_sent(digest);
        }
        let command = if early {
            CellCommand::RELAY_EARLY
        } else {
            CellCommand::RELAY
        };
        let cell = Cell::from_payload(next_id, command, payload);
        self.enqueue(key, Side::Next, cell, now);
    }

    /// Put a cell on a circuit's queue toward `side` and wake its channel.
    fn enqueue(&mut self, key: CircKey, side: Side, cell: Cell, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Some((chan, _)) = circ.endpoint(side) else {
            return;
        };
        let sampled_at = match self.cfg.cell_sample_every {
            0 => None,
            every => {
                self.sample_counter = self.sample_counter.wrapping_add(1);
                self.sample_counter.is_multiple_of(every).then_some(now)
            }
        };
        let queue = circ.queue(side);
        queue.push(cell, sampled_at);
        let len = queue.len();
        self.stats.queued_cells += 1;
        if len > self.cfg.max_circuit_queue {
            return self.kill(
                key,
                "circuit queue limit exceeded (peer ignores flow control)",
                now,
            );
        }
        if len == 1 {
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.sched.activate(queue_id(key, side), now);
            }
        }
        self.mark_ready(chan);
        if self.stats.queued_cells > self.cfg.max_queued_cells {
            self.relieve_memory_pressure(now);
        }
    }

    fn mark_ready(&mut self, chan: ChannelId) {
        if self.ready_set.insert(chan) {
            self.ready.push_back(chan);
        }
    }

    fn send_destroy(&mut self, chan: ChannelId, circ_id: CircId, reason: DestroyReason) {
        let Ok(cell) = Cell::new(circ_id, CellCommand::DESTROY, &Destroy { reason }.encode())
        else {
            return;
        };
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.urgent.push_back(cell);
            self.mark_ready(chan);
        }
    }

    /// Over the global queue cap: kill the circuit holding the most queued cells.
    fn relieve_memory_pressure(&mut self, now: Instant) {
        let victim = self
            .circuits
            .iter()
            .max_by_key(|(_, c)| c.q_prev.len() + c.q_next.len())
            .map(|(k, _)| *k);
        if let Some(key) = victim {
            warn!(
                ?key,
                queued = self.stats.queued_cells,
                "queue memory cap reached: killing the largest circuit"
            );
            self.kill(key, "queue memory cap reached", now);
        }
    }

    // --------------------------------------------------------------- teardown

    /// Close a circuit for a protocol violation or resource limit, with a log line.
    fn kill(&mut self, key: CircKey, why: &str, now: Instant) {
        warn!(?key, reason = why, "closing circuit");
        self.stats.circuits_killed += 1;
        self.close_circuit_inner(key, DestroyReason::PROTOCOL, None, now, why);
    }

    /// Remove a circuit, send DESTROY on every side except `except`, close its
    /// streams, and tell the driver if it was ours.
    fn close_circuit_inner(
        &mut self,
        key: CircKey,
        reason: DestroyReason,
        except: Option<ChannelId>,
        _now: Instant,
        why: &str,
    ) {
        let Some(circ) = self.circuits.remove(&key) else {
            return;
        };
        self.stats.queued_cells = self
            .stats
            .queued_cells
            .saturating_sub(circ.q_prev.len() + circ.q_next.len());
        for (side, end) in [(Side::Prev, circ.prev), (Side::Next, circ.next)] {
            let Some((chan, id)) = end else { continue };
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.circ_ids.remove(&id);
                ch.sched.deactivate(queue_id(key, side));
                ch.sched.forget(queue_id(key, side));
            }
            if Some(chan) != except {
                // Relays pass on the reason as tor-spec asks; a client says FINISHED.
                let r = if circ.is_origin() {
                    DestroyReason::FINISHED
                } else {
                    reason
                };
                self.send_destroy(chan, id, r);
            }
        }
        for waiting in self.waiting_for_channel.values_mut() {
            waiting.retain(|k| *k != key);
        }
        let (edge, origin) = match circ.role {
            Role::Relay { edge, .. } => (edge, false),
            Role::Origin { edge, .. } => (Some(edge), true),
        };
        if let Some(edge) = edge {
            for s in edge.streams.into_values() {
                self.streams.remove(&s.handle);
                self.events.push_back(Event::StreamClosed {
                    stream: s.handle,
                    reason: EndReason::DESTROY,
                });
            }
        }
        if origin {
            info!(?key, reason = why, "circuit closed");
            self.events.push_back(Event::CircuitClosed {
                circ: key,
                reason: why.to_string(),
            });
        }
    }

    // -------------------------------------------------------------- allocators

    fn alloc_key(&mut self) -> CircKey {
        let key = CircKey(self.next_key);
        self.next_key += 1;
        key
    }

    /// A random unused circuit id in our half of `chan`'s id space.
    fn alloc_circ_id(&mut self, chan: ChannelId) -> Option<CircId> {
        let ch = self.channels.get(&chan)?;
        let high = if ch.initiator { 0x8000_0000 } else { 0 };
        for _ in 0..64 {
            let id = (self.rng.gen::<u32>() & 0x7fff_ffff) | high;
            if id != 0 && !ch.circ_ids.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_crypto::IdentityKeypair;

    fn relay(seed: u8) -> (Core, IdentityKey) {
        let mut rng = StdRng::seed_from_u64(u64::from(seed));
        let identity = IdentityKeypair::generate(&mut rng).public();
        let ntor = NtorSecretKey::generate(&mut rng);
        let cfg = CoreConfig {
            relay: Some(RelayKeys { identity, ntor }),
            ..CoreConfig::default()
        };
        (Core::new(cfg, [seed; 32]), identity)
    }

    /// Two relays that open channels to each other at the same moment must both send new
    /// circuits on the same TCP connection (the one opened by the smaller identity), whichever
    /// handshake finishes first on either side; otherwise each connection would carry data one
    /// way only.
    #[test]
    fn simultaneous_channels_between_two_relays_agree_on_one() {
        let now = Instant::now();
        for (first_a, first_b) in [(true, true), (true, false), (false, true), (false, false)] {
            let (mut a, ida) = relay(1);
            let (mut b, idb) = relay(2);
            // Channel 1 on each side is its own outbound connection, 2 the peer's.
            let open = |core: &mut Core, peer: IdentityKey, own_first: bool| {
                let order = if own_first {
                    [(1, true), (2, false)]
                } else {
                    [(2, false), (1, true)]
                };
                for (id, initiator) in order {
                    core.channel_opened(ChannelId(id), Some(peer), initiator, now);
                }
            };
            open(&mut a, idb, first_a);
            open(&mut b, ida, first_b);
            let a_own = a.chan_by_identity.get(&idb) == Some(&ChannelId(1));
            let b_own = b.chan_by_identity.get(&ida) == Some(&ChannelId(1));
            // Exactly one side uses its own connection: both use the same one.
            assert_ne!(a_own, b_own, "order {first_a}/{first_b}");
            assert_eq!(a_own, ida < idb, "the smaller identity's connection wins");
        }
    }
}
