//! `chive authority`: the directory authority. Relays POST signed descriptors to it;
//! it publishes a signed consensus every `ConsensusInterval` seconds (and right away
//! when a relay appears for the first time, so a test network bootstraps quickly),
//! served over HTTP/1.1 at `GET /consensus`.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use chive_crypto::{IdentityKey, IdentityKeypair};
use chive_dir::{
    build_consensus, valid_nickname, FlagPolicy, NetParams, RelayDescriptor, MAX_DESCRIPTOR_LEN,
    MAX_RELAYS,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::common::{init_logging, load_config, load_identity, unix_now, write_ports_file};

/// Command-line arguments of `chive authority`.
#[derive(clap::Args, Debug)]
#[command(after_help = AUTHORITY_CONFIG_HELP)]
pub struct Args {
    /// TOML config file (see below for its options).
    #[arg(long)]
    pub config: PathBuf,
    /// Create the identity key if it is missing, print the identity (64 hex digits) on
    /// stdout and exit.
    #[arg(long)]
    pub print_identity: bool,
}

const AUTHORITY_CONFIG_HELP: &str = "\
Config file options (TOML):
  Nickname = \"auth\"                1-19 letters or digits (required)
  DataDirectory = \"/path/auth\"     keys/identity.key and the latest consensus live here (required)
  DirPort = \"127.0.0.1:7000\"       HTTP listen address: GET /consensus, GET /identity,
                                   POST /descriptor, POST and GET /onion/<address>
                                   (onion-service descriptors) (required)
  ConsensusInterval = 60           seconds between consensuses (1-86400)
  ConsensusValidity = 0            seconds a consensus stays valid; 0 = 3 x ConsensusInterval
  DescriptorLifetime = 0           drop relays whose last descriptor arrived longer ago;
                                   0 = 3 x ConsensusInterval, at least 90 s (three of a
                                   relay's default 30 s PublishInterval)
  TestingAllGuards = false         give Guard to every Fast relay (test networks)
  TestingMinFastFlagThreshold = 0  bytes/s a relay needs for the Fast flag
  StableUptime = 0                 seconds of uptime a relay needs for the Stable flag
  Log = \"info\"                     log filter (env CHIVE_LOG overrides)
  PortsFile = \"ports.json\"        once DirPort is bound, its address as JSON ({\"DirPort\":
                                   \"127.0.0.1:40123\"}; relative: in the DataDirectory; written
                                   whole, then renamed into place). With port 0 in DirPort the
                                   kernel picks a free port, and this file says which. Default none
  [NetworkParameters]              integers published in the consensus, e.g.
  circwindow = 1000                initial circuit window (100-1000)
  cc_alg = 0                       circuit congestion control: 0 fixed window, 2 Vegas
                                   (tunables cc_cwnd_init, cc_vegas_alpha_exit, ...:
                                   docs/protocol.md)";

/// Clock skew tolerated on a descriptor's `published` time (seconds into the future).
const DESCRIPTOR_FUTURE_SKEW: u64 = 300;
/// Minimum default descriptor lifetime: three of a relay's default 30 s publish intervals.
const MIN_DEFAULT_LIFETIME: u64 = 90;
/// Concurrent HTTP connections served; more are dropped at accept.
const MAX_CONNECTIONS: usize = 256;
/// A whole HTTP connection may last this long (slow clients cannot hold a slot forever).
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// Wait this long after a new relay appears before publishing, so relays starting
/// together land in one consensus.
const NEW_RELAY_DEBOUNCE: Duration = Duration::from_millis(200);

/// The authority's config file, Tor-style names.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct AuthorityConfig {
    nickname: String,
    data_directory: PathBuf,
    dir_port: SocketAddr,
    #[serde(default = "default_interval")]
    consensus_interval: u64,
    #[serde(default)]
    consensus_validity: u64,
    #[serde(default)]
    descriptor_lifetime: u64,
    #[serde(default)]
    testing_all_guards: bool,
    #[serde(default)]
    testing_min_fast_flag_threshold: u64,
    #[serde(default)]
    stable_uptime: u64,
    #[serde(default = "default_log")]
    log: String,
    #[serde(default)]
    network_parameters: BTreeMap<String, i64>,
    /// Where the bound DirPort address is written (see the help).
    #[serde(default)]
    ports_file: Option<PathBuf>,
}

fn default_interval() -> u64 {
    60
}
fn default_log() -> String {
    "info".to_string()
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub nickname: String,
    pub data_dir: PathBuf,
    pub dir_port: SocketAddr,
    pub interval: u64,
    pub validity: u64,
    pub lifetime: u64,
    pub flags: FlagPolicy,
    pub params: NetParams,
    pub log: String,
    pub ports_file: Option<PathBuf>,
}

impl AuthorityConfig {
    /// Check values; errors name the offending option.
    pub(crate) fn validate(self) -> anyhow::Result<Settings> {
        if !valid_nickname(&self.nickname) {
            bail!(
                "Nickname {:?} must be 1-19 ASCII letters or digits",
                self.nickname
            );
        }
        if !(1..=86_400).contains(&self.consensus_interval) {
            bail!(
                "ConsensusInterval must be 1-86400 seconds, got {}",
                self.consensus_interval
            );
        }
        let validity = match self.consensus_validity {
            0 => 3 * self.consensus_interval,
            v if v < self.consensus_interval => bail!(
                "ConsensusValidity ({v}) must be at least ConsensusInterval ({}), or 0",
                self.consensus_interval
            ),
            v => v,
        };
        let lifetime = match self.descriptor_lifetime {
            0 => (3 * self.consensus_interval).max(MIN_DEFAULT_LIFETIME),
            v => v,
        };
        let params = NetParams::from_map(self.network_parameters)
            .and_then(|p| p.check_known().map(|()| p))
            .map_err(|e| anyhow::anyhow!("[NetworkParameters]: {e}"))?;
        Ok(Settings {
            nickname: self.nickname,
            data_dir: self.data_directory,
            dir_port: self.dir_port,
            interval: self.consensus_interval,
            validity,
            lifetime,
            flags: FlagPolicy {
                fast_min: self.testing_min_fast_flag_threshold,
                stable_min_uptime: self.stable_uptime,
                all_guards: self.testing_all_guards,
            },
            params,
            log: self.log,
            ports_file: self.ports_file,
        })
    }
}

/// A relay the authority knows about.
struct Entry {
    desc: RelayDescriptor,
    /// When the latest descriptor arrived, by the authority's clock (immune to the
    /// relay's clock being off).
    received: u64,
}

#[derive(Default)]
struct State {
    relays: HashMap<IdentityKey, Entry>,
    consensus: Option<Arc<str>>,
}

/// The running authority: keys, settings and the relay table.
pub(crate) struct Authority {
    key: IdentityKeypair,
    settings: Settings,
    state: Mutex<State>,
    new_relay: Notify,
    /// Onion-service descriptors (`onion_dir.rs`).
    onions: crate::onion_dir::OnionStore,
}

impl Authority {
    pub(crate) fn new(key: IdentityKeypair, settings: Settings) -> Authority {
        Authority {
            key,
            settings,
            state: Mutex::new(State::default()),
            new_relay: Notify::new(),
            onions: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the table half-updated in a
        // harmful way (each update is one insert), so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Verify and store a descriptor. Returns whether the relay is new.
    pub(crate) fn accept_descriptor(
        &self,
        doc: &str,
        now: u64,
    ) -> Result<(RelayDescriptor, bool), String> {
        let desc = RelayDescriptor::verify(doc).map_err(|e| e.to_string())?;
        if desc.published > now.saturating_add(DESCRIPTOR_FUTURE_SKEW) {
            return Err(format!(
                "descriptor published {} s in the future; check the relay's clock",
                desc.published - now
            ));
        }
        if desc.published.saturating_add(self.settings.lifetime) < now {
            return Err(format!(
                "descriptor published {} s ago, older than DescriptorLifetime ({} s)",
                now - desc.published,
                self.settings.lifetime
            ));
        }
        let mut st = self.lock();
        let is_new = match st.relays.get(&desc.identity) {
            Some(old) if old.desc.published > desc.published => {
                return Err(format!(
                    "descriptor published at {} is older than the one already held ({})",
                    desc.published, old.desc.published
                ));
            }
            Some(_) => false,
            None => {
                if st.relays.len() >= MAX_RELAYS {
                    return Err(format!("relay table full ({MAX_RELAYS} relays)"));
                }
                if let Some(other) = st
                    .relays
                    .values()
                    .find(|e| e.desc.nickname.eq_ignore_ascii_case(&desc.nickname))
                {
                    warn!(
                        nickname = %desc.nickname,
                        other = %other.desc.identity,
                        "two relays use the same nickname; .exit notation will pick one"
                    );
                }
                true
            }
        };
        st.relays.insert(
            desc.identity,
            Entry {
                desc: desc.clone(),
                received: now,
            },
        );
        drop(st);
        if is_new {
            self.new_relay.notify_one();
        }
        Ok((desc, is_new))
    }

    /// Drop stale relays, build and sign a consensus, keep it as the latest.
    /// Returns the document and the number of relays in it.
    pub(crate) fn publish(&self, now: u64) -> (Arc<str>, usize) {
        let mut st = self.lock();
        let lifetime = self.settings.lifetime;
        st.relays.retain(|id, e| {
            let keep = e.received.saturating_add(lifetime) >= now;
            if !keep {
                info!(nickname = %e.desc.nickname, identity = %id, "relay dropped: no descriptor for {lifetime} s");
            }
            keep
        });
        let descs: Vec<RelayDescriptor> = st.relays.values().map(|e| e.desc.clone()).collect();
        let consensus = build_consensus(
            &descs,
            self.settings.params.clone(),
            &self.settings.flags,
            now,
            self.settings.interval,
            self.settings.validity,
        );
        let doc: Arc<str> = Arc::from(consensus.sign(&self.key));
        st.consensus = Some(doc.clone());
        (doc, consensus.relays.len())
    }

    fn latest(&self) -> Option<Arc<str>> {
        self.lock().consensus.clone()
    }

    /// Publish, log, and save a copy to DataDirectory/consensus for debugging.
    async fn publish_and_save(&self) {
        let now = unix_now();
        let (doc, n) = self.publish(now);
        info!(
            relays = n,
            valid_until = now + self.settings.validity,
            "published consensus"
        );
        if let Err(e) =
            write_atomically(&self.settings.data_dir.join("consensus"), doc.as_bytes()).await
        {
            warn!(error = %format!("{e:#}"), "cannot save the consensus to DataDirectory");
        }
    }
}

/// Write via a temporary file and rename, so readers never see half a document.
async fn write_atomically(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, data)
        .await
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    tokio::fs::rename(&tmp, path)
        .await
        .with_context(|| format!("cannot rename to {}", path.display()))?;
    Ok(())
}

/// Publish every interval, and shortly after a new relay appears.
pub(crate) async fn publish_loop(auth: Arc<Authority>) {
    let mut ticker = tokio::time::interval(Duration::from_secs(auth.settings.interval));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; wait for a relay or a full interval instead, so the
    // first consensus is not an empty one.
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = auth.new_relay.notified() => {
                tokio::time::sleep(NEW_RELAY_DEBOUNCE).await;
            }
        }
        auth.publish_and_save().await;
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// One HTTP request.
pub(crate) async fn handle(
    auth: Arc<Authority>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = match (req.method(), req.uri().path()) {
        (&Method::POST, "/descriptor") => {
            let body = match Limited::new(req.into_body(), MAX_DESCRIPTOR_LEN)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    warn!(%peer, error = %e, "descriptor rejected: unreadable or larger than 64 KiB");
                    return Ok(text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "descriptor unreadable or larger than {MAX_DESCRIPTOR_LEN} bytes\n"
                        ),
                    ));
                }
            };
            let Ok(doc) = std::str::from_utf8(&body) else {
                warn!(%peer, "descriptor rejected: not UTF-8");
                return Ok(text(
                    StatusCode::BAD_REQUEST,
                    "descriptor is not UTF-8 text\n",
                ));
            };
            match auth.accept_descriptor(doc, unix_now()) {
                Ok((d, is_new)) => {
                    if is_new {
                        info!(%peer, nickname = %d.nickname, identity = %d.identity, address = %d.address,
                              exit = d.exit_policy.is_exit(), "new relay descriptor accepted");
                    } else {
                        debug!(%peer, nickname = %d.nickname, "relay descriptor refreshed");
                    }
                    text(StatusCode::OK, "accepted\n")
                }
                Err(reason) => {
                    warn!(%peer, %reason, "descriptor rejected");
                    text(StatusCode::BAD_REQUEST, format!("{reason}\n"))
                }
            }
        }
        (&Method::GET, "/consensus") => match auth.latest() {
            Some(doc) => text(StatusCode::OK, Bytes::copy_from_slice(doc.as_bytes())),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "no consensus yet\n"),
        },
        (&Method::GET, "/identity") => {
            text(StatusCode::OK, format!("{}\n", auth.key.public().to_hex()))
        }
        (m, p) if p.starts_with(crate::onion_dir::ONION_PATH) => {
            return Ok(onion_request(&auth, peer, m.clone(), p.to_string(), req).await)
        }
        (_, "/descriptor" | "/consensus" | "/identity") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(resp)
}

/// `POST` / `GET /onion/<address>`: the onion descriptor store.
async fn onion_request(
    auth: &Authority,
    peer: SocketAddr,
    method: Method,
    path: String,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    use crate::onion_dir::parse_path;
    let fail = |e: crate::onion_dir::StoreError| {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
        text(status, format!("{}\n", e.reason))
    };
    let addr = match parse_path(&path) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    match method {
        Method::GET => match auth.onions.get(&addr, unix_now()) {
            Some(doc) => text(StatusCode::OK, Bytes::copy_from_slice(doc.as_bytes())),
            None => text(StatusCode::NOT_FOUND, "no descriptor for this address\n"),
        },
        Method::POST => {
            let limit = chive_dir::MAX_ONION_DESCRIPTOR_LEN;
            let Ok(body) = Limited::new(req.into_body(), limit).collect().await else {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("onion descriptor unreadable or larger than {limit} bytes\n"),
                );
            };
            let body = body.to_bytes();
            let Ok(doc) = std::str::from_utf8(&body) else {
                return text(StatusCode::BAD_REQUEST, "descriptor is not UTF-8 text\n");
            };
            match auth.onions.accept(&addr, doc, unix_now()) {
                Ok(rev) => {
                    info!(%peer, address = %addr, revision = rev, "onion descriptor accepted");
                    text(StatusCode::OK, "accepted\n")
                }
                Err(e) => {
                    warn!(%peer, address = %addr, reason = %e.reason, "onion descriptor refused");
                    fail(e)
                }
            }
        }
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
    }
}

/// Serve HTTP on `listener` until the task is dropped.
pub(crate) async fn serve(auth: Arc<Authority>, listener: TcpListener) -> anyhow::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            warn!(%peer, "too many HTTP connections; dropping one");
            continue;
        };
        let auth = auth.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(auth.clone(), peer, req));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, error = %e, "HTTP connection error"),
                Err(_) => debug!(%peer, "HTTP connection closed: took too long"),
            }
            drop(permit);
        });
    }
}

/// Resolve on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Run `chive authority`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let cfg: AuthorityConfig = load_config(&args.config)?;
    let settings = cfg
        .validate()
        .with_context(|| format!("bad config file {}", args.config.display()))?;
    if args.print_identity {
        let key = load_identity(&settings.data_dir)?;
        println!("{}", key.public().to_hex());
        return Ok(());
    }
    init_logging(&settings.log);
    std::fs::create_dir_all(&settings.data_dir).with_context(|| {
        format!(
            "cannot create DataDirectory {}",
            settings.data_dir.display()
        )
    })?;
    let key = load_identity(&settings.data_dir)?;
    let listener = TcpListener::bind(settings.dir_port)
        .await
        .with_context(|| format!("cannot listen on DirPort {}", settings.dir_port))?;
    let dir_addr = listener.local_addr()?;
    write_ports_file(
        &settings.data_dir,
        settings.ports_file.as_deref(),
        &[("DirPort", dir_addr)],
    )?;
    info!(
        nickname = %settings.nickname,
        identity = %key.public(),
        dir_port = %dir_addr,
        interval = settings.interval,
        "authority started"
    );
    let auth = Arc::new(Authority::new(key, settings));
    let publisher = tokio::spawn(publish_loop(auth.clone()));
    let result = tokio::select! {
        r = serve(auth, listener) => r,
        _ = shutdown_signal() => {
            info!("authority stopping");
            Ok(())
        }
    };
    publisher.abort();
    result
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chive_dir::{Consensus, ExitPolicy, RelayFlags};

    /// Settings from a TOML snippet (DataDirectory given).
    pub(crate) fn settings(data_dir: &Path, extra: &str) -> Settings {
        let text = format!(
            "Nickname = \"auth\"\nDataDirectory = {:?}\nDirPort = \"127.0.0.1:0\"\n{extra}",
            data_dir.display().to_string()
        );
        let cfg: AuthorityConfig = toml::from_str(&text).unwrap();
        cfg.validate().unwrap()
    }

    /// A descriptor for test relay `n`, published at `published`.
    pub(crate) fn descriptor(n: u8, published: u64) -> (RelayDescriptor, IdentityKeypair) {
        let kp = IdentityKeypair::from_secret_bytes(&[n; 32]);
        let d = RelayDescriptor {
            nickname: format!("relay{n}"),
            identity: kp.public(),
            ntor_key: [n; 32],
            address: SocketAddr::from(([127, 0, 0, 1], 9000 + u16::from(n))),
            bandwidth: 1_000_000,
            exit_policy: ExitPolicy::parse(&["accept 127.0.0.0/8:*", "reject *:*"], false).unwrap(),
            features: 0,
            published,
            uptime: 10,
            version: "chive test".into(),
        };
        (d, kp)
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("chive-auth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn config_defaults_and_errors() {
        let dir = tmpdir("cfg");
        let s = settings(&dir, "ConsensusInterval = 5\nTestingAllGuards = true\n[NetworkParameters]\ncircwindow = 101\n");
        assert_eq!((s.interval, s.validity, s.lifetime), (5, 15, 90));
        assert!(s.flags.all_guards);
        assert_eq!(s.params.circwindow(), 101);
        let s = settings(
            &dir,
            "ConsensusInterval = 100\nConsensusValidity = 250\nDescriptorLifetime = 7",
        );
        assert_eq!((s.validity, s.lifetime), (250, 7));
        let s = settings(&dir, "");
        assert_eq!((s.interval, s.validity, s.lifetime), (60, 180, 180));

        let parse = |extra: &str| -> anyhow::Result<Settings> {
            let text = format!(
                "Nickname = \"auth\"\nDataDirectory = \"/x\"\nDirPort = \"127.0.0.1:1\"\n{extra}"
            );
            toml::from_str::<AuthorityConfig>(&text)?.validate()
        };
        let err = |extra: &str| format!("{:#}", parse(extra).unwrap_err());
        assert!(err("Bogus = 1").contains("Bogus"));
        assert!(err("ConsensusInterval = 0").contains("ConsensusInterval"));
        assert!(err("ConsensusInterval = 10\nConsensusValidity = 5").contains("ConsensusValidity"));
        assert!(err("[NetworkParameters]\ncircwindow = \"big\"").contains("circwindow"));
        assert!(err("[NetworkParameters]\n\"bad name\" = 1").contains("NetworkParameters"));
        assert!(err("[NetworkParameters]\ncircwindow = 5000").contains("circwindow = 5000"));
        assert!(parse("[NetworkParameters]\ncircwindow = 101\nFutureKnob = 123456").is_ok());
        let text = "Nickname = \"a-b\"\nDataDirectory = \"/x\"\nDirPort = \"127.0.0.1:1\"";
        let e = toml::from_str::<AuthorityConfig>(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("Nickname"));
        assert!(toml::from_str::<AuthorityConfig>(
            "Nickname = \"a\"\nDataDirectory = \"/x\"\nDirPort = \"nope\""
        )
        .is_err());
    }

    #[test]
    fn descriptor_acceptance_and_expiry() {
        let dir = tmpdir("accept");
        let auth = Authority::new(
            IdentityKeypair::from_secret_bytes(&[200; 32]),
            settings(&dir, "ConsensusInterval = 10\nDescriptorLifetime = 100"),
        );
        let now = 1_700_000_000;
        let (d1, k1) = descriptor(1, now);
        assert!(
            auth.accept_descriptor(&d1.sign(&k1), now).unwrap().1,
            "first time: new"
        );
        let (d1b, _) = descriptor(1, now + 5);
        assert!(
            !auth.accept_descriptor(&d1b.sign(&k1), now + 5).unwrap().1,
            "refresh: not new"
        );
        let err = auth.accept_descriptor(&d1.sign(&k1), now + 6).unwrap_err();
        assert!(err.contains("older than the one already held"), "{err}");
        let (future, kf) = descriptor(2, now + 10_000);
        assert!(auth
            .accept_descriptor(&future.sign(&kf), now)
            .unwrap_err()
            .contains("future"));
        let (old, ko) = descriptor(3, now - 1000);
        assert!(auth
            .accept_descriptor(&old.sign(&ko), now)
            .unwrap_err()
            .contains("DescriptorLifetime"));
        let mut tampered = d1b.sign(&k1);
        tampered = tampered.replacen("relay1", "relay9", 1);
        assert!(auth
            .accept_descriptor(&tampered, now + 6)
            .unwrap_err()
            .contains("signature"));

        let (d4, k4) = descriptor(4, now + 50);
        auth.accept_descriptor(&d4.sign(&k4), now + 50).unwrap();
        let auth_key = IdentityKeypair::from_secret_bytes(&[200; 32]).public();
        let (doc, n) = auth.publish(now + 60);
        assert_eq!(n, 2);
        let c = Consensus::verify(&doc, &auth_key, now + 60).unwrap();
        assert_eq!(c.valid_until, now + 60 + 30);
        assert!(c.relay_by_nickname("relay1").is_some() && c.relay_by_nickname("relay4").is_some());
        assert!(c
            .relays
            .iter()
            .all(|r| r.flags.contains(RelayFlags::EXIT | RelayFlags::RUNNING)));
        // relay1 last heard at now+5: gone after 100 s; relay4 (now+50) stays.
        let (doc, n) = auth.publish(now + 120);
        assert_eq!(n, 1);
        let c = Consensus::verify(&doc, &auth_key, now + 120).unwrap();
        assert!(c.relay_by_nickname("relay1").is_none());
        assert_eq!(auth.latest().as_deref(), Some(&*doc));
    }
}
