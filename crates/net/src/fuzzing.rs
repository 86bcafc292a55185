//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, off in every build of the
//! relay): the link handshake over an arbitrary byte stream instead of a TLS session, so that a
//! fuzzer can play the peer. Nothing here is part of the stable API.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::framing::CellBuf;
use crate::handshake::{self, Role, EXPORTER_LEN};
use crate::{FeatureSet, LinkConfig, LinkError};

pub use chive_crypto::IdentityKey;

mod handover;
mod provider;
pub use handover::{handover, Change, HandoverReport, HandoverScript, PeerOp, ReadEnd};

/// What a completed handshake settled (the fields `Link` would carry).
#[derive(Debug)]
pub struct Settled {
    /// Negotiated link protocol version.
    pub version: u16,
    /// Features both ends support.
    pub features: FeatureSet,
    /// The peer's proven identity, if it authenticated.
    pub peer_identity: Option<IdentityKey>,
}

/// Run our side of the link handshake on `io` as the initiator (`responder == false`) or the
/// responder, exactly as after a TLS handshake whose exporter value was `exporter`.
pub async fn handshake<S>(
    io: &mut S,
    responder: bool,
    cfg: &LinkConfig,
    exporter: &[u8; EXPORTER_LEN],
    expected: Option<IdentityKey>,
) -> Result<Settled, LinkError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut rbuf = CellBuf::new();
    let n = handshake::run(io, &mut rbuf, role(responder), cfg, exporter, expected).await?;
    Ok(Settled {
        version: n.version,
        features: n.features,
        peer_identity: n.peer_identity,
    })
}

/// The three cells a node with `cfg` sends in the given role: what a well-behaved peer sends,
/// used to build seed inputs.
pub fn handshake_cells(
    responder: bool,
    cfg: &LinkConfig,
    exporter: &[u8; EXPORTER_LEN],
) -> Result<Vec<u8>, LinkError> {
    handshake::our_cells(role(responder), cfg, exporter)
}

fn role(responder: bool) -> Role {
    if responder {
        Role::Responder
    } else {
        Role::Initiator
    }
}

/// The own record layer's reader ([`crate::record::RecordOpener`], what `LinkRecordLayer = own`
/// runs on every byte a peer sends after the TLS handshake) on `stream`, under fixed
/// AES-256-GCM keys (rustls builds 16-byte keys only inside itself; the opener's parsing is the
/// same for every suite) whose first record has sequence number 0. Opens records one after the other
/// until one is incomplete, fails, asks for a new key or closes the direction, as the link's
/// reader does. Returns the plaintext delivered and whether a close_notify was opened.
pub fn open_records(stream: &[u8]) -> (Vec<u8>, bool) {
    let mut buf = stream.to_vec();
    let mut opener = crate::record::RecordOpener::new(0, &record_secrets())
        .expect("fixed AES-256-GCM secrets make an opener");
    let mut delivered = Vec::new();
    let mut pos = 0;
    while let Ok(Some((len, opened))) = opener.open(&mut buf[pos..]) {
        match opened {
            crate::record::Opened::Data(range) => {
                delivered.extend_from_slice(&buf[pos + range.start..pos + range.end]);
            }
            crate::record::Opened::CloseNotify => return (delivered, true),
            crate::record::Opened::KeyUpdate { .. } => break,
            crate::record::Opened::Nothing => {}
        }
        pos += len;
    }
    (delivered, false)
}

/// A genuine record stream under the keys [`open_records`] uses: one application-data record
/// per item of `plaintexts`, then a close_notify.
pub fn seal_records(plaintexts: &[&[u8]]) -> Vec<u8> {
    let mut sealer = crate::record::RecordSealer::new(0, &record_secrets())
        .expect("fixed AES-256-GCM secrets make a sealer");
    let mut out = Vec::new();
    for p in plaintexts {
        sealer
            .seal_app_data(p, &mut out)
            .expect("a fresh key seals a few records");
    }
    sealer
        .seal_alert(crate::record::alert::CLOSE_NOTIFY, &mut out)
        .expect("a fresh key seals a few records");
    out
}

fn record_secrets() -> rustls::ConnectionTrafficSecrets {
    rustls::ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([0x5a; 32]),
        iv: rustls::crypto::cipher::Iv::new([0xa5; 12]),
    }
}
