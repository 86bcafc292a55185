//! Helpers shared by every subcommand: config loading, logging, key files.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use rand::RngCore;

// Config files and logging work the same for every chive subcommand, node roles and tools
// alike; one copy lives with the command-line tools.
pub use chive_tools::config::{init_logging, load_config};

/// Load a 32-byte secret stored as hex in `path`, creating it (mode 0600) if absent.
pub fn load_or_create_secret(path: &Path) -> anyhow::Result<[u8; 32]> {
    if path.exists() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read key file {}", path.display()))?;
        let bytes = hex::decode(text.trim())
            .map_err(|_| anyhow!("key file {} is not hex", path.display()))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| anyhow!("key file {} must hold 32 bytes", path.display()))?;
        return Ok(arr);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    write_private(path, hex::encode(secret).as_bytes())?;
    Ok(secret)
}

/// Write a file readable only by its owner.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(contents)?;
    Ok(())
}

/// The Ed25519 identity stored under `data_dir/keys/identity.key`.
pub fn load_identity(data_dir: &Path) -> anyhow::Result<chive_crypto::IdentityKeypair> {
    let seed = load_or_create_secret(&keys_dir(data_dir).join("identity.key"))?;
    Ok(chive_crypto::IdentityKeypair::from_secret_bytes(&seed))
}

/// Where a node keeps its keys.
pub fn keys_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("keys")
}

/// `LinkUnsentLimit` when unset on link sockets whose buffers are not constrained: at
/// 10 Mbit/s about 50 ms of data, so a SENDME queued behind it waits that long instead of
/// the ~1.8 s that autotuned buffers held on the paper-002 testbed; on loopback still far
/// above what one wake-up of the writer needs (docs/scheduling.md, "The unsent limit").
pub const DEFAULT_UNSENT_LIMIT: u32 = 64 * 1024;

/// `LinkKeepalive` when unset (seconds).
pub fn default_link_keepalive() -> u64 {
    crate::driver::DEFAULT_LINK_KEEPALIVE.as_secs()
}

/// `LinkIdleTimeout` when unset (seconds).
pub fn default_link_idle_timeout() -> u64 {
    crate::driver::DEFAULT_LINK_IDLE_TIMEOUT.as_secs()
}

/// OutbufCells, where set, must be between 1 and 10000 (a relay's and a client's option alike).
pub fn check_outbuf_cells(configured: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = configured {
        if !(1..=10_000).contains(&n) {
            anyhow::bail!("OutbufCells must be between 1 and 10000");
        }
    }
    Ok(())
}

/// Refuse a `LinkUnsentLimit` outside 0 (off) or 4096..16 MiB.
pub fn check_unsent_limit(configured: Option<u32>) -> anyhow::Result<()> {
    match configured {
        Some(bytes) if bytes != 0 && !(4096..=16 << 20).contains(&bytes) => Err(anyhow!(
            "LinkUnsentLimit must be 0 (no limit) or between 4096 and 16777216 bytes"
        )),
        _ => Ok(()),
    }
}

/// TCP_NOTSENT_LOWAT for link sockets from a configured `LinkUnsentLimit`: 0 turns it off;
/// unset means [`DEFAULT_UNSENT_LIMIT`] unless the sockets' buffers are already constrained
/// (their whole send buffer is small then).
pub fn effective_unsent_limit(configured: Option<u32>, constrained_buffers: bool) -> Option<u32> {
    match configured {
        Some(0) => None,
        Some(bytes) => Some(bytes),
        None if constrained_buffers => None,
        None => Some(DEFAULT_UNSENT_LIMIT),
    }
}

/// Refuse a `LinkCongestionControl` this kernel does not offer, naming the option.
pub fn check_congestion_control(configured: Option<&str>) -> anyhow::Result<()> {
    match configured {
        Some(name) => chive_net::check_congestion_control(name)
            .map_err(|e| anyhow!("LinkCongestionControl: {e}")),
        None => Ok(()),
    }
}

/// Seconds since the UNIX epoch, as the directory protocol counts time.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
