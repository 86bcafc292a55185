//! What a driver is configured with: its settings, and the send path's settings they imply.

use std::sync::Arc;

use chive_core::chansched::{ChannelSchedulerKind, SendConfig, WireFraming};
use chive_dir::ExitPolicy;
use chive_net::{LinkConfig, LinkLimits, RecordLayer};

use super::{Liveness, Tunables};

/// The send path's settings for `cfg`: a limited write bucket decides pacing, whether the
/// write rate is shared (`CrossChannelPriority` under a finite `BandwidthRate`) and the reserve.
pub(super) fn send_config(cfg: &DriverConfig, params: Option<&chive_dir::NetParams>) -> SendConfig {
    let bucket = cfg.limits.write_bucket.as_ref();
    SendConfig {
        outbuf_cells: cfg.outbuf_cells,
        write_rate: bucket.map_or(0, |b| b.rate().0),
        outbuf_max: cfg.tunables.outbuf_max(),
        // An unlimited bucket (rate 0, every relay without `BandwidthRate`) grants every batch
        // at once: its writers neither pay nor report (`Input::Paid`) until a SIGHUP limits it.
        paced: bucket.is_some_and(|b| !b.is_unlimited()),
        kind: ChannelSchedulerKind::for_rate(
            cfg.tunables.cross_channel,
            bucket.map_or(0, |b| b.rate().0),
        ),
        quiet_reserve: bucket.map_or(0, |b| b.reserve()),
        channel_fair_halflife: cfg.tunables.channel_fair_halflife(params),
    }
}

/// The room the send path leaves around each record's cells: with the own record layer the
/// writers seal batches where they lie ([`chive_net::LinkWriter::write_framed`]); under rustls,
/// which copies what it is given into its own records anyway, the cells go back to back.
pub(super) fn record_framing(link: &LinkConfig) -> Option<WireFraming> {
    (link.record_layer == RecordLayer::Own).then_some(WireFraming {
        head: chive_net::RECORD_HEAD,
        tail: chive_net::RECORD_TAIL,
        cells_per_record: chive_net::CELLS_PER_RECORD,
    })
}

/// Driver settings.
pub struct DriverConfig {
    pub link: Arc<LinkConfig>,
    pub limits: LinkLimits,
    pub outbuf_cells: usize,
    /// Exit policy applied to resolved addresses; None = not an exit.
    pub exit_policy: Option<Arc<ExitPolicy>>,
    /// Local settings (scheduler, half-life, output bound).
    pub tunables: Tunables,
    /// Keepalives and the idle timeout of every link.
    pub liveness: Liveness,
}
