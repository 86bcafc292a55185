//! The periodic DoS summary a relay logs (Tor's `dos_log_heartbeat`, part of its heartbeat
//! message): what the DoS defences and the OOM handler refused or killed since the last beat
//! and since start. Pure: the driver passes the clock and the counters in and logs the line.

use std::fmt;
use std::time::{Duration, Instant};

use super::DosStats;
use crate::CoreStats;

/// Counters that only grow, read from the core at each beat: the DoS defences' own
/// ([`DosStats`]; its `tracked_addresses` gauge is not part of the line, the beat reports it
/// apart) and the OOM handler's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// What the DoS defences refused and marked.
    pub dos: DosStats,
    /// Circuits the OOM handler killed.
    pub oom_circuits_killed: u64,
    /// Channels the OOM handler closed.
    pub oom_channels_closed: u64,
    /// Bytes the OOM handler freed.
    pub oom_bytes_freed: u64,
}

impl Totals {
    /// The core's counters now.
    pub fn read(dos: &DosStats, core: &CoreStats) -> Totals {
        Totals {
            dos: *dos,
            oom_circuits_killed: core.oom_circuits_killed,
            oom_channels_closed: core.oom_channels_closed,
            oom_bytes_freed: core.oom_bytes_freed,
        }
    }

    /// What grew from `earlier` to `self` (counters never shrink; saturating if one did).
    fn since(&self, earlier: &Totals) -> Totals {
        Totals {
            dos: self.dos.since(&earlier.dos),
            oom_circuits_killed: self
                .oom_circuits_killed
                .saturating_sub(earlier.oom_circuits_killed),
            oom_channels_closed: self
                .oom_channels_closed
                .saturating_sub(earlier.oom_channels_closed),
            oom_bytes_freed: self.oom_bytes_freed.saturating_sub(earlier.oom_bytes_freed),
        }
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dos = &self.dos;
        write!(
            f,
            "{} CREATE2 refused, {} addresses marked, {} connections refused ({} too many open, \
             {} too fast), {} streams refused, {} single-hop rendezvous refused, {} circuits \
             killed by the OOM handler ({} channels closed, {} bytes freed)",
            dos.circuits_refused,
            dos.addresses_marked,
            dos.connections_refused_concurrent + dos.connections_refused_rate,
            dos.connections_refused_concurrent,
            dos.connections_refused_rate,
            dos.streams_refused,
            dos.single_hop_refused,
            self.oom_circuits_killed,
            self.oom_channels_closed,
            self.oom_bytes_freed
        )
    }
}

/// One beat: the counts since the previous beat (over `period`) and since start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    /// Time since the previous beat (or since start, for the first).
    pub period: Duration,
    /// What happened in `period`.
    pub recent: Totals,
    /// Since start.
    pub total: Totals,
    /// Addresses the DoS defences track now.
    pub tracked_addresses: usize,
}

impl fmt::Display for Beat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DoS heartbeat: in the last {} s: {}; since start: {}; {} addresses tracked",
            self.period.as_secs(),
            self.recent,
            self.total,
            self.tracked_addresses
        )
    }
}

/// When to beat and what was counted at the last beat.
#[derive(Debug)]
pub struct Heartbeat {
    interval: Duration,
    last_at: Instant,
    last: Totals,
}

impl Heartbeat {
    /// A heartbeat every `interval` (Tor's `HeartbeatPeriod`), the first one `interval` after
    /// `now`.
    pub fn new(interval: Duration, now: Instant) -> Heartbeat {
        Heartbeat {
            interval,
            last_at: now,
            last: Totals::default(),
        }
    }

    /// Change the interval (SIGHUP); the next beat comes `interval` after the last one.
    pub fn set_interval(&mut self, interval: Duration) {
        self.interval = interval;
    }

    /// The beat due at `now`, if one is (at most one, however late the call).
    pub fn poll(&mut self, now: Instant, total: Totals, tracked_addresses: usize) -> Option<Beat> {
        let period = now.saturating_duration_since(self.last_at);
        if self.interval.is_zero() || period < self.interval {
            return None;
        }
        let recent = total.since(&self.last);
        self.last = total;
        self.last_at = now;
        Some(Beat {
            period,
            recent,
            total,
            tracked_addresses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(refused: u64, killed: u64) -> Totals {
        Totals {
            dos: DosStats {
                circuits_refused: refused,
                ..DosStats::default()
            },
            oom_circuits_killed: killed,
            ..Totals::default()
        }
    }

    #[test]
    fn beats_once_per_interval_with_counts_since_the_last() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut hb = Heartbeat::new(s(60), t0);
        assert_eq!(hb.poll(t0 + s(59), totals(5, 0), 1), None);
        let b = hb.poll(t0 + s(61), totals(7, 2), 3).expect("due");
        assert_eq!(
            (b.period, b.recent, b.total),
            (s(61), totals(7, 2), totals(7, 2))
        );
        assert_eq!(b.tracked_addresses, 3);
        // Not again until another interval has passed; then only what is new.
        assert_eq!(hb.poll(t0 + s(100), totals(9, 2), 3), None);
        let b = hb.poll(t0 + s(125), totals(10, 2), 0).expect("due");
        assert_eq!(
            (b.period, b.recent, b.total),
            (s(64), totals(3, 0), totals(10, 2))
        );
        // A late call beats once, not once per missed interval.
        let b = hb.poll(t0 + s(1000), totals(10, 2), 0).expect("due");
        assert_eq!(b.recent, Totals::default());
        assert_eq!(hb.poll(t0 + s(1001), totals(10, 2), 0), None);
    }

    #[test]
    fn zero_interval_is_off_and_the_line_names_every_count() {
        let t0 = Instant::now();
        let mut hb = Heartbeat::new(Duration::ZERO, t0);
        assert_eq!(
            hb.poll(t0 + Duration::from_secs(1_000_000), totals(1, 1), 0),
            None
        );
        hb.set_interval(Duration::from_secs(10));
        let line = hb
            .poll(
                t0 + Duration::from_secs(1_000_000),
                Totals {
                    dos: DosStats {
                        circuits_refused: 1,
                        addresses_marked: 2,
                        connections_refused_concurrent: 3,
                        connections_refused_rate: 4,
                        streams_refused: 9,
                        single_hop_refused: 11,
                        // A gauge: the beat reports its own argument, not this.
                        tracked_addresses: 99,
                    },
                    oom_circuits_killed: 5,
                    oom_channels_closed: 6,
                    oom_bytes_freed: 7,
                },
                8,
            )
            .expect("due")
            .to_string();
        for part in [
            "1 CREATE2 refused",
            "2 addresses marked",
            "7 connections refused (3 too many open, 4 too fast)",
            "9 streams refused",
            "11 single-hop rendezvous refused",
            "5 circuits killed by the OOM handler (6 channels closed, 7 bytes freed)",
            "8 addresses tracked",
        ] {
            assert!(line.contains(part), "{part:?} not in {line:?}");
        }
    }
}
