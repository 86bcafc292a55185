//! chive's end-to-end tests (real processes on loopback), one test binary: each `tests/*.rs`
//! file would be a binary of its own, linked against the whole dependency graph. Each module
//! is one former test file; `common` starts networks and holds the small clients they share.
//!
//! The harness runs these tests on parallel threads. A test that measures timing under load
//! starts its network with `Network::start_alone` (nothing else of this binary runs beside
//! it); every other test that starts processes holds a shared turn (`Network::start` takes
//! one; a test that spawns `chive` without a network calls `common::shared_turn()`). Each
//! `Network` prints an `[e2e-time]` line when dropped (how long its test waited for its turn,
//! started the network, then held it): shown for a failing test, or for all with
//! `-- --nocapture` (docs/testing.md, "The e2e binary, test by test").
//!
//! Every node a test starts listens on port 0 and reports the ports it got in its `PortsFile`
//! (`common::wait_ports`): a port probed free and handed over could be taken in between by a
//! parallel test (`ports_e2e`).
//!
//! A new test file goes here as `tests/it/<name>.rs` plus a `mod <name>;` line below (it
//! reaches the helpers with `use crate::common;`, often `use common::*;`). Run one file's
//! tests with `cargo test --release -p chive --test it <name>::`.

mod common;

mod circuit_window_e2e;
mod dos_e2e;
mod dos_streams_e2e;
mod e2e;
mod onion_e2e;
mod ports_e2e;
mod predicted_exit_e2e;
mod relay_failure_e2e;
mod reserve_e2e;
mod sched_e2e;
mod split;
mod switch_e2e;
