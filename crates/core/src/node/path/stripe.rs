//! The client's upload over every leg at once (`SwitchLegUse = stripe`,
//! [`crate::switching::legs`]): before each DATA cell of a set's stream is packaged, the
//! [`MinRtt`] scheduler picks the leg; a different leg is an ordinary path switch (lazy
//! CONFLUX_SWITCH with the next cell, SWITCH_CONFIRM, fallback on timeout), by default one
//! unconfirmed at a time. With `SwitchStripeMoves` = n > 1 up to n moves wait for their
//! confirmations at once: a move superseded before its confirmation is *released* (the
//! client stops keeping its cells; [`crate::switching::PathSender::switch_to`]). Why: the
//! confirmation crosses the same loaded entry as the data, so with one move at a time a leg
//! at its `SwitchStripeLegCells` cap stalls the stream for a confirmation round trip while
//! the other leg has room. A released move is covered as a leg is once its move is
//! confirmed: a leg that closes with cells charged to it ends the set's streams (below),
//! and a released move still unconfirmed at its deadline on a leg that has given no round
//! trip since its SWITCH went out (nothing comes back: the cells may be lost) ends them
//! too; one whose leg still answers is late, not lost, and only frees its slot. A spare leg
//! that closes while cells charged to it are unacknowledged ends the
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
        if set.spare.is_none() || !set.sender.may_switch() || !set.deferred.is_empty() {
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

    /// Client: the confirmation of a released move (`SwitchStripeMoves` > 1, `released.to` the
    /// leg it came on) arrived: record the switch (trigger, SWITCH sent, leg left) and package
    /// again (a move slot is free). No echo to the exit and no change of the control leg: the
    /// exit may have confirmed a later switch on this leg since, and only the latest of a leg
    /// is echoed ([`Core::path_on_confirm`]'s rule).
    pub(in crate::node) fn path_stripe_released_confirmed(
        &mut self,
        home: CircKey,
        released: crate::switching::Released,
        seq: u64,
        timeout: std::time::Duration,
        now: Instant,
    ) {
        let leg = released.to;
        let wait = now.saturating_duration_since(released.announced_at);
        self.sw.stats_mut().switches += 1;
        self.sw.stats_mut().completed += 1;
        self.sw.push_record(SwitchRecord {
            circ: home,
            from: self.first_chan(released.from).unwrap_or(ChannelId(0)),
            to: self.first_chan(leg),
            triggered: released.triggered_at,
            ended: released.announced_at,
            last_old: None,
            outcome: SwitchOutcome::Switched,
            mode: SwitchMode::Path,
            confirm_wait: Some(wait),
            confirm_timeout: Some(timeout),
            held_by: None,
        });
        debug!(?home, ?leg, seq, ?wait, "released stripe move confirmed");
        self.path_rtt_sample(leg, wait, true, now);
        self.path_resume(home, now);
    }

    /// Client: released moves of `home` passed their deadline unconfirmed. A leg heard from
    /// (a round trip sample) since the move's SWITCH went out is slow, not gone: the move
    /// only frees its slot. Otherwise nothing came back on that leg: the cells sent there
    /// since may be lost and the client kept no copy, so the set's streams end cleanly
    /// rather than wait for a gap the exit would never see filled.
    pub(in crate::node) fn path_stripe_released_expired(
        &mut self,
        home: CircKey,
        expired: Vec<crate::switching::Released>,
        now: Instant,
    ) {
        let Some(set) = self.path.client.get(&home) else {
            return;
        };
        let silent = expired.iter().find(|r| {
            !set.heard
                .iter()
                .any(|(l, at)| *l == r.to && *at > r.announced_at)
        });
        self.sw.stats_mut().timed_out += expired.len() as u64;
        if let Some(r) = silent.copied() {
            self.sw.stats_mut().failed += 1;
            return self.path_client_fail(
                home,
                &format!(
                    "a released stripe move onto {:?} went unconfirmed and the leg silent",
                    r.to
                ),
                now,
            );
        }
        debug!(
            ?home,
            n = expired.len(),
            "released stripe moves late; legs still answer"
        );
        self.path_resume(home, now);
    }
}
