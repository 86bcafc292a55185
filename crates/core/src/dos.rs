//! Denial-of-service defences keyed by the client's address, as in C tor's dos.c: the
//! circuit-creation defence (`DoSCircuitCreation*`) and the connection defence
//! (`DoSConnection*`). Sans-IO: every call takes `now`; the core calls it on CREATE2 and when
//! client channels open and close, the driver asks [`DosGuard::allow_connection`] (through
//! `Core::allow_connection`) before it starts a link handshake.
//!
//! Only client connections are counted: a channel whose peer authenticated as a relay is not
//! limited (Tor exempts known relays), and a channel without an address is not tracked.
//!
//! **Circuit creation.** Every address has a token bucket of `DoSCircuitCreationBurst` tokens,
//! refilled at `DoSCircuitCreationRate` per second (whole seconds, as Tor). Every CREATE2 from
//! the address takes a token, even one that is then refused or malformed. An address whose
//! bucket is empty while it has at least `DoSCircuitCreationMinConnections` client connections
//! open is *marked* for `DoSCircuitCreationDefenseTimePeriod` plus a random part of up to half
//! that again (so the end is hard to predict); while marked, its CREATE2 cells are answered with
//! DESTROY (RESOURCELIMIT) if `DoSCircuitCreationDefenseType` is 2 (refuse cell). A client that
//! keeps creating while marked stays marked.
//!
//! **Connections.** An address with more than `DoSConnectionMaxConcurrentCount` client
//! connections open may not open another while the defence type is 2 (close). Every new client
//! connection takes a token from a second bucket (`DoSConnectionConnectBurst`, refilled at
//! `DoSConnectionConnectRate` per second); when it runs empty the address is marked for
//! `DoSConnectionConnectDefenseTimePeriod` (plus up to half again) and may not connect at all.
//!
//! **Stream creation** (Tor 0.4.9's `DoSStreamCreation*`, per circuit, not per address): every
//! circuit ending at this exit has a bucket of `DoSStreamCreationBurst` tokens, refilled at
//! `DoSStreamCreationRate` per second; each well-formed BEGIN and each RESOLVE takes one. One
//! arriving at an empty bucket gets the `DoSStreamCreationDefenseType` answer: 2 (default)
//! refuses that stream (a BEGIN with END, reason MISC, as Tor: RESOURCELIMIT would make the
//! client avoid the exit; a RESOLVE with a RESOLVED transient error), 3 closes the circuit
//! (DESTROY, RESOURCELIMIT), 1 lets it through. Every one of them is counted, type 1 included
//! (Tor's `dos_stream_new_begin_or_resolve_cell` counts before it looks at the type). The
//! bucket lives in the circuit ([`StreamBucket`]), so it costs nothing per address and dies
//! with the circuit.
//!
//! Memory: an address has an entry while it has client connections, is marked, or has a bucket
//! that is not yet full again; idle entries are dropped by a sweep every
//! [`SWEEP_INTERVAL`], so the map is bounded by the addresses active in the last
//! `burst / rate` seconds plus the marked ones.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::Rng;
use tracing::{debug, info};

/// How often idle entries are looked for.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// `DoSCircuitCreationDefenseType` / `DoSConnectionDefenseType`: what happens to a marked
/// address (Tor: 1 = none, 2 = refuse the cell / close the connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefenseType {
    /// Detect and count, but let everything through.
    None,
    /// Refuse: CREATE2 is answered with DESTROY (RESOURCELIMIT), a connection is closed.
    Refuse,
}

impl DefenseType {
    /// From Tor's number (1 none, 2 refuse/close); other values are out of range.
    pub fn from_tor(v: i64) -> Option<DefenseType> {
        match v {
            1 => Some(DefenseType::None),
            2 => Some(DefenseType::Refuse),
            _ => None,
        }
    }
}

/// The circuit-creation defence's settings (Tor's names and defaults, dos.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitCreationConfig {
    /// `DoSCircuitCreationEnabled` (default off; Tor's consensus turns it on).
    pub enabled: bool,
    /// `DoSCircuitCreationMinConnections`: client connections an address must have open
    /// before it can be marked (default 3).
    pub min_connections: u32,
    /// `DoSCircuitCreationRate`: tokens added per second (default 3).
    pub rate: u32,
    /// `DoSCircuitCreationBurst`: the bucket's size (default 90).
    pub burst: u32,
    /// `DoSCircuitCreationDefenseType` (default refuse: DESTROY with RESOURCELIMIT).
    pub defense: DefenseType,
    /// `DoSCircuitCreationDefenseTimePeriod` (default 1 hour).
    pub defense_time: Duration,
}

impl Default for CircuitCreationConfig {
    fn default() -> Self {
        CircuitCreationConfig {
            enabled: false,
            min_connections: 3,
            rate: 3,
            burst: 90,
            defense: DefenseType::Refuse,
            defense_time: Duration::from_secs(60 * 60),
        }
    }
}

/// The connection defence's settings (Tor's names and defaults, dos.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// `DoSConnectionEnabled` (default off; Tor's consensus turns it on).
    pub enabled: bool,
    /// `DoSConnectionMaxConcurrentCount`: above this many open client connections an address
    /// may not open another (default 100).
    pub max_concurrent: u32,
    /// `DoSConnectionDefenseType` (default close).
    pub defense: DefenseType,
    /// `DoSConnectionConnectRate`: new connections per second (default 20).
    pub connect_rate: u32,
    /// `DoSConnectionConnectBurst` (default 40).
    pub connect_burst: u32,
    /// `DoSConnectionConnectDefenseTimePeriod` (default 24 hours, at least 10 s).
    pub connect_defense_time: Duration,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            enabled: false,
            max_concurrent: 100,
            defense: DefenseType::Refuse,
            connect_rate: 20,
            connect_burst: 40,
            connect_defense_time: Duration::from_secs(24 * 60 * 60),
        }
    }
}

/// `DoSStreamCreationDefenseType`: what a BEGIN or RESOLVE past its circuit's bucket gets
/// (Tor: 1 none, 2 refuse the stream, 3 close the circuit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamDefense {
    /// Count it, let it through.
    None,
    /// Refuse that stream (BEGIN: END, reason MISC; RESOLVE: RESOLVED with a transient
    /// error, as Tor); the circuit stays.
    RefuseStream,
    /// Close the circuit with DESTROY (RESOURCELIMIT).
    CloseCircuit,
}

impl StreamDefense {
    /// From Tor's number (1 none, 2 refuse the stream, 3 close the circuit).
    pub fn from_tor(v: i64) -> Option<StreamDefense> {
        match v {
            1 => Some(StreamDefense::None),
            2 => Some(StreamDefense::RefuseStream),
            3 => Some(StreamDefense::CloseCircuit),
            _ => None,
        }
    }
}

/// The stream-creation defence's settings (Tor 0.4.9's names and defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamCreationConfig {
    /// `DoSStreamCreationEnabled` (default off; Tor's consensus turns it on).
    pub enabled: bool,
    /// `DoSStreamCreationRate`: BEGIN/RESOLVE tokens a circuit gets back per second
    /// (default 100).
    pub rate: u32,
    /// `DoSStreamCreationBurst`: a circuit's bucket size (default 300).
    pub burst: u32,
    /// `DoSStreamCreationDefenseType` (default refuse the stream).
    pub defense: StreamDefense,
}

impl Default for StreamCreationConfig {
    fn default() -> Self {
        StreamCreationConfig {
            enabled: false,
            rate: 100,
            burst: 300,
            defense: StreamDefense::RefuseStream,
        }
    }
}

/// A circuit's stream-creation bucket (kept in the circuit, made full at its first BEGIN or
/// RESOLVE: the same as Tor's, made full when the circuit is).
#[derive(Clone, Copy, Debug)]
pub struct StreamBucket(Bucket);

/// The defences' settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DosConfig {
    /// `DoSCircuitCreation*`.
    pub circuit_creation: CircuitCreationConfig,
    /// `DoSConnection*`.
    pub connection: ConnectionConfig,
    /// `DoSStreamCreation*`.
    pub stream_creation: StreamCreationConfig,
    /// `DoSRefuseSingleHopClientRendezvous`: drop an ESTABLISH_RENDEZVOUS arriving straight
    /// from a client's channel (a single-hop rendezvous circuit), as Tor's
    /// `rend_mid_establish_rendezvous` (default off).
    pub refuse_single_hop_rendezvous: bool,
}

impl DosConfig {
    fn any_enabled(&self) -> bool {
        self.circuit_creation.enabled || self.connection.enabled
    }
}

/// Counters for metrics and the heartbeat (Tor's `dos_log_heartbeat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DosStats {
    /// CREATE2 cells refused because their address was marked.
    pub circuits_refused: u64,
    /// Times an unmarked address was marked by the circuit-creation defence.
    pub addresses_marked: u64,
    /// Connections refused for too many open at once.
    pub connections_refused_concurrent: u64,
    /// Connections refused because the address was marked for its connect rate.
    pub connections_refused_rate: u64,
    /// BEGIN/RESOLVE cells that found their circuit's stream bucket empty: refused (type 2),
    /// closed their circuit (type 3) or, with type 1, let through (Tor counts those too, as
    /// its heartbeat's "stream rejected").
    pub streams_refused: u64,
    /// ESTABLISH_RENDEZVOUS cells dropped for coming from a single-hop client
    /// (`DoSRefuseSingleHopClientRendezvous`).
    pub single_hop_refused: u64,
    /// Addresses tracked now.
    pub tracked_addresses: usize,
}

impl DosStats {
    /// What the counters grew by from `earlier` to `self` (saturating if one shrank);
    /// `tracked_addresses`, a gauge, is `self`'s.
    pub fn since(&self, earlier: &DosStats) -> DosStats {
        DosStats {
            circuits_refused: self
                .circuits_refused
                .saturating_sub(earlier.circuits_refused),
            addresses_marked: self
                .addresses_marked
                .saturating_sub(earlier.addresses_marked),
            connections_refused_concurrent: self
                .connections_refused_concurrent
                .saturating_sub(earlier.connections_refused_concurrent),
            connections_refused_rate: self
                .connections_refused_rate
                .saturating_sub(earlier.connections_refused_rate),
            streams_refused: self.streams_refused.saturating_sub(earlier.streams_refused),
            single_hop_refused: self
                .single_hop_refused
                .saturating_sub(earlier.single_hop_refused),
            tracked_addresses: self.tracked_addresses,
        }
    }
}

/// A token bucket counted in whole tokens and refilled in whole seconds, as Tor's DoS buckets.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    last_refill: Instant,
}

impl Bucket {
    fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            last_refill: now,
        }
    }

    /// Add `rate` tokens per whole second since the last refill, up to `burst`. The fraction of
    /// a second left over counts toward the next refill.
    fn refill(&mut self, rate: u32, burst: u32, now: Instant) {
        let secs = now.saturating_duration_since(self.last_refill).as_secs();
        if secs == 0 {
            // A lowered burst still applies at once.
            self.tokens = self.tokens.min(burst);
            return;
        }
        let add = secs.saturating_mul(u64::from(rate));
        self.tokens = u64::from(self.tokens)
            .saturating_add(add)
            .min(u64::from(burst)) as u32;
        self.last_refill += Duration::from_secs(secs);
    }

    /// Take one token if there is one.
    fn take(&mut self) {
        self.tokens = self.tokens.saturating_sub(1);
    }
}

/// What the defences know about one client address.
#[derive(Clone, Copy, Debug)]
struct AddrState {
    /// Client connections open now (tracked ones only).
    connections: u32,
    circuits: Bucket,
    circuits_marked_until: Option<Instant>,
    connects: Bucket,
    connects_marked_until: Option<Instant>,
}

/// The per-address state of both defences. One per [`crate::Core`].
pub struct DosGuard {
    cfg: DosConfig,
    addrs: HashMap<IpAddr, AddrState>,
    next_sweep: Option<Instant>,
    stats: DosStats,
}

/// `period` plus a random part of 1 s up to half the period (Tor's `crypto_rand_int_range(1,
/// period / 2)`), so an attacker cannot time the end of its punishment.
fn defense_end(period: Duration, now: Instant, rng: &mut impl Rng) -> Instant {
    let half = period.as_secs() / 2;
    let extra = if half > 1 { rng.gen_range(1..half) } else { 0 };
    now + period + Duration::from_secs(extra)
}

impl DosGuard {
    /// Defences with these settings and no address known yet.
    pub fn new(cfg: DosConfig) -> DosGuard {
        DosGuard {
            cfg,
            addrs: HashMap::new(),
            next_sweep: None,
            stats: DosStats::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> DosConfig {
        self.cfg
    }

    /// New settings (a new consensus). Addresses keep their state; buckets are capped to a
    /// lowered burst at their next refill.
    pub fn set_config(&mut self, cfg: DosConfig) {
        self.cfg = cfg;
    }

    /// Counters.
    pub fn stats(&self) -> DosStats {
        DosStats {
            tracked_addresses: self.addrs.len(),
            ..self.stats
        }
    }

    fn entry(&mut self, addr: IpAddr, now: Instant) -> &mut AddrState {
        let (cc, conn) = (&self.cfg.circuit_creation, &self.cfg.connection);
        self.addrs.entry(addr).or_insert_with(|| AddrState {
            connections: 0,
            circuits: Bucket::full(cc.burst, now),
            circuits_marked_until: None,
            connects: Bucket::full(conn.connect_burst, now),
            connects_marked_until: None,
        })
    }

    /// Whether `addr` may open a new connection (Tor's `dos_conn_addr_get_defense_type`): not
    /// while it is marked for its connect rate, nor while it has more than
    /// `DoSConnectionMaxConcurrentCount` client connections open.
    pub fn allow_connection(&mut self, addr: IpAddr, now: Instant) -> bool {
        let conn = self.cfg.connection;
        if !conn.enabled {
            return true;
        }
        let Some(st) = self.addrs.get_mut(&addr) else {
            return true;
        };
        if st.connects_marked_until.is_some_and(|t| t >= now) {
            self.stats.connections_refused_rate += 1;
            return conn.defense == DefenseType::None;
        }
        // The mark ran out: the address may be marked again.
        st.connects_marked_until = None;
        if st.connections > conn.max_concurrent {
            self.stats.connections_refused_concurrent += 1;
            return conn.defense == DefenseType::None;
        }
        true
    }

    /// A client connection from `addr` finished its handshake. Returns whether it is tracked
    /// (then [`DosGuard::client_disconnected`] must follow when it closes); nothing is tracked
    /// while both defences are off.
    pub fn client_connected(&mut self, addr: IpAddr, now: Instant, rng: &mut impl Rng) -> bool {
        if !self.cfg.any_enabled() {
            return false;
        }
        self.sweep(now);
        let conn = self.cfg.connection;
        let st = self.entry(addr, now);
        st.connections += 1;
        st.connects
            .refill(conn.connect_rate, conn.connect_burst, now);
        st.connects.take();
        // Mark once; marking again while marked would extend the block at every attempt.
        if st.connects.tokens == 0 && st.connects_marked_until.is_none() {
            st.connects_marked_until = Some(defense_end(conn.connect_defense_time, now, rng));
            info!(%addr, "DoS: address opens connections too fast: marked");
        }
        true
    }

    /// A tracked client connection from `addr` closed.
    pub fn client_disconnected(&mut self, addr: IpAddr, now: Instant) {
        if let Some(st) = self.addrs.get_mut(&addr) {
            st.connections = st.connections.saturating_sub(1);
        }
        self.sweep(now);
    }

    /// A CREATE2 arrived on a client channel from `addr` (Tor's `dos_cc_new_create_cell`):
    /// take a token, and mark the address if its bucket is empty while it holds at least
    /// `DoSCircuitCreationMinConnections` connections.
    pub fn on_create(&mut self, addr: IpAddr, now: Instant, rng: &mut impl Rng) {
        let cc = self.cfg.circuit_creation;
        if !cc.enabled {
            return;
        }
        // Only addresses with a tracked connection have an entry; a channel opened while
        // the defences were off has none (as Tor's geoip cache).
        let Some(st) = self.addrs.get_mut(&addr) else {
            return;
        };
        st.circuits.refill(cc.rate, cc.burst, now);
        st.circuits.take();
        if st.circuits.tokens == 0 && st.connections >= cc.min_connections {
            if st.circuits_marked_until.is_none_or(|t| t < now) {
                self.stats.addresses_marked += 1;
                info!(%addr, "DoS: circuit creation flood from address: marked");
            }
            st.circuits_marked_until = Some(defense_end(cc.defense_time, now, rng));
        }
    }

    /// Whether a CREATE2 from `addr` must be refused (Tor's `dos_cc_get_defense_type`).
    pub fn refuse_create(&mut self, addr: IpAddr, now: Instant) -> bool {
        let cc = self.cfg.circuit_creation;
        if !cc.enabled {
            return false;
        }
        let marked = self
            .addrs
            .get(&addr)
            .and_then(|st| st.circuits_marked_until)
            .is_some_and(|t| t >= now);
        if !marked {
            return false;
        }
        self.stats.circuits_refused += 1;
        debug!(%addr, "DoS: refusing CREATE2 from marked address");
        cc.defense == DefenseType::Refuse
    }

    /// A BEGIN or RESOLVE arrived on a circuit ending here (Tor's
    /// `dos_stream_new_begin_or_resolve_cell`): take a token from the circuit's bucket (made
    /// full on first use). `None`: let it through; otherwise the defence to apply. A cell
    /// that finds the bucket empty is counted whatever the defence type, as in Tor.
    pub fn on_stream(
        &mut self,
        bucket: &mut Option<StreamBucket>,
        now: Instant,
    ) -> Option<StreamDefense> {
        let sc = self.cfg.stream_creation;
        if !sc.enabled {
            return None;
        }
        let StreamBucket(b) = bucket.get_or_insert(StreamBucket(Bucket::full(sc.burst, now)));
        b.refill(sc.rate, sc.burst, now);
        if b.tokens > 0 {
            b.take();
            return None;
        }
        self.stats.streams_refused += 1;
        if sc.defense == StreamDefense::None {
            return None;
        }
        debug!(
            "DoS: stream creation over its circuit's rate: {:?}",
            sc.defense
        );
        Some(sc.defense)
    }

    /// An ESTABLISH_RENDEZVOUS came straight from a client's channel: `true` if it must be
    /// dropped (`DoSRefuseSingleHopClientRendezvous`; counted, as Tor's
    /// `dos_note_refuse_single_hop_client`).
    pub fn refuse_single_hop_rendezvous(&mut self) -> bool {
        if !self.cfg.refuse_single_hop_rendezvous {
            return false;
        }
        self.stats.single_hop_refused += 1;
        true
    }

    /// Drop entries that hold nothing worth keeping: no connection, no mark in force, both
    /// buckets full again (a new entry would be the same). At most once per [`SWEEP_INTERVAL`].
    fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + SWEEP_INTERVAL);
        let (cc, conn) = (self.cfg.circuit_creation, self.cfg.connection);
        self.addrs.retain(|_, st| {
            st.circuits.refill(cc.rate, cc.burst, now);
            st.connects
                .refill(conn.connect_rate, conn.connect_burst, now);
            let marked = |m: Option<Instant>| m.is_some_and(|t| t >= now);
            st.connections > 0
                || marked(st.circuits_marked_until)
                || marked(st.connects_marked_until)
                || st.circuits.tokens < cc.burst
                || st.connects.tokens < conn.connect_burst
        });
    }
}

pub mod heartbeat;

#[cfg(test)]
mod tests;
