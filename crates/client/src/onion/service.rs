//! One onion service run by a client (`HiddenServiceDir`): the policy around
//! `chive_core::onion::OnionServiceIntro`.
//!
//! - **Introduction points**: `ServiceConfig::intro_points` distinct relays from the
//!   consensus, each with its own auth and encryption keys and a circuit ending there that
//!   sends ESTABLISH_INTRO (keyed with the circuit's KH). A circuit that closes is rebuilt after
//!   a backoff (1 s, doubling, at most 15 s); after [`MAX_INTRO_FAILURES`] failures in a row
//!   the relay is replaced by another with fresh keys. An intro point whose replay cache asks
//!   for rotation gets fresh keys and a new circuit.
//! - **Descriptor**: signed with the service identity, listing the established introduction
//!   points, valid for `descriptor_lifetime`; asked for ([`ServiceAction::Publish`]) when the
//!   set of established points changed (once all are up, or [`PUBLISH_SETTLE`] after the first
//!   change), again when half its lifetime has passed, and after a failed upload
//!   ([`OnionService::publish_failed`], retried after [`PUBLISH_RETRY`]). Revisions increase
//!   with the clock (milliseconds), so a restarted service is not refused as older.
//! - **INTRODUCE2**: checked by the intro point's state (undecryptable, replayed, malformed
//!   dropped and counted there); an accepted one builds a circuit to the rendezvous point (at
//!   most [`MAX_PENDING_RENDEZVOUS`] at once, more are dropped and counted), which sends
//!   RENDEZVOUS1 once built and attaches the virtual hop.
//! - **Predicted circuits** ([`super::pool`]): from its first consensus on, the service keeps
//!   `ServiceConfig::predicted` built circuits one hop short of a rendezvous circuit and
//!   extends one to the rendezvous point an INTRODUCE2 names when one fits (it does not pass
//!   through that relay), instead of building the whole circuit then.
//! - **Streams**: a BEGIN through a joined circuit names a virtual port; `HiddenServicePort`
//!   maps it to a local target ([`OnionService::stream_target`]); unknown ports are refused.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chive_cell::RelayCommand;
use chive_core::onion::service::DEFAULT_REPLAY_CACHE;
use chive_core::onion::{IntroduceAccepted, OnionServiceIntro, ServiceStats};
use chive_core::{CircKey, Core, HopSpec};
use chive_crypto::{IdentityKey, IdentityKeypair, OnionAddress};
use chive_dir::{Consensus, IntroPoint, OnionDescriptor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tracing::{debug, info, warn};

use super::pool::{launch_or_extend, InternalPool, PoolCounters};
use super::{hop_of, path_to, usable_relays, OnionPaths, LONG_ONION_HOPS, SHORT_ONION_HOPS};

/// Circuit failures in a row after which an introduction point is replaced.
pub const MAX_INTRO_FAILURES: u32 = 3;
/// Rendezvous circuits being built at once; further INTRODUCE2s are dropped (and counted).
pub const MAX_PENDING_RENDEZVOUS: usize = 64;
/// How long after the first change of the established set a descriptor is published even if
/// not every introduction point is up.
pub const PUBLISH_SETTLE: Duration = Duration::from_secs(3);
/// Wait after a failed upload.
pub const PUBLISH_RETRY: Duration = Duration::from_secs(2);
/// Longest backoff before rebuilding an introduction circuit.
const MAX_INTRO_BACKOFF: Duration = Duration::from_secs(30);

/// A service's settings.
pub struct ServiceConfig {
    /// The service identity (its address is derived from it).
    pub identity: IdentityKeypair,
    /// `HiddenServicePort`: virtual port → local target.
    pub ports: Vec<(u16, SocketAddr)>,
    /// Introduction points to keep (Tor's default 3), 1 to `chive_dir::MAX_INTRO_POINTS`.
    pub intro_points: usize,
    /// Validity of each descriptor (at most 12 h, which the authority enforces).
    pub descriptor_lifetime: Duration,
    /// EntryNodes / MiddleNodes for the service's circuits.
    pub paths: OnionPaths,
    /// Predicted rendezvous circuits kept built (`OnionPredictedCircuits`; 0: none).
    pub predicted: usize,
}

/// What the caller must do for the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceAction {
    /// Upload this signed descriptor to the authority; report a failure with
    /// [`OnionService::publish_failed`].
    Publish {
        /// The document.
        doc: String,
        /// Its revision, for the log.
        revision: u64,
        /// Introduction points listed.
        intro_points: usize,
    },
}

/// The service's counters (the INTRODUCE2 checks are summed over its introduction points,
/// current and replaced).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// INTRODUCE2 outcomes.
    pub introduce: ServiceStats,
    /// Accepted INTRODUCE2s dropped because [`MAX_PENDING_RENDEZVOUS`] circuits were building.
    pub rendezvous_dropped: u64,
    /// Rendezvous circuits that closed before they were built.
    pub rendezvous_failed: u64,
    /// RENDEZVOUS1 sent (a client joined).
    pub rendezvous_joined: u64,
    /// Descriptors handed out for upload.
    pub descriptors_published: u64,
    /// Introduction circuits that closed.
    pub intro_circuits_lost: u64,
    /// Rendezvous circuits that were predicted circuits extended by one hop.
    pub predicted_used: u64,
}

struct IntroSlot {
    hop: HopSpec,
    keys: OnionServiceIntro,
    circ: Option<CircKey>,
    established: bool,
    failures: u32,
    retry_at: Option<Instant>,
}

/// One onion service. See the module docs.
pub struct OnionService {
    cfg: ServiceConfig,
    address: OnionAddress,
    consensus: Option<Arc<Consensus>>,
    slots: Vec<IntroSlot>,
    /// Rendezvous circuits being built, with what to send once built.
    /// Rendezvous circuits building, with their INTRODUCE2 and when it came.
    pending: HashMap<CircKey, (IntroduceAccepted, Instant)>,
    /// Joined rendezvous circuits (streams may come through them).
    joined: HashSet<CircKey>,
    /// The established set changed since the last publish; since when.
    dirty_since: Option<Instant>,
    /// When the last published descriptor should be replaced (half its lifetime).
    republish_at: Option<Instant>,
    /// After a failed upload: not before then.
    retry_publish_at: Option<Instant>,
    revision: u64,
    guard: Option<IdentityKey>,
    /// Relays recently replaced as introduction points (avoided while others exist).
    replaced: VecDeque<IdentityKey>,
    actions: VecDeque<ServiceAction>,
    counters: ServiceCounters,
    pool: InternalPool,
    rng: StdRng,
}

impl OnionService {
    /// A service with no consensus yet; `seed` feeds key generation and path choice.
    pub fn new(cfg: ServiceConfig, seed: [u8; 32]) -> Self {
        let address = OnionAddress::from_key(cfg.identity.public());
        let pool = InternalPool::new(cfg.predicted, &[LONG_ONION_HOPS], true);
        OnionService {
            cfg,
            address,
            consensus: None,
            slots: Vec::new(),
            pending: HashMap::new(),
            joined: HashSet::new(),
            dirty_since: None,
            republish_at: None,
            retry_publish_at: None,
            revision: 0,
            guard: None,
            replaced: VecDeque::new(),
            actions: VecDeque::new(),
            counters: ServiceCounters::default(),
            pool,
            rng: StdRng::from_seed(seed),
        }
    }

    /// The service's address.
    pub fn address(&self) -> OnionAddress {
        self.address
    }

    /// Counters.
    pub fn counters(&self) -> ServiceCounters {
        let mut c = self.counters;
        for s in &self.slots {
            add_stats(&mut c.introduce, &s.keys.stats);
        }
        c
    }

    /// The predicted circuits' counters.
    pub fn pool_counters(&self) -> PoolCounters {
        self.pool.counters
    }

    /// Predicted circuits built and waiting.
    pub fn predicted_ready(&self) -> usize {
        self.pool.ready()
    }

    /// Introduction points established now.
    pub fn established(&self) -> usize {
        self.slots.iter().filter(|s| s.established).count()
    }

    /// Next thing to do.
    pub fn poll_action(&mut self) -> Option<ServiceAction> {
        self.actions.pop_front()
    }

    /// A new verified consensus: choose introduction points if some are missing.
    pub fn set_consensus(&mut self, core: &mut Core, consensus: Arc<Consensus>, now: Instant) {
        if let Some(g) = self.guard {
            if consensus.relay_by_identity(&g).is_none() {
                self.guard = None;
            }
        }
        self.consensus = Some(consensus);
        self.tick(core, now, 0);
    }

    /// Does this service own `circ`?
    pub fn owns(&self, circ: CircKey) -> bool {
        self.pending.contains_key(&circ)
            || self.joined.contains(&circ)
            || self.pool.owns(circ)
            || self.slots.iter().any(|s| s.circ == Some(circ))
    }

    /// A circuit was built.
    pub fn on_circuit_built(&mut self, core: &mut Core, circ: CircKey, now: Instant) {
        if self.pool.on_built(circ, now) {
            return;
        }
        if let Some(slot) = self.slots.iter_mut().find(|s| s.circ == Some(circ)) {
            let Some(kh) = core.last_hop_kh(circ) else {
                return;
            };
            let body = slot.keys.establish_intro(&kh);
            if let Err(e) = core.send_onion_message(circ, RelayCommand::ESTABLISH_INTRO, &body, now)
            {
                warn!(?circ, error = %e, "cannot send ESTABLISH_INTRO");
                core.close_circuit(circ, now);
            }
            return;
        }
        if let Some((acc, since)) = self.pending.remove(&circ) {
            let (cmd, body) = &acc.rendezvous1;
            let sent = core
                .send_onion_message(circ, *cmd, body, now)
                .and_then(|()| core.attach_virtual_hop(circ, &acc.keys, true));
            match sent {
                Ok(()) => {
                    self.counters.rendezvous_joined += 1;
                    self.joined.insert(circ);
                    // took_ms: INTRODUCE2 to RENDEZVOUS1, the service's circuit to the point.
                    info!(?circ, service = %self.address,
                          rendezvous = %acc.rendezvous_point.identity,
                          took_ms = now.saturating_duration_since(since).as_millis() as u64,
                          "RENDEZVOUS1 sent; client joined");
                }
                Err(e) => {
                    warn!(?circ, error = %e, "cannot send RENDEZVOUS1");
                    core.close_circuit(circ, now);
                }
            }
        }
    }

    /// A circuit closed (or failed to build).
    pub fn on_circuit_closed(&mut self, circ: CircKey, reason: &str, now: Instant) {
        if self.pool.on_closed(circ, reason, now) {
            return;
        }
        if self.pending.remove(&circ).is_some() {
            self.counters.rendezvous_failed += 1;
            info!(?circ, %reason, "rendezvous circuit failed");
            return;
        }
        if self.joined.remove(&circ) {
            debug!(?circ, %reason, "rendezvous circuit closed");
            return;
        }
        let Some(i) = self.slots.iter().position(|s| s.circ == Some(circ)) else {
            return;
        };
        self.counters.intro_circuits_lost += 1;
        let slot = &mut self.slots[i];
        if slot.established {
            self.dirty_since.get_or_insert(now);
        }
        slot.circ = None;
        slot.established = false;
        slot.failures += 1;
        let backoff = Duration::from_secs(1u64 << slot.failures.min(5)).min(MAX_INTRO_BACKOFF);
        slot.retry_at = Some(now + backoff / 2);
        info!(?circ, relay = %slot.hop.identity, failures = slot.failures, %reason,
              "introduction circuit closed; rebuilding");
        if slot.failures >= MAX_INTRO_FAILURES {
            let old = self.slots.remove(i);
            add_stats(&mut self.counters.introduce, &old.keys.stats);
            if self.replaced.len() >= 8 {
                self.replaced.pop_front();
            }
            self.replaced.push_back(old.hop.identity);
            info!(relay = %old.hop.identity, "introduction point replaced after repeated failures");
        }
    }

    /// An onion message on one of the service's circuits.
    pub fn on_onion_message(
        &mut self,
        core: &mut Core,
        circ: CircKey,
        command: RelayCommand,
        body: &[u8],
        now: Instant,
    ) {
        let Some(i) = self.slots.iter().position(|s| s.circ == Some(circ)) else {
            debug!(?circ, %command, "onion message on a non-introduction circuit: ignored");
            return;
        };
        match command {
            RelayCommand::INTRO_ESTABLISHED => {
                let slot = &mut self.slots[i];
                if !slot.established {
                    slot.established = true;
                    slot.failures = 0;
                    self.dirty_since.get_or_insert(now);
                    info!(?circ, relay = %slot.hop.identity, "introduction point established");
                }
            }
            RelayCommand::INTRODUCE2 => self.on_introduce2(core, i, body, now),
            other => debug!(?circ, command = %other, "unexpected onion message; ignored"),
        }
    }

    fn on_introduce2(&mut self, core: &mut Core, i: usize, body: &[u8], now: Instant) {
        let acc = match self.slots[i].keys.on_introduce2(&mut self.rng, body) {
            Ok(acc) => acc,
            Err(e) => {
                info!(error = %e, "INTRODUCE2 dropped");
                return;
            }
        };
        if self.pending.len() >= MAX_PENDING_RENDEZVOUS {
            self.counters.rendezvous_dropped += 1;
            warn!(
                pending = self.pending.len(),
                "INTRODUCE2 dropped: too many rendezvous circuits building"
            );
            return;
        }
        let Some(consensus) = self.consensus.clone() else {
            return;
        };
        let rp = acc.rendezvous_point.clone();
        match path_to(
            &consensus,
            &self.cfg.paths,
            self.guard.as_ref(),
            rp,
            LONG_ONION_HOPS,
            &mut self.rng,
        ) {
            Ok(path) => {
                self.guard.get_or_insert(path[0].identity);
                let (circ, predicted) = launch_or_extend(&mut self.pool, core, path, now);
                self.counters.predicted_used += u64::from(predicted);
                info!(?circ, rendezvous = %acc.rendezvous_point.identity, predicted,
                      "INTRODUCE2 accepted; building to the rendezvous point");
                self.pending.insert(circ, (acc, now));
            }
            Err(e) => warn!(error = %e, "no path to the rendezvous point"),
        }
    }

    /// The local target for a stream to virtual port `port` on circuit `circ`, or `None`
    /// (refuse: not a joined rendezvous circuit of this service, or no such port).
    pub fn stream_target(&self, circ: CircKey, port: u16) -> Option<SocketAddr> {
        if !self.joined.contains(&circ) {
            return None;
        }
        self.cfg
            .ports
            .iter()
            .find(|(v, _)| *v == port)
            .map(|(_, t)| *t)
    }

    /// The last upload failed: publish again after [`PUBLISH_RETRY`].
    pub fn publish_failed(&mut self, now: Instant) {
        self.retry_publish_at = Some(now + PUBLISH_RETRY);
    }

    /// Housekeeping (call about every half second): fill and rebuild introduction points,
    /// rotate keys whose replay cache is full, publish when due. `unix` is the wall clock in
    /// seconds (descriptors carry it).
    pub fn tick(&mut self, core: &mut Core, now: Instant, unix: u64) {
        let Some(consensus) = self.consensus.clone() else {
            return;
        };
        self.fill_slots(&consensus);
        let paths = self.cfg.paths.clone();
        self.pool.fill(
            core,
            &consensus,
            &paths,
            &mut self.guard,
            &mut self.rng,
            now,
        );
        for i in 0..self.slots.len() {
            if self.slots[i].keys.should_rotate() {
                let sub = self.address.subcredential();
                let fresh = OnionServiceIntro::generate(&mut self.rng, sub, DEFAULT_REPLAY_CACHE);
                let old = std::mem::replace(&mut self.slots[i].keys, fresh);
                add_stats(&mut self.counters.introduce, &old.stats);
                if let Some(c) = self.slots[i].circ.take() {
                    core.close_circuit(c, now);
                }
                self.slots[i].established = false;
                self.dirty_since.get_or_insert(now);
                info!("introduction point keys rotated (replay cache full)");
            }
            let slot = &self.slots[i];
            if slot.circ.is_some() || slot.retry_at.is_some_and(|t| now < t) {
                continue;
            }
            match path_to(
                &consensus,
                &self.cfg.paths,
                self.guard.as_ref(),
                slot.hop.clone(),
                SHORT_ONION_HOPS,
                &mut self.rng,
            ) {
                Ok(path) => {
                    self.guard.get_or_insert(path[0].identity);
                    let circ = core.launch_circuit(path, now);
                    debug!(?circ, relay = %slot.hop.identity, "building introduction circuit");
                    self.slots[i].circ = Some(circ);
                }
                Err(e) => {
                    warn!(error = %e, "no path to an introduction point");
                    self.slots[i].retry_at = Some(now + Duration::from_secs(1));
                }
            }
        }
        if unix > 0 {
            self.maybe_publish(now, unix);
        }
    }

    /// Add introduction points up to the number configured, from relays not used yet.
    fn fill_slots(&mut self, consensus: &Consensus) {
        let want = self.cfg.intro_points.clamp(1, chive_dir::MAX_INTRO_POINTS);
        if self.slots.len() >= want {
            return;
        }
        let unused: Vec<_> = usable_relays(consensus)
            .into_iter()
            .filter(|r| !self.slots.iter().any(|s| s.hop.identity == r.identity))
            .collect();
        // Relays just replaced, and relays our pinned paths (EntryNodes/MiddleNodes) need
        // before the last hop, go last.
        let (mut cands, mut later): (Vec<_>, Vec<_>) = unused
            .into_iter()
            .partition(|r| !self.replaced.contains(&r.identity) && !self.cfg.paths.pins(r));
        cands.shuffle(&mut self.rng);
        later.shuffle(&mut self.rng);
        cands.extend(later);
        let sub = self.address.subcredential();
        for r in cands.into_iter().take(want - self.slots.len()) {
            self.slots.push(IntroSlot {
                hop: hop_of(r),
                keys: OnionServiceIntro::generate(&mut self.rng, sub, DEFAULT_REPLAY_CACHE),
                circ: None,
                established: false,
                failures: 0,
                retry_at: None,
            });
        }
    }

    fn maybe_publish(&mut self, now: Instant, unix: u64) {
        if self.retry_publish_at.is_some_and(|t| now < t) {
            return;
        }
        let up = self.established();
        if up == 0 {
            return;
        }
        let all_up = up == self.slots.len();
        let changed = self
            .dirty_since
            .is_some_and(|t| all_up || now.duration_since(t) >= PUBLISH_SETTLE);
        let due = self.republish_at.is_some_and(|t| now >= t);
        let retry = self.retry_publish_at.is_some();
        if !(changed || due || retry) {
            return;
        }
        let lifetime = self.cfg.descriptor_lifetime.as_secs().max(60);
        self.revision = (self.revision + 1).max(unix.saturating_mul(1000));
        let desc = OnionDescriptor {
            address: self.address,
            revision: self.revision,
            valid_after: unix,
            valid_until: unix + lifetime,
            intro_points: self
                .slots
                .iter()
                .filter(|s| s.established)
                .map(|s| {
                    let p = s.keys.public();
                    IntroPoint {
                        relay: s.hop.identity,
                        onion_key: s.hop.ntor_key,
                        addresses: vec![s.hop.addr],
                        auth_key: p.auth_key,
                        enc_key: p.enc_key,
                    }
                })
                .collect(),
        };
        match desc.sign(&self.cfg.identity) {
            Ok(doc) => {
                self.counters.descriptors_published += 1;
                self.actions.push_back(ServiceAction::Publish {
                    doc,
                    revision: self.revision,
                    intro_points: up,
                });
            }
            Err(e) => warn!(error = %e, "cannot sign the onion descriptor"),
        }
        self.dirty_since = None;
        self.retry_publish_at = None;
        self.republish_at = Some(now + Duration::from_secs(lifetime / 2));
    }
}

fn add_stats(total: &mut ServiceStats, s: &ServiceStats) {
    total.accepted += s.accepted;
    total.malformed += s.malformed;
    total.undecryptable += s.undecryptable;
    total.replayed += s.replayed;
    total.bad_rendezvous_point += s.bad_rendezvous_point;
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
