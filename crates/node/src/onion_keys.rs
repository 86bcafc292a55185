//! An onion service's directory on disk (`HiddenServiceDir`, as Tor lays it out in spirit):
//! the directory itself mode 0700, `hs_ed25519_secret_key` (the identity seed, hex) mode 0600,
//! and `hostname` (the `.onion` address, for the operator to read). Like Tor, a directory or
//! key file that group or others can access is refused rather than silently used, since
//! whoever reads the key can impersonate the service. And `HiddenServicePort` lines:
//! `"VIRTPORT [TARGET]"`, TARGET an `IP:PORT` (default 127.0.0.1:VIRTPORT).
//!
//! `chive client` with `HiddenServiceDir` uses these; the service's policy is
//! `chive_client::onion::OnionService`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use chive_crypto::{IdentityKeypair, OnionAddress};

use crate::common::{load_or_create_secret, write_private};

/// The key file inside the service directory.
pub const SECRET_KEY_FILE: &str = "hs_ed25519_secret_key";
/// The address file inside the service directory.
pub const HOSTNAME_FILE: &str = "hostname";

/// A loaded service directory.
pub struct ServiceDir {
    /// The directory.
    pub path: PathBuf,
    /// The service identity.
    pub identity: IdentityKeypair,
    /// Its address.
    pub address: OnionAddress,
}

/// Refuse a file or directory that group or others may access.
#[cfg(unix)]
fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} has mode {:o}: group or others may access it; chmod go= it (the service key must stay private)",
            path.display(),
            mode & 0o777
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// Create (mode 0700, key 0600) or load the service directory at `path`; writes `hostname`.
pub fn load_or_create(path: &Path) -> anyhow::Result<ServiceDir> {
    if !path.exists() {
        std::fs::create_dir_all(path)
            .with_context(|| format!("HiddenServiceDir {}: cannot create", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("HiddenServiceDir {}: cannot chmod", path.display()))?;
        }
    }
    check_private(path).context("HiddenServiceDir")?;
    let key_path = path.join(SECRET_KEY_FILE);
    if key_path.exists() {
        check_private(&key_path).context("HiddenServiceDir key")?;
    }
    let seed = load_or_create_secret(&key_path)?;
    let identity = IdentityKeypair::from_secret_bytes(&seed);
    let address = OnionAddress::from_key(identity.public());
    write_private(&path.join(HOSTNAME_FILE), format!("{address}\n").as_bytes())?;
    Ok(ServiceDir {
        path: path.to_path_buf(),
        identity,
        address,
    })
}

/// One `HiddenServicePort` line: `"80"` or `"80 127.0.0.1:8080"`.
pub fn parse_port(line: &str) -> anyhow::Result<(u16, SocketAddr)> {
    let mut parts = line.split_whitespace();
    let virt: u16 = parts
        .next()
        .ok_or_else(|| anyhow!("HiddenServicePort is empty"))?
        .parse()
        .map_err(|_| anyhow!("HiddenServicePort {line:?}: virtual port is not a number"))?;
    if virt == 0 {
        bail!("HiddenServicePort {line:?}: virtual port 0");
    }
    let target = match parts.next() {
        None => SocketAddr::from(([127, 0, 0, 1], virt)),
        Some(t) => t.parse().map_err(|_| {
            anyhow!("HiddenServicePort {line:?}: target must be IP:PORT (e.g. 127.0.0.1:8080)")
        })?,
    };
    if parts.next().is_some() {
        bail!("HiddenServicePort {line:?}: expected \"VIRTPORT [IP:PORT]\"");
    }
    Ok((virt, target))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_private_and_stable() {
        let base = std::env::temp_dir().join(format!("chive-hsdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("svc");
        let a = load_or_create(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(SECRET_KEY_FILE)), 0o600);
        let host = std::fs::read_to_string(dir.join(HOSTNAME_FILE)).unwrap();
        assert_eq!(host.trim(), a.address.to_string());
        // Loaded again: the same address.
        assert_eq!(load_or_create(&dir).unwrap().address, a.address);

        // A key file others can read is refused, naming the problem.
        std::fs::set_permissions(
            dir.join(SECRET_KEY_FILE),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = format!("{:#}", load_or_create(&dir).err().unwrap());
        assert!(e.contains("group or others"), "{e}");
        std::fs::set_permissions(
            dir.join(SECRET_KEY_FILE),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        // So is a directory others can enter.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(load_or_create(&dir).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn ports() {
        assert_eq!(
            parse_port("80").unwrap(),
            (80, "127.0.0.1:80".parse().unwrap())
        );
        assert_eq!(
            parse_port("80 127.0.0.1:8080").unwrap(),
            (80, "127.0.0.1:8080".parse().unwrap())
        );
        for bad in ["", "0", "x", "80 nowhere", "80 127.0.0.1:1 extra"] {
            assert!(parse_port(bad).is_err(), "{bad:?}");
        }
    }
}
