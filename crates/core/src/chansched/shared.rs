//! [`SharedRate`]: cross-channel priority under one shared write rate (`CrossChannelPriority`),
//! with the `QuietReserve`'s quiet batches.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use chive_cell::CELL_LEN;

use super::{BatchClass, ChannelScheduler, SendCtx};
use crate::ChannelId;

/// Cross-channel scheduling under a shared write rate (the papers' future work 8.1; C tor's
/// KIST does the same with `circuitmux_compare_muxes`). Every writer draws from one token bucket,
/// so cells handed to writers wait there in first-come order whatever their circuit. This policy
/// keeps that shared queue short — at most `OutbufCells` unpaid cells over all connections — and
/// whenever room appears gives it to the waiting channel whose next circuit is most deserving
/// (lowest decayed EWMA count; link-level cells first; ties and round-robin in turn), half a
/// buffer at a time so a newcomer never waits behind more than that. A fresh circuit on a quiet
/// channel thus overtakes bulk on other channels too, not only on its own.
///
/// With a reserve, channels whose next circuit is quiet go first, outside that bound, as
/// [`BatchClass::Quiet`] batches that may spend the reserve (see [`SharedRate::quiet_below`]).
///
/// With `ChannelFairness` ([`super::SendConfig::channel_fair_halflife`]) a *client's* channel
/// is ranked by what it sent *in all* (an EWMA over the channel's cells, the sum of its
/// circuits' counts), not by its least busy circuit: a client that spreads one download over 50
/// circuits has 50 circuits with small counts, but one channel with the same count as a
/// one-circuit client's at the same rate, so the two get equal shares. A client thus competes
/// as one circuit would. Relay channels ([`super::SendCtx::is_client`] false) keep the best
/// circuit's count: a relay cannot tell the clients on a channel from another relay apart (each
/// circuit may be another client's), so there circuits stay the unit, as without fairness —
/// ranking a middle's busy channel to an entry by its total would put the web circuits it
/// carries behind every quieter channel. Within a channel the circuit scheduler still picks
/// (EWMA: its web circuits first); link-level cells still go first; quiet batches (the
/// reserve) are unchanged, so a web circuit on any channel still overtakes bulk.
#[derive(Debug, Default)]
pub struct SharedRate {
    /// Channels with cells waiting for output room, oldest first.
    waiting: VecDeque<ChannelId>,
    /// `ChannelFairness`: each client channel's decayed count of cells sent, and when it was
    /// decayed.
    sent: HashMap<ChannelId, (f64, Instant)>,
}

impl SharedRate {
    /// The EWMA count (cells) below which a circuit is quiet and its cells may spend the write
    /// bucket's reserve: the reserve's size in cells, so a circuit is quiet while it has sent
    /// less, recently, than the reserve holds (a web page, a handshake, SENDMEs), and a bulk
    /// circuit stops being quiet within its first reserve's worth of cells. `None` without a
    /// reserve or under a circuit policy that does not rank (round-robin: no priority, no
    /// reserve).
    pub fn quiet_below(ctx: &SendCtx<'_>) -> Option<f64> {
        if !ctx.ranks_circuits() {
            return None;
        }
        let reserve = ctx.config().quiet_reserve;
        (reserve > 0).then(|| reserve as f64 / CELL_LEN as f64)
    }

    /// `chan`'s decayed count of cells sent, at `now` (0 without history).
    fn channel_count(&self, chan: ChannelId, halflife: f64, now: Instant) -> f64 {
        self.sent.get(&chan).map_or(0.0, |&(count, at)| {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            count * (-dt / halflife).exp2()
        })
    }

    /// Count `cells` sent by client channel `chan` (under `ChannelFairness` only).
    fn count_sent(&mut self, chan: ChannelId, cells: usize, ctx: &SendCtx<'_>) {
        let Some(h) = ctx.config().channel_fair_halflife else {
            return;
        };
        if cells == 0 || !ctx.is_client(chan) {
            return;
        }
        let now = ctx.now();
        let count = self.channel_count(chan, h, now) + cells as f64;
        self.sent.insert(chan, (count, now));
    }

    /// How deserving `chan` is for bulk room (lower first): its best circuit's count, or under
    /// `ChannelFairness` a client channel's own count; link-level cells (-1) first either way.
    fn rank(&self, chan: ChannelId, ctx: &SendCtx<'_>) -> f64 {
        let head = ctx.priority(chan).unwrap_or(0.0);
        match ctx.config().channel_fair_halflife {
            Some(h) if head >= 0.0 && ctx.is_client(chan) => self.channel_count(chan, h, ctx.now()),
            _ => head,
        }
    }

    /// Give the room there is to waiting channels: quiet ones first, then the most deserving.
    fn dispatch(&mut self, ctx: &mut SendCtx<'_>) {
        self.dispatch_quiet(ctx);
        // The bound may be stretched for late wake-ups; the quantum is not, so a newcomer
        // still waits behind at most half of `OutbufCells` of one channel's cells.
        let outbuf = ctx.outbuf();
        let quantum = (ctx.config().outbuf_cells / 2).max(1);
        loop {
            let room = outbuf.saturating_sub(ctx.unpaid_total());
            if room == 0 {
                return;
            }
            self.waiting
                .retain(|c| ctx.knows(*c) && ctx.has_pending(*c));
            let best = self
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, c)| ctx.room(**c) > 0)
                .map(|(i, c)| (i, self.rank(*c, ctx)))
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                .map(|(i, _)| i);
            let Some(chan) = best.and_then(|i| self.waiting.remove(i)) else {
                return;
            };
            let sent = ctx.transmit_up_to(chan, quantum.min(room), BatchClass::Bulk);
            self.count_sent(chan, sent, ctx);
            if ctx.has_pending(chan) {
                // Behind the others: equals take turns.
                self.waiting.push_back(chan);
            }
            if sent == 0 {
                return;
            }
        }
    }

    /// Hand quiet circuits' cells to their writers at once, as quiet batches that may spend the
    /// reserve. They are not held to the `OutbufCells` bound that bulk shares (bulk cells waiting
    /// for tokens would otherwise fill it and keep them out); their own bound is twice that over
    /// all connections and on each, so memory stays bounded whatever a peer does.
    fn dispatch_quiet(&mut self, ctx: &mut SendCtx<'_>) {
        let Some(below) = Self::quiet_below(ctx) else {
            return;
        };
        let cap = 2 * ctx.outbuf();
        let mut unpaid = ctx.unpaid_total();
        let mut i = 0;
        while i < self.waiting.len() && unpaid < cap {
            let Some(&chan) = self.waiting.get(i) else {
                return;
            };
            i += 1;
            if ctx.priority(chan).is_some_and(|p| p < below) {
                let sent = ctx.transmit_up_to(chan, cap - unpaid, BatchClass::Quiet { below });
                self.count_sent(chan, sent, ctx);
                unpaid += sent;
            }
        }
    }
}

impl ChannelScheduler for SharedRate {
    fn schedule(&mut self, chan: ChannelId, ctx: &mut SendCtx<'_>) {
        if !self.waiting.contains(&chan) && ctx.has_pending(chan) {
            self.waiting.push_back(chan);
        }
        self.dispatch(ctx);
    }

    fn budget_freed(&mut self, ctx: &mut SendCtx<'_>) {
        // The most deserving waiting channel goes next.
        if !self.waiting.is_empty() {
            self.dispatch(ctx);
        }
    }

    fn settle(&mut self, ctx: &mut SendCtx<'_>) {
        if !self.waiting.is_empty() {
            self.dispatch(ctx);
        }
    }

    fn forget(&mut self, chan: ChannelId) {
        self.waiting.retain(|c| *c != chan);
        self.sent.remove(&chan);
    }

    fn waiting(&self) -> Vec<ChannelId> {
        self.waiting.iter().copied().collect()
    }

    fn name(&self) -> &'static str {
        "shared-rate"
    }
}
