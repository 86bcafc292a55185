//! The own record layer's hand-over from rustls's handshake to [`RecordStream`]
//! (`record_stream::connect` / `accept`), driven against a scripted rustls peer over an
//! in-memory wire whose peer-to-us bytes the fuzzer splits and changes (target
//! `record_handover` in `fuzz/`).
//!
//! Everything runs synchronously: the wire never pends (what the peer answers is computed inside
//! our write), so a `Pending` from our side is a hang. The peer is rustls's buffered connection
//! with chive's link configs; once its handshake is done (or, as a server with half-RTT data,
//! once its first flight is out) it plays the script: application data, KeyUpdates (asking for
//! ours), a close_notify or a fatal alert (it is fed a bad record and answers with one). The
//! fuzzer chooses the read sizes on both sides of the hand-over (so rustls may hold the peer's
//! first records when its secrets are extracted), XORs into the peer's bytes (at an offset from
//! the stream's start, or after the handshake), cuts the stream and appends bytes to it.

use std::cell::RefCell;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::provider;
use crate::record_stream;
use crate::tls;

/// One step of the peer's script, played after its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerOp {
    /// Send this many bytes of application data (at most 16 000: one record).
    Data(usize),
    /// `refresh_traffic_keys`: a KeyUpdate asking for ours.
    KeyUpdate,
    /// close_notify; the script ends.
    CloseNotify,
    /// The peer is fed a bad record and answers with a fatal alert; the script ends.
    Alert,
}

/// A change to the peer's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// XOR this byte in at this offset from the stream's start.
    At(usize, u8),
    /// XOR this byte in at this offset from the end of the peer's handshake bytes.
    AfterHandshake(usize, u8),
}

/// What the fuzzer chose.
#[derive(Debug, Clone, Default, Hash)]
pub struct HandoverScript {
    /// Our side is the TLS server (the peer the client).
    pub we_are_server: bool,
    /// A server peer sends its script right after its first flight (rustls's
    /// `send_half_rtt_data`), before our Finished.
    pub half_rtt: bool,
    /// The peer's script.
    pub ops: Vec<PeerOp>,
    /// Most bytes the wire hands over per read, cycled (0 counts as 1; none: everything).
    pub wire_reads: Vec<usize>,
    /// Our reads' buffer sizes after the hand-over, cycled (0 counts as 1; none: 64 KiB).
    pub our_reads: Vec<usize>,
    /// Changes to the peer's bytes.
    pub changes: Vec<Change>,
    /// The stream ends this many bytes after the peer's handshake bytes.
    pub cut_after_handshake: Option<usize>,
    /// Bytes after everything the peer sent (once its script ran).
    pub appended: Vec<u8>,
    /// What we write after reading to the end without an error, then our close_notify.
    pub our_writes: Vec<usize>,
}

/// How the read side ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadEnd {
    /// The TLS handshake failed (the error).
    HandshakeFailed(String),
    /// EOF (close_notify, or the TCP end on a record boundary).
    Eof,
    /// A read failed (the error).
    Failed(String),
}

/// What happened.
#[derive(Debug, Clone)]
pub struct HandoverReport {
    /// The peer's application data, in order.
    pub sent: Vec<u8>,
    /// After each `Data` op: where its record ends in the peer's stream, and `sent`'s length.
    pub marks: Vec<(usize, usize)>,
    /// Where the peer's handshake bytes end (None: its script never ran).
    pub handshake_end: Option<usize>,
    /// The peer's genuine stream's length.
    pub genuine_len: usize,
    /// The first offset at which what we were handed differs from the genuine stream (a
    /// change, the cut, or the appended bytes), if any.
    pub first_change: Option<usize>,
    /// The last op the peer played ends its script with an alert.
    pub ended_with_alert: bool,
    /// What our side read.
    pub delivered: Vec<u8>,
    /// How our read side ended.
    pub read_end: ReadEnd,
    /// Our side returned `Pending` on a wire that never pends (a hang), or never ended.
    pub hung: bool,
    /// What we wrote after the read side's EOF (empty if it did not end so).
    pub written: Vec<u8>,
    /// Our writes and close_notify all succeeded.
    pub write_ok: bool,
    /// What the peer read from us.
    pub peer_received: Vec<u8>,
    /// The peer's connection failed (it refused something we sent, or its Alert op).
    pub peer_failed: bool,
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(7)) % 251) as u8)
        .collect()
}

struct Configs {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    server_half_rtt: Arc<rustls::ServerConfig>,
}

/// chive's link configs, made once (a server config generates a certificate), on both sides
/// with the fuzzing provider (`provider.rs`: no X25519 arithmetic, deterministic randomness).
fn configs() -> &'static Configs {
    static CONFIGS: OnceLock<Configs> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let server =
            tls::server_config_with(provider::provider()).expect("the link's server config");
        let mut half = (*server).clone();
        half.send_half_rtt_data = true;
        Configs {
            client: tls::client_config_with(provider::provider())
                .expect("the link's client config"),
            server,
            server_half_rtt: Arc::new(half),
        }
    })
}

/// The in-memory connection: our side's `AsyncRead`/`AsyncWrite`, the scripted peer behind it.
struct Wire {
    peer: rustls::Connection,
    script: HandoverScript,
    /// The peer's genuine bytes so far, and how many were handed to us.
    genuine: Vec<u8>,
    pos: usize,
    reads: usize,
    script_ran: bool,
    handshake_end: Option<usize>,
    sent: Vec<u8>,
    marks: Vec<(usize, usize)>,
    ended_with_alert: bool,
    peer_received: Vec<u8>,
    peer_failed: bool,
}

impl Wire {
    fn new(script: HandoverScript) -> Self {
        let cfg = configs();
        let peer: rustls::Connection = if script.we_are_server {
            let name = rustls::pki_types::ServerName::IpAddress(
                std::net::IpAddr::from([127, 0, 0, 1]).into(),
            );
            rustls::ClientConnection::new(cfg.client.clone(), name)
                .expect("a client connection")
                .into()
        } else {
            let server = if script.half_rtt {
                &cfg.server_half_rtt
            } else {
                &cfg.server
            };
            rustls::ServerConnection::new(server.clone())
                .expect("a server connection")
                .into()
        };
        let mut wire = Wire {
            peer,
            script,
            genuine: Vec::new(),
            pos: 0,
            reads: 0,
            script_ran: false,
            handshake_end: None,
            sent: Vec::new(),
            marks: Vec::new(),
            ended_with_alert: false,
            peer_received: Vec::new(),
            peer_failed: false,
        };
        wire.pump();
        wire
    }

    /// Everything the peer has to send, onto its stream.
    fn pump(&mut self) {
        while self.peer.wants_write() {
            match self.peer.write_tls(&mut self.genuine) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    /// Hand `bytes` to the peer and let it answer (and, once its handshake is done, play its
    /// script).
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.peer_failed {
            match self.peer.read_tls(&mut bytes) {
                Ok(0) | Err(_) => self.peer_failed = true,
                Ok(_) => {}
            }
            if self.peer.process_new_packets().is_err() {
                self.peer_failed = true;
            }
            self.pump();
            let mut buf = [0u8; 4096];
            loop {
                match self.peer.reader().read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => self.peer_received.extend_from_slice(&buf[..n]),
                }
            }
        }
        let half_rtt_flight_out =
            self.script.half_rtt && !self.script.we_are_server && !self.genuine.is_empty();
        if !self.script_ran
            && !self.peer_failed
            && (!self.peer.is_handshaking() || half_rtt_flight_out)
        {
            self.play();
        }
    }

    fn play(&mut self) {
        self.script_ran = true;
        self.handshake_end = Some(self.genuine.len());
        for op in self.script.ops.clone() {
            match op {
                PeerOp::Data(len) => {
                    let data = pattern(len.min(16_000), self.sent.len());
                    if self.peer.writer().write_all(&data).is_err() {
                        break;
                    }
                    self.sent.extend_from_slice(&data);
                    self.pump();
                    self.marks.push((self.genuine.len(), self.sent.len()));
                }
                PeerOp::KeyUpdate => {
                    // Refused while a half-RTT server still waits for our Finished.
                    let _ = self.peer.refresh_traffic_keys();
                    self.pump();
                }
                PeerOp::CloseNotify => {
                    self.peer.send_close_notify();
                    self.pump();
                    break;
                }
                PeerOp::Alert => {
                    // An application-data record no key opens: the peer answers with a fatal
                    // alert (bad_record_mac).
                    let mut junk: &[u8] = &[[23, 3, 3, 0, 20].as_slice(), &[0; 20]].concat();
                    let _ = self.peer.read_tls(&mut junk);
                    let _ = self.peer.process_new_packets();
                    self.peer_failed = true;
                    self.pump();
                    self.ended_with_alert = true;
                    break;
                }
            }
        }
    }

    /// Where the stream we are handed ends now, and what is appended after the genuine bytes.
    fn limit(&self) -> usize {
        let mut end = self.genuine.len();
        if let (Some(hs), Some(cut)) = (self.handshake_end, self.script.cut_after_handshake) {
            end = end.min(hs.saturating_add(cut));
        }
        end
    }

    /// Where a change applies in the stream (None: after a handshake that has not ended), and
    /// its XOR byte.
    fn change_at(&self, c: Change) -> Option<(usize, u8)> {
        match c {
            Change::At(off, x) => Some((off, x)),
            Change::AfterHandshake(off, x) => {
                self.handshake_end.map(|hs| (hs.saturating_add(off), x))
            }
        }
    }

    /// The byte at `at` of the genuine stream, as changed.
    fn changed(&self, at: usize) -> u8 {
        let mut b = self.genuine[at];
        for c in &self.script.changes {
            match self.change_at(*c) {
                Some((off, x)) if off == at => b ^= x,
                _ => {}
            }
        }
        b
    }

    fn first_change(&self) -> Option<usize> {
        let len = self.genuine.len();
        let hs = self.handshake_end;
        // Offsets where the XORs, taken together, change the byte (two may cancel out).
        let at: Vec<usize> = self
            .script
            .changes
            .iter()
            .filter_map(|c| match *c {
                Change::At(off, _) => Some(off),
                Change::AfterHandshake(off, _) => hs.and_then(|hs| hs.checked_add(off)),
            })
            .filter(|&at| at < self.limit() && self.changed(at) != self.genuine[at])
            .collect();
        let cut = Some(self.limit()).filter(|&l| l < len);
        let appended = (self.script_ran && !self.script.appended.is_empty()).then_some(len);
        at.into_iter().chain(cut).chain(appended).min()
    }
}

/// Our side's end of the wire (the report reads the wire after a failed handshake too).
struct WireEnd(Rc<RefCell<Wire>>);

impl AsyncRead for WireEnd {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut this = self.0.borrow_mut();
        let most = match this.script.wire_reads.as_slice() {
            [] => usize::MAX,
            sizes => sizes[this.reads % sizes.len()].max(1),
        };
        this.reads += 1;
        let limit = this.limit();
        let appended = if this.script_ran && limit == this.genuine.len() {
            this.script.appended.len()
        } else {
            0
        };
        let end = limit + appended;
        let n = most.min(buf.remaining()).min(end.saturating_sub(this.pos));
        // The genuine bytes in one copy, then the changes that fall in them, then the appended
        // bytes: the same bytes as `changed` byte by byte, without a loop per byte (the
        // streams are up to ~130 KB, and every instrumented iteration counted).
        let (start, stop) = (this.pos, this.pos + n);
        let genuine_stop = stop.min(limit);
        if start < genuine_stop {
            let before = buf.filled().len();
            buf.put_slice(&this.genuine[start..genuine_stop]);
            let put = &mut buf.filled_mut()[before..];
            for c in &this.script.changes {
                if let Some((at, x)) = this.change_at(*c) {
                    if (start..genuine_stop).contains(&at) {
                        put[at - start] ^= x;
                    }
                }
            }
        }
        if stop > limit {
            buf.put_slice(&this.script.appended[start.max(limit) - limit..stop - limit]);
        }
        this.pos = stop;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WireEnd {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.borrow_mut().feed(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Poll `f` once: the wire never pends, so `None` is a hang.
fn now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Run the handshake, the hand-over and the script; read to the end; write if that ended in
/// EOF. Properties are the caller's (`fuzz/targets/src/records.rs`).
pub fn handover(script: HandoverScript) -> HandoverReport {
    let cfg = configs();
    // The same script gets the same hellos and key shares when replayed; another script gets
    // other ones. DefaultHasher::new() has fixed keys.
    let mut seed = std::collections::hash_map::DefaultHasher::new();
    script.hash(&mut seed);
    provider::reseed(seed.finish());
    let we_are_server = script.we_are_server;
    let our_reads = script.our_reads.clone();
    let our_writes = script.our_writes.clone();
    let wire = Rc::new(RefCell::new(Wire::new(script)));
    let end = WireEnd(wire.clone());
    let handshake = if we_are_server {
        now(record_stream::accept(end, &cfg.server))
    } else {
        let name =
            rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        now(record_stream::connect(end, &cfg.client, name))
    };
    let mut report = HandoverReport {
        sent: Vec::new(),
        marks: Vec::new(),
        handshake_end: None,
        genuine_len: 0,
        first_change: None,
        ended_with_alert: false,
        delivered: Vec::new(),
        read_end: ReadEnd::Eof,
        hung: false,
        written: Vec::new(),
        write_ok: false,
        peer_received: Vec::new(),
        peer_failed: false,
    };
    match handshake {
        None => report.hung = true,
        Some(Err(e)) => report.read_end = ReadEnd::HandshakeFailed(e.to_string()),
        Some(Ok((mut stream, _, _))) => {
            let bound = {
                let w = wire.borrow();
                w.genuine.len() + w.script.appended.len() + 8
            };
            read_and_write(&mut stream, &our_reads, &our_writes, bound, &mut report);
        }
    }
    let wire = wire.borrow();
    report.sent = wire.sent.clone();
    report.marks = wire.marks.clone();
    report.handshake_end = wire.handshake_end;
    report.genuine_len = wire.genuine.len();
    report.first_change = wire.first_change();
    report.ended_with_alert = wire.ended_with_alert;
    report.peer_received = wire.peer_received.clone();
    report.peer_failed = wire.peer_failed;
    report
}

/// Read to the end (at most `bound` reads: each returns a byte or ends); after EOF, write.
fn read_and_write(
    stream: &mut record_stream::RecordStream<WireEnd>,
    our_reads: &[usize],
    our_writes: &[usize],
    bound: usize,
    report: &mut HandoverReport,
) {
    let mut buf = vec![0u8; 1 << 16];
    let mut reads = 0usize;
    loop {
        let size = match our_reads {
            [] => buf.len(),
            sizes => sizes[reads % sizes.len()].clamp(1, buf.len()),
        };
        reads += 1;
        if reads > bound {
            report.hung = true;
            return;
        }
        match now(stream.read(&mut buf[..size])) {
            None => {
                report.hung = true;
                return;
            }
            Some(Ok(0)) => break,
            Some(Ok(n)) => report.delivered.extend_from_slice(&buf[..n]),
            Some(Err(e)) => {
                report.read_end = ReadEnd::Failed(e.to_string());
                return;
            }
        }
    }
    report.read_end = ReadEnd::Eof;
    for (i, len) in our_writes.iter().enumerate() {
        let data = pattern(*len, 1000 + i);
        match now(stream.write_all(&data)) {
            Some(Ok(())) => report.written.extend_from_slice(&data),
            Some(Err(_)) => return,
            None => {
                report.hung = true;
                return;
            }
        }
    }
    match now(stream.shutdown()) {
        Some(Ok(())) => report.write_ok = true,
        Some(Err(_)) => {}
        None => report.hung = true,
    }
}
