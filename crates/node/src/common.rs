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

/// OutbufCells, where set, must be between 1 and 10000 (a relay's and a client's option alike).
pub fn check_outbuf_cells(configured: Option<usize>) -> anyhow::Result<()> {
    if let Some(n) = configured {
        if !(1..=10_000).contains(&n) {
            anyhow::bail!("OutbufCells must be between 1 and 10000");
        }
    }
    Ok(())
}

/// Seconds since the UNIX epoch, as the directory protocol counts time.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
