//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, off in every build of the
//! node): the config files as each role reads them at start (and the relay at SIGHUP), and the
//! authority's HTTP server over any byte stream. Nothing here is part of the stable API.

use std::net::SocketAddr;
use std::sync::Arc;

use chive_crypto::IdentityKeypair;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::authority::{self, Authority, AuthorityConfig};
use crate::client::ClientConfig;
use crate::relay::RelayConfig;

/// A relay config file's text, parsed and checked as `chive relay` does before it opens any
/// socket: `validate`, then every value `run` derives from the file.
pub fn relay_config(text: &str) -> anyhow::Result<()> {
    let cfg: RelayConfig = toml::from_str(text)?;
    cfg.check_for_fuzzing()
}

/// A client config file's text, parsed and checked as `chive client` does.
pub fn client_config(text: &str) -> anyhow::Result<()> {
    let cfg: ClientConfig = toml::from_str(text)?;
    cfg.check_for_fuzzing()
}

/// An authority config file's text, parsed and checked as `chive authority` does; on success,
/// the network parameters it would publish are returned for a relay to apply.
pub fn authority_config(text: &str) -> anyhow::Result<chive_dir::NetParams> {
    let cfg: AuthorityConfig = toml::from_str(text)?;
    Ok(cfg.validate()?.params)
}

/// A relay config checked against the parameters of a consensus (as when one arrives).
pub fn relay_config_with_params(text: &str, params: &chive_dir::NetParams) -> anyhow::Result<()> {
    let cfg: RelayConfig = toml::from_str(text)?;
    cfg.check_for_fuzzing()?;
    cfg.check_params_for_fuzzing(params)
}

/// Serve one HTTP connection on `io` with the authority's request handler, as
/// `chive authority` serves its DirPort (a fresh authority with the identity `key_seed`, no
/// relays and no consensus;
/// without the header and connection deadlines, which need a timer).
pub async fn authority_http<S>(io: S, key_seed: &[u8; 32]) -> Result<(), hyper::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let settings = AuthorityConfig::fuzzing_default()
        .validate()
        .expect("the fuzzing authority's settings are valid");
    let auth = Arc::new(Authority::new(
        IdentityKeypair::from_secret_bytes(key_seed),
        settings,
    ));
    let peer = SocketAddr::from(([127, 0, 0, 1], 9));
    let service = hyper::service::service_fn(move |req| authority::handle(auth.clone(), peer, req));
    hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await
}

impl AuthorityConfig {
    fn fuzzing_default() -> Self {
        toml::from_str(
            "Nickname = \"fuzz\"\nDataDirectory = \"/nonexistent/chive-fuzz\"\n\
             DirPort = \"127.0.0.1:1\"\n",
        )
        .expect("the fuzzing authority's config parses")
    }
}
