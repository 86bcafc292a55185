//! chive's link handshake, run inside a fresh TLS 1.3 session (protocol in README.md).
//!
//! Both sides first send their three cells (VERSIONS, LINK_FEATURES, AUTHENTICATE), then read the
//! peer's three in the same order. Sending before reading cannot deadlock: the cells are small
//! and fit in socket buffers.

use chive_cell::{AnyCell, Authenticate, CellCommand, LinkFeatures, VarCell, Versions};
use chive_crypto::{IdentityKey, Signature};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::framing::{CellBuf, Fill};
use crate::{FeatureSet, LinkConfig, LinkError, LINK_VERSIONS, MAX_PEER_VERSIONS};

/// TLS exporter label for the value signed in AUTHENTICATE.
pub(crate) const EXPORTER_LABEL: &[u8] = b"EXPORTER-chive-link-auth";
/// TLS exporter label for a channel's split-direction bind token (see `Link::bind_token`).
/// A different label from the AUTHENTICATE one, so the token reveals nothing about the value
/// the identities signed.
pub(crate) const BIND_EXPORTER_LABEL: &[u8] = b"EXPORTER-chive-split-bind";
/// Length of the exported keying material.
pub(crate) const EXPORTER_LEN: usize = 32;
/// Domain separation prefix of the signed message.
pub(crate) const AUTH_PREFIX: &[u8] = b"chive-link-auth-v1";

/// Which end of the link we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Opened the TCP connection (TLS client).
    Initiator,
    /// Accepted it (TLS server); always a relay, always authenticates.
    Responder,
}

impl Role {
    /// The byte that goes into the signature of a node in this role, so that a responder's
    /// signature can never be reflected back as an initiator's (both sign the same exporter).
    pub(crate) fn byte(self) -> u8 {
        match self {
            Role::Initiator => b'I',
            Role::Responder => b'R',
        }
    }

    fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Responder,
            Role::Responder => Role::Initiator,
        }
    }
}

/// The message an AUTHENTICATE cell signs: prefix || role byte || TLS exporter.
pub(crate) fn auth_message(role: Role, exporter: &[u8; EXPORTER_LEN]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(AUTH_PREFIX.len() + 1 + EXPORTER_LEN);
    msg.extend_from_slice(AUTH_PREFIX);
    msg.push(role.byte());
    msg.extend_from_slice(exporter);
    msg
}

/// What the handshake settled.
#[derive(Debug)]
pub(crate) struct Negotiated {
    pub(crate) version: u16,
    pub(crate) features: FeatureSet,
    pub(crate) peer_identity: Option<IdentityKey>,
}

/// Our three handshake cells, encoded back to back.
pub(crate) fn our_cells(
    role: Role,
    cfg: &LinkConfig,
    exporter: &[u8; EXPORTER_LEN],
) -> Result<Vec<u8>, LinkError> {
    let mut out = Vec::with_capacity(256);
    let versions = Versions {
        versions: LINK_VERSIONS.to_vec(),
    };
    var_cell(CellCommand::VERSIONS, versions.encode()).encode_into(&mut out)?;
    let features = LinkFeatures {
        features: cfg.features.0,
    };
    var_cell(CellCommand::LINK_FEATURES, features.encode()).encode_into(&mut out)?;
    let auth_payload = match (&cfg.identity, role) {
        (Some(id), _) => {
            let sig = id.sign(&auth_message(role, exporter));
            Authenticate {
                identity: *id.public().as_bytes(),
                signature: sig.0,
            }
            .encode()
        }
        // An anonymous initiator sends an *empty* AUTHENTICATE so that the responder knows the
        // handshake is over without waiting for a cell that may never come.
        (None, Role::Initiator) => Vec::new(),
        (None, Role::Responder) => {
            return Err(LinkError::Config(
                "a responder must have a relay identity".into(),
            ))
        }
    };
    var_cell(CellCommand::AUTHENTICATE, auth_payload).encode_into(&mut out)?;
    Ok(out)
}

fn var_cell(command: CellCommand, payload: Vec<u8>) -> VarCell {
    VarCell {
        circ_id: 0,
        command,
        payload,
    }
}

/// Run the link handshake on an established TLS stream. `rbuf` receives the bytes read; any
/// bytes after the peer's last handshake cell stay in it for the link reader.
pub(crate) async fn run<S>(
    io: &mut S,
    rbuf: &mut CellBuf,
    role: Role,
    cfg: &LinkConfig,
    exporter: &[u8; EXPORTER_LEN],
    expected: Option<IdentityKey>,
) -> Result<Negotiated, LinkError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ours = our_cells(role, cfg, exporter)?;
    io.write_all(&ours).await?;
    io.flush().await?;

    let versions = read_var(io, rbuf, CellCommand::VERSIONS).await?;
    // Check the count before decoding so a hostile list is never materialised.
    if versions.len() > 2 * MAX_PEER_VERSIONS {
        return Err(LinkError::Protocol(format!(
            "peer lists {} versions (at most {MAX_PEER_VERSIONS})",
            versions.len() / 2
        )));
    }
    let versions = Versions::decode(&versions)?;
    let version = LINK_VERSIONS
        .iter()
        .copied()
        .filter(|v| versions.versions.contains(v))
        .max()
        .ok_or(LinkError::NoCommonVersion)?;

    let features = read_var(io, rbuf, CellCommand::LINK_FEATURES).await?;
    let features = FeatureSet(LinkFeatures::decode(&features)?.features).intersect(cfg.features);

    let auth = read_var(io, rbuf, CellCommand::AUTHENTICATE).await?;
    let peer_identity = if auth.is_empty() {
        if role == Role::Initiator {
            // We initiated, so the peer is the responder, which must prove it is a relay.
            return Err(match expected {
                Some(expected) => LinkError::IdentityMismatch {
                    expected,
                    got: None,
                },
                None => LinkError::BadAuthentication,
            });
        }
        None
    } else {
        let msg = Authenticate::decode(&auth).map_err(|_| LinkError::BadAuthentication)?;
        let key =
            IdentityKey::from_bytes(&msg.identity).map_err(|_| LinkError::BadAuthentication)?;
        key.verify(
            &auth_message(role.peer(), exporter),
            &Signature(msg.signature),
        )
        .map_err(|_| LinkError::BadAuthentication)?;
        Some(key)
    };
    if let Some(expected) = expected {
        if peer_identity != Some(expected) {
            return Err(LinkError::IdentityMismatch {
                expected,
                got: peer_identity,
            });
        }
    }
    Ok(Negotiated {
        version,
        features,
        peer_identity,
    })
}

/// Read the next cell, which must be a variable cell with circuit id 0 and command `want`;
/// returns its payload.
async fn read_var<S>(
    io: &mut S,
    rbuf: &mut CellBuf,
    want: CellCommand,
) -> Result<Vec<u8>, LinkError>
where
    S: AsyncRead + Unpin,
{
    loop {
        if let Some(cell) = rbuf.next_cell()? {
            return match cell {
                AnyCell::Var(v) if v.command == want && v.circ_id == 0 => Ok(v.payload),
                other => Err(LinkError::Protocol(format!(
                    "expected {want:?} var cell on circuit 0 during link handshake, got {:?} on circuit {}",
                    other.command(),
                    other.circ_id()
                ))),
            };
        }
        if let Fill::Eof = rbuf.fill(io).await? {
            return Err(LinkError::Protocol(format!(
                "peer closed the connection before sending {want:?}"
            )));
        }
    }
}
