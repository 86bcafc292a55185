//! `chive client`'s config file: its options (`ClientConfig`, with the link options every
//! node shares), the help text `--help` prints for them, their defaults and their checks.

use super::*;

pub(super) const CLIENT_CONFIG_HELP: &str = "\
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
  OutbufCells = 128                cells handed to a connection but not yet written, at most
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
  SwitchLegUse = \"stripe\"         how the upload uses the linked circuits: \"stripe\" = every
                                   circuit with room at once, the lowest round trip first
                                   (conflux-style; reports move nothing); \"whole\" = one at a
                                   time, moved on the entry's congestion report (the paper)
  SwitchStripeLegCells = 100       with SwitchLegUse \"stripe\": the most cells of an upload sent
                                   on one circuit and not yet acknowledged (0 = no cap beyond
                                   the 500-cell stream window; else 50..500): short queues on
                                   both paths, so other traffic through them waits less
  SwitchStripeMoves = 4            with SwitchLegUse \"stripe\": how many moves between circuits
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
    /// a congestion report; "stripe": every leg with room at once; default: the consensus's
    /// `SwitchLegUse`, "stripe").
    #[serde(rename = "SwitchLegUse", default)]
    pub switch_leg_use: Option<String>,
    /// Path switching, stripe: the most unacknowledged cells of a stream per leg (0 = no
    /// cap; else 50..=500; default: the consensus's `SwitchStripeLegCells`, 100).
    #[serde(rename = "SwitchStripeLegCells", default)]
    pub switch_stripe_leg_cells: Option<u32>,
    /// Path switching, stripe: moves between legs that may be unconfirmed at once (1..=16;
    /// default: the consensus's `SwitchStripeMoves`, 4).
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
    pub(super) fn validate(&self) -> anyhow::Result<IdentityKey> {
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
    pub(super) fn switch_options(&self) -> anyhow::Result<crate::driver::SwitchOptions> {
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
    pub(super) fn service_ports(&self) -> anyhow::Result<Vec<(u16, SocketAddr)>> {
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
    pub(super) fn connector_config(&self, paths: OnionPaths) -> ConnectorConfig {
        ConnectorConfig {
            max_dirtiness: Duration::from_secs(self.max_circuit_dirtiness),
            attempt_timeout: Duration::from_secs(self.onion_attempt_timeout),
            predicted: self.onion_predicted_circuits,
            paths,
            ..ConnectorConfig::default()
        }
    }

    /// The link sockets' settings. A client never constrains its socket buffers.
    pub(super) fn link_config(&self) -> LinkConfig {
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
