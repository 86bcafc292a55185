//! chive's measurement tools, apart from the relay: the programs the lab puts around a
//! network, each a `chive` subcommand (`chive httpd`, `chive shape`, `chive delayline`)
//! whose clap `Args` and `run` live here.
//!
//! - [`httpd`]: the HTTP/1.1 server at the far end of measurements (`/bytes/<N>`, `/upload`);
//! - [`pattern`]: the content it serves, which `chive perf` uploads and verifies;
//! - [`shape`]: ACK prioritisation on an interface with `tc` (paper 002);
//! - [`delay`]: a user-space one-way delay line between two interfaces;
//! - [`config`]: TOML config files and logging, as the node's subcommands do them.

pub mod config;
pub mod delay;
pub mod httpd;
pub mod pattern;
pub mod shape;
pub mod sockq;
