//! Circuit switching's IO (paper 003, issue 16): one congestion detector per outbound relay
//! connection this relay is the entry on, sampled on a timer (both variants: in `path` mode
//! the core answers a trigger with CONGESTED to the client instead of moving the circuit); the switch connections the core
//! asks for; the relay's options over the consensus parameters. The protocol and the choice of
//! circuit are the core's ([`chive_core::Core::congested`], docs/protocol.md).
//!
//! A sample is the connection's occupancy: cells handed to its writer and not yet written
//! (chive's outbuf, [`SendPath::in_flight`]) at 514 bytes each, plus the bytes the kernel holds
//! unsent (SIOCOUTQ on the TCP socket), plus the bytes in flight that wait in a queue on the
//! path (TCP_INFO: in flight × (srtt − min_rtt) / srtt; `SwitchNetworkQueue 0` leaves them
//! out). Refused writes (EAGAIN) are not reported to the
//! detector: the writer task writes through tokio and TLS, which hide them; a full outbuf
//! shows in the occupancy instead.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chive_core::switching::{CongestionDetector, DetectorConfig, Level, Occupancy};
use chive_core::{ChannelId, SwitchMode, SwitchSettings};
use chive_crypto::IdentityKey;
use chive_dir::SwitchingMode;
use tracing::{debug, info, warn};

use super::tasks::start_link;
use super::{Driver, Input};

/// The relay's own switching options; `None` follows the consensus parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SwitchOptions {
    /// `CircuitSwitching`.
    pub mode: Option<SwitchingMode>,
    /// `SwitchGamma` (0..1, exclusive).
    pub gamma: Option<f64>,
    /// `SwitchAlpha` (fraction of `SwitchBufferBytes`).
    pub alpha: Option<f64>,
    /// `SwitchBeta` (fraction of `SwitchBufferBytes`).
    pub beta: Option<f64>,
    /// `SwitchSampleIntervalMsec`.
    pub sample_interval_ms: Option<u32>,
    /// `SwitchBufferBytes`.
    pub buffer_bytes: Option<u32>,
    /// `SwitchTimeoutMsec`.
    pub timeout_ms: Option<u32>,
    /// `SwitchTimeoutRttFactor` (a client option for the path variant; relays take the
    /// consensus value, which also scales the connection variant's SWITCH_ACK timeout).
    pub timeout_rtt_factor: Option<u32>,
    /// `SwitchMinShare` (0..1).
    pub min_share: Option<f64>,
    /// `SwitchNetworkQueue`: count the bytes queued on the path beyond the socket (from
    /// TCP_INFO's round trips) in the occupancy. `None`: the consensus's `SwitchNetworkQueue`.
    pub network_queue: Option<bool>,
    /// `SwitchLighterLeg` (a client option for the path variant): never move onto a leg that
    /// measures heavier. `None`: on.
    pub lighter_leg: Option<bool>,
    /// `SwitchLegProbe` (a client option for the path variant): 0 = judge the other leg by
    /// its last estimate, 1 = probe it when a congestion report arrives, 2 = keep it probed
    /// ahead while the upload runs (a report is decided at once). `None`: 0.
    pub leg_probe: Option<u8>,
    /// `SwitchLegUse` (a client option for the path variant): whole (default) or stripe.
    pub leg_use: Option<chive_core::switching::LegUse>,
    /// `SwitchStripeLegCells` (a client option, with `SwitchLegUse = stripe`): the most cells
    /// of a stream unacknowledged on one leg; 0 = no cap. `None`: 0.
    pub stripe_leg_cells: Option<u32>,
    /// `SwitchStripeMoves` (a client option, with `SwitchLegUse = stripe`): moves between
    /// legs that may wait for their confirmations at once. `None`: 1.
    pub stripe_moves: Option<u32>,
}

/// The driver's switching state.
#[derive(Default)]
pub struct SwitchIo {
    /// The relay's options.
    pub options: SwitchOptions,
    config: Option<DetectorConfig>,
    interval: Option<Duration>,
    detectors: HashMap<ChannelId, CongestionDetector>,
    /// Sockets of open links, for SIOCOUTQ.
    fds: HashMap<ChannelId, RawFd>,
    /// Links being opened as switch connections.
    pending: HashSet<ChannelId>,
}

impl SwitchIo {
    /// The sampling timer (the interval in force at start; a later change of
    /// `SwitchSampleIntervalMsec` takes effect in the detectors, which skip early calls).
    pub(super) fn timer(&self) -> tokio::time::Interval {
        let every = self.interval.unwrap_or(Duration::from_millis(100));
        let mut t = tokio::time::interval(every.min(Duration::from_millis(100)));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    }

    pub(super) fn link_fd(&mut self, chan: ChannelId, fd: RawFd) {
        self.fds.insert(chan, fd);
    }

    pub(super) fn forget(&mut self, chan: ChannelId) {
        self.fds.remove(&chan);
        self.detectors.remove(&chan);
        self.pending.remove(&chan);
    }
}

/// How the client stripes (`SwitchLegUse`, `SwitchStripeLegCells`, `SwitchStripeMoves`): each
/// client option over its consensus parameter.
fn stripe_settings(
    o: &SwitchOptions,
    p: &chive_dir::SwitchingParams,
) -> (chive_core::switching::LegUse, u32, u32) {
    use chive_core::switching::{LegUse, MAX_STRIPE_MOVES};
    let leg_use = o.leg_use.unwrap_or(if p.leg_stripe {
        LegUse::Stripe
    } else {
        LegUse::Whole
    });
    let cells = o.stripe_leg_cells.unwrap_or(p.stripe_leg_cells);
    let moves = o
        .stripe_moves
        .unwrap_or(p.stripe_moves)
        .clamp(1, MAX_STRIPE_MOVES);
    (leg_use, cells, moves)
}

impl Driver {
    /// Options over consensus parameters: the core's mode and timeout, the detectors' settings.
    pub(crate) fn apply_switching(&mut self) {
        let p = self
            .params
            .as_ref()
            .map(|p| p.switching())
            .unwrap_or_else(|| chive_dir::NetParams::new().switching());
        let o = self.switching.options;
        let mode = match o.mode.unwrap_or(p.mode) {
            SwitchingMode::Off => SwitchMode::Off,
            SwitchingMode::Connection => SwitchMode::Connection,
            SwitchingMode::Path => SwitchMode::Path,
        };
        let frac = |m: u32| f64::from(m) / 1000.0;
        let beta = o.beta.unwrap_or(frac(p.beta_milli));
        let alpha = o.alpha.unwrap_or(frac(p.alpha_milli)).min(beta);
        let interval = Duration::from_millis(u64::from(
            o.sample_interval_ms.unwrap_or(p.sample_interval_ms),
        ));
        let cfg = DetectorConfig::new(
            o.gamma.unwrap_or(frac(p.gamma_milli)),
            alpha,
            beta,
            interval,
            u64::from(o.buffer_bytes.unwrap_or(p.buffer_bytes)),
        );
        let (leg_use, stripe_leg_cells, stripe_moves) = stripe_settings(&o, &p);
        let settings = SwitchSettings {
            mode,
            timeout: Duration::from_millis(u64::from(o.timeout_ms.unwrap_or(p.timeout_ms))),
            timeout_rtt_factor: o.timeout_rtt_factor.unwrap_or(p.timeout_rtt_factor),
            min_share_milli: o.min_share.map_or(p.min_share_milli, |f| {
                (f.clamp(0.0, 1.0) * 1000.0).round() as u32
            }),
            lighter_leg_only: o.lighter_leg.unwrap_or(true),
            // Default 0 (session 20, full-size lab runs, docs/paper003-lab.md): neither probing
            // at the report (+0.9 s of switch time) nor probing ahead (+0.1 s, twice the switches)
            // gained throughput over judging the other leg by its last estimate.
            probe_legs: o.leg_probe.unwrap_or(0) >= 1,
            probe_ahead: o.leg_probe.unwrap_or(0) == 2,
            leg_use,
            stripe_leg_cells,
            stripe_moves,
            ..SwitchSettings::default()
        };
        if settings != self.core.switching() {
            info!(
                mode = mode.label(),
                timeout_ms = settings.timeout.as_millis() as u64,
                timeout_rtt_factor = settings.timeout_rtt_factor,
                min_share = settings.min_share(),
                leg_use = settings.leg_use.label(),
                stripe_leg_cells = settings.stripe_leg_cells,
                stripe_moves = settings.stripe_moves,
                "circuit switching settings"
            );
            self.core.set_switching(settings);
        }
        match cfg {
            Ok(cfg) => {
                if self.switching.config != Some(cfg) {
                    self.switching.config = Some(cfg);
                    self.switching.interval = Some(interval);
                    self.switching.detectors.clear();
                }
            }
            Err(e) => warn!(error = %e, "switching detector settings not applied"),
        }
    }

    /// Sample every outbound relay connection this relay is an entry on; report congestion.
    pub(super) fn switch_tick(&mut self, now: Instant) {
        let Some(cfg) = self.switching.config else {
            return;
        };
        if self.core.switching().mode == SwitchMode::Off {
            if !self.switching.detectors.is_empty() {
                self.switching.detectors.clear();
            }
            return;
        }
        let chans: Vec<ChannelId> = self
            .chans
            .keys()
            .copied()
            .filter(|c| self.core.may_switch_from(*c))
            .collect();
        self.switching.detectors.retain(|c, _| chans.contains(c));
        let count_net = self.switching.options.network_queue.unwrap_or_else(|| {
            self.params
                .as_ref()
                .is_none_or(|p| p.switching().network_queue)
        });
        for chan in chans {
            let fd = self.switching.fds.get(&chan).copied();
            let occupancy = Occupancy {
                outbuf_cells: self.send.in_flight(chan) as u64,
                kernel_unsent_bytes: fd.map_or(0, chive_tools::sockq::tcp_unsent_bytes),
                network_queued_bytes: fd
                    .filter(|_| count_net)
                    .and_then(chive_tools::sockq::tcp_queue)
                    .map_or(0, |q| q.queued_bytes()),
            };
            let det = self
                .switching
                .detectors
                .entry(chan)
                .or_insert_with(|| CongestionDetector::new(cfg));
            let Some(sample) = det.sample(now, occupancy) else {
                continue;
            };
            if sample.level != Level::Underfull {
                // Congestion building: the switch connection is opened ahead (once per peer).
                self.core.congestion_building(chan, now);
            }
            if let Some(trigger) = sample.trigger {
                debug!(?chan, estimate = trigger.estimate_bytes, reason = ?trigger.reason, "connection congested");
                self.core.congested(chan, trigger.estimate_bytes, now);
            }
        }
    }

    /// The core wants a switch connection to `identity`: dial it like any relay link.
    pub(super) fn connect_switch(&mut self, identity: IdentityKey) {
        let tx = self.tx.clone();
        let Some(addr) = self.relay_addrs.get(&identity).copied() else {
            // Not in the consensus: the core treats it as a failed connect.
            let _ = tx.try_send(Input::SwitchConnectFailed {
                identity,
                why: "no address in the consensus".into(),
            });
            return;
        };
        let chan = ChannelId(self.next_chan.fetch_add(1, Ordering::Relaxed));
        self.switching.pending.insert(chan);
        let cfg = self.cfg.link.clone();
        let limits = self.cfg.limits.clone();
        let liveness = self.cfg.liveness;
        tokio::spawn(async move {
            match chive_net::connect(addr, Some(identity), &cfg).await {
                Ok(link) => start_link(chan, link, true, limits, liveness, tx).await,
                Err(e) => {
                    let _ = tx
                        .send(Input::SwitchConnectFailed {
                            identity,
                            why: e.to_string(),
                        })
                        .await;
                }
            }
        });
    }

    pub(super) fn switch_connect_failed(&mut self, identity: IdentityKey, why: &str, now: Instant) {
        warn!(peer = %identity, %why, "switch connection failed; circuits stay where they are");
        self.core.switch_connect_failed(identity, now);
    }

    /// A link came up: if it is a switch connection, hand it to the core as one (not as the
    /// peer's channel for new circuits). Returns whether it was.
    pub(super) fn switch_link_opened(
        &mut self,
        chan: ChannelId,
        peer: Option<IdentityKey>,
        now: Instant,
    ) -> bool {
        if !self.switching.pending.remove(&chan) {
            return false;
        }
        let Some(peer) = peer else {
            return false;
        };
        info!(?chan, %peer, "switch connection up");
        self.core.switch_channel_opened(chan, peer, now);
        true
    }

    /// Switch records and counters for the metrics.
    pub(super) fn switch_metrics(&mut self) {
        let Some(m) = self.metrics.as_mut() else {
            while self.core.poll_switch_record().is_some() {}
            return;
        };
        while let Some(r) = self.core.poll_switch_record() {
            m.switch_record(&r);
        }
        m.switch_stats(self.core.switch_stats());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_core::switching::LegUse;

    #[test]
    fn stripe_options_override_the_consensus() {
        let none = SwitchOptions::default();
        let d = chive_dir::NetParams::new().switching();
        assert_eq!(stripe_settings(&none, &d), (LegUse::Stripe, 100, 4));
        let mut p = d;
        p.leg_stripe = false;
        p.stripe_leg_cells = 0;
        p.stripe_moves = 1;
        assert_eq!(stripe_settings(&none, &p), (LegUse::Whole, 0, 1));
        p.leg_stripe = true;
        p.stripe_leg_cells = 120;
        p.stripe_moves = 4;
        assert_eq!(stripe_settings(&none, &p), (LegUse::Stripe, 120, 4));
        let o = SwitchOptions {
            leg_use: Some(LegUse::Whole),
            stripe_leg_cells: Some(0),
            stripe_moves: Some(2),
            ..SwitchOptions::default()
        };
        assert_eq!(stripe_settings(&o, &p), (LegUse::Whole, 0, 2));
    }
}
