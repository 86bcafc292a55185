//! Round trips of a linked set's legs and the confirmation timeout they set (split out of
//! `switching/path.rs`; re-exported there).

use std::time::Duration;

use super::MAX_LEGS;
use crate::CircKey;

/// Longest confirmation timeout the round trip can make (a leg that does not answer in a
/// minute is gone in practice); a larger `SwitchTimeoutMsec` floor still wins.
pub const MAX_RTT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);

/// The confirmation timeout of a path switch: `max(floor, factor × rtt)` (Tor-style: a fixed
/// floor, and a multiple of the measured round trip above it), the multiple capped at
/// [`MAX_RTT_CONFIRM_TIMEOUT`]. `rtt` None (nothing measured yet) or `factor` 0 gives the
/// floor. The timeout only has to tell a late confirmation from a leg that dropped it (a leg
/// that closes is noticed at once): under load the SWITCH waits behind the entry's backlog,
/// so a fixed 2 s timed out switches whose confirmation was on its way.
pub fn confirm_timeout(floor: Duration, factor: u32, rtt: Option<Duration>) -> Duration {
    match rtt {
        Some(rtt) if factor > 0 => {
            floor.max(rtt.saturating_mul(factor).min(MAX_RTT_CONFIRM_TIMEOUT))
        }
        _ => floor,
    }
}

/// The shortest a client waits for a probe's answer before it takes the other leg as heavier
/// (a round trip through three relays on loopback is a few ms; 20 ms keeps a scheduling hiccup
/// from deciding).
pub const PROBE_MIN_WAIT: Duration = Duration::from_millis(20);

/// Round trips measured on the legs of a linked set (client side): LINK → LINKED, SWITCH →
/// SWITCH_CONFIRM, and circuit SENDMEs (each acknowledged cell's round trip). Per leg a
/// smoothed value (gain 1/8, as TCP's SRTT) and the latest sample; [`SetRtt::estimate`] is
/// the larger of the two over every leg. Every leg, not only the one switched to: a spare
/// that has been idle since its LINK carries an idle network's round trip, while the leg
/// being left shows what the backlog costs now, and the SWITCH meets the same kind of backlog
/// at the other entry.
#[derive(Clone, Debug, Default)]
pub struct SetRtt {
    /// (leg, smoothed, latest).
    legs: Vec<(CircKey, Duration, Duration)>,
    /// Legs measured by more than their LINK: a circuit SENDME, a switch's confirmation or a
    /// probe (a LINK → LINKED round trip is the idle network's).
    loaded: Vec<CircKey>,
}

impl SetRtt {
    /// A round trip measured on `leg` while it carried data (a circuit SENDME, SWITCH →
    /// SWITCH_CONFIRM).
    pub fn sample(&mut self, leg: CircKey, rtt: Duration) {
        self.link_sample(leg, rtt);
        if !self.loaded.contains(&leg) && self.loaded.len() < MAX_LEGS * 2 {
            self.loaded.push(leg);
        }
    }

    /// A LINK → LINKED round trip on `leg` (the network idle for this leg).
    pub fn link_sample(&mut self, leg: CircKey, rtt: Duration) {
        if let Some(e) = self.legs.iter_mut().find(|(c, _, _)| *c == leg) {
            e.1 = (e.1 * 7 + rtt) / 8;
            e.2 = rtt;
        } else if self.legs.len() < MAX_LEGS * 2 {
            self.legs.push((leg, rtt, rtt));
        }
    }

    /// A probe's round trip on `leg`, which carried no data lately: it replaces the leg's
    /// estimate (smoothed and latest), since the samples from when the leg last carried data,
    /// or from its LINK, describe another load.
    pub fn probed(&mut self, leg: CircKey, rtt: Duration) {
        self.sample(leg, rtt);
        if let Some(e) = self.legs.iter_mut().find(|(c, _, _)| *c == leg) {
            e.1 = rtt;
            e.2 = rtt;
        }
    }

    /// The round trip `leg` costs now, as far as measured: the larger of its smoothed value and
    /// its latest sample (a congestion report says the load is rising, and the smoothed value
    /// lags).
    pub fn now(&self, leg: CircKey) -> Option<Duration> {
        self.legs
            .iter()
            .find(|(c, _, _)| *c == leg)
            .map(|e| e.1.max(e.2))
    }

    /// `leg` is gone: forget it.
    pub fn leg_closed(&mut self, leg: CircKey) {
        self.legs.retain(|(c, _, _)| *c != leg);
        self.loaded.retain(|c| *c != leg);
    }

    /// The smoothed round trip of `leg`.
    pub fn smoothed(&self, leg: CircKey) -> Option<Duration> {
        self.legs.iter().find(|(c, _, _)| *c == leg).map(|e| e.1)
    }

    /// Whether leg `to` measures heavier than leg `from`: its smoothed round trip is more
    /// than 10 % above `from`'s. Unmeasured legs are not heavier. The caller has a congestion
    /// report for `from` (the evidence that `from` is loaded now), so a tie does not keep it
    /// there: in the lab the first reports came before any SENDME, with both legs measured
    /// only at their LINK, idle and equal. The samples of a leg not in use are those from when
    /// it last carried data (or its LINK): a leg left because it was loaded keeps that load in
    /// its estimate, so the client does not go back while the leg it is on measures lighter.
    pub fn heavier(&self, to: CircKey, from: CircKey) -> bool {
        match (self.smoothed(to), self.smoothed(from)) {
            (Some(t), Some(f)) => t.as_secs_f64() > f.as_secs_f64() * 1.1,
            _ => false,
        }
    }

    /// How long a probe on the other leg may take and still show it lighter than `from`:
    /// 1.1 × `from`'s [`SetRtt::now`], at least [`PROBE_MIN_WAIT`] and at most
    /// [`MAX_RTT_CONFIRM_TIMEOUT`]. None while `from` has no measurement but its LINK's: that
    /// is the idle network's round trip, while the congestion report says `from` is loaded
    /// now (in the lab the first reports came before any SENDME, and a probe compared with
    /// the LINK's 30 ms never answered in time).
    pub fn probe_wait(&self, from: CircKey) -> Option<Duration> {
        if !self.loaded.contains(&from) {
            return None;
        }
        let f = self.now(from)?;
        Some(
            f.mul_f64(1.1)
                .clamp(PROBE_MIN_WAIT, MAX_RTT_CONFIRM_TIMEOUT),
        )
    }

    /// Whether `to` measures heavier than `from` now ([`SetRtt::now`] of each, the 10 %
    /// margin of [`SetRtt::heavier`]): the comparison a probe's answer decides (`to` just
    /// probed, `from` carrying the upload). Unmeasured legs are not heavier.
    pub fn heavier_now(&self, to: CircKey, from: CircKey) -> bool {
        match (self.now(to), self.now(from)) {
            (Some(t), Some(f)) => t.as_secs_f64() > f.as_secs_f64() * 1.1,
            _ => false,
        }
    }

    /// The round trip a switch's confirmation should be given: the largest smoothed or
    /// latest sample over the set's legs (None before any sample).
    pub fn estimate(&self) -> Option<Duration> {
        self.legs.iter().map(|(_, s, l)| (*s).max(*l)).max()
    }
}
