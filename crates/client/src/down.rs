//! Relays the client believes are down, and the policy that puts them there.
//!
//! Policy (see docs/security.md, "Relay failure"):
//! - A circuit whose link to its first hop was lost (the connection could not be opened, or
//!   closed with EOF/RST) marks its guard **down**: certain, the client saw it itself.
//! - A circuit torn down by a DESTROY saying CHANNEL_CLOSED or CONNECTFAILED makes its later
//!   hops **suspect**. The DESTROY does not say which hop failed (Tor stopped sending
//!   TRUNCATED, which did), so a built circuit suspects every hop after the guard, and a
//!   circuit still being built suspects the hop it was extending to. Other reasons (FINISHED,
//!   PROTOCOL, RESOURCELIMIT, ...) and the client's own closes blame nobody.
//! - New paths leave out down and suspect relays; if that leaves no path, suspects are allowed
//!   again step by step, least blamed first (a suspect counts the circuit ends that blamed it:
//!   the relay common to several failed circuits is the likeliest dead one), then down relays
//!   (a tiny network must keep working, as Tor retries all its guards when every one has
//!   failed).
//! - A mark ends after the retry interval (`RelayRetryInterval`, default 60 s), or as soon as a
//!   consensus lists the relay again after one that did not (the authority saw it leave and
//!   come back).
//!
//! Tor itself marks a relay not running when its own connection to it fails and forgets that
//! at the next consensus (hourly); it never blames middles or exits for a DESTROY, so that a
//! hostile relay cannot steer paths by tearing circuits down. The suspect marks here are short
//! and soft for that reason: they only steer while an alternative exists.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chive_cell::DestroyReason;
use chive_core::CloseCause;
use chive_crypto::IdentityKey;
use chive_dir::Consensus;

/// How sure the client is that a relay is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Blame {
    /// Perhaps: it was on a circuit whose far side went away.
    Suspect,
    /// Surely: the client's own link to it failed.
    Down,
}

/// Which relays of `path` a circuit's end blames. `hops` is how many had completed their
/// handshake (the path's length once built). See the module docs.
pub fn blame(cause: CloseCause, hops: usize, path: &[IdentityKey]) -> Vec<(IdentityKey, Blame)> {
    match cause {
        CloseCause::LinkLost => path
            .first()
            .map(|g| (*g, Blame::Down))
            .into_iter()
            .collect(),
        CloseCause::Destroyed(r)
            if r == DestroyReason::CHANNEL_CLOSED || r == DestroyReason::CONNECTFAILED =>
        {
            if hops >= path.len() {
                path.iter()
                    .skip(1)
                    .map(|id| (*id, Blame::Suspect))
                    .collect()
            } else if hops >= 1 {
                // The hop being extended to could not be reached (or its link dropped).
                vec![(path[hops], Blame::Suspect)]
            } else {
                // The guard refused the CREATE2 itself; it is alive.
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

#[derive(Clone, Copy, Debug)]
struct Mark {
    blame: Blame,
    until: Instant,
    /// Circuit ends that blamed it while marked: a relay common to several failed circuits is
    /// the likeliest culprit, so it is the last suspect to be allowed again.
    count: u32,
    /// The last consensus did not list it; listing it again ends the mark.
    absent: bool,
}

/// The client's down and suspect relays, each with an end time.
#[derive(Debug)]
pub struct DownList {
    retry: Duration,
    marks: HashMap<IdentityKey, Mark>,
}

impl DownList {
    /// Marks last `retry` unless a consensus brings the relay back sooner.
    pub fn new(retry: Duration) -> Self {
        DownList {
            retry,
            marks: HashMap::new(),
        }
    }

    /// Mark `id` (a stronger blame replaces a weaker one; either restarts the interval).
    /// Returns whether this is news: not marked before at this strength.
    pub fn mark(&mut self, id: IdentityKey, blame: Blame, now: Instant) -> bool {
        let until = now + self.retry;
        match self.marks.get_mut(&id) {
            Some(m) if m.until > now && m.blame >= blame => {
                m.until = until;
                m.count = m.count.saturating_add(1);
                false
            }
            Some(m) if m.until > now => {
                // A stronger blame on a live mark: news, and the count goes on.
                m.blame = blame;
                m.until = until;
                m.count = m.count.saturating_add(1);
                true
            }
            _ => {
                self.marks.insert(
                    id,
                    Mark {
                        blame,
                        until,
                        count: 1,
                        absent: false,
                    },
                );
                true
            }
        }
    }

    /// A new consensus: a marked relay it lists after one that did not is back.
    pub fn on_consensus(&mut self, consensus: &Consensus) {
        self.marks.retain(|id, m| {
            let listed = consensus.relay_by_identity(id).is_some();
            let back = listed && m.absent;
            m.absent = !listed;
            !back
        });
    }

    /// Forget marks whose interval has passed.
    pub fn expire(&mut self, now: Instant) {
        self.marks.retain(|_, m| m.until > now);
    }

    /// The blame on `id` now, if any.
    pub fn blame_of(&self, id: &IdentityKey, now: Instant) -> Option<Blame> {
        self.marks
            .get(id)
            .filter(|m| m.until > now)
            .map(|m| m.blame)
    }

    /// Relays blamed at least `min` now.
    fn excluded(&self, min: Blame, now: Instant) -> HashSet<IdentityKey> {
        self.marks
            .iter()
            .filter(|(_, m)| m.until > now && m.blame >= min)
            .map(|(id, _)| *id)
            .collect()
    }

    /// `consensus` without the relays blamed at least `min`; None if it would lose none.
    pub fn without(&self, consensus: &Consensus, min: Blame, now: Instant) -> Option<Consensus> {
        let out = self.excluded(min, now);
        Self::leave_out(consensus, &out)
    }

    /// `consensus` without the down relays and the suspects blamed by at least `count` circuit
    /// ends; None if it would lose none.
    pub fn without_blamed(
        &self,
        consensus: &Consensus,
        count: u32,
        now: Instant,
    ) -> Option<Consensus> {
        let out: HashSet<IdentityKey> = self
            .marks
            .iter()
            .filter(|(_, m)| m.until > now && (m.blame == Blame::Down || m.count >= count))
            .map(|(id, _)| *id)
            .collect();
        Self::leave_out(consensus, &out)
    }

    /// The counts, above one and in ascending order, that tell the live suspects apart: the
    /// steps in which [`DownList::without_blamed`] allows suspects again, least blamed first.
    pub fn suspect_counts(&self, now: Instant) -> Vec<u32> {
        let mut counts: Vec<u32> = self
            .marks
            .values()
            .filter(|m| m.until > now && m.blame == Blame::Suspect && m.count > 1)
            .map(|m| m.count)
            .collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    fn leave_out(consensus: &Consensus, out: &HashSet<IdentityKey>) -> Option<Consensus> {
        if !consensus.relays.iter().any(|r| out.contains(&r.identity)) {
            return None;
        }
        let mut c = consensus.clone();
        c.relays.retain(|r| !out.contains(&r.identity));
        Some(c)
    }

    /// Number of live marks (for logs and tests).
    pub fn len(&self, now: Instant) -> usize {
        self.marks.values().filter(|m| m.until > now).count()
    }

    /// Whether no mark is live.
    pub fn is_empty(&self, now: Instant) -> bool {
        self.len(now) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> IdentityKey {
        chive_crypto::IdentityKeypair::from_secret_bytes(&[n; 32]).public()
    }

    fn consensus(ids: &[u8]) -> Consensus {
        let relays = ids
            .iter()
            .map(|&n| chive_dir::ConsensusRelay {
                nickname: format!("r{n}"),
                identity: id(n),
                ntor_key: [n; 32],
                address: format!("127.0.0.1:{}", 9000 + u16::from(n))
                    .parse()
                    .unwrap(),
                bandwidth: 100,
                flags: chive_dir::RelayFlags::RUNNING,
                exit_policy: chive_dir::ExitPolicy::parse(&["reject *:*"], false).unwrap(),
                features: 0,
            })
            .collect();
        Consensus {
            valid_after: 0,
            fresh_until: 1,
            valid_until: 2,
            params: chive_dir::NetParams::new(),
            relays,
        }
    }

    #[test]
    fn a_relay_the_consensus_drops_and_lists_again_is_back() {
        let t0 = Instant::now();
        let mut d = DownList::new(Duration::from_secs(600));
        d.mark(id(2), Blame::Down, t0);
        d.on_consensus(&consensus(&[1, 2, 3]));
        assert_eq!(d.blame_of(&id(2), t0), Some(Blame::Down), "still listed");
        d.on_consensus(&consensus(&[1, 3]));
        assert_eq!(d.blame_of(&id(2), t0), Some(Blame::Down), "gone");
        d.on_consensus(&consensus(&[1, 2, 3]));
        assert_eq!(d.blame_of(&id(2), t0), None, "back");
    }

    #[test]
    fn paths_leave_out_relays_blamed_at_least_the_given_strength() {
        let t0 = Instant::now();
        let mut d = DownList::new(Duration::from_secs(60));
        let c = consensus(&[1, 2, 3, 4]);
        assert!(d.without(&c, Blame::Suspect, t0).is_none());
        d.mark(id(2), Blame::Down, t0);
        d.mark(id(3), Blame::Suspect, t0);
        let ids = |c: Consensus| c.relays.iter().map(|r| r.identity).collect::<Vec<_>>();
        let all = d.without(&c, Blame::Suspect, t0).unwrap();
        assert_eq!(ids(all), vec![id(1), id(4)]);
        let hard = d.without(&c, Blame::Down, t0).unwrap();
        assert_eq!(ids(hard), vec![id(1), id(3), id(4)]);
        assert!(d
            .without(&c, Blame::Suspect, t0 + Duration::from_secs(60))
            .is_none());
    }

    /// Session 13's flaky kill test: the dead middle (3) was on all three failed circuits,
    /// the innocent exit (2) and another middle (4) on fewer; with every suspect left out no
    /// path remained, and allowing them all again picked the dead one three times.
    #[test]
    fn the_suspect_blamed_most_is_the_last_allowed_again() {
        let t0 = Instant::now();
        let mut d = DownList::new(Duration::from_secs(60));
        let c = consensus(&[1, 2, 3, 4, 5]);
        let ids = |c: Consensus| c.relays.iter().map(|r| r.identity).collect::<Vec<_>>();
        // Three circuits through 3 died; 4 was on two of them, 2 on one.
        for blamed in [&[3, 2][..], &[4, 3], &[4, 3]] {
            for &n in blamed {
                d.mark(id(n), Blame::Suspect, t0);
            }
        }
        assert_eq!(d.suspect_counts(t0), vec![2, 3]);
        assert_eq!(
            ids(d.without(&c, Blame::Suspect, t0).unwrap()),
            vec![id(1), id(5)]
        );
        assert_eq!(
            ids(d.without_blamed(&c, 2, t0).unwrap()),
            vec![id(1), id(2), id(5)]
        );
        assert_eq!(
            ids(d.without_blamed(&c, 3, t0).unwrap()),
            vec![id(1), id(2), id(4), id(5)]
        );
        // A down relay stays out at every step.
        d.mark(id(1), Blame::Down, t0);
        assert!(!ids(d.without_blamed(&c, 3, t0).unwrap()).contains(&id(1)));
        // Counts end with the mark.
        assert!(d.suspect_counts(t0 + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn a_lost_first_link_blames_the_guard_only() {
        let path = [id(1), id(2), id(3)];
        assert_eq!(
            blame(CloseCause::LinkLost, 3, &path),
            vec![(id(1), Blame::Down)]
        );
        assert_eq!(
            blame(CloseCause::LinkLost, 0, &path),
            vec![(id(1), Blame::Down)]
        );
    }

    #[test]
    fn a_destroy_on_a_built_circuit_suspects_every_later_hop() {
        let path = [id(1), id(2), id(3)];
        let closed = CloseCause::Destroyed(DestroyReason::CHANNEL_CLOSED);
        assert_eq!(
            blame(closed, 3, &path),
            vec![(id(2), Blame::Suspect), (id(3), Blame::Suspect)]
        );
        // Extending to the exit failed: only the exit.
        let failed = CloseCause::Destroyed(DestroyReason::CONNECTFAILED);
        assert_eq!(blame(failed, 2, &path), vec![(id(3), Blame::Suspect)]);
        // The guard refused to create: nobody is down.
        assert!(blame(failed, 0, &path).is_empty());
    }

    #[test]
    fn other_ends_blame_nobody() {
        let path = [id(1), id(2), id(3)];
        for cause in [
            CloseCause::Local,
            CloseCause::Destroyed(DestroyReason::FINISHED),
            CloseCause::Destroyed(DestroyReason::PROTOCOL),
            CloseCause::Destroyed(DestroyReason::RESOURCELIMIT),
        ] {
            assert!(blame(cause, 3, &path).is_empty(), "{cause:?}");
        }
    }

    #[test]
    fn marks_expire_after_the_retry_interval() {
        let t0 = Instant::now();
        let mut d = DownList::new(Duration::from_secs(60));
        assert!(d.mark(id(1), Blame::Suspect, t0));
        assert!(!d.mark(id(1), Blame::Suspect, t0));
        assert!(d.mark(id(1), Blame::Down, t0), "an upgrade is news");
        assert!(!d.mark(id(1), Blame::Suspect, t0), "no downgrade");
        assert_eq!(d.blame_of(&id(1), t0), Some(Blame::Down));
        let later = t0 + Duration::from_secs(59);
        assert_eq!(d.blame_of(&id(1), later), Some(Blame::Down));
        let after = t0 + Duration::from_secs(60);
        assert_eq!(d.blame_of(&id(1), after), None);
        d.expire(after);
        assert!(d.is_empty(after));
    }
}
