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
//!   `bdp + delta - cwnd_inc`; above `beta` shrink by `cwnd_inc`; below `alpha` (and only if
//!   the window was in use) grow by `cwnd_inc`.
//! - Always within `cwnd_min..=cwnd_max`.
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
    /// Tor's exit thresholds are multiples of its 62-cell output buffer (alpha 2, beta 4,
    /// gamma 3, delta 6 buffers); chive's output buffer (`OutbufCells`) is 64 cells, so the
    /// same multiples of 64. `beta - alpha` (128) exceeds one step (100), so a window
    /// inside the band stays put instead of hopping over it.
    fn default() -> Self {
        VegasParams {
            cwnd_init: 2 * CIRCUIT_SENDME_INCREMENT,
            cwnd_min: CIRCUIT_WINDOW_MIN,
            cwnd_max: CC_CWND_LIMIT,
            cwnd_inc: CIRCUIT_SENDME_INCREMENT,
            cwnd_inc_pct_ss: 100,
            ss_max: CC_CWND_LIMIT,
            alpha: 2 * 64,
            beta: 4 * 64,
            gamma: 3 * 64,
            delta: 6 * 64,
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
                    self.cwnd = self.cwnd.saturating_sub(p.cwnd_inc);
                } else if queue_use < p.alpha && ack.cwnd_full {
                    self.cwnd = self.cwnd.saturating_add(p.cwnd_inc);
                }
                self.sendmes_until_update = self.sendmes_per_window();
            }
        }
        self.cwnd = self.cwnd.clamp(p.cwnd_min, p.cwnd_max);
    }
}
