//! The driver's IO tasks: a connection's reader and writer, a stream's socket, an exit's
//! connect, the signal handlers. They talk to the driver only through its input queue.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, EndReason, VarCell};
use chive_core::chansched::BatchClass;
use chive_core::{ChannelId, StreamHandle};
use chive_dir::ExitPolicy;
use chive_net::{
    BatchPool, DirectWriter, FramedProgress, Link, LinkLimits, LinkReader, LinkWriter,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::AbortHandle;
use tracing::{info, warn};

use super::watchdog::{bounded, LazyTimer};
use super::{Input, LinkUp};

/// Most cells a link reader hands the driver in one input (one 64 KiB read holds about 127).
pub(super) const READ_BATCH: usize = 128;

/// The input queue's cell budget, shared by every link reader of a driver: a batch holds one
/// permit per cell until the driver has handled it, so queued cells stay bounded however many
/// connections there are and however the queue's slots are used.
pub type CellBudget = Arc<Semaphore>;

/// Cells one connection may have waiting in the driver's input queue (one batch; the reader
/// decodes the next one meanwhile). A reader holds one permit per cell it queued and the
/// driver returns it when it has handled the cell, so a connection flooding cells (a CREATE2
/// flood, docs/security.md) has at most this many ahead of another connection's cell, instead
/// of the whole input queue: the others keep their latency.
pub const LINK_INPUT_CREDIT: usize = READ_BATCH;

/// Largest read from a stream socket: the core's whole read credit of a stream (128 cells,
/// about 62 KiB), so a download leaves an exit in pieces that size, not 16 KiB (session 26:
/// fewer syscalls at every hop). The reader never reads more than the credit it was granted.
const STREAM_READ_CHUNK: usize = chive_core::STREAM_BUFFER_TARGET;
/// Time allowed for an exit's DNS lookup and TCP connect.
pub(super) const EXIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Link liveness (relay and client options `LinkKeepalive`, `LinkIdleTimeout`): a peer that
/// keeps its TCP connection open but stops answering (SIGSTOP, a pulled cable, a NAT that
/// dropped its state) sends no FIN, so without this a link to it would look alive until the
/// kernel's retransmission timeout, and every circuit through it would stall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Write a PADDING cell on a link that wrote nothing for this long (`None`: never).
    pub keepalive: Option<Duration>,
    /// Close a link that read nothing for this long, or whose write made no progress for this
    /// long (`None`: never). Must exceed the peer's keepalive, or idle links close.
    pub idle_timeout: Option<Duration>,
}

/// `LinkKeepalive` default: within Tor's channel padding range (1.5–9.5 s), so an idle link
/// carries about 100 bytes/s.
pub const DEFAULT_LINK_KEEPALIVE: Duration = Duration::from_secs(5);
/// `LinkIdleTimeout` default: four keepalives missed. A stream on a circuit through a hung relay
/// fails after at most this long (plus the DESTROY's trip), instead of minutes.
pub const DEFAULT_LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            keepalive: Some(DEFAULT_LINK_KEEPALIVE),
            idle_timeout: Some(DEFAULT_LINK_IDLE_TIMEOUT),
        }
    }
}

impl Liveness {
    /// From the options' seconds (0 = off), checked: a timeout must be at least twice the
    /// keepalive, so one late keepalive does not close a live link.
    pub fn from_options(keepalive: u64, idle_timeout: u64) -> Result<Liveness, String> {
        if keepalive > 3600 {
            return Err("LinkKeepalive must be between 0 (off) and 3600 seconds".into());
        }
        if idle_timeout != 0 && !(2..=86_400).contains(&idle_timeout) {
            return Err("LinkIdleTimeout must be 0 (off) or between 2 and 86400 seconds".into());
        }
        if idle_timeout != 0 && keepalive != 0 && idle_timeout < 2 * keepalive {
            return Err(format!(
                "LinkIdleTimeout ({idle_timeout} s) must be at least twice LinkKeepalive \
                 ({keepalive} s), or a live but idle link is closed"
            ));
        }
        let secs = |s: u64| (s != 0).then(|| Duration::from_secs(s));
        Ok(Liveness {
            keepalive: secs(keepalive),
            idle_timeout: secs(idle_timeout),
        })
    }

    /// Run `io` (a read or a write), failing it if it makes no progress for the idle timeout.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        what: &str,
        io: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, String> {
        match self.idle_timeout {
            Some(t) => match tokio::time::timeout(t, io).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "peer presumed hung: no {what} for {} s (LinkIdleTimeout)",
                    t.as_secs()
                )),
            },
            None => io.await.map_err(|e| e.to_string()),
        }
    }
}

/// Write one batch of cells: framed ones sealed where they lie (going on from where the
/// driver's direct write left one, `begun`), others as they are. `paid`: the batch's
/// write-bucket tokens are taken.
async fn write_batch(
    writer: &mut LinkWriter,
    bytes: &mut [u8],
    cells: usize,
    framed: bool,
    paid: bool,
    begun: FramedProgress,
) -> Result<(), chive_net::LinkError> {
    match (framed, paid) {
        (true, _) => writer.write_framed_from(bytes, cells, paid, begun).await,
        (false, true) => writer.write_paid_wire(bytes).await,
        (false, false) => writer.write_wire(bytes).await,
    }
}

/// Commands for a stream's writer task.
pub enum StreamCmd {
    /// The payloads of `cells` DATA cells (one [`chive_core::Event::StreamWrite`]).
    Write {
        data: Vec<u8>,
        cells: u32,
    },
    Close,
}

/// The driver's side of one stream's socket.
pub struct StreamIo {
    pub(super) write_tx: mpsc::UnboundedSender<StreamCmd>,
    pub(super) credit_tx: mpsc::UnboundedSender<usize>,
    /// The socket's write half (once its IO runs), shared with the stream's writer task.
    out: Arc<StreamOut>,
    /// The IO tasks' ends, until the socket is ready.
    parked: Option<StreamEnds>,
}

/// What a stream's IO tasks take over from its [`StreamIo`] once the socket is ready
/// ([`spawn_stream_io`]).
pub struct StreamEnds {
    write_rx: mpsc::UnboundedReceiver<StreamCmd>,
    credit_rx: mpsc::UnboundedReceiver<usize>,
    out: Arc<StreamOut>,
}

/// A stream socket's write half, shared by the driver and the stream's writer task. The
/// driver writes a [`chive_core::Event::StreamWrite`] itself when the writer task holds no
/// earlier write (so the bytes stay in order) and the socket takes it whole: the write is
/// flushed within the driver turn that made it, and the stream SENDMEs it makes due leave
/// with the circuit SENDMEs of the same read (one link write instead of two or three:
/// docs/performance.md, "Task hops and syscalls"). Otherwise the writer task waits for room.
#[derive(Default)]
struct StreamOut {
    /// Set once, when the stream's IO starts.
    socket: std::sync::OnceLock<tokio::net::tcp::OwnedWriteHalf>,
    /// Write commands handed to the writer task and not yet in the kernel.
    queued: AtomicUsize,
}

impl StreamIo {
    /// Channels for a stream whose socket is not ready yet.
    pub fn parked() -> Self {
        let (write_tx, write_rx) = mpsc::unbounded_channel();
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
        let out = Arc::new(StreamOut::default());
        StreamIo {
            write_tx,
            credit_tx,
            out: out.clone(),
            parked: Some(StreamEnds {
                write_rx,
                credit_rx,
                out,
            }),
        }
    }

    /// Take the ends for the IO tasks.
    pub fn unpark(&mut self) -> Option<StreamEnds> {
        self.parked.take()
    }

    /// Write the payloads of `cells` DATA cells to the socket. Returns true if they are in the
    /// kernel now (the caller reports them flushed); false if the writer task has them (it
    /// reports them with [`Input::StreamFlushed`]): the socket is not ready yet, the writer
    /// task still holds an earlier write, or the socket took only part (or none) of them.
    pub(super) fn write(&self, mut data: Vec<u8>, cells: u32) -> bool {
        if self.out.queued.load(Ordering::Acquire) == 0 {
            if let Some(wr) = self.out.socket.get() {
                match wr.try_write(&data) {
                    Ok(n) if n == data.len() => return true,
                    // The rest waits for room in the writer task.
                    Ok(n) => drop(data.drain(..n)),
                    // Full, or failed: the writer task waits, or meets the error and reports it.
                    Err(_) => {}
                }
            }
        }
        self.out.queued.fetch_add(1, Ordering::AcqRel);
        // A gone writer task has its StreamError on the way, or the stream is closing.
        let _ = self.write_tx.send(StreamCmd::Write { data, cells });
        false
    }
}

/// Write all of `buf` to a shared write half, waiting for room.
async fn write_all_shared(
    wr: &tokio::net::tcp::OwnedWriteHalf,
    mut buf: &[u8],
) -> std::io::Result<()> {
    while !buf.is_empty() {
        wr.writable().await?;
        match wr.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a connection's writer task is given.
pub enum WriteMsg {
    /// A batch of cells as their wire bytes (`cells` fixed cells, encoded by the core straight
    /// from their queues: the writer hands them to TLS as they are), acknowledged with
    /// [`Input::Paid`] and [`Input::Written`]. A [`BatchClass::Quiet`] batch may spend the write
    /// bucket's reserve (`QuietReserve`), and so may every batch queued before it on the same
    /// connection (it cannot leave before them); a [`BatchClass::Bulk`] one may not.
    /// `sent_at`: when the driver handed it over (the writer measures how long it took to
    /// wake for it).
    /// `framed`: `bytes` has the room for the records around the cells
    /// ([`chive_net::LinkWriter::write_framed`]).
    /// `paced`: the send path counts the cells unpaid ([`chive_core::chansched::Transmit`]):
    /// the writer pays for them first and reports [`Input::Paid`]; otherwise it only writes
    /// (an unlimited bucket grants at once, without a lock or a clock read).
    /// `begun`: how far the driver's own write of the batch got ([`ConnHandles::send_batch`]):
    /// a sealed batch is not sealed again, and the writer writes only its rest.
    Cells {
        bytes: Vec<u8>,
        cells: usize,
        class: BatchClass,
        sent_at: Instant,
        framed: bool,
        paced: bool,
        begun: FramedProgress,
    },
    /// A variable-length link cell (HANDOFF), not acknowledged.
    Var(VarCell),
}

/// Shared by the driver and one connection's writer: how many quiet batches the writer holds
/// unpaid, and a wake-up for a batch waiting at the reserve ahead of them.
#[derive(Default)]
pub(super) struct QuietSignal {
    pub(super) queued: AtomicUsize,
    pub(super) wake: tokio::sync::Notify,
}

/// When the driver last wrote a batch on a link itself, read by the link's writer task: its
/// keepalive is due a period after the link's last write, whoever made it (without this a
/// link whose batches all go direct would get a PADDING cell every keepalive period).
struct DirectWrites {
    /// The clock this counts from.
    base: tokio::time::Instant,
    /// Nanoseconds from `base` to the last direct write (0: none yet).
    last: AtomicU64,
}

impl DirectWrites {
    fn new() -> Self {
        DirectWrites {
            base: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// A direct write at `at` (the driver's wake-up time: no clock read per batch).
    fn wrote(&self, at: Instant) {
        let since = tokio::time::Instant::from_std(at).saturating_duration_since(self.base);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        self.last.store(nanos, Ordering::Relaxed);
    }

    /// When the keepalive after the last direct write is due, if that is later than `now`.
    fn keepalive_after(
        &self,
        period: Duration,
        now: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        let last = self.base + Duration::from_nanos(self.last.load(Ordering::Relaxed));
        Some(last + period).filter(|due| *due > now)
    }
}

/// What became of a batch given to [`ConnHandles::send_batch`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BatchSent {
    /// In the kernel already, written by the driver: the caller reports it as the writer's
    /// [`Input::Written`] would (no `Written` comes for it).
    Written,
    /// The writer has it and reports it written.
    Queued,
    /// The writer is gone (its `LinkDown` is on the way).
    Gone,
}

/// Handles of one connection's IO tasks (see [`start_link`]).
pub struct ConnHandles {
    writer: mpsc::UnboundedSender<WriteMsg>,
    /// The driver's own handle on the link's records (own record layer only): it writes an
    /// unpaced batch itself while the writer holds nothing ([`ConnHandles::send_batch`]).
    direct: Option<DirectWriter>,
    /// What the writer holds: messages handed to it and not yet written, plus one while it
    /// writes a keepalive. Zero: nothing of the writer's can be cut or overtaken, and the
    /// writer waits for no socket room (a direct write's poll would replace its wake-up).
    held: Arc<AtomicUsize>,
    /// When the driver last wrote a batch itself, for the writer's keepalive (a link the
    /// driver keeps writing to needs no PADDING): [`DirectWrites`].
    direct_writes: Arc<DirectWrites>,
    /// Quiet batches handed to the writer and not yet paid.
    pub(super) quiet: Arc<QuietSignal>,
    pub(super) reader: AbortHandle,
    /// `true` pauses the reader (its cells would only be held back).
    pub(super) hold: watch::Sender<bool>,
    /// Starts the reader; the driver fires it when it takes the connection over (so no cell
    /// can overtake the connection's announcement) and hands it the cell budget and the pool
    /// of read buffers its batches travel in.
    pub(super) gate: Option<oneshot::Sender<(CellBudget, Arc<BatchPool>)>>,
}

impl ConnHandles {
    /// Hand a batch to the writer, or write it here: a framed, unpaced batch (no rate limit
    /// to pay) on an own-records link whose writer holds nothing is sealed and written by the
    /// caller's task at once if `may_direct` ([`DirectWriter::try_write_framed`]). That saves
    /// the hop to the writer's task and its `Written` back through the input queue, one of
    /// each per batch (docs/performance.md, "Task hops and syscalls"). What the socket does
    /// not take goes to the writer, sealed, ahead of anything sent later.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_batch(
        &self,
        mut bytes: Vec<u8>,
        cells: usize,
        class: BatchClass,
        sent_at: Instant,
        framed: bool,
        paced: bool,
        may_direct: bool,
    ) -> BatchSent {
        let mut begun = FramedProgress::default();
        if let Some(direct) = self.direct.as_ref().filter(|d| {
            may_direct
                && framed
                && !paced
                && !d.is_rate_limited()
                && self.held.load(Ordering::Acquire) == 0
        }) {
            // An error here is the writer's too: it meets it again and reports it.
            if let Ok(true) = direct.try_write_framed(&mut bytes, cells, &mut begun) {
                self.direct_writes.wrote(sent_at);
                return BatchSent::Written;
            }
        }
        if let BatchClass::Quiet { .. } = class {
            self.quiet.queued.fetch_add(1, Ordering::Relaxed);
            self.quiet.wake.notify_one();
        }
        self.held.fetch_add(1, Ordering::AcqRel);
        let msg = WriteMsg::Cells {
            bytes,
            cells,
            class,
            sent_at,
            framed,
            paced,
            begun,
        };
        if self.writer.send(msg).is_err() {
            return BatchSent::Gone;
        }
        BatchSent::Queued
    }

    /// Hand a variable-length link cell (HANDOFF) to the writer, behind what it holds.
    pub(super) fn send_var(&self, cell: VarCell) {
        self.held.fetch_add(1, Ordering::AcqRel);
        // A gone writer has its LinkDown on the way.
        let _ = self.writer.send(WriteMsg::Var(cell));
    }

    /// Let the reader start, drawing on `budget` and `pool` (once; later calls do nothing).
    pub(super) fn start_reader(&mut self, budget: &CellBudget, pool: &Arc<BatchPool>) {
        if let Some(gate) = self.gate.take() {
            // A reader already gone (aborted) has nothing to start.
            let _ = gate.send((budget.clone(), pool.clone()));
        }
    }
}

/// Split a finished link into reader and writer tasks and announce it.
pub async fn start_link(
    chan: ChannelId,
    link: Link,
    initiator: bool,
    limits: LinkLimits,
    liveness: Liveness,
    tx: mpsc::Sender<Input>,
) {
    let peer = link.peer_identity;
    let addr = link.peer_addr;
    let features = link.features;
    let bind_token = link.bind_token();
    let fd = link.raw_fd();
    let (reader, writer) = link.split(limits);
    let conn = spawn_conn(chan, reader, writer, liveness, tx.clone());
    // A driver that is gone drops the handles, and with them the reader's gate.
    let _ = tx
        .send(Input::LinkUp(LinkUp {
            chan,
            peer,
            initiator,
            addr,
            features,
            bind_token,
            fd,
            conn,
        }))
        .await;
}

/// Start connection `id`'s reader and writer tasks. The reader waits for the handles' gate,
/// fired by the driver once it has taken the connection over ([`ConnHandles::start_reader`]),
/// so that no cell can overtake the connection's announcement in the input queue.
pub(super) fn spawn_conn(
    id: ChannelId,
    mut reader: LinkReader,
    mut writer: LinkWriter,
    liveness: Liveness,
    tx: mpsc::Sender<Input>,
) -> ConnHandles {
    let (gate_tx, gate_rx) = oneshot::channel::<(CellBudget, Arc<BatchPool>)>();
    let (hold_tx, mut hold_rx) = watch::channel(false);
    let (wtx, mut wrx) = mpsc::unbounded_channel::<WriteMsg>();
    let direct = writer.direct();
    let held = Arc::new(AtomicUsize::new(0));
    let writer_held = held.clone();
    let direct_writes = Arc::new(DirectWrites::new());
    let writer_direct_writes = direct_writes.clone();
    let quiet = Arc::new(QuietSignal::default());
    let signal = quiet.clone();
    let rtx = tx.clone();
    let credit = Arc::new(tokio::sync::Semaphore::new(LINK_INPUT_CREDIT));
    let reader_task = tokio::spawn(async move {
        let Ok((budget, pool)) = gate_rx.await else {
            return;
        };
        // Every whole cell from one read goes to the driver in one input: one queue message
        // (and at most one wake-up of the driver) per read instead of one per cell. The cells
        // travel as their wire bytes, in the read buffer itself when there are many (the reader
        // goes on in a spare from `pool`), and are decoded where the driver hands them to the
        // core.
        let mut idle = LazyTimer::new(liveness.idle_timeout);
        let why = loop {
            // Paused while the driver holds this connection's cells back (split channels).
            if hold_rx.wait_for(|held| !*held).await.is_err() {
                return;
            }
            let read = bounded(
                &mut idle,
                liveness.idle_timeout,
                "cell from it",
                reader.read_cell_batch(READ_BATCH, Some(&pool)),
            )
            .await;
            match read {
                Ok(None) => break "closed by peer".to_string(),
                Ok(Some((bytes, n))) => {
                    // n <= READ_BATCH = LINK_INPUT_CREDIT, and READ_BATCH is far below the
                    // budget's size: both always complete.
                    let Ok(credit) = credit.clone().acquire_many_owned(n as u32).await else {
                        return;
                    };
                    let Ok(permit) = budget.clone().acquire_many_owned(n as u32).await else {
                        return;
                    };
                    let input = Input::Cells {
                        chan: id,
                        bytes,
                        cells: n,
                        permit,
                        credit,
                    };
                    if rtx.send(input).await.is_err() {
                        return;
                    }
                }
                Err(e) => break e,
            }
        };
        let _ = rtx.send(Input::LinkDown { chan: id, why }).await;
    });
    tokio::spawn(async move {
        let mut idle = LazyTimer::new(liveness.idle_timeout);
        let mut keep = LazyTimer::new(liveness.keepalive);
        // Set when the keepalive timer found a direct write within the period: the next
        // deadline is a period after that write, not after now.
        let mut keep_due = None;
        loop {
            // A batch sent after this waited for the writer's wake-up (the driver's reaction
            // latency includes it); one sent before was ready at once. Only a paced writer
            // reports it (one clock read per batch less on an unpaced link; the batch itself
            // says whether it is paced, the bucket only whether it may be).
            let waiting_since = writer.is_rate_limited().then(Instant::now);
            // `None`: nothing to write for a keepalive period.
            let msg = match liveness.keepalive {
                Some(k) => {
                    let due = keep_due
                        .take()
                        .unwrap_or_else(|| tokio::time::Instant::now() + k);
                    tokio::select! {
                        biased;
                        msg = wrx.recv() => Some(msg),
                        () = keep.until(due) => None,
                    }
                }
                None => Some(wrx.recv().await),
            };
            let Some(msg) = msg else {
                // The driver wrote on this link within the period: no PADDING yet.
                if let Some(due) = liveness.keepalive.and_then(|k| {
                    writer_direct_writes.keepalive_after(k, tokio::time::Instant::now())
                }) {
                    keep_due = Some(due);
                    continue;
                }
                // Tell the peer we are alive. Not paid for (514 bytes per keepalive period)
                // and not counted as a batch.
                let padding = Cell::new(0, CellCommand::PADDING, &[])
                    .expect("PADDING is a fixed-size command");
                // Held while it waits for room: the driver writes no batch meanwhile.
                writer_held.fetch_add(1, Ordering::AcqRel);
                let sent = bounded(
                    &mut idle,
                    liveness.idle_timeout,
                    "write progress",
                    writer.write_cells(&[padding]),
                )
                .await;
                writer_held.fetch_sub(1, Ordering::AcqRel);
                if let Err(why) = sent {
                    let _ = tx.send(Input::LinkDown { chan: id, why }).await;
                    return;
                }
                continue;
            };
            let Some(msg) = msg else {
                break;
            };
            let (result, n) = match msg {
                WriteMsg::Cells {
                    mut bytes,
                    cells,
                    class,
                    sent_at,
                    framed,
                    paced: true,
                    ..
                } => {
                    let since = waiting_since.map_or(sent_at, |w| sent_at.max(w));
                    let wake_lag = Instant::now().saturating_duration_since(since);
                    let quiet = matches!(class, BatchClass::Quiet { .. });
                    // Pay first and say so: from here on the batch waits only for the socket.
                    // A batch ahead of a quiet one may use the reserve too, or the quiet one
                    // would wait behind it for tokens above the reserve.
                    writer
                        .pay_for_cells(
                            cells,
                            || class.may_spend_reserve(signal.queued.load(Ordering::Relaxed)),
                            Some(&signal.wake),
                        )
                        .await;
                    if quiet {
                        signal.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    let paid = Input::Paid {
                        chan: id,
                        cells,
                        at: Instant::now(),
                        wake_lag,
                    };
                    if tx.send(paid).await.is_err() {
                        return;
                    }
                    let w = write_batch(
                        &mut writer,
                        &mut bytes,
                        cells,
                        framed,
                        true,
                        FramedProgress::default(),
                    );
                    (
                        bounded(&mut idle, liveness.idle_timeout, "write progress", w).await,
                        Some(cells),
                    )
                }
                WriteMsg::Cells {
                    mut bytes,
                    cells,
                    class,
                    framed,
                    begun,
                    ..
                } => {
                    if let BatchClass::Quiet { .. } = class {
                        // Unpaced: nothing to pay, but keep the count exact.
                        signal.queued.fetch_sub(1, Ordering::Relaxed);
                    }
                    let w = write_batch(&mut writer, &mut bytes, cells, framed, false, begun);
                    (
                        bounded(&mut idle, liveness.idle_timeout, "write progress", w).await,
                        Some(cells),
                    )
                }
                WriteMsg::Var(cell) => {
                    let w = writer.write_var_cell(&cell);
                    (
                        bounded(&mut idle, liveness.idle_timeout, "write progress", w).await,
                        None,
                    )
                }
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
            // In the kernel: the driver may write the next batch itself.
            writer_held.fetch_sub(1, Ordering::AcqRel);
            if let Some(cells) = n {
                if tx.send(Input::Written { chan: id, cells }).await.is_err() {
                    return;
                }
            }
        }
        // A hung peer must not keep this task (and the socket) forever.
        let _ = liveness.bounded("write progress", writer.shutdown()).await;
    });
    ConnHandles {
        writer: wtx,
        direct,
        held,
        direct_writes,
        quiet,
        reader: reader_task.abort_handle(),
        hold: hold_tx,
        gate: Some(gate_tx),
    }
}

/// Resolve, check the exit policy, connect.
pub(super) async fn exit_connect(
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
    connect(stream, addr).await
}

/// Connect `stream`'s TCP connection to `addr` within `EXIT_CONNECT_TIMEOUT`: an exit's last
/// step ([`exit_connect`]), and all an onion service does for its local target
/// (`HiddenServicePort`: no policy, no resolving).
pub(super) async fn connect(stream: StreamHandle, addr: SocketAddr) -> Input {
    let fail = |reason, why: String| Input::ExitFailed {
        stream,
        reason,
        why,
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
/// writer that reports each batch of writes back (the driver writes itself while the writer
/// holds none: [`StreamIo::write`]).
pub fn spawn_stream_io(
    stream: StreamHandle,
    tcp: TcpStream,
    ends: StreamEnds,
    tx: mpsc::Sender<Input>,
) {
    let StreamEnds {
        mut write_rx,
        mut credit_rx,
        out,
    } = ends;
    let (rd, wr) = tcp.into_split();
    // Set only here, once per stream (its ends are taken once).
    let _ = out.socket.set(wr);
    let rtx = tx.clone();
    tokio::spawn(async move {
        let mut credit = 0usize;
        loop {
            if credit == 0 {
                match credit_rx.recv().await {
                    Some(n) => credit += n,
                    None => return, // stream closed by the core
                }
                continue;
            }
            tokio::select! {
                more = credit_rx.recv() => match more {
                    Some(n) => credit += n,
                    None => return,
                },
                ready = rd.readable() => {
                    if let Err(e) = ready {
                        let _ = rtx.send(Input::StreamError { stream, why: e.to_string() }).await;
                        return;
                    }
                    // The buffer exists only once there is something to read (an idle stream
                    // holds none) and is handed to the driver as read (no copy).
                    let mut data = Vec::with_capacity(credit.min(STREAM_READ_CHUNK));
                    match rd.try_read_buf(&mut data) {
                        Ok(0) => {
                            let _ = rtx.send(Input::StreamEof { stream }).await;
                            return;
                        }
                        Ok(n) => {
                            credit -= n;
                            if rtx.send(Input::StreamData { stream, data }).await.is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => {
                            let _ = rtx.send(Input::StreamError { stream, why: e.to_string() }).await;
                            return;
                        }
                    }
                },
            }
        }
    });
    tokio::spawn(async move {
        let Some(wr) = out.socket.get() else {
            return; // set above
        };
        while let Some(cmd) = write_rx.recv().await {
            // `writes` counts cells (what the core's stream window takes back), `cmds` the
            // commands gathered into this write.
            let mut writes = 0u32;
            let mut cmds = 0usize;
            let mut close = false;
            let mut batch = Vec::new();
            let mut next = Some(cmd);
            while let Some(cmd) = next.take() {
                match cmd {
                    StreamCmd::Write { data, cells } => {
                        // The usual case is one command per wake-up (the core gathers a read
                        // batch's cells into one): written from its own buffer, no copy.
                        if batch.is_empty() {
                            batch = data;
                        } else {
                            batch.extend_from_slice(&data);
                        }
                        writes += cells;
                        cmds += 1;
                    }
                    StreamCmd::Close => {
                        close = true;
                        break;
                    }
                }
                if cmds < 128 {
                    next = write_rx.try_recv().ok();
                }
            }
            if cmds > 0 {
                if let Err(e) = write_all_shared(wr, &batch).await {
                    let _ = tx
                        .send(Input::StreamError {
                            stream,
                            why: e.to_string(),
                        })
                        .await;
                    return;
                }
                // In the kernel: the driver may write the next ones itself.
                out.queued.fetch_sub(cmds, Ordering::AcqRel);
                let _ = tx.send(Input::StreamFlushed { stream, writes }).await;
            }
            if close {
                break;
            }
        }
        // The write half shuts down (FIN) when its last holder drops it: this task and the
        // driver's `StreamIo`, which the driver removes when it closes the stream.
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

#[cfg(test)]
#[path = "tasks_direct_tests.rs"]
mod direct_tests;

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// The driver writes a stream's data itself while the writer task holds none (reported
    /// flushed at once), and hands it to the writer task while that one still holds earlier
    /// data (or the socket is not ready): the bytes arrive in order, each write reported once.
    #[tokio::test]
    async fn the_driver_writes_a_stream_itself_only_behind_nothing() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let stream = StreamHandle(1);
        let mut io = StreamIo::parked();
        let ends = io.unpark().unwrap();
        // Not connected yet: the writer task takes it.
        assert!(!io.write(b"a".to_vec(), 1));
        spawn_stream_io(stream, ours, ends, tx);
        // The writer task has not run: behind its write, this one goes to it too.
        assert!(!io.write(b"bc".to_vec(), 2));
        match rx.recv().await.unwrap() {
            Input::StreamFlushed { writes, .. } => assert_eq!(writes, 3),
            _ => panic!("expected StreamFlushed"),
        }
        // Nothing held: written at once, for the caller to report.
        assert!(io.write(b"def".to_vec(), 3));
        let mut got = [0u8; 6];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcdef");
        assert!(rx.try_recv().is_err(), "no second report");
    }
}
