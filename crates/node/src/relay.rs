//! `chive relay`: an onion relay, and an exit if its exit policy accepts anything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chive_core::{ChannelId, Core, CoreConfig, RelayKeys};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::IdentityKey;
use chive_dir::{valid_nickname, ExitPolicy, RelayDescriptor};
use chive_net::{FeatureSet, LinkConfig, LinkLimits, LinkListener, TokenBucket};
use rand::RngCore;
use serde::Deserialize;
use tracing::{info, warn};

use crate::common::{
    check_outbuf_cells, init_logging, keys_dir, load_config, load_identity, load_or_create_secret,
    unix_now, write_ports_file,
};
use crate::driver::{stop_on_signal, Driver, DriverConfig, Input, Tunables};
use crate::limits::{max_mem_in_queues, DosOptions, MemSize};
use crate::link_options::with_link_options;
use crate::metrics::Metrics;

/// Command-line arguments of `chive relay`.
#[derive(clap::Args, Debug)]
#[command(after_help = RELAY_CONFIG_HELP)]
pub struct Args {
    /// TOML config file (see below for its options).
    #[arg(long)]
    pub config: PathBuf,
}

const RELAY_CONFIG_HELP: &str = "\
Config file options (TOML):
  Nickname = \"relay1\"              1-19 letters or digits (required)
  DataDirectory = \"/path\"          keys live in DataDirectory/keys (required)
  ORPort = \"127.0.0.1:9001\"        address to listen on and advertise (required)
  Authority = \"127.0.0.1:7000\"     the directory authority's DirPort (required)
  AuthorityIdentity = \"<hex>\"      its Ed25519 identity, 64 hex digits (required)
  BandwidthRate = 0                bytes/s for writing (and, see ReadRateMargin, reading);
                                   0 = unlimited
  BandwidthBurst = 0               bucket size in bytes; 0 = same as BandwidthRate
  CrossChannelPriority = true      with BandwidthRate: OutbufCells bounds the cells waiting
                                   for write tokens over ALL connections, and free room goes
                                   to the channel whose next circuit has the lowest EWMA count
                                   (KIST-like; docs/scheduling.md). false: each connection's
                                   writer takes tokens first come, first served
  ChannelFairness = true           with CrossChannelPriority: a client's channel is ranked by
                                   what it sent in all (its circuits' EWMA counts summed), as
                                   one circuit, then EWMA picks among its circuits, so a client
                                   spreading bulk over many circuits gets no larger share than
                                   a one-circuit client; channels to relays (an identity the
                                   consensus lists) keep per-circuit ranking (docs/security.md,
                                   EWMA gaming).
                                   Unset: the consensus's ChannelFairness (default 1 = on)
  PerClientQueueCells = 2000       at an entry: once this many cells wait here toward one
                                   client's channel, that client's cells on its circuits with
                                   cells waiting here (its SENDMEs) are held back and let go
                                   as the queue drains, so a client spreading a download over
                                   many circuits keeps its excess here, not in the middles
                                   (docs/security.md, EWMA gaming). 0 = off. Unset: the
                                   consensus's PerClientQueueCells (default 2000)
  ClientCircuitWindow = 0          with PerClientQueueCells: a client circuit's first cell
                                   (on a circuit owing nothing) is taken to set this many cells
                                   in flight toward this entry, each later cell what arrived
                                   since the one before (at most 100), less what arrives
                                   (forgotten 0.1 s after the last arrival, or 1 s after the
                                   cell if nothing came back);
                                   the bound counts the queue plus that, and holds the client's
                                   cells on any circuit (new ones too) while past it, so many
                                   circuits cannot set more than the bound moving at once.
                                   500 met the EWMA-gaming target with fixed windows
                                   (docs/security.md). 0 = the queue alone. Unset: the
                                   consensus's ClientCircuitWindow (default 0 = off)
  QuietReserve = 131072            with BandwidthRate and CrossChannelPriority under EWMA: bytes
                                   of the write bucket that only quiet circuits may spend (EWMA
                                   count below the reserve's size in cells). Bulk then leaves
                                   the bucket at the reserve, and a quiet circuit's burst (a web
                                   page, a handshake) goes at once instead of waiting for
                                   tokens; the long-run rate is unchanged. At most half of
                                   BandwidthBurst; 0 = off, as in Tor. Default: 128 KiB, at
                                   most a quarter of the burst (docs/scheduling.md)
  ReadRateMargin = 0.1             reading may go this fraction faster than BandwidthRate
                                   (0..=1; 0 = as Tor). With equal limits it is chance which
                                   side binds; when reading does, cells queue in kernel buffers
                                   and at the read bucket in arrival order, out of the
                                   scheduler's reach. A relay writes what it reads, so reads
                                   stay at the write rate on average (docs/scheduling.md)
  ExitPolicy = [\"reject *:*\"]      torrc-style rules, first match wins (default: not an exit)
  ExitPolicyRejectPrivate = true   reject private and local addresses before ExitPolicy
  Scheduler = \"ewma\"               circuit scheduler: \"rr\", \"ewma\" or \"ewma-direct\" (reference)
  CircuitPriorityHalflife = 30     EWMA half-life in seconds; <= 0 means round-robin
                                   (default: consensus CircuitPriorityHalflifeMsec, else 30 s)
  OutbufCells = 128                cells handed to a connection but not yet written, at most
                                   (default: 10 ms of BandwidthRate, 8 to 64, when set;
                                   else the consensus OutbufCells, else 128: one read)
  OutbufMaxMsec = 200              with BandwidthRate: the bound above grows by the rate's
                                   worth of the measured driver reaction latency (writer paid
                                   -> next batch handed over; mean + 2 deviations), up to this
                                   many ms of the rate, so late wake-ups on a loaded machine do
                                   not cap the rate at bound / latency. 0 = fixed bound;
                                   0..1000 (docs/scheduling.md, \"Late wake-ups\")
  CircuitWindow = 101              circuit window for the circuits this relay packages (its
                                   exit streams), 100..1000, overriding the consensus
                                   circwindow (paper 004); applies with cc_alg=0. Read at start
  ConstrainedSockets = true        limit link sockets' kernel buffers (SO_SNDBUF/SO_RCVBUF)...
  ConstrainedSockSize = 20000      ...to this many bytes (2048..262144), as Tor's options do, so
                                   queued cells wait where the scheduler can reorder them.
                                   Default: off (kernel autotuning), with or without a
                                   BandwidthRate: a fixed buffer caps a link at size / RTT
                                   (8 KiB over 60 ms: 137 kB/s), LinkUnsentLimit bounds the
                                   kernel's backlog instead. When on, the size defaults to
                                   10 ms of BandwidthRate (at least 8192), else 8192.
                                   Constrained links also use segments of size/8 (536..1460
                                   bytes), so the small window holds several segments
  LinkUnsentLimit = 65536          bytes a link socket may hold written but not yet sent
                                   (TCP_NOTSENT_LOWAT; 0 = no limit, 4096..16777216). The
                                   window in flight is not capped; the backlog waits in the
                                   relay's circuit queues, where SENDMEs and quiet circuits
                                   go first, not behind megabytes of kernel send buffer.
                                   Default with BandwidthRate: 10 ms of it plus the rate times
                                   twice each link's round trip at set-up, 4096..65536 (a
                                   small fixed limit caps a delayed link far below the rate);
                                   without: 64 KiB; none if sockets are constrained (their
                                   whole buffer is small then). Read at start only
  LinkCongestionControl = \"bbr\"    TCP congestion control for link sockets (TCP_CONGESTION),
                                   checked at start; default: the system's. BBR keeps the
                                   standing queues short that delay ACKs and SENDMEs behind
                                   bulk (docs/netns.md). Read at start only
  LinkRecordLayer = \"own\"          who seals and opens TLS records after the handshake:
                                   \"own\" (default: rustls does the handshake, chive-net the
                                   records in place, two copies fewer per received byte;
                                   docs/performance.md) or \"rustls\" (rustls does both). The wire
                                   is TLS 1.3 either way. Read at start only
  HeartbeatPeriod = 21600          seconds between DoS heartbeat log lines: CREATE2 and
                                   connections refused, addresses marked, OOM kills, since
                                   the last line and since start (Tor's heartbeat; 0 = off;
                                   default 6 h; SIGHUP)
  LinkKeepalive = 5                seconds: a link that wrote nothing for this long sends a
                                   PADDING cell, so its peer knows it is alive (0 = off)
  LinkIdleTimeout = 20             seconds: a link that read nothing (or could write nothing)
                                   for this long is closed as hung, with its circuits (DESTROY
                                   CHANNEL_CLOSED): a peer stopped without closing its socket
                                   (SIGSTOP, pulled cable) fails streams in seconds, not
                                   minutes (0 = off; 2..86400, at least 2x LinkKeepalive)
  MetricsPort = \"127.0.0.1:9101\"   Prometheus text endpoint (GET /metrics); default off
  MetricsFile = \"metrics.jsonl\"    JSON-lines instrumentation (per-cell timing, per-second stats);
                                   a relative path is taken inside DataDirectory
  PortsFile = \"ports.json\"        once every listener is bound, their addresses as JSON
                                   ({\"ORPort\": \"127.0.0.1:40123\", ...}; relative: in the
                                   DataDirectory; written whole, then renamed into place). With
                                   port 0 in the config the kernel picks a free port, and this
                                   file says which: no race for a port. Default none
  CellSampleRate = 100             time one cell in this many (0 = no per-cell timing)
  SplitDirection = \"off\"           split-direction links (paper 002): \"off\" (default for now),
                                   \"always\" or \"dynamic\". When on, links to relays that also
                                   support it may use two one-way connections per channel
                                   (the three Split options are read at start only)
  SplitThreshold = 200000          \"dynamic\": bytes/s in each direction that count as bulk;
                                   split after both directions exceed it for 3 s
  SplitIdle = 30                   \"dynamic\": seconds below bulk before the second connection
                                   closes
  MaxMemInQueues = \"256 MB\"        memory for queued cells and the driver's output buffers
                                   (bytes, or Tor's units: \"16 MB\", \"1 GB\"); when reached, the
                                   circuits whose oldest queued cell is oldest are killed
                                   until 90 % is in use (Tor's OOM rule). 0 = Tor's automatic
                                   rule from the RAM size; at least 1 MiB (Tor: 256 MB).
                                   Default 256 MiB (docs/security.md)
  DoSCircuitCreationEnabled = 1    DoS defences, Tor's torrc names, ranges and defaults
  DoSCircuitCreationMinConnections = 3   (docs/security.md); each set option overrides
  DoSCircuitCreationRate = 3             the consensus parameter of the same name.
  DoSCircuitCreationBurst = 90           Circuit creation: a per-address CREATE2 token
  DoSCircuitCreationDefenseType = 2      bucket; an address that empties it while holding
  DoSCircuitCreationDefenseTimePeriod = 3600   MinConnections client connections gets
  DoSConnectionEnabled = 1               DESTROY (RESOURCELIMIT) for the period. Connection:
  DoSConnectionMaxConcurrentCount = 100  concurrent client connections and a connect rate
  DoSConnectionDefenseType = 2           per address. Both off unless enabled here or by
  DoSConnectionConnectRate = 20          the consensus; relays listed in the consensus
  DoSConnectionConnectBurst = 40         are exempt
  DoSConnectionConnectDefenseTimePeriod = 86400
  DoSStreamCreationEnabled = 1           Exits: a per-circuit BEGIN/RESOLVE token bucket
  DoSStreamCreationRate = 100            (Tor 0.4.9); past it, DefenseType 2 refuses the
  DoSStreamCreationBurst = 300           stream (END MISC; RESOLVED error for a RESOLVE),
  DoSStreamCreationDefenseType = 2       3 closes the circuit, 1 only counts. As in torrc,
                                         0 = the consensus's value for every DoS option
                                         but the on/off ones (0 = off)
  DoSRefuseSingleHopClientRendezvous = 1 a rendezvous point drops ESTABLISH_RENDEZVOUS from
                                         a client connected straight to it (Tor's)
  CircuitSwitching = \"off\"        circuit switching (paper 003): \"off\", \"connection\" (an entry
                                   moves its heaviest circuit off a congested connection onto a
                                   second connection to the same relay) or \"path\" (an entry
                                   tells the client of its heaviest circuit to move its upload
                                   to a spare circuit; an exit answers CONFLUX_LINK and puts the
                                   client's cells back in order); default: the consensus
                                   CircuitSwitching
  SwitchGamma = 0.7                the occupancy EWMA's γ (0..1, exclusive)
  SwitchAlpha = 0.1                α: re-arm level, fraction of SwitchBufferBytes (<= β)
  SwitchBeta = 0.5                 β: congestion level, fraction of SwitchBufferBytes
  SwitchSampleIntervalMsec = 100   occupancy sample interval (10..60000)
  SwitchBufferBytes = 32768        the buffer α and β are fractions of (1024..16777216)
  SwitchTimeoutMsec = 2000         wait for SWITCH_ACK this long, then stay (100..120000); path
                                   mode: the client's wait for SWITCH_CONFIRM (consensus value)
  SwitchMinShare = 0.25            move (or, path mode, warn the client of) a circuit only if its
                                   EWMA count plus queued cells is at least this share of the
                                   congested connection's load (0..1; 0 = always the heaviest)
  SwitchNetworkQueue = 1           count the bytes queued on the path beyond the socket (TCP_INFO:
                                   in flight × (srtt − min_rtt) / srtt) in the occupancy (0 = only
                                   chive's outbuf and the kernel's unsent bytes)
                                   (each Switch option defaults to its consensus parameter;
                                   all are read at start only)
  PublishInterval = 30             seconds between descriptor uploads
  Log = \"info\"                     log filter (env CHIVE_LOG overrides)
SIGHUP reloads BandwidthRate, BandwidthBurst, QuietReserve, ReadRateMargin, Scheduler,
CircuitPriorityHalflife, OutbufCells, OutbufMaxMsec, ChannelFairness, PerClientQueueCells,
ClientCircuitWindow, MaxMemInQueues and the DoS options without dropping circuits.";

/// `QuietReserve` when unset under a `BandwidthRate` (capped at a quarter of the burst).
const DEFAULT_QUIET_RESERVE: u64 = 128 * 1024;

with_link_options! {
/// The relay's config file.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    #[serde(rename = "Nickname")]
    pub nickname: String,
    #[serde(rename = "DataDirectory")]
    pub data_directory: PathBuf,
    #[serde(rename = "ORPort")]
    pub or_port: SocketAddr,
    #[serde(rename = "Authority")]
    pub authority: SocketAddr,
    #[serde(rename = "AuthorityIdentity")]
    pub authority_identity: String,
    #[serde(rename = "BandwidthRate", default)]
    pub bandwidth_rate: u64,
    #[serde(rename = "BandwidthBurst", default)]
    pub bandwidth_burst: u64,
    #[serde(rename = "CrossChannelPriority", default = "yes")]
    pub cross_channel_priority: bool,
    /// `ChannelFairness` (see the help); unset = the consensus's.
    #[serde(rename = "ChannelFairness", default)]
    pub channel_fairness: Option<bool>,
    /// `PerClientQueueCells` (see the help); unset = the consensus's.
    #[serde(rename = "PerClientQueueCells", default)]
    pub per_client_queue_cells: Option<usize>,
    /// `ClientCircuitWindow` (see the help); unset = the consensus's.
    #[serde(rename = "ClientCircuitWindow", default)]
    pub client_circuit_window: Option<usize>,
    #[serde(rename = "ReadRateMargin", default = "default_read_margin")]
    pub read_rate_margin: f64,
    #[serde(rename = "QuietReserve", default)]
    pub quiet_reserve: Option<u64>,
    #[serde(rename = "ExitPolicy", default = "default_exit_policy")]
    pub exit_policy: Vec<String>,
    #[serde(rename = "ExitPolicyRejectPrivate", default = "yes")]
    pub exit_policy_reject_private: bool,
    #[serde(rename = "OutbufCells", default)]
    pub outbuf_cells: Option<usize>,
    #[serde(rename = "OutbufMaxMsec", default)]
    pub outbuf_max_msec: Option<u64>,
    #[serde(rename = "Scheduler", default)]
    pub scheduler: Option<String>,
    #[serde(rename = "CircuitPriorityHalflife", default)]
    pub circuit_priority_halflife: Option<f64>,
    #[serde(rename = "CircuitWindow", default)]
    pub circuit_window: Option<u32>,
    #[serde(rename = "ConstrainedSockets", default)]
    pub constrained_sockets: Option<bool>,
    #[serde(rename = "ConstrainedSockSize", default)]
    pub constrained_sock_size: Option<u32>,
    #[serde(rename = "HeartbeatPeriod", default)]
    pub heartbeat_period: Option<u64>,
    #[serde(rename = "MetricsPort", default)]
    pub metrics_port: Option<SocketAddr>,
    #[serde(rename = "MetricsFile", default)]
    pub metrics_file: Option<PathBuf>,
    /// Where the bound listening addresses are written (see the help).
    #[serde(rename = "PortsFile", default)]
    pub ports_file: Option<PathBuf>,
    #[serde(rename = "CellSampleRate", default = "default_sample_rate")]
    pub cell_sample_rate: u64,
    #[serde(rename = "PublishInterval", default = "default_publish")]
    pub publish_interval: u64,
    #[serde(rename = "Log", default = "default_log")]
    pub log: String,
    #[serde(rename = "SplitDirection", default = "default_split_mode")]
    pub split_direction: String,
    #[serde(rename = "SplitThreshold", default = "default_split_threshold")]
    pub split_threshold: u64,
    #[serde(rename = "SplitIdle", default = "default_split_idle")]
    pub split_idle: u64,
    #[serde(rename = "MaxMemInQueues", default)]
    pub max_mem_in_queues: Option<MemSize>,
    #[serde(rename = "DoSCircuitCreationEnabled", default)]
    pub dos_cc_enabled: Option<i64>,
    #[serde(rename = "DoSCircuitCreationMinConnections", default)]
    pub dos_cc_min_connections: Option<i64>,
    #[serde(rename = "DoSCircuitCreationRate", default)]
    pub dos_cc_rate: Option<i64>,
    #[serde(rename = "DoSCircuitCreationBurst", default)]
    pub dos_cc_burst: Option<i64>,
    #[serde(rename = "DoSCircuitCreationDefenseType", default)]
    pub dos_cc_defense_type: Option<i64>,
    #[serde(rename = "DoSCircuitCreationDefenseTimePeriod", default)]
    pub dos_cc_defense_time_period: Option<i64>,
    #[serde(rename = "DoSConnectionEnabled", default)]
    pub dos_conn_enabled: Option<i64>,
    #[serde(rename = "DoSConnectionMaxConcurrentCount", default)]
    pub dos_conn_max_concurrent_count: Option<i64>,
    #[serde(rename = "DoSConnectionDefenseType", default)]
    pub dos_conn_defense_type: Option<i64>,
    #[serde(rename = "DoSConnectionConnectRate", default)]
    pub dos_conn_connect_rate: Option<i64>,
    #[serde(rename = "DoSConnectionConnectBurst", default)]
    pub dos_conn_connect_burst: Option<i64>,
    #[serde(rename = "DoSConnectionConnectDefenseTimePeriod", default)]
    pub dos_conn_connect_defense_time_period: Option<i64>,
    #[serde(rename = "DoSStreamCreationEnabled", default)]
    pub dos_stream_enabled: Option<i64>,
    #[serde(rename = "DoSStreamCreationRate", default)]
    pub dos_stream_rate: Option<i64>,
    #[serde(rename = "DoSStreamCreationBurst", default)]
    pub dos_stream_burst: Option<i64>,
    #[serde(rename = "DoSStreamCreationDefenseType", default)]
    pub dos_stream_defense_type: Option<i64>,
    #[serde(rename = "DoSRefuseSingleHopClientRendezvous", default)]
    pub dos_refuse_single_hop: Option<i64>,
    #[serde(rename = "CircuitSwitching", default)]
    pub circuit_switching: Option<String>,
    #[serde(rename = "SwitchGamma", default)]
    pub switch_gamma: Option<f64>,
    #[serde(rename = "SwitchAlpha", default)]
    pub switch_alpha: Option<f64>,
    #[serde(rename = "SwitchBeta", default)]
    pub switch_beta: Option<f64>,
    #[serde(rename = "SwitchSampleIntervalMsec", default)]
    pub switch_sample_interval_msec: Option<u32>,
    #[serde(rename = "SwitchBufferBytes", default)]
    pub switch_buffer_bytes: Option<u32>,
    #[serde(rename = "SwitchTimeoutMsec", default)]
    pub switch_timeout_msec: Option<u32>,
    #[serde(rename = "SwitchMinShare", default)]
    pub switch_min_share: Option<f64>,
    #[serde(rename = "SwitchNetworkQueue", default)]
    pub switch_network_queue: Option<i64>,
}
}

fn default_exit_policy() -> Vec<String> {
    vec!["reject *:*".to_string()]
}
/// Writing binds, so cells queue where the scheduler orders them (docs/scheduling.md).
fn default_read_margin() -> f64 {
    0.1
}
fn yes() -> bool {
    true
}
fn default_sample_rate() -> u64 {
    100
}
fn default_publish() -> u64 {
    30
}
fn default_split_mode() -> String {
    "off".to_string()
}
fn default_split_threshold() -> u64 {
    chive_core::split::SplitConfig::default().threshold
}
fn default_split_idle() -> u64 {
    chive_core::split::SplitConfig::default().idle.as_secs()
}
pub(crate) fn default_log() -> String {
    "info".to_string()
}

/// Bandwidth advertised by a relay without a rate limit (bytes/s).
const UNLIMITED_BANDWIDTH: u64 = 100_000_000;

impl RelayConfig {
    /// Kernel socket buffer size for links, if constrained (`ConstrainedSockets = true`; off
    /// by default, with or without a rate). Under a `BandwidthRate` a fixed buffer of 10 ms of
    /// the rate capped a link at buffer / RTT (≈ 137 kB/s at 60 ms RTT), far below the rate:
    /// the kernel's autotuning sizes the window to the path, and [`Self::unsent_limit`]
    /// keeps the backlog in the relay's queues (docs/scheduling.md, "Socket buffers under a
    /// rate").
    fn socket_buffer(&self) -> Option<u32> {
        if !self.constrained_sockets.unwrap_or(false) {
            return None;
        }
        let limited = self.bandwidth_rate > 0;
        Some(self.constrained_sock_size.unwrap_or_else(|| {
            if limited {
                (self.bandwidth_rate / 100).clamp(8192, 262_144) as u32
            } else {
                8192
            }
        }))
    }

    /// TCP_NOTSENT_LOWAT for link sockets, if any (see `LinkUnsentLimit` in the help): under
    /// a rate 10 ms of it (4..64 KiB) unless set or the sockets are constrained.
    fn unsent_limit(&self) -> Option<u32> {
        self.link()
            .unsent_limit(self.socket_buffer().is_some(), self.bandwidth_rate)
    }

    /// The rate the unsent limit grows with per round trip ([`chive_net::LinkConfig::unsent_rtt_rate`],
    /// up to the no-rate default, 64 KiB): the `BandwidthRate` when the limit is its default
    /// under a rate (unset `LinkUnsentLimit`, sockets not constrained); an explicit limit is
    /// used as it is.
    fn unsent_rtt_rate(&self) -> Option<u64> {
        (self.bandwidth_rate > 0
            && self.link().unsent_limit.is_none()
            && self.socket_buffer().is_none())
        .then_some(self.bandwidth_rate)
    }

    /// The settings SIGHUP may change in the running core. Fails, naming the option, on a
    /// bad `MaxMemInQueues` or `DoS*` value; a warning for a legal but unwise one is logged.
    fn tunables(&self) -> anyhow::Result<Tunables> {
        let (mem, warning) =
            max_mem_in_queues(self.max_mem_in_queues.as_ref()).map_err(anyhow::Error::msg)?;
        if let Some(w) = warning {
            warn!("{w}");
        }
        Ok(Tunables {
            scheduler: self.scheduler.clone(),
            halflife: self.circuit_priority_halflife,
            outbuf_cells: self.outbuf_cells.or_else(|| self.rate_based_outbuf()),
            cross_channel: self.cross_channel_priority,
            max_mem_in_queues: Some(mem),
            channel_fairness: self.channel_fairness,
            per_client_queue_cells: self.per_client_queue_cells,
            client_circuit_window: self.client_circuit_window,
            heartbeat_period: self.heartbeat_period,
            outbuf_max_msec: self.outbuf_max_msec,
            dos: self.dos_options()?,
        })
    }

    /// The `DoS*` options set in the file (checked against Tor's ranges).
    fn dos_options(&self) -> anyhow::Result<DosOptions> {
        DosOptions::new(&[
            ("DoSCircuitCreationEnabled", self.dos_cc_enabled),
            (
                "DoSCircuitCreationMinConnections",
                self.dos_cc_min_connections,
            ),
            ("DoSCircuitCreationRate", self.dos_cc_rate),
            ("DoSCircuitCreationBurst", self.dos_cc_burst),
            ("DoSCircuitCreationDefenseType", self.dos_cc_defense_type),
            (
                "DoSCircuitCreationDefenseTimePeriod",
                self.dos_cc_defense_time_period,
            ),
            ("DoSConnectionEnabled", self.dos_conn_enabled),
            (
                "DoSConnectionMaxConcurrentCount",
                self.dos_conn_max_concurrent_count,
            ),
            ("DoSConnectionDefenseType", self.dos_conn_defense_type),
            ("DoSConnectionConnectRate", self.dos_conn_connect_rate),
            ("DoSConnectionConnectBurst", self.dos_conn_connect_burst),
            (
                "DoSConnectionConnectDefenseTimePeriod",
                self.dos_conn_connect_defense_time_period,
            ),
            ("DoSStreamCreationEnabled", self.dos_stream_enabled),
            ("DoSStreamCreationRate", self.dos_stream_rate),
            ("DoSStreamCreationBurst", self.dos_stream_burst),
            ("DoSStreamCreationDefenseType", self.dos_stream_defense_type),
            (
                "DoSRefuseSingleHopClientRendezvous",
                self.dos_refuse_single_hop,
            ),
        ])
        .map_err(anyhow::Error::msg)
    }

    /// A rate-limited relay hands a connection about 10 ms of its rate (at least 8 cells), so
    /// the scheduler's choice is made close to the moment the cell leaves; unlimited relays
    /// use the consensus `OutbufCells` (default 128, one read), where batching matters more.
    fn rate_based_outbuf(&self) -> Option<usize> {
        (self.bandwidth_rate > 0).then(|| {
            let cells = self.bandwidth_rate / 100 / chive_cell::CELL_LEN as u64;
            cells.clamp(8, 64) as usize
        })
    }

    /// The read bucket's rate: BandwidthRate plus the margin (docs/scheduling.md has the
    /// measurements: it helps fresh circuits and hurts reused ones, so it is off by default).
    fn read_rate(&self) -> u64 {
        (self.bandwidth_rate as f64 * (1.0 + self.read_rate_margin)).round() as u64
    }

    /// The write bucket's reserve for quiet circuits: `QuietReserve`, else 128 KiB (a web
    /// object of a few round trips' worth) but at most a quarter of the burst.
    fn quiet_reserve(&self) -> u64 {
        match self.quiet_reserve {
            Some(r) => r,
            None if self.bandwidth_rate > 0 => DEFAULT_QUIET_RESERVE.min(self.burst() / 4),
            None => 0,
        }
    }

    fn burst(&self) -> u64 {
        if self.bandwidth_burst == 0 {
            self.bandwidth_rate
        } else {
            self.bandwidth_burst.max(self.bandwidth_rate)
        }
    }

    /// The split-direction settings, with the option named in any error.
    fn split_config(&self) -> anyhow::Result<chive_core::split::SplitConfig> {
        let mode = chive_core::split::SplitMode::parse(&self.split_direction)
            .map_err(|e| anyhow::anyhow!("SplitDirection: {e}"))?;
        if self.split_threshold == 0 {
            bail!("SplitThreshold must be at least 1 byte/s");
        }
        if !(1..=86_400).contains(&self.split_idle) {
            bail!("SplitIdle must be between 1 and 86400 seconds");
        }
        Ok(chive_core::split::SplitConfig {
            mode,
            threshold: self.split_threshold,
            idle: Duration::from_secs(self.split_idle),
        })
    }

    /// The circuit-switching options, checked, with the option named in any error.
    fn switch_options(&self) -> anyhow::Result<crate::driver::SwitchOptions> {
        let mode = crate::common::parse_switching_mode(self.circuit_switching.as_deref())?;
        if let Some(g) = self.switch_gamma {
            if !(g > 0.0 && g < 1.0) {
                bail!("SwitchGamma must lie strictly between 0 and 1");
            }
        }
        for (name, v) in [
            ("SwitchAlpha", self.switch_alpha),
            ("SwitchBeta", self.switch_beta),
        ] {
            if v.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                bail!("{name} must be between 0 and 1 (a fraction of SwitchBufferBytes)");
            }
        }
        if self
            .switch_min_share
            .is_some_and(|v| !(0.0..=1.0).contains(&v))
        {
            bail!("SwitchMinShare must be between 0 and 1");
        }
        let network_queue = match self.switch_network_queue {
            None => None,
            Some(0) => Some(false),
            Some(1) => Some(true),
            Some(v) => bail!("SwitchNetworkQueue must be 0 or 1, not {v}"),
        };
        if let (Some(a), Some(b)) = (self.switch_alpha, self.switch_beta) {
            if a > b {
                bail!("SwitchAlpha ({a}) must not exceed SwitchBeta ({b})");
            }
        }
        let ranged =
            |name: &str, v: Option<u32>, lo: u32, hi: u32| -> anyhow::Result<Option<u32>> {
                match v {
                    Some(v) if !(lo..=hi).contains(&v) => {
                        bail!("{name} must be between {lo} and {hi}")
                    }
                    v => Ok(v),
                }
            };
        Ok(crate::driver::SwitchOptions {
            mode,
            gamma: self.switch_gamma,
            alpha: self.switch_alpha,
            beta: self.switch_beta,
            sample_interval_ms: ranged(
                "SwitchSampleIntervalMsec",
                self.switch_sample_interval_msec,
                10,
                60_000,
            )?,
            buffer_bytes: ranged(
                "SwitchBufferBytes",
                self.switch_buffer_bytes,
                1024,
                16_777_216,
            )?,
            timeout_ms: ranged("SwitchTimeoutMsec", self.switch_timeout_msec, 100, 120_000)?,
            // A client's setting (path switches are timed there): the consensus's here.
            timeout_rtt_factor: None,
            min_share: self.switch_min_share,
            network_queue,
            // A client's choice (it picks the leg).
            lighter_leg: None,
            leg_probe: None,
            leg_use: None,
            stripe_leg_cells: None,
            stripe_moves: None,
        })
    }

    /// Link features this relay announces.
    fn features(&self) -> FeatureSet {
        match self.split_config().map(|c| c.mode) {
            Ok(chive_core::split::SplitMode::Off) | Err(_) => FeatureSet::EMPTY,
            Ok(_) => FeatureSet(chive_net::SPLIT_DIRECTION),
        }
    }

    /// `validate` and every value `run` derives from the file before opening a socket.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn check_for_fuzzing(&self) -> anyhow::Result<()> {
        self.validate()?;
        let _ = (
            self.socket_buffer(),
            self.unsent_limit(),
            self.unsent_rtt_rate(),
            self.read_rate(),
            self.burst(),
            self.quiet_reserve(),
            self.features(),
            self.split_config()?,
            self.switch_options()?,
        );
        Ok(())
    }

    /// The settings as a consensus with `params` would make them.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn check_params_for_fuzzing(
        &self,
        params: &chive_dir::NetParams,
    ) -> anyhow::Result<()> {
        let tunables = self.tunables()?;
        tunables
            .effective(Some(params))
            .map_err(anyhow::Error::msg)?;
        tunables
            .dos_config(Some(params))
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }

    /// Everything checkable before starting, with the option named in the error.
    fn validate(&self) -> anyhow::Result<(ExitPolicy, IdentityKey)> {
        if !valid_nickname(&self.nickname) {
            bail!(
                "Nickname {:?} must be 1-19 letters or digits",
                self.nickname
            );
        }
        check_outbuf_cells(self.outbuf_cells)?;
        crate::driver::check_outbuf_max_msec(self.outbuf_max_msec).map_err(anyhow::Error::msg)?;
        if let Some(w) = self.circuit_window {
            if !(100..=1000).contains(&w) {
                bail!("CircuitWindow must be between 100 and 1000 cells");
            }
        }
        if let Some(h) = self.circuit_priority_halflife {
            if !h.is_finite() || h > 1e6 {
                bail!("CircuitPriorityHalflife must be a number of seconds (<= 0 turns EWMA off)");
            }
        }
        // Scheduler and half-life together, as the driver will use them (named in the error).
        let tunables = self.tunables()?;
        tunables.effective(None).map_err(anyhow::Error::msg)?;
        tunables.dos_config(None).map_err(anyhow::Error::msg)?;
        if !(0.0..=1.0).contains(&self.read_rate_margin) {
            bail!("ReadRateMargin must be between 0 and 1 (a fraction of BandwidthRate)");
        }
        if let Some(reserve) = self.quiet_reserve {
            if self.bandwidth_rate > 0 && reserve > self.burst() / 2 {
                bail!(
                    "QuietReserve ({reserve}) must be at most half of BandwidthBurst ({}): bulk \
                     traffic may only spend what lies above the reserve",
                    self.burst()
                );
            }
        }
        if let Some(size) = self.constrained_sock_size {
            if !(2048..=262_144).contains(&size) {
                bail!("ConstrainedSockSize must be between 2048 and 262144 bytes");
            }
        }
        self.link().validate()?;
        if self.heartbeat_period.is_some_and(|p| p > 30 * 86_400) {
            bail!("HeartbeatPeriod must be between 0 (off) and 2592000 seconds (30 days)");
        }
        self.split_config()?;
        self.switch_options()?;
        if self.publish_interval == 0 {
            bail!("PublishInterval must be at least 1 second");
        }
        let policy = ExitPolicy::parse(&self.exit_policy, self.exit_policy_reject_private)
            .map_err(|e| anyhow::anyhow!("ExitPolicy: {e}"))?;
        let auth = IdentityKey::from_hex(&self.authority_identity)
            .map_err(|e| anyhow::anyhow!("AuthorityIdentity: {e}"))?;
        Ok((policy, auth))
    }
}

/// Run `chive relay`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let cfg: RelayConfig = load_config(&args.config)?;
    init_logging(&cfg.log);
    let (policy, authority_id) = cfg.validate()?;
    let identity = Arc::new(load_identity(&cfg.data_directory)?);
    let ntor = NtorSecretKey::from_bytes(load_or_create_secret(
        &keys_dir(&cfg.data_directory).join("ntor.key"),
    )?);
    let ntor_public = ntor.public();

    let read_bucket = Arc::new(TokenBucket::new(cfg.read_rate(), cfg.burst()));
    let write_bucket = Arc::new(TokenBucket::new(cfg.bandwidth_rate, cfg.burst()));
    write_bucket.set_reserve(cfg.quiet_reserve());
    let limits = LinkLimits {
        read_bucket: Some(read_bucket.clone()),
        write_bucket: Some(write_bucket.clone()),
    };
    let link = Arc::new(LinkConfig {
        identity: Some(identity.clone()),
        features: cfg.features(),
        socket_buffer: cfg.socket_buffer(),
        unsent_limit: cfg.unsent_limit(),
        unsent_rtt_rate: cfg.unsent_rtt_rate().map(|rate| chive_net::UnsentPerRtt {
            rate,
            max: crate::link_options::DEFAULT_UNSENT_LIMIT,
            probe: chive_tools::sockq::tcp_rtt,
        }),
        congestion_control: cfg.link().congestion_control.clone(),
        // Checked at start (`LinkOptions::validate`).
        record_layer: cfg.link().record_layer().unwrap_or_default(),
    });
    let listener = LinkListener::bind(cfg.or_port, link.clone())
        .await
        .with_context(|| format!("ORPort {}: cannot listen", cfg.or_port))?;
    // With ORPort port 0 the kernel picks the port: the descriptor carries the bound address.
    let or_addr = listener.local_addr();
    info!(nickname = %cfg.nickname, identity = %identity.public(), addr = %or_addr, "relay listening");

    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let is_exit = policy.is_exit();
    let tunables = cfg.tunables()?;
    let (scheduler, outbuf_cells) = tunables.effective(None).map_err(anyhow::Error::msg)?;
    let dos = tunables.dos_config(None).map_err(anyhow::Error::msg)?;
    let metrics_file = crate::common::metrics_path(&cfg.data_directory, cfg.metrics_file.as_ref());
    let core = Core::new(
        CoreConfig {
            relay: Some(RelayKeys {
                identity: identity.public(),
                ntor,
            }),
            exit: is_exit,
            scheduler,
            circwindow_override: cfg.circuit_window,
            max_mem_in_queues: tunables
                .max_mem_in_queues
                .unwrap_or(chive_core::DEFAULT_MAX_MEM_IN_QUEUES),
            dos,
            cell_sample_every: if metrics_file.is_some() || cfg.metrics_port.is_some() {
                cfg.cell_sample_rate
            } else {
                0
            },
            ..CoreConfig::default()
        },
        seed,
    );
    let policy = Arc::new(policy);
    let mut driver = Driver::new(
        core,
        DriverConfig {
            link,
            limits: limits.clone(),
            outbuf_cells,
            exit_policy: is_exit.then(|| policy.clone()),
            tunables: tunables.clone(),
            liveness: cfg.link().liveness()?,
        },
    );
    driver.metrics = Metrics::start(metrics_file.as_deref(), cfg.metrics_port).await?;
    let mut ports = vec![("ORPort", or_addr)];
    ports.extend(Metrics::ports_entry(driver.metrics.as_ref()));
    write_ports_file(&cfg.data_directory, cfg.ports_file.as_deref(), &ports)?;
    driver.split = cfg.split_config()?;
    driver.switching.options = cfg.switch_options()?;
    driver.apply_policy(Instant::now());
    let tx = driver.sender();
    let chan_ids = driver.chan_ids();

    // Accept loop: the driver asks the DoS defences, then runs the handshake in its own task
    // so a slow peer blocks nobody.
    let accept_tx = tx.clone();
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok(accepting) => {
                    let chan = ChannelId(chan_ids.fetch_add(1, Ordering::Relaxed));
                    if accept_tx
                        .send(Input::Accepted { chan, accepting })
                        .await
                        .is_err()
                    {
                        return; // the driver stopped
                    }
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });

    // Descriptor uploads.
    let started = Instant::now();
    let desc_template = RelayDescriptor {
        nickname: cfg.nickname.clone(),
        identity: identity.public(),
        ntor_key: ntor_public.0,
        address: or_addr,
        bandwidth: if cfg.bandwidth_rate > 0 {
            cfg.bandwidth_rate
        } else {
            UNLIMITED_BANDWIDTH
        },
        exit_policy: (*policy).clone(),
        features: cfg.features().0,
        published: 0,
        uptime: 0,
        version: format!("chive {}", env!("CARGO_PKG_VERSION")),
    };
    let publish_identity = identity.clone();
    let publish_every = Duration::from_secs(cfg.publish_interval);
    let authority = cfg.authority;
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let mut desc = desc_template.clone();
            desc.published = unix_now();
            desc.uptime = started.elapsed().as_secs();
            let doc = desc.sign(&publish_identity);
            let wait = match crate::dirclient::publish_descriptor(authority, &doc).await {
                Ok(()) => {
                    if first {
                        info!(%authority, "descriptor published");
                        first = false;
                    }
                    publish_every
                }
                Err(e) => {
                    warn!(%authority, error = %format!("{e:#}"), "descriptor upload failed; retrying");
                    Duration::from_secs(1).min(publish_every)
                }
            };
            tokio::time::sleep(wait).await;
        }
    });

    crate::client::spawn_consensus_fetcher(authority, authority_id, tx.clone());
    spawn_signal_handlers(args.config.clone(), tx, read_bucket, write_bucket);
    // A task of its own, not the `block_on` future (no IO poll per hand-over; see run_driver).
    crate::driver::run_driver(driver).await;
    info!("relay stopped");
    Ok(())
}

/// SIGTERM/SIGINT stop the relay; SIGHUP reloads the rate limits.
fn spawn_signal_handlers(
    config: PathBuf,
    tx: tokio::sync::mpsc::Sender<Input>,
    read_bucket: Arc<TokenBucket>,
    write_bucket: Arc<TokenBucket>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    stop_on_signal(tx.clone());
    tokio::spawn(async move {
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            let loaded = load_config::<RelayConfig>(&config)
                .and_then(|c| c.validate().map(|_| c))
                .and_then(|c| Ok((c.tunables()?, c)));
            match loaded {
                Ok((tunables, c)) => {
                    read_bucket.set_rate(c.read_rate(), c.burst());
                    write_bucket.set_rate(c.bandwidth_rate, c.burst());
                    write_bucket.set_reserve(c.quiet_reserve());
                    let _ = tx.send(Input::Reconfigure(tunables)).await;
                    info!(
                        rate = c.bandwidth_rate,
                        burst = c.burst(),
                        quiet_reserve = write_bucket.reserve(),
                        "config reloaded"
                    );
                }
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "config reload failed; keeping the old one")
                }
            }
        }
    });
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
