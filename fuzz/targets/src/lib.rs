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

mod cell;
mod dir;
mod handshake;
mod io;
mod relay;
pub mod seeds;
mod socks;

pub use cell::cell;
pub use dir::{consensus, descriptor, exit_policy};
pub use handshake::link_handshake;
pub use relay::relay_msg;
pub use socks::socks;

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
];
