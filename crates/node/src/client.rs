//! `chive client`: a SOCKS4a/5 proxy that carries each connection over a circuit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chive_cell::{EndReason, ResolvedAnswer};
use chive_client::circmgr::{
    CircMgrConfig, CircuitManager, Outcome, RequestKind, StreamRequest, Ticket,
};
use chive_client::onion::connect::ConnectorConfig;
use chive_client::onion::{OnionConnector, OnionPaths, OnionService, ServiceConfig};
use chive_client::path::valid_node_spec;
use chive_client::socks::{
    accept_socks, send_reply, SocksCommand, SocksReply, SocksRequest, TargetAddr,
};
use chive_core::{Core, CoreConfig, Event, LocalMap, StreamHandle};
use chive_crypto::IdentityKey;
use chive_dir::OnionDescriptor;
use chive_net::{FeatureSet, LinkConfig, LinkLimits};
use rand::RngCore;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::common::{check_outbuf_cells, init_logging, load_config, write_ports_file};
use crate::driver::{
    spawn_stream_io, stop_on_signal, Driver, DriverConfig, Input, StreamCmd, StreamIo, Tunables,
};
use crate::link_options::with_link_options;
use crate::metrics::Metrics;

/// Command-line arguments of `chive client`.
#[derive(clap::Args, Debug)]
#[command(after_help = CLIENT_CONFIG_HELP)]
pub struct Args {
    /// TOML config file (see below for its options).
    #[arg(long)]
    pub config: PathBuf,
}

const CLIENT_CONFIG_HELP: &str = "\
Config file options (TOML):
  DataDirectory = \"/path\"          state directory (required)
  SocksPort = \"127.0.0.1:9050\"     SOCKS4a/5 listen address (required)
  Authority = \"127.0.0.1:7000\"     the directory authority's DirPort (required)
  AuthorityIdentity = \"<hex>\"      its Ed25519 identity, 64 hex digits (required)
  MaxCircuitDirtiness = 600        seconds a circuit takes new streams after its first
  PreemptiveCircuits = 2           clean circuits kept built and ready
  CircuitBuildTimeout = 10         seconds before an unfinished circuit is abandoned (its streams retry elsewhere)
  CircuitStreamTimeout = 0         seconds a stream waits for CONNECTED before it is ended
                                   (END TIMEOUT) and retried on another circuit, avoiding the
                                   timed-out circuit's middle and exit; 0 = Tor's schedule:
                                   10 s for the first two tries, 15 s after (3 tries in all,
                                   then the SOCKS request fails); 1..3600
  RelayRetryInterval = 60          seconds a relay blamed for a failed circuit is left out of
                                   new paths (a lost link to the guard: down, the guard is
                                   replaced; a DESTROY saying CHANNEL_CLOSED/CONNECTFAILED: the
                                   later hops are suspect, avoided while another path exists);
                                   a consensus listing it again after dropping it ends it sooner
  OutbufCells = 64                 cells handed to a connection but not yet written, at most
  EntryNodes = [\"relayA\"]          first hops are chosen only among these (Guard flag not required)
  MiddleNodes = [\"relayB2\"]        middle hops only among these
                                   (both: relay nicknames or 64-hex identities; default [] = any relay.
                                   For testbeds and experiments; restricting paths harms anonymity.)
  LinkUnsentLimit = 65536          bytes a link socket may hold written but not yet sent
                                   (TCP_NOTSENT_LOWAT; 0 = no limit, 4096..16777216; default
                                   64 KiB). While this client uploads over a slow uplink, the
                                   SENDMEs that keep its downloads going wait behind at most
                                   this much, not behind megabytes of kernel send buffer
  LinkCongestionControl = \"bbr\"    TCP congestion control for link sockets (TCP_CONGESTION),
                                   checked at start; default: the system's
  LinkRecordLayer = \"own\"          who seals and opens TLS records after the handshake:
                                   \"own\" (default: chive-net's record layer) or \"rustls\"
  CircuitSwitching = \"path\"        paper 003's path switching: every exit circuit is linked to a
                                   spare through another entry and middle to the same exit, and
                                   the upload moves to it when the entry reports congestion
                                   (relays need CircuitSwitching = \"path\" too). \"off\" or
                                   \"connection\" (a relay-side mode) keep one circuit; default:
                                   the consensus CircuitSwitching
  SwitchTimeoutMsec = 2000         a path switch waits at least this long for SWITCH_CONFIRM,
                                   then falls back to the old circuit (100..120000; default: the
                                   consensus)
  SwitchTimeoutRttFactor = 3       ... and at least this many round trips measured on the linked
                                   circuits (0..20, 0 = the fixed SwitchTimeoutMsec; default: the
                                   consensus)
  SwitchLighterLeg = 1             a congestion report does not move the upload onto a leg whose
                                   measured round trip is more than 10% higher (0 = onto the
                                   other leg whenever its entry did not report congestion lately)
  SwitchLegProbe = 0               with SwitchLighterLeg: 0 = judge the other leg by its round trip
                                   from when it last carried data; or by a probe the exit answers
                                   at once: 1 = probe when a report comes (the move waits for the
                                   answer), 2 = probe it ahead, at most once a second while the
                                   upload runs (a report is decided at once by the last answer)
  SwitchLegUse = \"whole\"          how the upload uses the linked circuits: \"whole\" = one at a
                                   time, moved on the entry's congestion report (the paper);
                                   \"stripe\" = every circuit with room at once, the lowest
                                   round trip first (conflux-style; reports move nothing)
  SwitchStripeLegCells = 0         with SwitchLegUse \"stripe\": the most cells of an upload sent
                                   on one circuit and not yet acknowledged (0 = no cap beyond
                                   the 500-cell stream window; else 50..500): short queues on
                                   both paths, so other traffic through them waits less
  SwitchStripeMoves = 1            with SwitchLegUse \"stripe\": how many moves between circuits
                                   may wait for their confirmations at once (1..16); more keeps
                                   a circuit at its cap from waiting on the other's round trip
                                   (SwitchLegUse, SwitchStripeLegCells and SwitchStripeMoves
                                   default to the consensus parameters of the same names)
  MetricsFile = \"metrics.jsonl\"    JSON-lines metrics (relative: in the DataDirectory), among
                                   them one `switch` record per path switch, one `onion_join`
                                   record per onion connection (its set-up by step) and an
                                   `onion` record when the onion counters change; default none
  MetricsPort = \"127.0.0.1:9102\"   Prometheus text endpoint (GET /metrics); default off
  PortsFile = \"ports.json\"        once every listener is bound, their addresses as JSON
                                   ({\"SocksPort\": \"127.0.0.1:40123\", ...}; relative: in the
                                   DataDirectory; written whole, then renamed into place). With
                                   port 0 in the config the kernel picks a free port, and this
                                   file says which: no race for a port. Default none
  HiddenServiceDir = \"/path\"       run an onion service: its key (created if missing; the
                                   directory must be 0700, the key 0600) and `hostname`,
                                   which holds its address NAME.onion
  HiddenServicePort = [\"80 127.0.0.1:8080\"]  virtual port and local target (IP:PORT,
                                   default 127.0.0.1:VIRTPORT); required with HiddenServiceDir
  HiddenServiceNumIntroductionPoints = 3   introduction points (1..10)
  OnionAttemptTimeout = 30         seconds one attempt to reach an onion service (rendezvous and
                                   introduction circuits, INTRODUCE1, RENDEZVOUS2) may take
                                   before it is abandoned and another starts with a fresh
                                   cookie and introduction point; 3 attempts, then 0xF7
                                   (1..120; tor has no single equivalent: it bounds each
                                   circuit build and the whole request, SocksTimeout)
  OnionPredictedCircuits = 2       predicted internal circuits kept built for each kind of
                                   onion circuit (client: rendezvous and introduction, from
                                   the first onion connection until an hour after the last;
                                   service: rendezvous, always); a client's rendezvous ones
                                   end at a random relay that becomes the point, the others
                                   are extended by one hop to the chosen point instead of
                                   built anew (0..8, 0 = none)
  PinnedExitCircuits = 2           clean circuits kept built to an exit that requests pinned
                                   (HOST.NICKNAME.exit) for that port, from the first such
                                   request until an hour after the last, so the next one needs
                                   no circuit build (Tor's predicted ports, keyed by exit;
                                   0..8, 0 = none)
  LinkKeepalive = 5                seconds: a link that wrote nothing for this long sends a
                                   PADDING cell, so its peer knows it is alive (0 = off)
  LinkIdleTimeout = 20             seconds: a link that read nothing (or could write nothing)
                                   for this long is closed as hung, with its circuits (DESTROY
                                   CHANNEL_CLOSED): a peer stopped without closing its socket
                                   (SIGSTOP, pulled cable) fails streams in seconds, not
                                   minutes (0 = off; 2..86400, at least 2x LinkKeepalive)
  Log = \"info\"                     log filter (env CHIVE_LOG overrides)
SOCKS5 username/password isolate streams: distinct credentials never share a circuit.
A host NAME.onion is an onion service, reached through a rendezvous circuit (reused by
later streams with the same SOCKS credentials). Failures answer with proposal 304's SOCKS5
codes: malformed address 0xF6 (at once), no descriptor at the authority 0xF0, a descriptor
that does not verify 0xF1, introduction failed 0xF2, rendezvous failed 0xF3, timed out 0xF7.
A host written as HOST.NICKNAME.exit is reached through the relay NICKNAME as exit.";

with_link_options! {
/// The client's config file.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    #[serde(rename = "DataDirectory")]
    pub data_directory: PathBuf,
    #[serde(rename = "SocksPort")]
    pub socks_port: SocketAddr,
    #[serde(rename = "Authority")]
    pub authority: SocketAddr,
    #[serde(rename = "AuthorityIdentity")]
    pub authority_identity: String,
    #[serde(rename = "MaxCircuitDirtiness", default = "default_dirtiness")]
    pub max_circuit_dirtiness: u64,
    #[serde(rename = "PreemptiveCircuits", default = "default_preemptive")]
    pub preemptive_circuits: usize,
    #[serde(rename = "CircuitBuildTimeout", default = "default_build_timeout")]
    pub circuit_build_timeout: u64,
    /// Tor's CircuitStreamTimeout (seconds; 0 = Tor's 10/10/15 s schedule).
    #[serde(rename = "CircuitStreamTimeout", default)]
    pub circuit_stream_timeout: u64,
    #[serde(rename = "OutbufCells", default)]
    pub outbuf_cells: Option<usize>,
    /// Seconds a relay blamed for a failure is avoided (see the help).
    #[serde(rename = "RelayRetryInterval", default = "default_relay_retry")]
    pub relay_retry_interval: u64,
    #[serde(rename = "Log", default = "crate::relay::default_log")]
    pub log: String,
    /// Tor's EntryNodes: nicknames or hex identities the first hop is chosen among.
    #[serde(rename = "EntryNodes", default)]
    pub entry_nodes: Vec<String>,
    /// Tor's MiddleNodes: nicknames or hex identities middle hops are chosen among.
    #[serde(rename = "MiddleNodes", default)]
    pub middle_nodes: Vec<String>,
    /// Path switching (paper 003): "path" keeps a linked spare per exit circuit.
    #[serde(rename = "CircuitSwitching", default)]
    pub circuit_switching: Option<String>,
    /// How long a path switch waits for its confirmation.
    #[serde(rename = "SwitchTimeoutMsec", default)]
    pub switch_timeout_msec: Option<u32>,
    /// A path switch waits at least this many measured round trips for its confirmation.
    #[serde(rename = "SwitchTimeoutRttFactor", default)]
    pub switch_timeout_rtt_factor: Option<u32>,
    /// Path switching: never move onto a leg that measures heavier (0 or 1; default 1).
    #[serde(rename = "SwitchLighterLeg", default)]
    pub switch_lighter_leg: Option<u8>,
    /// Path switching: how the other leg is judged on a congestion report (0 = its last
    /// estimate, 1 = a probe then, 2 = probes ahead while the upload runs; default 0).
    #[serde(rename = "SwitchLegProbe", default)]
    pub switch_leg_probe: Option<u8>,
    /// Path switching: how the upload uses the linked legs ("whole": one at a time, moved on
    /// a congestion report; "stripe": every leg with room at once; default "whole").
    #[serde(rename = "SwitchLegUse", default)]
    pub switch_leg_use: Option<String>,
    /// Path switching, stripe: the most unacknowledged cells of a stream per leg (0 = no
    /// cap; else 50..=500; default 0).
    #[serde(rename = "SwitchStripeLegCells", default)]
    pub switch_stripe_leg_cells: Option<u32>,
    /// Path switching, stripe: moves between legs that may be unconfirmed at once (1..=16;
    /// default: the consensus's `SwitchStripeMoves`, 1).
    #[serde(rename = "SwitchStripeMoves", default)]
    pub switch_stripe_moves: Option<u32>,
    /// JSON-lines metrics file (relative: in the DataDirectory).
    #[serde(rename = "MetricsFile", default)]
    pub metrics_file: Option<PathBuf>,
    /// Prometheus text endpoint.
    #[serde(rename = "MetricsPort", default)]
    pub metrics_port: Option<SocketAddr>,
    /// Where the bound listening addresses are written (see the help).
    #[serde(rename = "PortsFile", default)]
    pub ports_file: Option<PathBuf>,
    /// Seconds one onion connection attempt may take (see the help).
    #[serde(
        rename = "OnionAttemptTimeout",
        default = "default_onion_attempt_timeout"
    )]
    pub onion_attempt_timeout: u64,
    /// Predicted internal circuits per kind (see the help).
    #[serde(
        rename = "OnionPredictedCircuits",
        default = "default_onion_predicted_circuits"
    )]
    pub onion_predicted_circuits: usize,
    /// Clean circuits kept per predicted pinned exit (see the help).
    #[serde(rename = "PinnedExitCircuits", default = "default_pinned_exit_circuits")]
    pub pinned_exit_circuits: usize,
    /// Onion service directory (key, hostname); unset = no service.
    #[serde(rename = "HiddenServiceDir", default)]
    pub hidden_service_dir: Option<PathBuf>,
    /// `"VIRTPORT [IP:PORT]"` lines for the service.
    #[serde(rename = "HiddenServicePort", default)]
    pub hidden_service_port: Vec<String>,
    /// Introduction points the service keeps.
    #[serde(
        rename = "HiddenServiceNumIntroductionPoints",
        default = "default_intro_points"
    )]
    pub hidden_service_intro_points: usize,
}
}

impl ClientConfig {
    /// `validate` and the link settings `run` derives from the file.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn check_for_fuzzing(&self) -> anyhow::Result<()> {
        self.validate()?;
        let _ = self.link_config();
        Ok(())
    }

    /// Refuse bad values, naming the option.
    fn validate(&self) -> anyhow::Result<IdentityKey> {
        let authority_id = IdentityKey::from_hex(&self.authority_identity)
            .map_err(|e| anyhow::anyhow!("AuthorityIdentity: {e}"))?;
        check_outbuf_cells(self.outbuf_cells)?;
        if !(1..=86_400).contains(&self.relay_retry_interval) {
            anyhow::bail!("RelayRetryInterval: 1..86400 seconds");
        }
        if self.circuit_stream_timeout > 3600 {
            anyhow::bail!("CircuitStreamTimeout: 0 (Tor's schedule) or 1..3600 seconds");
        }
        check_node_list("EntryNodes", &self.entry_nodes)?;
        check_node_list("MiddleNodes", &self.middle_nodes)?;
        self.link().validate()?;
        self.switch_options()?;
        self.service_ports()?;
        if !(1..=MAX_ONION_ATTEMPT_TIMEOUT).contains(&self.onion_attempt_timeout) {
            anyhow::bail!("OnionAttemptTimeout: 1..{MAX_ONION_ATTEMPT_TIMEOUT} seconds");
        }
        if self.onion_predicted_circuits > chive_client::onion::pool::MAX_PREDICTED {
            anyhow::bail!(
                "OnionPredictedCircuits: 0..{}",
                chive_client::onion::pool::MAX_PREDICTED
            );
        }
        if self.pinned_exit_circuits > chive_client::predict::MAX_PER_EXIT {
            anyhow::bail!(
                "PinnedExitCircuits: 0..{}",
                chive_client::predict::MAX_PER_EXIT
            );
        }
        if !(1..=chive_dir::MAX_INTRO_POINTS).contains(&self.hidden_service_intro_points) {
            anyhow::bail!(
                "HiddenServiceNumIntroductionPoints: 1..{}",
                chive_dir::MAX_INTRO_POINTS
            );
        }
        Ok(authority_id)
    }

    /// `CircuitSwitching`, `SwitchTimeoutMsec`, `SwitchTimeoutRttFactor` and `SwitchLighterLeg`,
    /// checked, with the option named in errors.
    fn switch_options(&self) -> anyhow::Result<crate::driver::SwitchOptions> {
        let mode = crate::common::parse_switching_mode(self.circuit_switching.as_deref())?;
        if let Some(t) = self.switch_timeout_msec {
            if !(100..=120_000).contains(&t) {
                anyhow::bail!("SwitchTimeoutMsec: 100..120000");
            }
        }
        if self.switch_timeout_rtt_factor.is_some_and(|f| f > 20) {
            anyhow::bail!("SwitchTimeoutRttFactor: 0..20");
        }
        if self.switch_lighter_leg.is_some_and(|v| v > 1) {
            anyhow::bail!("SwitchLighterLeg: 0 or 1");
        }
        if self.switch_leg_probe.is_some_and(|v| v > 2) {
            anyhow::bail!("SwitchLegProbe: 0, 1 or 2");
        }
        let leg_use = self
            .switch_leg_use
            .as_deref()
            .map(chive_core::switching::LegUse::parse)
            .transpose()
            .map_err(|e| anyhow::anyhow!("SwitchLegUse: {e}"))?;
        if self
            .switch_stripe_leg_cells
            .is_some_and(|n| n != 0 && !(chive_core::switching::MIN_LEG_CELLS..=500).contains(&n))
        {
            anyhow::bail!("SwitchStripeLegCells: 0 or 50..500");
        }
        if self
            .switch_stripe_moves
            .is_some_and(|n| !(1..=chive_core::switching::MAX_STRIPE_MOVES).contains(&n))
        {
            anyhow::bail!(
                "SwitchStripeMoves: 1..{}",
                chive_core::switching::MAX_STRIPE_MOVES
            );
        }
        Ok(crate::driver::SwitchOptions {
            mode,
            leg_use,
            stripe_leg_cells: self.switch_stripe_leg_cells,
            stripe_moves: self.switch_stripe_moves,
            timeout_ms: self.switch_timeout_msec,
            timeout_rtt_factor: self.switch_timeout_rtt_factor,
            lighter_leg: self.switch_lighter_leg.map(|v| v == 1),
            leg_probe: self.switch_leg_probe,
            ..Default::default()
        })
    }

    /// The service's ports; an error names the option (ports without a directory, a
    /// directory without ports, a malformed line, a virtual port given twice).
    fn service_ports(&self) -> anyhow::Result<Vec<(u16, SocketAddr)>> {
        match (
            &self.hidden_service_dir,
            self.hidden_service_port.is_empty(),
        ) {
            (None, true) => return Ok(Vec::new()),
            (None, false) => anyhow::bail!("HiddenServicePort given without HiddenServiceDir"),
            (Some(_), true) => {
                anyhow::bail!("HiddenServiceDir needs at least one HiddenServicePort")
            }
            (Some(_), false) => {}
        }
        let mut ports: Vec<(u16, SocketAddr)> = Vec::new();
        for line in &self.hidden_service_port {
            let (virt, target) = crate::onion_keys::parse_port(line)?;
            if ports.iter().any(|(v, _)| *v == virt) {
                anyhow::bail!("HiddenServicePort: virtual port {virt} given twice");
            }
            ports.push((virt, target));
        }
        Ok(ports)
    }

    /// The onion connector's settings (`OnionAttemptTimeout`, `MaxCircuitDirtiness`).
    fn connector_config(&self, paths: OnionPaths) -> ConnectorConfig {
        ConnectorConfig {
            max_dirtiness: Duration::from_secs(self.max_circuit_dirtiness),
            attempt_timeout: Duration::from_secs(self.onion_attempt_timeout),
            predicted: self.onion_predicted_circuits,
            paths,
            ..ConnectorConfig::default()
        }
    }

    /// The link sockets' settings. A client never constrains its socket buffers.
    fn link_config(&self) -> LinkConfig {
        LinkConfig {
            identity: None,
            features: FeatureSet::EMPTY,
            socket_buffer: None,
            unsent_limit: self.link().unsent_limit(false, 0),
            unsent_rtt_rate: None,
            congestion_control: self.link().congestion_control.clone(),
            // Checked at start (`LinkOptions::validate`).
            record_layer: self.link().record_layer().unwrap_or_default(),
        }
    }
}

/// Most entries accepted in EntryNodes / MiddleNodes (far more than any consensus here).
const MAX_NODE_LIST: usize = 1000;

/// Refuse a node list with a malformed entry, naming the option and the entry.
fn check_node_list(option: &str, nodes: &[String]) -> anyhow::Result<()> {
    if nodes.len() > MAX_NODE_LIST {
        anyhow::bail!("{option}: at most {MAX_NODE_LIST} entries");
    }
    for n in nodes {
        if !valid_node_spec(n) {
            anyhow::bail!(
                "{option}: {n:?} is neither a relay nickname (1-19 letters or digits) \
                 nor a 64-hex-digit identity"
            );
        }
    }
    Ok(())
}

fn default_dirtiness() -> u64 {
    600
}
fn default_preemptive() -> usize {
    2
}
fn default_build_timeout() -> u64 {
    10
}
fn default_relay_retry() -> u64 {
    60
}
fn default_intro_points() -> usize {
    3
}
fn default_onion_attempt_timeout() -> u64 {
    30
}
fn default_pinned_exit_circuits() -> usize {
    chive_client::predict::DEFAULT_PER_EXIT
}
fn default_onion_predicted_circuits() -> usize {
    chive_client::onion::pool::DEFAULT_PREDICTED
}
/// The longest `OnionAttemptTimeout` (a SOCKS request waits 120 s at most anyway).
const MAX_ONION_ATTEMPT_TIMEOUT: u64 = 120;

/// How long a SOCKS request may wait for its stream to open.
const SOCKS_STREAM_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a SOCKS client may take to send its request.
const SOCKS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Run `chive client`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let cfg: ClientConfig = load_config(&args.config)?;
    init_logging(&cfg.log);
    let authority_id = cfg.validate()?;
    if !cfg.entry_nodes.is_empty() || !cfg.middle_nodes.is_empty() {
        warn!(
            entry = ?cfg.entry_nodes,
            middle = ?cfg.middle_nodes,
            "EntryNodes/MiddleNodes restrict paths: fine for experiments, bad for anonymity"
        );
    }
    let tunables = Tunables {
        outbuf_cells: cfg.outbuf_cells,
        ..Tunables::default()
    };
    std::fs::create_dir_all(&cfg.data_directory)
        .with_context(|| format!("DataDirectory {}", cfg.data_directory.display()))?;
    let listener = TcpListener::bind(cfg.socks_port)
        .await
        .with_context(|| format!("SocksPort {}: cannot listen", cfg.socks_port))?;
    let socks_addr = listener.local_addr()?;
    info!(addr = %socks_addr, "SOCKS listening");

    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let core = Core::new(
        CoreConfig {
            circuit_build_timeout: Duration::from_secs(cfg.circuit_build_timeout.max(1)),
            ..CoreConfig::default()
        },
        seed,
    );
    let mut driver = Driver::new(
        core,
        DriverConfig {
            link: Arc::new(cfg.link_config()),
            limits: LinkLimits::default(),
            outbuf_cells: tunables.effective(None).map_err(anyhow::Error::msg)?.1,
            tunables,
            exit_policy: None,
            liveness: cfg.link().liveness()?,
        },
    );
    driver.switching.options = cfg.switch_options()?;
    let metrics_file = crate::common::metrics_path(&cfg.data_directory, cfg.metrics_file.as_ref());
    if metrics_file.is_some() || cfg.metrics_port.is_some() {
        driver.metrics = Metrics::start(metrics_file.as_deref(), cfg.metrics_port).await?;
    }
    let mut ports = vec![("SocksPort", socks_addr)];
    ports.extend(Metrics::ports_entry(driver.metrics.as_ref()));
    write_ports_file(&cfg.data_directory, cfg.ports_file.as_deref(), &ports)?;
    driver.apply_switching();
    rand::rngs::OsRng.fill_bytes(&mut seed);
    driver.client = Some(ClientState::new(CircuitManager::new(
        CircMgrConfig {
            max_circuit_dirtiness: Duration::from_secs(cfg.max_circuit_dirtiness),
            preemptive_circuits: cfg.preemptive_circuits,
            entry_nodes: cfg.entry_nodes.clone(),
            middle_nodes: cfg.middle_nodes.clone(),
            relay_retry: Duration::from_secs(cfg.relay_retry_interval),
            stream_timeout: (cfg.circuit_stream_timeout > 0)
                .then(|| Duration::from_secs(cfg.circuit_stream_timeout)),
            pinned_exit_circuits: cfg.pinned_exit_circuits,
            ..CircMgrConfig::default()
        },
        seed,
    )));
    let tx = driver.sender();
    let paths = OnionPaths {
        entry_nodes: cfg.entry_nodes.clone(),
        middle_nodes: cfg.middle_nodes.clone(),
    };
    let service = match &cfg.hidden_service_dir {
        Some(dir) => {
            let sd = crate::onion_keys::load_or_create(dir)?;
            info!(address = %sd.address, dir = %dir.display(), "onion service");
            rand::rngs::OsRng.fill_bytes(&mut seed);
            Some(OnionService::new(
                ServiceConfig {
                    identity: sd.identity,
                    ports: cfg.service_ports()?,
                    intro_points: cfg.hidden_service_intro_points,
                    descriptor_lifetime: Duration::from_secs(3 * 3600),
                    paths: paths.clone(),
                    predicted: cfg.onion_predicted_circuits,
                },
                seed,
            ))
        }
        None => None,
    };
    rand::rngs::OsRng.fill_bytes(&mut seed);
    if let Some(c) = driver.client.as_mut() {
        c.authority = Some(cfg.authority);
        c.tx = Some(tx.clone());
        c.service = service;
        c.onion = OnionConnector::new(cfg.connector_config(paths), seed);
    }
    let socks_tx = tx.clone();
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    let tx = socks_tx.clone();
                    tokio::spawn(async move { serve_socks(tcp, peer, tx).await });
                }
                Err(e) => {
                    warn!(error = %e, "SOCKS accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    spawn_consensus_fetcher(cfg.authority, authority_id, tx.clone());
    stop_on_signal(tx);
    // A task of its own, not the `block_on` future (no IO poll per hand-over; see run_driver).
    crate::driver::run_driver(driver).await;
    info!("client stopped");
    Ok(())
}

/// Fetch and verify the consensus now, and again whenever it stops being fresh.
pub fn spawn_consensus_fetcher(
    authority: SocketAddr,
    authority_id: IdentityKey,
    tx: mpsc::Sender<Input>,
) {
    tokio::spawn(async move {
        let mut have: Option<u64> = None;
        loop {
            let wait = match crate::dirclient::fetch_consensus(authority, &authority_id).await {
                Ok((consensus, _doc)) => {
                    let now = crate::common::unix_now();
                    let wait = Duration::from_secs(
                        consensus.fresh_until.saturating_sub(now).clamp(1, 300),
                    );
                    if have != Some(consensus.valid_after) {
                        have = Some(consensus.valid_after);
                        debug!(relays = consensus.relays.len(), "new consensus");
                        if tx
                            .send(Input::Consensus(Arc::new(consensus)))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    wait
                }
                Err(e) => {
                    warn!(%authority, error = %format!("{e:#}"), "consensus fetch failed; retrying");
                    Duration::from_secs(1)
                }
            };
            tokio::time::sleep(wait).await;
        }
    });
}

/// Client-only inputs to the driver.
pub enum ClientInput {
    /// A SOCKS request wants a stream.
    Socks {
        req: SocksRequest,
        reply: oneshot::Sender<SocksAnswer>,
    },
    /// The descriptor fetch for an `.onion` request finished (`onion_client.rs`).
    OnionDescriptor {
        target: crate::onion_client::OnionTarget,
        result: Result<OnionDescriptor, SocksReply>,
        reply: oneshot::Sender<SocksAnswer>,
    },
    /// The onion service's descriptor upload failed (it is retried).
    ServicePublishFailed,
}

/// What the driver tells a SOCKS connection.
pub enum SocksAnswer {
    /// The stream is open: run its IO with these.
    Connected {
        handle: StreamHandle,
        write_rx: mpsc::UnboundedReceiver<StreamCmd>,
        credit_rx: mpsc::UnboundedReceiver<usize>,
    },
    /// Answers to a RESOLVE.
    Resolved(Vec<ResolvedAnswer>),
    /// Failure, with the SOCKS error to report.
    Failed(SocksReply),
}

/// The client's part of the driver: circuit policy and SOCKS bookkeeping.
pub struct ClientState {
    mgr: CircuitManager,
    /// The authority, for onion descriptors (`onion_client.rs`).
    pub(crate) authority: Option<SocketAddr>,
    /// The driver's input queue, for the onion tasks' answers.
    pub(crate) tx: Option<mpsc::Sender<Input>>,
    /// Requests waiting for a circuit.
    waiting: HashMap<Ticket, oneshot::Sender<SocksAnswer>>,
    /// Streams whose BEGIN/RESOLVE is out.
    pub(crate) opening: HashMap<StreamHandle, oneshot::Sender<SocksAnswer>>,
    /// Connections to onion services.
    pub(crate) onion: OnionConnector,
    /// `.onion` requests waiting for their connection, by the connector's ticket.
    pub(crate) onion_waiting: HashMap<u64, oneshot::Sender<SocksAnswer>>,
    /// The onion service this client runs (HiddenServiceDir), if any.
    pub(crate) service: Option<OnionService>,
}

fn socks_error(reason: EndReason) -> SocksReply {
    match reason {
        EndReason::CONNECTREFUSED => SocksReply::ConnectionRefused,
        EndReason::EXITPOLICY => SocksReply::NotAllowed,
        EndReason::RESOLVEFAILED => SocksReply::HostUnreachable,
        EndReason::TIMEOUT => SocksReply::TtlExpired,
        EndReason::NOROUTE => SocksReply::NetworkUnreachable,
        _ => SocksReply::GeneralFailure,
    }
}

impl ClientState {
    fn new(mgr: CircuitManager) -> Self {
        ClientState {
            mgr,
            authority: None,
            tx: None,
            waiting: HashMap::new(),
            opening: HashMap::new(),
            onion: OnionConnector::new(ConnectorConfig::default(), [0; 32]),
            onion_waiting: HashMap::new(),
            service: None,
        }
    }

    pub fn set_consensus(
        &mut self,
        core: &mut Core,
        consensus: Arc<chive_dir::Consensus>,
        now: Instant,
    ) {
        debug!(relays = consensus.relays.len(), "using new consensus");
        self.onion.set_consensus(consensus.clone());
        if let Some(svc) = self.service.as_mut() {
            svc.set_consensus(core, consensus.clone(), now);
        }
        self.mgr.set_consensus(core, consensus, now);
    }

    pub fn on_input(
        &mut self,
        core: &mut Core,
        _streams: &mut LocalMap<StreamHandle, StreamIo>,
        input: ClientInput,
        now: Instant,
    ) {
        match input {
            ClientInput::Socks { req, reply } => {
                let (host, port) = match &req.target {
                    TargetAddr::Ip(a) => (a.ip().to_string(), a.port()),
                    TargetAddr::Domain(h, p) => (h.clone(), *p),
                };
                // Tor's IsolateSOCKSAuth: the credentials are the isolation key.
                let isolation = match &req.auth {
                    Some((user, pass)) => {
                        let mut k = Vec::with_capacity(user.len() + pass.len() + 1);
                        k.extend_from_slice(user);
                        k.push(0);
                        k.extend_from_slice(pass);
                        k
                    }
                    None => Vec::new(),
                };
                if crate::onion_client::is_onion_host(&host) {
                    let req = crate::onion_client::OnionRequest {
                        host,
                        port,
                        command: req.command,
                        isolation,
                    };
                    return self.onion_request(core, req, reply, now);
                }
                let kind = match req.command {
                    SocksCommand::Connect => RequestKind::Connect,
                    SocksCommand::Resolve => RequestKind::Resolve,
                };
                let ticket = self.mgr.request(
                    core,
                    StreamRequest {
                        host,
                        port,
                        isolation,
                        kind,
                    },
                    now,
                );
                self.waiting.insert(ticket, reply);
            }
            ClientInput::OnionDescriptor {
                target,
                result,
                reply,
            } => self.onion_descriptor(core, target, result, reply, now),
            ClientInput::ServicePublishFailed => {
                if let Some(svc) = self.service.as_mut() {
                    svc.publish_failed(now);
                }
            }
        }
    }

    /// Hand out finished circuit requests. Returns whether anything happened.
    pub fn poll(
        &mut self,
        _core: &mut Core,
        streams: &mut LocalMap<StreamHandle, StreamIo>,
        _now: Instant,
    ) -> bool {
        let a = self.take_outcomes(streams);
        a | self.service_actions()
    }

    /// Move finished circuit requests from the manager into `opening` (or answer their
    /// failure). Called before every lookup in `opening`: the driver handles a batch of inputs
    /// before it polls, and within one batch a stream's BEGIN can leave (a `Written` input
    /// transmits) and its CONNECTED or END come back, so the core's event for a stream may be
    /// handled before the manager's "started" outcome for it. Without this the reply was
    /// dropped and the SOCKS client waited until the exit's server gave up (30 s).
    fn take_outcomes(&mut self, streams: &mut LocalMap<StreamHandle, StreamIo>) -> bool {
        let mut any = self.take_onion_outcomes(streams);
        while let Some((ticket, outcome)) = self.mgr.poll_outcome() {
            any = true;
            if let Outcome::Retrying(old) = outcome {
                // The stream's BEGIN timed out (its END is sent): its SOCKS reply waits for
                // the request's next outcome.
                streams.remove(&old);
                if let Some(reply) = self.opening.remove(&old) {
                    self.waiting.insert(ticket, reply);
                }
                continue;
            }
            let Some(reply) = self.waiting.remove(&ticket) else {
                continue;
            };
            match outcome {
                Outcome::Started(handle) => {
                    streams.insert(handle, StreamIo::parked());
                    self.opening.insert(handle, reply);
                }
                Outcome::Failed(why) => {
                    info!(%why, "stream request failed");
                    let _ = reply.send(SocksAnswer::Failed(SocksReply::GeneralFailure));
                }
                Outcome::Retrying(_) => {}
            }
        }
        any
    }

    pub fn on_event(
        &mut self,
        core: &mut Core,
        streams: &mut LocalMap<StreamHandle, StreamIo>,
        ev: Event,
        now: Instant,
    ) {
        self.take_outcomes(streams);
        match ev {
            Event::StreamConnected { stream, .. } => {
                self.mgr.stream_answered(stream);
                let (Some(reply), Some((write_rx, credit_rx))) = (
                    self.opening.remove(&stream),
                    streams.get_mut(&stream).and_then(|io| io.unpark()),
                ) else {
                    return;
                };
                if reply
                    .send(SocksAnswer::Connected {
                        handle: stream,
                        write_rx,
                        credit_rx,
                    })
                    .is_err()
                {
                    // The application went away while we waited.
                    streams.remove(&stream);
                    core.stream_error(stream, now);
                }
            }
            Event::Resolved { stream, answers } => {
                self.mgr.stream_answered(stream);
                streams.remove(&stream);
                if let Some(reply) = self.opening.remove(&stream) {
                    let _ = reply.send(SocksAnswer::Resolved(answers));
                }
            }
            Event::CircuitBuilt { circ } => {
                if self.onion.owns(circ) {
                    self.onion.on_circuit_built(core, circ, now);
                } else if let Some(svc) = self.service.as_mut().filter(|s| s.owns(circ)) {
                    svc.on_circuit_built(core, circ, now);
                } else {
                    self.mgr.on_circuit_built(core, circ, now);
                }
            }
            Event::CircuitClosed {
                circ,
                cause,
                hops,
                reason,
            } => {
                if self.onion.owns(circ) {
                    self.onion.on_circuit_closed(core, circ, &reason, now);
                } else if let Some(svc) = self.service.as_mut().filter(|s| s.owns(circ)) {
                    svc.on_circuit_closed(circ, &reason, now);
                } else {
                    self.mgr.on_circuit_closed(core, circ, cause, hops, now);
                }
            }
            Event::OnionMessage {
                circ,
                command,
                body,
            } => {
                if self.onion.owns(circ) {
                    self.onion.on_onion_message(core, circ, command, &body, now);
                } else if let Some(svc) = self.service.as_mut().filter(|s| s.owns(circ)) {
                    svc.on_onion_message(core, circ, command, &body, now);
                } else {
                    debug!(?circ, %command, "onion message on a circuit no onion role owns");
                }
            }
            _ => {}
        }
    }

    /// A stream ended; if it never opened, fail its SOCKS request. Returns true if handled.
    pub fn on_stream_closed(
        &mut self,
        streams: &mut LocalMap<StreamHandle, StreamIo>,
        stream: StreamHandle,
        reason: EndReason,
    ) -> bool {
        self.take_outcomes(streams);
        self.mgr.stream_answered(stream);
        match self.opening.remove(&stream) {
            Some(reply) => {
                streams.remove(&stream);
                debug!(?stream, %reason, "stream refused");
                let _ = reply.send(SocksAnswer::Failed(socks_error(reason)));
                true
            }
            None => false,
        }
    }

    pub fn tick(&mut self, core: &mut Core, now: Instant) {
        self.mgr.tick(core, now);
        self.onion.tick(core, now);
        if let Some(svc) = self.service.as_mut() {
            svc.tick(core, now, crate::common::unix_now());
        }
    }
}

/// One SOCKS connection: handshake, wait for the stream, then relay bytes.
async fn serve_socks(mut tcp: TcpStream, peer: SocketAddr, tx: mpsc::Sender<Input>) {
    let _ = tcp.set_nodelay(true);
    let req = match tokio::time::timeout(SOCKS_HANDSHAKE_TIMEOUT, accept_socks(&mut tcp)).await {
        Ok(Ok(req)) => req,
        Ok(Err(e)) => {
            info!(%peer, error = %e, "bad SOCKS request; closing");
            return;
        }
        Err(_) => {
            info!(%peer, "SOCKS request timed out; closing");
            return;
        }
    };
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx
        .send(Input::Client(ClientInput::Socks {
            req: req.clone(),
            reply: reply_tx,
        }))
        .await
        .is_err()
    {
        return;
    }
    let answer = match tokio::time::timeout(SOCKS_STREAM_TIMEOUT, reply_rx).await {
        Ok(Ok(a)) => a,
        Ok(Err(_)) => SocksAnswer::Failed(SocksReply::GeneralFailure),
        Err(_) => SocksAnswer::Failed(SocksReply::TtlExpired),
    };
    match answer {
        SocksAnswer::Connected {
            handle,
            write_rx,
            credit_rx,
        } => {
            if send_reply(&mut tcp, &req, SocksReply::Succeeded, None)
                .await
                .is_ok()
            {
                spawn_stream_io(handle, tcp, write_rx, credit_rx, tx);
            } else {
                let _ = tx
                    .send(Input::StreamError {
                        stream: handle,
                        why: "SOCKS reply failed".into(),
                    })
                    .await;
            }
        }
        SocksAnswer::Resolved(answers) => {
            let addr = answers.iter().find_map(|a| match a {
                ResolvedAnswer::Ip(ip, _) => Some(SocketAddr::new(*ip, 0)),
                _ => None,
            });
            let reply = if addr.is_some() {
                SocksReply::Succeeded
            } else {
                SocksReply::HostUnreachable
            };
            let _ = send_reply(&mut tcp, &req, reply, addr).await;
        }
        SocksAnswer::Failed(code) => {
            let _ = send_reply(&mut tcp, &req, code, None).await;
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
