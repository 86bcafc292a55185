//! chive-node: the async node around the sans-IO [`chive_core::Core`].
//!
//! One [`driver::Driver`] task owns the core and does only IO: link, stream and connect tasks
//! feed it through one bounded input queue; it hands the core's output to writer tasks as the
//! core-side send path ([`chive_core::chansched::SendPath`]) and split-direction state
//! ([`chive_core::split::SplitChannel`]) decide. The roles ([`relay`], [`client`],
//! [`authority`]) load and validate their TOML configs (a bad value is an error naming the
//! option) and start the tasks; [`metrics`] records, [`dirclient`] talks to the authority.
//! The `chive` binary is a thin command line over these.
#![forbid(unsafe_code)]

pub mod authority;
pub mod client;
pub mod common;
pub mod dirclient;
pub mod driver;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod limits;
pub mod link_options;
pub mod memtrim;
pub mod metrics;
pub mod onion_client;
pub mod onion_dir;
pub mod onion_keys;
pub mod onion_metrics;
pub mod relay;
#[cfg(test)]
mod test_support;
