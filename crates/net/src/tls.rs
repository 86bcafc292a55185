//! TLS 1.3 configuration for chive links (rustls, ring provider, throwaway certificates).
//!
//! As in Tor, TLS only provides a confidential, integrity-protected pipe: the X.509 certificate is
//! a self-signed throwaway generated at startup and is not checked against any authority. Who the
//! peer is comes from the link handshake (the AUTHENTICATE cell signs the TLS exporter), see
//! `handshake.rs`. The initiator still checks that the server holds the private key of the
//! certificate it presented (the TLS 1.3 CertificateVerify signature), so the session is a proper
//! authenticated key exchange bound to that certificate.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

use crate::LinkError;

/// The ring provider, passed explicitly to every config builder: chive never relies on a
/// process-wide default provider (another crate in the process could install a different one).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS server config with a fresh self-signed certificate, TLS 1.3 only, no client certificates.
pub(crate) fn server_config() -> Result<Arc<ServerConfig>, LinkError> {
    // The names in the certificate are irrelevant (nobody checks them); a fixed bland one avoids
    // leaking anything about the relay.
    let certified = rcgen::generate_simple_self_signed(vec!["chive.invalid".to_string()])
        .map_err(|e| LinkError::Tls(format!("certificate generation: {e}")))?;
    let cert_der: CertificateDer<'static> = certified.cert.der().clone();
    let key_der =
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| LinkError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key_der)
        .map_err(|e| LinkError::Tls(e.to_string()))?;
    // Session tickets would let a resumed session skip the certificate; links are long-lived and
    // resumption buys nothing, so keep every handshake a full one.
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A TLS client config (TLS 1.3 only) that accepts any server certificate but still verifies the
/// handshake signature.
pub(crate) fn client_config() -> Result<Arc<ClientConfig>, LinkError> {
    let provider = provider();
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
