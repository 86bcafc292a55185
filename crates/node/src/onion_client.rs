//! `.onion` hostnames at the SOCKS port (issue 19), as far as the client goes so far.
//!
//! A malformed address is answered at once with proposal 304's 0xF6, without touching the
//! network. A well-formed one has its descriptor fetched from the authority and verified:
//! none held → 0xF0, one that does not verify → 0xF1. Connecting through a verified
//! descriptor (rendezvous circuit, INTRODUCE1, RENDEZVOUS2, the virtual hop: chive-core has
//! all of it, `chive_core::onion`) is not wired into this client yet, so such a request ends
//! in a general failure with a log line saying so.

use std::net::SocketAddr;

use chive_client::socks::{OnionSocksError, SocksReply};
use chive_crypto::OnionAddress;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::client::SocksAnswer;
use crate::common::unix_now;
use crate::onion_dir::{fetch_onion_descriptor, FetchError};

/// Is `host` an onion-service name (`….onion`, any case)?
pub fn is_onion_host(host: &str) -> bool {
    host.len() >= 6 && host[host.len() - 6..].eq_ignore_ascii_case(".onion")
}

/// The address in an `.onion` host name. Tor accepts subdomains (`www.<addr>.onion`): the
/// address is the last label before `.onion`.
pub fn parse_onion_host(host: &str) -> Result<OnionAddress, SocksReply> {
    let stem = &host[..host.len().saturating_sub(6)];
    let label = stem.rsplit('.').next().unwrap_or(stem);
    label
        .parse::<OnionAddress>()
        .map_err(|_| SocksReply::Onion(OnionSocksError::BadAddress))
}

/// What a descriptor fetch failure tells the SOCKS client.
pub fn fetch_error_reply(e: &FetchError) -> SocksReply {
    match e {
        FetchError::NotFound => SocksReply::Onion(OnionSocksError::DescriptorNotFound),
        FetchError::Invalid(_) => SocksReply::Onion(OnionSocksError::InvalidDescriptor),
        FetchError::Unreachable(_) => SocksReply::GeneralFailure,
    }
}

/// Answer a SOCKS request for `host` (an `.onion` name): at once if malformed, else after
/// fetching and verifying the descriptor in a task of its own (the driver does not wait).
pub fn handle_onion_request(
    host: &str,
    authority: SocketAddr,
    reply: oneshot::Sender<SocksAnswer>,
) {
    let addr = match parse_onion_host(host) {
        Ok(a) => a,
        Err(code) => {
            info!(host = %host.chars().take(80).collect::<String>(), "malformed onion address");
            let _ = reply.send(SocksAnswer::Failed(code));
            return;
        }
    };
    tokio::spawn(async move {
        let code = match fetch_onion_descriptor(authority, &addr, unix_now()).await {
            Ok(desc) => {
                warn!(address = %addr, intro_points = desc.intro_points.len(),
                      "onion descriptor verified, but connecting to onion services is not wired into chive client yet");
                SocksReply::GeneralFailure
            }
            Err(e) => {
                info!(address = %addr, error = ?e, "onion descriptor fetch failed");
                fetch_error_reply(&e)
            }
        };
        let _ = reply.send(SocksAnswer::Failed(code));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onion_hosts() {
        let addr = "pg6mmjiyjmcrsslvykfwnntlaru7p5svn6y2ymmju6nubxndf4pscryd.onion";
        assert!(is_onion_host(addr));
        assert!(is_onion_host(&addr.to_uppercase()));
        assert!(!is_onion_host("example.com"));
        assert!(!is_onion_host("onion"));
        assert!(parse_onion_host(addr).is_ok());
        assert!(parse_onion_host(&format!("www.{addr}")).is_ok());
        let bad = SocksReply::Onion(OnionSocksError::BadAddress);
        // Checksum broken (last character before the version changed).
        let broken = addr.replacen("cryd", "crya", 1);
        assert_eq!(parse_onion_host(&broken), Err(bad));
        assert_eq!(parse_onion_host("short.onion"), Err(bad));
        assert_eq!(parse_onion_host(".onion"), Err(bad));
    }
}
