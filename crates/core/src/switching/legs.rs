//! How a client's upload uses the legs of its linked set (`SwitchLegUse`): the policy hook.
//!
//! - `whole` ([`LegUse::Whole`], the paper's design): the upload stays on one leg and moves
//!   whole to the other on the entry's congestion report (`node/path/switch.rs`).
//! - `stripe` ([`LegUse::Stripe`], conflux's idea, proposal 329's MINRTT scheduler): the
//!   upload uses both legs at once. Before each DATA cell is packaged the client asks a
//!   [`LegScheduler`] which leg it goes on: a leg *has room* when its circuit window allows a
//!   cell, its circuit queue is below the high-water mark and the stream's window on that leg
//!   (`crate::streamflow::LegWindows`) is not used up. Moving to another leg is an ordinary
//!   path switch (CONFLUX_SWITCH with the relative number, SWITCH_CONFIRM), so at most one
//!   move is unconfirmed at a time; the exit restores order by sequence number as for any
//!   switch. Congestion reports move nothing in this mode: a loaded entry shows in its leg's
//!   round trip and in its window not refilling.
//!
//! The scheduler is pure (no time, no IO): the caller gathers one [`LegView`] per leg.
//!
//! **Per-leg cap** (`SwitchStripeLegCells`, [`MinRtt::leg_cells`]): under fixed windows each
//! leg may otherwise hold the stream's whole 500-cell window, and with every client striping
//! both paths' queues (the entry's socket towards its middle, where the paper's latency probe
//! waits) hold every client's windows: throughput up, latency barely down (session 22). A cap
//! on the stream's unacknowledged cells per leg bounds what one client can park in each path's
//! queue, as conflux bounds each leg by its congestion window (tor's `circuit_ready_to_send`:
//! inflight < cwnd); here the bound is a fixed cell count because fixed windows have no cwnd.
//! The cap gates packaging too ([`LegScheduler::within_bound`]), not only the choice of leg: a
//! client whose legs are all at their cap waits for a stream SENDME.

use std::time::Duration;

use crate::CircKey;

/// `SwitchLegUse`: how the client's upload uses the legs of its linked set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LegUse {
    /// One leg at a time; the entry's congestion report moves the upload whole (the paper).
    #[default]
    Whole,
    /// Every leg with room, the lowest smoothed round trip first (conflux-style).
    Stripe,
}

impl LegUse {
    /// Parse the option ("whole", "stripe").
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "whole" => Ok(LegUse::Whole),
            "stripe" => Ok(LegUse::Stripe),
            other => Err(format!("{other:?} is not one of \"whole\", \"stripe\"")),
        }
    }

    /// The option's spelling.
    pub fn label(self) -> &'static str {
        match self {
            LegUse::Whole => "whole",
            LegUse::Stripe => "stripe",
        }
    }
}

/// One leg as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegView {
    /// The leg.
    pub leg: CircKey,
    /// A cell of the stream being packaged may go on it now (circuit window, circuit queue,
    /// the stream's window on this leg).
    pub room: bool,
    /// Its smoothed round trip (None: not measured yet).
    pub srtt: Option<Duration>,
    /// The stream's cells charged to this leg and not yet acknowledged by a stream SENDME
    /// (None: the stream keeps no per-leg count, as under XON/XOFF).
    pub in_flight: Option<u32>,
}

/// Picks the leg the next cell goes on. `current` is the leg the sender uses now; the answer
/// is the leg to use (`current` itself to stay), or None when no leg has room (the cell
/// waits, as it would on one leg with a closed window).
pub trait LegScheduler {
    /// The leg for the next cell.
    fn pick(&self, current: CircKey, legs: &[LegView]) -> Option<CircKey>;

    /// Is the leg within the policy's own bound (beside its windows and queue, which
    /// [`LegView::room`] says)? Asked for the leg in use while a move is unconfirmed too (no
    /// pick then), so the bound holds on every cell. Default: no bound of its own.
    fn within_bound(&self, _v: &LegView) -> bool {
        true
    }
}

/// Conflux's MINRTT with a margin: among the legs with room, the lowest smoothed round trip;
/// the current leg is kept while it has room and is not more than `margin_pct` % slower than
/// that best one. The margin matters more here than in conflux: every move is a switch that
/// waits for its confirmation before the next, so alternating on round-trip noise would
/// spend the one move in flight on nothing. An unmeasured leg counts as the fastest (it is
/// tried, and then measured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinRtt {
    /// How much slower (in %) the current leg may be than the best one and still be kept.
    pub margin_pct: u32,
    /// The most cells of the stream unacknowledged on one leg (`SwitchStripeLegCells`);
    /// 0: no cap beyond the stream's per-leg window (500). See the module docs.
    pub leg_cells: u32,
}

/// The most moves between legs that may wait for their confirmations at once
/// (`SwitchStripeMoves`; [`crate::switching::PathLimits::max_moves`]). Each unconfirmed move
/// is a slot in the sender and, at the exit, one confirmation per leg: a few cover the
/// confirmation round trip of a loaded entry at the lab's rates; more only lengthens what
/// a silent leg can take before its move's deadline ends the streams.
pub const MAX_STRIPE_MOVES: u32 = 16;

/// The least per-leg cap taken: the exit acknowledges the stream 50 cells at a time
/// (`STREAM_SENDME_INCREMENT`) counted over both legs, so two legs at a cap of 50 always hold
/// at least one SENDME's worth, and the stream cannot wait on an acknowledgement that needs
/// cells it may not send.
pub const MIN_LEG_CELLS: u32 = crate::flow::STREAM_SENDME_INCREMENT;

impl Default for MinRtt {
    fn default() -> Self {
        // The 10 % the lighter-leg rule uses (`SetRtt::heavier`).
        MinRtt {
            margin_pct: 10,
            leg_cells: 0,
        }
    }
}

impl MinRtt {
    /// MINRTT with the per-leg cap `leg_cells` (0: none; else at least [`MIN_LEG_CELLS`]).
    pub fn with_leg_cells(leg_cells: u32) -> Self {
        MinRtt {
            leg_cells: if leg_cells == 0 {
                0
            } else {
                leg_cells.max(MIN_LEG_CELLS)
            },
            ..MinRtt::default()
        }
    }
}

impl LegScheduler for MinRtt {
    fn within_bound(&self, v: &LegView) -> bool {
        self.leg_cells == 0 || v.in_flight.is_none_or(|n| n < self.leg_cells)
    }

    fn pick(&self, current: CircKey, legs: &[LegView]) -> Option<CircKey> {
        let rtt = |v: &LegView| v.srtt.unwrap_or(Duration::ZERO);
        let best = legs
            .iter()
            .filter(|v| v.room && self.within_bound(v))
            .min_by_key(|v| (rtt(v), v.leg != current))?;
        match legs
            .iter()
            .find(|v| v.leg == current && v.room && self.within_bound(v))
        {
            Some(cur)
                if rtt(cur).as_secs_f64() * 100.0
                    <= rtt(best).as_secs_f64() * f64::from(100 + self.margin_pct) =>
            {
                Some(current)
            }
            _ => Some(best.leg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(leg: u32, room: bool, ms: Option<u64>) -> LegView {
        LegView {
            leg: CircKey(leg.into()),
            room,
            srtt: ms.map(Duration::from_millis),
            in_flight: Some(0),
        }
    }

    #[test]
    fn parse_and_label_round_trip() {
        for u in [LegUse::Whole, LegUse::Stripe] {
            assert_eq!(LegUse::parse(u.label()), Ok(u));
        }
        assert!(LegUse::parse("both").is_err());
        assert_eq!(LegUse::default(), LegUse::Whole);
    }

    #[test]
    fn the_current_leg_is_kept_while_it_has_room_and_is_not_much_slower() {
        let s = MinRtt::default();
        let a = CircKey(1);
        assert_eq!(
            s.pick(a, &[v(1, true, Some(105)), v(2, true, Some(100))]),
            Some(a)
        );
        // 20 % slower than the other: move.
        assert_eq!(
            s.pick(a, &[v(1, true, Some(120)), v(2, true, Some(100))]),
            Some(CircKey(2))
        );
    }

    #[test]
    fn a_full_leg_gives_way_to_one_with_room_whatever_the_round_trips() {
        let s = MinRtt::default();
        let a = CircKey(1);
        assert_eq!(
            s.pick(a, &[v(1, false, Some(10)), v(2, true, Some(900))]),
            Some(CircKey(2))
        );
        assert_eq!(
            s.pick(a, &[v(1, false, Some(10)), v(2, false, Some(9))]),
            None
        );
    }

    #[test]
    fn an_unmeasured_leg_with_room_is_tried() {
        let s = MinRtt::default();
        assert_eq!(
            s.pick(CircKey(1), &[v(1, true, Some(50)), v(2, true, None)]),
            Some(CircKey(2))
        );
    }

    #[test]
    fn a_leg_at_its_cap_has_no_room_and_the_cap_has_a_floor() {
        let s = MinRtt::with_leg_cells(100);
        let a = CircKey(1);
        let at = |leg, n, ms| LegView {
            in_flight: Some(n),
            ..v(leg, true, Some(ms))
        };
        // The faster leg is at its cap: the slower one takes the cell.
        assert_eq!(
            s.pick(a, &[at(1, 100, 50), at(2, 99, 200)]),
            Some(CircKey(2))
        );
        // Both at the cap: the cell waits, though windows and queues would allow it.
        assert_eq!(s.pick(a, &[at(1, 100, 50), at(2, 100, 200)]), None);
        assert!(!s.within_bound(&at(1, 100, 50)));
        // Without a cap (or with no per-leg count) the same legs have room.
        assert_eq!(
            MinRtt::default().pick(a, &[at(1, 100, 50), at(2, 100, 200)]),
            Some(a)
        );
        assert!(s.within_bound(&LegView {
            in_flight: None,
            ..at(1, 100, 50)
        }));
        assert_eq!(MinRtt::with_leg_cells(10).leg_cells, MIN_LEG_CELLS);
        assert_eq!(MinRtt::with_leg_cells(0).leg_cells, 0);
    }
}
