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
    spawn_stream_io, stop_on_signal, Driver, DriverConfig, Input, StreamEnds, StreamIo, Tunables,
};
use crate::link_options::with_link_options;
use crate::metrics::Metrics;

#[path = "client_config.rs"]
mod config;
pub use config::ClientConfig;
use config::CLIENT_CONFIG_HELP;

/// Command-line arguments of `chive client`.
#[derive(clap::Args, Debug)]
#[command(after_help = CLIENT_CONFIG_HELP)]
pub struct Args {
    /// TOML config file (see below for its options).
    #[arg(long)]
    pub config: PathBuf,
}

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
        ends: StreamEnds,
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
                let (Some(reply), Some(ends)) = (
                    self.opening.remove(&stream),
                    streams.get_mut(&stream).and_then(|io| io.unpark()),
                ) else {
                    return;
                };
                if reply
                    .send(SocksAnswer::Connected {
                        handle: stream,
                        ends,
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
        SocksAnswer::Connected { handle, ends } => {
            if send_reply(&mut tcp, &req, SocksReply::Succeeded, None)
                .await
                .is_ok()
            {
                spawn_stream_io(handle, tcp, ends, tx);
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
