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
//! (the paper's cached-time fix). Cells move to a link's writer only while it
//! has fewer than `outbuf_cells` unwritten, so the scheduler decides late.
//!
//! A channel normally has one connection. With split-direction links (split.rs,
//! docs/protocol.md) a channel between relays may have a second one: the channel's
//! responder writes only there, its initiator only on the first; the core never
//! notices. Connections are named by ids from the channel-id allocator; a channel's
//! first connection has the channel's own id.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::{
    AnyCell, Bind, Cell, CellCommand, EndReason, Handoff, ResolvedAnswer, VarCell, CELL_LEN,
    VAR_CELL_HEADER_LEN,
};
use chive_core::{CellSample, ChannelId, Core, Event, SchedulerKind, StreamHandle};
use chive_crypto::IdentityKey;
use chive_dir::ExitPolicy;
use chive_net::{
    FeatureSet, Link, LinkConfig, LinkLimits, LinkReader, LinkWriter, SPLIT_DIRECTION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use crate::client::ClientState;
use crate::split::{
    BulkDetector, Conn, Decision, Item, Reorder, Sender as SplitSender, SplitConfig, SplitMode,
    Violation, HOLD_CELLS,
};

/// Capacity of the driver's input queue: readers wait (and stop reading their
/// sockets) when the core falls behind.
const INPUT_QUEUE: usize = 4096;
/// Largest read from a stream socket.
const STREAM_READ_CHUNK: usize = 16 * 1024;
/// Time allowed for an exit's DNS lookup and TCP connect.
const EXIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Inputs handled before the driver flushes output again.
const INPUT_BATCH: usize = 256;
/// How long an accepted link that negotiated split-direction may stay silent before it counts
/// as a channel of its own (its first cell may be a BIND making it another channel's second
/// connection; an honest peer sends that, or its first CREATE2, at once).
const BIND_WAIT: Duration = Duration::from_secs(2);
/// After a second connection failed or could not be opened, wait this long before another.
const SPLIT_RETRY: Duration = Duration::from_secs(10);

/// Something for the core, from an IO task.
// Cells travel inline (no allocation per cell); other inputs are rare.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    /// A link finished its handshake and has reader/writer tasks.
    LinkUp {
        chan: ChannelId,
        peer: Option<IdentityKey>,
        initiator: bool,
        /// Negotiated link features.
        features: FeatureSet,
        /// The link's split-direction bind token.
        bind_token: [u8; 32],
        conn: ConnHandles,
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
    /// A cell arrived on connection `chan`.
    Cell { chan: ChannelId, cell: AnyCell },
    /// Connection `chan`'s writer finished writing a batch of `cells` cells.
    Written { chan: ChannelId, cells: usize },
    /// Connection `chan`'s writer took the write-bucket tokens for a batch of `cells` cells
    /// (sent only by rate-limited writers, before the batch's `Written`).
    Paid { chan: ChannelId, cells: usize },
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

/// Commands for a stream's writer task.
pub enum StreamCmd {
    Write(Vec<u8>),
    Close,
}

/// The driver's side of one stream's socket.
pub struct StreamIo {
    write_tx: mpsc::UnboundedSender<StreamCmd>,
    credit_tx: mpsc::UnboundedSender<usize>,
    /// Receivers handed to the IO tasks once the socket is ready.
    parked: Option<(
        mpsc::UnboundedReceiver<StreamCmd>,
        mpsc::UnboundedReceiver<usize>,
    )>,
}

impl StreamIo {
    /// Channels for a stream whose socket is not ready yet.
    pub fn parked() -> Self {
        let (write_tx, write_rx) = mpsc::unbounded_channel();
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
        StreamIo {
            write_tx,
            credit_tx,
            parked: Some((write_rx, credit_rx)),
        }
    }

    /// Take the receivers for the IO tasks.
    pub fn unpark(
        &mut self,
    ) -> Option<(
        mpsc::UnboundedReceiver<StreamCmd>,
        mpsc::UnboundedReceiver<usize>,
    )> {
        self.parked.take()
    }
}

/// What a connection's writer task is given.
pub enum WriteMsg {
    /// A batch of cells, acknowledged with [`Input::Paid`] and [`Input::Written`]. A
    /// [`BatchClass::Quiet`] batch may spend the write bucket's reserve (`QuietReserve`), and
    /// so may every batch queued before it on the same connection (it cannot leave before
    /// them); a [`BatchClass::Bulk`] one may not.
    Cells { cells: Vec<Cell>, class: BatchClass },
    /// A variable-length link cell (HANDOFF), not acknowledged.
    Var(VarCell),
}

/// How a batch of cells may draw on the write bucket (see [`Driver::quiet_below`]).
#[derive(Clone, Copy, Debug)]
pub enum BatchClass {
    /// Not classified (no shared write rate): the reserve does not apply.
    Unranked,
    /// Bulk under a shared write rate: leaves the reserve alone.
    Bulk,
    /// Cells of circuits whose EWMA count is below `below`: may spend the reserve.
    Quiet { below: f64 },
}

/// Shared by the driver and one connection's writer: how many quiet batches the writer holds
/// unpaid, and a wake-up for a batch waiting at the reserve ahead of them.
#[derive(Default)]
struct QuietSignal {
    queued: AtomicUsize,
    wake: tokio::sync::Notify,
}

/// Handles of one connection's IO tasks (see [`start_link`]).
pub struct ConnHandles {
    writer: mpsc::UnboundedSender<WriteMsg>,
    /// Quiet batches handed to the writer and not yet paid.
    quiet: Arc<QuietSignal>,
    reader: AbortHandle,
    /// `true` pauses the reader (its cells would only be held back).
    hold: watch::Sender<bool>,
}

/// The driver's side of one connection.
struct ConnIo {
    id: ChannelId,
    h: ConnHandles,
    in_flight: usize,
    /// Of those, cells still waiting for write-bucket tokens (not yet paid): what the
    /// cross-channel budget counts, so that a connection blocked on a slow receiver's socket
    /// does not hold up the others.
    unpaid: usize,
    /// Batches handed to the writer, oldest first, with their sampled cells.
    batches: VecDeque<(usize, Vec<CellSample>)>,
    held: bool,
}

impl ConnIo {
    fn new(id: ChannelId, h: ConnHandles) -> Self {
        ConnIo {
            id,
            h,
            in_flight: 0,
            unpaid: 0,
            batches: VecDeque::new(),
            held: false,
        }
    }

    /// Stop reading now; the writer task finishes what it was given, then closes (TLS
    /// close_notify + FIN) once this handle's sender is dropped.
    fn close(self) {
        self.h.reader.abort();
    }

    fn send_var(&self, command: CellCommand, payload: Vec<u8>) {
        let cell = VarCell {
            circ_id: 0,
            command,
            payload,
        };
        // A gone writer has its LinkDown on the way.
        let _ = self.h.writer.send(WriteMsg::Var(cell));
    }
}

/// A channel's split-direction state.
enum SplitSide {
    /// One bidirectional connection (feature not negotiated, or a client link).
    None,
    /// We opened the first connection: the peer may bind a connection it writes on.
    Reader { token: [u8; 32], reorder: Reorder },
    /// We accepted the first connection: we may open our own and write there.
    Writer {
        token: [u8; 32],
        sender: SplitSender,
        /// A connect task for the second connection is running.
        opening: bool,
        /// No new second connection before this.
        retry_at: Option<Instant>,
        detector: BulkDetector,
    },
}

struct ChanIo {
    /// The channel's first connection (id = the channel's id).
    primary: ConnIo,
    /// The peer's (Reader) or our (Writer) one-way second connection.
    secondary: Option<ConnIo>,
    /// The output buffer is full and cells are waiting (counted once per episode).
    blocked: bool,
    peer: Option<IdentityKey>,
    initiator: bool,
    /// The core knows the channel (false while an accepted link may still send a BIND).
    opened: bool,
    up_since: Instant,
    /// Bytes read and written on the channel (all connections), for "dynamic".
    bytes_in: u64,
    bytes_out: u64,
    split: SplitSide,
}

impl ChanIo {
    fn conn_mut(&mut self, which: Conn) -> Option<&mut ConnIo> {
        match which {
            Conn::Primary => Some(&mut self.primary),
            Conn::Secondary => self.secondary.as_mut(),
        }
    }

    fn in_flight(&self) -> usize {
        self.primary.in_flight + self.secondary.as_ref().map_or(0, |s| s.in_flight)
    }

    fn unpaid(&self) -> usize {
        self.primary.unpaid + self.secondary.as_ref().map_or(0, |s| s.unpaid)
    }

    /// Cells the connection we write on may still take.
    fn room(&self, outbuf_cells: usize) -> usize {
        let conn = match (self.writing_secondary(), &self.secondary) {
            (true, Some(s)) => s,
            _ => &self.primary,
        };
        outbuf_cells.saturating_sub(conn.in_flight)
    }

    /// Whether our cells currently go on the second connection.
    fn writing_secondary(&self) -> bool {
        matches!(&self.split, SplitSide::Writer { sender, .. } if sender.current() == Conn::Secondary)
            && self.secondary.is_some()
    }

    fn close(self) {
        self.primary.close();
        if let Some(s) = self.secondary {
            s.close();
        }
    }
}

/// Wire size of a cell, for the byte counters.
fn cell_len(cell: &AnyCell) -> u64 {
    match cell {
        AnyCell::Fixed(_) => CELL_LEN as u64,
        AnyCell::Var(v) => (VAR_CELL_HEADER_LEN + v.payload.len()) as u64,
    }
}

/// A peer identity for the log, in full hex (tests and operators match it against others).
fn hex_peer(peer: Option<IdentityKey>) -> String {
    peer.map(|p| p.to_hex()).unwrap_or_else(|| "client".into())
}

/// Constant-time equality for bind tokens.
fn token_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Settings a node's operator may set locally; unset ones come from the consensus.
#[derive(Clone, Debug, Default)]
pub struct Tunables {
    /// `Scheduler`: "rr", "ewma" or "ewma-direct" (default "ewma", as Tor).
    pub scheduler: Option<String>,
    /// `CircuitPriorityHalflife` in seconds (≤ 0: round-robin).
    pub halflife: Option<f64>,
    /// `OutbufCells`.
    pub outbuf_cells: Option<usize>,
    /// `CrossChannelPriority`: under a write rate, share OutbufCells among all connections
    /// and give room to the channel with the most deserving circuit (default off).
    pub cross_channel: bool,
}

impl Tunables {
    /// The policy and output bound in force, given the latest consensus parameters.
    pub fn effective(&self, params: Option<&chive_dir::NetParams>) -> (SchedulerKind, usize) {
        let halflife = self.halflife.unwrap_or_else(|| {
            let msec = params
                .map(|p| p.get_spec(&chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC))
                .unwrap_or(chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC.default);
            msec as f64 / 1000.0
        });
        let name = self.scheduler.as_deref().unwrap_or("ewma");
        let kind =
            SchedulerKind::from_config(name, Some(halflife)).unwrap_or(SchedulerKind::RoundRobin);
        let outbuf = self.outbuf_cells.unwrap_or_else(|| {
            params
                .map(|p| p.get_spec(&chive_dir::OUTBUF_CELLS))
                .unwrap_or(chive_dir::OUTBUF_CELLS.default) as usize
        });
        (kind, outbuf)
    }
}

/// Driver settings.
pub struct DriverConfig {
    pub link: Arc<LinkConfig>,
    pub limits: LinkLimits,
    pub outbuf_cells: usize,
    /// Exit policy applied to resolved addresses; None = not an exit.
    pub exit_policy: Option<Arc<ExitPolicy>>,
    /// Local settings (scheduler, half-life, output bound).
    pub tunables: Tunables,
}

/// Owns the core and the IO tasks' handles.
pub struct Driver {
    pub core: Core,
    pub cfg: DriverConfig,
    tx: mpsc::Sender<Input>,
    rx: mpsc::Receiver<Input>,
    next_chan: Arc<AtomicU64>,
    chans: HashMap<ChannelId, ChanIo>,
    pub streams: HashMap<StreamHandle, StreamIo>,
    pub client: Option<ClientState>,
    pub metrics: Option<crate::metrics::Metrics>,
    params: Option<chive_dir::NetParams>,
    /// Split-direction settings (relays; clients keep the default, off).
    pub split: SplitConfig,
    /// Relays' ORPorts from the latest consensus (where second connections go).
    relay_addrs: HashMap<IdentityKey, SocketAddr>,
    /// Second connections: connection id → channel.
    secondaries: HashMap<ChannelId, ChannelId>,
    /// Channels with cells waiting for output room while the relay's write rate is shared
    /// (see [`Driver::dispatch`]), oldest first.
    waiting: VecDeque<ChannelId>,
}

impl Driver {
    /// A driver around `core`.
    pub fn new(core: Core, cfg: DriverConfig) -> Self {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        Driver {
            core,
            cfg,
            tx,
            rx,
            next_chan: Arc::new(AtomicU64::new(1)),
            chans: HashMap::new(),
            streams: HashMap::new(),
            client: None,
            metrics: None,
            params: None,
            split: SplitConfig::default(),
            relay_addrs: HashMap::new(),
            secondaries: HashMap::new(),
            waiting: VecDeque::new(),
        }
    }

    /// Apply the tunables and consensus parameters now in force.
    pub fn apply_policy(&mut self, now: Instant) {
        let (kind, outbuf) = self.cfg.tunables.effective(self.params.as_ref());
        if kind != self.core.scheduler() {
            info!(scheduler = %kind.label(), "circuit scheduler changed");
            self.core.set_scheduler(kind, now);
        }
        if outbuf != self.cfg.outbuf_cells {
            info!(outbuf_cells = outbuf, "output buffer bound changed");
            self.cfg.outbuf_cells = outbuf;
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
                    let now = Instant::now();
                    if !self.handle_input(input, now) {
                        return;
                    }
                    // Take what else is ready before flushing, so output is batched.
                    for _ in 0..INPUT_BATCH {
                        match self.rx.try_recv() {
                            Ok(input) => {
                                if !self.handle_input(input, now) {
                                    return;
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    self.flush(now);
                }
                _ = sleep => {
                    let now = Instant::now();
                    self.core.handle_timeout(now);
                    self.flush(now);
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if let Some(client) = self.client.as_mut() {
                        client.tick(&mut self.core, now);
                    }
                    self.split_tick(now);
                    if let Some(m) = self.metrics.as_mut() {
                        m.quiet_reserve = self.cfg.limits.write_bucket.as_ref().map_or(0, |b| b.reserve());
                        let outbufs: Vec<(u64, usize)> =
                            self.chans.iter().map(|(c, io)| (c.0, io.in_flight())).collect();
                        m.tick(&self.core, &outbufs, self.cfg.outbuf_cells, now);
                    }
                    self.flush(now);
                }
            }
        }
    }

    /// Apply one input to the core. Returns false on shutdown.
    fn handle_input(&mut self, input: Input, now: Instant) -> bool {
        match input {
            Input::LinkUp {
                chan,
                peer,
                initiator,
                features,
                bind_token,
                conn,
            } => self.link_up(chan, peer, initiator, features, bind_token, conn, now),
            Input::SplitUp {
                chan,
                conn_id,
                conn,
            } => self.split_up(chan, conn_id, conn, now),
            Input::SplitFailed { chan, why } => {
                if let Some(io) = self.chans.get_mut(&chan) {
                    if let SplitSide::Writer {
                        opening, retry_at, ..
                    } = &mut io.split
                    {
                        *opening = false;
                        *retry_at = Some(now + SPLIT_RETRY);
                    }
                }
                warn!(?chan, %why, "could not open a second connection; staying on one");
            }
            Input::ConnectFailed { identity, why } => {
                warn!(peer = %identity, %why, "connect failed");
                self.core.connect_failed(identity, now);
            }
            Input::Cell { chan, cell } => self.on_cell(chan, cell, now),
            Input::Paid { chan: conn, cells } => {
                let Some((chan, which)) = self.locate(conn) else {
                    return true;
                };
                if let Some(c) = self.chans.get_mut(&chan).and_then(|io| io.conn_mut(which)) {
                    c.unpaid = c.unpaid.saturating_sub(cells);
                }
                // Budget freed: the most deserving waiting channel goes next.
                if !self.waiting.is_empty() {
                    self.dispatch(now);
                }
            }
            Input::Written { chan: conn, cells } => {
                let Some((chan, which)) = self.locate(conn) else {
                    return true;
                };
                if let Some(c) = self.chans.get_mut(&chan).and_then(|io| io.conn_mut(which)) {
                    c.in_flight = c.in_flight.saturating_sub(cells);
                    // The writer reports whole batches, in order.
                    if let Some((_, samples)) = c.batches.pop_front() {
                        if let Some(m) = self.metrics.as_mut() {
                            m.cells_written(samples, now);
                        }
                    }
                }
                self.transmit(chan, now);
            }
            Input::LinkDown { chan: conn, why } => match self.locate(conn) {
                Some((chan, Conn::Primary)) => {
                    if let Some(io) = self.remove_channel(chan) {
                        info!(?chan, %why, "link closed");
                        io.close();
                    }
                    self.core.channel_closed(chan, now);
                }
                Some((chan, Conn::Secondary)) => self.secondary_down(chan, &why, now),
                // Already forgotten (a second connection we closed).
                None => {}
            },
            Input::StreamData { stream, data } => self.core.stream_data(stream, &data, now),
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
                    Some((write_rx, credit_rx)) => {
                        spawn_stream_io(stream, tcp, write_rx, credit_rx, self.tx.clone());
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
                self.cfg.tunables = t;
                self.apply_policy(now);
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
                        io.in_flight(),
                        io.unpaid(),
                        io.blocked,
                        io.secondary.is_some(),
                        self.core.has_pending(*chan),
                    ));
                }
                conns.push_str(&format!(
                    "waiting for output room: {:?}\n",
                    self.waiting.iter().map(|c| c.0).collect::<Vec<_>>()
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

    /// Act on everything the core produced, until it is quiet.
    fn flush(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            while let Some(ev) = self.core.poll_event() {
                progressed = true;
                self.handle_event(ev, now);
            }
            if let Some(client) = self.client.as_mut() {
                progressed |= client.poll(&mut self.core, &mut self.streams, now);
            }
            while let Some(chan) = self.core.poll_ready_channel() {
                progressed = true;
                self.transmit(chan, now);
            }
            if !progressed {
                break;
            }
        }
        // Room may have appeared without a Written for a waiting channel (a link went down).
        if !self.waiting.is_empty() {
            self.dispatch(now);
        }
    }

    /// `chan` may have cells to send. Without a write rate limit they go straight to its
    /// writer (up to `outbuf_cells` in flight on the connection). With one, all channels share
    /// the rate, so the channel joins the waiting list and [`Driver::dispatch`] decides.
    fn transmit(&mut self, chan: ChannelId, now: Instant) {
        if !self.rate_shared() {
            self.transmit_up_to(chan, usize::MAX, now, BatchClass::Unranked);
            return;
        }
        if !self.waiting.contains(&chan) && self.core.has_pending(chan) {
            self.waiting.push_back(chan);
        }
        self.dispatch(now);
    }

    /// Whether link writers share a finite write rate (`BandwidthRate`).
    fn rate_shared(&self) -> bool {
        self.cfg.tunables.cross_channel
            && self
                .cfg
                .limits
                .write_bucket
                .as_ref()
                .is_some_and(|b| b.rate().0 > 0)
    }

    /// Cross-channel scheduling under a shared write rate (the papers' future work 8.1; C tor's
    /// KIST does the same with `circuitmux_compare_muxes`). Every writer draws from one token
    /// bucket, so cells handed to writers wait there in first-come order whatever their
    /// circuit. Keep that shared queue short — at most `outbuf_cells` cells in flight over all
    /// connections — and whenever room appears, give it to the waiting channel whose next
    /// circuit is most deserving (lowest decayed EWMA count; link-level cells first; ties and
    /// round-robin in turn), a half-buffer at a time so a newcomer never waits behind more
    /// than that. A fresh circuit on a quiet channel thus overtakes bulk on other channels too,
    /// not only on its own.
    ///
    /// With a `QuietReserve`, channels whose next circuit is quiet go first, outside that
    /// bound: see [`Driver::dispatch_quiet`].
    fn dispatch(&mut self, now: Instant) {
        self.dispatch_quiet(now);
        let quantum = (self.cfg.outbuf_cells / 2).max(1);
        loop {
            let unpaid: usize = self.chans.values().map(ChanIo::unpaid).sum();
            let room = self.cfg.outbuf_cells.saturating_sub(unpaid);
            if room == 0 {
                return;
            }
            let (chans, core) = (&self.chans, &self.core);
            self.waiting
                .retain(|c| chans.contains_key(c) && core.has_pending(*c));
            let best = self
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, c)| {
                    chans
                        .get(c)
                        .is_some_and(|io| io.room(self.cfg.outbuf_cells) > 0)
                })
                .map(|(i, c)| (i, core.channel_priority(*c, now).unwrap_or(0.0)))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                .map(|(i, _)| i);
            let Some(chan) = best.and_then(|i| self.waiting.remove(i)) else {
                return;
            };
            let sent = self.transmit_up_to(chan, quantum.min(room), now, BatchClass::Bulk);
            if self.core.has_pending(chan) {
                // Behind the others: equals take turns.
                self.waiting.push_back(chan);
            }
            if sent == 0 {
                return;
            }
        }
    }

    /// The EWMA count (cells) below which a circuit is quiet and its cells may spend the
    /// write bucket's reserve: the reserve's size in cells, so a circuit is quiet while it has
    /// sent less, recently, than the reserve holds (a web page, a handshake, SENDMEs), and a
    /// bulk circuit stops being quiet within its first reserve's worth of cells. `None` without
    /// a reserve, without a shared write rate, or under a policy that does not rank circuits
    /// (round-robin: no priority, no reserve).
    fn quiet_below(&self) -> Option<f64> {
        if !self.rate_shared() || !self.core.scheduler().ranks_circuits() {
            return None;
        }
        let reserve = self.cfg.limits.write_bucket.as_ref()?.reserve();
        (reserve > 0).then(|| reserve as f64 / CELL_LEN as f64)
    }

    /// Hand quiet circuits' cells to their writers at once, as quiet batches that may spend
    /// the reserve. They are not held to the `outbuf_cells` bound that bulk shares (bulk cells
    /// waiting for tokens would otherwise fill it and keep them out); their own bound is twice
    /// that over all connections and on each, so memory stays bounded whatever a peer does.
    fn dispatch_quiet(&mut self, now: Instant) {
        let Some(below) = self.quiet_below() else {
            return;
        };
        let cap = 2 * self.cfg.outbuf_cells;
        let mut unpaid: usize = self.chans.values().map(ChanIo::unpaid).sum();
        let mut i = 0;
        while i < self.waiting.len() && unpaid < cap {
            let Some(&chan) = self.waiting.get(i) else {
                return;
            };
            i += 1;
            if self
                .core
                .channel_priority(chan, now)
                .is_some_and(|p| p < below)
            {
                unpaid += self.transmit_up_to(chan, cap - unpaid, now, BatchClass::Quiet { below });
            }
        }
    }

    /// Move up to `limit` cells to a link's writer while it has room. A split channel's
    /// responder writes on its second connection, everyone else on the first. Returns how
    /// many cells moved.
    ///
    /// A [`BatchClass::Quiet`] batch takes cells only while the channel's next circuit is
    /// quiet, one at a time (the scheduler may turn to a bulk circuit after any cell), and may
    /// fill the connection to twice `outbuf_cells`.
    fn transmit_up_to(
        &mut self,
        chan: ChannelId,
        limit: usize,
        now: Instant,
        class: BatchClass,
    ) -> usize {
        // Paced writers report Paid for every batch (see spawn_conn).
        let paced = self.cfg.limits.write_bucket.is_some();
        let Some(io) = self.chans.get_mut(&chan) else {
            return 0;
        };
        let on_secondary = io.writing_secondary();
        let ChanIo {
            primary,
            secondary,
            blocked,
            bytes_out,
            split,
            ..
        } = io;
        let conn = match (on_secondary, secondary.as_mut()) {
            (true, Some(s)) => s,
            _ => primary,
        };
        let bound = match class {
            BatchClass::Quiet { .. } => 2 * self.cfg.outbuf_cells,
            _ => self.cfg.outbuf_cells,
        };
        let room = bound.saturating_sub(conn.in_flight);
        if room == 0 {
            if !*blocked && self.core.has_pending(chan) {
                *blocked = true;
                if let Some(m) = self.metrics.as_mut() {
                    m.outbuf_full_events += 1;
                }
            }
            return 0;
        }
        *blocked = false;
        let room = room.min(limit);
        let mut cells = Vec::with_capacity(room.min(64));
        let n = match class {
            BatchClass::Quiet { below } => {
                let mut n = 0;
                while n < room
                    && self
                        .core
                        .channel_priority(chan, now)
                        .is_some_and(|p| p < below)
                    && self.core.poll_transmit(chan, 1, now, &mut cells) == 1
                {
                    n += 1;
                }
                n
            }
            _ => self.core.poll_transmit(chan, room, now, &mut cells),
        };
        if n > 0 {
            conn.in_flight += n;
            if paced {
                conn.unpaid += n;
            }
            *bytes_out += (n * CELL_LEN) as u64;
            if let SplitSide::Writer { sender, .. } = split {
                sender.sent(n);
            }
            let mut samples = Vec::new();
            while let Some(s) = self.core.poll_cell_sample() {
                samples.push(s);
            }
            conn.batches.push_back((n, samples));
            if let BatchClass::Quiet { .. } = class {
                conn.h.quiet.queued.fetch_add(1, Ordering::Relaxed);
                conn.h.quiet.wake.notify_one();
                if let Some(m) = self.metrics.as_mut() {
                    m.quiet_cells += n as u64;
                }
            }
            if conn
                .h
                .writer
                .send(WriteMsg::Cells { cells, class })
                .is_err()
            {
                // The writer is gone; its LinkDown is on the way.
                debug!(?chan, "writer gone");
            }
        }
        n
    }

    fn handle_event(&mut self, ev: Event, now: Instant) {
        match ev {
            Event::Connect { addr, identity } => {
                let chan = ChannelId(self.next_chan.fetch_add(1, Ordering::Relaxed));
                let cfg = self.cfg.link.clone();
                let limits = self.cfg.limits.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    match chive_net::connect(addr, Some(identity), &cfg).await {
                        Ok(link) => start_link(chan, link, true, limits, tx).await,
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
            Event::StreamWrite { stream, data } => {
                if let Some(io) = self.streams.get(&stream) {
                    let _ = io.write_tx.send(StreamCmd::Write(data));
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
            ev @ (Event::StreamConnected { .. }
            | Event::Resolved { .. }
            | Event::CircuitBuilt { .. }
            | Event::CircuitClosed { .. }) => {
                if let Some(client) = self.client.as_mut() {
                    client.on_event(&mut self.core, &mut self.streams, ev, now);
                }
            }
        }
    }
}

/// Connections and split-direction channels (the policy; the ordering rules are in split.rs).
impl Driver {
    /// Which channel a connection belongs to, and as which of its connections.
    fn locate(&self, conn: ChannelId) -> Option<(ChannelId, Conn)> {
        if self.chans.contains_key(&conn) {
            return Some((conn, Conn::Primary));
        }
        self.secondaries
            .get(&conn)
            .map(|chan| (*chan, Conn::Secondary))
    }

    /// Forget a channel's connections (the caller closes them and tells the core).
    fn remove_channel(&mut self, chan: ChannelId) -> Option<ChanIo> {
        let io = self.chans.remove(&chan)?;
        if let Some(s) = &io.secondary {
            self.secondaries.remove(&s.id);
        }
        Some(io)
    }

    #[allow(clippy::too_many_arguments)]
    fn link_up(
        &mut self,
        chan: ChannelId,
        peer: Option<IdentityKey>,
        initiator: bool,
        features: FeatureSet,
        bind_token: [u8; 32],
        conn: ConnHandles,
        now: Instant,
    ) {
        let split_ok = features.contains(SPLIT_DIRECTION) && peer.is_some();
        let split = match (split_ok, initiator) {
            (false, _) => SplitSide::None,
            (true, true) => SplitSide::Reader {
                token: bind_token,
                reorder: Reorder::default(),
            },
            (true, false) => SplitSide::Writer {
                token: bind_token,
                sender: SplitSender::default(),
                opening: false,
                retry_at: None,
                detector: BulkDetector::new(self.split.threshold, self.split.idle),
            },
        };
        if let Some(p) = peer {
            info!(?chan, peer = %p, initiator, split = split_ok, "relay link up");
        }
        self.chans.insert(
            chan,
            ChanIo {
                primary: ConnIo::new(chan, conn),
                secondary: None,
                blocked: false,
                peer,
                initiator,
                opened: false,
                up_since: now,
                bytes_in: 0,
                bytes_out: 0,
                split,
            },
        );
        // An accepted link that negotiated the feature may be another channel's second
        // connection; its first cell (BIND or not) tells, so the core waits for it.
        if !split_ok || initiator {
            self.open_channel(chan, now);
        }
    }

    /// Tell the core about a channel.
    fn open_channel(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if io.opened {
            return;
        }
        io.opened = true;
        let (peer, initiator) = (io.peer, io.initiator);
        self.core.channel_opened(chan, peer, initiator, now);
        if self.split.mode == SplitMode::Always {
            self.start_split(chan, now);
        }
    }

    fn deliver(&mut self, chan: ChannelId, cell: AnyCell, now: Instant) {
        match cell {
            AnyCell::Fixed(cell) => self.core.handle_cell(chan, cell, now),
            AnyCell::Var(cell) => self.core.handle_var_cell(chan, cell, now),
        }
    }

    fn on_cell(&mut self, conn: ChannelId, cell: AnyCell, now: Instant) {
        let Some((chan, which)) = self.locate(conn) else {
            return;
        };
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        io.bytes_in += cell_len(&cell);
        if !io.opened {
            if let AnyCell::Var(v) = &cell {
                if v.command == CellCommand::BIND {
                    return self.bind(chan, &v.payload);
                }
            }
            self.open_channel(chan, now);
        }
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        match &mut io.split {
            SplitSide::None => self.deliver(chan, cell, now),
            SplitSide::Reader { reorder, .. } => {
                let item = match cell {
                    AnyCell::Var(v) if v.command == CellCommand::HANDOFF => {
                        match Handoff::decode(&v.payload) {
                            Ok(h) => Item::Handoff(h),
                            Err(_) => {
                                return self.split_violation(
                                    chan,
                                    Violation::Protocol("malformed HANDOFF"),
                                    now,
                                )
                            }
                        }
                    }
                    other => Item::Cell(other),
                };
                let before = reorder.current();
                let mut out = Vec::new();
                let result = reorder.push(which, item, &mut out);
                let after = reorder.current();
                self.after_reorder(chan, before, after, out, result, now);
            }
            SplitSide::Writer { .. } => {
                if which == Conn::Secondary {
                    // The peer must never write on our write-only connection.
                    warn!(?chan, "peer wrote on our one-way connection; dropping it");
                    return self.secondary_down(chan, "peer wrote on a one-way connection", now);
                }
                if let AnyCell::Var(v) = &cell {
                    if v.command == CellCommand::HANDOFF || v.command == CellCommand::BIND {
                        return self.split_violation(
                            chan,
                            Violation::Protocol("HANDOFF or BIND from the channel's initiator"),
                            now,
                        );
                    }
                }
                self.deliver(chan, cell, now);
            }
        }
    }

    /// Deliver what the reorder released, log switches, close on violations, pause readers.
    fn after_reorder(
        &mut self,
        chan: ChannelId,
        before: Conn,
        after: Conn,
        out: Vec<AnyCell>,
        result: Result<(), Violation>,
        now: Instant,
    ) {
        for cell in out {
            self.deliver(chan, cell, now);
        }
        if let Err(v) = result {
            return self.split_violation(chan, v, now);
        }
        if before != after {
            let peer = hex_peer(self.chans.get(&chan).and_then(|io| io.peer));
            match after {
                Conn::Secondary => {
                    info!(?chan, %peer, "channel went split: peer writes on its own connection")
                }
                Conn::Primary => {
                    info!(?chan, %peer, "channel back to one connection: peer writes on ours again")
                }
            }
        }
        self.update_holds(chan);
    }

    /// Pause reading a connection whose cells pile up waiting for a HANDOFF on the other;
    /// resume once they can flow.
    fn update_holds(&mut self, chan: ChannelId) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let SplitSide::Reader { reorder, .. } = &io.split else {
            return;
        };
        let wants = [Conn::Primary, Conn::Secondary]
            .map(|c| (c, c != reorder.current() && reorder.queued(c) >= HOLD_CELLS));
        for (which, want) in wants {
            if let Some(c) = io.conn_mut(which) {
                if c.held != want {
                    c.held = want;
                    let _ = c.h.hold.send(want);
                }
            }
        }
    }

    fn split_violation(&mut self, chan: ChannelId, v: Violation, now: Instant) {
        warn!(?chan, reason = %v, "closing split channel: peer broke the hand-off rules");
        if let Some(io) = self.remove_channel(chan) {
            io.close();
        }
        self.core.channel_closed(chan, now);
    }

    /// The first cell of accepted link `conn` was a BIND: attach it to the channel it names.
    fn bind(&mut self, conn: ChannelId, payload: &[u8]) {
        let Some(x) = self.chans.remove(&conn) else {
            return;
        };
        let refuse = |x: ChanIo, why: &str| {
            warn!(?conn, peer = %hex_peer(x.peer), why, "refusing BIND");
            x.close();
        };
        let Ok(bind) = Bind::decode(payload) else {
            return refuse(x, "malformed BIND");
        };
        let target = self.chans.iter_mut().find(|(_, io)| {
            io.opened
                && io.peer == x.peer
                && io.secondary.is_none()
                && matches!(&io.split, SplitSide::Reader { token, .. } if token_eq(token, &bind.token))
        });
        let Some((&chan, io)) = target else {
            return refuse(x, "no channel of ours with that peer and token");
        };
        let SplitSide::Reader { reorder, .. } = &mut io.split else {
            return refuse(x, "not a reader");
        };
        if !reorder.attach_secondary() {
            return refuse(x, "the previous second connection is not finished");
        }
        io.secondary = Some(x.primary);
        self.secondaries.insert(conn, chan);
        info!(?chan, ?conn, peer = %hex_peer(io.peer), "second connection bound to channel");
    }

    /// A channel's second connection closed or failed.
    fn secondary_down(&mut self, chan: ChannelId, why: &str, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if let Some(s) = io.secondary.take() {
            self.secondaries.remove(&s.id);
            s.close();
        }
        match &mut io.split {
            SplitSide::None => {}
            SplitSide::Reader { reorder, .. } => {
                let before = reorder.current();
                let mut out = Vec::new();
                let result = reorder.closed(Conn::Secondary, &mut out);
                let after = reorder.current();
                debug!(?chan, %why, "peer's second connection closed");
                self.after_reorder(chan, before, after, out, result, now);
            }
            SplitSide::Writer {
                sender, retry_at, ..
            } => {
                if sender.current() == Conn::Secondary {
                    // Resume on the first connection; the recovery marker tells the peer how
                    // many cells to expect from the failed one.
                    let h = sender.recover();
                    io.primary.send_var(CellCommand::HANDOFF, h.encode());
                    info!(?chan, %why, "channel back to one connection: second connection failed");
                }
                *retry_at = Some(now + SPLIT_RETRY);
                self.transmit(chan, now);
            }
        }
    }

    /// Our second connection for `chan` is ready: switch our writing to it.
    fn split_up(&mut self, chan: ChannelId, conn_id: ChannelId, conn: ConnHandles, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            conn.reader.abort();
            return;
        };
        let SplitSide::Writer {
            sender, opening, ..
        } = &mut io.split
        else {
            conn.reader.abort();
            return;
        };
        if !*opening || io.secondary.is_some() || sender.current() != Conn::Primary {
            conn.reader.abort();
            return;
        }
        *opening = false;
        // The marker goes behind every cell already handed to the first connection's writer.
        let h = sender.switch();
        io.primary.send_var(CellCommand::HANDOFF, h.encode());
        io.secondary = Some(ConnIo::new(conn_id, conn));
        self.secondaries.insert(conn_id, chan);
        info!(?chan, peer = %hex_peer(io.peer), "channel went split: we write on our own connection");
        self.transmit(chan, now);
    }

    /// Open our second connection for `chan` if it is eligible and none is open or opening.
    fn start_split(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let Some(peer) = io.peer else {
            return;
        };
        let SplitSide::Writer {
            token,
            sender,
            opening,
            retry_at,
            ..
        } = &mut io.split
        else {
            return;
        };
        if !io.opened
            || *opening
            || io.secondary.is_some()
            || sender.current() != Conn::Primary
            || retry_at.is_some_and(|t| now < t)
        {
            return;
        }
        // The peer's ORPort comes from the consensus, as for any relay link.
        let Some(addr) = self.relay_addrs.get(&peer).copied() else {
            return;
        };
        *opening = true;
        let token = *token;
        let conn_id = ChannelId(self.next_chan.fetch_add(1, Ordering::Relaxed));
        let cfg = self.cfg.link.clone();
        let limits = self.cfg.limits.clone();
        let tx = self.tx.clone();
        debug!(?chan, %addr, "opening second connection");
        tokio::spawn(async move {
            let opened = async {
                let link = chive_net::connect(addr, Some(peer), &cfg)
                    .await
                    .map_err(|e| e.to_string())?;
                if !link.features.contains(SPLIT_DIRECTION) {
                    return Err("peer did not offer split-direction on it".to_string());
                }
                let (reader, mut writer) = link.split(limits);
                let bind = VarCell {
                    circ_id: 0,
                    command: CellCommand::BIND,
                    payload: Bind { token }.encode(),
                };
                writer
                    .write_var_cell(&bind)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((reader, writer))
            }
            .await;
            match opened {
                Ok((reader, writer)) => {
                    let (conn, gate) = spawn_conn(conn_id, reader, writer, tx.clone());
                    if tx
                        .send(Input::SplitUp {
                            chan,
                            conn_id,
                            conn,
                        })
                        .await
                        .is_ok()
                    {
                        let _ = gate.send(());
                    }
                }
                Err(why) => {
                    let _ = tx.send(Input::SplitFailed { chan, why }).await;
                }
            }
        });
    }

    /// "dynamic": go back to one connection (marker on the second, which then closes).
    fn merge(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let SplitSide::Writer { sender, .. } = &mut io.split else {
            return;
        };
        if sender.current() != Conn::Secondary {
            return;
        }
        let Some(s) = io.secondary.take() else {
            return;
        };
        let h = sender.switch();
        s.send_var(CellCommand::HANDOFF, h.encode());
        self.secondaries.remove(&s.id);
        s.close();
        info!(?chan, peer = %hex_peer(io.peer), "channel back to one connection: second connection idle");
        self.transmit(chan, now);
    }

    /// Periodic split-direction work: silent accepted links become channels; "always" retries;
    /// "dynamic" measures and decides.
    fn split_tick(&mut self, now: Instant) {
        let silent: Vec<ChannelId> = self
            .chans
            .iter()
            .filter(|(_, io)| !io.opened && now.saturating_duration_since(io.up_since) >= BIND_WAIT)
            .map(|(c, _)| *c)
            .collect();
        for chan in silent {
            self.open_channel(chan, now);
        }
        if self.split.mode == SplitMode::Off {
            return;
        }
        let mut split = Vec::new();
        let mut merge = Vec::new();
        for (chan, io) in self.chans.iter_mut() {
            let writing_secondary = io.writing_secondary();
            let SplitSide::Writer { detector, .. } = &mut io.split else {
                continue;
            };
            match self.split.mode {
                SplitMode::Always => split.push(*chan),
                SplitMode::Dynamic => {
                    match detector.observe(now, io.bytes_in, io.bytes_out, writing_secondary) {
                        Decision::Split => split.push(*chan),
                        Decision::Merge => merge.push(*chan),
                        Decision::Stay => {}
                    }
                }
                SplitMode::Off => {}
            }
        }
        for chan in split {
            self.start_split(chan, now);
        }
        for chan in merge {
            self.merge(chan, now);
        }
    }
}

/// Split a finished link into reader and writer tasks and announce it.
pub async fn start_link(
    chan: ChannelId,
    link: Link,
    initiator: bool,
    limits: LinkLimits,
    tx: mpsc::Sender<Input>,
) {
    let peer = link.peer_identity;
    let features = link.features;
    let bind_token = link.bind_token();
    let (reader, writer) = link.split(limits);
    let (conn, gate) = spawn_conn(chan, reader, writer, tx.clone());
    if tx
        .send(Input::LinkUp {
            chan,
            peer,
            initiator,
            features,
            bind_token,
            conn,
        })
        .await
        .is_ok()
    {
        let _ = gate.send(());
    }
}

/// Start connection `id`'s reader and writer tasks. The reader waits for the returned gate,
/// fired once the driver has been told about the connection, so that no cell can overtake
/// that announcement in the input queue.
fn spawn_conn(
    id: ChannelId,
    mut reader: LinkReader,
    mut writer: LinkWriter,
    tx: mpsc::Sender<Input>,
) -> (ConnHandles, oneshot::Sender<()>) {
    let (gate_tx, gate_rx) = oneshot::channel::<()>();
    let (hold_tx, mut hold_rx) = watch::channel(false);
    let (wtx, mut wrx) = mpsc::unbounded_channel::<WriteMsg>();
    let quiet = Arc::new(QuietSignal::default());
    let signal = quiet.clone();
    let rtx = tx.clone();
    let reader_task = tokio::spawn(async move {
        if gate_rx.await.is_err() {
            return;
        }
        let why = loop {
            // Paused while the driver holds this connection's cells back (split channels).
            if hold_rx.wait_for(|held| !*held).await.is_err() {
                return;
            }
            match reader.read_cell().await {
                Ok(Some(cell)) => {
                    if rtx.send(Input::Cell { chan: id, cell }).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break "closed by peer".to_string(),
                Err(e) => break e.to_string(),
            }
        };
        let _ = rtx.send(Input::LinkDown { chan: id, why }).await;
    });
    tokio::spawn(async move {
        while let Some(msg) = wrx.recv().await {
            let (result, n) = match msg {
                WriteMsg::Cells { cells, class } if writer.is_paced() => {
                    let quiet = matches!(class, BatchClass::Quiet { .. });
                    // Pay first and say so: from here on the batch waits only for the socket.
                    // A batch ahead of a quiet one may use the reserve too, or the quiet one
                    // would wait behind it for tokens above the reserve.
                    writer
                        .pay_for_cells(
                            cells.len(),
                            || {
                                !matches!(class, BatchClass::Bulk)
                                    || signal.queued.load(Ordering::Relaxed) > 0
                            },
                            Some(&signal.wake),
                        )
                        .await;
                    if quiet {
                        signal.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    let paid = Input::Paid {
                        chan: id,
                        cells: cells.len(),
                    };
                    if tx.send(paid).await.is_err() {
                        return;
                    }
                    (writer.write_paid_cells(&cells).await, Some(cells.len()))
                }
                WriteMsg::Cells { cells, class } => {
                    if let BatchClass::Quiet { .. } = class {
                        // Unpaced: nothing to pay, but keep the count exact.
                        signal.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    (writer.write_cells(&cells).await, Some(cells.len()))
                }
                WriteMsg::Var(cell) => (writer.write_var_cell(&cell).await, None),
            };
            if let Err(e) = result {
                let _ = tx
                    .send(Input::LinkDown {
                        chan: id,
                        why: format!("write failed: {e}"),
                    })
                    .await;
                return;
            }
            if let Some(cells) = n {
                if tx.send(Input::Written { chan: id, cells }).await.is_err() {
                    return;
                }
            }
        }
        let _ = writer.shutdown().await;
    });
    (
        ConnHandles {
            writer: wtx,
            quiet,
            reader: reader_task.abort_handle(),
            hold: hold_tx,
        },
        gate_tx,
    )
}

/// Resolve, check the exit policy, connect.
async fn exit_connect(
    stream: StreamHandle,
    host: &str,
    port: u16,
    policy: Option<Arc<ExitPolicy>>,
) -> Input {
    let fail = |reason, why: String| Input::ExitFailed {
        stream,
        reason,
        why,
    };
    let Some(policy) = policy else {
        return fail(EndReason::EXITPOLICY, "not an exit".into());
    };
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            match tokio::time::timeout(EXIT_CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
                .await
            {
                Ok(Ok(a)) => a.collect(),
                Ok(Err(e)) => {
                    return fail(EndReason::RESOLVEFAILED, format!("resolve {host}: {e}"))
                }
                Err(_) => return fail(EndReason::TIMEOUT, format!("resolve {host}: timeout")),
            }
        }
    };
    let Some(addr) = addrs.into_iter().find(|a| policy.allows(a.ip(), a.port())) else {
        return fail(
            EndReason::EXITPOLICY,
            format!("{host}:{port} rejected by exit policy"),
        );
    };
    match tokio::time::timeout(EXIT_CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(tcp)) => {
            let _ = tcp.set_nodelay(true);
            Input::ExitConnected { stream, addr, tcp }
        }
        Ok(Err(e)) => fail(EndReason::CONNECTREFUSED, format!("connect {addr}: {e}")),
        Err(_) => fail(EndReason::TIMEOUT, format!("connect {addr}: timeout")),
    }
}

/// Run a stream's socket: a reader that reads only as far as its credit, and a
/// writer that reports each batch of writes back.
pub fn spawn_stream_io(
    stream: StreamHandle,
    tcp: TcpStream,
    mut write_rx: mpsc::UnboundedReceiver<StreamCmd>,
    mut credit_rx: mpsc::UnboundedReceiver<usize>,
    tx: mpsc::Sender<Input>,
) {
    let (mut rd, mut wr) = tcp.into_split();
    let rtx = tx.clone();
    tokio::spawn(async move {
        let mut credit = 0usize;
        let mut buf = vec![0u8; STREAM_READ_CHUNK];
        loop {
            if credit == 0 {
                match credit_rx.recv().await {
                    Some(n) => credit += n,
                    None => return, // stream closed by the core
                }
                continue;
            }
            let want = credit.min(buf.len());
            tokio::select! {
                more = credit_rx.recv() => match more {
                    Some(n) => credit += n,
                    None => return,
                },
                r = rd.read(&mut buf[..want]) => match r {
                    Ok(0) => {
                        let _ = rtx.send(Input::StreamEof { stream }).await;
                        return;
                    }
                    Ok(n) => {
                        credit -= n;
                        if rtx.send(Input::StreamData { stream, data: buf[..n].to_vec() }).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = rtx.send(Input::StreamError { stream, why: e.to_string() }).await;
                        return;
                    }
                },
            }
        }
    });
    tokio::spawn(async move {
        while let Some(cmd) = write_rx.recv().await {
            let mut writes = 0u32;
            let mut close = false;
            let mut batch = Vec::new();
            let mut next = Some(cmd);
            while let Some(cmd) = next.take() {
                match cmd {
                    StreamCmd::Write(data) => {
                        batch.extend_from_slice(&data);
                        writes += 1;
                    }
                    StreamCmd::Close => {
                        close = true;
                        break;
                    }
                }
                if writes < 128 {
                    next = write_rx.try_recv().ok();
                }
            }
            if !batch.is_empty() {
                if let Err(e) = wr.write_all(&batch).await {
                    let _ = tx
                        .send(Input::StreamError {
                            stream,
                            why: e.to_string(),
                        })
                        .await;
                    return;
                }
                let _ = tx.send(Input::StreamFlushed { stream, writes }).await;
            }
            if close {
                let _ = wr.shutdown().await;
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
}

/// SIGTERM or SIGINT stops the driver (and so the process) cleanly; SIGUSR1
/// logs a snapshot of circuits, queues, windows and streams.
pub fn stop_on_signal(tx: mpsc::Sender<Input>) {
    use tokio::signal::unix::{signal, SignalKind};
    let dump_tx = tx.clone();
    tokio::spawn(async move {
        let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
            return;
        };
        while usr1.recv().await.is_some() {
            if dump_tx.send(Input::Dump).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            warn!("cannot install signal handlers; stop with SIGKILL");
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        info!("stopping on signal");
        let _ = tx.send(Input::Shutdown).await;
    });
}
