//! Config files and logging for every chive subcommand: the tools here and the node roles
//! (chive-node re-exports these from its `common` module).

use std::path::Path;

use anyhow::{anyhow, Context};
use serde::de::DeserializeOwned;

/// Read and parse a TOML config file. Unknown keys and bad values are errors
/// that name the file and the offending option (structs use `deny_unknown_fields`).
pub fn load_config<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow!("bad config file {}: {}", path.display(), e))
}

/// Start logging to stderr. `level` is a tracing filter such as `info` or
/// `chive_tools=debug,info`; the environment variable `CHIVE_LOG` overrides it.
pub fn init_logging(level: &str) {
    let filter = std::env::var("CHIVE_LOG").unwrap_or_else(|_| level.to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
