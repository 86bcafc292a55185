//! The stream-BEGIN timeout (Tor's `CircuitStreamTimeout`): a stream whose BEGIN (or RESOLVE)
//! got no answer in time is given up on its circuit and retried on another. Pure policy, time
//! passed in; [`crate::circmgr::CircuitManager`] applies it.
//!
//! Tor's rules (`connection_ap_expire_beginning`, `compute_retry_timeout`): a stream waits
//! 10 s for CONNECTED on its first two tries and 15 s on later ones, or `CircuitStreamTimeout`
//! seconds on every try if that is set; when the time is up Tor sends END (TIMEOUT), marks the
//! circuit as taking no new streams, and attaches the stream to another circuit. Tor retries
//! until `SocksTimeout` (120 s); chive retries up to the circuit manager's `max_attempts` tries
//! in all, then fails the SOCKS request with a clean error.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chive_core::{CircKey, StreamHandle};

use crate::circmgr::{StreamRequest, Ticket};

/// How long try number `attempt` (0 = the first) waits for its answer: `fixed` on every try
/// if set (`CircuitStreamTimeout`), else Tor's schedule: 10 s for tries 0 and 1, 15 s after.
pub fn stream_timeout(fixed: Option<Duration>, attempt: u32) -> Duration {
    match fixed {
        Some(d) => d,
        None if attempt < 2 => Duration::from_secs(10),
        None => Duration::from_secs(15),
    }
}

/// A stream whose BEGIN is out.
#[derive(Clone, Debug)]
pub struct Waiting {
    /// The request it came from (its SOCKS reply waits under this ticket).
    pub ticket: Ticket,
    /// What it asked for, to ask again.
    pub req: StreamRequest,
    /// The circuit it was started on.
    pub circ: CircKey,
    /// Tries before this one.
    pub attempts: u32,
    /// When its BEGIN was sent.
    pub since: Instant,
}

/// Streams waiting for CONNECTED (or RESOLVED), with their deadlines.
#[derive(Debug, Default)]
pub struct BeginTimeouts {
    fixed: Option<Duration>,
    waiting: HashMap<StreamHandle, Waiting>,
}

impl BeginTimeouts {
    /// `fixed`: `CircuitStreamTimeout` (None: Tor's 10/10/15 s schedule).
    pub fn new(fixed: Option<Duration>) -> Self {
        BeginTimeouts {
            fixed,
            waiting: HashMap::new(),
        }
    }

    /// Stream `handle` sent its BEGIN at `w.since`.
    pub fn started(&mut self, handle: StreamHandle, w: Waiting) {
        self.waiting.insert(handle, w);
    }

    /// `handle` got its answer (CONNECTED, RESOLVED, END) or went away: stop timing it.
    pub fn answered(&mut self, handle: StreamHandle) {
        self.waiting.remove(&handle);
    }

    /// Circuit `circ` closed: its streams end with it (their SOCKS requests fail as before).
    pub fn circuit_closed(&mut self, circ: CircKey) {
        self.waiting.retain(|_, w| w.circ != circ);
    }

    /// Streams whose time is up at `now`, oldest first; they are no longer timed.
    pub fn expired(&mut self, now: Instant) -> Vec<(StreamHandle, Waiting)> {
        let fixed = self.fixed;
        let mut out: Vec<(StreamHandle, Waiting)> = Vec::new();
        self.waiting.retain(|h, w| {
            let due = now.saturating_duration_since(w.since) >= stream_timeout(fixed, w.attempts);
            if due {
                out.push((*h, w.clone()));
            }
            !due
        });
        out.sort_by_key(|(h, w)| (w.since, *h));
        out
    }

    /// The earliest deadline, if any stream waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting
            .values()
            .map(|w| w.since + stream_timeout(self.fixed, w.attempts))
            .min()
    }

    /// Streams being timed.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether no stream is being timed.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::circmgr::RequestKind;

    fn req() -> StreamRequest {
        StreamRequest {
            host: "127.0.0.1".into(),
            port: 80,
            isolation: vec![],
            kind: RequestKind::Connect,
        }
    }

    fn waiting(circ: u64, attempts: u32, since: Instant) -> Waiting {
        Waiting {
            ticket: Ticket(attempts.into()),
            req: req(),
            circ: CircKey(circ),
            attempts,
            since,
        }
    }

    #[test]
    fn tors_schedule_is_ten_ten_fifteen_unless_fixed() {
        let s = |a| stream_timeout(None, a).as_secs();
        assert_eq!([s(0), s(1), s(2), s(3)], [10, 10, 15, 15]);
        let d = Duration::from_secs(4);
        assert_eq!(stream_timeout(Some(d), 0), d);
        assert_eq!(stream_timeout(Some(d), 5), d);
    }

    #[test]
    fn streams_expire_at_their_try_deadline_on_a_virtual_clock() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = BeginTimeouts::new(None);
        b.started(StreamHandle(1), waiting(1, 0, t0));
        b.started(StreamHandle(2), waiting(1, 2, t0));
        b.started(StreamHandle(3), waiting(2, 0, at(500)));
        assert_eq!(b.next_deadline(), Some(at(10_000)));
        assert!(b.expired(at(9_999)).is_empty());
        let first: Vec<_> = b.expired(at(10_000)).into_iter().map(|e| e.0).collect();
        assert_eq!(first, [StreamHandle(1)]);
        // Stream 3 answered in time; stream 2 (third try) waits 15 s.
        b.answered(StreamHandle(3));
        assert_eq!(b.next_deadline(), Some(at(15_000)));
        assert!(b.expired(at(14_999)).is_empty());
        let second: Vec<_> = b.expired(at(15_000)).into_iter().map(|e| e.0).collect();
        assert_eq!(second, [StreamHandle(2)]);
        assert!(b.is_empty());
        assert_eq!(b.next_deadline(), None);
    }

    #[test]
    fn a_closed_circuit_takes_its_streams_out_of_the_timer() {
        let t0 = Instant::now();
        let mut b = BeginTimeouts::new(Some(Duration::from_secs(1)));
        b.started(StreamHandle(1), waiting(7, 0, t0));
        b.started(StreamHandle(2), waiting(8, 0, t0));
        b.circuit_closed(CircKey(7));
        let left: Vec<_> = b
            .expired(t0 + Duration::from_secs(1))
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(left, [StreamHandle(2)]);
    }
}
