//! The IO driver around a sans-IO [`Core`]: one task owns the core; link,
//! stream and connect tasks talk to it through one bounded input queue.
//!
//! ```text
//!  link reader tasks ─┐                         ┌─▶ link writer tasks (≤ OutbufCells in flight)
//!  stream reader tasks├─▶ input queue ─▶ Core ──┼─▶ stream writer tasks
//!  connect/exit tasks ┘   (bounded)             └─▶ connect / exit-connect tasks
//! ```
//!
//! Time is read once per wake-up and passed to every core call made for it
//! (the paper's cached-time fix). Which channel writes next, how many cells and in which class
//! is the core-side channel scheduler's decision ([`chive_core::chansched::SendPath`], which
//! also keeps the output accounting); the driver hands its [`Transmit`]s to the writers and
//! reports back what they paid and wrote.
//!
//! A channel normally has one connection. With split-direction links
//! ([`chive_core::split`], docs/protocol.md) a channel between relays may have a second one:
//! the channel's responder writes only there, its initiator only on the first; the core's
//! circuits never notice. [`SplitChannel`] decides when a second connection opens, binds,
//! merges or is retried, and which one the channel writes on; the driver connects and closes.
//! Connections are named by ids from the channel-id allocator; a channel's first connection has
//! the channel's own id.
//!
//! Files: this one holds the inputs and the loop; `output.rs` the send side (a wake-up's
//! flush, batches to the writers or written directly); `links.rs` the connections and
//! split-direction channels; `tasks.rs` the IO tasks; `tunables.rs` the runtime settings.

mod config;
mod guard;
mod links;
mod output;
mod switching;
mod task;
mod tasks;
#[cfg(test)]
mod tests;
mod tunables;
mod watchdog;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::{AnyCell, Cell, CellCommand, EndReason, ResolvedAnswer, VarCell, PAYLOAD_LEN};
pub use chive_core::chansched::BatchClass;
use chive_core::chansched::SendPath;
use chive_core::{ChannelId, Core, Event, LocalMap, SchedulerKind, StreamHandle};
use chive_crypto::IdentityKey;
use chive_net::FeatureSet;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use chive_core::dos::heartbeat::{Heartbeat, Totals as HeartbeatTotals};
use chive_core::split::{Conn, SplitChannel, SplitConfig};

use crate::client::ClientState;

pub use config::DriverConfig;
use config::{record_framing, send_config};
pub use switching::SwitchOptions;
pub use task::run_driver;
use task::BackOfQueue;
pub use tasks::WriteMsg;
use tasks::{exit_connect, StreamCmd, EXIT_CONNECT_TIMEOUT};
pub use tasks::{
    spawn_stream_io, start_link, stop_on_signal, CellBudget, ConnHandles, Liveness, StreamEnds,
    StreamIo, DEFAULT_LINK_IDLE_TIMEOUT, DEFAULT_LINK_KEEPALIVE,
};
pub use tunables::{
    check_outbuf_max_msec, Tunables, DEFAULT_HEARTBEAT_PERIOD, MAX_OUTBUF_MAX_MSEC,
};

/// Capacity of the driver's input queue: readers wait (and stop reading their
/// sockets) when the core falls behind.
const INPUT_QUEUE: usize = 4096;
/// Inputs handled before the driver flushes output again (a batch of cells counts as one
/// input per cell).
const INPUT_BATCH: usize = 256;
/// Cells the input queue holds at most, over all link readers (see [`CellBudget`]).
const INPUT_CELLS: usize = 4096;
/// Spare read buffers (~130 KiB each) for readers' handed-over batches, for the whole node:
/// two per direction of one busy flow through a relay (a batch at the driver and the next
/// read's); busier nodes fall back to copying a batch out when none is free.
const BATCH_POOL_BUFFERS: usize = 4;

/// Something for the core, from an IO task.
pub enum Input {
    /// A link finished its handshake and has reader/writer tasks.
    LinkUp(LinkUp),
    /// A relay accepted a TCP connection (its handshakes have not run): the DoS defences
    /// decide whether it goes on.
    Accepted {
        chan: ChannelId,
        accepting: chive_net::Accepting,
    },
    /// Our second connection for `chan` is up and its BIND was sent.
    SplitUp {
        chan: ChannelId,
        conn_id: ChannelId,
        conn: ConnHandles,
    },
    /// Opening a second connection for `chan` failed.
    SplitFailed { chan: ChannelId, why: String },
    /// Opening a link to `identity` failed.
    ConnectFailed { identity: IdentityKey, why: String },
    /// `cells` whole cells arrived on connection `chan` (at most [`tasks::READ_BATCH`]), as
    /// their wire bytes in order ([`chive_net::LinkReader::read_cell_batch`]: a large batch is
    /// the reader's buffer itself, back to the pool when dropped). `permit` holds
    /// their share of the input queue's cell budget and `credit` their share of the
    /// connection's own ([`tasks::LINK_INPUT_CREDIT`]) until they are handled.
    Cells {
        chan: ChannelId,
        bytes: chive_net::CellBatch,
        cells: usize,
        permit: tokio::sync::OwnedSemaphorePermit,
        credit: tokio::sync::OwnedSemaphorePermit,
    },
    /// Opening a circuit-switching connection to `identity` failed.
    SwitchConnectFailed { identity: IdentityKey, why: String },
    /// Connection `chan`'s writer finished writing a batch of `cells` cells.
    Written { chan: ChannelId, cells: usize },
    /// Connection `chan`'s writer took the write-bucket tokens for a batch of `cells` cells
    /// at `at` (sent only by rate-limited writers, before the batch's `Written`); `wake_lag`:
    /// how long the batch took to wake the writer, if it was waiting for one
    /// ([`chive_core::chansched::SendPath::paid_report`]).
    Paid {
        chan: ChannelId,
        cells: usize,
        at: Instant,
        wake_lag: Duration,
    },
    /// Connection `chan` closed or failed.
    LinkDown { chan: ChannelId, why: String },
    /// Bytes read from a stream's socket.
    StreamData { stream: StreamHandle, data: Vec<u8> },
    /// A stream's socket reached EOF.
    StreamEof { stream: StreamHandle },
    /// A stream's socket failed.
    StreamError { stream: StreamHandle, why: String },
    /// `writes` stream writes were written to the socket.
    StreamFlushed { stream: StreamHandle, writes: u32 },
    /// Exit: connected.
    ExitConnected {
        stream: StreamHandle,
        addr: SocketAddr,
        tcp: TcpStream,
    },
    /// Exit: could not connect.
    ExitFailed {
        stream: StreamHandle,
        reason: EndReason,
        why: String,
    },
    /// Exit: resolved.
    ExitResolved {
        stream: StreamHandle,
        answers: Vec<ResolvedAnswer>,
    },
    /// A fresh, verified consensus.
    Consensus(Arc<chive_dir::Consensus>),
    /// New local settings (SIGHUP).
    Reconfigure(Tunables),
    /// Client-only inputs (SOCKS requests).
    Client(crate::client::ClientInput),
    /// Stop.
    Shutdown,
    /// Log a snapshot of the core and the connections (SIGUSR1).
    Dump,
}

impl Input {
    /// How much of the driver's per-flush work this input is: its cells, or 1.
    fn weight(&self) -> usize {
        match self {
            Input::Cells { cells, .. } => *cells,
            _ => 1,
        }
    }
}

/// A link that finished its handshake, as the driver's task hands it over.
pub struct LinkUp {
    pub chan: ChannelId,
    pub peer: Option<IdentityKey>,
    pub initiator: bool,
    /// The peer's socket address.
    pub addr: SocketAddr,
    /// Negotiated link features.
    pub features: FeatureSet,
    /// The link's split-direction bind token.
    pub bind_token: [u8; 32],
    /// The TCP socket's descriptor (circuit switching reads its unsent bytes).
    pub fd: std::os::fd::RawFd,
    pub conn: ConnHandles,
}

/// The driver's side of one connection (its output accounting is the send path's).
struct ConnIo {
    id: ChannelId,
    h: ConnHandles,
    held: bool,
    /// Batches handed to the writer and not yet written: when, and how many cells (bounded
    /// by `OutbufCells`; reported to the core against `MaxMemInQueues`).
    batches: VecDeque<(Instant, usize)>,
}

impl ConnIo {
    fn new(id: ChannelId, h: ConnHandles) -> Self {
        ConnIo {
            id,
            h,
            held: false,
            batches: VecDeque::new(),
        }
    }

    /// Stop reading now; the writer task finishes what it was given, then closes (TLS
    /// close_notify + FIN) once this handle's sender is dropped.
    fn close(self) {
        self.h.reader.abort();
    }

    fn send_var(&self, command: CellCommand, payload: Vec<u8>) {
        self.h.send_var(VarCell {
            circ_id: 0,
            command,
            payload,
        });
    }
}

struct ChanIo {
    /// The channel's first connection (id = the channel's id).
    primary: ConnIo,
    /// The peer's (Reader) or our (Writer) one-way second connection.
    secondary: Option<ConnIo>,
    peer: Option<IdentityKey>,
    initiator: bool,
    /// Split-direction state: roles, second connection, which connection we write on.
    split: SplitChannel,
    /// The peer's address, for a channel we accepted (the DoS defences count by it).
    addr: Option<IpAddr>,
    /// Bytes last reported to the core as held by the driver for this channel.
    reported: usize,
    /// Cells held back for reordering at the last report, and since when some are.
    held_cells: usize,
    held_since: Option<Instant>,
}

impl ChanIo {
    fn conn_mut(&mut self, which: Conn) -> Option<&mut ConnIo> {
        match which {
            Conn::Primary => Some(&mut self.primary),
            Conn::Secondary => self.secondary.as_mut(),
        }
    }

    /// The connection with id `conn`, if it is one of the channel's.
    fn conn_by_id_mut(&mut self, conn: ChannelId) -> Option<&mut ConnIo> {
        if self.primary.id == conn {
            return Some(&mut self.primary);
        }
        self.secondary.as_mut().filter(|s| s.id == conn)
    }

    fn close(self) {
        self.primary.close();
        if let Some(s) = self.secondary {
            s.close();
        }
    }
}

/// A peer identity for the log, in full hex (tests and operators match it against others).
fn hex_peer(peer: Option<IdentityKey>) -> String {
    peer.map(|p| p.to_hex()).unwrap_or_else(|| "client".into())
}

/// Owns the core and the IO tasks' handles.
pub struct Driver {
    pub core: Core,
    pub cfg: DriverConfig,
    tx: mpsc::Sender<Input>,
    rx: mpsc::Receiver<Input>,
    next_chan: Arc<AtomicU64>,
    // Keyed by ids the core allocates: the core's cheap hasher, not SipHash (looked up per
    // batch on the send and receive paths).
    chans: LocalMap<ChannelId, ChanIo>,
    pub streams: LocalMap<StreamHandle, StreamIo>,
    pub client: Option<ClientState>,
    pub metrics: Option<crate::metrics::Metrics>,
    params: Option<chive_dir::NetParams>,
    /// Split-direction settings (relays; clients keep the default, off).
    pub split: SplitConfig,
    /// Relays' ORPorts from the latest consensus (where second connections go).
    relay_addrs: HashMap<IdentityKey, SocketAddr>,
    /// Second connections: connection id → channel.
    secondaries: LocalMap<ChannelId, ChannelId>,
    /// Which channel writes next and how much, and what each connection's writer holds.
    send: SendPath,
    /// Bounds the cells waiting in the input queue (handed to each link reader).
    cell_budget: CellBudget,
    /// Spare read buffers: a reader hands a large batch over in its read buffer and goes on in
    /// a spare ([`chive_net::LinkReader::read_cell_batch`]).
    batch_pool: Arc<chive_net::BatchPool>,
    /// Reused by `on_cell` for the cells the split state releases.
    recv_scratch: Vec<AnyCell>,
    /// Scratch for the fixed cells the core must see decoded (`Core::handle_cell_wire`'s
    /// fallback: unknown circuits, the client's, the last hop's, switching); relayed cells go
    /// from the read batch into their queue slot without it.
    cell_scratch: Cell,
    /// Cells read from connections the core asked not to read (`Core::read_paused`: a
    /// client's held cells reached their bound), in order, each batch with its share of the
    /// connection's input credit: held, so that connection's reader stops (TCP back-pressure
    /// to that client only); the shared input budget is given back at once.
    stalled:
        LocalMap<ChannelId, VecDeque<(chive_net::CellBatch, tokio::sync::OwnedSemaphorePermit)>>,
    /// Circuit switching: options, per-connection congestion detectors, switch connects.
    pub switching: switching::SwitchIo,
    /// The DoS heartbeat log line (relays only).
    heartbeat: Heartbeat,
    /// The output bound last logged, and when (it grows for late wake-ups under a rate).
    outbuf_logged: (usize, Instant),
    /// When to give memory the queues freed back to the OS (`crate::memtrim`).
    mem_release: crate::memtrim::MemRelease,
    /// Batches the driver may still write itself in this wake-up ([`output`]).
    direct_left: usize,
}

impl Driver {
    /// A driver around `core`.
    pub fn new(core: Core, cfg: DriverConfig) -> Self {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let mut send = SendPath::new(send_config(&cfg, None));
        send.set_framing(record_framing(&cfg.link));
        let heartbeat = Heartbeat::new(cfg.tunables.heartbeat(), Instant::now());
        Driver {
            heartbeat,
            outbuf_logged: (cfg.outbuf_cells, Instant::now()),
            mem_release: crate::memtrim::MemRelease::default(),
            core,
            cfg,
            tx,
            rx,
            next_chan: Arc::new(AtomicU64::new(1)),
            chans: LocalMap::default(),
            streams: LocalMap::default(),
            client: None,
            metrics: None,
            params: None,
            split: SplitConfig::default(),
            relay_addrs: HashMap::new(),
            secondaries: LocalMap::default(),
            send,
            cell_budget: Arc::new(tokio::sync::Semaphore::new(INPUT_CELLS)),
            batch_pool: chive_net::BatchPool::new(BATCH_POOL_BUFFERS),
            recv_scratch: Vec::new(),
            cell_scratch: Cell {
                circ_id: 0,
                command: CellCommand::PADDING,
                payload: [0; PAYLOAD_LEN],
            },
            stalled: LocalMap::default(),
            switching: switching::SwitchIo::default(),
            direct_left: 0,
        }
    }

    /// Apply the tunables and consensus parameters now in force. Returns false, leaving the
    /// circuit policy and output bound as they were, if they name a value the policy cannot use
    /// (logged with the option's name).
    pub fn apply_policy(&mut self, now: Instant) -> bool {
        let params = self.params.as_ref();
        let tunables = &self.cfg.tunables;
        let resolved = tunables
            .effective(params)
            .and_then(|policy| Ok((policy, tunables.dos_config(params)?)));
        let applied = match resolved {
            Ok(((kind, outbuf), dos)) => {
                self.set_policy(kind, outbuf, now);
                self.set_limits(dos, now);
                true
            }
            Err(e) => {
                warn!(error = %e, "settings not applied; keeping the old policy and limits");
                false
            }
        };
        self.apply_switching();
        self.heartbeat.set_interval(self.cfg.tunables.heartbeat());
        // The write bucket's rate and reserve may have changed with the tunables (SIGHUP).
        let cap = self.cfg.tunables.client_queue_cap(self.params.as_ref());
        if cap != self.core.client_queue_cap() {
            info!(cells = cap, "PerClientQueueCells set");
            self.core.set_client_queue_cap(cap, now);
        }
        let window = self
            .cfg
            .tunables
            .client_circuit_window(self.params.as_ref());
        if window != self.core.client_circuit_window() {
            info!(cells = window, "ClientCircuitWindow set");
            self.core.set_client_circuit_window(window, now);
        }
        let send = send_config(&self.cfg, self.params.as_ref());
        if send != *self.send.config() {
            self.send.set_config(send, &mut self.core, now);
            self.drain_transmits(now);
        }
        applied
    }

    /// Log the DoS heartbeat if one is due (Tor's heartbeat DoS summary).
    /// Log the output bound when it has moved by a quarter since last logged, at most every
    /// 10 s: it grows when the driver reacts late to its writers (`OutbufMaxMsec`).
    fn log_outbuf(&mut self, now: Instant) {
        let bound = self.send.outbuf();
        let (last, at) = self.outbuf_logged;
        if bound.abs_diff(last) * 4 >= last.max(1)
            && now.saturating_duration_since(at) >= Duration::from_secs(10)
        {
            let latency = self.send.reaction_latency();
            info!(
                outbuf_cells = bound,
                reaction_ms = format!("{:.1}", latency.mean().as_secs_f64() * 1e3),
                reaction_high_ms = format!("{:.1}", latency.high().as_secs_f64() * 1e3),
                "output bound in force"
            );
            self.outbuf_logged = (bound, now);
        }
    }

    fn beat(&mut self, now: Instant) {
        let dos = self.core.dos_stats();
        let totals = HeartbeatTotals::read(&dos, &self.core.stats());
        if let Some(beat) = self.heartbeat.poll(now, totals, dos.tracked_addresses) {
            info!("{beat}");
        }
    }

    fn set_policy(&mut self, kind: SchedulerKind, outbuf: usize, now: Instant) {
        if kind != self.core.scheduler() {
            info!(scheduler = %kind.label(), "circuit scheduler changed");
            self.core.set_scheduler(kind, now);
        }
        if outbuf != self.cfg.outbuf_cells {
            info!(outbuf_cells = outbuf, "output buffer bound changed");
            self.cfg.outbuf_cells = outbuf;
        }
    }

    fn set_limits(&mut self, dos: chive_core::dos::DosConfig, now: Instant) {
        if dos != self.core.dos_config() {
            let (cc, conn) = (dos.circuit_creation, dos.connection);
            info!(
                circuit_creation = cc.enabled,
                cc_rate = cc.rate,
                cc_burst = cc.burst,
                connection = conn.enabled,
                max_concurrent = conn.max_concurrent,
                "DoS defences set"
            );
            self.core.set_dos_config(dos);
        }
        if let Some(bytes) = self.cfg.tunables.max_mem_in_queues {
            if bytes != self.core.max_mem_in_queues() {
                info!(bytes, "MaxMemInQueues set");
                self.core.set_max_mem_in_queues(bytes, now);
            }
        }
    }

    /// A sender for inputs (for listener, SOCKS and directory tasks).
    pub fn sender(&self) -> mpsc::Sender<Input> {
        self.tx.clone()
    }

    /// Channel id allocator shared with the accept loop.
    pub fn chan_ids(&self) -> Arc<AtomicU64> {
        self.next_chan.clone()
    }

    /// Run until [`Input::Shutdown`].
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut switch_tick = self.switching.timer();
        loop {
            let deadline = self.core.next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = self.rx.recv() => {
                    let Some(input) = input else { return };
                    // Let the tasks queued ahead of this wake-up hand over their batches too.
                    BackOfQueue(false).await;
                    let now = Instant::now();
                    if self.take_inputs(input, now).await.is_none() {
                        return;
                    }
                    self.flush(now);
                }
                _ = sleep => {
                    let now = Instant::now();
                    self.core.handle_timeout(now);
                    self.flush(now);
                }
                _ = switch_tick.tick() => {
                    let now = Instant::now();
                    self.switch_tick(now);
                    self.flush(now);
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if let Some(client) = self.client.as_mut() {
                        client.tick(&mut self.core, now);
                    }
                    self.split_tick(now);
                    self.release_memory(now);
                    self.switch_metrics();
                    self.onion_metrics(now);
                    if self.client.is_none() {
                        self.beat(now);
                        self.log_outbuf(now);
                    }
                    if let Some(m) = self.metrics.as_mut() {
                        m.quiet_reserve = self.cfg.limits.write_bucket.as_ref().map_or(0, |b| b.reserve());
                        let stats = self.send.stats();
                        m.outbuf_full_events = stats.outbuf_full_events;
                        m.quiet_cells = stats.quiet_cells;
                        let send = &self.send;
                        let outbufs: Vec<(u64, usize)> =
                            self.chans.keys().map(|c| (c.0, send.in_flight(*c))).collect();
                        m.reaction_latency = self.send.reaction_latency().mean();
                        m.tick(&self.core, &outbufs, self.send.outbuf(), now);
                    }
                    self.flush(now);
                }
            }
        }
    }

    /// Apply one input to the core. Returns false on shutdown.
    pub(super) fn handle_input(&mut self, input: Input, now: Instant) -> bool {
        match input {
            Input::LinkUp(mut up) => {
                // The reader's cells queue behind this input, so they reach the connection
                // only once `link_up` has registered it.
                up.conn.start_reader(&self.cell_budget, &self.batch_pool);
                self.link_up(up, now)
            }
            Input::Accepted { chan, accepting } => self.accepted(chan, accepting, now),
            Input::SplitUp {
                chan,
                conn_id,
                mut conn,
            } => {
                conn.start_reader(&self.cell_budget, &self.batch_pool);
                self.split_up(chan, conn_id, conn, now)
            }
            Input::SplitFailed { chan, why } => {
                if let Some(io) = self.chans.get_mut(&chan) {
                    io.split.open_failed(now);
                }
                warn!(?chan, %why, "could not open a second connection; staying on one");
            }
            Input::ConnectFailed { identity, why } => {
                warn!(peer = %identity, %why, "connect failed");
                self.core.connect_failed(identity, now);
            }
            Input::SwitchConnectFailed { identity, why } => {
                self.switch_connect_failed(identity, &why, now)
            }
            Input::Cells {
                chan,
                bytes,
                permit,
                credit,
                ..
            } => {
                if self.core.read_paused(chan) || self.stalled.contains_key(&chan) {
                    // Kept for later, in order; the connection's credit stays taken.
                    drop(permit);
                    self.stalled
                        .entry(chan)
                        .or_default()
                        .push_back((bytes, credit));
                    return true;
                }
                self.on_cells(chan, &bytes, now);
                // Handled: their room in the queue and in the connection's credit is free again.
                drop((permit, credit));
            }
            Input::Paid {
                chan: conn,
                cells,
                at,
                wake_lag,
            } => {
                // The report's delay counts to when it is handled, not to the wake-up.
                let reaction = wake_lag + Instant::now().saturating_duration_since(at);
                self.send
                    .paid_report(conn, cells, reaction, &mut self.core, now);
                self.drain_transmits(now);
            }
            Input::Written { chan: conn, cells } => {
                // The channel sends again at this wake-up's flush, with everything the rest of
                // its inputs queue (one batch, not one now and one then).
                self.report_written(conn, cells, now);
                self.batch_written(conn, now);
            }
            Input::LinkDown { chan: conn, why } => {
                self.stalled.remove(&conn);
                self.conn_down(conn, &why, now)
            }
            Input::StreamData { stream, data } => self.core.stream_data_owned(stream, data, now),
            Input::StreamEof { stream } => self.core.stream_eof(stream, now),
            Input::StreamError { stream, why } => {
                debug!(?stream, %why, "stream socket error");
                self.streams.remove(&stream);
                self.core.stream_error(stream, now);
            }
            Input::StreamFlushed { stream, writes } => {
                self.core.stream_flushed(stream, writes, now)
            }
            Input::ExitConnected { stream, addr, tcp } => {
                match self.streams.get_mut(&stream).and_then(|s| s.unpark()) {
                    Some(ends) => {
                        spawn_stream_io(stream, tcp, ends, self.tx.clone());
                        self.core.exit_connected(stream, addr, now);
                    }
                    None => drop(tcp), // the stream was closed meanwhile
                }
            }
            Input::ExitFailed {
                stream,
                reason,
                why,
            } => {
                debug!(?stream, %why, "exit connect failed");
                self.streams.remove(&stream);
                self.core.exit_failed(stream, reason, now);
            }
            Input::ExitResolved { stream, answers } => {
                self.core.exit_resolved(stream, answers, now)
            }
            Input::Reconfigure(t) => {
                let old = std::mem::replace(&mut self.cfg.tunables, t);
                if !self.apply_policy(now) {
                    self.cfg.tunables = old;
                }
            }
            Input::Consensus(consensus) => {
                self.relay_addrs = consensus
                    .relays
                    .iter()
                    .map(|r| (r.identity, r.address))
                    .collect();
                self.core
                    .set_circwindow(u32::from(consensus.params.circwindow()));
                self.core
                    .set_congestion_control(chive_client::cc::congestion_control(
                        &consensus.params,
                    ));
                self.params = Some(consensus.params.clone());
                self.recheck_known_relays(now);
                self.apply_policy(now);
                if let Some(client) = self.client.as_mut() {
                    client.set_consensus(&mut self.core, consensus, now);
                }
            }
            Input::Client(ci) => {
                if let Some(client) = self.client.as_mut() {
                    client.on_input(&mut self.core, &mut self.streams, ci, now);
                }
            }
            Input::Shutdown => return false,
            Input::Dump => {
                let mut conns = String::new();
                for (chan, io) in &self.chans {
                    conns.push_str(&format!(
                        "connection chan={} in_flight={} unpaid={} blocked={} secondary={} pending={}\n",
                        chan.0,
                        self.send.in_flight(*chan),
                        self.send.unpaid(*chan),
                        self.send.blocked(*chan),
                        io.secondary.is_some(),
                        self.core.has_pending(*chan),
                    ));
                }
                conns.push_str(&format!(
                    "waiting for output room ({}): {:?}\n",
                    self.send.policy_name(),
                    self.send.waiting().iter().map(|c| c.0).collect::<Vec<_>>()
                ));
                info!(
                    "state dump (SIGUSR1):\n{}{}",
                    conns,
                    self.core.debug_dump(now)
                );
            }
        }
        true
    }

    /// Once a second: the onion counters and the connections joined since (`onion_metrics`).
    fn onion_metrics(&mut self, now: Instant) {
        let Some(m) = self.metrics.as_mut() else {
            return;
        };
        let mut c = crate::onion_metrics::OnionCounters {
            relay: self.core.onion_relay_stats(),
            ..Default::default()
        };
        if let Some(client) = self.client.as_mut() {
            c.client = Some(client.onion.counters);
            c.service = client.service.as_ref().map(|s| s.counters());
            c.client_pool = Some(crate::onion_metrics::PoolStats {
                counters: client.onion.pool_counters(),
                ready: client.onion.predicted_ready(),
            });
            c.service_pool = client
                .service
                .as_ref()
                .map(|s| crate::onion_metrics::PoolStats {
                    counters: s.pool_counters(),
                    ready: s.predicted_ready(),
                });
            while let Some(j) = client.onion.poll_join_timing() {
                m.onion_join(&j);
            }
        }
        m.onion(c, now);
    }

    /// Connection `conn` closed or failed (or we close it for `why`).
    fn conn_down(&mut self, conn: ChannelId, why: &str, now: Instant) {
        match self.locate(conn) {
            Some((chan, Conn::Primary)) => {
                if let Some(io) = self.remove_channel(chan) {
                    info!(?chan, %why, "link closed");
                    io.close();
                }
                self.core.channel_closed(chan, now);
            }
            Some((chan, Conn::Secondary)) => self.secondary_down(chan, why, now),
            // Already forgotten (a second connection we closed).
            None => {}
        }
    }

    fn handle_event(&mut self, ev: Event, now: Instant) {
        match ev {
            Event::Connect { addr, identity } => {
                let chan = ChannelId(self.next_chan.fetch_add(1, Ordering::Relaxed));
                let cfg = self.cfg.link.clone();
                let limits = self.cfg.limits.clone();
                let liveness = self.cfg.liveness;
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    match chive_net::connect(addr, Some(identity), &cfg).await {
                        Ok(link) => start_link(chan, link, true, limits, liveness, tx).await,
                        Err(e) => {
                            let _ = tx
                                .send(Input::ConnectFailed {
                                    identity,
                                    why: e.to_string(),
                                })
                                .await;
                        }
                    }
                });
            }
            Event::ConnectSwitch { identity } => self.connect_switch(identity),
            Event::CloseChannel { chan, reason } => {
                info!(?chan, %reason, "closing channel");
                if let Some(io) = self.remove_channel(chan) {
                    io.close();
                }
                self.core.channel_closed(chan, now);
            }
            Event::ExitConnect { stream, host, port } => {
                self.streams.insert(stream, StreamIo::parked());
                let policy = self.cfg.exit_policy.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let input = exit_connect(stream, &host, port, policy).await;
                    let _ = tx.send(input).await;
                });
            }
            Event::ExitResolve { stream, host } => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let answers = match tokio::time::timeout(
                        EXIT_CONNECT_TIMEOUT,
                        tokio::net::lookup_host((host.as_str(), 0)),
                    )
                    .await
                    {
                        Ok(Ok(addrs)) => addrs.map(|a| ResolvedAnswer::Ip(a.ip(), 60)).collect(),
                        _ => vec![ResolvedAnswer::NontransientError(0)],
                    };
                    let _ = tx.send(Input::ExitResolved { stream, answers }).await;
                });
            }
            Event::StreamWrite {
                stream,
                data,
                cells,
            } => {
                // Written now when the socket takes it (its stream SENDMEs then leave with
                // this turn's other cells); else the writer task reports it later.
                let flushed = self
                    .streams
                    .get(&stream)
                    .is_some_and(|io| io.write(data, cells));
                if flushed {
                    self.core.stream_flushed(stream, cells, now);
                }
            }
            Event::StreamReadCredit { stream, bytes } => {
                if let Some(io) = self.streams.get(&stream) {
                    let _ = io.credit_tx.send(bytes);
                }
            }
            Event::StreamClosed { stream, reason } => {
                let handled = self
                    .client
                    .as_mut()
                    .is_some_and(|c| c.on_stream_closed(&mut self.streams, stream, reason));
                if !handled {
                    if let Some(io) = self.streams.remove(&stream) {
                        let _ = io.write_tx.send(StreamCmd::Close);
                    }
                }
            }
            // Onion service (a client with HiddenServiceDir): a stream through a joined
            // rendezvous circuit goes to the HiddenServicePort target; anything else is refused.
            Event::OnionStreamRequest { circ, stream, port } => {
                let target = self
                    .client
                    .as_ref()
                    .and_then(|c| c.service_target(circ, port));
                match target {
                    Some(addr) => {
                        self.streams.insert(stream, StreamIo::parked());
                        let tx = self.tx.clone();
                        tokio::spawn(async move {
                            let _ = tx.send(tasks::connect(stream, addr).await).await;
                        });
                    }
                    None => {
                        info!(
                            ?circ,
                            port, "onion stream to a port the service does not offer"
                        );
                        self.core.exit_failed(stream, EndReason::EXITPOLICY, now);
                    }
                }
            }
            ev @ (Event::StreamConnected { .. }
            | Event::Resolved { .. }
            | Event::CircuitBuilt { .. }
            | Event::CircuitClosed { .. }
            | Event::OnionMessage { .. }) => {
                if let Some(client) = self.client.as_mut() {
                    client.on_event(&mut self.core, &mut self.streams, ev, now);
                }
            }
        }
    }
}
