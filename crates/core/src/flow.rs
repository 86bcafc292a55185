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
/// How many unacknowledged digests a sender may hold (window max / increment, plus slack).
const MAX_PENDING_DIGESTS: usize = (CIRCUIT_WINDOW_MAX / CIRCUIT_SENDME_INCREMENT) as usize + 2;

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
}

/// Circuit-level window state at one end of a circuit (client or exit).
#[derive(Debug, Clone)]
pub struct CircuitWindow {
    package: u32,
    sent_data_cells: u64,
    pending_digests: VecDeque<[u8; 20]>,
    delivered_data_cells: u64,
}

impl CircuitWindow {
    /// A window starting at `start` cells (clamped into 100..=1000).
    pub fn new(start: u32) -> Self {
        CircuitWindow {
            package: start.clamp(CIRCUIT_WINDOW_MIN, CIRCUIT_WINDOW_MAX),
            sent_data_cells: 0,
            pending_digests: VecDeque::new(),
            delivered_data_cells: 0,
        }
    }

    /// May another DATA cell be sent now?
    pub fn can_package(&self) -> bool {
        self.package > 0
    }

    /// Cells that may still be sent before a SENDME is needed.
    pub fn package_window(&self) -> u32 {
        self.package
    }

    /// Record that one DATA cell with running digest `digest` was sent.
    pub fn on_data_sent(&mut self, digest: [u8; 20]) {
        self.package = self.package.saturating_sub(1);
        self.sent_data_cells += 1;
        if self
            .sent_data_cells
            .is_multiple_of(u64::from(CIRCUIT_SENDME_INCREMENT))
            && self.pending_digests.len() < MAX_PENDING_DIGESTS
        {
            self.pending_digests.push_back(digest);
        }
    }

    /// A circuit SENDME arrived (with its v1 digest, if any).
    pub fn on_sendme(&mut self, digest: Option<[u8; 20]>) -> Result<(), FlowError> {
        let expected = self
            .pending_digests
            .pop_front()
            .ok_or(FlowError::UnexpectedSendme("circuit"))?;
        if let Some(d) = digest {
            if d != expected {
                return Err(FlowError::BadSendmeDigest);
            }
        }
        self.package = (self.package + CIRCUIT_SENDME_INCREMENT).min(CIRCUIT_WINDOW_MAX);
        Ok(())
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
}

impl Default for StreamWindow {
    fn default() -> Self {
        StreamWindow {
            package: STREAM_WINDOW,
            received_unacked: 0,
            flushed_unacked: 0,
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

    /// A DATA cell arrived from the peer.
    pub fn on_data_received(&mut self) -> Result<(), FlowError> {
        if self.received_unacked >= STREAM_WINDOW {
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
                    sender.on_data_sent(digest(sent));
                    in_flight.push(sent);
                }
                assert!(
                    !in_flight.is_empty(),
                    "window {start} stalled after {sent} cells"
                );
                for n in in_flight.drain(..) {
                    if let Some(d) = receiver.on_data_received(digest(n)) {
                        sender.on_sendme(Some(d)).unwrap();
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
            w.on_data_sent(digest(n));
        }
        assert!(!w.can_package());
        assert_eq!(CircuitWindow::new(5).package_window(), 100);
        assert_eq!(CircuitWindow::new(5000).package_window(), 1000);
    }

    #[test]
    fn bad_or_unexpected_sendme_is_refused() {
        let mut w = CircuitWindow::new(1000);
        assert_eq!(
            w.on_sendme(None),
            Err(FlowError::UnexpectedSendme("circuit"))
        );
        for n in 1..=100 {
            w.on_data_sent(digest(n));
        }
        assert_eq!(
            w.on_sendme(Some(digest(99))),
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
}
