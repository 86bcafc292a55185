//! [`Direct`]: no shared write rate, so channels do not compete for one.

use super::{BatchClass, ChannelScheduler, SendCtx};
use crate::ChannelId;

/// Every ready channel sends at once, up to `OutbufCells` in flight on its own connection; a
/// full connection sends again when a batch on it is written. Nothing waits in the policy.
#[derive(Debug, Default)]
pub struct Direct;

impl ChannelScheduler for Direct {
    fn schedule(&mut self, chan: ChannelId, ctx: &mut SendCtx<'_>) {
        ctx.transmit_up_to(chan, usize::MAX, BatchClass::Unranked);
    }

    fn name(&self) -> &'static str {
        "direct"
    }
}
