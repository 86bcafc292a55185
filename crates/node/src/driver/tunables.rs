//! The settings a node's operator may change at runtime (SIGHUP), merged with the consensus.

use chive_core::SchedulerKind;

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
}

impl Tunables {
    /// The policy and output bound in force, given the latest consensus parameters.
    pub fn effective(&self, params: Option<&chive_dir::NetParams>) -> (SchedulerKind, usize) {
        let halflife = self.halflife.unwrap_or_else(|| {
            let msec = params
                .map(|p| p.get_spec(&chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC))
                .unwrap_or(chive_dir::CIRCUIT_PRIORITY_HALFLIFE_MSEC.default);
            msec as f64 / 1000.0
        });
        let name = self.scheduler.as_deref().unwrap_or("ewma");
        let kind =
            SchedulerKind::from_config(name, Some(halflife)).unwrap_or(SchedulerKind::RoundRobin);
        let outbuf = self.outbuf_cells.unwrap_or_else(|| {
            params
                .map(|p| p.get_spec(&chive_dir::OUTBUF_CELLS))
                .unwrap_or(chive_dir::OUTBUF_CELLS.default) as usize
        });
        (kind, outbuf)
    }
}
