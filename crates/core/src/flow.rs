//! SENDME flow control, as Tor does it, with authenticated (v1) SENDMEs that
//! work for every allowed circuit window, including 101.
//!
//! Tor records the digest of the cell that will be acknowledged by looking at
//! the package window modulo the increment, which only lines up when the window
//! starts at a multiple of 100 (so `circwindow=101` breaks authenticated
//! SENDMEs). Here both ends count DATA cells from the start of the circuit: the
//! receiver acknowledges the 100th, 200th, … cell it delivered and echoes that
//! cell's running digest; the sender remembers the digest of exactly those
//! cells. The window's start value plays no part in which cell is acknowledged.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::cc::{CongestionControl, FixedWindow, SendmeAck, CC_CWND_LIMIT};

/// Cells acknowledged by one circuit-level SENDME.
pub const CIRCUIT_SENDME_INCREMENT: u32 = 100;
/// The largest allowed circuit window; the receiver polices the sender against it.
pub const CIRCUIT_WINDOW_MAX: u32 = 1000;
/// The smallest allowed circuit window.
pub const CIRCUIT_WINDOW_MIN: u32 = 100;
/// Tor's stream window.
pub const STREAM_WINDOW: u32 = 500;
/// Cells acknowledged by one stream-level SENDME.
pub const STREAM_SENDME_INCREMENT: u32 = 50;
/// How many unacknowledged digests a sender may hold (the largest congestion window / increment,
/// plus slack).
const MAX_PENDING_DIGESTS: usize = (CC_CWND_LIMIT / CIRCUIT_SENDME_INCREMENT) as usize + 2;

/// Why a flow-control message was refused: the peer violated the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    /// The peer sent more DATA cells than the window allows.
    #[error("peer exceeded the {0} window")]
    WindowExceeded(&'static str),
    /// A SENDME arrived with nothing outstanding to acknowledge.
    #[error("unexpected {0} SENDME: nothing to acknowledge")]
    UnexpectedSendme(&'static str),
    /// An authenticated SENDME carried the wrong digest.
    #[error("circuit SENDME digest does not match the acknowledged cell")]
    BadSendmeDigest,
    /// A flow-control message this stream does not expect (XON/XOFF on a windowed stream,
    /// an XOFF before the XOFF limit was sent).
    #[error("unexpected {0}")]
    Unexpected(&'static str),
}

/// Circuit-level window state at one end of a circuit (client or exit).
///
/// The protocol part lives here (cells in flight, the digests authenticated SENDMEs must
/// echo, when each acknowledged cell left); how large the window is, is the congestion
/// control policy's ([`crate::cc`]).
#[derive(Debug)]
pub struct CircuitWindow {
    cc: Box<dyn CongestionControl>,
    /// DATA cells sent and not yet acknowledged.
    inflight: u32,
    sent_data_cells: u64,
    /// For each cell a SENDME will acknowledge: its running digest and when it was sent.
    pending: VecDeque<([u8; 20], Instant)>,
    delivered_data_cells: u64,
    /// Whether the window stopped the sender since the previous SENDME.
    blocked_since_sendme: bool,
}

impl CircuitWindow {
    /// A fixed window of `start` cells (clamped into 100..=1000): Tor's window before
    /// congestion control.
    pub fn new(start: u32) -> Self {
        Self::with_policy(Box::new(FixedWindow::new(start)))
    }

    /// A window sized by `cc`.
    pub fn with_policy(cc: Box<dyn CongestionControl>) -> Self {
        CircuitWindow {
            cc,
            inflight: 0,
            sent_data_cells: 0,
            pending: VecDeque::new(),
            delivered_data_cells: 0,
            blocked_since_sendme: false,
        }
    }

    /// May another DATA cell be sent now?
    pub fn can_package(&self) -> bool {
        self.inflight < self.cc.cwnd()
    }

    /// Cells that may still be sent before a SENDME is needed.
    pub fn package_window(&self) -> u32 {
        self.cc.cwnd().saturating_sub(self.inflight)
    }

    /// The congestion window now.
    pub fn cwnd(&self) -> u32 {
        self.cc.cwnd()
    }

    /// DATA cells sent and not yet acknowledged.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// The congestion-control policy (for stats).
    pub fn policy(&self) -> &dyn CongestionControl {
        self.cc.as_ref()
    }

    /// Record that one DATA cell with running digest `digest` was sent at `now`.
    pub fn on_data_sent(&mut self, digest: [u8; 20], now: Instant) {
        self.inflight = self.inflight.saturating_add(1);
        self.sent_data_cells += 1;
        if self
            .sent_data_cells
            .is_multiple_of(u64::from(CIRCUIT_SENDME_INCREMENT))
            && self.pending.len() < MAX_PENDING_DIGESTS
        {
            self.pending.push_back((digest, now));
        }
        if self.inflight >= self.cc.cwnd() {
            self.blocked_since_sendme = true;
        }
        self.cc.on_data_sent(self.inflight, now);
    }

    /// A circuit SENDME arrived at `now` (with its v1 digest, if any). Returns the round trip
    /// it measured (from sending the acknowledged cell to now).
    pub fn on_sendme(
        &mut self,
        digest: Option<[u8; 20]>,
        now: Instant,
    ) -> Result<Duration, FlowError> {
        let &(expected, sent_at) = self
            .pending
            .front()
            .ok_or(FlowError::UnexpectedSendme("circuit"))?;
        if let Some(d) = digest {
            if d != expected {
                return Err(FlowError::BadSendmeDigest);
            }
        }
        self.pending.pop_front();
        let ack = SendmeAck {
            inflight: self.inflight,
            acked: CIRCUIT_SENDME_INCREMENT,
            rtt: now.saturating_duration_since(sent_at),
            cwnd_full: self.blocked_since_sendme,
            now,
        };
        self.inflight = self.inflight.saturating_sub(CIRCUIT_SENDME_INCREMENT);
        self.blocked_since_sendme = false;
        self.cc.on_sendme(&ack);
        Ok(ack.rtt)
    }

    /// A DATA cell with running digest `digest` was received and delivered.
    /// Returns `Some(digest)` when a SENDME carrying it must be sent now.
    ///
    /// The receiver acknowledges eagerly (as Tor does for circuits), so its own
    /// count can never show an overrun; a sender that ignores its window is
    /// stopped by the relays' circuit queue limits instead.
    pub fn on_data_received(&mut self, digest: [u8; 20]) -> Option<[u8; 20]> {
        self.delivered_data_cells += 1;
        self.delivered_data_cells
            .is_multiple_of(u64::from(CIRCUIT_SENDME_INCREMENT))
            .then_some(digest)
    }
}

/// Stream-level window state at one end of a stream.
#[derive(Debug, Clone)]
pub struct StreamWindow {
    package: u32,
    /// DATA cells received from the peer and not yet acknowledged with a SENDME.
    received_unacked: u32,
    /// Of those, cells whose data the local side has fully written out.
    flushed_unacked: u32,
    /// Most cells the peer may have sent and not had acknowledged: one stream window, or
    /// one per leg for a stream of a linked set whose sender keeps a window per leg
    /// (`crate::streamflow::LegWindows`).
    receive_limit: u32,
}

impl Default for StreamWindow {
    fn default() -> Self {
        StreamWindow {
            package: STREAM_WINDOW,
            received_unacked: 0,
            flushed_unacked: 0,
            receive_limit: STREAM_WINDOW,
        }
    }
}

impl StreamWindow {
    /// May another DATA cell be sent on this stream?
    pub fn can_package(&self) -> bool {
        self.package > 0
    }

    /// One DATA cell was sent.
    pub fn on_data_sent(&mut self) {
        self.package = self.package.saturating_sub(1);
    }

    /// A stream SENDME arrived.
    pub fn on_sendme(&mut self) -> Result<(), FlowError> {
        if self.package + STREAM_SENDME_INCREMENT > STREAM_WINDOW {
            return Err(FlowError::UnexpectedSendme("stream"));
        }
        self.package += STREAM_SENDME_INCREMENT;
        Ok(())
    }

    /// Let the peer have `limit` cells unacknowledged (at least one stream window): a linked
    /// set's exit, whose client keeps a stream window per leg.
    pub fn set_receive_limit(&mut self, limit: u32) {
        self.receive_limit = limit.max(STREAM_WINDOW);
    }

    /// Cells received and not yet acknowledged with a SENDME.
    pub fn received_unacked(&self) -> u32 {
        self.received_unacked
    }

    /// A DATA cell arrived from the peer.
    pub fn on_data_received(&mut self) -> Result<(), FlowError> {
        if self.received_unacked >= self.receive_limit {
            return Err(FlowError::WindowExceeded("stream"));
        }
        self.received_unacked += 1;
        Ok(())
    }

    /// `cells` received cells were written out locally. Returns how many
    /// stream SENDMEs to send now (Tor sends them once data has left the
    /// edge's buffer, so a slow local reader throttles the sender).
    pub fn on_flushed(&mut self, cells: u32) -> u32 {
        self.flushed_unacked = (self.flushed_unacked + cells).min(self.received_unacked);
        let sendmes = self.flushed_unacked / STREAM_SENDME_INCREMENT;
        let acked = sendmes * STREAM_SENDME_INCREMENT;
        self.flushed_unacked -= acked;
        self.received_unacked -= acked;
        sendmes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        // One instant for tests where time plays no part.
        use std::sync::OnceLock;
        static T0: OnceLock<Instant> = OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn digest(n: u64) -> [u8; 20] {
        let mut d = [0u8; 20];
        d[..8].copy_from_slice(&n.to_be_bytes());
        d
    }

    /// Sender and receiver stay in step for every window start, 101 included:
    /// the sender never stalls forever and every authenticated SENDME verifies.
    #[test]
    fn every_window_start_flows_with_authenticated_sendmes() {
        for start in [100u32, 101, 150, 199, 200, 999, 1000] {
            let mut sender = CircuitWindow::new(start);
            let mut receiver = CircuitWindow::new(start);
            let mut sent = 0u64;
            let mut in_flight = Vec::new();
            while sent < 5_000 {
                while sender.can_package() && sent < 5_000 {
                    sent += 1;
                    sender.on_data_sent(digest(sent), t0());
                    in_flight.push(sent);
                }
                assert!(
                    !in_flight.is_empty(),
                    "window {start} stalled after {sent} cells"
                );
                for n in in_flight.drain(..) {
                    if let Some(d) = receiver.on_data_received(digest(n)) {
                        sender.on_sendme(Some(d), t0()).unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn window_limits_what_can_be_sent() {
        let mut w = CircuitWindow::new(101);
        for n in 0..101 {
            assert!(w.can_package());
            w.on_data_sent(digest(n), t0());
        }
        assert!(!w.can_package());
        assert_eq!(CircuitWindow::new(5).package_window(), 100);
        assert_eq!(CircuitWindow::new(5000).package_window(), 1000);
    }

    #[test]
    fn bad_or_unexpected_sendme_is_refused() {
        let mut w = CircuitWindow::new(1000);
        assert_eq!(
            w.on_sendme(None, t0()),
            Err(FlowError::UnexpectedSendme("circuit"))
        );
        for n in 1..=100 {
            w.on_data_sent(digest(n), t0());
        }
        assert_eq!(
            w.on_sendme(Some(digest(99)), t0()),
            Err(FlowError::BadSendmeDigest)
        );
    }

    #[test]
    fn receiver_polices_stream_window_overrun() {
        let mut s = StreamWindow::default();
        for _ in 0..STREAM_WINDOW {
            s.on_data_received().unwrap();
        }
        assert_eq!(
            s.on_data_received(),
            Err(FlowError::WindowExceeded("stream"))
        );
    }

    #[test]
    fn stream_sendme_only_after_flush() {
        let mut s = StreamWindow::default();
        for _ in 0..120 {
            s.on_data_received().unwrap();
        }
        assert_eq!(s.on_flushed(30), 0);
        assert_eq!(s.on_flushed(30), 1);
        assert_eq!(s.on_flushed(60), 1);
        assert_eq!(s.on_flushed(100), 0, "cannot flush more than was received");
        let mut p = StreamWindow::default();
        assert!(p.on_sendme().is_err(), "window already full");
        for _ in 0..STREAM_WINDOW {
            p.on_data_sent();
        }
        assert!(!p.can_package());
        p.on_sendme().unwrap();
        assert!(p.can_package());
    }

    #[test]
    fn a_wider_receive_limit_polices_at_that_limit() {
        let mut s = StreamWindow::default();
        s.set_receive_limit(2 * STREAM_WINDOW);
        for _ in 0..2 * STREAM_WINDOW {
            s.on_data_received().unwrap();
        }
        assert_eq!(s.received_unacked(), 2 * STREAM_WINDOW);
        assert!(s.on_data_received().is_err());
        let mut t = StreamWindow::default();
        t.set_receive_limit(1);
        for _ in 0..STREAM_WINDOW {
            t.on_data_received().unwrap();
        }
        assert!(t.on_data_received().is_err(), "never below one window");
    }
}
