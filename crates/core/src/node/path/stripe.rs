//! The client's upload over every leg at once (`SwitchLegUse = stripe`,
//! [`crate::switching::legs`]): before each DATA cell of a set's stream is packaged, the
//! [`MinRtt`] scheduler picks the leg; a different leg is an ordinary path switch (lazy
//! CONFLUX_SWITCH with the next cell, SWITCH_CONFIRM, fallback on timeout), one unconfirmed
//! at a time. A spare leg that closes while cells charged to it are unacknowledged ends the
//! set's streams cleanly (their applications see the connection close): those cells may be
//! lost in it, the client keeps no copy once a switch is confirmed, and a gap the exit
//! never sees filled would be a silent stall.

use super::*;
use crate::switching::path::MAX_LEGS;
use crate::switching::{LegScheduler, LegUse, LegView, MinRtt};

use super::super::queue::QUEUE_HIGHWATER;

impl Core {
    /// Whether the client stripes its uploads over the legs.
    pub(in crate::node) fn path_striping(&self) -> bool {
        self.sw.settings().leg_use == LegUse::Stripe
    }

    /// Client, stripe mode, before packaging a DATA cell of stream `sid` on `home`: move the
    /// set's sender to the leg the scheduler picks (no move outside a set, in whole mode,
    /// while a switch is unconfirmed or cells wait behind one). False: the scheduler's own
    /// bound (`SwitchStripeLegCells`) leaves no leg for the cell, which waits for a stream
    /// SENDME, as at a closed window.
    pub(in crate::node) fn path_stripe_pick(
        &mut self,
        home: CircKey,
        sid: u16,
        now: Instant,
    ) -> bool {
        if !self.path_striping() {
            return true;
        }
        let Some(set) = self.path.client.get(&home) else {
            return true;
        };
        let Some(current) = set.sender.current() else {
            return true;
        };
        let Some(stream) = self
            .circuits
            .get(&home)
            .and_then(|c| c.edge())
            .and_then(|e| e.streams.get(&sid))
        else {
            return true;
        };
        let sched = MinRtt::with_leg_cells(self.sw.settings().stripe_leg_cells);
        let view = |leg: CircKey| LegView {
            leg,
            room: self.circuits.get(&leg).is_some_and(|c| {
                c.edge().is_some_and(|e| e.window.can_package())
                    && c.queue_len(c.edge_out_side()) < QUEUE_HIGHWATER
            }) && stream.can_package_on(leg),
            srtt: set.rtt.smoothed(leg),
            in_flight: stream.legs.as_ref().map(|l| l.in_flight(leg)),
        };
        if set.spare.is_none() || set.sender.switch_announced() || !set.deferred.is_empty() {
            // No move now: the cell goes on the leg in use, within the scheduler's bound.
            // (Windows and queue are the packaging loop's own checks.)
            return sched.within_bound(&view(current));
        }
        // Asked before every DATA cell: the views go on the stack (a set has at most
        // MAX_LEGS legs), not in a fresh Vec per cell.
        let mut views = [LegView {
            leg: current,
            room: false,
            srtt: None,
            in_flight: None,
        }; MAX_LEGS];
        let mut n = 0;
        for (slot, leg) in views.iter_mut().zip(set.sender.legs()) {
            *slot = view(leg);
            n += 1;
        }
        let Some(to) = sched.pick(current, &views[..n]) else {
            // No leg with room. Blocked only by the scheduler's bound: a window or the queue
            // closing is the packaging loop's to see (and the cell waits there anyway).
            let cur = views[..n].iter().find(|v| v.leg == current);
            return cur.is_none_or(|v| sched.within_bound(v));
        };
        if to == current {
            return true;
        }
        let from = self.first_chan(current).unwrap_or(ChannelId(0));
        let to_chan = self.first_chan(to);
        let Some(set) = self.path.client.get_mut(&home) else {
            return true;
        };
        if set.sender.switch_to(to, now).is_err() {
            return true;
        }
        set.switch = Some(PendingRecord {
            triggered: now,
            from,
            to: to_chan,
            first_cell: None,
            last_old: None,
            held_by: None,
        });
        self.sw.stats_mut().stripe_moves += 1;
        debug!(?home, from = ?current, ?to, "striping: next cells on the other leg");
        true
    }

    /// Client, stripe mode: spare `leg` of `home` is closing. Nonzero if cells of `home`'s
    /// streams charged to it are unacknowledged (their number under fixed windows; 1 under
    /// congestion control, whose XON/XOFF streams keep no per-leg count, if the leg ever
    /// carried a multiplexed cell): the set's streams must end (the caller closes the set),
    /// since those cells may be lost with the leg.
    pub(in crate::node) fn path_stripe_leg_loses(&self, home: CircKey, leg: CircKey) -> u32 {
        if !self.path_striping() {
            return 0;
        }
        let Some(edge) = self.circuits.get(&home).and_then(|c| c.edge()) else {
            return 0;
        };
        let mut windowed = false;
        let mut charged = 0;
        for l in edge.streams.values().filter_map(|s| s.legs.as_ref()) {
            windowed = true;
            charged += l.in_flight(leg);
        }
        if windowed || edge.streams.is_empty() {
            return charged;
        }
        let carried = self
            .path
            .client
            .get(&home)
            .and_then(|s| s.sender.last_sent_on(leg))
            .is_some_and(|n| n > 0);
        u32::from(carried)
    }
}
