//! Helpers shared by every subcommand: config loading, logging, key files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use rand::RngCore;

// Config files and logging work the same for every chive subcommand, node roles and tools
// alike; one copy lives with the command-line tools.
pub use chive_tools::config::{init_logging, load_config};

/// The `CircuitSwitching` option of a relay or client config, parsed (None: not set), with the
/// option named in the error.
pub fn parse_switching_mode(
    value: Option<&str>,
) -> anyhow::Result<Option<chive_dir::SwitchingMode>> {
    value
        .map(chive_dir::SwitchingMode::parse)
        .transpose()
        .map_err(|e| anyhow!("CircuitSwitching: {e}"))
}

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

/// Where `MetricsFile` (`file`) writes: a relative path lives in `data_dir`, so one setting
/// serves many nodes; an empty one means none (so a lab default can be switched off).
pub fn metrics_path(data_dir: &Path, file: Option<&PathBuf>) -> Option<PathBuf> {
    file.filter(|p| !p.as_os_str().is_empty())
        .map(|p| data_dir.join(p))
}

/// Write `PortsFile` (`file`; relative: inside `data_dir`): a JSON object from each listening
/// option's name to the address its socket is bound to (the kernel's choice where the config
/// said port 0). Written whole to `<file>.tmp` and renamed, so a reader never sees half of it.
pub fn write_ports_file(
    data_dir: &Path,
    file: Option<&Path>,
    ports: &[(&str, SocketAddr)],
) -> anyhow::Result<()> {
    let Some(file) = file.filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let path = data_dir.join(file);
    let map: serde_json::Map<String, serde_json::Value> = ports
        .iter()
        .map(|(name, addr)| (name.to_string(), addr.to_string().into()))
        .collect();
    let text = serde_json::Value::Object(map).to_string() + "\n";
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| {
            format!("PortsFile {}: cannot create its directory", path.display())
        })?;
    }
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)
        .with_context(|| format!("PortsFile {}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, &path)
        .with_context(|| format!("PortsFile {}: cannot rename into place", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_file_is_relative_to_the_data_directory_and_empty_means_none() {
        let dir = Path::new("/var/lib/chive");
        let at = |f: &str| metrics_path(dir, Some(&PathBuf::from(f)));
        assert_eq!(at("m.jsonl"), Some(dir.join("m.jsonl")));
        assert_eq!(at("/tmp/m.jsonl"), Some(PathBuf::from("/tmp/m.jsonl")));
        assert_eq!(at(""), None);
        assert_eq!(metrics_path(dir, None), None);
    }

    #[test]
    fn the_ports_file_lands_whole_under_the_data_directory() {
        let dir = std::env::temp_dir().join(format!("chive-ports-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let or: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let metrics: SocketAddr = "[::1]:9101".parse().unwrap();
        write_ports_file(
            &dir,
            Some(Path::new("sub/ports.json")),
            &[("ORPort", or), ("MetricsPort", metrics)],
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.join("sub/ports.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ORPort"], "127.0.0.1:40123");
        assert_eq!(v["MetricsPort"], "[::1]:9101");
        assert!(!dir.join("sub/ports.json.tmp").exists());
        // None or empty: nothing written.
        write_ports_file(&dir, None, &[("ORPort", or)]).unwrap();
        write_ports_file(&dir, Some(Path::new("")), &[("ORPort", or)]).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
