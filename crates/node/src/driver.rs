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
//! merges or is retried, and which one the channel writes on; the driver connects and closes. Connections are named by ids from the channel-id allocator; a channel's
//! first connection has the channel's own id.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::{AnyCell, Bind, Cell, CellCommand, EndReason, ResolvedAnswer, VarCell};
pub use chive_core::chansched::BatchClass;
use chive_core::chansched::{ChannelSchedulerKind, SendConfig, SendPath, Transmit};
use chive_core::{ChannelId, Core, Event, SchedulerKind, StreamHandle};
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
use chive_core::split::{
    Conn, Decision, Refusal, SecondaryDown, SplitChannel, SplitConfig, SplitMode, Violation,
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

/// The driver's side of one connection (its output accounting is the send path's).
struct ConnIo {
    id: ChannelId,
    h: ConnHandles,
    held: bool,
}

impl ConnIo {
    fn new(id: ChannelId, h: ConnHandles) -> Self {
        ConnIo { id, h, held: false }
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

struct ChanIo {
    /// The channel's first connection (id = the channel's id).
    primary: ConnIo,
    /// The peer's (Reader) or our (Writer) one-way second connection.
    secondary: Option<ConnIo>,
    peer: Option<IdentityKey>,
    initiator: bool,
    /// Split-direction state: roles, second connection, which connection we write on.
    split: SplitChannel,
}

impl ChanIo {
    fn conn_mut(&mut self, which: Conn) -> Option<&mut ConnIo> {
        match which {
            Conn::Primary => Some(&mut self.primary),
            Conn::Secondary => self.secondary.as_mut(),
        }
    }

    /// The connection with id `conn`, if it is one of the channel's.
    fn conn_by_id(&self, conn: ChannelId) -> Option<&ConnIo> {
        if self.primary.id == conn {
            return Some(&self.primary);
        }
        self.secondary.as_ref().filter(|s| s.id == conn)
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

/// The send path's settings for `cfg`: the write bucket (if any) decides pacing, whether the
/// write rate is shared (`CrossChannelPriority` under a finite `BandwidthRate`) and the reserve.
fn send_config(cfg: &DriverConfig) -> SendConfig {
    let bucket = cfg.limits.write_bucket.as_ref();
    SendConfig {
        outbuf_cells: cfg.outbuf_cells,
        paced: bucket.is_some(),
        kind: ChannelSchedulerKind::for_rate(
            cfg.tunables.cross_channel,
            bucket.map_or(0, |b| b.rate().0),
        ),
        quiet_reserve: bucket.map_or(0, |b| b.reserve()),
    }
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
    /// Which channel writes next and how much, and what each connection's writer holds.
    send: SendPath,
}

impl Driver {
    /// A driver around `core`.
    pub fn new(core: Core, cfg: DriverConfig) -> Self {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let send = SendPath::new(send_config(&cfg));
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
            send,
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
        // The write bucket's rate and reserve may have changed with the tunables (SIGHUP).
        let send = send_config(&self.cfg);
        if send != *self.send.config() {
            self.send.set_config(send, &mut self.core, now);
            self.drain_transmits();
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
                        let stats = self.send.stats();
                        m.outbuf_full_events = stats.outbuf_full_events;
                        m.quiet_cells = stats.quiet_cells;
                        let send = &self.send;
                        let outbufs: Vec<(u64, usize)> =
                            self.chans.keys().map(|c| (c.0, send.in_flight(*c))).collect();
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
                    io.split.open_failed(now);
                }
                warn!(?chan, %why, "could not open a second connection; staying on one");
            }
            Input::ConnectFailed { identity, why } => {
                warn!(peer = %identity, %why, "connect failed");
                self.core.connect_failed(identity, now);
            }
            Input::Cell { chan, cell } => self.on_cell(chan, cell, now),
            Input::Paid { chan: conn, cells } => {
                self.send.paid(conn, cells, &mut self.core, now);
                self.drain_transmits();
            }
            Input::Written { chan: conn, cells } => {
                let samples = self.send.written(conn, cells, &mut self.core, now);
                self.drain_transmits();
                if let (Some(samples), Some(m)) = (samples, self.metrics.as_mut()) {
                    m.cells_written(samples, now);
                }
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
        self.send.settle(&mut self.core, now);
        self.drain_transmits();
    }

    /// `chan` may have cells to send: the channel scheduler decides what goes now.
    fn transmit(&mut self, chan: ChannelId, now: Instant) {
        self.send.channel_ready(chan, &mut self.core, now);
        self.drain_transmits();
    }

    /// Hand the batches the send path decided to their connections' writers, in order.
    fn drain_transmits(&mut self) {
        while let Some(Transmit {
            chan,
            conn,
            cells,
            class,
        }) = self.send.poll_transmit()
        {
            let Some(io) = self.chans.get_mut(&chan) else {
                // The send path forgets a channel with the driver; never reached.
                warn!(
                    ?chan,
                    cells = cells.len(),
                    "batch for an unknown channel dropped"
                );
                continue;
            };
            let n = cells.len();
            io.split.sent(n);
            let Some(c) = io.conn_by_id(conn) else {
                warn!(
                    ?chan,
                    ?conn,
                    cells = n,
                    "batch for an unknown connection dropped"
                );
                continue;
            };
            if let BatchClass::Quiet { .. } = class {
                c.h.quiet.queued.fetch_add(1, Ordering::Relaxed);
                c.h.quiet.wake.notify_one();
            }
            if c.h.writer.send(WriteMsg::Cells { cells, class }).is_err() {
                // The writer is gone; its LinkDown is on the way.
                debug!(?chan, "writer gone");
            }
        }
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
        self.send.remove_channel(chan);
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
        let split = SplitChannel::new(split_ok, initiator, bind_token, &self.split, now);
        // An accepted link that negotiated the feature may be another channel's second
        // connection; its first cell (BIND or not) tells, so the core waits for it.
        let wait_for_bind = split.may_be_bound();
        if let Some(p) = peer {
            info!(?chan, peer = %p, initiator, split = split_ok, "relay link up");
        }
        self.chans.insert(
            chan,
            ChanIo {
                primary: ConnIo::new(chan, conn),
                secondary: None,
                peer,
                initiator,
                split,
            },
        );
        self.send.add_channel(chan);
        if !wait_for_bind {
            self.open_channel(chan, now);
        }
    }

    /// Tell the core about a channel.
    fn open_channel(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        if !io.split.open() {
            return;
        }
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
        if !io.split.is_open() {
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
        let mut out = Vec::new();
        let result = match io.split.receive(which, cell, &mut out) {
            Ok(switched) => Ok(switched),
            Err(Refusal::Violation(v)) => Err(v),
            Err(Refusal::OneWay) => {
                warn!(?chan, "peer wrote on our one-way connection; dropping it");
                return self.secondary_down(chan, "peer wrote on a one-way connection", now);
            }
        };
        self.after_receive(chan, out, result, now);
    }

    /// Deliver what the split state released, log switches, close on violations, pause readers.
    fn after_receive(
        &mut self,
        chan: ChannelId,
        out: Vec<AnyCell>,
        result: Result<Option<Conn>, Violation>,
        now: Instant,
    ) {
        for cell in out {
            self.deliver(chan, cell, now);
        }
        let switched = match result {
            Ok(switched) => switched,
            Err(v) => return self.split_violation(chan, v, now),
        };
        if let Some(after) = switched {
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
        let Some(wants) = io.split.holds() else {
            return;
        };
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
        // Whatever comes of it, the link is no channel of its own: nothing was sent on it.
        self.send.remove_channel(conn);
        let refuse = |x: ChanIo, why: &str| {
            warn!(?conn, peer = %hex_peer(x.peer), why, "refusing BIND");
            x.close();
        };
        let Ok(bind) = Bind::decode(payload) else {
            return refuse(x, "malformed BIND");
        };
        let target = self.chans.iter_mut().find(|(_, io)| {
            io.peer == x.peer && io.secondary.is_none() && io.split.bind_matches(&bind.token)
        });
        let Some((&chan, io)) = target else {
            return refuse(x, "no channel of ours with that peer and token");
        };
        if !io.split.attach_peer_second() {
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
            self.send.detach_conn(s.id);
            s.close();
        }
        let mut out = Vec::new();
        match io.split.secondary_down(now, &mut out) {
            SecondaryDown::Nothing => {}
            SecondaryDown::Released(result) => {
                debug!(?chan, %why, "peer's second connection closed");
                self.after_receive(chan, out, result, now);
            }
            SecondaryDown::Resume { recover } => {
                if let Some(h) = recover {
                    io.primary.send_var(CellCommand::HANDOFF, h.encode());
                    info!(?chan, %why, "channel back to one connection: second connection failed");
                }
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
        let Some(h) = io.split.second_up() else {
            // Not wanted any more (merged, failed, or one is already there).
            conn.reader.abort();
            return;
        };
        // The marker goes behind every cell already handed to the first connection's writer.
        io.primary.send_var(CellCommand::HANDOFF, h.encode());
        io.secondary = Some(ConnIo::new(conn_id, conn));
        self.secondaries.insert(conn_id, chan);
        self.send.attach_conn(chan, conn_id);
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
        let Some(token) = io.split.wants_second(now) else {
            return;
        };
        // The peer's ORPort comes from the consensus, as for any relay link.
        let Some(addr) = self.relay_addrs.get(&peer).copied() else {
            return;
        };
        io.split.opening();
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
        if io.secondary.is_none() {
            return;
        }
        let Some(h) = io.split.merge() else {
            return;
        };
        let Some(s) = io.secondary.take() else {
            return;
        };
        s.send_var(CellCommand::HANDOFF, h.encode());
        self.secondaries.remove(&s.id);
        self.send.detach_conn(s.id);
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
            .filter(|(_, io)| io.split.bind_wait_over(now))
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
            match io.split.tick(self.split.mode, now) {
                Decision::Split => split.push(*chan),
                Decision::Merge => merge.push(*chan),
                Decision::Stay => {}
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
