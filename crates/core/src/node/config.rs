//! What a node is configured with: [`CoreConfig`] (policies and limits), [`RelayKeys`],
//! and [`HopSpec`] (one hop of a circuit a client builds).

use std::net::SocketAddr;
use std::time::Duration;

use chive_crypto::ntor::{NtorPublicKey, NtorSecretKey};
use chive_crypto::IdentityKey;

use crate::cc::CcKind;
use crate::dos::DosConfig;
use crate::sched::SchedulerKind;

use super::oom::DEFAULT_MAX_MEM_IN_QUEUES;
#[cfg(doc)]
use super::{oom::max_mem_in_queues_auto, Core};

/// The keys that make a node a relay.
pub struct RelayKeys {
    /// The relay's Ed25519 identity (public half; the link layer holds the secret).
    pub identity: IdentityKey,
    /// The relay's ntor onion key.
    pub ntor: NtorSecretKey,
}

/// Core configuration. Everything a policy may vary lives here, chosen per node.
pub struct CoreConfig {
    /// Initial circuit package window (`circwindow`, 100..=1000), from the consensus.
    pub circwindow: u32,
    /// This node's own circuit window (a relay's `CircuitWindow`), overriding `circwindow`
    /// for the circuits it packages (its exit streams; a client's uploads). `None` = follow
    /// the consensus. Clamped to 100..=1000 when used.
    pub circwindow_override: Option<u32>,
    /// Congestion-control policy for the circuits this node packages (consensus `cc_alg`).
    /// [`CcKind::Fixed`] uses the circuit window above.
    pub congestion_control: CcKind,
    /// Scheduling policy for every channel.
    pub scheduler: SchedulerKind,
    /// A circuit whose queue in one direction grows past this is destroyed (the
    /// peer ignores flow control).
    pub max_circuit_queue: usize,
    /// Circuits a single channel may carry.
    pub max_circuits_per_channel: usize,
    /// `MaxMemInQueues`, in bytes: what circuit queues and the buffers the driver reports
    /// ([`Core::channel_buffered`]) may hold together. When reached, the OOM handler kills the
    /// circuits whose oldest queued cell is oldest until at most 90 % is in use (`node/oom.rs`).
    /// Default [`DEFAULT_MAX_MEM_IN_QUEUES`] (256 MiB); [`max_mem_in_queues_auto`] is Tor's
    /// rule from the machine's RAM.
    pub max_mem_in_queues: usize,
    /// The DoS defences (`DoSCircuitCreation*`, `DoSConnection*`); all off by default, as in
    /// Tor, where the consensus turns them on.
    pub dos: DosConfig,
    /// Origin circuits not built within this time are closed.
    pub circuit_build_timeout: Duration,
    /// Relay keys; `None` for a pure client.
    pub relay: Option<RelayKeys>,
    /// Whether this relay opens exit streams (the driver applies the exit policy).
    pub exit: bool,
    /// Sample one cell in this many for per-cell timing (0 = off).
    pub cell_sample_every: u64,
    /// `PerClientQueueCells`: at an entry, once the cells queued here toward one *client's*
    /// channel pass this many, that client's upstream relay cells on its circuits that have
    /// cells queued here are held back (its SENDMEs, so its windows stop refilling) and let
    /// go as the queue drains (`node/client_hold.rs`, docs/security.md "EWMA gaming").
    /// 0 = off.
    pub client_queue_cap: usize,
    /// `ClientCircuitWindow`: with `client_queue_cap` on, each circuit of a client on which
    /// the client sent a relay cell within [`super::client_hold::OWED_FORGET`] is taken to
    /// have up to this many cells in flight toward this entry, less those that arrived since
    /// (a new stream's window: what one BEGIN or SENDME can set moving before anything is
    /// queued here). The bound then counts the client's queue here *plus* that estimate, and
    /// holds the client's cells on any of its circuits while it is past the cap (new circuits
    /// too). 0 = off: only what is queued here counts (`node/client_hold.rs`).
    pub client_circuit_window: usize,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            circwindow: 1000,
            circwindow_override: None,
            congestion_control: CcKind::Fixed,
            scheduler: SchedulerKind::default(),
            max_circuit_queue: 2500,
            max_circuits_per_channel: 20_000,
            max_mem_in_queues: DEFAULT_MAX_MEM_IN_QUEUES,
            dos: DosConfig::default(),
            circuit_build_timeout: Duration::from_secs(30),
            relay: None,
            exit: false,
            cell_sample_every: 0,
            client_queue_cap: 0,
            client_circuit_window: 0,
        }
    }
}

/// Where and how to reach one hop of a circuit the client builds.
#[derive(Clone, Debug)]
pub struct HopSpec {
    /// Ed25519 identity (from the consensus).
    pub identity: IdentityKey,
    /// ntor onion key (from the consensus).
    pub ntor_key: NtorPublicKey,
    /// ORPort address.
    pub addr: SocketAddr,
}
