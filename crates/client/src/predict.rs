//! Predicted pinned exits: which exits the client keeps clean circuits built to, because
//! requests pinned to them (`host.<nickname>.exit`) came recently. Pure bookkeeping on a clock
//! passed in; [`crate::circmgr::CircuitManager`] counts the circuits and launches them.
//!
//! Tor's model (0.4.x `predict_ports.c`, `circuituse.c`): every CONNECT notes its port
//! (`rep_hist_note_used_port`); once a second `circuit_predict_and_launch_new` launches an
//! exit circuit while some predicted port has fewer than `MIN_CIRCUITS_HANDLING_STREAM` (2)
//! clean-or-not-yet-isolated circuits, open or building, whose exit allows it, and while fewer
//! than `MAX_UNUSED_OPEN_CIRCUITS` (14) clean circuits exist; a port is predicted for
//! `CircuitsAvailableTimeout` (30..60 min) after its last use, and a clean circuit is closed
//! when that time is over. Those circuits end at any exit `ExitNodes` allows, so a client
//! pinned with `ExitNodes` always has two prebuilt circuits at its exit. A `.exit` request
//! notes its port too but gets no circuit of its own ahead of time (it is built on demand).
//!
//! What chive copies: the prediction keyed by **(exit, port)**: a CONNECT pinned to an exit
//! predicts that exit for that port, so pinned requests get what `ExitNodes` gives Tor's;
//! `per_exit` (Tor's 2) clean circuits at the exit, open or building, that allow the port;
//! the total of clean circuits capped at [`MAX_CLEAN`] (Tor's 14) and launches bounded by the
//! manager's `max_building` (Tor's `MaxClientCircuitsPending`); [`PREDICTION_WINDOW`] (one
//! hour, the top of Tor's range) after the last use, and then the unused circuits are closed.
//! Added: the table is bounded ([`MAX_PREDICTIONS`], least recently used dropped), and a
//! prediction whose circuit failed to build backs off (1 s doubling to [`MAX_BACKOFF`]; Tor
//! has a global circuit-failure limit instead), so a dead exit is not hammered.

use std::time::{Duration, Instant};

use chive_crypto::IdentityKey;

/// Clean circuits kept per predicted exit and port by default (Tor's
/// `MIN_CIRCUITS_HANDLING_STREAM`).
pub const DEFAULT_PER_EXIT: usize = 2;
/// Most clean circuits per predicted exit (the client option's upper bound).
pub const MAX_PER_EXIT: usize = 8;
/// Most (exit, port) pairs predicted at once.
pub const MAX_PREDICTIONS: usize = 8;
/// No prediction launches while this many clean circuits exist (Tor's
/// `MAX_UNUSED_OPEN_CIRCUITS`).
pub const MAX_CLEAN: usize = 14;
/// A pinned exit stays predicted this long after its last request.
pub const PREDICTION_WINDOW: Duration = Duration::from_secs(3600);
const BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause after failed builds for one prediction.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One predicted exit and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The pinned exit.
    pub exit: IdentityKey,
    /// The port its requests asked for.
    pub port: u16,
    last_used: Instant,
    /// Builds that failed in a row.
    failures: u32,
    /// Backing off until then.
    not_before: Option<Instant>,
}

/// Which pinned exits to keep circuits at. See the module docs.
#[derive(Debug)]
pub struct ExitPredictor {
    per_exit: usize,
    entries: Vec<Prediction>,
}

impl ExitPredictor {
    /// A predictor keeping `per_exit` clean circuits per predicted exit and port (capped at
    /// [`MAX_PER_EXIT`]; 0 predicts nothing).
    pub fn new(per_exit: usize) -> Self {
        ExitPredictor {
            per_exit: per_exit.min(MAX_PER_EXIT),
            entries: Vec::new(),
        }
    }

    /// Clean circuits wanted per prediction.
    pub fn per_exit(&self) -> usize {
        self.per_exit
    }

    /// A CONNECT pinned to `exit` for `port` was made now.
    pub fn note_used(&mut self, exit: IdentityKey, port: u16, now: Instant) {
        if self.per_exit == 0 {
            return;
        }
        if let Some(p) = self
            .entries
            .iter_mut()
            .find(|p| p.exit == exit && p.port == port)
        {
            p.last_used = now;
            return;
        }
        if self.entries.len() >= MAX_PREDICTIONS {
            if let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map(|(i, _)| i)
            {
                self.entries.swap_remove(oldest);
            }
        }
        self.entries.push(Prediction {
            exit,
            port,
            last_used: now,
            failures: 0,
            not_before: None,
        });
    }

    /// Drop the predictions whose window is over.
    pub fn expire(&mut self, now: Instant) {
        self.entries
            .retain(|p| now.saturating_duration_since(p.last_used) < PREDICTION_WINDOW);
    }

    /// Whether `exit` is predicted for `port` now.
    pub fn is_predicted(&self, exit: &IdentityKey, port: u16, now: Instant) -> bool {
        self.entries.iter().any(|p| {
            p.exit == *exit
                && p.port == port
                && now.saturating_duration_since(p.last_used) < PREDICTION_WINDOW
        })
    }

    /// The predictions that may launch now (in the window, not backing off), most recently
    /// used first.
    pub fn active(&self, now: Instant) -> Vec<(IdentityKey, u16)> {
        let mut v: Vec<&Prediction> = self
            .entries
            .iter()
            .filter(|p| {
                now.saturating_duration_since(p.last_used) < PREDICTION_WINDOW
                    && p.not_before.is_none_or(|t| now >= t)
            })
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.last_used));
        v.into_iter().map(|p| (p.exit, p.port)).collect()
    }

    /// A circuit launched for (`exit`, `port`) was built: its back-off ends.
    pub fn on_built(&mut self, exit: &IdentityKey, port: u16) {
        if let Some(p) = self.find(exit, port) {
            p.failures = 0;
            p.not_before = None;
        }
    }

    /// A circuit launched for (`exit`, `port`) closed before it was built: back off (1 s, 2 s,
    /// 4 s ... at most [`MAX_BACKOFF`]). Returns the pause.
    pub fn on_failed(&mut self, exit: &IdentityKey, port: u16, now: Instant) -> Option<Duration> {
        let p = self.find(exit, port)?;
        let pause = BACKOFF
            .saturating_mul(1 << p.failures.min(6))
            .min(MAX_BACKOFF);
        p.failures = p.failures.saturating_add(1);
        p.not_before = Some(now + pause);
        Some(pause)
    }

    /// Predictions held (in or past their window until [`ExitPredictor::expire`]).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if nothing is predicted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&mut self, exit: &IdentityKey, port: u16) -> Option<&mut Prediction> {
        self.entries
            .iter_mut()
            .find(|p| p.exit == *exit && p.port == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> IdentityKey {
        chive_crypto::IdentityKeypair::from_secret_bytes(&[b; 32]).public()
    }

    #[test]
    fn a_pinned_request_predicts_its_exit_and_port_for_the_window() {
        let t0 = Instant::now();
        let mut p = ExitPredictor::new(2);
        assert!(p.active(t0).is_empty());
        p.note_used(id(1), 80, t0);
        assert_eq!(p.active(t0), vec![(id(1), 80)]);
        assert!(p.is_predicted(&id(1), 80, t0));
        assert!(
            !p.is_predicted(&id(1), 443, t0),
            "another port is not predicted"
        );
        assert!(
            !p.is_predicted(&id(2), 80, t0),
            "another exit is not predicted"
        );
        // A later use restarts the window.
        let later = t0 + PREDICTION_WINDOW - Duration::from_secs(1);
        p.note_used(id(1), 80, later);
        assert_eq!(p.len(), 1);
        assert!(p.is_predicted(&id(1), 80, t0 + PREDICTION_WINDOW + Duration::from_secs(60)));
        let over = later + PREDICTION_WINDOW;
        assert!(!p.is_predicted(&id(1), 80, over));
        assert!(p.active(over).is_empty());
        p.expire(over);
        assert!(p.is_empty());
    }

    #[test]
    fn the_table_is_bounded_and_drops_the_least_recently_used() {
        let t0 = Instant::now();
        let mut p = ExitPredictor::new(2);
        for i in 0..MAX_PREDICTIONS as u8 {
            p.note_used(id(i), 80, t0 + Duration::from_secs(u64::from(i)));
        }
        // Refresh the oldest: the second oldest goes when a new one comes.
        p.note_used(id(0), 80, t0 + Duration::from_secs(100));
        p.note_used(id(200), 80, t0 + Duration::from_secs(101));
        assert_eq!(p.len(), MAX_PREDICTIONS);
        let now = t0 + Duration::from_secs(102);
        assert!(p.is_predicted(&id(0), 80, now));
        assert!(!p.is_predicted(&id(1), 80, now));
        assert!(p.is_predicted(&id(200), 80, now));
        // Most recently used first.
        assert_eq!(p.active(now)[0], (id(200), 80));
    }

    #[test]
    fn failed_builds_back_off_doubling_until_one_is_built() {
        let t0 = Instant::now();
        let mut p = ExitPredictor::new(2);
        p.note_used(id(1), 80, t0);
        let mut now = t0;
        let mut pauses = Vec::new();
        for _ in 0..9 {
            let pause = p.on_failed(&id(1), 80, now).unwrap();
            assert!(p.active(now).is_empty(), "backing off");
            assert!(p.active(now + pause - Duration::from_millis(1)).is_empty());
            now += pause;
            assert_eq!(p.active(now).len(), 1, "back after {pause:?}");
            pauses.push(pause.as_secs());
        }
        assert_eq!(pauses, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        p.on_built(&id(1), 80);
        assert_eq!(
            p.on_failed(&id(1), 80, now),
            Some(BACKOFF),
            "a build resets it"
        );
        // Another prediction is not held back by this one's failures.
        p.note_used(id(2), 80, now);
        assert_eq!(p.active(now), vec![(id(2), 80)]);
        assert_eq!(p.on_failed(&id(3), 80, now), None, "not predicted");
    }

    #[test]
    fn zero_predicts_nothing() {
        let t0 = Instant::now();
        let mut p = ExitPredictor::new(0);
        p.note_used(id(1), 80, t0);
        assert!(p.is_empty() && p.active(t0).is_empty());
        assert_eq!(ExitPredictor::new(99).per_exit(), MAX_PER_EXIT);
    }
}
