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
    init_logging, keys_dir, load_config, load_identity, load_or_create_secret, unix_now,
};
use crate::driver::{start_link, Driver, DriverConfig, Input};

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
  BandwidthRate = 0                bytes/s for reading and for writing; 0 = unlimited
  BandwidthBurst = 0               bucket size in bytes; 0 = same as BandwidthRate
  ExitPolicy = [\"reject *:*\"]      torrc-style rules, first match wins (default: not an exit)
  ExitPolicyRejectPrivate = true   reject private and local addresses before ExitPolicy
  OutbufCells = 64                 cells handed to a connection but not yet written, at most
  PublishInterval = 30             seconds between descriptor uploads
  Log = \"info\"                     log filter (env CHIVE_LOG overrides)
SIGHUP reloads BandwidthRate and BandwidthBurst without dropping circuits.";

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
    #[serde(rename = "ExitPolicy", default = "default_exit_policy")]
    pub exit_policy: Vec<String>,
    #[serde(rename = "ExitPolicyRejectPrivate", default = "yes")]
    pub exit_policy_reject_private: bool,
    #[serde(rename = "OutbufCells", default = "default_outbuf")]
    pub outbuf_cells: usize,
    #[serde(rename = "PublishInterval", default = "default_publish")]
    pub publish_interval: u64,
    #[serde(rename = "Log", default = "default_log")]
    pub log: String,
}

fn default_exit_policy() -> Vec<String> {
    vec!["reject *:*".to_string()]
}
fn yes() -> bool {
    true
}
fn default_outbuf() -> usize {
    64
}
fn default_publish() -> u64 {
    30
}
pub(crate) fn default_log() -> String {
    "info".to_string()
}

/// Bandwidth advertised by a relay without a rate limit (bytes/s).
const UNLIMITED_BANDWIDTH: u64 = 100_000_000;

impl RelayConfig {
    fn burst(&self) -> u64 {
        if self.bandwidth_burst == 0 {
            self.bandwidth_rate
        } else {
            self.bandwidth_burst.max(self.bandwidth_rate)
        }
    }

    /// Everything checkable before starting, with the option named in the error.
    fn validate(&self) -> anyhow::Result<(ExitPolicy, IdentityKey)> {
        if !valid_nickname(&self.nickname) {
            bail!(
                "Nickname {:?} must be 1-19 letters or digits",
                self.nickname
            );
        }
        if !(1..=100_000).contains(&self.outbuf_cells) {
            bail!("OutbufCells must be between 1 and 100000");
        }
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

    let read_bucket = Arc::new(TokenBucket::new(cfg.bandwidth_rate, cfg.burst()));
    let write_bucket = Arc::new(TokenBucket::new(cfg.bandwidth_rate, cfg.burst()));
    let limits = LinkLimits {
        read_bucket: Some(read_bucket.clone()),
        write_bucket: Some(write_bucket.clone()),
    };
    let link = Arc::new(LinkConfig {
        identity: Some(identity.clone()),
        features: FeatureSet::EMPTY,
    });
    let listener = LinkListener::bind(cfg.or_port, link.clone())
        .await
        .with_context(|| format!("ORPort {}: cannot listen", cfg.or_port))?;
    info!(nickname = %cfg.nickname, identity = %identity.public(), addr = %listener.local_addr(), "relay listening");

    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let is_exit = policy.is_exit();
    let core = Core::new(
        CoreConfig {
            relay: Some(RelayKeys {
                identity: identity.public(),
                ntor,
            }),
            exit: is_exit,
            ..CoreConfig::default()
        },
        seed,
    );
    let policy = Arc::new(policy);
    let driver = Driver::new(
        core,
        DriverConfig {
            link,
            limits: limits.clone(),
            outbuf_cells: cfg.outbuf_cells,
            exit_policy: is_exit.then(|| policy.clone()),
        },
    );
    let tx = driver.sender();
    let chan_ids = driver.chan_ids();

    // Accept loop: the handshake runs in its own task so a slow peer blocks nobody.
    let accept_tx = tx.clone();
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok(accepting) => {
                    let tx = accept_tx.clone();
                    let limits = limits.clone();
                    let chan = ChannelId(chan_ids.fetch_add(1, Ordering::Relaxed));
                    tokio::spawn(async move {
                        let peer = accepting.peer_addr();
                        match accepting.handshake().await {
                            Ok(link) => start_link(chan, link, false, limits, tx).await,
                            Err(e) => warn!(%peer, error = %e, "incoming link failed"),
                        }
                    });
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
        address: cfg.or_port,
        bandwidth: if cfg.bandwidth_rate > 0 {
            cfg.bandwidth_rate
        } else {
            UNLIMITED_BANDWIDTH
        },
        exit_policy: (*policy).clone(),
        features: FeatureSet::EMPTY.0,
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
    driver.run().await;
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
    let stop_tx = tx.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        info!("stopping on signal");
        let _ = stop_tx.send(Input::Shutdown).await;
    });
    tokio::spawn(async move {
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match load_config::<RelayConfig>(&config).and_then(|c| c.validate().map(|_| c)) {
                Ok(c) => {
                    read_bucket.set_rate(c.bandwidth_rate, c.burst());
                    write_bucket.set_rate(c.bandwidth_rate, c.burst());
                    info!(
                        rate = c.bandwidth_rate,
                        burst = c.burst(),
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
