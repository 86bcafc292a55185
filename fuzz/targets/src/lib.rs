//! chive-fuzz-targets: one function per fuzz target, taking the fuzzer's bytes.
//!
//! The cargo-fuzz binaries in `fuzz/fuzz_targets/` are one-line wrappers around these, and the
//! stable test `tests/replay.rs` runs every checked-in seed and regression input through the
//! same functions, so `make test` keeps covering what the fuzzers found without nightly.
//!
//! Every target asserts at least "no panic"; where the format allows it, also a round trip
//! (decode → encode → decode gives the same value) or another property named in its docs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Shared by the message targets (`relay`, `onion`): defined before the modules that use it.
/// Decode, and when that succeeds, check that encoding and decoding again gives the same value.
macro_rules! round_trip {
    ($ty:ty, $body:expr, fallible) => {
        if let Ok(m) = <$ty>::decode($body) {
            let enc = m
                .encode()
                .expect(concat!(stringify!($ty), " decoded but cannot encode"));
            assert_eq!(
                <$ty>::decode(&enc).as_ref(),
                Ok(&m),
                "{} round trip",
                stringify!($ty)
            );
        }
    };
    ($ty:ty, $body:expr) => {
        if let Ok(m) = <$ty>::decode($body) {
            let enc = m.encode();
            assert_eq!(
                <$ty>::decode(&enc).as_ref(),
                Ok(&m),
                "{} round trip",
                stringify!($ty)
            );
        }
    };
}

/// `genuine` changed by the fuzzer's `input` (targets that must start from a message only they
/// can make, e.g. one carrying a MAC): `input` XORed in byte by byte and, where it is longer,
/// appended; with `cut`, the result is cut to `input`'s length.
pub(crate) fn changed(genuine: &[u8], input: &[u8], cut: bool) -> Vec<u8> {
    let mut out = genuine.to_vec();
    for (i, b) in input.iter().enumerate() {
        match out.get_mut(i) {
            Some(o) => *o ^= b,
            None => out.push(*b),
        }
    }
    if cut {
        out.truncate(input.len());
    }
    out
}

mod cell;
mod client_core;
mod config;
mod core_harness;
mod dir;
mod handover;
mod handshake;
mod http;
mod io;
mod more_seeds;
mod ntor;
mod onion;
mod records;
mod relay;
mod relay_core;
pub mod seeds;
mod socks;
mod split;

pub use cell::cell;
pub use client_core::client_core;
pub use config::config;
pub use dir::{consensus, descriptor, exit_policy};
pub use handover::record_handover;
pub use handshake::link_handshake;
pub use http::{http_response, http_server};
pub use ntor::ntor;
pub use onion::{onion_descriptor, onion_msg};
pub use records::tls_records;
pub use relay::relay_msg;
pub use relay_core::relay_core;
pub use socks::socks;
pub use split::split_handoff;

/// A fuzz target: takes arbitrary bytes, panics on a bug.
pub type Target = fn(&[u8]);

/// Every target by name (the name of its cargo-fuzz binary and of its seed directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("cell", cell),
    ("relay_msg", relay_msg),
    ("link_handshake", link_handshake),
    ("socks", socks),
    ("consensus", consensus),
    ("descriptor", descriptor),
    ("exit_policy", exit_policy),
    ("onion_msg", onion_msg),
    ("onion_descriptor", onion_descriptor),
    ("split_handoff", split_handoff),
    ("http_server", http_server),
    ("http_response", http_response),
    ("config", config),
    ("ntor", ntor),
    ("tls_records", tls_records),
    ("record_handover", record_handover),
    ("relay_core", relay_core),
    ("client_core", client_core),
];
