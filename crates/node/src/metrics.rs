//! Relay instrumentation: JSON lines to a file and a Prometheus text endpoint.
//!
//! What is recorded (the papers used per-cell timing and a "node monitor"):
//! - `{"type":"cell", ...}`: one sampled cell's life: entered its circuit queue,
//!   moved to the connection's output, written to the socket (UNIX seconds);
//! - `{"type":"relay", ...}` once per second: cells in/out, bytes forwarded per
//!   second, circuits, queued cells, scheduler, outbuf-full events, client cells held at this
//!   entry now and in all (`held_cells`, `cells_held_total`: `PerClientQueueCells`);
//! - `{"type":"chan", ...}` once per second per busy channel: output-buffer occupancy;
//! - `{"type":"circ", ...}` once per second per circuit that sent cells: cells
//!   sent, queue length, scheduler priority (EWMA count) when the policy has one; at an
//!   edge its congestion window, cells in flight, smallest and smoothed round trip
//!   (`min_rtt_ms`, `rtt_ms`: null under a fixed window) and slow start;
//! - `{"type":"oom", ...}` in a second when the OOM handler ran (`MaxMemInQueues`): circuits
//!   killed, channels closed, bytes freed in that second, memory in use and the limit;
//! - `{"type":"dos", ...}` in a second when the DoS defences refused something: CREATE2 cells
//!   refused, addresses marked, connections refused, streams refused, single-hop rendezvous
//!   refused in that second, addresses tracked ([`dos_record`]).
//!
//! Sampling (`CellSampleRate`, one cell in N) keeps the cost small; the
//! per-second records cost O(circuits) once a second.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chive_core::dos::DosStats;
use chive_core::{CellSample, Core, CoreStats};
use tracing::{info, warn};

/// Converts the core's `Instant`s to UNIX seconds.
#[derive(Clone, Copy)]
pub struct Clock {
    base_instant: Instant,
    base_unix: f64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock anchored at the current instant and wall-clock time.
    pub fn new() -> Self {
        let base_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Clock {
            base_instant: Instant::now(),
            base_unix,
        }
    }

    /// `t` in UNIX seconds.
    pub fn unix(&self, t: Instant) -> f64 {
        if t >= self.base_instant {
            self.base_unix + (t - self.base_instant).as_secs_f64()
        } else {
            self.base_unix - (self.base_instant - t).as_secs_f64()
        }
    }
}

/// The latest figures, shared with the Prometheus endpoint.
#[derive(Default, Clone)]
pub struct Snapshot {
    pub cells_received: u64,
    pub cells_transmitted: u64,
    pub circuits: usize,
    pub streams: usize,
    pub queued_cells: usize,
    pub circuits_killed: u64,
    pub outbuf_full_events: u64,
    pub quiet_cells: u64,
    pub quiet_reserve: u64,
    pub bytes_forwarded_per_sec: f64,
    pub scheduler: String,
    pub outbuf_cells: usize,
    /// Smoothed reaction latency of paced writers (seconds).
    pub reaction_latency: f64,
    /// Recent sampled queue delays (seconds), for quantiles.
    pub queue_delays: VecDeque<f64>,
    pub samples_total: u64,
    /// Bytes counted against `MaxMemInQueues` now, and the limit.
    pub mem_in_queues: usize,
    pub max_mem_in_queues: usize,
    pub oom_circuits_killed: u64,
    pub oom_channels_closed: u64,
    pub oom_bytes_freed: u64,
    /// `PerClientQueueCells`: client cells held at this entry (now and in all).
    pub hold: chive_core::HoldStats,
    pub dos: DosStats,
    /// Circuit switching's counters and the sum of switch times (seconds).
    pub switching: chive_core::SwitchStats,
    pub switch_time_sum: f64,
    /// Onion-service counters (`crate::onion_metrics`).
    pub onion: crate::onion_metrics::OnionCounters,
    /// Congestion-control agreement counters (relay and client side).
    pub cc_agreement: chive_core::CcAgreementStats,
}

const RECENT_DELAYS: usize = 2048;

/// Everything the driver needs to record.
pub struct Metrics {
    clock: Clock,
    file: Option<std::io::BufWriter<std::fs::File>>,
    shared: Arc<Mutex<Snapshot>>,
    /// Where the endpoint listens (the kernel's port where `MetricsPort` said 0).
    listening: Option<SocketAddr>,
    last_tick: Instant,
    last_transmitted: u64,
    last_received: u64,
    pub outbuf_full_events: u64,
    /// Cells handed to writers as quiet batches (allowed to spend `QuietReserve`).
    pub quiet_cells: u64,
    /// The write bucket's reserve in force (bytes), set by the driver.
    pub quiet_reserve: u64,
    /// The send path's smoothed reaction latency (paced writers only), set by the driver.
    pub reaction_latency: Duration,
    last_circ_sent: std::collections::HashMap<chive_core::CircKey, u64>,
    /// The core's counters and the DoS counters at the last tick (for the per-second deltas).
    last_stats: CoreStats,
    last_dos: DosStats,
    /// The onion counters last written as an `onion` record.
    last_onion: crate::onion_metrics::OnionCounters,
}

impl Metrics {
    /// Open the JSON-lines file (if any) and start the endpoint (if any).
    pub async fn start(
        file: Option<&Path>,
        port: Option<SocketAddr>,
    ) -> anyhow::Result<Option<Metrics>> {
        if file.is_none() && port.is_none() {
            return Ok(None);
        }
        let file = match file {
            Some(p) => {
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).ok();
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| anyhow::anyhow!("MetricsFile {}: {e}", p.display()))?;
                Some(std::io::BufWriter::with_capacity(256 * 1024, f))
            }
            None => None,
        };
        let shared = Arc::new(Mutex::new(Snapshot::default()));
        let mut listening = None;
        if let Some(addr) = port {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("MetricsPort {addr}: cannot listen: {e}"))?;
            let local = listener.local_addr()?;
            info!(addr = %local, "metrics endpoint listening");
            listening = Some(local);
            tokio::spawn(serve(listener, shared.clone()));
        }
        Ok(Some(Metrics {
            clock: Clock::new(),
            file,
            shared,
            listening,
            last_tick: Instant::now(),
            last_transmitted: 0,
            last_received: 0,
            outbuf_full_events: 0,
            quiet_cells: 0,
            quiet_reserve: 0,
            reaction_latency: Duration::ZERO,
            last_circ_sent: Default::default(),
            last_stats: CoreStats::default(),
            last_dos: DosStats::default(),
            last_onion: Default::default(),
        }))
    }

    /// The endpoint's bound address (`MetricsPort`), if it has one.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listening
    }

    /// The `PortsFile` entry of a node's metrics endpoint, if it listens: a node lists it after
    /// its own listener.
    pub fn ports_entry(metrics: Option<&Metrics>) -> Option<(&'static str, SocketAddr)> {
        metrics
            .and_then(Metrics::local_addr)
            .map(|a| ("MetricsPort", a))
    }

    /// Cells of one write batch were written to the socket at `written`.
    pub fn cells_written(&mut self, samples: Vec<CellSample>, written: Instant) {
        if samples.is_empty() {
            return;
        }
        let mut delays = Vec::with_capacity(samples.len());
        for s in &samples {
            delays.push((s.dequeued - s.queued).as_secs_f64());
            if let Some(f) = self.file.as_mut() {
                let _ = writeln!(
                    f,
                    "{{\"type\":\"cell\",\"chan\":{},\"circ\":{},\"queued\":{:.6},\"dequeued\":{:.6},\"written\":{:.6}}}",
                    s.chan.0,
                    s.circ.0,
                    self.clock.unix(s.queued),
                    self.clock.unix(s.dequeued),
                    self.clock.unix(written)
                );
            }
        }
        if let Ok(mut snap) = self.shared.lock() {
            snap.samples_total += delays.len() as u64;
            for d in delays {
                if snap.queue_delays.len() >= RECENT_DELAYS {
                    snap.queue_delays.pop_front();
                }
                snap.queue_delays.push_back(d);
            }
        }
    }

    /// A switch this relay started ended: one `switch` record (docs/metrics.md).
    pub fn switch_record(&mut self, r: &chive_core::SwitchRecord) {
        let secs = r.ended.duration_since(r.triggered).as_secs_f64();
        // The paper's switch time: last cell on the old connection or leg to the first on the new.
        let gap = r.last_old.map_or_else(
            || "null".to_string(),
            |l| format!("{:.6}", r.ended.duration_since(l).as_secs_f64()),
        );
        let opt_secs = |d: Option<std::time::Duration>| {
            d.map_or_else(|| "null".to_string(), |d| format!("{:.6}", d.as_secs_f64()))
        };
        let (wait, timeout) = (opt_secs(r.confirm_wait), opt_secs(r.confirm_timeout));
        let held = r
            .held_by
            .map_or_else(|| "null".to_string(), |h| format!("\"{}\"", h.label()));
        if let Some(f) = self.file.as_mut() {
            let _ = writeln!(
                f,
                "{{\"type\":\"switch\",\"t\":{:.6},\"mode\":\"{}\",\"circ\":{},\"from\":{},\"to\":{},\"outcome\":\"{}\",\"triggered\":{:.6},\"switch_time_s\":{secs:.6},\"gap_s\":{gap},\"confirm_wait_s\":{wait},\"confirm_timeout_s\":{timeout},\"held_by\":{held}}}",
                self.clock.unix(r.ended),
                r.mode.label(),
                r.circ.0,
                r.from.0,
                r.to.map_or_else(|| "null".to_string(), |c| c.0.to_string()),
                r.outcome.label(),
                self.clock.unix(r.triggered),
            );
        }
        if r.outcome == chive_core::SwitchOutcome::Switched {
            if let Ok(mut snap) = self.shared.lock() {
                snap.switch_time_sum += secs;
            }
        }
    }

    /// The onion counters now (once a second): an `onion` record if one changed, and the
    /// endpoint's figures.
    pub fn onion(&mut self, c: crate::onion_metrics::OnionCounters, now: Instant) {
        if c != self.last_onion {
            self.last_onion = c;
            if let Some(f) = self.file.as_mut() {
                let _ = writeln!(
                    f,
                    "{}",
                    crate::onion_metrics::json_record(&c, self.clock.unix(now))
                );
            }
        }
        if let Ok(mut snap) = self.shared.lock() {
            snap.onion = c;
        }
    }

    /// A connection to an onion service joined: one `onion_join` record.
    pub fn onion_join(&mut self, j: &chive_client::onion::JoinTiming) {
        if let Some(f) = self.file.as_mut() {
            let _ = writeln!(
                f,
                "{}",
                crate::onion_metrics::join_record(j, self.clock.unix(j.at))
            );
        }
    }

    /// The core's switching counters, for the endpoint and the `relay` record.
    pub fn switch_stats(&mut self, stats: chive_core::SwitchStats) {
        if let Ok(mut snap) = self.shared.lock() {
            snap.switching = stats;
        }
    }

    /// Once a second: relay, channel and circuit records; refresh the snapshot.
    pub fn tick(
        &mut self,
        core: &Core,
        outbufs: &[(u64, usize)],
        outbuf_cells: usize,
        now: Instant,
    ) {
        let elapsed = now.duration_since(self.last_tick);
        if elapsed < Duration::from_secs(1) {
            return;
        }
        self.last_tick = now;
        let stats = core.stats();
        let secs = elapsed.as_secs_f64();
        let out_rate = (stats.cells_transmitted - self.last_transmitted) as f64
            * chive_cell::CELL_LEN as f64
            / secs;
        let in_cells = stats.cells_received - self.last_received;
        let out_cells = stats.cells_transmitted - self.last_transmitted;
        self.last_transmitted = stats.cells_transmitted;
        self.last_received = stats.cells_received;
        let t = self.clock.unix(now);
        let scheduler = format!("{:?}", core.scheduler());
        if let Some(f) = self.file.as_mut() {
            let _ = writeln!(
                f,
                "{{\"type\":\"relay\",\"t\":{t:.6},\"cells_in\":{in_cells},\"cells_out\":{out_cells},\"bytes_out_per_s\":{out_rate:.1},\"circuits\":{},\"streams\":{},\"queued_cells\":{},\"outbuf_full_events\":{},\"quiet_cells\":{},\"circuits_killed\":{},\"scheduler\":{:?},\"outbuf_cells\":{outbuf_cells},\"reaction_ms\":{:.3},\"stream_xoff_sent\":{},\"stream_xon_sent\":{},\"mem_in_queues\":{},\"held_cells\":{},\"cells_held_total\":{},\"cc_agreement\":{}}}",
                stats.circuits, stats.streams, stats.queued_cells, self.outbuf_full_events, self.quiet_cells, stats.circuits_killed, scheduler, self.reaction_latency.as_secs_f64() * 1e3, stats.stream_xoff_sent, stats.stream_xon_sent, stats.mem_in_queues, core.hold_stats().held_now, core.hold_stats().held_total, cc_agreement_json(&core.cc_agreement_stats())
            );
            for (chan, occupancy) in outbufs.iter().filter(|(_, o)| *o > 0) {
                let _ = writeln!(
                    f,
                    "{{\"type\":\"chan\",\"t\":{t:.6},\"chan\":{chan},\"outbuf\":{occupancy}}}"
                );
            }
            let mut seen = std::collections::HashMap::new();
            for c in core.circuit_stats(now) {
                let before = self.last_circ_sent.get(&c.circ).copied().unwrap_or(0);
                if c.cells_sent > before {
                    let prio = c
                        .priority
                        .map(|p| format!("{p:.6}"))
                        .unwrap_or_else(|| "null".into());
                    // At an edge: its congestion window, cells in flight under it, smallest
                    // round trip (Vegas) and slow start, to see congestion control at work.
                    let edge = match c.window {
                        Some((cwnd, inflight)) => format!(
                            ",\"cwnd\":{cwnd},\"inflight\":{inflight},\"min_rtt_ms\":{},\"rtt_ms\":{},\"slow_start\":{}",
                            ms(c.min_rtt),
                            ms(c.smoothed_rtt),
                            c.slow_start.unwrap_or(false)
                        ),
                        None => String::new(),
                    };
                    let _ = writeln!(
                        f,
                        "{{\"type\":\"circ\",\"t\":{t:.6},\"circ\":{},\"cells_sent\":{},\"sent_since\":{},\"queued\":{},\"priority\":{prio}{edge}}}",
                        c.circ.0,
                        c.cells_sent,
                        c.cells_sent - before,
                        c.queued
                    );
                }
                seen.insert(c.circ, c.cells_sent);
            }
            self.last_circ_sent = seen;
            let last = &self.last_stats;
            if stats.oom_circuits_killed > last.oom_circuits_killed
                || stats.oom_channels_closed > last.oom_channels_closed
            {
                let _ = writeln!(
                    f,
                    "{{\"type\":\"oom\",\"t\":{t:.6},\"circuits_killed\":{},\"channels_closed\":{},\"bytes_freed\":{},\"mem_in_queues\":{},\"limit\":{}}}",
                    stats.oom_circuits_killed - last.oom_circuits_killed,
                    stats.oom_channels_closed - last.oom_channels_closed,
                    stats.oom_bytes_freed - last.oom_bytes_freed,
                    stats.mem_in_queues,
                    core.max_mem_in_queues(),
                );
            }
            if let Some(line) = dos_record(t, &core.dos_stats(), &self.last_dos) {
                let _ = writeln!(f, "{line}");
            }
            if let Err(e) = f.flush() {
                warn!(error = %e, "cannot write metrics file");
            }
        }
        self.last_stats = stats;
        self.last_dos = core.dos_stats();
        if let Ok(mut snap) = self.shared.lock() {
            snap.mem_in_queues = stats.mem_in_queues;
            snap.max_mem_in_queues = core.max_mem_in_queues();
            snap.oom_circuits_killed = stats.oom_circuits_killed;
            snap.oom_channels_closed = stats.oom_channels_closed;
            snap.oom_bytes_freed = stats.oom_bytes_freed;
            snap.hold = core.hold_stats();
            snap.cc_agreement = core.cc_agreement_stats();
            snap.dos = self.last_dos;
            snap.cells_received = stats.cells_received;
            snap.cells_transmitted = stats.cells_transmitted;
            snap.circuits = stats.circuits;
            snap.streams = stats.streams;
            snap.queued_cells = stats.queued_cells;
            snap.circuits_killed = stats.circuits_killed;
            snap.outbuf_full_events = self.outbuf_full_events;
            snap.quiet_cells = self.quiet_cells;
            snap.quiet_reserve = self.quiet_reserve;
            snap.bytes_forwarded_per_sec = out_rate;
            snap.scheduler = scheduler;
            snap.outbuf_cells = outbuf_cells;
            snap.reaction_latency = self.reaction_latency.as_secs_f64();
        }
    }
}

/// The `{"type":"dos"}` record of the second at `t` (unix seconds) if the DoS defences
/// refused anything since `last` (the counters at the previous record): each count is that
/// second's, `tracked_addresses` the number now.
pub fn dos_record(t: f64, dos: &DosStats, last: &DosStats) -> Option<String> {
    let d = dos.since(last);
    let refused = d.connections_refused_concurrent + d.connections_refused_rate;
    let any = d.circuits_refused
        + d.addresses_marked
        + refused
        + d.streams_refused
        + d.single_hop_refused
        > 0;
    any.then(|| {
        format!(
            "{{\"type\":\"dos\",\"t\":{t:.6},\"circuits_refused\":{},\"addresses_marked\":{},\"connections_refused\":{},\"streams_refused\":{},\"single_hop_refused\":{},\"tracked_addresses\":{}}}",
            d.circuits_refused,
            d.addresses_marked,
            refused,
            d.streams_refused,
            d.single_hop_refused,
            d.tracked_addresses,
        )
    })
}

/// The `relay` record's `cc_agreement` object: the congestion-control agreement counters.
pub fn cc_agreement_json(c: &chive_core::CcAgreementStats) -> String {
    format!(
        "{{\"relay\":{{\"agreed\":{},\"declined\":{},\"refused\":{}}},\"client\":{{\"agreed\":{},\"declined\":{},\"refused\":{}}}}}",
        c.relay_agreed, c.relay_declined, c.relay_refused, c.client_agreed, c.client_declined, c.client_refused
    )
}

/// Milliseconds with three decimals, or `null`.
fn ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.3}", d.as_secs_f64() * 1e3))
        .unwrap_or_else(|| "null".into())
}

/// Prometheus text exposition of a snapshot.
pub fn render(snap: &Snapshot) -> String {
    let mut s = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            s,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "chive_cells_received_total",
        "counter",
        "Cells received on all channels.",
        snap.cells_received.to_string(),
    );
    metric(
        "chive_cells_transmitted_total",
        "counter",
        "Cells moved to connection output buffers.",
        snap.cells_transmitted.to_string(),
    );
    metric(
        "chive_circuits",
        "gauge",
        "Circuits open.",
        snap.circuits.to_string(),
    );
    metric(
        "chive_streams",
        "gauge",
        "Edge streams open.",
        snap.streams.to_string(),
    );
    metric(
        "chive_queued_cells",
        "gauge",
        "Cells waiting in circuit queues.",
        snap.queued_cells.to_string(),
    );
    metric(
        "chive_circuits_killed_total",
        "counter",
        "Circuits closed for protocol violations or limits.",
        snap.circuits_killed.to_string(),
    );
    metric(
        "chive_outbuf_full_events_total",
        "counter",
        "Times a connection's output buffer was full with cells waiting.",
        snap.outbuf_full_events.to_string(),
    );
    metric(
        "chive_quiet_cells_total",
        "counter",
        "Cells of quiet circuits handed to writers with access to QuietReserve.",
        snap.quiet_cells.to_string(),
    );
    metric(
        "chive_bytes_forwarded_per_second",
        "gauge",
        "Bytes (whole cells) moved to output in the last second.",
        format!("{:.1}", snap.bytes_forwarded_per_sec),
    );
    metric(
        "chive_quiet_reserve_bytes",
        "gauge",
        "Write-bucket bytes only quiet circuits may spend (QuietReserve; 0 = off).",
        snap.quiet_reserve.to_string(),
    );
    metric(
        "chive_outbuf_cells",
        "gauge",
        "Output buffer bound in force in cells (OutbufCells, grown for late wake-ups under a rate).",
        snap.outbuf_cells.to_string(),
    );
    metric(
        "chive_send_reaction_latency_seconds",
        "gauge",
        "Smoothed time from a paced writer paying a batch to its next batch reaching it.",
        format!("{:.6}", snap.reaction_latency),
    );
    metric(
        "chive_mem_in_queues_bytes",
        "gauge",
        "Bytes counted against MaxMemInQueues: queued cells and the driver's output buffers.",
        snap.mem_in_queues.to_string(),
    );
    metric(
        "chive_max_mem_in_queues_bytes",
        "gauge",
        "MaxMemInQueues in force.",
        snap.max_mem_in_queues.to_string(),
    );
    metric(
        "chive_oom_circuits_killed_total",
        "counter",
        "Circuits killed by the OOM handler (their oldest queued cell was the oldest).",
        snap.oom_circuits_killed.to_string(),
    );
    metric(
        "chive_oom_channels_closed_total",
        "counter",
        "Channels closed by the OOM handler (their buffered data was the oldest).",
        snap.oom_channels_closed.to_string(),
    );
    metric(
        "chive_oom_bytes_freed_total",
        "counter",
        "Bytes freed by the OOM handler.",
        snap.oom_bytes_freed.to_string(),
    );
    metric(
        "chive_client_held_cells",
        "gauge",
        "Client cells held at this entry now (PerClientQueueCells).",
        snap.hold.held_now.to_string(),
    );
    metric(
        "chive_client_cells_held_total",
        "counter",
        "Client cells held at this entry since start (PerClientQueueCells).",
        snap.hold.held_total.to_string(),
    );
    metric(
        "chive_client_read_pauses_total",
        "counter",
        "Times a client channel was no longer read because its held cells reached their bound.",
        snap.hold.read_pauses.to_string(),
    );
    metric(
        "chive_dos_circuits_refused_total",
        "counter",
        "CREATE2 cells refused with DESTROY (RESOURCELIMIT) by DoSCircuitCreation.",
        snap.dos.circuits_refused.to_string(),
    );
    metric(
        "chive_dos_streams_refused_total",
        "counter",
        "BEGIN/RESOLVE cells past their circuit's DoSStreamCreation bucket (refused, circuit closed, or counted only with defense type 1).",
        snap.dos.streams_refused.to_string(),
    );
    metric(
        "chive_dos_single_hop_refused_total",
        "counter",
        "ESTABLISH_RENDEZVOUS from single-hop clients dropped (DoSRefuseSingleHopClientRendezvous).",
        snap.dos.single_hop_refused.to_string(),
    );
    metric(
        "chive_dos_addresses_marked_total",
        "counter",
        "Times an address was marked by the circuit-creation defence.",
        snap.dos.addresses_marked.to_string(),
    );
    metric(
        "chive_dos_tracked_addresses",
        "gauge",
        "Client addresses the DoS defences hold state for.",
        snap.dos.tracked_addresses.to_string(),
    );
    metric(
        "chive_cell_samples_total",
        "counter",
        "Sampled cells timed.",
        snap.samples_total.to_string(),
    );
    let cc = &snap.cc_agreement;
    for (name, help, v) in [
        (
            "chive_cc_relay_agreed_total",
            "Relay: CREATE2 congestion-control requests answered with CC_RESPONSE.",
            cc.relay_agreed,
        ),
        (
            "chive_cc_relay_declined_total",
            "Relay: CREATE2 congestion-control requests declined (consensus cc_alg=0).",
            cc.relay_declined,
        ),
        (
            "chive_cc_relay_refused_total",
            "Relay: CREATE2 refused for a malformed extension list.",
            cc.relay_refused,
        ),
        (
            "chive_cc_client_agreed_total",
            "Client: last hops that agreed to the congestion control asked for.",
            cc.client_agreed,
        ),
        (
            "chive_cc_client_declined_total",
            "Client: last hops that declined the congestion control asked for.",
            cc.client_declined,
        ),
        (
            "chive_cc_client_refused_total",
            "Client: CREATED2 answers refused as hostile (circuit closed).",
            cc.client_refused,
        ),
    ] {
        metric(name, "counter", help, v.to_string());
    }
    let sw = &snap.switching;
    for (name, help, v) in [
        (
            "chive_switches_total",
            "Circuits this entry moved to another connection (first cell sent there).",
            sw.switches,
        ),
        (
            "chive_switch_triggers_total",
            "Congestion reports that chose a circuit to move.",
            sw.triggered,
        ),
        (
            "chive_switch_refused_total",
            "Switches the next hop refused.",
            sw.refused,
        ),
        (
            "chive_switch_timeouts_total",
            "Switches abandoned without SWITCH_ACK in time.",
            sw.timed_out,
        ),
        (
            "chive_switch_failed_total",
            "Switches abandoned because the switch connection failed.",
            sw.failed,
        ),
        (
            "chive_switch_accepted_total",
            "Circuits moved onto a new connection at this relay as next hop.",
            sw.accepted,
        ),
        (
            "chive_switch_violations_total",
            "Switch requests or markers refused as protocol violations.",
            sw.violations,
        ),
        (
            "chive_switch_cells_resent_total",
            "Cells sent twice by switching.",
            sw.cells_resent,
        ),
        (
            "chive_switch_cells_lost_total",
            "Cells lost by switching (held cells dropped, or missing by a marker's count).",
            sw.cells_lost,
        ),
        (
            "chive_switch_congested_sent_total",
            "Path variant, entry: CONGESTED messages sent to clients.",
            sw.congested_sent,
        ),
        (
            "chive_switch_congested_received_total",
            "Path variant, client: CONGESTED messages received (acted on or not).",
            sw.congested_received,
        ),
        (
            "chive_switch_congested_ignored_total",
            "Path variant, client: CONGESTED not acted on (the other leg congested lately, or heavier).",
            sw.congested_ignored,
        ),
        (
            "chive_switch_stripe_moves_total",
            "Path variant, client, SwitchLegUse stripe: moves of the upload to another leg by the leg scheduler.",
            sw.stripe_moves,
        ),
        (
            "chive_switch_leg_probes_total",
            "Path variant, client: LEG_PROBEs sent on the other leg before acting on CONGESTED.",
            sw.leg_probes,
        ),
        (
            "chive_switch_leg_probes_late_total",
            "Path variant, client: probes not answered within 1.1 x the current leg's round trip (stayed).",
            sw.leg_probes_late,
        ),
        (
            "chive_switch_leg_probes_answered_total",
            "Path variant, exit: LEG_PROBEs answered.",
            sw.leg_probes_answered,
        ),
        (
            "chive_switch_path_out_of_order_total",
            "Path variant, exit: cells that arrived ahead of their turn and were buffered.",
            sw.path_out_of_order,
        ),
        (
            "chive_switch_path_duplicates_total",
            "Path variant, exit: second copies dropped (after a fallback's resend).",
            sw.path_duplicates,
        ),
        (
            "chive_switch_path_sendmes_withheld_total",
            "Path variant, exit: circuit SENDMEs withheld on a leg ahead while the out-of-order buffer was high.",
            sw.path_sendmes_withheld,
        ),
        (
            "chive_switch_cells_held_total",
            "Cells that overtook their SWITCH marker on the new connection and were held back.",
            sw.cells_held,
        ),
        (
            "chive_switch_idle_closed_total",
            "Connection variant, entry: switch connections closed after a minute without a circuit.",
            sw.idle_closed,
        ),
    ] {
        metric(name, "counter", help, v.to_string());
    }
    metric(
        "chive_switch_path_out_of_order_peak",
        "gauge",
        "Path variant, exit: the most cells one linked set's out-of-order buffer held at once (SENDMEs withheld from 1000; limit 5256 for two legs).",
        sw.path_out_of_order_peak.to_string(),
    );
    metric(
        "chive_switch_time_seconds_sum",
        "counter",
        "Sum over switches of the time from the congestion report to the first cell on the new connection.",
        format!("{:.6}", snap.switch_time_sum),
    );
    metric(
        "chive_switch_time_seconds_count",
        "counter",
        "Switches timed (as chive_switches_total).",
        sw.switches.to_string(),
    );
    let _ = writeln!(
        s,
        "# HELP chive_dos_connections_refused_total Connections refused by DoSConnection.\n\
         # TYPE chive_dos_connections_refused_total counter\n\
         chive_dos_connections_refused_total{{reason=\"concurrent\"}} {}\n\
         chive_dos_connections_refused_total{{reason=\"rate\"}} {}",
        snap.dos.connections_refused_concurrent, snap.dos.connections_refused_rate
    );
    crate::onion_metrics::render(&snap.onion, &mut s);
    let _ = writeln!(s, "# HELP chive_scheduler_info The circuit scheduler in use.\n# TYPE chive_scheduler_info gauge\nchive_scheduler_info{{policy=\"{}\"}} 1", snap.scheduler.replace('"', "'"));
    let mut d: Vec<f64> = snap.queue_delays.iter().copied().collect();
    d.sort_by(|a, b| a.total_cmp(b));
    let _ = writeln!(s, "# HELP chive_cell_queue_delay_seconds Circuit-queue delay of recent sampled cells.\n# TYPE chive_cell_queue_delay_seconds summary");
    for q in [0.5, 0.9, 0.99] {
        let v = if d.is_empty() {
            f64::NAN
        } else {
            d[((d.len() - 1) as f64 * q).round() as usize]
        };
        let _ = writeln!(s, "chive_cell_queue_delay_seconds{{quantile=\"{q}\"}} {v}");
    }
    let _ = writeln!(s, "chive_cell_queue_delay_seconds_count {}", d.len());
    s
}

/// A minimal HTTP/1.1 responder for `GET /metrics` (no keep-alive needed by scrapers).
async fn serve(listener: tokio::net::TcpListener, shared: Arc<Mutex<Snapshot>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut got = 0;
            // Read the request head (bounded, with a timeout).
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while got < buf.len() {
                    match sock.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            got += n;
                            if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..got]);
            let (status, body) = if head.starts_with("GET /metrics ") || head.starts_with("GET / ")
            {
                let snap = shared.lock().map(|s| s.clone()).unwrap_or_default();
                ("200 OK", render(&snap))
            } else {
                ("404 Not Found", "not found; try /metrics\n".to_string())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_quantiles_and_counters() {
        let mut snap = Snapshot {
            cells_transmitted: 42,
            scheduler: "Ewma".into(),
            ..Default::default()
        };
        snap.queue_delays.extend([0.001, 0.002, 0.003, 0.1]);
        let text = render(&snap);
        assert!(text.contains("chive_cells_transmitted_total 42"));
        assert!(text.contains("chive_cell_queue_delay_seconds{quantile=\"0.5\"} 0.003"));
        assert!(text.contains("chive_scheduler_info{policy=\"Ewma\"} 1"));
        let snap = Snapshot {
            oom_circuits_killed: 7,
            dos: DosStats {
                circuits_refused: 11,
                connections_refused_rate: 2,
                streams_refused: 5,
                single_hop_refused: 3,
                ..DosStats::default()
            },
            ..Default::default()
        };
        let text = render(&snap);
        assert!(text.contains("chive_oom_circuits_killed_total 7"));
        assert!(text.contains("chive_dos_circuits_refused_total 11"));
        assert!(text.contains("chive_dos_streams_refused_total 5"));
        assert!(text.contains("chive_dos_single_hop_refused_total 3"));
        assert!(text.contains("chive_dos_connections_refused_total{reason=\"rate\"} 2"));
    }

    #[test]
    fn cc_agreement_counters_are_exported() {
        let cc = chive_core::CcAgreementStats {
            relay_agreed: 4,
            relay_declined: 3,
            relay_refused: 1,
            client_agreed: 6,
            client_declined: 2,
            client_refused: 5,
        };
        let text = render(&Snapshot {
            cc_agreement: cc,
            ..Default::default()
        });
        for line in [
            "chive_cc_relay_agreed_total 4",
            "chive_cc_relay_declined_total 3",
            "chive_cc_relay_refused_total 1",
            "chive_cc_client_agreed_total 6",
            "chive_cc_client_declined_total 2",
            "chive_cc_client_refused_total 5",
        ] {
            assert!(text.contains(line), "{line}");
        }
        let v: serde_json::Value = serde_json::from_str(&cc_agreement_json(&cc)).unwrap();
        assert_eq!(v["relay"]["agreed"], 4);
        assert_eq!(v["relay"]["declined"], 3);
        assert_eq!(v["relay"]["refused"], 1);
        assert_eq!(v["client"]["agreed"], 6);
        assert_eq!(v["client"]["declined"], 2);
        assert_eq!(v["client"]["refused"], 5);
    }

    #[test]
    fn dos_record_counts_the_second_and_names_every_refusal() {
        let last = DosStats {
            circuits_refused: 10,
            streams_refused: 4,
            single_hop_refused: 1,
            ..DosStats::default()
        };
        assert_eq!(
            dos_record(1.0, &last, &last),
            None,
            "nothing new, no record"
        );
        // A second in which only single-hop rendezvous were refused still writes one.
        let now = DosStats {
            single_hop_refused: 3,
            tracked_addresses: 2,
            ..last
        };
        let line = dos_record(2.5, &now, &last).expect("a record");
        let v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(v["type"], "dos");
        assert_eq!(v["t"], 2.5);
        assert_eq!(v["single_hop_refused"], 2);
        assert_eq!(v["circuits_refused"], 0);
        assert_eq!(v["streams_refused"], 0);
        assert_eq!(v["tracked_addresses"], 2);
        let now = DosStats {
            circuits_refused: 15,
            addresses_marked: 1,
            connections_refused_concurrent: 2,
            connections_refused_rate: 1,
            streams_refused: 7,
            ..last
        };
        let v: serde_json::Value =
            serde_json::from_str(&dos_record(3.0, &now, &last).expect("a record")).unwrap();
        assert_eq!(v["circuits_refused"], 5);
        assert_eq!(v["addresses_marked"], 1);
        assert_eq!(v["connections_refused"], 3);
        assert_eq!(v["streams_refused"], 3);
        assert_eq!(v["single_hop_refused"], 0);
    }
}
