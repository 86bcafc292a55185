//! Circuit congestion control: how many DATA cells an edge (an exit, or a client
//! uploading) may have unacknowledged on one circuit.
//!
//! [`crate::flow::CircuitWindow`] keeps the protocol part, which is the same for every
//! policy: it counts cells in flight, remembers the digests that authenticated SENDMEs must
//! echo, and times the round trip from each acknowledged cell to its SENDME. A policy only
//! owns the congestion window (`cwnd`): the edge may package while `inflight < cwnd`.
//!
//! Hooks, in the order the window calls them:
//! - [`CongestionControl::cwnd`] (mandatory): the window now; read before every DATA cell.
//! - [`CongestionControl::on_data_sent`] (optional, default no-op): one DATA cell went into
//!   the circuit queue; `inflight` counts it.
//! - [`CongestionControl::on_sendme`] (mandatory): a SENDME acknowledged
//!   [`crate::flow::CIRCUIT_SENDME_INCREMENT`] cells, with the round trip it measured and
//!   whether the window was in use ([`SendmeAck`]). RTT-based policies adjust here.
//! - [`CongestionControl::in_slow_start`] (optional, default `false`): for stats and logs.
//! - [`CongestionControl::keeps_stream_window`] (optional, default `false`): whether the
//!   circuit's streams keep the 500-cell stream window (fixed windows) or use XON/XOFF.
//! - [`CongestionControl::min_rtt`], [`CongestionControl::smoothed_rtt`] (optional, default
//!   `None`): for metrics.
//!
//! `now` is passed in (sans-IO): the driver reads the clock once per event.
//!
//! Policies: [`FixedWindow`] (Tor before 0.4.7 and chive's default: the window is the
//! consensus `circwindow`, or the relay's own `CircuitWindow`) and [`Vegas`] (an RTT-based
//! window in the spirit of Tor's proposal 324 TOR_VEGAS). [`CcKind`] chooses one by
//! configuration (the consensus parameter `cc_alg`: 0 fixed, 2 Vegas, as Tor numbers them).

mod fixed;
mod vegas;

#[cfg(test)]
mod shared_path;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

pub use fixed::FixedWindow;
pub use vegas::{Vegas, VegasParams};

/// The largest congestion window any policy may open, in cells.
///
/// The receiving edge acknowledges every 100 cells eagerly and never polices the circuit
/// window, so what bounds a sender is the relays' per-circuit queue limit
/// (`CoreConfig::max_circuit_queue`, 2500 by default): the window stays below it, so a
/// whole window queued at one bottleneck does not get an honest circuit killed.
pub const CC_CWND_LIMIT: u32 = 2000;

/// What a SENDME told the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendmeAck {
    /// Cells in flight when the SENDME arrived, before it acknowledged any.
    pub inflight: u32,
    /// Cells this SENDME acknowledged.
    pub acked: u32,
    /// Time from sending the acknowledged cell to receiving its SENDME.
    pub rtt: Duration,
    /// Whether the window was in use: the sender had packaged up to the window since the
    /// previous SENDME. An application-limited circuit says nothing about the path's
    /// capacity, so policies do not grow on it.
    pub cwnd_full: bool,
    /// When the SENDME arrived.
    pub now: Instant,
}

/// A circuit congestion-control policy (one instance per circuit edge). See the module docs
/// for the order of the hooks.
pub trait CongestionControl: Send + std::fmt::Debug {
    /// The congestion window: cells that may be unacknowledged at once.
    fn cwnd(&self) -> u32;

    /// One DATA cell was packaged; `inflight` includes it.
    fn on_data_sent(&mut self, _inflight: u32, _now: Instant) {}

    /// A SENDME acknowledged `ack.acked` cells.
    fn on_sendme(&mut self, ack: &SendmeAck);

    /// Whether the policy is still probing upward fast (slow start).
    fn in_slow_start(&self) -> bool {
        false
    }

    /// Whether streams on this circuit keep Tor's 500-cell stream window (true only for
    /// fixed windows); otherwise they use XON/XOFF ([`crate::streamflow`]), so a stream may
    /// use the whole congestion window.
    fn keeps_stream_window(&self) -> bool {
        false
    }

    /// The smallest round trip the policy has seen, if it keeps one (for metrics).
    fn min_rtt(&self) -> Option<Duration> {
        None
    }

    /// The smoothed round trip the policy steers by, if it keeps one (for metrics).
    fn smoothed_rtt(&self) -> Option<Duration> {
        None
    }
}

/// Which congestion-control policy circuit edges use (consensus `cc_alg`).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum CcKind {
    /// `cc_alg=0`: the window is fixed at the circuit window (`circwindow`, or the relay's
    /// own override). Byte for byte what chive did before congestion control existed.
    #[default]
    Fixed,
    /// `cc_alg=2`: RTT-based window (proposal 324's TOR_VEGAS, adapted to chive's SENDMEs).
    Vegas(VegasParams),
}

impl CcKind {
    /// Tor's number for the algorithm (the `cc_alg` consensus parameter).
    pub fn alg(&self) -> u8 {
        match self {
            CcKind::Fixed => 0,
            CcKind::Vegas(_) => 2,
        }
    }

    /// A policy instance for one new circuit edge; `circwindow` is the fixed window this
    /// node would use (the consensus value or its own override), already clamped to
    /// 100..=1000.
    pub fn build(&self, circwindow: u32) -> Box<dyn CongestionControl> {
        match self {
            CcKind::Fixed => Box::new(FixedWindow::new(circwindow)),
            CcKind::Vegas(p) => Box::new(Vegas::new(*p)),
        }
    }
}
