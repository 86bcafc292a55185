//! The fixed window: Tor's circuit window before congestion control.

use super::{CongestionControl, SendmeAck};

/// A constant window of `circwindow` cells (100..=1000).
///
/// Tor keeps a package window that starts at `circwindow`, loses one per DATA cell and
/// gains 100 per SENDME (capped at 1000). That is `circwindow - inflight`: SENDMEs only
/// acknowledge cells that were sent, so the cap can never bind for an honest peer, and a
/// SENDME with nothing to acknowledge is refused before it reaches the policy.
#[derive(Debug, Clone)]
pub struct FixedWindow {
    window: u32,
}

impl FixedWindow {
    /// A window of `window` cells, clamped to the protocol's 100..=1000.
    pub fn new(window: u32) -> Self {
        FixedWindow {
            window: window.clamp(
                crate::flow::CIRCUIT_WINDOW_MIN,
                crate::flow::CIRCUIT_WINDOW_MAX,
            ),
        }
    }
}

impl CongestionControl for FixedWindow {
    fn cwnd(&self) -> u32 {
        self.window
    }

    fn on_sendme(&mut self, _ack: &SendmeAck) {}

    fn keeps_stream_window(&self) -> bool {
        true
    }
}
