//! chive-dir: the directory documents of chive, with no IO and no clock.
//!
//! - [`policy`]: exit policies in torrc syntax ([`ExitPolicy`]).
//! - [`params`]: consensus network parameters ([`NetParams`]); [`cc_params`]: those of
//!   circuit congestion control ([`CongestionParams`]).
//! - [`descriptor`]: signed relay descriptors ([`RelayDescriptor`]).
//! - [`consensus`]: the signed consensus, relay flags and the pure functions an
//!   authority uses to build it ([`Consensus`], [`assign_flags`], [`build_consensus`]).
//! - [`onion`]: onion service descriptors ([`OnionDescriptor`], [`IntroPoint`]).
//!
//! Every function that depends on time takes `now` (UNIX seconds) from its caller, so
//! everything here is deterministic and unit-testable.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cc_params;
pub mod consensus;
pub mod descriptor;
mod document;
pub mod dos_params;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod onion;
pub mod params;
pub mod policy;

pub use cc_params::CongestionParams;
pub use consensus::{
    assign_flags, build_consensus, Consensus, ConsensusRelay, FlagPolicy, RelayFlags,
    CONSENSUS_CLOCK_SKEW, MAX_CONSENSUS_LEN, MAX_RELAYS,
};
pub use descriptor::{valid_nickname, RelayDescriptor, MAX_DESCRIPTOR_LEN};
pub use onion::{
    IntroPoint, OnionDescriptor, MAX_INTRO_POINTS, MAX_ONION_DESCRIPTOR_LEN,
    ONION_DESCRIPTOR_CLOCK_SKEW,
};
pub use params::{
    NetParams, ParamSpec, SwitchingMode, SwitchingParams, CHANNEL_FAIRNESS,
    CIRCUIT_PRIORITY_HALFLIFE_MSEC, CIRCUIT_SWITCHING, CIRCWINDOW, CLIENT_CIRCUIT_WINDOW,
    KNOWN_PARAMS, OUTBUF_CELLS, PER_CLIENT_QUEUE_CELLS, SWITCH_ALPHA_MILLI, SWITCH_BETA_MILLI,
    SWITCH_BUFFER_BYTES, SWITCH_GAMMA_MILLI, SWITCH_SAMPLE_INTERVAL_MSEC, SWITCH_TIMEOUT_MSEC,
};
pub use policy::{AddrPattern, ExitPolicy, PolicyRule, PortRange};

/// Everything that can go wrong reading or checking a directory document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirError {
    /// The consensus signature is missing, unreadable or wrong.
    #[error("consensus signature does not verify: tampered or signed by another authority")]
    BadSignature,
    /// A relay descriptor's signature is missing, unreadable or wrong.
    #[error(
        "descriptor signature does not verify: tampered or not signed by the identity it names"
    )]
    BadDescriptorSignature,
    /// The consensus is past its `valid_until` (beyond the allowed clock skew).
    #[error(
        "consensus expired: valid until {valid_until}, now {now} ({} s late); fetch a fresh one or check the clock",
        now.saturating_sub(*valid_until)
    )]
    Expired {
        /// End of the consensus validity (UNIX seconds).
        valid_until: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// The consensus starts in the future (beyond the allowed clock skew).
    #[error(
        "consensus not yet valid: valid after {valid_after}, now {now} ({} s early); check the clock",
        valid_after.saturating_sub(*now)
    )]
    NotYetValid {
        /// Start of the consensus validity (UNIX seconds).
        valid_after: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// A document is larger than its limit.
    #[error("{what} too large: {size} bytes, limit {max}")]
    TooLarge {
        /// Which kind of document.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A correctly signed document (or a config value) whose content is invalid.
    #[error("malformed directory document: {0}")]
    Malformed(String),
    /// An exit policy rule that does not parse.
    #[error("bad exit policy: {0}")]
    BadPolicy(String),
    /// A network parameter with a bad name or value.
    #[error("bad network parameter: {0}")]
    BadParam(String),
    /// An onion service descriptor's signature is missing, unreadable, or not by the service's
    /// identity key.
    #[error("onion descriptor signature does not verify: tampered or not signed by the service")]
    BadOnionSignature,
    /// An onion service descriptor is for another service than the one asked for.
    #[error("onion descriptor is for {got}, not {expected}")]
    WrongOnionAddress {
        /// The address asked for.
        expected: String,
        /// The address label the descriptor names (truncated).
        got: String,
    },
    /// An onion service descriptor is past its `valid_until` (beyond the clock skew).
    #[error(
        "onion descriptor expired: valid until {valid_until}, now {now} ({} s late)",
        now.saturating_sub(*valid_until)
    )]
    OnionExpired {
        /// End of validity (UNIX seconds).
        valid_until: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// An onion service descriptor starts in the future (beyond the clock skew).
    #[error(
        "onion descriptor not yet valid: valid after {valid_after}, now {now} ({} s early); check the clock",
        valid_after.saturating_sub(*now)
    )]
    OnionNotYetValid {
        /// Start of validity (UNIX seconds).
        valid_after: u64,
        /// The verifier's clock.
        now: u64,
    },
    /// A relay nickname that is not 1-19 ASCII letters and digits.
    #[error("bad nickname {0:?}: must be 1-19 ASCII letters or digits")]
    BadNickname(String),
}
