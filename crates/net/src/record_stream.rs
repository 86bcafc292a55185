//! A link's TCP connection under the own record layer (`LinkRecordLayer = own`): rustls's
//! unbuffered API runs the TLS handshake over the socket, its secrets are extracted into a
//! [`RecordSealer`] / [`RecordOpener`] pair and rustls's `KernelConnection` (the key schedule
//! for KeyUpdates), and [`RecordStream`] then reads and writes records itself. rustls is shown
//! the received records one at a time and none after its handshake's last, so every record
//! after it (even one that came in the same read) is the record layer's. The stream is generic
//! over its transport (a `TcpStream` in the relay; the `record_handover` fuzz target drives it
//! over an in-memory wire against a scripted rustls peer).
//!
//! Copies of a relayed byte: in, kernel → the caller's buffer (the link's `CellBuf`: the `read`
//! syscall), where each record is opened with its plaintext moved right after the last one's
//! (ring decrypts to the shifted place; only the start of a record left at the end of a read is
//! copied aside for the next); out, a framed batch of cells ([`RecordStream::poll_write_framed`],
//! what a link's writer sends) is sealed where the caller encoded it, → kernel, and other bytes
//! (`poll_write`) are copied into the send buffer and sealed there. Reads with less than `DIRECT_MIN` of room go through the receive buffer (one more
//! copy), as do the bytes left over from the handshake. rustls's path has two more on the way in
//! (`BufReader` → deframer → `received_plaintext` → caller) and a new `Vec` per record on the
//! way out (docs/performance-history.md, session 16).
//!
//! The exporter the link handshake binds to: rustls's unbuffered connections have no
//! `export_keying_material`, so the handshake logs its exporter secret to a per-connection
//! [`rustls::KeyLog`] (only that label) and [`tls13_exporter`] derives the values as RFC 8446
//! §7.5 does; tests check them equal to rustls's own on the other end.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use ring::{digest, hkdf};
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError};
use rustls::{CipherSuite, ConnectionTrafficSecrets, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use zeroize::Zeroizing;

use crate::handshake::{BIND_EXPORTER_LABEL, EXPORTER_LABEL, EXPORTER_LEN};
use crate::record::{
    alert, alert_name, record_len as checked_record_len, Opened, RecordError, RecordOpener,
    RecordSealer, MAX_RECORD,
};
use crate::LinkError;

/// The receive buffer of reads too small to take records directly (`poll_fill`) and of the
/// handshake: one `read` brings in several records (the rustls path's `BufReader` is 64 KiB).
/// Allocated only while such reads happen: a link's reads go to its `CellBuf` directly, and
/// between them the buffer holds at most the start of one record (< `MAX_RECORD` bytes).
const RECV_BUF: usize = 64 * 1024;
/// A read with this much room (the link's `CellBuf` offers 64 KiB) opens records straight into
/// the caller's buffer (`poll_read_direct`); a smaller one goes through the receive buffer.
const DIRECT_MIN: usize = 2 * MAX_RECORD;
/// Most plaintext bytes sealed per `poll_write` call: bounds the send buffer (it is drained
/// before more is accepted).
const WRITE_CHUNK: usize = 64 * 1024;
/// The send buffer is given back after an exceptional batch left it larger than this.
const SEND_BUF_KEEP: usize = 2 * WRITE_CHUNK;

/// The key schedule of one end (rustls's `KernelConnection`).
enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn update_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
    }

    fn update_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
        }
    }

    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        }
    }
}

/// Captures the one secret the link needs from the handshake: the exporter master secret
/// (wiped when dropped).
#[derive(Debug, Default)]
pub(crate) struct ExporterCapture(Mutex<Option<Zeroizing<Vec<u8>>>>);

impl rustls::KeyLog for ExporterCapture {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if label == "EXPORTER_SECRET" {
            if let Ok(mut slot) = self.0.lock() {
                *slot = Some(Zeroizing::new(secret.to_vec()));
            }
        }
    }

    fn will_log(&self, label: &str) -> bool {
        label == "EXPORTER_SECRET"
    }
}

impl ExporterCapture {
    fn take(&self) -> Option<Zeroizing<Vec<u8>>> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }
}

/// RFC 8446 §7.5: `HKDF-Expand-Label(Derive-Secret(secret, label, ""), "exporter",
/// Hash(context), out.len())` with an empty context (chive's exporters pass none, which rustls
/// treats as empty).
pub(crate) fn tls13_exporter(
    suite: SupportedCipherSuite,
    exporter_secret: &[u8],
    label: &[u8],
    out: &mut [u8],
) -> Result<(), LinkError> {
    let (prf, hash) = match suite.suite() {
        CipherSuite::TLS13_AES_256_GCM_SHA384 => (hkdf::HKDF_SHA384, &digest::SHA384),
        CipherSuite::TLS13_AES_128_GCM_SHA256 | CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => {
            (hkdf::HKDF_SHA256, &digest::SHA256)
        }
        other => return Err(LinkError::Tls(format!("no exporter for suite {other:?}"))),
    };
    let empty = digest::digest(hash, b"");
    let mut derived = Zeroizing::new(vec![0u8; hash.output_len()]);
    expand_label(prf, exporter_secret, label, empty.as_ref(), &mut derived)?;
    expand_label(prf, &derived, b"exporter", empty.as_ref(), out)
}

/// HKDF-Expand-Label (RFC 8446 §7.1).
fn expand_label(
    prf: hkdf::Algorithm,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    out: &mut [u8],
) -> Result<(), LinkError> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let bad = |_| LinkError::Tls("exporter derivation".into());
    let len = u16::try_from(out.len()).map_err(|_| bad(()))?.to_be_bytes();
    let label_len = [u8::try_from(6 + label.len()).map_err(|_| bad(()))?];
    let context_len = [u8::try_from(context.len()).map_err(|_| bad(()))?];
    let info: [&[u8]; 6] = [&len, &label_len, b"tls13 ", label, &context_len, context];
    hkdf::Prk::new_less_safe(prf, secret)
        .expand(&info, Len(out.len()))
        .map_err(|_| bad(()))?
        .fill(out)
        .map_err(|_| bad(()))
}

/// What the handshake leaves: the socket, bytes received past the handshake, the plaintext
/// rustls opened while finishing it (the peer's first application data, if it came in the same
/// read), the extracted state.
struct Handshaken<S> {
    tcp: S,
    incoming: Vec<u8>,
    filled: usize,
    early: Vec<u8>,
    /// The peer's close_notify was among those bytes.
    peer_closed: bool,
    secrets: rustls::ExtractedSecrets,
    kernel: Kernel,
}

/// Drive an unbuffered connection through the TLS handshake over `$tcp` (a macro: the client's
/// and the server's `process_tls_records` are separate methods).
macro_rules! handshake_loop {
    ($conn:expr, $tcp:expr) => {{
        let conn = &mut $conn;
        let tcp = $tcp;
        let mut incoming = vec![0u8; RECV_BUF];
        let mut filled = 0usize;
        // rustls is shown the received records one at a time, and none after the one that
        // ends its handshake: everything after (data, KeyUpdate, close_notify, alerts) is the
        // record layer's. (Shown all of them, rustls would open the peer's first records and
        // answer a KeyUpdate among them with a message it keeps queued, lost when its secrets
        // are extracted: found by the `record_handover` fuzz target.)
        let mut visible = 0usize;
        let mut outgoing = vec![0u8; 8 * 1024];
        let mut out_len = 0usize;
        let mut early = Vec::new();
        let mut peer_closed = false;
        loop {
            enum Next {
                Process,
                Transmit,
                Read,
                PeerClosed,
                Done,
            }
            let status = conn.process_tls_records(&mut incoming[..visible]);
            let mut discard = status.discard;
            let next = match status.state.map_err(|e| LinkError::Tls(e.to_string()))? {
                ConnectionState::EncodeTlsData(mut st) => loop {
                    match st.encode(&mut outgoing[out_len..]) {
                        Ok(n) => {
                            out_len += n;
                            break Next::Process;
                        }
                        Err(EncodeError::InsufficientSize(e)) if e.required_size <= 1 << 20 => {
                            outgoing.resize(out_len + e.required_size, 0)
                        }
                        Err(e) => return Err(LinkError::Tls(e.to_string())),
                    }
                },
                ConnectionState::TransmitTlsData(st) => {
                    // Written right below, before anything else is processed.
                    st.done();
                    Next::Transmit
                }
                ConnectionState::BlockedHandshake => Next::Read,
                ConnectionState::ReadTraffic(mut st) => {
                    while let Some(record) = st.next_record() {
                        let record = record.map_err(|e| LinkError::Tls(e.to_string()))?;
                        discard += record.discard;
                        early.extend_from_slice(record.payload);
                    }
                    Next::Process
                }
                ConnectionState::WriteTraffic(_) => Next::Done,
                ConnectionState::PeerClosed => Next::PeerClosed,
                ConnectionState::Closed => {
                    return Err(LinkError::Tls("closed during the TLS handshake".into()))
                }
                _ => return Err(LinkError::Tls("unexpected TLS handshake state".into())),
            };
            incoming.copy_within(discard..filled, 0);
            filled -= discard;
            visible -= discard;
            match next {
                Next::Process => {}
                // A close_notify rustls opened after its handshake (not reached while it sees no
                // record past the handshake's last, kept for safety): our read side is closed,
                // the write side is not.
                Next::PeerClosed if !conn.is_handshaking() => peer_closed = true,
                Next::PeerClosed => {
                    return Err(LinkError::Tls("closed during the TLS handshake".into()))
                }
                Next::Transmit => {
                    tcp.write_all(&outgoing[..out_len]).await?;
                    out_len = 0;
                }
                Next::Read
                    if conn.is_handshaking()
                        && record_len(&incoming[visible..filled]).is_some() =>
                {
                    visible += record_len(&incoming[visible..filled]).unwrap_or(0);
                }
                Next::Read => {
                    if filled == incoming.len() {
                        return Err(LinkError::Tls("TLS handshake message too large".into()));
                    }
                    let n = tcp.read(&mut incoming[filled..]).await?;
                    if n == 0 {
                        return Err(LinkError::Tls("EOF during the TLS handshake".into()));
                    }
                    filled += n;
                }
                Next::Done => break (incoming, filled, early, peer_closed),
            }
        }
    }};
}

/// The handshake's receive buffer cut down to the bytes received past the handshake (usually
/// none: then no heap at all).
fn kept(mut incoming: Vec<u8>, filled: usize) -> Vec<u8> {
    incoming.truncate(filled);
    incoming.shrink_to_fit();
    incoming
}

/// A finished handshake: the stream and the link's two exporter values.
type Handed<S> = (RecordStream<S>, [u8; EXPORTER_LEN], [u8; EXPORTER_LEN]);

/// The length of the complete TLS record at the start of `buf`, if it holds one. A header no
/// TLS peer would send (content type outside 20..=24, a version byte other than 3, a length past
/// TLS's largest record) gives everything there is, so rustls sees it and refuses it at once
/// instead of the handshake waiting for a record that will never be whole (say, an HTTP request
/// sent to a relay's port).
fn record_len(buf: &[u8]) -> Option<usize> {
    // Any TLS version's largest record body (TLS 1.2's ciphertext bound); not the module's
    // `MAX_RECORD`, which is TLS 1.3 application data with its header.
    const MAX_ANY_BODY: usize = (1 << 14) + 2048;
    let header = buf.get(..5)?;
    let body = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if !(20..=24).contains(&header[0]) || header[1] != 3 || body > MAX_ANY_BODY {
        return Some(buf.len());
    }
    let len = 5 + body;
    (buf.len() >= len).then_some(len)
}

/// The whole handshake over `$tcp` for one side: `$config` with exporter capture, the
/// unbuffered connection `$new` makes of it, [`handshake_loop!`], the secrets, [`finish`].
/// A macro for the reason `handshake_loop!` is one: the client's and the server's connection
/// and kernel types are separate.
macro_rules! handshake {
    ($tcp:ident, $config:expr, $new:expr, $kernel:path) => {{
        let capture = Arc::new(ExporterCapture::default());
        let mut config = $config.clone();
        config.enable_secret_extraction = true;
        config.key_log = capture.clone();
        let mut conn = ($new)(Arc::new(config)).map_err(|e| LinkError::Tls(e.to_string()))?;
        let (incoming, filled, early, peer_closed) = handshake_loop!(conn, &mut $tcp);
        let (secrets, kernel) = conn
            .dangerous_into_kernel_connection()
            .map_err(|e| LinkError::Tls(e.to_string()))?;
        finish(
            Handshaken {
                tcp: $tcp,
                incoming,
                filled,
                early,
                peer_closed,
                secrets,
                kernel: $kernel(kernel),
            },
            &capture,
        )
    }};
}

/// Client side: TLS handshake, then the record layer and the link's two exporter values.
pub(crate) async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    mut tcp: S,
    config: &rustls::ClientConfig,
    name: rustls::pki_types::ServerName<'static>,
) -> Result<Handed<S>, LinkError> {
    handshake!(
        tcp,
        config,
        |config| UnbufferedClientConnection::new(config, name),
        Kernel::Client
    )
}

/// Server side, as [`connect`].
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    mut tcp: S,
    config: &rustls::ServerConfig,
) -> Result<Handed<S>, LinkError> {
    handshake!(tcp, config, UnbufferedServerConnection::new, Kernel::Server)
}

fn finish<S>(h: Handshaken<S>, capture: &ExporterCapture) -> Result<Handed<S>, LinkError> {
    let suite = h.kernel.suite();
    let secret = capture
        .take()
        .ok_or_else(|| LinkError::Tls("the handshake logged no exporter secret".into()))?;
    let mut exporter = [0u8; EXPORTER_LEN];
    let mut bind = [0u8; EXPORTER_LEN];
    tls13_exporter(suite, &secret, EXPORTER_LABEL, &mut exporter)?;
    tls13_exporter(suite, &secret, BIND_EXPORTER_LABEL, &mut bind)?;
    let record = |e: RecordError| LinkError::Tls(e.to_string());
    let (tx_seq, tx) = &h.secrets.tx;
    let (rx_seq, rx) = &h.secrets.rx;
    let stream = RecordStream {
        tcp: h.tcp,
        sealer: RecordSealer::new(*tx_seq, tx).map_err(record)?,
        opener: RecordOpener::new(*rx_seq, rx).map_err(record)?,
        kernel: h.kernel,
        suite,
        rbuf: kept(h.incoming, h.filled),
        rstart: 0,
        rend: h.filled,
        plain: 0..0,
        plain_end: 0,
        early: h.early,
        wbuf: Vec::new(),
        wpos: 0,
        read_closed: h.peer_closed,
        write_closed: false,
        failed: None,
        framed_out: false,
        #[cfg(test)]
        moved: 0,
        #[cfg(test)]
        sealed_copied: 0,
    };
    Ok((stream, exporter, bind))
}

/// A TCP connection whose TLS records are sealed and opened by this crate (see the module
/// documentation). `AsyncRead` yields the peer's application data, `AsyncWrite` seals what is
/// written; a KeyUpdate from the peer is followed (and answered if asked), one is sent before
/// the key's confidentiality limit, close_notify ends the read side, and a bad record fails
/// the stream with an error naming why (after a sealed alert to the peer).
pub(crate) struct RecordStream<S = TcpStream> {
    tcp: S,
    sealer: RecordSealer,
    opener: RecordOpener,
    kernel: Kernel,
    suite: SupportedCipherSuite,
    /// Received bytes: records from `rstart` to `rend`. As long as `rend` on the direct path
    /// (the start of one record kept from the last read), `RECV_BUF` while `poll_fill` reads,
    /// empty (no heap) once the direct path has taken everything.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Opened plaintext not yet read, inside `rbuf`; its record ends at `plain_end`.
    plain: std::ops::Range<usize>,
    plain_end: usize,
    /// Plaintext rustls opened at the end of the handshake, read first.
    early: Vec<u8>,
    /// Sealed records not yet written, from `wpos`.
    wbuf: Vec<u8>,
    wpos: usize,
    /// The peer's close_notify arrived: reads return EOF.
    read_closed: bool,
    /// Our close_notify is sealed: no more writes.
    write_closed: bool,
    /// A fatal record error: every later read fails with it.
    failed: Option<String>,
    /// Bytes the direct path moved between `rbuf` and callers' buffers (tests: the short-read
    /// copy must stay linear in the bytes received).
    #[cfg(test)]
    moved: usize,
    /// A framed batch ([`RecordStream::poll_write_framed`]) is sealed and not yet all written:
    /// nothing else may reach the socket before its end.
    framed_out: bool,
    /// Plaintext bytes `poll_write` copied into `wbuf` to seal them (tests: a framed batch is
    /// sealed where it lies).
    #[cfg(test)]
    sealed_copied: usize,
}

/// Where a framed batch's write stands ([`RecordStream::poll_write_framed`]).
#[derive(Debug, Default)]
pub(crate) struct FramedWrite {
    sealed: bool,
    pos: usize,
}

impl FramedWrite {
    /// Whether the batch is sealed.
    pub(crate) fn sealed(&self) -> bool {
        self.sealed
    }
}

impl<S> std::fmt::Debug for RecordStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStream")
            .field("tx_seq", &self.sealer.seq())
            .field("rx_seq", &self.opener.seq())
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RecordStream<S> {
    /// The socket.
    pub(crate) fn tcp(&self) -> &S {
        &self.tcp
    }

    /// The negotiated suite.
    pub(crate) fn suite(&self) -> SupportedCipherSuite {
        self.suite
    }

    /// Write the sealed bytes not yet written.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.wpos < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.wbuf[self.wpos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.wpos += n;
        }
        self.wbuf.clear();
        self.wpos = 0;
        if self.wbuf.capacity() > SEND_BUF_KEEP {
            self.wbuf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Write a batch the caller encoded with room for the records around its plaintext
    /// (`plain` bytes per record, the last one shorter: [`RecordSealer::seal_framed`]), sealing
    /// it where it lies: no copy into the send buffer. What was sealed before (a KeyUpdate,
    /// a variable-length cell) goes first. `st` starts as `FramedWrite::default()` and is kept
    /// between polls; the batch's bytes must not change between them.
    pub(crate) fn poll_write_framed(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
        plain: usize,
        st: &mut FramedWrite,
    ) -> Poll<io::Result<()>> {
        if !st.sealed {
            ready!(self.poll_ready_to_seal(cx))?;
            // The batch goes straight to the socket: what was sealed before it goes first.
            ready!(self.poll_drain(cx))?;
            self.sealer
                .seal_framed(buf, plain)
                .map_err(|e| io::Error::other(e.to_string()))?;
            st.sealed = true;
            self.framed_out = true;
        }
        while st.pos < buf.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &buf[st.pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            st.pos += n;
        }
        self.framed_out = false;
        Poll::Ready(Ok(()))
    }

    /// Before sealing application data: refused once the write side is closed; what waits in
    /// the send buffer written; a KeyUpdate sealed if the key is due for one (it waits in the
    /// send buffer, ahead of what is sealed next).
    fn poll_ready_to_seal(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        ready!(self.poll_drain(cx))?;
        if self.sealer.needs_key_update() {
            self.send_key_update(false)
                .map_err(|why| io::Error::other(format!("KeyUpdate: {why}")))?;
        }
        Poll::Ready(Ok(()))
    }

    /// Send a KeyUpdate under the current key and switch to the next one.
    pub(crate) fn send_key_update(&mut self, update_requested: bool) -> Result<(), String> {
        self.sealer
            .seal_key_update(update_requested, &mut self.wbuf)
            .map_err(|e| e.to_string())?;
        let (seq, secrets) = self.kernel.update_tx().map_err(|e| e.to_string())?;
        self.sealer.rekey(seq, &secrets).map_err(|e| e.to_string())
    }

    /// Fail the stream: seal `alert` for the peer (best effort: one non-blocking write) and
    /// remember why, so every later read fails the same way.
    fn fail(&mut self, cx: &mut Context<'_>, why: String, alert: Option<u8>) -> io::Error {
        if let (Some(desc), false) = (alert, self.write_closed) {
            if self.sealer.seal_alert(desc, &mut self.wbuf).is_ok() {
                self.write_closed = true;
                // Mid-way through a framed batch the alert waits for the batch's end (the
                // writer's flush or shutdown sends it): written now, it would cut a record.
                if !self.framed_out {
                    let _ = self.poll_drain(cx);
                }
            }
        }
        self.failed = Some(why.clone());
        io::Error::new(io::ErrorKind::InvalidData, why)
    }

    /// Open records until there is plaintext, EOF, or the socket has nothing more now.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if let Some(why) = &self.failed {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why.clone())));
            }
            if !self.plain.is_empty() || self.read_closed {
                return Poll::Ready(Ok(()));
            }
            match self.opener.open(&mut self.rbuf[self.rstart..self.rend]) {
                Ok(Some((len, Opened::Data(range)))) => {
                    self.plain = self.rstart + range.start..self.rstart + range.end;
                    self.plain_end = self.rstart + len;
                    if self.plain.is_empty() {
                        self.rstart = self.plain_end;
                    }
                }
                Ok(Some((len, Opened::KeyUpdate { update_requested }))) => {
                    self.rstart += len;
                    self.follow_key_update(cx, update_requested)?;
                }
                Ok(Some((len, Opened::CloseNotify))) => {
                    self.rstart += len;
                    self.read_closed = true;
                }
                Ok(Some((len, Opened::Nothing))) => self.rstart += len,
                Ok(None) => {
                    if self.rbuf.len() < RECV_BUF {
                        self.rbuf.resize(RECV_BUF, 0);
                    }
                    if self.rstart == self.rend {
                        self.rstart = 0;
                        self.rend = 0;
                    } else if self.rbuf.len() - self.rend < MAX_RECORD {
                        self.rbuf.copy_within(self.rstart..self.rend, 0);
                        self.rend -= self.rstart;
                        self.rstart = 0;
                    }
                    let mut rb = ReadBuf::new(&mut self.rbuf[self.rend..]);
                    ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut rb))?;
                    let n = rb.filled().len();
                    if n == 0 {
                        if self.rstart < self.rend {
                            let why = "connection closed inside a TLS record".to_string();
                            return Poll::Ready(Err(self.fail(cx, why, None)));
                        }
                        // EOF without close_notify, on a record boundary: EOF, as the rustls
                        // path reports it to the link (the cell framer checks cell boundaries).
                        self.read_closed = true;
                        return Poll::Ready(Ok(()));
                    }
                    self.rend += n;
                }
                Err(e) => return Poll::Ready(Err(self.fail_record(cx, e))),
            }
        }
    }

    /// Fail the stream on a record the opener refused.
    fn fail_record(&mut self, cx: &mut Context<'_>, e: RecordError) -> io::Error {
        let why = match &e {
            RecordError::PeerAlert(d) => format!("TLS alert from peer: {} ({d})", alert_name(*d)),
            other => format!("TLS record: {other}"),
        };
        self.fail(cx, why, e.alert())
    }

    /// The peer's KeyUpdate was opened: switch the opener to its next key and, if it asked,
    /// seal ours (it goes out now if the socket takes it and no framed batch is half-written,
    /// else with the next write or flush).
    fn follow_key_update(
        &mut self,
        cx: &mut Context<'_>,
        update_requested: bool,
    ) -> io::Result<()> {
        let next = self.kernel.update_rx().map_err(|e| e.to_string());
        let rekeyed = next
            .and_then(|(seq, secrets)| self.opener.rekey(seq, &secrets).map_err(|e| e.to_string()));
        let answered = rekeyed.and_then(|()| {
            if update_requested {
                self.send_key_update(false)
            } else {
                Ok(())
            }
        });
        if let Err(why) = answered {
            let why = format!("KeyUpdate: {why}");
            return Err(self.fail(cx, why, Some(alert::INTERNAL_ERROR)));
        }
        // Mid-way through a framed batch the answer waits for the batch's end (the writer's
        // flush, or the next batch, drains it): its records are sealed before it, and written
        // now it would cut one of them.
        if update_requested && !self.framed_out {
            let _ = self.poll_drain(cx);
        }
        Ok(())
    }

    /// Whether the next read can go straight into a caller's buffer: no plaintext or
    /// complete record waits here (at most the start of one record, copied ahead of the read).
    fn direct_ready(&self) -> bool {
        self.early.is_empty()
            && self.plain.is_empty()
            && !self.read_closed
            && self.failed.is_none()
            && match checked_record_len(&self.rbuf[self.rstart..self.rend]) {
                Ok(None) => true,
                Ok(Some(len)) => len > self.rend - self.rstart,
                Err(_) => false,
            }
    }

    /// Count bytes the direct path moves in user space (tests only).
    #[inline]
    fn count_moved(&mut self, _n: usize) {
        #[cfg(test)]
        {
            self.moved += _n;
        }
    }

    /// The kept start of a record plus `new` (the bytes a read just brought) still end before
    /// that record does: its length when its header is whole (`Ok(Some)`), `Ok(None)` while
    /// the header is not. `Err` when the bytes complete it or its header is bad (the opener
    /// then takes them and refuses a bad header).
    fn first_record_incomplete(&self, new: &[u8]) -> Result<Option<usize>, ()> {
        let kept = &self.rbuf[self.rstart..self.rend];
        let mut header = [0u8; 5];
        let have = (kept.len() + new.len()).min(header.len());
        for (h, b) in header.iter_mut().zip(kept.iter().chain(new)) {
            *h = *b;
        }
        match checked_record_len(&header[..have]) {
            Ok(None) => Ok(None),
            Ok(Some(len)) if kept.len() + new.len() < len => Ok(Some(len)),
            _ => Err(()),
        }
    }

    /// Append `new` to the kept start of an unfinished record (of `len` bytes, if its header
    /// is whole), so a record arriving in many short reads is moved once per byte, not once
    /// per read. The buffer is sized for the record's start (at most `len - 1` bytes): one left
    /// large by `poll_fill`, or holding bytes before `rstart`, is replaced first.
    fn keep_more(&mut self, new: &[u8], len: Option<usize>) {
        let kept = self.rend - self.rstart;
        let want = len.map_or(5, |l| l - 1).max(kept + new.len());
        if self.rstart > 0 || self.rbuf.capacity() > MAX_RECORD {
            let mut fresh = Vec::with_capacity(want);
            fresh.extend_from_slice(&self.rbuf[self.rstart..self.rend]);
            self.count_moved(kept);
            self.rbuf = fresh;
        }
        self.rbuf.truncate(kept);
        self.rbuf.reserve_exact(want - kept);
        self.rbuf.extend_from_slice(new);
        self.count_moved(new.len());
        self.rstart = 0;
        self.rend = self.rbuf.len();
    }

    /// Read records into `room` (after the start of a record kept from the last read) and open
    /// them there, each one's plaintext right after the last's: one copy fewer than opening in
    /// the receive buffer and copying out. The start of a record at the end is kept for the
    /// next read; while reads keep ending inside that record (a peer's record in tiny pieces),
    /// they are appended to it, and it is copied into `room` once, when whole. Returns how many
    /// plaintext bytes lead `room` (0 only at EOF); an error after some plaintext is returned by
    /// the next read, after that plaintext.
    fn poll_read_direct(
        &mut self,
        cx: &mut Context<'_>,
        room: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let kept = self.rend - self.rstart;
            let mut rb = ReadBuf::new(&mut room[kept..]);
            ready!(Pin::new(&mut self.tcp).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if kept > 0 {
                    let why = "connection closed inside a TLS record".to_string();
                    return Poll::Ready(Err(self.fail(cx, why, None)));
                }
                self.read_closed = true;
                return Poll::Ready(Ok(0));
            }
            if let Ok(len) = self.first_record_incomplete(&room[kept..kept + n]) {
                // Still inside the first record: nothing to open yet. Before, the kept start
                // went into `room` and everything back out on every such read, up to a record
                // per read for a peer sending byte by byte (found by the `record_handover`
                // fuzzer).
                self.keep_more(&room[kept..kept + n], len);
                continue;
            }
            // Copied only once the first record is whole (or its header bad).
            room[..kept].copy_from_slice(&self.rbuf[self.rstart..self.rend]);
            self.count_moved(kept);
            self.rstart = 0;
            self.rend = 0;
            let total = kept + n;
            let (mut to, mut at) = (0, 0);
            loop {
                match self.opener.open_into(&mut room[..total], to, at) {
                    Ok(Some((len, Opened::Data(range)))) => {
                        to = range.end;
                        at += len;
                    }
                    Ok(Some((len, Opened::KeyUpdate { update_requested }))) => {
                        at += len;
                        if let Err(e) = self.follow_key_update(cx, update_requested) {
                            if to == 0 {
                                return Poll::Ready(Err(e));
                            }
                            break;
                        }
                    }
                    Ok(Some((_, Opened::CloseNotify))) => {
                        self.read_closed = true;
                        break;
                    }
                    Ok(Some((len, Opened::Nothing))) => at += len,
                    Ok(None) => {
                        // The start of a record, kept for the next read. The buffer is reused
                        // while reads keep ending inside records (a busy link), never larger than
                        // a record; one left large by `poll_fill` is given back first.
                        let rest = &room[at..total];
                        if self.rbuf.capacity() > MAX_RECORD {
                            self.rbuf = Vec::new();
                        }
                        self.rbuf.clear();
                        self.rbuf.reserve_exact(rest.len());
                        self.rbuf.extend_from_slice(rest);
                        self.rend = rest.len();
                        self.count_moved(self.rend);
                        break;
                    }
                    Err(e) => {
                        let err = self.fail_record(cx, e);
                        if to == 0 {
                            return Poll::Ready(Err(err));
                        }
                        break;
                    }
                }
            }
            if self.rend == 0 && self.rbuf.capacity() > 0 {
                // Nothing kept: the read ended on a record boundary, as an idle link's last read
                // does. An idle link holds no receive buffer.
                self.rbuf = Vec::new();
            }
            if to > 0 || self.read_closed {
                return Poll::Ready(Ok(to));
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RecordStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.early.is_empty() {
            let n = this.early.len().min(buf.remaining());
            buf.put_slice(&this.early[..n]);
            this.early.drain(..n);
            if this.early.is_empty() {
                this.early = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() >= DIRECT_MIN && this.direct_ready() {
            let n = ready!(this.poll_read_direct(cx, buf.initialize_unfilled()))?;
            buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_fill(cx))?;
        if !this.plain.is_empty() {
            let n = this.plain.len().min(buf.remaining());
            buf.put_slice(&this.rbuf[this.plain.start..this.plain.start + n]);
            this.plain.start += n;
            if this.plain.is_empty() {
                this.rstart = this.plain_end;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RecordStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The send buffer holds at most one chunk: drained before accepting more.
        ready!(this.poll_ready_to_seal(cx))?;
        let n = data.len().min(WRITE_CHUNK);
        #[cfg(test)]
        {
            this.sealed_copied += n;
        }
        this.sealer
            .seal_app_data(&data[..n], &mut this.wbuf)
            .map_err(|e| io::Error::other(e.to_string()))?;
        // Start writing now; what the socket does not take yet goes with the next write or
        // the flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            this.write_closed = true;
            this.sealer
                .seal_alert(alert::CLOSE_NOTIFY, &mut this.wbuf)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "record_stream_tests.rs"]
mod tests;
