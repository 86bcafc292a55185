//! Stream flow control: what keeps one stream from filling the receiving edge's buffer
//! toward its application.
//!
//! Two mechanisms, chosen per stream by the circuit's congestion control:
//!
//! - [`StreamFlow::Window`] (`cc_alg=0`): Tor's 500-cell stream window with stream SENDMEs
//!   every 50 cells written out ([`StreamWindow`]), byte for byte what chive always did. It
//!   caps one stream at 500 cells in flight, whatever the circuit window.
//! - [`StreamFlow::XonXoff`] (`cc_alg != 0`): no stream window (proposal 324 section 4, the
//!   XON/XOFF design Tor uses with congestion control). The receiving edge counts cells
//!   handed to its application and not yet written out; past `xoff_cells` it sends XOFF and
//!   the sender stops packaging that stream; once the buffer has drained to half of that it
//!   sends XON with the drain rate it measured since the XOFF (advisory: 1000 bytes/s, 0 =
//!   unlimited) and the sender resumes. A stream is then limited by the circuit's congestion
//!   window only, and a slow reader still pushes back.
//!
//! Bounds: a sender that ignores XOFF can put at most a congestion window more into the
//! receiver's buffer; beyond `xoff_cells + CC_CWND_LIMIT + 100` cells unwritten the stream is
//! closed as a protocol violation ([`FlowError::WindowExceeded`]). An XOFF before the sender
//! sent `xoff_cells` cells on the stream is refused (proposal 324 section 4.1.4: an early XOFF
//! is a side channel), and so is XON/XOFF on a windowed stream or a stream SENDME on an
//! XON/XOFF one: both ends choose the mechanism from the same consensus `cc_alg`.
//!
//! A stream of a linked set (path switching, `crate::switching::path`) under fixed windows
//! keeps, at its client, one stream window *per leg* ([`LegWindows`]): cells queued behind a
//! congested entry then hold only that leg's window, and a switch sends its first cell on the
//! other leg at once. The exit's stream SENDMEs are unchanged (one per 50 cells written out,
//! in stream order); the client knows which leg it charged each cell to, so each SENDME
//! credits the legs of the 50 oldest unacknowledged cells. The exit lets such a stream have
//! one window per leg unacknowledged ([`StreamFlow::set_receive_limit`]).
//!
//! Not here: rate limiting by the XON's advisory rate (the sender records it in
//! [`XonXoff::advised_kbps`] but does not pace by it); advisory XONs while the buffer is
//! non-empty without an XOFF before (Tor sends them when the rate changes by
//! `cc_xon_change_pct`).

use std::collections::VecDeque;
use std::time::Instant;

use chive_cell::RELAY_DATA_LEN;

use crate::cc::CC_CWND_LIMIT;
use crate::flow::{
    FlowError, StreamWindow, CIRCUIT_SENDME_INCREMENT, STREAM_SENDME_INCREMENT, STREAM_WINDOW,
};
use crate::CircKey;

/// Cells a receiving edge may hold for its application before it sends XOFF (Tor's
/// `cc_xoff_client` / `cc_xoff_exit` default: 500 cells).
pub const XOFF_CELLS: u32 = 500;

/// What the receiving edge must send after a flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flushed {
    /// Stream SENDMEs (windowed streams).
    pub sendmes: u32,
    /// An XON with this advisory rate (1000 bytes/s; 0 = unlimited).
    pub xon: Option<u32>,
}

/// XON/XOFF state of one stream, both directions (an edge both sends and receives).
#[derive(Clone, Debug)]
pub struct XonXoff {
    xoff_cells: u32,
    // --- sending side
    /// The peer said XOFF and no XON since.
    paused: bool,
    /// DATA cells sent on the stream.
    sent: u64,
    /// The rate of the last XON (1000 bytes/s, 0 = unlimited).
    pub advised_kbps: u32,
    // --- receiving side
    /// DATA cells handed to the application and not yet written out.
    unflushed: u32,
    /// When we sent XOFF (None: no XOFF outstanding).
    xoff_at: Option<Instant>,
    /// Bytes written out since that XOFF (for the XON's rate).
    drained_bytes: u64,
}

impl XonXoff {
    /// A stream with the XOFF threshold `xoff_cells` (at least 1).
    pub fn new(xoff_cells: u32) -> Self {
        XonXoff {
            xoff_cells: xoff_cells.max(1),
            paused: false,
            sent: 0,
            advised_kbps: 0,
            unflushed: 0,
            xoff_at: None,
            drained_bytes: 0,
        }
    }

    /// Cells beyond which the receiver closes the stream: the threshold plus the most a
    /// sender can have in flight when the XOFF reaches it.
    pub fn hard_limit(&self) -> u32 {
        self.xoff_cells + CC_CWND_LIMIT + CIRCUIT_SENDME_INCREMENT
    }

    /// Cells handed to the application and not yet written out.
    pub fn unflushed(&self) -> u32 {
        self.unflushed
    }

    /// Whether the peer has us stopped.
    pub fn paused(&self) -> bool {
        self.paused
    }
}

/// The sending side of a linked set's stream under fixed windows: one 500-cell stream window
/// per leg. A cell is charged to the leg it is first sent on (a fallback's re-send of it on
/// the old leg keeps that charge: the exit delivers it once, whichever copy comes first).
/// The exit acknowledges in stream order (a SENDME per 50 cells written out, as for any
/// windowed stream), so a SENDME frees the legs the 50 oldest unacknowledged cells were
/// charged to, whichever leg brings it. Exactly once per cell, whatever the legs did.
#[derive(Clone, Debug, Default)]
pub struct LegWindows {
    /// The cells sent and not yet acknowledged, oldest first, as runs of (leg, cells).
    unacked: VecDeque<(CircKey, u32)>,
}

impl LegWindows {
    /// Cells charged to `leg` and not yet acknowledged.
    pub fn in_flight(&self, leg: CircKey) -> u32 {
        self.unacked
            .iter()
            .filter(|(l, _)| *l == leg)
            .map(|(_, n)| n)
            .sum()
    }

    /// Cells not yet acknowledged, over every leg.
    pub fn unacked(&self) -> u32 {
        self.unacked.iter().map(|(_, n)| n).sum()
    }

    /// May another DATA cell go on `leg`?
    pub fn can_package(&self, leg: CircKey) -> bool {
        self.in_flight(leg) < STREAM_WINDOW
    }

    /// A DATA cell went on `leg`.
    pub fn on_data_sent(&mut self, leg: CircKey) {
        match self.unacked.back_mut() {
            Some((l, n)) if *l == leg => *n += 1,
            _ => self.unacked.push_back((leg, 1)),
        }
    }

    /// A stream SENDME arrived: the 50 oldest cells are acknowledged. Fewer outstanding is
    /// the peer acknowledging what was never sent.
    pub fn on_sendme(&mut self) -> Result<(), FlowError> {
        if self.unacked() < STREAM_SENDME_INCREMENT {
            return Err(FlowError::UnexpectedSendme("stream (per leg)"));
        }
        let mut left = STREAM_SENDME_INCREMENT;
        while left > 0 {
            let Some((_, n)) = self.unacked.front_mut() else {
                break;
            };
            let take = left.min(*n);
            *n -= take;
            left -= take;
            if *n == 0 {
                self.unacked.pop_front();
            }
        }
        Ok(())
    }
}

/// The flow control of one stream (see the module docs).
#[derive(Clone, Debug)]
pub enum StreamFlow {
    /// Tor's 500-cell stream window (fixed circuit windows).
    Window(StreamWindow),
    /// XON/XOFF (congestion control on).
    XonXoff(XonXoff),
}

impl StreamFlow {
    /// The flow control for a new stream: XON/XOFF with `xoff_cells` when the circuit runs
    /// congestion control, else the stream window.
    pub fn new(xon_xoff: bool, xoff_cells: u32) -> Self {
        if xon_xoff {
            StreamFlow::XonXoff(XonXoff::new(xoff_cells))
        } else {
            StreamFlow::Window(StreamWindow::default())
        }
    }

    /// Let the peer have `limit` DATA cells unacknowledged (a linked set's exit: one window
    /// per leg). No effect under XON/XOFF.
    pub fn set_receive_limit(&mut self, limit: u32) {
        if let StreamFlow::Window(w) = self {
            w.set_receive_limit(limit);
        }
    }

    /// Windowed streams: DATA cells received and not yet acknowledged.
    pub fn received_unacked(&self) -> Option<u32> {
        match self {
            StreamFlow::Window(w) => Some(w.received_unacked()),
            StreamFlow::XonXoff(_) => None,
        }
    }

    /// May another DATA cell be sent on this stream?
    pub fn can_package(&self) -> bool {
        match self {
            StreamFlow::Window(w) => w.can_package(),
            StreamFlow::XonXoff(x) => !x.paused,
        }
    }

    /// One DATA cell was sent.
    pub fn on_data_sent(&mut self) {
        match self {
            StreamFlow::Window(w) => w.on_data_sent(),
            StreamFlow::XonXoff(x) => x.sent += 1,
        }
    }

    /// A DATA cell arrived for the application. `Ok(true)`: send XOFF now.
    pub fn on_data_received(&mut self, now: Instant) -> Result<bool, FlowError> {
        match self {
            StreamFlow::Window(w) => w.on_data_received().map(|()| false),
            StreamFlow::XonXoff(x) => {
                if x.unflushed >= x.hard_limit() {
                    return Err(FlowError::WindowExceeded("stream buffer (XOFF ignored)"));
                }
                x.unflushed += 1;
                if x.xoff_at.is_none() && x.unflushed > x.xoff_cells {
                    x.xoff_at = Some(now);
                    x.drained_bytes = 0;
                    return Ok(true);
                }
                Ok(false)
            }
        }
    }

    /// `cells` received cells were written out to the application.
    pub fn on_flushed(&mut self, cells: u32, now: Instant) -> Flushed {
        match self {
            StreamFlow::Window(w) => Flushed {
                sendmes: w.on_flushed(cells),
                xon: None,
            },
            StreamFlow::XonXoff(x) => {
                let cells = cells.min(x.unflushed);
                x.unflushed -= cells;
                let Some(at) = x.xoff_at else {
                    return Flushed::default();
                };
                x.drained_bytes += u64::from(cells) * RELAY_DATA_LEN as u64;
                // Resume before the buffer runs dry: what is left (half the threshold) covers
                // the XON's trip to the sender and the first cells' trip back.
                if x.unflushed > x.xoff_cells / 2 {
                    return Flushed::default();
                }
                x.xoff_at = None;
                let ms = now.saturating_duration_since(at).as_millis();
                // bytes per ms = 1000 bytes/s; no elapsed time measured: unlimited (0).
                let kbps = u128::from(x.drained_bytes)
                    .checked_div(ms)
                    .map_or(0, |r| u32::try_from(r).unwrap_or(u32::MAX).max(1));
                Flushed {
                    sendmes: 0,
                    xon: Some(kbps),
                }
            }
        }
    }

    /// A stream SENDME arrived.
    pub fn on_sendme(&mut self) -> Result<(), FlowError> {
        match self {
            StreamFlow::Window(w) => w.on_sendme(),
            StreamFlow::XonXoff(_) => Err(FlowError::UnexpectedSendme("stream (XON/XOFF in use)")),
        }
    }

    /// An XOFF arrived: stop packaging.
    pub fn on_xoff(&mut self) -> Result<(), FlowError> {
        match self {
            StreamFlow::Window(_) => Err(FlowError::Unexpected("XOFF on a windowed stream")),
            StreamFlow::XonXoff(x) if x.sent < u64::from(x.xoff_cells) => {
                Err(FlowError::Unexpected("XOFF before the XOFF limit was sent"))
            }
            StreamFlow::XonXoff(x) => {
                x.paused = true;
                Ok(())
            }
        }
    }

    /// An XON arrived: resume, noting the advisory rate.
    pub fn on_xon(&mut self, kbps: u32) -> Result<(), FlowError> {
        match self {
            StreamFlow::Window(_) => Err(FlowError::Unexpected("XON on a windowed stream")),
            StreamFlow::XonXoff(x) => {
                x.paused = false;
                x.advised_kbps = kbps;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn leg_windows_are_separate_and_sendmes_free_the_oldest_cells_legs() {
        let (a, b) = (CircKey(1), CircKey(2));
        let mut w = LegWindows::default();
        for _ in 0..STREAM_WINDOW {
            assert!(w.can_package(a));
            w.on_data_sent(a);
        }
        assert!(!w.can_package(a), "A's window used up");
        assert!(w.can_package(b), "B has its own");
        for _ in 0..30 {
            w.on_data_sent(b);
        }
        assert_eq!((w.in_flight(a), w.in_flight(b)), (500, 30));
        // The first SENDMEs acknowledge A's cells (sent first), not B's.
        w.on_sendme().unwrap();
        assert_eq!((w.in_flight(a), w.in_flight(b)), (450, 30));
        for _ in 0..9 {
            w.on_sendme().unwrap();
        }
        assert_eq!((w.in_flight(a), w.in_flight(b)), (0, 30));
        // 30 left: a SENDME for 50 is one for cells never sent.
        assert!(w.on_sendme().is_err());
        for _ in 0..20 {
            w.on_data_sent(a);
        }
        // A run spanning legs: 30 of B then 20 of A.
        w.on_sendme().unwrap();
        assert_eq!((w.unacked(), w.in_flight(a), w.in_flight(b)), (0, 0, 0));
    }

    #[test]
    fn window_mode_is_the_stream_window() {
        let mut f = StreamFlow::new(false, XOFF_CELLS);
        let now = Instant::now();
        for _ in 0..500 {
            assert!(f.can_package());
            f.on_data_sent();
        }
        assert!(!f.can_package(), "500-cell stream window");
        assert!(f.on_xoff().is_err() && f.on_xon(0).is_err());
        for _ in 0..500 {
            assert_eq!(f.on_data_received(now), Ok(false));
        }
        assert!(f.on_data_received(now).is_err());
        assert_eq!(f.on_flushed(100, now).sendmes, 2);
    }

    #[test]
    fn xoff_past_the_threshold_and_xon_at_half_with_the_rate() {
        let mut f = StreamFlow::new(true, 500);
        let t0 = Instant::now();
        for _ in 0..500 {
            assert_eq!(f.on_data_received(t0), Ok(false));
        }
        assert_eq!(f.on_data_received(t0), Ok(true), "501st cell: XOFF");
        assert_eq!(f.on_data_received(t0), Ok(false), "one XOFF only");
        // 252 of 502 written in 1 s (250 left, half the threshold): 252 * 498 bytes/s.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            f.on_flushed(200, t1),
            Flushed::default(),
            "302 left: no XON"
        );
        assert_eq!(f.on_flushed(51, t1), Flushed::default(), "251 left: no XON");
        let got = f.on_flushed(1, t1);
        assert_eq!(got.xon, Some(252 * 498 / 1000));
        assert_eq!(f.on_flushed(250, t1), Flushed::default(), "XON once");
    }

    #[test]
    fn sender_pauses_and_refuses_early_xoff_and_stream_sendme() {
        let mut f = StreamFlow::new(true, 500);
        for _ in 0..499 {
            f.on_data_sent();
        }
        assert!(f.on_xoff().is_err(), "XOFF before 500 cells sent");
        f.on_data_sent();
        for _ in 0..5000 {
            assert!(f.can_package(), "no stream window");
            f.on_data_sent();
        }
        f.on_xoff().unwrap();
        assert!(!f.can_package());
        f.on_xon(1234).unwrap();
        assert!(f.can_package());
        assert!(f.on_sendme().is_err());
    }

    #[test]
    fn receiver_buffer_is_bounded() {
        let mut f = StreamFlow::new(true, 500);
        let now = Instant::now();
        let StreamFlow::XonXoff(x) = &f else {
            unreachable!()
        };
        let hard = x.hard_limit();
        for _ in 0..hard {
            f.on_data_received(now).unwrap();
        }
        assert!(f.on_data_received(now).is_err(), "sender ignored XOFF");
    }
}
