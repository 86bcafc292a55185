//! Onion services (rend-spec v3 in its essentials; what chive simplifies is in docs/protocol.md,
//! "Onion services"): the four roles as sans-IO state, one file each.
//!
//! - [`intro`]: an introduction point's table of service circuits (ESTABLISH_INTRO checked
//!   against the circuit's KH and the auth key's signature; INTRODUCE1 → INTRODUCE2 + ACK).
//! - [`rend`]: a rendezvous point's cookie table (ESTABLISH_RENDEZVOUS; RENDEZVOUS1 →
//!   RENDEZVOUS2 and the pair of circuits to splice).
//! - [`service`]: the service's answer to INTRODUCE2 (replay check, hs-ntor, where to meet,
//!   RENDEZVOUS1, the end-to-end keys) and its ESTABLISH_INTRO.
//! - [`client`]: the client's side of one connection (cookie, INTRODUCE1, RENDEZVOUS2 → keys).
//!
//! These hold no circuits: `Core` (`node/onion.rs`) feeds them relay message bodies and acts on
//! what they return; the tables are generic over the circuit key so they test on their own.

pub mod client;
pub mod intro;
pub mod rend;
pub mod service;

pub use client::{ClientRendezvous, OnionClientError};
pub use intro::{IntroError, IntroPointTable};
pub use rend::{RendError, RendezvousTable};
pub use service::{IntroduceAccepted, IntroduceError, OnionServiceIntro, ServiceStats};

#[cfg(test)]
mod tests;
