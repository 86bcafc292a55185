//! The settings a node's operator may change at runtime (SIGHUP), merged with the consensus.

use chive_core::dos::DosConfig;
use chive_core::SchedulerKind;

use crate::limits::DosOptions;

/// Settings a node's operator may set locally; unset ones come from the consensus.
#[derive(Clone, Debug, Default)]
pub struct Tunables {
    /// `Scheduler`: "rr", "ewma" or "ewma-direct" (default "ewma", as Tor).
    pub scheduler: Option<String>,
    /// `CircuitPriorityHalflife` in seconds (≤ 0: round-robin).
    pub halflife: Option<f64>,
    /// `OutbufCells`.
    pub outbuf_cells: Option<usize>,
    /// `CrossChannelPriority`: under a write rate, share OutbufCells among all connections
    /// and give room to the channel with the most deserving circuit (default off).
    pub cross_channel: bool,
    /// `MaxMemInQueues` in bytes, already resolved (`crate::limits::max_mem_in_queues`);
    /// `None` leaves the core's (default 256 MiB).
    pub max_mem_in_queues: Option<usize>,
    /// The relay's own `DoS*` options, overriding the consensus.
    pub dos: DosOptions,
    /// `ChannelFairness`: share the write rate between channels by each channel's recent
    /// cells, then EWMA within the channel; unset = the consensus's `ChannelFairness`.
    pub channel_fairness: Option<bool>,
    /// `PerClientQueueCells`: cells queued toward one client's channel past which its
    /// upstream cells are held (0 = off); unset = the consensus's `PerClientQueueCells`.
    pub per_client_queue_cells: Option<usize>,
    /// `ClientCircuitWindow`: cells each client circuit is taken to have in flight toward
    /// this entry (0 = off); unset = the consensus's `ClientCircuitWindow`.
    pub client_circuit_window: Option<usize>,
    /// `HeartbeatPeriod` in seconds (0: off); unset = [`DEFAULT_HEARTBEAT_PERIOD`].
    pub heartbeat_period: Option<u64>,
    /// `OutbufMaxMsec`: under a write rate the output bound grows with the measured reaction
    /// latency up to this many ms of the rate (0: fixed at `OutbufCells`); unset =
    /// [`chive_core::chansched::DEFAULT_OUTBUF_MAX`].
    pub outbuf_max_msec: Option<u64>,
}

/// Largest `OutbufMaxMsec`: a second of the rate.
pub const MAX_OUTBUF_MAX_MSEC: u64 = 1000;

/// `OutbufMaxMsec`, where set, must be between 0 and [`MAX_OUTBUF_MAX_MSEC`].
pub fn check_outbuf_max_msec(configured: Option<u64>) -> Result<(), String> {
    match configured {
        Some(ms) if ms > MAX_OUTBUF_MAX_MSEC => Err(format!(
            "OutbufMaxMsec must be between 0 (fixed bound) and {MAX_OUTBUF_MAX_MSEC}"
        )),
        _ => Ok(()),
    }
}

/// `HeartbeatPeriod` when unset: Tor's default, 6 hours.
pub const DEFAULT_HEARTBEAT_PERIOD: u64 = 6 * 3600;

impl Tunables {
    /// The most the output bound may grow to, as time at the write rate (`OutbufMaxMsec`).
    pub fn outbuf_max(&self) -> std::time::Duration {
        self.outbuf_max_msec
            .map_or(chive_core::chansched::DEFAULT_OUTBUF_MAX, |ms| {
                std::time::Duration::from_millis(ms.min(MAX_OUTBUF_MAX_MSEC))
            })
    }

    /// How often the relay logs its DoS heartbeat (zero: never).
    pub fn heartbeat(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.heartbeat_period.unwrap_or(DEFAULT_HEARTBEAT_PERIOD))
    }

    /// `PerClientQueueCells` in force (0 = off): the relay's option, else the consensus's.
    pub fn client_queue_cap(&self, params: Option<&chive_dir::NetParams>) -> usize {
        self.per_client_queue_cells.unwrap_or_else(|| {
            params
                .map(|p| p.get_spec(&chive_dir::PER_CLIENT_QUEUE_CELLS))
                .unwrap_or(chive_dir::PER_CLIENT_QUEUE_CELLS.default) as usize
        })
    }

    /// `ClientCircuitWindow` in force (0 = off): the relay's option, else the consensus's.
    pub fn client_circuit_window(&self, params: Option<&chive_dir::NetParams>) -> usize {
        self.client_circuit_window.unwrap_or_else(|| {
            params
                .map(|p| p.get_spec(&chive_dir::CLIENT_CIRCUIT_WINDOW))
                .unwrap_or(chive_dir::CLIENT_CIRCUIT_WINDOW.default) as usize
        })
    }

    /// The half-life (s) of the channels' cell counts under `ChannelFairness`, `None` if off:
    /// the circuit scheduler's half-life, so a channel's count is the sum of its circuits'.
    pub fn channel_fair_halflife(&self, params: Option<&chive_dir::NetParams>) -> Option<f64> {
        let consensus = params.map_or(chive_dir::CHANNEL_FAIRNESS.default, |p| {
            p.get_spec(&chive_dir::CHANNEL_FAIRNESS)
        }) == 1;
        if !self.channel_fairness.unwrap_or(consensus) {
            return None;
        }
        match self.effective(params) {
            Ok((SchedulerKind::Ewma { halflife } | SchedulerKind::EwmaDirect { halflife }, _)) => {
                Some(halflife)
            }
            _ => Some(chive_core::sched::DEFAULT_HALFLIFE),
        }
    }

    /// The circuit policy and output bound in force, given the latest consensus parameters.
    ///
    /// A value the policy cannot use is an error naming the option (`Scheduler`,
    /// `CircuitPriorityHalflife`, or the consensus's `CircuitPriorityHalflifeMsec`), never a
    /// silent fallback: config loading refuses it, and a running driver keeps its old policy.
    /// A half-life ≤ 0 is no error: as in C tor it turns EWMA off (round-robin).
    pub fn effective(
        &self,
        params: Option<&chive_dir::NetParams>,
    ) -> Result<(SchedulerKind, usize), String> {
        let name = self.scheduler.as_deref().unwrap_or("ewma");
        // The name alone first, so that a bad one is reported as `Scheduler`.
        SchedulerKind::from_config(name, None).map_err(|e| format!("Scheduler: {e}"))?;
        let (halflife, option) = match self.halflife {
            Some(h) => (h, "CircuitPriorityHalflife"),
            None => {
                let msec = params
                    .map(|p| p.get_spec(&chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC))
                    .unwrap_or(chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC.default);
                (
                    msec as f64 / 1000.0,
                    "consensus CircuitPriorityHalflifeMsec",
                )
            }
        };
        let kind = SchedulerKind::from_config(name, Some(halflife))
            .map_err(|e| format!("{option}: {e}"))?;
        let outbuf = self.outbuf_cells.unwrap_or_else(|| {
            params
                .map(|p| p.get_spec(&chive_dir::OUTBUF_CELLS))
                .unwrap_or(chive_dir::OUTBUF_CELLS.default) as usize
        });
        Ok((kind, outbuf))
    }

    /// The DoS defences' settings in force: our `DoS*` options over the consensus parameters
    /// over Tor's defaults. An error names the option.
    pub fn dos_config(&self, params: Option<&chive_dir::NetParams>) -> Result<DosConfig, String> {
        self.dos.config(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunables(scheduler: Option<&str>, halflife: Option<f64>) -> Tunables {
        Tunables {
            scheduler: scheduler.map(str::to_string),
            halflife,
            ..Tunables::default()
        }
    }

    #[test]
    fn defaults_come_from_the_consensus_defaults() {
        let (kind, outbuf) = Tunables::default().effective(None).unwrap();
        let halflife = chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC.default as f64 / 1000.0;
        assert_eq!(kind, SchedulerKind::Ewma { halflife });
        assert_eq!(outbuf, chive_dir::OUTBUF_CELLS.default as usize);
        let (kind, outbuf) = Tunables {
            outbuf_cells: Some(9),
            ..tunables(Some("rr"), None)
        }
        .effective(None)
        .unwrap();
        assert_eq!((kind, outbuf), (SchedulerKind::RoundRobin, 9));
    }

    #[test]
    fn outbuf_max_defaults_to_200_ms_and_is_checked() {
        use std::time::Duration;
        assert_eq!(Tunables::default().outbuf_max(), Duration::from_millis(200));
        let off = Tunables {
            outbuf_max_msec: Some(0),
            ..Tunables::default()
        };
        assert_eq!(off.outbuf_max(), Duration::ZERO);
        assert!(check_outbuf_max_msec(None).is_ok());
        assert!(check_outbuf_max_msec(Some(0)).is_ok());
        assert!(check_outbuf_max_msec(Some(1000)).is_ok());
        let err = check_outbuf_max_msec(Some(1001)).unwrap_err();
        assert!(err.starts_with("OutbufMaxMsec must be"), "{err}");
    }

    #[test]
    fn channel_fairness_follows_the_option_then_the_consensus() {
        let mut on = chive_dir::NetParams::new();
        on.set("ChannelFairness", 1).unwrap();
        let mut off = chive_dir::NetParams::new();
        off.set("ChannelFairness", 0).unwrap();
        let t = tunables(None, Some(10.0));
        assert_eq!(t.channel_fair_halflife(None), Some(10.0), "on by default");
        assert_eq!(t.channel_fair_halflife(Some(&on)), Some(10.0));
        assert_eq!(t.channel_fair_halflife(Some(&off)), None);
        let local_off = Tunables {
            channel_fairness: Some(false),
            ..tunables(None, None)
        };
        assert_eq!(local_off.channel_fair_halflife(Some(&on)), None);
        let local_on = Tunables {
            channel_fairness: Some(true),
            ..tunables(Some("rr"), None)
        };
        // Round-robin circuits: the channels' counts still decay, at the default half-life.
        assert_eq!(
            local_on.channel_fair_halflife(None),
            Some(chive_core::sched::DEFAULT_HALFLIFE)
        );
    }

    #[test]
    fn per_client_queue_cells_follows_the_option_then_the_consensus() {
        let mut set = chive_dir::NetParams::new();
        set.set("PerClientQueueCells", 3000).unwrap();
        let t = tunables(None, None);
        assert_eq!(
            t.client_queue_cap(None),
            chive_dir::PER_CLIENT_QUEUE_CELLS.default as usize
        );
        assert_eq!(t.client_queue_cap(Some(&set)), 3000);
        let local = Tunables {
            per_client_queue_cells: Some(0),
            ..tunables(None, None)
        };
        assert_eq!(
            local.client_queue_cap(Some(&set)),
            0,
            "the relay's own option wins"
        );
    }

    #[test]
    fn client_circuit_window_follows_the_option_then_the_consensus() {
        let mut set = chive_dir::NetParams::new();
        set.set("ClientCircuitWindow", 800).unwrap();
        let t = tunables(None, None);
        assert_eq!(
            t.client_circuit_window(None),
            chive_dir::CLIENT_CIRCUIT_WINDOW.default as usize
        );
        assert_eq!(t.client_circuit_window(Some(&set)), 800);
        let local = Tunables {
            client_circuit_window: Some(0),
            ..tunables(None, None)
        };
        assert_eq!(local.client_circuit_window(Some(&set)), 0);
    }

    #[test]
    fn bad_values_are_errors_naming_the_option() {
        let err = tunables(Some("fifo"), None).effective(None).unwrap_err();
        assert!(err.starts_with("Scheduler: "), "{err}");
        // Too short a half-life for EWMA: refused, not round-robin in disguise.
        let err = tunables(None, Some(1e-4)).effective(None).unwrap_err();
        assert!(err.starts_with("CircuitPriorityHalflife: "), "{err}");
        let err = tunables(Some("ewma-direct"), Some(f64::NAN))
            .effective(None)
            .unwrap_err();
        assert!(err.starts_with("CircuitPriorityHalflife: "), "{err}");
        // Tor's rule, not an error: a half-life <= 0 turns EWMA off.
        let (kind, _) = tunables(Some("ewma"), Some(0.0)).effective(None).unwrap();
        assert_eq!(kind, SchedulerKind::RoundRobin);
    }
}
