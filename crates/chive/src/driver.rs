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

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::{AnyCell, Cell, EndReason, ResolvedAnswer};
use chive_core::{CellSample, ChannelId, Core, Event, SchedulerKind, StreamHandle};
use chive_crypto::IdentityKey;
use chive_dir::ExitPolicy;
use chive_net::{Link, LinkConfig, LinkLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use crate::client::ClientState;

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
        writer: mpsc::UnboundedSender<Vec<Cell>>,
        reader: AbortHandle,
    },
    /// Opening a link to `identity` failed.
    ConnectFailed { identity: IdentityKey, why: String },
    /// A cell arrived.
    Cell { chan: ChannelId, cell: AnyCell },
    /// A link's writer finished writing `cells` cells.
    Written { chan: ChannelId, cells: usize },
    /// A link closed or failed.
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

struct ChanIo {
    writer: mpsc::UnboundedSender<Vec<Cell>>,
    reader: AbortHandle,
    in_flight: usize,
    /// Batches handed to the writer, oldest first, with their sampled cells.
    batches: VecDeque<(usize, Vec<CellSample>)>,
    /// The output buffer is full and cells are waiting (counted once per episode).
    blocked: bool,
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
                    if let Some(m) = self.metrics.as_mut() {
                        let outbufs: Vec<(u64, usize)> =
                            self.chans.iter().map(|(c, io)| (c.0, io.in_flight)).collect();
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
                writer,
                reader,
            } => {
                self.chans.insert(
                    chan,
                    ChanIo {
                        writer,
                        reader,
                        in_flight: 0,
                        batches: VecDeque::new(),
                        blocked: false,
                    },
                );
                self.core.channel_opened(chan, peer, initiator, now);
            }
            Input::ConnectFailed { identity, why } => {
                warn!(peer = %identity, %why, "connect failed");
                self.core.connect_failed(identity, now);
            }
            Input::Cell { chan, cell } => match cell {
                AnyCell::Fixed(cell) => self.core.handle_cell(chan, cell, now),
                AnyCell::Var(cell) => self.core.handle_var_cell(chan, cell, now),
            },
            Input::Written { chan, cells } => {
                if let Some(io) = self.chans.get_mut(&chan) {
                    io.in_flight = io.in_flight.saturating_sub(cells);
                    // The writer reports whole batches, in order.
                    if let Some((_, samples)) = io.batches.pop_front() {
                        if let Some(m) = self.metrics.as_mut() {
                            m.cells_written(samples, now);
                        }
                    }
                }
                self.transmit(chan, now);
            }
            Input::LinkDown { chan, why } => {
                if let Some(io) = self.chans.remove(&chan) {
                    info!(?chan, %why, "link closed");
                    io.reader.abort();
                }
                self.core.channel_closed(chan, now);
            }
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
    }

    /// Move cells to a link's writer while it has room.
    fn transmit(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let room = self.cfg.outbuf_cells.saturating_sub(io.in_flight);
        if room == 0 {
            if !io.blocked && self.core.has_pending(chan) {
                io.blocked = true;
                if let Some(m) = self.metrics.as_mut() {
                    m.outbuf_full_events += 1;
                }
            }
            return;
        }
        io.blocked = false;
        let mut cells = Vec::with_capacity(room.min(64));
        let n = self.core.poll_transmit(chan, room, now, &mut cells);
        if n > 0 {
            io.in_flight += n;
            let mut samples = Vec::new();
            while let Some(s) = self.core.poll_cell_sample() {
                samples.push(s);
            }
            io.batches.push_back((n, samples));
            if io.writer.send(cells).is_err() {
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
                if let Some(io) = self.chans.remove(&chan) {
                    io.reader.abort();
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

/// Split a finished link into reader and writer tasks and announce it.
pub async fn start_link(
    chan: ChannelId,
    link: Link,
    initiator: bool,
    limits: LinkLimits,
    tx: mpsc::Sender<Input>,
) {
    let peer = link.peer_identity;
    let (mut reader, mut writer) = link.split(limits);
    let (wtx, mut wrx) = mpsc::unbounded_channel::<Vec<Cell>>();
    let rtx = tx.clone();
    let reader_task = tokio::spawn(async move {
        let why = loop {
            match reader.read_cell().await {
                Ok(Some(cell)) => {
                    if rtx.send(Input::Cell { chan, cell }).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break "closed by peer".to_string(),
                Err(e) => break e.to_string(),
            }
        };
        let _ = rtx.send(Input::LinkDown { chan, why }).await;
    });
    let wtx_status = tx.clone();
    tokio::spawn(async move {
        while let Some(cells) = wrx.recv().await {
            let n = cells.len();
            if let Err(e) = writer.write_cells(&cells).await {
                let _ = wtx_status
                    .send(Input::LinkDown {
                        chan,
                        why: format!("write failed: {e}"),
                    })
                    .await;
                return;
            }
            if wtx_status
                .send(Input::Written { chan, cells: n })
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let _ = tx
        .send(Input::LinkUp {
            chan,
            peer,
            initiator,
            writer: wtx,
            reader: reader_task.abort_handle(),
        })
        .await;
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
