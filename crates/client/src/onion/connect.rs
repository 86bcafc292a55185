//! A client's connections to onion services: the policy around
//! `chive_core::onion::ClientRendezvous`.
//!
//! Connections are keyed by address and SOCKS isolation ([`ConnectKey`]). For a key with no
//! joined circuit, [`OnionConnector::connect`] (given a verified descriptor) starts an
//! attempt: a rendezvous circuit to a relay of the client's choice (ESTABLISH_RENDEZVOUS with a
//! fresh cookie) and, in parallel, an introduction circuit to one of the descriptor's
//! introduction points; INTRODUCE1 goes once the rendezvous point has answered and the
//! introduction circuit is built; an INTRODUCE_ACK that says yes closes the introduction
//! circuit, RENDEZVOUS2 finishes hs-ntor and the virtual hop is attached. Then every waiting
//! request opens its stream (BEGIN) on the joined circuit, and later requests for the key open
//! theirs at once ([`OnionConnector::attach`]) while the circuit lives and is younger than
//! `max_dirtiness`.
//!
//! Failures: a refused introduction or a lost introduction circuit (0xF2), a lost rendezvous
//! circuit or a RENDEZVOUS2 that does not authenticate (0xF3), an attempt not finished within
//! `attempt_timeout` (0xF7). Each starts a new attempt (new cookie, another introduction point
//! while untried ones remain) up to `max_attempts`; then every waiting request fails with the
//! last failure's code. So a request always ends, at the latest after
//! `max_attempts × attempt_timeout`.
//!
//! Descriptors: the caller fetches and verifies them; the connector keeps them in a
//! [`DescriptorCache`] ([`OnionConnector::store_descriptor`], [`OnionConnector::cached_descriptor`])
//! until they expire, and drops a service's descriptor when an attempt through one of its
//! introduction points fails (0xF2 or 0xF7), so the next request fetches it again.
//!
//! Predicted circuits ([`super::pool`]): from the first connection on, the connector keeps
//! `predicted` built circuits for each kind of path (rendezvous, introduction). A rendezvous
//! circuit is a whole predicted circuit whose last hop becomes the rendezvous point (as Tor's
//! client does), so ESTABLISH_RENDEZVOUS goes at once; an introduction circuit is a predicted
//! one extended to the intro point. Either is built from scratch when none fits.
//!
//! Each joined connection leaves a [`JoinTiming`] ([`OnionConnector::poll_join_timing`]): when,
//! after the attempt started, each step of the protocol finished, to see where set-up time goes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::RelayCommand;
use chive_core::onion::ClientRendezvous;
use chive_core::{CircKey, Core, HopSpec, StreamHandle};
use chive_crypto::hs_ntor::HsIntroPublic;
use chive_crypto::{IdentityKey, OnionAddress};
use chive_dir::{Consensus, OnionDescriptor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tracing::{debug, info, warn};

use super::desc_cache::{DescriptorCache, DEFAULT_MAX_DESCRIPTORS};
use super::pool::{launch_or_extend, InternalPool, PoolCounters, DEFAULT_PREDICTED};
use super::{hop_of, path_to, usable_relays, OnionPaths, LONG_ONION_HOPS, SHORT_ONION_HOPS};
use crate::socks::{OnionSocksError, SocksReply};

/// A connection's identity: the service and the SOCKS isolation key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnectKey {
    /// The service.
    pub address: OnionAddress,
    /// SOCKS credentials (as `CircuitManager`'s isolation key).
    pub isolation: Vec<u8>,
}

/// What became of a request (by its ticket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnionOutcome {
    /// The stream's BEGIN went out on the joined circuit: watch the handle for
    /// CONNECTED / END.
    Started(StreamHandle),
    /// The connection failed.
    Failed(SocksReply),
}

/// Connector settings.
#[derive(Clone, Debug)]
pub struct ConnectorConfig {
    /// Attempts (each with a fresh rendezvous cookie) before a request fails.
    pub max_attempts: u32,
    /// Time one attempt may take, from launching its circuits to RENDEZVOUS2 (the client's
    /// `OnionAttemptTimeout`; Tor has no single equivalent).
    pub attempt_timeout: Duration,
    /// A joined circuit takes new streams for this long after it joined (Tor's
    /// MaxCircuitDirtiness); then it is closed once idle.
    pub max_dirtiness: Duration,
    /// Requests that may wait on one attempt; more fail at once.
    pub max_waiting: usize,
    /// EntryNodes / MiddleNodes.
    pub paths: OnionPaths,
    /// Services whose descriptors are cached.
    pub max_descriptors: usize,
    /// Predicted circuits kept for each kind of path (`OnionPredictedCircuits`; 0: none).
    pub predicted: usize,
}

/// The connector's counters (for the client's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectorCounters {
    /// Attempts started (each with its own rendezvous cookie).
    pub attempts: u64,
    /// Attempts that ended with a joined rendezvous circuit.
    pub joined: u64,
    /// Attempts that failed at the introduction (refused, or its circuit lost): 0xF2.
    pub intro_failed: u64,
    /// Attempts that failed at the rendezvous (its circuit lost, RENDEZVOUS2 unauthentic): 0xF3.
    pub rendezvous_failed: u64,
    /// Attempts past `attempt_timeout`: 0xF7.
    pub timed_out: u64,
    /// Requests that failed (after their last attempt, or at once).
    pub requests_failed: u64,
    /// Descriptors fetched and verified.
    pub descriptors_fetched: u64,
    /// Descriptors fetched that did not verify (bad signature, expired, another address,
    /// malformed): 0xF1.
    pub descriptors_refused: u64,
    /// Fetches the directory answered with no descriptor: 0xF0.
    pub descriptors_not_found: u64,
    /// Requests served from the descriptor cache (no fetch).
    pub descriptor_cache_hits: u64,
    /// Cached descriptors dropped after an introduction failure.
    pub descriptors_dropped: u64,
    /// Circuits to a point that were predicted circuits (extended by one hop, or, for the
    /// rendezvous, ending at the point it became).
    pub predicted_used: u64,
}

/// Where one connection's set-up time went: each step's end, measured from the start of the
/// attempt that joined (its circuits launched). `None`: the step did not happen in that
/// attempt (an INTRODUCE_ACK may come after RENDEZVOUS2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTiming {
    /// The service.
    pub address: OnionAddress,
    /// The attempt's number (1 = the first).
    pub attempt: u32,
    /// The rendezvous circuit was built.
    pub rend_built: Option<Duration>,
    /// RENDEZVOUS_ESTABLISHED arrived.
    pub rend_ready: Option<Duration>,
    /// The introduction circuit was built.
    pub intro_built: Option<Duration>,
    /// INTRODUCE1 went out (both of the above done).
    pub introduced: Option<Duration>,
    /// INTRODUCE_ACK arrived.
    pub acked: Option<Duration>,
    /// RENDEZVOUS2 arrived and authenticated: the circuit joined.
    pub joined: Duration,
    /// The rendezvous circuit was a predicted circuit (its last hop became the point).
    pub rend_predicted: bool,
    /// The introduction circuit was a predicted circuit extended to the point.
    pub intro_predicted: bool,
    /// When it joined.
    pub at: Instant,
}

impl Default for ConnectorConfig {
    fn default() -> Self {
        ConnectorConfig {
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(30),
            max_dirtiness: Duration::from_secs(600),
            max_waiting: 64,
            paths: OnionPaths::default(),
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            predicted: DEFAULT_PREDICTED,
        }
    }
}

struct Waiter {
    ticket: u64,
    host: String,
    port: u16,
}

/// One attempt in flight for a key.
struct Attempt {
    desc: OnionDescriptor,
    conn: ClientRendezvous,
    rend: CircKey,
    rp: HopSpec,
    rend_ready: bool,
    intro: Option<CircKey>,
    intro_built: bool,
    intro_sent: bool,
    acked: bool,
    /// Indexes of intro points tried, the current one last.
    tried: Vec<usize>,
    number: u32,
    deadline: Instant,
    started: Instant,
    waiters: Vec<Waiter>,
    /// When each step ended (for [`JoinTiming`]).
    marks: Marks,
    /// Which circuits were predicted ones (rendezvous, introduction).
    predicted: (bool, bool),
}

#[derive(Default)]
struct Marks {
    rend_built: Option<Instant>,
    rend_ready: Option<Instant>,
    intro_built: Option<Instant>,
    introduced: Option<Instant>,
    acked: Option<Instant>,
}

struct Joined {
    circ: CircKey,
    since: Instant,
}

/// Which attempt and role a circuit has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CircRole {
    Rend,
    Intro,
    Joined,
}

/// The client's onion connections. See the module docs.
pub struct OnionConnector {
    cfg: ConnectorConfig,
    consensus: Option<Arc<Consensus>>,
    attempts: HashMap<ConnectKey, Attempt>,
    joined: HashMap<ConnectKey, Joined>,
    circs: HashMap<CircKey, (ConnectKey, CircRole)>,
    outcomes: VecDeque<(u64, OnionOutcome)>,
    next_ticket: u64,
    guard: Option<IdentityKey>,
    rng: StdRng,
    cache: DescriptorCache,
    timings: VecDeque<JoinTiming>,
    pool: InternalPool,
    /// Counters.
    pub counters: ConnectorCounters,
}

/// Join timings kept for [`OnionConnector::poll_join_timing`]; older ones are dropped.
const MAX_TIMINGS: usize = 256;

impl OnionConnector {
    /// A connector; `seed` feeds cookies, keys and paths.
    pub fn new(cfg: ConnectorConfig, seed: [u8; 32]) -> Self {
        let cfg_max_descriptors = cfg.max_descriptors;
        let pool = InternalPool::new(cfg.predicted, &[SHORT_ONION_HOPS, LONG_ONION_HOPS], false)
            .with_whole(&[SHORT_ONION_HOPS]);
        OnionConnector {
            cfg,
            consensus: None,
            attempts: HashMap::new(),
            joined: HashMap::new(),
            circs: HashMap::new(),
            outcomes: VecDeque::new(),
            next_ticket: 1,
            guard: None,
            rng: StdRng::from_seed(seed),
            cache: DescriptorCache::new(cfg_max_descriptors),
            timings: VecDeque::new(),
            pool,
            counters: ConnectorCounters::default(),
        }
    }

    /// Use a new verified consensus (paths are chosen from it).
    pub fn set_consensus(&mut self, consensus: Arc<Consensus>) {
        if let Some(g) = self.guard {
            if consensus.relay_by_identity(&g).is_none() {
                self.guard = None;
            }
        }
        self.consensus = Some(consensus);
    }

    /// A verified descriptor of `address` held in the cache and valid at `now_unix`.
    pub fn cached_descriptor(
        &mut self,
        address: &OnionAddress,
        now_unix: u64,
    ) -> Option<OnionDescriptor> {
        let d = self.cache.get(address, now_unix);
        if d.is_some() {
            self.counters.descriptor_cache_hits += 1;
        }
        d
    }

    /// A descriptor the caller fetched and verified: keep it until it expires.
    pub fn store_descriptor(&mut self, desc: OnionDescriptor, now_unix: u64) {
        self.counters.descriptors_fetched += 1;
        self.cache.insert(desc, now_unix);
    }

    /// Count a fetch that failed: `refused` (did not verify) or not found.
    pub fn descriptor_fetch_failed(&mut self, refused: bool) {
        if refused {
            self.counters.descriptors_refused += 1;
        } else {
            self.counters.descriptors_not_found += 1;
        }
    }

    /// Descriptors in the cache.
    pub fn cached_descriptors(&self) -> usize {
        self.cache.len()
    }

    /// Next join timing (one per joined connection, oldest first, at most 256 kept).
    pub fn poll_join_timing(&mut self) -> Option<JoinTiming> {
        self.timings.pop_front()
    }

    /// Next finished request.
    pub fn poll_outcome(&mut self) -> Option<(u64, OnionOutcome)> {
        self.outcomes.pop_front()
    }

    /// Does this connector own `circ`?
    pub fn owns(&self, circ: CircKey) -> bool {
        self.circs.contains_key(&circ) || self.pool.owns(circ)
    }

    /// The predicted circuits' counters.
    pub fn pool_counters(&self) -> PoolCounters {
        self.pool.counters
    }

    /// Predicted circuits built and waiting.
    pub fn predicted_ready(&self) -> usize {
        self.pool.ready()
    }

    /// The joined circuit for `key`, if one is usable now.
    pub fn joined_circuit(&self, key: &ConnectKey) -> Option<CircKey> {
        self.joined.get(key).map(|j| j.circ)
    }

    fn ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    fn fail(&mut self, ticket: u64, code: SocksReply) {
        self.counters.requests_failed += 1;
        self.outcomes
            .push_back((ticket, OnionOutcome::Failed(code)));
    }

    /// A request for `key` that needs no descriptor: a stream on the joined circuit, or a
    /// place among the waiters of the attempt in flight. `None` if there is neither (fetch
    /// the descriptor, then call [`OnionConnector::connect`]).
    pub fn attach(
        &mut self,
        core: &mut Core,
        key: &ConnectKey,
        host: &str,
        port: u16,
        now: Instant,
    ) -> Option<u64> {
        if let Some(j) = self.joined.get(key) {
            let fresh = now.duration_since(j.since) < self.cfg.max_dirtiness;
            if fresh && core.circuit_is_open(j.circ) {
                let circ = j.circ;
                let ticket = self.ticket();
                self.open_stream(core, circ, ticket, host, port, now);
                return Some(ticket);
            }
        }
        if self.attempts.contains_key(key) {
            let ticket = self.ticket();
            self.wait_on(key, ticket, host, port);
            return Some(ticket);
        }
        None
    }

    fn wait_on(&mut self, key: &ConnectKey, ticket: u64, host: &str, port: u16) {
        let max = self.cfg.max_waiting;
        let Some(a) = self.attempts.get_mut(key) else {
            return;
        };
        if a.waiters.len() >= max {
            return self.fail(ticket, SocksReply::GeneralFailure);
        }
        a.waiters.push(Waiter {
            ticket,
            host: host.to_string(),
            port,
        });
    }

    fn open_stream(
        &mut self,
        core: &mut Core,
        circ: CircKey,
        ticket: u64,
        host: &str,
        port: u16,
        now: Instant,
    ) {
        match core.open_stream(circ, host, port, now) {
            Ok(h) => self.outcomes.push_back((ticket, OnionOutcome::Started(h))),
            Err(e) => {
                warn!(?circ, error = %e, "cannot open a stream on the rendezvous circuit");
                self.fail(ticket, SocksReply::GeneralFailure);
            }
        }
    }

    /// A request for `key` with a verified descriptor: attach if possible, else start an
    /// attempt. Returns the request's ticket; its outcome comes from
    /// [`OnionConnector::poll_outcome`].
    pub fn connect(
        &mut self,
        core: &mut Core,
        key: ConnectKey,
        desc: OnionDescriptor,
        host: &str,
        port: u16,
        now: Instant,
    ) -> u64 {
        if let Some(t) = self.attach(core, &key, host, port, now) {
            return t;
        }
        let ticket = self.ticket();
        let waiters = vec![Waiter {
            ticket,
            host: host.to_string(),
            port,
        }];
        self.start_attempt(core, key, desc, waiters, Vec::new(), 1, now);
        ticket
    }

    #[allow(clippy::too_many_arguments)]
    fn start_attempt(
        &mut self,
        core: &mut Core,
        key: ConnectKey,
        desc: OnionDescriptor,
        waiters: Vec<Waiter>,
        mut tried: Vec<usize>,
        number: u32,
        now: Instant,
    ) {
        let fail_all = |this: &mut Self, waiters: Vec<Waiter>, why: String| {
            warn!(service = %key.address, %why, "cannot connect to the onion service");
            for w in waiters {
                this.fail(w.ticket, SocksReply::Onion(OnionSocksError::IntroFailed));
            }
        };
        let Some(consensus) = self.consensus.clone() else {
            return fail_all(self, waiters, "no consensus".into());
        };
        // An intro point not tried yet, else any; among them one our pinned paths
        // (EntryNodes/MiddleNodes) do not need, if there is one.
        let n = desc.intro_points.len();
        let mut untried: Vec<usize> = (0..n).filter(|i| !tried.contains(i)).collect();
        if untried.is_empty() {
            untried = (0..n).collect();
        }
        let pinned = |i: &usize| {
            consensus
                .relays
                .iter()
                .any(|r| r.identity == desc.intro_points[*i].relay && self.cfg.paths.pins(r))
        };
        let free: Vec<usize> = untried.iter().copied().filter(|i| !pinned(i)).collect();
        if !free.is_empty() {
            untried = free;
        }
        // And one a built whole rendezvous circuit does not end at, if there is one, so that
        // circuit can be the rendezvous circuit (see `take_whole` below).
        let ends = self.pool.ready_whole_ends(SHORT_ONION_HOPS);
        let fits: Vec<usize> = untried
            .iter()
            .copied()
            .filter(|i| ends.iter().any(|e| *e != desc.intro_points[*i].relay))
            .collect();
        if !fits.is_empty() {
            untried = fits;
        }
        let Some(&ii) = untried.choose(&mut self.rng) else {
            return fail_all(
                self,
                waiters,
                "descriptor lists no introduction point".into(),
            );
        };
        tried.push(ii);
        let ip = &desc.intro_points[ii];
        let Some(&ip_addr) = ip.addresses.first() else {
            return fail_all(self, waiters, "introduction point without address".into());
        };
        let intro_hop = HopSpec {
            identity: ip.relay,
            ntor_key: ip.onion_key,
            addr: ip_addr,
        };
        self.pool.note_used(now);
        // The rendezvous point: the last hop of a predicted whole circuit that does not end at
        // the intro point, if one is built (no EXTEND2 to wait for); else any usable relay but
        // the intro point (unless it is the only), and not one our pinned paths need (unless
        // only those are left).
        let whole = self.pool.take_whole(SHORT_ONION_HOPS, &ip.relay);
        if whole.is_none() {
            self.pool
                .retire_whole_ending_at(core, SHORT_ONION_HOPS, &ip.relay, now);
        }
        let paths = self.cfg.paths.clone();
        let intro_path = path_to(
            &consensus,
            &paths,
            self.guard.as_ref(),
            intro_hop,
            LONG_ONION_HOPS,
            &mut self.rng,
        );
        let intro_path = match intro_path {
            Ok(i) => i,
            Err(e) => {
                if let Some((c, _)) = whole {
                    core.close_circuit(c, now);
                }
                return fail_all(self, waiters, e);
            }
        };
        let (rend, rp, rend_predicted, rend_open) = if let Some((c, rp)) = whole {
            (c, rp, true, true)
        } else {
            let mut rps: Vec<_> = usable_relays(&consensus)
                .into_iter()
                .filter(|r| r.identity != ip.relay)
                .collect();
            if rps.is_empty() {
                rps = usable_relays(&consensus);
            }
            let free: Vec<_> = rps
                .iter()
                .copied()
                .filter(|r| !self.cfg.paths.pins(r))
                .collect();
            if !free.is_empty() {
                rps = free;
            }
            let Some(rp) = rps.choose(&mut self.rng).map(|r| hop_of(r)) else {
                return fail_all(self, waiters, "no relay for a rendezvous point".into());
            };
            let rend_path = match path_to(
                &consensus,
                &paths,
                self.guard.as_ref(),
                rp.clone(),
                SHORT_ONION_HOPS,
                &mut self.rng,
            ) {
                Ok(r) => r,
                Err(e) => return fail_all(self, waiters, e),
            };
            self.guard.get_or_insert(rend_path[0].identity);
            let (c, predicted) = launch_or_extend(&mut self.pool, core, rend_path, now);
            (c, rp, predicted, false)
        };
        self.guard.get_or_insert(intro_path[0].identity);
        let intro = HsIntroPublic {
            auth_key: ip.auth_key,
            enc_key: ip.enc_key,
            subcredential: key.address.subcredential(),
        };
        let conn = ClientRendezvous::new(&mut self.rng, intro);
        self.counters.attempts += 1;
        let (intro_circ, intro_predicted) = launch_or_extend(&mut self.pool, core, intro_path, now);
        self.counters.predicted_used += u64::from(rend_predicted) + u64::from(intro_predicted);
        info!(service = %key.address, attempt = number, ?rend, intro = ?intro_circ,
              rendezvous = %rp.identity, rend_predicted, intro_predicted,
              "connecting to onion service");
        self.circs.insert(rend, (key.clone(), CircRole::Rend));
        self.circs
            .insert(intro_circ, (key.clone(), CircRole::Intro));
        self.attempts.insert(
            key.clone(),
            Attempt {
                desc,
                conn,
                rend,
                rp,
                rend_ready: false,
                intro: Some(intro_circ),
                intro_built: false,
                intro_sent: false,
                acked: false,
                tried,
                number,
                deadline: now + self.cfg.attempt_timeout,
                started: now,
                waiters,
                marks: Marks::default(),
                predicted: (rend_predicted, intro_predicted),
            },
        );
        if rend_open {
            self.rend_built(core, rend, &key, now);
        }
    }

    /// The attempt for `key` failed with `why`: retry, or fail its waiters with `code`.
    fn attempt_failed(
        &mut self,
        core: &mut Core,
        key: &ConnectKey,
        code: OnionSocksError,
        why: &str,
        now: Instant,
    ) {
        let Some(a) = self.attempts.remove(key) else {
            return;
        };
        match code {
            OnionSocksError::IntroFailed => self.counters.intro_failed += 1,
            OnionSocksError::IntroTimedOut => self.counters.timed_out += 1,
            _ => self.counters.rendezvous_failed += 1,
        }
        if matches!(
            code,
            OnionSocksError::IntroFailed | OnionSocksError::IntroTimedOut
        ) && self.cache.remove(&key.address)
        {
            // The service may have moved its introduction points: fetch again next time.
            self.counters.descriptors_dropped += 1;
            debug!(service = %key.address, "cached descriptor dropped after an introduction failure");
        }
        for c in [Some(a.rend), a.intro].into_iter().flatten() {
            if self.circs.remove(&c).is_some() {
                core.close_circuit(c, now);
            }
        }
        if a.number < self.cfg.max_attempts {
            info!(service = %key.address, attempt = a.number, %why, "onion connection attempt failed; retrying");
            self.start_attempt(
                core,
                key.clone(),
                a.desc,
                a.waiters,
                a.tried,
                a.number + 1,
                now,
            );
        } else {
            warn!(service = %key.address, attempts = a.number, %why, code = SocksReply::Onion(code).v5_code(),
                  "onion connection failed");
            for w in a.waiters {
                self.fail(w.ticket, SocksReply::Onion(code));
            }
        }
    }

    /// A circuit was built.
    pub fn on_circuit_built(&mut self, core: &mut Core, circ: CircKey, now: Instant) {
        if self.pool.on_built(circ, now) {
            return;
        }
        let Some((key, role)) = self.circs.get(&circ).cloned() else {
            return;
        };
        let Some(a) = self.attempts.get_mut(&key) else {
            return;
        };
        match role {
            CircRole::Rend => self.rend_built(core, circ, &key, now),
            CircRole::Intro => {
                a.intro_built = true;
                a.marks.intro_built = Some(now);
                self.maybe_introduce(core, &key, now);
            }
            CircRole::Joined => {}
        }
    }

    /// The rendezvous circuit `circ` of `key`'s attempt is open: ESTABLISH_RENDEZVOUS.
    fn rend_built(&mut self, core: &mut Core, circ: CircKey, key: &ConnectKey, now: Instant) {
        let Some(a) = self.attempts.get_mut(key) else {
            return;
        };
        a.marks.rend_built = Some(now);
        let body = a.conn.establish_rendezvous();
        if let Err(e) =
            core.send_onion_message(circ, RelayCommand::ESTABLISH_RENDEZVOUS, &body, now)
        {
            let why = format!("ESTABLISH_RENDEZVOUS: {e}");
            self.attempt_failed(core, key, OnionSocksError::RendezvousFailed, &why, now);
        }
    }

    /// Send INTRODUCE1 once the rendezvous point waits and the introduction circuit is built.
    fn maybe_introduce(&mut self, core: &mut Core, key: &ConnectKey, now: Instant) {
        let Some(a) = self.attempts.get_mut(key) else {
            return;
        };
        let Some(intro) = a.intro else {
            return;
        };
        if !(a.rend_ready && a.intro_built) || a.intro_sent {
            return;
        }
        let sent = a
            .conn
            .introduce1(&mut self.rng, &a.rp)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                core.send_onion_message(intro, RelayCommand::INTRODUCE1, &body, now)
                    .map_err(|e| e.to_string())
            });
        match sent {
            Ok(()) => {
                a.intro_sent = true;
                a.marks.introduced = Some(now);
            }
            Err(e) => {
                let why = format!("INTRODUCE1: {e}");
                self.attempt_failed(core, key, OnionSocksError::IntroFailed, &why, now);
            }
        }
    }

    /// An onion message on one of the connector's circuits.
    pub fn on_onion_message(
        &mut self,
        core: &mut Core,
        circ: CircKey,
        command: RelayCommand,
        body: &[u8],
        now: Instant,
    ) {
        let Some((key, role)) = self.circs.get(&circ).cloned() else {
            return;
        };
        let Some(a) = self.attempts.get_mut(&key) else {
            return;
        };
        match (role, command) {
            (CircRole::Rend, RelayCommand::RENDEZVOUS_ESTABLISHED) => {
                a.rend_ready = true;
                a.marks.rend_ready = Some(now);
                self.maybe_introduce(core, &key, now);
            }
            (CircRole::Intro, RelayCommand::INTRODUCE_ACK) => match a.conn.on_introduce_ack(body) {
                Ok(()) => {
                    a.acked = true;
                    a.marks.acked = Some(now);
                    a.intro = None;
                    self.circs.remove(&circ);
                    core.close_circuit(circ, now);
                }
                Err(e) => {
                    let why = e.to_string();
                    self.attempt_failed(core, &key, OnionSocksError::IntroFailed, &why, now);
                }
            },
            (CircRole::Rend, RelayCommand::RENDEZVOUS2) => {
                let joined = a
                    .conn
                    .on_rendezvous2(body)
                    .map_err(|e| e.to_string())
                    .and_then(|keys| {
                        core.attach_virtual_hop(circ, &keys, false)
                            .map_err(|e| e.to_string())
                    });
                match joined {
                    Ok(()) => self.joined(core, key, now),
                    Err(why) => self.attempt_failed(
                        core,
                        &key,
                        OnionSocksError::RendezvousFailed,
                        &why,
                        now,
                    ),
                }
            }
            (_, other) => {
                debug!(?circ, command = %other, "unexpected onion message; ignored")
            }
        }
    }

    /// RENDEZVOUS2 verified: the circuit is joined; start the waiting streams.
    fn joined(&mut self, core: &mut Core, key: ConnectKey, now: Instant) {
        let Some(a) = self.attempts.remove(&key) else {
            return;
        };
        if let Some(intro) = a.intro {
            // RENDEZVOUS2 before INTRODUCE_ACK: the introduction circuit is done anyway.
            self.circs.remove(&intro);
            core.close_circuit(intro, now);
        }
        self.counters.joined += 1;
        let since = |t: Option<Instant>| t.map(|t| t.duration_since(a.started));
        let timing = JoinTiming {
            address: key.address,
            attempt: a.number,
            rend_built: since(a.marks.rend_built),
            rend_ready: since(a.marks.rend_ready),
            intro_built: since(a.marks.intro_built),
            introduced: since(a.marks.introduced),
            acked: since(a.marks.acked),
            joined: now.duration_since(a.started),
            rend_predicted: a.predicted.0,
            intro_predicted: a.predicted.1,
            at: now,
        };
        let ms = |d: Option<Duration>| d.map_or(-1, |d| d.as_millis() as i64);
        info!(service = %key.address, circ = ?a.rend, attempt = a.number,
              took_ms = timing.joined.as_millis() as u64,
              rend_built_ms = ms(timing.rend_built), rend_ready_ms = ms(timing.rend_ready),
              intro_built_ms = ms(timing.intro_built), introduced_ms = ms(timing.introduced),
              acked_ms = ms(timing.acked), rend_predicted = timing.rend_predicted,
              intro_predicted = timing.intro_predicted,
              "rendezvous joined");
        if self.timings.len() >= MAX_TIMINGS {
            self.timings.pop_front();
        }
        self.timings.push_back(timing);
        self.circs.insert(a.rend, (key.clone(), CircRole::Joined));
        if let Some(old) = self.joined.insert(
            key,
            Joined {
                circ: a.rend,
                since: now,
            },
        ) {
            self.circs.remove(&old.circ);
        }
        for w in a.waiters {
            self.open_stream(core, a.rend, w.ticket, &w.host, w.port, now);
        }
    }

    /// A circuit closed (or failed to build).
    pub fn on_circuit_closed(
        &mut self,
        core: &mut Core,
        circ: CircKey,
        reason: &str,
        now: Instant,
    ) {
        if self.pool.on_closed(circ, reason, now) {
            return;
        }
        let Some((key, role)) = self.circs.remove(&circ) else {
            return;
        };
        match role {
            CircRole::Joined => {
                if self.joined.get(&key).is_some_and(|j| j.circ == circ) {
                    self.joined.remove(&key);
                }
                debug!(?circ, %reason, "joined rendezvous circuit closed");
            }
            CircRole::Rend => {
                let why = format!("rendezvous circuit closed: {reason}");
                self.attempt_failed(core, &key, OnionSocksError::RendezvousFailed, &why, now);
            }
            CircRole::Intro => {
                let acked = self.attempts.get(&key).is_some_and(|a| a.acked);
                if !acked {
                    let why = format!("introduction circuit closed: {reason}");
                    self.attempt_failed(core, &key, OnionSocksError::IntroFailed, &why, now);
                }
            }
        }
    }

    /// Housekeeping: attempts past their deadline fail (0xF7) or retry; joined circuits past
    /// `max_dirtiness` with no streams are closed; predicted circuits are replaced.
    pub fn tick(&mut self, core: &mut Core, now: Instant) {
        if let Some(consensus) = self.consensus.clone() {
            let paths = self.cfg.paths.clone();
            self.pool.fill(
                core,
                &consensus,
                &paths,
                &mut self.guard,
                &mut self.rng,
                now,
            );
        }
        let late: Vec<ConnectKey> = self
            .attempts
            .iter()
            .filter(|(_, a)| now >= a.deadline)
            .map(|(k, _)| k.clone())
            .collect();
        for key in late {
            let why = "introduction or rendezvous timed out";
            self.attempt_failed(core, &key, OnionSocksError::IntroTimedOut, why, now);
        }
        let stale: Vec<ConnectKey> = self
            .joined
            .iter()
            .filter(|(_, j)| {
                now.duration_since(j.since) >= self.cfg.max_dirtiness
                    && core.circuit_streams(j.circ) == 0
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            if let Some(j) = self.joined.remove(&key) {
                self.circs.remove(&j.circ);
                core.close_circuit(j.circ, now);
            }
        }
    }
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
