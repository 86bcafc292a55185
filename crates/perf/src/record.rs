//! What a run reports: one [`Record`] per transfer and [`ProgressRecord`]s while one
//! runs, as JSON lines; times from one [`Clock`] that never goes backwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Body sizes (bytes) whose arrival time every transfer record reports under
/// "partials": 10/20/50/100/200/500 KiB and 1/2/5 MiB, as OnionPerf does.
pub const PARTIAL_SIZES: [u64; 9] = [
    10_240, 20_480, 51_200, 102_400, 204_800, 512_000, 1_048_576, 2_097_152, 5_242_880,
];

/// What identifies a transfer in its records.
#[derive(Debug, Clone)]
pub(crate) struct Tag {
    pub(crate) class: Option<String>,
    pub(crate) loop_index: u32,
    pub(crate) seq: u64,
}

/// Wall-clock UNIX time that never goes backwards: the wall clock is read once,
/// then advanced by a monotonic clock, so recorded events stay ordered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base_us: u64,
    base: std::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let base_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Clock {
            base_us,
            base: std::time::Instant::now(),
        }
    }

    /// UNIX seconds with microsecond precision.
    pub(crate) fn now(&self) -> f64 {
        let us = self.base_us + self.base.elapsed().as_micros() as u64;
        us as f64 / 1e6
    }
}

/// The outcome of one transfer: one JSON line with "type": "transfer".
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Record {
    /// Always "transfer".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `--label`, or null.
    pub class: Option<String>,
    /// Index of the transfer loop (0..`--parallel`).
    #[serde(rename = "loop")]
    pub loop_index: u32,
    /// Sequence number of the transfer within its loop (0, 1, ...).
    pub seq: u64,
    /// The URL fetched.
    pub url: String,
    /// When the transfer began.
    pub start: f64,
    /// TCP connection to the SOCKS proxy established.
    pub socket_connected: Option<f64>,
    /// SOCKS handshake succeeded (the stream through the overlay is open).
    pub socks_connected: Option<f64>,
    /// The whole HTTP request (including any upload body) was written.
    pub request_sent: Option<f64>,
    /// The first response byte arrived.
    pub first_byte: Option<f64>,
    /// The last body byte arrived.
    pub last_byte: Option<f64>,
    /// Body bytes received (GET) or uploaded (POST).
    pub bytes: u64,
    /// Response Content-Length (GET) or upload size (POST).
    pub expected_bytes: Option<u64>,
    /// HTTP status code.
    pub status: Option<u16>,
    /// Why the transfer failed or stopped ("timeout", "cut at deadline",
    /// "interrupted", or the failure), if it did.
    pub error: Option<String>,
    /// SOCKS username used.
    pub socks_user: Option<String>,
    /// Size in [`PARTIAL_SIZES`] (a JSON string key) -> UNIX time when that many
    /// body bytes had arrived (GET) or been sent (POST), or null if never. Only
    /// sizes up to the transfer's size (Content-Length or upload size; the bytes
    /// received when the length is unknown).
    pub partials: BTreeMap<u64, Option<f64>>,
    /// Arrival times of the [`PARTIAL_SIZES`], filled as bytes arrive.
    #[serde(skip)]
    reached: [Option<f64>; PARTIAL_SIZES.len()],
}

impl Record {
    /// A record for a transfer starting at `start`; nothing reached yet.
    pub(crate) fn new(tag: &Tag, url: String, start: f64, socks_user: Option<String>) -> Self {
        Record {
            kind: "transfer",
            class: tag.class.clone(),
            loop_index: tag.loop_index,
            seq: tag.seq,
            url,
            start,
            socket_connected: None,
            socks_connected: None,
            request_sent: None,
            first_byte: None,
            last_byte: None,
            bytes: 0,
            expected_bytes: None,
            status: None,
            error: None,
            socks_user,
            partials: BTreeMap::new(),
            reached: [None; PARTIAL_SIZES.len()],
        }
    }

    /// Publish the partial times for sizes up to `size` (or up to the bytes
    /// counted, if the size is unknown).
    pub(crate) fn fill_partials(&mut self, size: Option<u64>) {
        let size = size.unwrap_or(self.bytes);
        self.partials = PARTIAL_SIZES
            .iter()
            .zip(self.reached)
            .filter(|(&n, _)| n <= size)
            .map(|(&n, t)| (n, t))
            .collect();
    }
}

/// A progress line: cumulative bytes of the running transfer at time `t`.
#[derive(Serialize, Debug)]
pub struct ProgressRecord<'a> {
    /// Always "progress".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `--label`, or null.
    pub class: Option<&'a str>,
    /// Index of the transfer loop.
    #[serde(rename = "loop")]
    pub loop_index: u32,
    /// UNIX time of the sample.
    pub t: f64,
    /// Body bytes of this transfer so far (received for GET, sent for POST).
    pub bytes: u64,
    /// `seq` of the transfer.
    pub transfer: u64,
}

/// Counts body bytes as they move: into the record (with partial times) and
/// into `live`, which the progress ticker reads while the transfer runs.
#[derive(Clone, Copy)]
pub(crate) struct Tally<'a> {
    pub(crate) clock: &'a Clock,
    pub(crate) live: &'a AtomicU64,
}

impl Tally<'_> {
    /// `total` body bytes have now arrived (or been sent).
    pub(crate) fn count(&self, rec: &mut Record, total: u64) {
        rec.bytes = total;
        self.live.store(total, Ordering::Relaxed);
        let mut now = None;
        for (slot, &n) in rec.reached.iter_mut().zip(PARTIAL_SIZES.iter()) {
            if slot.is_none() && total >= n {
                *slot = Some(*now.get_or_insert_with(|| self.clock.now()));
            }
        }
    }
}
