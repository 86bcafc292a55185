//! No code. This crate exists for its `[dependencies]`: see `Cargo.toml` and `README.md`.
