//! chive-http's integration tests, one test binary (each `tests/*.rs` file would be a binary
//! of its own, linked against the whole dependency graph). Each module is one former test file.
//! A new test file goes here as `tests/it/<name>.rs` plus a `mod <name>;` line below.

mod oneshot;
mod reader;
