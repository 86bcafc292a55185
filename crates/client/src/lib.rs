//! chive-client: the client side of chive, minus the sockets.
//!
//! - [`socks`]: the SOCKS4a/5 server protocol (what applications speak to us).
//! - [`path`]: bandwidth-weighted guard / middle / exit selection from a consensus.
//! - [`circmgr`]: which circuit a stream goes on (reuse, isolation, dirtiness,
//!   preemptive circuits), driving a sans-IO [`chive_core::Core`].
//! - [`predict`]: exits that pinned requests used recently, kept with clean circuits.
//! - [`down`]: relays the client believes down after a failure, and for how long.
//! - [`cc`]: the consensus's congestion-control parameters as the core's policy choice.
//! - [`onion`]: onion services: a service's introduction points, descriptor and rendezvous
//!   circuits ([`onion::OnionService`]), and a client's connections to services
//!   ([`onion::OnionConnector`]), driving the core's onion state machines.
#![forbid(unsafe_code)]

pub mod begin;
pub mod cc;
pub mod circmgr;
pub mod down;
pub mod onion;
pub mod path;
pub mod predict;
pub mod socks;
