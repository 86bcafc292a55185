//! TLS 1.3 configuration for chive links (rustls, ring provider, throwaway certificates).
//!
//! As in Tor, TLS only provides a confidential, integrity-protected pipe: the X.509 certificate is
//! a self-signed throwaway generated at startup and is not checked against any authority. Who the
//! peer is comes from the link handshake (the AUTHENTICATE cell signs the TLS exporter), see
//! `handshake.rs`. The initiator still checks that the server holds the private key of the
//! certificate it presented (the TLS 1.3 CertificateVerify signature), so the session is a proper
//! authenticated key exchange bound to that certificate.
//!
//! Both ends prefer `TLS13_AES_128_GCM_SHA256` ([`LINK_SUITES`]); AES-256-GCM and
//! ChaCha20-Poly1305 stay acceptable. Why 128-bit keys suffice on links: docs/security.md, "Link
//! encryption".

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::ring::cipher_suite::{
    TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme, SupportedCipherSuite,
};

use crate::LinkError;

/// The TLS 1.3 suites a link offers (as initiator) and accepts (as responder), most preferred
/// first. AES-128-GCM costs a relay about a quarter less per record than AES-256-GCM, the ring
/// provider's first choice (docs/performance.md); the others stay acceptable, so a peer that
/// offers only one of them still connects.
pub(crate) const LINK_SUITES: &[SupportedCipherSuite] = &[
    TLS13_AES_128_GCM_SHA256,
    TLS13_AES_256_GCM_SHA384,
    TLS13_CHACHA20_POLY1305_SHA256,
];

/// The ring provider with [`LINK_SUITES`], passed explicitly to every config builder: chive never
/// relies on a process-wide default provider (another crate in the process could install a
/// different one). The `record_handover` fuzz target starts from it too (`fuzzing/provider.rs`).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: LINK_SUITES.to_vec(),
        ..rustls::crypto::ring::default_provider()
    })
}

/// A TLS server config with a fresh self-signed certificate, TLS 1.3 only, no client certificates.
pub(crate) fn server_config() -> Result<Arc<ServerConfig>, LinkError> {
    server_config_with(provider())
}

pub(crate) fn server_config_with(
    provider: Arc<CryptoProvider>,
) -> Result<Arc<ServerConfig>, LinkError> {
    // The names in the certificate are irrelevant (nobody checks them); a fixed bland one avoids
    // leaking anything about the relay.
    let certified = rcgen::generate_simple_self_signed(vec!["chive.invalid".to_string()])
        .map_err(|e| LinkError::Tls(format!("certificate generation: {e}")))?;
    let cert_der: CertificateDer<'static> = certified.cert.der().clone();
    let key_der =
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| LinkError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der)
        .map_err(|e| LinkError::Tls(e.to_string()))?;
    // Session tickets would let a resumed session skip the certificate; links are long-lived and
    // resumption buys nothing, so keep every handshake a full one.
    config.send_tls13_tickets = 0;
    // The responder's order decides ([`LINK_SUITES`]): an initiator that lists AES-256-GCM first
    // (an older chive) still gets AES-128-GCM when it offers it.
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// A TLS client config (TLS 1.3 only) that accepts any server certificate but still verifies the
/// handshake signature.
pub(crate) fn client_config() -> Result<Arc<ClientConfig>, LinkError> {
    client_config_with(provider())
}

pub(crate) fn client_config_with(
    provider: Arc<CryptoProvider>,
) -> Result<Arc<ClientConfig>, LinkError> {
    let verifier = Arc::new(AnyCertVerifier {
        algs: provider.signature_verification_algorithms,
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| LinkError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // No SNI: the name would be meaningless and only help fingerprinting.
    config.enable_sni = false;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// Server name handed to rustls; with SNI disabled and chain checks skipped it only needs to be
/// syntactically valid.
pub(crate) fn server_name(addr: std::net::SocketAddr) -> ServerName<'static> {
    ServerName::IpAddress(addr.ip().into())
}

/// Accepts any certificate chain (identity is established by the link handshake), but verifies
/// handshake signatures with the provider's algorithms so the peer must hold the certificate's key.
#[derive(Debug)]
struct AnyCertVerifier {
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Unreachable in practice (TLS 1.3 only), but verify properly rather than accept.
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{ClientConnection, ServerConnection};

    /// A provider offering only `suites`, in this order (another implementation's preference).
    fn offering(suites: &[SupportedCipherSuite]) -> Arc<CryptoProvider> {
        Arc::new(CryptoProvider {
            cipher_suites: suites.to_vec(),
            ..rustls::crypto::ring::default_provider()
        })
    }

    /// Run a TLS handshake between the two configs in memory; the suite both ends agreed on.
    fn negotiate(
        client: Arc<ClientConfig>,
        server: Arc<ServerConfig>,
    ) -> Result<SupportedCipherSuite, rustls::Error> {
        let name = server_name("127.0.0.1:1".parse().unwrap());
        let mut c = ClientConnection::new(client, name)?;
        let mut s = ServerConnection::new(server)?;
        let mut wire = Vec::new();
        for _ in 0..10 {
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
            wire.clear();
            c.write_tls(&mut wire).unwrap();
            let mut rd = &wire[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets()?;
            }
            wire.clear();
            s.write_tls(&mut wire).unwrap();
            let mut rd = &wire[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets()?;
            }
        }
        assert!(!c.is_handshaking() && !s.is_handshaking());
        let suite = c.negotiated_cipher_suite().unwrap();
        assert_eq!(s.negotiated_cipher_suite(), Some(suite));
        Ok(suite)
    }

    #[test]
    fn chive_links_negotiate_aes_128_gcm() {
        let suite = negotiate(client_config().unwrap(), server_config().unwrap()).unwrap();
        assert_eq!(suite, TLS13_AES_128_GCM_SHA256);
    }

    #[test]
    fn the_responder_prefers_aes_128_gcm_over_an_initiator_listing_aes_256_first() {
        // The ring provider's default order, which chive links used before.
        let old = client_config_with(Arc::new(rustls::crypto::ring::default_provider())).unwrap();
        let suite = negotiate(old, server_config().unwrap()).unwrap();
        assert_eq!(suite, TLS13_AES_128_GCM_SHA256);
    }

    #[test]
    fn the_other_suites_stay_acceptable_both_ways() {
        for other in [TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256] {
            let client = client_config_with(offering(&[other])).unwrap();
            assert_eq!(negotiate(client, server_config().unwrap()).unwrap(), other);
            let server = server_config_with(offering(&[other])).unwrap();
            assert_eq!(negotiate(client_config().unwrap(), server).unwrap(), other);
        }
    }
}
