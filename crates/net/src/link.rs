//! Links: a TCP connection + TLS 1.3 session on which the link handshake succeeded.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use chive_cell::{AnyCell, Cell, VarCell, CELL_LEN};
use chive_crypto::IdentityKey;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use crate::framing::{BatchPool, CellBatch, CellBuf, Fill};
use crate::handshake::{self, Role, BIND_EXPORTER_LABEL, EXPORTER_LABEL, EXPORTER_LEN};
use crate::record_stream::{self, RecordStream};
use crate::{tls, FeatureSet, LinkConfig, LinkError, RecordLayer, TokenBucket, HANDSHAKE_TIMEOUT};

/// Size of the socket read buffer under TLS: rustls itself reads only 4 KiB per call, so this
/// buffer is what makes one `read` syscall bring in many cells.
const SOCKET_READ_BUF: usize = 64 * 1024;
/// When writing through a token bucket, write at most this much per bucket grant, so a large
/// batch is paced smoothly instead of being sent in one burst after one long wait.
const PACED_WRITE_CHUNK: usize = 16 * 1024;

/// The transport under a link: TLS records by rustls or by this crate ([`RecordLayer`]).
enum Stream {
    Rustls(Box<TlsStream<BufReader<TcpStream>>>),
    Own(Box<RecordStream>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Rustls(s) => s.get_ref().0.get_ref(),
            Stream::Own(s) => s.tcp(),
        }
    }

    fn suite(&self) -> Option<rustls::SupportedCipherSuite> {
        match self {
            Stream::Rustls(s) => s.get_ref().1.negotiated_cipher_suite(),
            Stream::Own(s) => Some(s.suite()),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Rustls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Own(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Rustls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, data),
            Stream::Own(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Rustls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Own(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Rustls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Own(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One half of a split [`Stream`]. Both halves share the stream behind a mutex locked for one
/// poll at a time, as `tokio::io::split` does (the reader and the writer are separate tasks; on
/// a current-thread runtime the lock is never contended); unlike tokio's halves, the writer
/// can reach the own record layer to seal a framed batch where it lies
/// ([`LinkWriter::write_framed`]).
struct Half(Arc<std::sync::Mutex<Stream>>);

impl Half {
    fn pair(stream: Stream) -> (Half, Half) {
        let shared = Arc::new(std::sync::Mutex::new(stream));
        (Half(shared.clone()), Half(shared))
    }

    fn with<R>(&self, f: impl FnOnce(&mut Stream) -> R) -> R {
        // Poisoned only by a panic in a poll, which ends the task; the other half then sees
        // the stream as that poll left it, like any failed I/O.
        let mut stream = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut stream)
    }
}

impl AsyncRead for Half {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| std::pin::Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Half {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.with(|s| std::pin::Pin::new(s).poll_write(cx, data))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| std::pin::Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| std::pin::Pin::new(s).poll_shutdown(cx))
    }
}

/// An established, authenticated link to a peer.
pub struct Link {
    /// The peer's proven relay identity; `None` if the peer is an anonymous client.
    pub peer_identity: Option<IdentityKey>,
    /// The peer's socket address.
    pub peer_addr: SocketAddr,
    /// Negotiated link protocol version.
    pub version: u16,
    /// Negotiated features (intersection of both sides').
    pub features: FeatureSet,
    stream: Stream,
    /// Bytes the peer sent right after its handshake cells.
    rbuf: CellBuf,
    /// Keying material for binding a second connection to this one's channel.
    bind_token: [u8; EXPORTER_LEN],
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer_identity", &self.peer_identity)
            .field("peer_addr", &self.peer_addr)
            .field("version", &self.version)
            .field("features", &self.features)
            .finish_non_exhaustive()
    }
}

/// Optional token buckets applied to a link's traffic (usually shared by all links of a relay).
#[derive(Clone, Default, Debug)]
pub struct LinkLimits {
    /// Tokens consumed for bytes read.
    pub read_bucket: Option<Arc<TokenBucket>>,
    /// Tokens consumed for bytes written.
    pub write_bucket: Option<Arc<TokenBucket>>,
}

impl Link {
    /// 32 bytes of keying material exported from this link's TLS session with the label
    /// `"EXPORTER-chive-split-bind"` (no context). Both ends derive the same value and nobody
    /// else can, so a BIND cell carrying it on another connection proves that connection's
    /// sender is this link's peer (split-direction connections).
    pub fn bind_token(&self) -> [u8; 32] {
        self.bind_token
    }

    /// The TCP socket's file descriptor, for reading kernel queue sizes (SIOCOUTQ: bytes
    /// written but not yet sent) while the halves run in their tasks. Valid while the link is
    /// open; the caller must not close it.
    #[cfg(unix)]
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.tcp().as_raw_fd()
    }

    /// The TLS 1.3 suite this link negotiated (`TLS13_AES_128_GCM_SHA256` between chive peers).
    pub(crate) fn tls_suite(&self) -> Option<rustls::SupportedCipherSuite> {
        self.stream.suite()
    }

    /// Whether this link's records are sealed and opened by this crate
    /// ([`RecordLayer::Own`]).
    pub fn own_records(&self) -> bool {
        matches!(self.stream, Stream::Own(_))
    }

    /// Split into independent reader and writer halves (usable from different tasks).
    pub fn split(self, limits: LinkLimits) -> (LinkReader, LinkWriter) {
        let (rd, wr) = Half::pair(self.stream);
        (
            LinkReader {
                rd,
                buf: self.rbuf,
                bucket: limits.read_bucket,
            },
            LinkWriter {
                wr,
                // Relayed cells come encoded (`write_wire`); this one only holds keepalives
                // and variable-length cells, so it starts empty.
                out: Vec::new(),
                bucket: limits.write_bucket,
            },
        )
    }
}

/// The reading half of a [`Link`].
pub struct LinkReader {
    rd: Half,
    buf: CellBuf,
    bucket: Option<Arc<TokenBucket>>,
}

impl LinkReader {
    /// Next cell; `Ok(None)` on clean EOF. Reads in large chunks (≥ 32 KiB) into a buffer and
    /// decodes many cells per syscall; a malformed cell is an error (the caller closes the link
    /// with a logged reason).
    ///
    /// Cancel-safe (usable in `select!`): bytes already read stay buffered; at worst the read
    /// bucket is not charged for one chunk.
    pub async fn read_cell(&mut self) -> Result<Option<AnyCell>, LinkError> {
        loop {
            if let Some(cell) = self.buf.next_cell()? {
                return Ok(Some(cell));
            }
            if !self.fill_charged().await? {
                return Ok(None);
            }
        }
    }

    /// One more read into the buffer, charged to the read bucket; false on clean EOF. Charged
    /// after the read: the next read waits until the bucket has recovered, which bounds the
    /// average rate at the cost of at most one chunk of burst.
    async fn fill_charged(&mut self) -> Result<bool, LinkError> {
        match self.buf.fill(&mut self.rd).await? {
            Fill::Eof => Ok(false),
            Fill::Read(n) => {
                if let Some(bucket) = &self.bucket {
                    bucket.consume(n).await;
                }
                Ok(true)
            }
        }
    }
}

impl LinkReader {
    /// Up to `max` whole cells' wire bytes as a [`CellBatch`]: every whole cell already
    /// buffered, or, if none is, those of one more read (a read brings in up to 64 KiB, so a
    /// busy link yields about 127 cells per call), and how many. The caller decodes each cell
    /// where it is used ([`chive_cell::decode_cell`] over the batch yields exactly these cells).
    /// A batch of many cells is the read buffer itself, handed over (the reader continues in a
    /// spare buffer from `pool`, and the batch goes back to the pool when dropped), so the
    /// cells are not copied between the read and their handler. `None`: clean EOF; `max` 0
    /// returns an empty batch at once. Cancel-safe like [`LinkReader::read_cell`].
    pub async fn read_cell_batch(
        &mut self,
        max: usize,
        pool: Option<&Arc<BatchPool>>,
    ) -> Result<Option<(CellBatch, usize)>, LinkError> {
        if max == 0 {
            return Ok(Some((CellBatch::copied(Vec::new()), 0)));
        }
        loop {
            if let Some(batch) = self.buf.take_batch(max, pool) {
                return Ok(Some(batch));
            }
            if !self.fill_charged().await? {
                return Ok(None);
            }
        }
    }
}

impl std::fmt::Debug for LinkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkReader").finish_non_exhaustive()
    }
}

/// The writing half of a [`Link`].
pub struct LinkWriter {
    wr: Half,
    /// Reused encoding buffer for [`LinkWriter::write_cells`] and variable-length cells.
    out: Vec<u8>,
    bucket: Option<Arc<TokenBucket>>,
}

impl LinkWriter {
    /// Encode all cells into one buffer and write them with as few syscalls as possible, then
    /// flush.
    ///
    /// Not cancel-safe: if the future is dropped midway, part of the batch may have been sent
    /// and the link must be closed.
    pub async fn write_cells(&mut self, cells: &[Cell]) -> Result<(), LinkError> {
        self.out.clear();
        for cell in cells {
            cell.encode_into(&mut self.out);
        }
        self.send_out().await
    }

    /// Whether the write bucket, if any, limits the rate now (it may change at SIGHUP).
    pub fn is_rate_limited(&self) -> bool {
        self.bucket.as_ref().is_some_and(|b| !b.is_unlimited())
    }

    /// Take the tokens for `cells` cells from the write bucket (if any) without writing:
    /// a caller that pays first and then calls [`LinkWriter::write_paid_wire`] learns when a
    /// batch stops waiting for the rate limit and starts waiting for the socket. While
    /// `quiet()` is false the batch leaves the bucket's reserve alone (see
    /// [`TokenBucket::consume_classed`]).
    pub async fn pay_for_cells(
        &self,
        cells: usize,
        quiet: impl Fn() -> bool,
        wake: Option<&tokio::sync::Notify>,
    ) {
        if let Some(bucket) = &self.bucket {
            for chunk in (0..cells * CELL_LEN).step_by(PACED_WRITE_CHUNK) {
                bucket
                    .consume_classed(
                        PACED_WRITE_CHUNK.min(cells * CELL_LEN - chunk),
                        &quiet,
                        wake,
                    )
                    .await;
            }
        }
    }

    /// Write cells already encoded (whole cells, as [`Cell::encode_into`] writes them: the
    /// driver's batches come encoded from the core's queues) and flush, charging the bucket
    /// like [`LinkWriter::write_cells`]. The bytes go to TLS as they are: no copy here.
    ///
    /// Not cancel-safe, like [`LinkWriter::write_cells`].
    pub async fn write_wire(&mut self, wire: &[u8]) -> Result<(), LinkError> {
        write_all_flush(&mut self.wr, self.bucket.as_ref(), wire).await
    }

    /// [`LinkWriter::write_wire`] for a batch already paid with [`LinkWriter::pay_for_cells`].
    pub async fn write_paid_wire(&mut self, wire: &[u8]) -> Result<(), LinkError> {
        write_all_flush(&mut self.wr, None, wire).await
    }

    /// A handle for writing framed batches from outside this writer's task
    /// ([`DirectWriter`]); `None` under rustls (its records are not sealed where they lie).
    pub fn direct(&self) -> Option<DirectWriter> {
        let own = self.wr.with(|s| matches!(s, Stream::Own(_)));
        own.then(|| DirectWriter {
            wr: Half(self.wr.0.clone()),
            bucket: self.bucket.clone(),
        })
    }

    /// Write a batch of `cells` cells encoded with room for the records around them
    /// ([`crate::framed_len`]: [`crate::RECORD_HEAD`] bytes before and [`crate::RECORD_TAIL`]
    /// after every [`crate::CELLS_PER_RECORD`] cells), and flush. With the own record layer
    /// the records are sealed in that room, where the cells lie: no copy into a record buffer.
    /// Under rustls the cells are written without the room. `paid`: the batch's tokens are
    /// taken ([`LinkWriter::pay_for_cells`]); otherwise the bucket, if any, is charged first.
    ///
    /// Not cancel-safe, like [`LinkWriter::write_cells`].
    pub async fn write_framed(
        &mut self,
        framed: &mut [u8],
        cells: usize,
        paid: bool,
    ) -> Result<(), LinkError> {
        self.write_framed_from(framed, cells, paid, FramedProgress::default())
            .await
    }

    /// [`LinkWriter::write_framed`] for a batch a [`DirectWriter`] began: it goes on from
    /// where `progress` stands (a sealed batch is not sealed again, and its bytes already in
    /// the socket are not written again). A begun batch is not charged to the bucket (the
    /// direct path takes only batches it need not charge).
    pub async fn write_framed_from(
        &mut self,
        framed: &mut [u8],
        cells: usize,
        paid: bool,
        progress: FramedProgress,
    ) -> Result<(), LinkError> {
        check_framed(framed, cells)?;
        let begun = progress.0.sealed();
        if let Some(bucket) = self
            .bucket
            .as_ref()
            .filter(|b| !paid && !begun && !b.is_unlimited())
        {
            // As `write_wire` charges: the cells' bytes, in `PACED_WRITE_CHUNK` slices.
            for chunk in (0..cells * CELL_LEN).step_by(PACED_WRITE_CHUNK) {
                bucket
                    .consume(PACED_WRITE_CHUNK.min(cells * CELL_LEN - chunk))
                    .await;
            }
        }
        let plain = crate::CELLS_PER_RECORD * CELL_LEN;
        let mut st = progress.0;
        let own = std::future::poll_fn(|cx| {
            self.wr.with(|s| match s {
                Stream::Own(r) => r
                    .poll_write_framed(cx, framed, plain, &mut st)
                    .map(|r| r.map(|()| true)),
                Stream::Rustls(_) => std::task::Poll::Ready(Ok(false)),
            })
        })
        .await?;
        if !own {
            let (head, tail) = (crate::RECORD_HEAD, crate::RECORD_TAIL);
            for record in framed.chunks(head + plain + tail) {
                let end = record.len().saturating_sub(tail);
                self.wr
                    .write_all(record.get(head..end).unwrap_or_default())
                    .await?;
            }
        }
        self.wr.flush().await?;
        Ok(())
    }

    /// Seal a KeyUpdate of ours now (tests: it waits in the send buffer, ahead of the next
    /// batch, as one due at the key's limit does).
    #[cfg(test)]
    pub(crate) fn force_key_update(&self) {
        self.wr.with(|s| match s {
            Stream::Own(r) => r.send_key_update(false).unwrap(),
            Stream::Rustls(_) => panic!("not an own-records link"),
        })
    }

    /// Write one variable-length cell and flush.
    pub async fn write_var_cell(&mut self, cell: &VarCell) -> Result<(), LinkError> {
        self.out.clear();
        cell.encode_into(&mut self.out)?;
        self.send_out().await
    }

    /// Send TLS close_notify and shut down the sending direction of the TCP connection.
    pub async fn shutdown(&mut self) -> Result<(), LinkError> {
        self.wr.shutdown().await?;
        Ok(())
    }

    async fn send_out(&mut self) -> Result<(), LinkError> {
        self.write_out(true).await
    }

    /// Write `out` (charging the bucket, if any, when `pace`), flush, and trim the buffer.
    async fn write_out(&mut self, pace: bool) -> Result<(), LinkError> {
        let bucket = self.bucket.as_ref().filter(|_| pace);
        write_all_flush(&mut self.wr, bucket, &self.out).await?;
        // Do not keep a huge buffer around after one exceptional batch.
        if self.out.capacity() > 64 * 1024 {
            self.out = Vec::new();
        }
        Ok(())
    }
}

/// Write `data` to TLS (in [`PACED_WRITE_CHUNK`] slices, each charged to `bucket` first, if
/// any) and flush.
async fn write_all_flush(
    wr: &mut Half,
    bucket: Option<&Arc<TokenBucket>>,
    data: &[u8],
) -> Result<(), LinkError> {
    // An unlimited bucket grants everything: one write, not one per slice.
    match bucket.filter(|b| !b.is_unlimited()) {
        None => wr.write_all(data).await?,
        Some(bucket) => {
            for chunk in data.chunks(PACED_WRITE_CHUNK) {
                bucket.consume(chunk.len()).await;
                wr.write_all(chunk).await?;
            }
        }
    }
    wr.flush().await?;
    Ok(())
}

fn check_framed(framed: &[u8], cells: usize) -> Result<(), LinkError> {
    if framed.len() != crate::framed_len(cells) {
        return Err(LinkError::Protocol(format!(
            "framed batch of {} bytes for {cells} cells",
            framed.len()
        )));
    }
    Ok(())
}

/// How far a framed batch got ([`DirectWriter::try_write_framed`]): whether it is sealed, and
/// how many of its bytes the socket took. [`LinkWriter::write_framed_from`] goes on from there.
#[derive(Debug, Default)]
pub struct FramedProgress(record_stream::FramedWrite);

impl FramedProgress {
    /// Whether the batch is sealed (its bytes must not change, nor be sealed again).
    pub fn sealed(&self) -> bool {
        self.0.sealed()
    }
}

/// A third handle on an own-records link's stream (besides its reader and writer), for the
/// node's driver to write a framed batch itself, without the hop to the writer's task, when
/// the socket has room ([`DirectWriter::try_write_framed`]).
///
/// The caller keeps the order: it writes directly only while the writer holds nothing (no
/// batch or variable-length cell handed to it and not yet written, no keepalive under way),
/// and hands the rest of a batch the socket did not take whole to the writer, ahead of
/// anything else. A write the writer's task had begun would otherwise be cut, and its task's
/// wake-up for socket room replaced by this call's (which wakes nobody).
pub struct DirectWriter {
    wr: Half,
    bucket: Option<Arc<TokenBucket>>,
}

impl DirectWriter {
    /// Whether the write bucket, if any, limits the rate now: a batch it should pay for goes
    /// through the writer.
    pub fn is_rate_limited(&self) -> bool {
        self.bucket.as_ref().is_some_and(|b| !b.is_unlimited())
    }

    /// Seal and write a framed batch ([`LinkWriter::write_framed`]'s layout) as far as the
    /// socket takes it now, without waiting: records sealed before (a KeyUpdate, a keepalive)
    /// go first, then the batch, sealed where it lies by the same code as the writer's.
    /// `Ok(true)`: all of it is in the kernel. `Ok(false)`: not all, and `progress` says how
    /// far it got; the caller hands the batch and `progress` to the writer
    /// ([`LinkWriter::write_framed_from`]). An error is the writer's too: the caller hands the
    /// batch over the same way and the writer meets the error again and reports it.
    pub fn try_write_framed(
        &self,
        framed: &mut [u8],
        cells: usize,
        progress: &mut FramedProgress,
    ) -> Result<bool, LinkError> {
        use std::future::Future;
        check_framed(framed, cells)?;
        let plain = crate::CELLS_PER_RECORD * CELL_LEN;
        // Polled once with a waker that wakes nobody: `Pending` only says the socket is full
        // (the writer's task then polls with its own waker). Unconstrained, so that tokio's
        // cooperative budget of the calling task cannot make a socket with room look full.
        let write = tokio::task::unconstrained(std::future::poll_fn(|cx| {
            self.wr.with(|s| match s {
                Stream::Own(r) => r.poll_write_framed(cx, framed, plain, &mut progress.0),
                // `direct` gives no handle on a rustls link.
                Stream::Rustls(_) => std::task::Poll::Ready(Err(std::io::Error::other(
                    "direct write on a rustls link",
                ))),
            })
        }));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(write).poll(&mut cx) {
            std::task::Poll::Ready(r) => r.map(|()| true).map_err(LinkError::from),
            std::task::Poll::Pending => Ok(false),
        }
    }
}

impl std::fmt::Debug for DirectWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectWriter").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LinkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkWriter").finish_non_exhaustive()
    }
}

/// Listens for incoming links (relays only: the responder always authenticates).
pub struct LinkListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    server_config: Arc<rustls::ServerConfig>,
    cfg: Arc<LinkConfig>,
    local_addr: SocketAddr,
}

impl std::fmt::Debug for LinkListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkListener")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl LinkListener {
    /// Bind a TCP listener and create this listener's throwaway TLS certificate. Fails if `cfg`
    /// has no identity.
    pub async fn bind(addr: SocketAddr, cfg: Arc<LinkConfig>) -> Result<Self, LinkError> {
        if cfg.identity.is_none() {
            return Err(LinkError::Config(
                "accepting links requires a relay identity".into(),
            ));
        }
        let server_config = tls::server_config()?;
        let acceptor = TlsAcceptor::from(server_config.clone());
        let socket = new_socket(addr, cfg.socket_buffer)?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // Accepted sockets inherit the listener's buffer sizes.
        let tcp = socket.listen(1024)?;
        let local_addr = tcp.local_addr()?;
        Ok(LinkListener {
            tcp,
            acceptor,
            server_config,
            cfg,
            local_addr,
        })
    }

    /// The bound address (useful after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Accept a TCP connection (fast). The TLS + link handshake is done by
    /// [`Accepting::handshake`], so a slow or hostile peer never blocks the accept loop.
    pub async fn accept(&self) -> Result<Accepting, LinkError> {
        let (tcp, peer_addr) = self.tcp.accept().await?;
        Ok(Accepting {
            tcp,
            peer_addr,
            acceptor: self.acceptor.clone(),
            server_config: self.server_config.clone(),
            cfg: self.cfg.clone(),
        })
    }
}

/// An accepted TCP connection whose handshakes have not run yet.
pub struct Accepting {
    tcp: TcpStream,
    peer_addr: SocketAddr,
    acceptor: TlsAcceptor,
    server_config: Arc<rustls::ServerConfig>,
    cfg: Arc<LinkConfig>,
}

impl std::fmt::Debug for Accepting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepting")
            .field("peer_addr", &self.peer_addr)
            .finish_non_exhaustive()
    }
}

impl Accepting {
    /// The remote address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// Run the TLS handshake and the link handshake as responder, within [`HANDSHAKE_TIMEOUT`].
    pub async fn handshake(self) -> Result<Link, LinkError> {
        self.handshake_within(HANDSHAKE_TIMEOUT).await
    }

    /// [`Accepting::handshake`] within `limit`: [`LinkError::Timeout`] once it has passed.
    pub async fn handshake_within(self, limit: std::time::Duration) -> Result<Link, LinkError> {
        let Accepting {
            tcp,
            peer_addr,
            acceptor,
            server_config,
            cfg,
        } = self;
        let fut = async move {
            tune_link_socket(&tcp, &cfg)?;
            let (stream, exporter, bind_token) = match cfg.record_layer {
                RecordLayer::Rustls => {
                    let io = prepare(tcp)?;
                    let tls = acceptor.accept(io).await.map_err(tls_err)?;
                    let (exporter, bind) = exporters(std::ops::Deref::deref(tls.get_ref().1))?;
                    (
                        Stream::Rustls(Box::new(TlsStream::from(tls))),
                        exporter,
                        bind,
                    )
                }
                RecordLayer::Own => {
                    tcp.set_nodelay(true)?;
                    let (s, exporter, bind) = record_stream::accept(tcp, &server_config).await?;
                    (Stream::Own(Box::new(s)), exporter, bind)
                }
            };
            finish(
                stream,
                peer_addr,
                Role::Responder,
                &cfg,
                (&exporter, bind_token),
                None,
            )
            .await
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| LinkError::Timeout)?
    }
}

/// Open a link to `addr` as initiator, within [`HANDSHAKE_TIMEOUT`] (TCP, TLS and link
/// handshake). If `expected_identity` is set, the responder must prove exactly that identity.
/// With `cfg.identity` set we authenticate too (relay to relay); otherwise we stay anonymous.
pub async fn connect(
    addr: SocketAddr,
    expected_identity: Option<IdentityKey>,
    cfg: &LinkConfig,
) -> Result<Link, LinkError> {
    connect_from(None, addr, expected_identity, cfg).await
}

/// [`connect`] from local address `local` (any port), e.g. another loopback address so that
/// a test's clients have distinct source addresses; `None` lets the kernel choose.
pub async fn connect_from(
    local: Option<std::net::IpAddr>,
    addr: SocketAddr,
    expected_identity: Option<IdentityKey>,
    cfg: &LinkConfig,
) -> Result<Link, LinkError> {
    let fut = async {
        let socket = new_socket(addr, cfg.socket_buffer)?;
        if let Some(ip) = local {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let tcp = socket.connect(addr).await?;
        tune_link_socket(&tcp, cfg)?;
        let (stream, exporter, bind_token) = match cfg.record_layer {
            RecordLayer::Rustls => {
                let io = prepare(tcp)?;
                let connector = TlsConnector::from(client_config()?);
                let tls = connector
                    .connect(tls::server_name(addr), io)
                    .await
                    .map_err(tls_err)?;
                let (exporter, bind) = exporters(std::ops::Deref::deref(tls.get_ref().1))?;
                (
                    Stream::Rustls(Box::new(TlsStream::from(tls))),
                    exporter,
                    bind,
                )
            }
            RecordLayer::Own => {
                tcp.set_nodelay(true)?;
                let config = client_config()?;
                let (s, exporter, bind) =
                    record_stream::connect(tcp, &config, tls::server_name(addr)).await?;
                (Stream::Own(Box::new(s)), exporter, bind)
            }
        };
        finish(
            stream,
            addr,
            Role::Initiator,
            cfg,
            (&exporter, bind_token),
            expected_identity,
        )
        .await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, fut)
        .await
        .map_err(|_| LinkError::Timeout)?
}

/// The client TLS config is the same for every link; build it once.
fn client_config() -> Result<Arc<rustls::ClientConfig>, LinkError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| tls::client_config().map_err(|e| e.to_string()))
        .clone()
        .map_err(LinkError::Tls)
}

/// The TLS session's keying material for link authentication and for BIND tokens (both
/// ends derive the same values; distinct labels keep them independent).
fn exporters<D>(
    conn: &rustls::ConnectionCommon<D>,
) -> Result<([u8; EXPORTER_LEN], [u8; EXPORTER_LEN]), LinkError> {
    let export = |label: &[u8]| {
        conn.export_keying_material([0u8; EXPORTER_LEN], label, None)
            .map_err(|e| LinkError::Tls(e.to_string()))
    };
    Ok((export(EXPORTER_LABEL)?, export(BIND_EXPORTER_LABEL)?))
}

/// A TCP socket for `addr`'s family with the configured buffer sizes (set before
/// connect/listen, so the TCP window is negotiated with them).
pub(crate) fn new_socket(
    addr: SocketAddr,
    buffer: Option<u32>,
) -> Result<tokio::net::TcpSocket, LinkError> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(size) = buffer {
        socket.set_send_buffer_size(size)?;
        socket.set_recv_buffer_size(size)?;
        // Accepted sockets inherit this from the listener, and it caps the MSS advertised in
        // the SYN, so both directions use it.
        socket2::SockRef::from(&socket).set_tcp_mss(constrained_mss(size))?;
    }
    Ok(socket)
}

/// The segment size for a link socket whose buffers are `buffer` bytes: small enough that the
/// receive window always holds several segments. With a window smaller than about two
/// segments, Linux's silly-window avoidance on both ends (the receiver advertises whole
/// segments, the sender will not send less than one into a window it thinks too small) leaves
/// the sender waiting for zero-window probes that back off exponentially: on loopback (MSS
/// 65483) a 10 kB buffer stalled relay links for seconds to tens of seconds. Ethernet-sized
/// segments at most; never below TCP's 536-byte minimum.
pub(crate) fn constrained_mss(buffer: u32) -> u32 {
    (buffer / 8).clamp(536, 1460)
}

/// The per-connection socket options of `cfg` (unsent limit, congestion control), set on
/// each connected socket rather than inherited from the listener, so both ends of every link
/// have them whatever the kernel copies at accept.
pub(crate) fn tune_link_socket(tcp: &TcpStream, cfg: &LinkConfig) -> Result<(), LinkError> {
    let limit = match (cfg.unsent_limit, cfg.unsent_rtt_rate) {
        (Some(base), Some(per)) => {
            use std::os::fd::AsRawFd;
            Some(rtt_scaled_unsent(
                base,
                per.rate,
                per.max,
                (per.probe)(tcp.as_raw_fd()),
            ))
        }
        (limit, _) => limit,
    };
    limit_unsent(tcp, limit)?;
    if let Some(name) = &cfg.congestion_control {
        set_congestion_control(tcp, name)?;
    }
    Ok(())
}

/// Whether link sockets may use congestion control `name`, tried on a throwaway socket, so a
/// relay refuses a bad `LinkCongestionControl` at start instead of failing every link.
pub fn check_congestion_control(name: &str) -> Result<(), LinkError> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    set_congestion_control(&socket, name)
}

/// Set TCP_CONGESTION; the kernel refuses an algorithm it does not have (or, without
/// CAP_NET_ADMIN, one not in `net.ipv4.tcp_allowed_congestion_control`).
fn set_congestion_control<S: std::os::fd::AsFd>(socket: &S, name: &str) -> Result<(), LinkError> {
    socket2::SockRef::from(socket)
        .set_tcp_congestion(name.as_bytes())
        .map_err(|e| {
            LinkError::Config(format!(
                "congestion control {name:?}: {e} (see /proc/sys/net/ipv4/tcp_available_congestion_control)"
            ))
        })
}

/// TCP_NOTSENT_LOWAT for a link under a rate ([`LinkConfig::unsent_rtt_rate`]): `base` plus
/// `rate` bytes/s for twice `rtt` (none known: `base`), at most `max` (and never below
/// `base`). On loopback that is `base`; over a 60 ms round trip at 500 kB/s, 5000 + 60000
/// bytes.
pub fn rtt_scaled_unsent(base: u32, rate: u64, max: u32, rtt: Option<std::time::Duration>) -> u32 {
    let extra = rtt.map_or(0, |rtt| {
        (u128::from(rate) * 2 * rtt.as_micros() / 1_000_000).min(u128::from(u32::MAX))
    });
    (u128::from(base) + extra).min(u128::from(max.max(base))) as u32
}

/// Set TCP_NOTSENT_LOWAT (see [`LinkConfig::unsent_limit`]).
pub(crate) fn limit_unsent(tcp: &TcpStream, limit: Option<u32>) -> Result<(), LinkError> {
    if let Some(bytes) = limit {
        socket2::SockRef::from(tcp).set_tcp_notsent_lowat(bytes)?;
    }
    Ok(())
}

fn prepare(tcp: TcpStream) -> Result<BufReader<TcpStream>, LinkError> {
    // Cells are latency-sensitive and we already batch writes ourselves: Nagle would only add
    // delay to the last partial segment of each batch.
    tcp.set_nodelay(true)?;
    Ok(BufReader::with_capacity(SOCKET_READ_BUF, tcp))
}

/// tokio-rustls reports TLS failures as io::Errors; classify them as TLS errors.
fn tls_err(e: std::io::Error) -> LinkError {
    LinkError::Tls(e.to_string())
}

async fn finish(
    mut stream: Stream,
    peer_addr: SocketAddr,
    role: Role,
    cfg: &LinkConfig,
    (exporter, bind_token): (&[u8; EXPORTER_LEN], [u8; EXPORTER_LEN]),
    expected: Option<IdentityKey>,
) -> Result<Link, LinkError> {
    let mut rbuf = CellBuf::new();
    let n = handshake::run(&mut stream, &mut rbuf, role, cfg, exporter, expected).await?;
    let link = Link {
        peer_identity: n.peer_identity,
        peer_addr,
        version: n.version,
        features: n.features,
        stream,
        rbuf,
        bind_token,
    };
    tracing::debug!(
        %peer_addr, ?role, version = n.version, features = n.features.0,
        peer = ?n.peer_identity, suite = ?link.tls_suite(), own_records = link.own_records(),
        "link handshake complete"
    );
    Ok(link)
}
