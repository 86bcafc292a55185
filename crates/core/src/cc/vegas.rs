//! An RTT-based window after Tor's TOR_VEGAS (proposal 324, section 3.3), adapted to
//! chive's SENDMEs, which acknowledge every 100th cell rather than Tor's 31st.
//!
//! Why Vegas: a circuit's sender sees no loss (cells are never dropped), only delay, so a
//! delay-based controller is the one that can work; Tor chose it after simulating Westwood
//! and NOLA too. The idea: with a congestion window `cwnd` and the smallest round trip seen
//! `min_rtt` (the path's propagation delay), a path moving `cwnd` cells per smoothed RTT
//! `rtt` holds `bdp = cwnd * min_rtt / rtt` cells in flight on the wire; the rest,
//! `queue_use = cwnd - bdp`, sits in queues. Vegas keeps `queue_use` between `alpha` and
//! `beta` cells: enough queued that the bottleneck never idles, few enough that the
//! circuit's cells (and everyone else's behind them) do not wait long.
//!
//! - Slow start: on every SENDME while `queue_use < gamma`, grow by `cwnd_inc_pct_ss`
//!   percent of the window per round trip (100 = double per RTT); leave slow start at
//!   `cwnd = bdp + gamma` once queues pass `gamma`, or at `ss_max`.
//! - Steady state, once per window of acknowledgements (one RTT): above `delta` cut to
//!   `bdp + delta - cwnd_inc`; above `beta` shrink to the middle of the band,
//!   `bdp + (alpha + beta) / 2`, or by `cwnd_inc` if that is more; below `alpha` (and only if
//!   the window was in use) grow by `cwnd_inc`.
//! - Always within `cwnd_min..=cwnd_max`.
//!
//! Two departures from Tor's numbers and rules, both for circuits that share a bottleneck
//! with bulk downloads (paper 004's torperf fetches; measured on the simulated shared path in
//! `cc::tests` and on the netns testbed, issue 17):
//! - Queue targets of 1, 3, 2 and 5 output buffers (alpha 64, beta 192, gamma 128, delta
//!   320 cells) instead of Tor's 2, 4, 3 and 6. In a FIFO bottleneck every Vegas circuit
//!   keeps `alpha..beta` of its own cells queued, so the standing queue is that times the
//!   circuits, and every other cell (a CONNECTED, the first bytes of a page) waits behind it.
//!   The smaller band cuts the standing queue by about a third; with chive's 100-cell SENDMEs
//!   the band (128 cells) is still wider than one step, and a lone circuit still fills its
//!   path (`vegas_window_grows_to_the_bandwidth_delay_product`).
//! - Above `beta`, Tor shrinks by one step per round trip, so a circuit that arrives at a
//!   bottleneck where others already queue waits `queue_use / cwnd_inc` round trips for them
//!   to make room: longer than a 1 MiB fetch lasts. Cutting straight to the middle of the
//!   band (as the `delta` rule cuts to `delta`) gives it its share within a round trip or two.
//!
//! Not here (compared with Tor): the signal from a blocked local channel (chive's driver
//! bounds each connection's output buffer instead), the `min_rtt` reset heuristics for a
//! path whose base delay rises, and negotiation of the SENDME increment (see docs/protocol.md).

use std::time::Duration;

use super::{CongestionControl, SendmeAck, CC_CWND_LIMIT};
use crate::flow::{CIRCUIT_SENDME_INCREMENT, CIRCUIT_WINDOW_MIN};

/// Vegas's tunables (the consensus parameters of the same names, Tor's `_exit` set: every
/// chive circuit is a three-hop exit circuit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VegasParams {
    /// `cc_cwnd_init`: the first window. 200 = two SENDME increments, so one SENDME can be
    /// on its way back while the next hundred cells go out (Tor: 4 × its increment of 31).
    pub cwnd_init: u32,
    /// `cc_cwnd_min`: never below one SENDME increment, or no SENDME would ever come back.
    pub cwnd_min: u32,
    /// `cc_cwnd_max`: at most [`CC_CWND_LIMIT`].
    pub cwnd_max: u32,
    /// `cc_cwnd_inc`: the steady-state step, once per round trip (Tor: one increment, 31).
    pub cwnd_inc: u32,
    /// `cc_cwnd_inc_pct_ss`: slow-start growth per round trip, percent of the window.
    pub cwnd_inc_pct_ss: u32,
    /// `cc_ss_max`: slow start ends here at the latest.
    pub ss_max: u32,
    /// `cc_vegas_alpha_exit`: below this many queued cells, grow.
    pub alpha: u32,
    /// `cc_vegas_beta_exit`: above this many queued cells, shrink.
    pub beta: u32,
    /// `cc_vegas_gamma_exit`: slow start ends when this many cells are queued.
    pub gamma: u32,
    /// `cc_vegas_delta_exit`: above this many queued cells, cut to `bdp + delta - cwnd_inc`.
    pub delta: u32,
    /// `cc_ewma_cwnd_pct`: the smoothed RTT averages over this percent of a window's SENDMEs.
    pub ewma_cwnd_pct: u32,
}

impl Default for VegasParams {
    /// Multiples of chive's 64-cell output buffer (`OutbufCells`), one fewer than Tor's
    /// exit thresholds in its 62-cell buffers (alpha 1, beta 3, gamma 2, delta 5 buffers;
    /// Tor: 2, 4, 3, 6): see the module docs. `beta - alpha` (128) exceeds one step (100), so
    /// a window inside the band stays put instead of hopping over it.
    fn default() -> Self {
        VegasParams {
            cwnd_init: 2 * CIRCUIT_SENDME_INCREMENT,
            cwnd_min: CIRCUIT_WINDOW_MIN,
            cwnd_max: CC_CWND_LIMIT,
            cwnd_inc: CIRCUIT_SENDME_INCREMENT,
            cwnd_inc_pct_ss: 100,
            ss_max: CC_CWND_LIMIT,
            alpha: 64,
            beta: 3 * 64,
            gamma: 2 * 64,
            delta: 5 * 64,
            ewma_cwnd_pct: 50,
        }
    }
}

impl VegasParams {
    /// The same parameters with the bounds made consistent: `cwnd_min` at least one SENDME
    /// increment, `cwnd_max` within `cwnd_min..=CC_CWND_LIMIT`, the rest inside those.
    pub fn sanitized(mut self) -> Self {
        self.cwnd_min = self.cwnd_min.clamp(CIRCUIT_SENDME_INCREMENT, CC_CWND_LIMIT);
        self.cwnd_max = self.cwnd_max.clamp(self.cwnd_min, CC_CWND_LIMIT);
        self.cwnd_init = self.cwnd_init.clamp(self.cwnd_min, self.cwnd_max);
        self.ss_max = self.ss_max.clamp(self.cwnd_min, self.cwnd_max);
        self.cwnd_inc = self.cwnd_inc.max(1);
        self.ewma_cwnd_pct = self.ewma_cwnd_pct.clamp(1, 100);
        self
    }
}

/// The Vegas policy for one circuit edge. See the module docs.
#[derive(Debug, Clone)]
pub struct Vegas {
    p: VegasParams,
    cwnd: u32,
    slow_start: bool,
    min_rtt: Option<Duration>,
    /// Smoothed RTT in seconds.
    ewma_rtt: Option<f64>,
    /// SENDMEs to wait before the next steady-state adjustment (one window's worth).
    sendmes_until_update: u32,
}

impl Vegas {
    /// A policy in slow start at `cwnd_init`.
    pub fn new(params: VegasParams) -> Self {
        let p = params.sanitized();
        Vegas {
            p,
            cwnd: p.cwnd_init,
            slow_start: true,
            min_rtt: None,
            ewma_rtt: None,
            sendmes_until_update: 0,
        }
    }

    /// The current estimate of the path's bandwidth-delay product, in cells.
    pub fn bdp(&self) -> Option<u32> {
        let (min, ewma) = (self.min_rtt?.as_secs_f64(), self.ewma_rtt?);
        if ewma <= 0.0 {
            return Some(self.cwnd);
        }
        // min <= ewma, so this never exceeds cwnd.
        Some((f64::from(self.cwnd) * (min / ewma).min(1.0)) as u32)
    }

    /// The smallest round trip seen (the path's base delay, as far as this circuit knows).
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    fn sendmes_per_window(&self) -> u32 {
        (self.cwnd / CIRCUIT_SENDME_INCREMENT).max(1)
    }

    fn update_rtt(&mut self, rtt: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        let n = (self.sendmes_per_window() * self.p.ewma_cwnd_pct / 100).max(2);
        let w = 2.0 / f64::from(n + 1);
        let sample = rtt.as_secs_f64();
        self.ewma_rtt = Some(match self.ewma_rtt {
            None => sample,
            Some(e) => w * sample + (1.0 - w) * e,
        });
    }
}

impl CongestionControl for Vegas {
    fn cwnd(&self) -> u32 {
        self.cwnd
    }

    fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    fn smoothed_rtt(&self) -> Option<Duration> {
        self.ewma_rtt.map(Duration::from_secs_f64)
    }

    fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    fn on_sendme(&mut self, ack: &SendmeAck) {
        self.update_rtt(ack.rtt);
        let bdp = self.bdp().unwrap_or(self.cwnd);
        let queue_use = self.cwnd.saturating_sub(bdp);
        let p = self.p;
        if self.slow_start {
            if queue_use < p.gamma {
                if ack.cwnd_full {
                    // Spread one round trip's growth over its SENDMEs.
                    let step = (u64::from(self.cwnd) * u64::from(p.cwnd_inc_pct_ss) / 100)
                        / u64::from(self.sendmes_per_window());
                    self.cwnd = self
                        .cwnd
                        .saturating_add(u32::try_from(step.max(1)).unwrap_or(u32::MAX));
                }
            } else {
                self.cwnd = bdp.saturating_add(p.gamma);
                self.slow_start = false;
            }
            if self.cwnd >= p.ss_max {
                self.cwnd = p.ss_max;
                self.slow_start = false;
            }
            if !self.slow_start {
                self.sendmes_until_update = self.sendmes_per_window();
            }
        } else {
            self.sendmes_until_update = self.sendmes_until_update.saturating_sub(1);
            if self.sendmes_until_update == 0 {
                if queue_use > p.delta {
                    self.cwnd = (bdp + p.delta).saturating_sub(p.cwnd_inc);
                } else if queue_use > p.beta {
                    // Back into the band in one step: to its middle, or by `cwnd_inc` if that
                    // is further (see the module docs).
                    let middle = bdp.saturating_add((p.alpha + p.beta) / 2);
                    self.cwnd = self.cwnd.saturating_sub(p.cwnd_inc).min(middle);
                } else if queue_use < p.alpha && ack.cwnd_full {
                    self.cwnd = self.cwnd.saturating_add(p.cwnd_inc);
                }
                self.sendmes_until_update = self.sendmes_per_window();
            }
        }
        self.cwnd = self.cwnd.clamp(p.cwnd_min, p.cwnd_max);
    }
}
