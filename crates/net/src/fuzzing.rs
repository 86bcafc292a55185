//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, off in every build of the
//! relay): the link handshake over an arbitrary byte stream instead of a TLS session, so that a
//! fuzzer can play the peer. Nothing here is part of the stable API.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::framing::CellBuf;
use crate::handshake::{self, Role, EXPORTER_LEN};
use crate::{FeatureSet, LinkConfig, LinkError};

pub use chive_crypto::IdentityKey;

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
