//! chive-core's integration tests, one test binary (each `tests/*.rs` file would be a binary of
//! its own, linked against the whole dependency graph; one binary links once). Each module is
//! one former test file; `common` is the hand-driven path they share, `sim` the whole overlay in
//! memory that the multi-node tests share.
//!
//! A new test file goes here as `tests/it/<name>.rs` plus a `mod <name>;` line below (it
//! reaches the shared helpers with `use crate::common;`). Run one file's tests with
//! `cargo test --release -p chive-core --test it <name>::`.

mod alloc_count;
mod cc_negotiation;
mod common;
mod sim;

mod circuit_window;
mod client_hold;
mod client_inflight;
mod dos;
mod dos_streams;
mod heap;
mod network;
mod onion;
mod oom;
mod origin_run;
mod path_client;
mod path_hostile;
mod path_probe;
mod path_stripe;
mod path_switching;
mod queue_limits;
mod relay_early;
mod relay_run;
mod relay_wire;
mod same_channel;
mod sched_liveness;
mod stream_flow;
mod switching;
mod truncate;
