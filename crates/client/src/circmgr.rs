//! Which circuit a new stream goes on: reuse, isolation, dirtiness, preemptive
//! circuits. Pure policy over a [`chive_core::Core`]; no IO, time passed in.
//!
//! Rules (Tor's, simplified):
//! - A circuit is *clean* until its first stream; then it is *dirty* from that
//!   moment, and takes no new streams once dirty for longer than
//!   `max_circuit_dirtiness`. Idle dirty circuits past that age are closed.
//! - A circuit carries streams of one isolation key only (the SOCKS
//!   username/password, as Tor's IsolateSOCKSAuth): distinct credentials never
//!   share a circuit. Streams without credentials share their own key.
//! - Its exit must allow the target (address and port, or for a host name, the
//!   port somewhere), and must be the pinned relay for `host.<nickname>.exit`.
//! - `preemptive_circuits` clean circuits are kept built so that a new stream
//!   rarely waits for a circuit to be built.
//! - A request pinned to an exit predicts that exit and port ([`crate::predict`], Tor's
//!   predicted ports keyed by exit too): `pinned_exit_circuits` clean circuits ending there
//!   are kept built or building for an hour after the last such request, so the next pinned
//!   request attaches to a built circuit instead of waiting for CREATEs. At most
//!   [`crate::predict::MAX_CLEAN`] clean circuits and `max_building` builds; a prediction
//!   whose circuit fails to build backs off; unused circuits close when it expires.
//! - `entry_nodes` / `middle_nodes` (Tor's EntryNodes / MiddleNodes) restrict the
//!   guard, including the persistent one, and the middles of every circuit.
//! - A circuit that fails blames relays as [`crate::down`] says: new paths avoid them for
//!   `relay_retry`, and a guard marked down is replaced at the next circuit.
//! - A stream whose BEGIN (or RESOLVE) gets no answer in time ([`crate::begin`], Tor's
//!   `CircuitStreamTimeout`: 10 s, 10 s, then 15 s) is ended (END TIMEOUT) and retried on
//!   another circuit: the one it timed out on, and every other circuit through its middle or
//!   exit (at any hop), take no new streams, and those hops are marked suspect, so the retry goes over a
//!   path without them while one exists.
//!   After `max_attempts` tries in all the request fails.
//! - Path switching (paper 003; the core's switching mode is `path`): every exit circuit is
//!   linked at once (`Core::path_link`) and gets a spare through another entry and middle to
//!   the same exit (`Core::path_add_spare`); spares never take streams themselves, and one
//!   lost is replaced at the next tick.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_core::{CircKey, CloseCause, Core, HopSpec, StreamHandle, SwitchMode};
use chive_crypto::ntor::NtorPublicKey;
use chive_crypto::IdentityKey;
use chive_dir::{Consensus, ConsensusRelay};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tracing::{debug, info, warn};

use crate::begin::{BeginTimeouts, Waiting};
use crate::down::{blame, Blame, DownList};
use crate::path::{
    choose_guard, find_pinned, parse_exit_notation, select_path, select_spare_path, PathRequest,
    PathTarget,
};
use crate::predict::{ExitPredictor, DEFAULT_PER_EXIT, MAX_CLEAN};

/// Circuit manager settings.
#[derive(Clone, Debug)]
pub struct CircMgrConfig {
    /// Tor's MaxCircuitDirtiness.
    pub max_circuit_dirtiness: Duration,
    /// Clean circuits kept ready.
    pub preemptive_circuits: usize,
    /// Circuits that may be building at once.
    pub max_building: usize,
    /// How many circuits a request may try before it fails.
    pub max_attempts: u32,
    /// Tor's EntryNodes: relay nicknames or 64-hex identities; if non-empty, the
    /// guard (first hop) is chosen only among these. Empty: unrestricted.
    pub entry_nodes: Vec<String>,
    /// Tor's MiddleNodes: if non-empty, middle hops are chosen only among these.
    pub middle_nodes: Vec<String>,
    /// How long a relay blamed for a failure is left out of new paths (unless a consensus
    /// lists it again after dropping it). See [`crate::down`].
    pub relay_retry: Duration,
    /// Tor's `CircuitStreamTimeout`: how long a stream waits for CONNECTED before it is
    /// retried on another circuit; `None`: Tor's schedule (10 s, 10 s, then 15 s).
    pub stream_timeout: Option<Duration>,
    /// Clean circuits kept at each exit that requests were pinned to recently, per port
    /// ([`crate::predict`]; 0: none).
    pub pinned_exit_circuits: usize,
}

impl Default for CircMgrConfig {
    fn default() -> Self {
        CircMgrConfig {
            max_circuit_dirtiness: Duration::from_secs(600),
            preemptive_circuits: 2,
            max_building: 8,
            max_attempts: 3,
            entry_nodes: Vec::new(),
            middle_nodes: Vec::new(),
            relay_retry: Duration::from_secs(60),
            stream_timeout: None,
            pinned_exit_circuits: DEFAULT_PER_EXIT,
        }
    }
}

/// What the stream asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// Open a data stream (BEGIN).
    Connect,
    /// Resolve a host name (RESOLVE).
    Resolve,
}

/// A stream waiting for a circuit.
#[derive(Clone, Debug)]
pub struct StreamRequest {
    /// Host name or address literal (may use `.exit` notation).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Isolation key: streams with different keys never share a circuit.
    pub isolation: Vec<u8>,
    /// Connect or resolve.
    pub kind: RequestKind,
}

/// Names a request until it has a stream handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(pub u64);

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The stream was started on a circuit; watch its handle for CONNECTED/END.
    Started(StreamHandle),
    /// No circuit could carry it.
    Failed(String),
    /// The stream started earlier for this request got no answer in time and was ended; the
    /// request is being placed again (a later outcome of the same ticket follows).
    Retrying(StreamHandle),
}

struct CircInfo {
    /// Every hop, guard first (the exit is the last).
    path: Vec<IdentityKey>,
    exit: IdentityKey,
    exit_nickname: String,
    built: bool,
    /// Set by the first stream.
    isolation: Option<Vec<u8>>,
    dirty_since: Option<Instant>,
    /// A request made this circuit for itself (pinned exit, unusual target).
    waiting: Vec<(Ticket, StreamRequest, u32)>,
    /// Path switching: this circuit is the spare of that home circuit (it takes no streams).
    spare_of: Option<CircKey>,
    /// Path switching: when a spare for this circuit was last launched or found impossible.
    spare_tried: Option<Instant>,
    /// A stream's BEGIN timed out on it (Tor makes it dirty), or a relay on its path was blamed
    /// for a circuit's end: it takes no new streams.
    timed_out: bool,
    /// Launched for this predicted exit and port ([`crate::predict`]); cleared by its first
    /// stream.
    predicted: Option<(IdentityKey, u16)>,
}

impl CircInfo {
    /// Clean: no stream yet, none waiting, no other role, usable for new streams.
    fn is_clean(&self) -> bool {
        self.isolation.is_none()
            && self.waiting.is_empty()
            && self.spare_of.is_none()
            && !self.timed_out
    }
}

/// Path switching: a home circuit whose spare went (or could not be built) gets another try
/// after this long.
const SPARE_RETRY: Duration = Duration::from_secs(5);

/// The client's circuit policy. See the module docs.
pub struct CircuitManager {
    cfg: CircMgrConfig,
    consensus: Option<Arc<Consensus>>,
    circuits: HashMap<CircKey, CircInfo>,
    /// Requests that wait for a consensus.
    parked: Vec<(Ticket, StreamRequest, u32)>,
    outcomes: VecDeque<(Ticket, Outcome)>,
    guard: Option<IdentityKey>,
    /// Relays blamed for failures.
    down: DownList,
    /// Streams whose BEGIN is out, timed.
    begins: BeginTimeouts,
    /// Exits that pinned requests used recently.
    predictor: ExitPredictor,
    next_ticket: u64,
    rng: StdRng,
}

fn target_of(host: &str, port: u16) -> PathTarget<'_> {
    match host.parse::<IpAddr>() {
        Ok(ip) => PathTarget::Ip(SocketAddr::new(ip, port)),
        Err(_) => PathTarget::Host(host, port),
    }
}

fn exit_allows(relay: &ConsensusRelay, host: &str, port: u16) -> bool {
    match host.parse::<IpAddr>() {
        Ok(ip) => relay.exit_policy.allows(ip, port),
        Err(_) => relay.exit_policy.allows_port_somewhere(port),
    }
}

fn hop_spec(r: &ConsensusRelay) -> HopSpec {
    HopSpec {
        identity: r.identity,
        ntor_key: NtorPublicKey(r.ntor_key),
        addr: r.address,
    }
}

/// A relay's nickname for the log.
fn nick(choices: &[Arc<Consensus>], id: &IdentityKey) -> String {
    choices
        .iter()
        .find_map(|c| c.relay_by_identity(id))
        .map_or_else(|| "?".to_string(), |r| r.nickname.clone())
}

impl CircuitManager {
    /// A manager with no consensus yet. `seed` feeds path selection.
    pub fn new(cfg: CircMgrConfig, seed: [u8; 32]) -> Self {
        CircuitManager {
            down: DownList::new(cfg.relay_retry),
            begins: BeginTimeouts::new(cfg.stream_timeout),
            predictor: ExitPredictor::new(cfg.pinned_exit_circuits),
            cfg,
            consensus: None,
            circuits: HashMap::new(),
            parked: Vec::new(),
            outcomes: VecDeque::new(),
            guard: None,
            next_ticket: 1,
            rng: StdRng::from_seed(seed),
        }
    }

    /// Use a newly fetched (and verified) consensus; serve parked requests.
    pub fn set_consensus(&mut self, core: &mut Core, consensus: Arc<Consensus>, now: Instant) {
        core.set_circwindow(u32::from(consensus.params.circwindow()));
        core.set_congestion_control(crate::cc::congestion_control(&consensus.params));
        if let Some(g) = self.guard {
            if consensus.relay_by_identity(&g).is_none() {
                info!("guard left the consensus; choosing another");
                self.guard = None;
            }
        }
        self.down.on_consensus(&consensus);
        self.consensus = Some(consensus);
        for (ticket, req, attempts) in std::mem::take(&mut self.parked) {
            self.place(core, ticket, req, attempts, now);
        }
        self.tick(core, now);
    }

    /// Whether a consensus is loaded.
    pub fn has_consensus(&self) -> bool {
        self.consensus.is_some()
    }

    /// Ask for a stream; its outcome comes from [`CircuitManager::poll_outcome`].
    pub fn request(&mut self, core: &mut Core, req: StreamRequest, now: Instant) -> Ticket {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.place(core, ticket, req, 0, now);
        ticket
    }

    /// Next finished request.
    pub fn poll_outcome(&mut self) -> Option<(Ticket, Outcome)> {
        self.outcomes.pop_front()
    }

    /// Number of circuits the manager knows (built or building).
    pub fn circuit_count(&self) -> usize {
        self.circuits.len()
    }

    /// The circuit a stream handle was started on is not tracked here; this
    /// tells which circuit carries streams of `isolation` (for tests and logs).
    pub fn circuits_for(&self, isolation: &[u8]) -> Vec<CircKey> {
        let mut v: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(_, c)| c.isolation.as_deref() == Some(isolation))
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }

    fn usable(
        &self,
        info: &CircInfo,
        req: &StreamRequest,
        host: &str,
        pin: Option<&str>,
        now: Instant,
    ) -> bool {
        if info.spare_of.is_some() || info.timed_out {
            return false;
        }
        if let Some(iso) = &info.isolation {
            if *iso != req.isolation {
                return false;
            }
        }
        if let Some(since) = info.dirty_since {
            if now.duration_since(since) >= self.cfg.max_circuit_dirtiness {
                return false;
            }
        }
        if let Some(pin) = pin {
            // A nickname or a hex identity (`find_pinned` takes both).
            if !info.exit_nickname.eq_ignore_ascii_case(pin)
                && IdentityKey::from_hex(pin).ok() != Some(info.exit)
            {
                return false;
            }
        }
        let Some(cons) = &self.consensus else {
            return false;
        };
        match cons.relay_by_identity(&info.exit) {
            Some(r) => req.kind == RequestKind::Resolve || exit_allows(r, host, req.port),
            None => false,
        }
    }

    fn place(
        &mut self,
        core: &mut Core,
        ticket: Ticket,
        req: StreamRequest,
        attempts: u32,
        now: Instant,
    ) {
        if attempts >= self.cfg.max_attempts {
            self.outcomes.push_back((
                ticket,
                Outcome::Failed(format!("no circuit after {attempts} attempts")),
            ));
            return;
        }
        if self.consensus.is_none() {
            self.parked.push((ticket, req, attempts));
            return;
        }
        let (host, pin) = match parse_exit_notation(&req.host) {
            Some((h, n)) => (h.to_string(), Some(n.to_string())),
            None => (req.host.clone(), None),
        };
        // A pinned CONNECT predicts its exit and port (Tor notes the port of every CONNECT).
        if let (Some(pin), RequestKind::Connect, Some(cons)) = (&pin, &req.kind, &self.consensus) {
            if let Some(exit) = find_pinned(cons, pin) {
                self.predictor.note_used(exit.identity, req.port, now);
            }
        }
        // A built circuit: prefer one already dirty with this key, then a clean one.
        let mut best: Option<(bool, CircKey)> = None;
        for (key, info) in &self.circuits {
            if !info.built
                || !core.circuit_is_open(*key)
                || !self.usable(info, &req, &host, pin.as_deref(), now)
            {
                continue;
            }
            let rank = info.isolation.is_some();
            if best.is_none_or(|(r, k)| (rank, std::cmp::Reverse(*key)) > (r, std::cmp::Reverse(k)))
            {
                best = Some((rank, *key));
            }
        }
        if let Some((_, key)) = best {
            return self.start_stream(core, key, ticket, req, &host, attempts, now);
        }
        // A circuit being built that will suit it.
        let building = self.circuits.iter().find(|(_, info)| {
            !info.built
                && self.usable(info, &req, &host, pin.as_deref(), now)
                && info
                    .waiting
                    .iter()
                    .all(|(_, r, _)| r.isolation == req.isolation)
        });
        if let Some((key, _)) = building {
            let key = *key;
            if let Some(info) = self.circuits.get_mut(&key) {
                info.waiting.push((ticket, req, attempts));
            }
            return;
        }
        let target = match req.kind {
            RequestKind::Resolve => PathTarget::Any,
            RequestKind::Connect => target_of(&host, req.port),
        };
        match self.launch(core, target, pin.as_deref(), "request", now) {
            Ok(key) => {
                if let Some(info) = self.circuits.get_mut(&key) {
                    info.waiting.push((ticket, req, attempts));
                }
            }
            Err(e) => self.outcomes.push_back((ticket, Outcome::Failed(e))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_stream(
        &mut self,
        core: &mut Core,
        key: CircKey,
        ticket: Ticket,
        req: StreamRequest,
        host: &str,
        attempts: u32,
        now: Instant,
    ) {
        let result = match req.kind {
            RequestKind::Connect => core.open_stream(key, host, req.port, now),
            RequestKind::Resolve => core.resolve(key, host, now),
        };
        match result {
            Ok(handle) => {
                if let Some(info) = self.circuits.get_mut(&key) {
                    if info.isolation.is_none() {
                        info.isolation = Some(req.isolation.clone());
                        info.dirty_since = Some(now);
                        if info.predicted.take().is_some() {
                            debug!(
                                ?key,
                                "a circuit built for a predicted exit takes its first stream"
                            );
                        }
                    }
                }
                // The user name only (never the password), for operators and tests.
                let user = req.isolation.split(|b| *b == 0).next().unwrap_or_default();
                info!(?key, ?handle, isolation = %String::from_utf8_lossy(user), "stream attached");
                self.outcomes.push_back((ticket, Outcome::Started(handle)));
                self.begins.started(
                    handle,
                    Waiting {
                        ticket,
                        req,
                        circ: key,
                        attempts,
                        since: now,
                    },
                );
            }
            Err(e) => {
                warn!(?key, error = %e, "cannot start stream on circuit; trying another");
                self.place(core, ticket, req, attempts + 1, now);
            }
        }
    }

    /// Build a new circuit whose exit allows `target` (pinned: that exit). `why` is logged:
    /// "request", "preemptive" or "predicted".
    fn launch(
        &mut self,
        core: &mut Core,
        target: PathTarget<'_>,
        pin: Option<&str>,
        why: &'static str,
        now: Instant,
    ) -> Result<CircKey, String> {
        let Some(full) = self.consensus.clone() else {
            return Err("no consensus".into());
        };
        // Leave out blamed relays: down and suspect ones if a path remains, else the down ones
        // and the suspects blamed most often (the relay common to several failed circuits is
        // the likeliest to be dead), else only the down ones, else none (a tiny network must
        // keep trying).
        let mut choices: Vec<Arc<Consensus>> = Vec::new();
        if let Some(c) = self.down.without(&full, Blame::Suspect, now) {
            choices.push(Arc::new(c));
        }
        for count in self.down.suspect_counts(now) {
            if let Some(c) = self.down.without_blamed(&full, count, now) {
                choices.push(Arc::new(c));
            }
        }
        if let Some(c) = self.down.without(&full, Blame::Down, now) {
            choices.push(Arc::new(c));
        }
        choices.push(full);
        if let Some(g) = self.guard {
            if self.down.blame_of(&g, now) == Some(Blame::Down) {
                let new = choices
                    .iter()
                    .find_map(|c| choose_guard(c, &self.cfg.entry_nodes, &mut self.rng))
                    .map(|r| r.identity);
                if new.is_some_and(|n| n != g) {
                    info!(old = %nick(&choices, &g), new = %nick(&choices, &new.unwrap_or(g)),
                          "guard is down; using another");
                    self.guard = new;
                }
            }
        }
        if self.guard.is_none() {
            self.guard = choices
                .iter()
                .find_map(|c| choose_guard(c, &self.cfg.entry_nodes, &mut self.rng))
                .map(|r| r.identity);
        }
        let req = PathRequest {
            target,
            exit_nickname: pin,
            guard: self.guard.as_ref(),
            hops: 3,
            entry_nodes: &self.cfg.entry_nodes,
            middle_nodes: &self.cfg.middle_nodes,
        };
        let mut result = Err(String::new());
        for cons in &choices {
            result = select_path(cons, &req, &mut self.rng).map_err(|e| e.to_string());
            if result.is_ok() {
                break;
            }
        }
        let path = result?;
        let Some(exit) = path.last() else {
            return Err("empty path".into());
        };
        let (exit_id, exit_nick) = (exit.identity, exit.nickname.clone());
        let names: Vec<&str> = path.iter().map(|r| r.nickname.as_str()).collect();
        let ids: Vec<IdentityKey> = path.iter().map(|r| r.identity).collect();
        let key = core.launch_circuit(path.iter().map(|r| hop_spec(r)).collect(), now);
        info!(?key, why = %why, path = %names.join(","), "launching circuit");
        self.circuits.insert(
            key,
            CircInfo {
                path: ids,
                exit: exit_id,
                exit_nickname: exit_nick,
                built: false,
                isolation: None,
                dirty_since: None,
                waiting: Vec::new(),
                spare_of: None,
                spare_tried: None,
                timed_out: false,
                predicted: None,
            },
        );
        Ok(key)
    }

    /// Path switching: build a spare for `home` (same exit, another entry and middle).
    fn launch_spare(&mut self, core: &mut Core, home: CircKey, now: Instant) {
        let (Some(cons), Some(info)) = (self.consensus.clone(), self.circuits.get_mut(&home))
        else {
            return;
        };
        info.spare_tried = Some(now);
        let Some(path) = select_spare_path(
            &cons,
            &info.path,
            &self.cfg.entry_nodes,
            &self.cfg.middle_nodes,
            &mut self.rng,
        ) else {
            warn!(
                ?home,
                "no spare path: no other entry and middle to the same exit"
            );
            return;
        };
        let names: Vec<&str> = path.iter().map(|r| r.nickname.as_str()).collect();
        let ids: Vec<IdentityKey> = path.iter().map(|r| r.identity).collect();
        let key = core.launch_circuit(path.iter().map(|r| hop_spec(r)).collect(), now);
        info!(?key, ?home, path = %names.join(","), "launching spare circuit");
        let (exit, exit_nickname) = (info.exit, info.exit_nickname.clone());
        self.circuits.insert(
            key,
            CircInfo {
                path: ids,
                exit,
                exit_nickname,
                built: false,
                isolation: None,
                dirty_since: None,
                waiting: Vec::new(),
                spare_of: Some(home),
                spare_tried: None,
                timed_out: false,
                predicted: None,
            },
        );
    }

    /// The core reported [`chive_core::Event::CircuitBuilt`].
    pub fn on_circuit_built(&mut self, core: &mut Core, circ: CircKey, now: Instant) {
        let Some(info) = self.circuits.get_mut(&circ) else {
            return;
        };
        info.built = true;
        if let Some((exit, port)) = info.predicted {
            self.predictor.on_built(&exit, port);
            info!(?circ, port, "circuit for a predicted exit built");
        }
        if let Some(home) = info.spare_of {
            if let Err(e) = core.path_add_spare(home, circ, now) {
                debug!(?circ, ?home, error = %e, "spare not linked (its home is gone); closing it");
                self.circuits.remove(&circ);
                core.close_circuit(circ, now);
            }
            return;
        }
        if core.switching().mode == SwitchMode::Path
            && info.path.len() >= 3
            && core.path_link(circ, now).is_ok()
        {
            self.launch_spare(core, circ, now);
        }
        let Some(info) = self.circuits.get_mut(&circ) else {
            return;
        };
        let waiting = std::mem::take(&mut info.waiting);
        for (ticket, req, attempts) in waiting {
            // Re-place: the circuit is built and suits them, unless a stream of
            // another key got there first.
            self.place(core, ticket, req, attempts, now);
        }
    }

    /// The core reported [`chive_core::Event::CircuitClosed`]: blame relays as
    /// [`crate::down`] says, then retry its waiters elsewhere.
    pub fn on_circuit_closed(
        &mut self,
        core: &mut Core,
        circ: CircKey,
        cause: CloseCause,
        hops: usize,
        now: Instant,
    ) {
        self.begins.circuit_closed(circ);
        let Some(info) = self.circuits.remove(&circ) else {
            return;
        };
        if let (Some((exit, port)), false) = (info.predicted, info.built) {
            if let Some(pause) = self.predictor.on_failed(&exit, port, now) {
                info!(
                    ?circ,
                    ?cause,
                    port,
                    pause_ms = pause.as_millis() as u64,
                    "circuit for a predicted exit failed to build; backing off"
                );
            }
        }
        let mut blamed = Vec::new();
        for (id, b) in blame(cause, hops, &info.path) {
            if self.down.mark(id, b, now) {
                let name = self
                    .consensus
                    .as_ref()
                    .and_then(|c| c.relay_by_identity(&id))
                    .map_or_else(|| "?".to_string(), |r| r.nickname.clone());
                warn!(relay = %name, blame = ?b, ?cause, "marking relay down; new paths avoid it");
            }
            blamed.push(id);
        }
        // Open circuits through a relay this close blamed (down or suspect) take no new
        // streams: if it died, their DESTROY is on its way and a stream attached now would
        // fail with it (a fetch started right after a middle died did, twice). Their waiting
        // requests go elsewhere. Circuits built later may still use the relay when no other
        // path exists (`crate::down`).
        let mut moved = Vec::new();
        if !blamed.is_empty() {
            for c in self.circuits.values_mut() {
                if c.path.iter().any(|h| blamed.contains(h)) {
                    c.timed_out = true;
                    moved.append(&mut c.waiting);
                }
            }
        }
        for (ticket, req, attempts) in info.waiting {
            self.place(core, ticket, req, attempts + 1, now);
        }
        for (ticket, req, attempts) in moved {
            self.place(core, ticket, req, attempts, now);
        }
    }

    /// Stream `handle` got its answer (CONNECTED, RESOLVED or END) or went away: its BEGIN is
    /// no longer timed.
    pub fn stream_answered(&mut self, handle: StreamHandle) {
        self.begins.answered(handle);
    }

    /// Streams whose BEGIN is out and timed.
    pub fn streams_opening(&self) -> usize {
        self.begins.len()
    }

    /// Give up the streams whose BEGIN got no answer in time ([`crate::begin`]): END them
    /// (TIMEOUT), keep new streams off their circuits, mark the circuits' later hops suspect,
    /// and place their requests again.
    fn expire_begins(&mut self, core: &mut Core, now: Instant) {
        for (handle, w) in self.begins.expired(now) {
            let waited = now.saturating_duration_since(w.since);
            core.stream_end(handle, chive_cell::EndReason::TIMEOUT, now);
            // The guard is kept (a hung guard's link times out and marks it down); the middle
            // and exit are suspect, as for a DESTROY that does not say which hop failed, and
            // circuits through them at any hop (a preemptive one would hang the same way; a
            // hung exit may be another circuit's guard) take no new streams.
            let later: Vec<IdentityKey> = self
                .circuits
                .get(&w.circ)
                .map(|info| info.path.iter().skip(1).copied().collect())
                .unwrap_or_default();
            for id in &later {
                self.down.mark(*id, Blame::Suspect, now);
            }
            // Requests waiting for such a circuit to be built go elsewhere too.
            let mut moved = Vec::new();
            for (key, info) in self.circuits.iter_mut() {
                if *key == w.circ || info.path.iter().any(|h| later.contains(h)) {
                    info.timed_out = true;
                    moved.append(&mut info.waiting);
                }
            }
            warn!(?handle, circ = ?w.circ, waited_ms = waited.as_millis() as u64,
                  attempt = w.attempts + 1,
                  "stream got no CONNECTED in time (CircuitStreamTimeout); retrying on another circuit");
            self.outcomes
                .push_back((w.ticket, Outcome::Retrying(handle)));
            self.place(core, w.ticket, w.req, w.attempts + 1, now);
            for (ticket, req, attempts) in moved {
                self.place(core, ticket, req, attempts, now);
            }
        }
    }

    /// Periodic housekeeping: time out BEGINs, close stale idle circuits, keep preemptive ones.
    pub fn tick(&mut self, core: &mut Core, now: Instant) {
        self.down.expire(now);
        self.expire_begins(core, now);
        let stale: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(k, c)| {
                c.built
                    && (c.timed_out
                        || c.dirty_since.is_some_and(|d| {
                            now.duration_since(d) >= self.cfg.max_circuit_dirtiness
                        }))
                    && core.circuit_streams(**k) == 0
            })
            .map(|(k, _)| *k)
            .collect();
        for key in stale {
            debug!(?key, "closing dirty idle circuit");
            self.circuits.remove(&key);
            core.close_circuit(key, now);
        }
        if self.consensus.is_none() {
            return;
        }
        // Path switching: a linked circuit whose spare went gets another.
        let spareless: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(k, c)| {
                c.built
                    && c.spare_of.is_none()
                    && c.spare_tried
                        .is_none_or(|t| now.duration_since(t) >= SPARE_RETRY)
                    && core.path_set_of(**k) == Some(None)
                    && !self.circuits.values().any(|s| s.spare_of == Some(**k))
            })
            .map(|(k, _)| *k)
            .collect();
        for home in spareless {
            self.launch_spare(core, home, now);
        }
        self.keep_predicted(core, now);
        let clean = self.circuits.values().filter(|c| c.is_clean()).count();
        let building = self.circuits.values().filter(|c| !c.built).count();
        let want = self.cfg.preemptive_circuits.saturating_sub(clean);
        for _ in 0..want.min(self.cfg.max_building.saturating_sub(building)) {
            if let Err(e) = self.launch(core, PathTarget::Any, None, "preemptive", now) {
                warn!(error = %e, "cannot build a preemptive circuit");
                break;
            }
        }
    }

    /// Predicted exits ([`crate::predict`]): close the unused circuits of predictions that are
    /// over, then launch what each active one lacks, within [`MAX_CLEAN`] clean circuits and
    /// `max_building` builds. A prediction whose exit left the consensus, no longer allows the
    /// port, or is blamed for a failure ([`crate::down`]) launches nothing meanwhile (a pinned
    /// request still builds on demand).
    fn keep_predicted(&mut self, core: &mut Core, now: Instant) {
        self.predictor.expire(now);
        let over: Vec<CircKey> = self
            .circuits
            .iter()
            .filter(|(k, c)| {
                c.built
                    && c.is_clean()
                    && c.predicted
                        .is_some_and(|(e, p)| !self.predictor.is_predicted(&e, p, now))
                    && core.circuit_streams(**k) == 0
            })
            .map(|(k, _)| *k)
            .collect();
        for key in over {
            debug!(
                ?key,
                "closing an unused circuit of a predicted exit no longer predicted"
            );
            self.circuits.remove(&key);
            core.close_circuit(key, now);
        }
        let Some(cons) = self.consensus.clone() else {
            return;
        };
        for (exit, port) in self.predictor.active(now) {
            let Some(relay) = cons.relay_by_identity(&exit) else {
                continue;
            };
            if !relay.exit_policy.allows_port_somewhere(port)
                || self.down.blame_of(&exit, now).is_some()
            {
                continue;
            }
            let have = self
                .circuits
                .values()
                .filter(|c| c.exit == exit && c.is_clean())
                .count();
            for _ in have..self.predictor.per_exit() {
                let clean = self.circuits.values().filter(|c| c.is_clean()).count();
                let building = self.circuits.values().filter(|c| !c.built).count();
                if clean >= MAX_CLEAN || building >= self.cfg.max_building {
                    return;
                }
                match self.launch(
                    core,
                    PathTarget::Port(port),
                    Some(&exit.to_hex()),
                    "predicted",
                    now,
                ) {
                    Ok(key) => {
                        if let Some(info) = self.circuits.get_mut(&key) {
                            info.predicted = Some((exit, port));
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, port, "cannot build a circuit for a predicted exit");
                        self.predictor.on_failed(&exit, port, now);
                        break;
                    }
                }
            }
        }
    }

    /// Clean circuits (built or building) ending at `exit`: what a pinned request to it could
    /// attach to without a new build.
    pub fn clean_circuits_at(&self, exit: &IdentityKey) -> usize {
        self.circuits
            .values()
            .filter(|c| c.exit == *exit && c.is_clean())
            .count()
    }

    /// Exits and ports predicted now.
    pub fn predicted_exits(&self, now: Instant) -> Vec<(IdentityKey, u16)> {
        self.predictor.active(now)
    }
}

#[cfg(test)]
#[path = "circmgr_tests.rs"]
mod tests;
