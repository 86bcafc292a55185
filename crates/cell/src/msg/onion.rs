//! Relay messages of onion services, in rend-spec v3's formats and with Tor's relay command
//! numbers (32–40, 40 = INTRODUCE_ACK): ESTABLISH_INTRO, INTRO_ESTABLISHED, INTRODUCE1/2,
//! INTRODUCE_ACK, ESTABLISH_RENDEZVOUS, RENDEZVOUS_ESTABLISHED, RENDEZVOUS1/2, and the
//! decrypted INTRODUCE plaintext.
//!
//! Only the v3 forms exist: an ESTABLISH_INTRO or INTRODUCE1 with a legacy (RSA) key is
//! refused. Signatures, MACs and encryption are not checked here (no crypto in this crate):
//! [`EstablishIntro::signed_bytes`] and [`Introduce::header`] give the bytes that
//! chive-crypto signs or authenticates. Each message must fit one relay cell
//! ([`crate::RELAY_DATA_LEN`] bytes); `encode` refuses a longer one.

use super::{put_len16, put_len8, LinkSpec};
use crate::reader::Reader;
use crate::{CellError, RELAY_DATA_LEN};

/// AUTH_KEY_TYPE of an Ed25519 intro point auth key (the only type chive knows).
pub const AUTH_KEY_TYPE_ED25519: u8 = 2;
/// ONION_KEY_TYPE of an ntor (curve25519) onion key.
pub const ONION_KEY_TYPE_NTOR: u8 = 1;
/// Length of a rendezvous cookie.
pub const REND_COOKIE_LEN: usize = 20;
/// Length of ESTABLISH_INTRO's HANDSHAKE_AUTH (a SHA3-256 MAC).
pub const HANDSHAKE_AUTH_LEN: usize = 32;
/// Length of an Ed25519 signature.
pub const ED25519_SIG_LEN: usize = 64;
/// What ESTABLISH_INTRO's signature covers is prefixed with this string.
pub const ESTABLISH_INTRO_SIG_PREFIX: &[u8] = b"Tor establish-intro cell v1";

const KEY_LEN: usize = 32;
const LEGACY_KEY_ID_LEN: usize = 20;

/// One extension field (`EXT_FIELD_TYPE`, `EXT_FIELD_LEN`, `EXT_FIELD`). Chive defines none
/// yet; unknown ones are kept so that a relay can pass them on and a reader can ignore them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extension {
    /// `EXT_FIELD_TYPE`.
    pub ty: u8,
    /// `EXT_FIELD` (at most 255 bytes).
    pub data: Vec<u8>,
}

fn put_extensions(out: &mut Vec<u8>, exts: &[Extension]) -> Result<(), CellError> {
    put_len8(out, "extension count", exts.len())?;
    for e in exts {
        out.push(e.ty);
        put_len8(out, "extension field", e.data.len())?;
        out.extend_from_slice(&e.data);
    }
    Ok(())
}

fn read_extensions(r: &mut Reader<'_>) -> Result<Vec<Extension>, CellError> {
    let n = r.u8()?;
    // Each entry takes at least 2 bytes, so a hostile count is bounded by the body length.
    let mut exts = Vec::with_capacity(usize::from(n).min(r.remaining() / 2));
    for _ in 0..n {
        let ty = r.u8()?;
        let len = usize::from(r.u8()?);
        exts.push(Extension {
            ty,
            data: r.take(len)?.to_vec(),
        });
    }
    Ok(exts)
}

/// AUTH_KEY_TYPE (1) AUTH_KEY_LEN (2) AUTH_KEY (32), Ed25519 only.
fn put_auth_key(out: &mut Vec<u8>, key: &[u8; KEY_LEN]) {
    out.push(AUTH_KEY_TYPE_ED25519);
    out.extend_from_slice(&(KEY_LEN as u16).to_be_bytes());
    out.extend_from_slice(key);
}

fn read_auth_key(r: &mut Reader<'_>, what: &'static str) -> Result<[u8; KEY_LEN], CellError> {
    let ty = r.u8()?;
    let len = usize::from(r.u16()?);
    if ty != AUTH_KEY_TYPE_ED25519 {
        return Err(CellError::Invalid {
            what,
            why: "auth key type is not Ed25519 (legacy RSA keys are not supported)",
        });
    }
    if len != KEY_LEN {
        return Err(CellError::WrongLength {
            what,
            expected: KEY_LEN,
            got: len,
        });
    }
    r.array()
}

/// Refuse a message that does not fit one relay cell.
fn fits_relay_cell(what: &'static str, body: Vec<u8>) -> Result<Vec<u8>, CellError> {
    if body.len() > RELAY_DATA_LEN {
        return Err(CellError::TooLong {
            what,
            max: RELAY_DATA_LEN,
            got: body.len(),
        });
    }
    Ok(body)
}

/// ESTABLISH_INTRO (service to intro point): registers the circuit as an introduction point
/// for `auth_key`.
///
/// `AUTH_KEY_TYPE (1) AUTH_KEY_LEN (2) AUTH_KEY (32) N_EXTENSIONS (1) extensions
/// HANDSHAKE_AUTH (32) SIG_LEN (2) SIG (64)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EstablishIntro {
    /// The intro point auth key (Ed25519 public key).
    pub auth_key: [u8; KEY_LEN],
    /// Extensions (none defined).
    pub extensions: Vec<Extension>,
    /// MAC of the earlier fields under the circuit's handshake key, proving the cell was made
    /// for this circuit (not replayed from another).
    pub handshake_auth: [u8; HANDSHAKE_AUTH_LEN],
    /// Signature by `auth_key` over [`EstablishIntro::signed_bytes`].
    pub sig: [u8; ED25519_SIG_LEN],
}

impl EstablishIntro {
    /// The fields before HANDSHAKE_AUTH: what HANDSHAKE_AUTH authenticates.
    pub fn mac_bytes(&self) -> Result<Vec<u8>, CellError> {
        let mut out = Vec::with_capacity(64);
        put_auth_key(&mut out, &self.auth_key);
        put_extensions(&mut out, &self.extensions)?;
        Ok(out)
    }

    /// What SIG signs: the prefix "Tor establish-intro cell v1" then every field up to and
    /// including HANDSHAKE_AUTH.
    pub fn signed_bytes(&self) -> Result<Vec<u8>, CellError> {
        let mut out = ESTABLISH_INTRO_SIG_PREFIX.to_vec();
        out.extend_from_slice(&self.mac_bytes()?);
        out.extend_from_slice(&self.handshake_auth);
        Ok(out)
    }

    /// Encode; fails if an extension is too long or the message exceeds one relay cell.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = self.mac_bytes()?;
        out.extend_from_slice(&self.handshake_auth);
        out.extend_from_slice(&(ED25519_SIG_LEN as u16).to_be_bytes());
        out.extend_from_slice(&self.sig);
        fits_relay_cell("ESTABLISH_INTRO", out)
    }

    /// Decode; refuses a non-Ed25519 key and a signature that is not 64 bytes.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "ESTABLISH_INTRO";
        let mut r = Reader::new(body, what);
        let auth_key = read_auth_key(&mut r, what)?;
        let extensions = read_extensions(&mut r)?;
        let handshake_auth = r.array()?;
        let sig_len = usize::from(r.u16()?);
        if sig_len != ED25519_SIG_LEN {
            return Err(CellError::WrongLength {
                what: "ESTABLISH_INTRO signature",
                expected: ED25519_SIG_LEN,
                got: sig_len,
            });
        }
        let sig = r.array()?;
        Ok(EstablishIntro {
            auth_key,
            extensions,
            handshake_auth,
            sig,
        })
    }
}

/// INTRO_ESTABLISHED (intro point to service): `N_EXTENSIONS (1)` extensions. An empty body
/// (old Tor relays) decodes as no extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntroEstablished {
    /// Extensions (none defined).
    pub extensions: Vec<Extension>,
}

impl IntroEstablished {
    /// Encode.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = Vec::new();
        put_extensions(&mut out, &self.extensions)?;
        fits_relay_cell("INTRO_ESTABLISHED", out)
    }

    /// Decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.is_empty() {
            return Ok(Self::default());
        }
        let mut r = Reader::new(body, "INTRO_ESTABLISHED");
        Ok(IntroEstablished {
            extensions: read_extensions(&mut r)?,
        })
    }
}

/// INTRODUCE1 (client to intro point) and INTRODUCE2 (intro point to service, same bytes).
///
/// `LEGACY_KEY_ID (20, zero) AUTH_KEY_TYPE (1) AUTH_KEY_LEN (2) AUTH_KEY (32) N_EXTENSIONS (1)
/// extensions ENCRYPTED (to the end)`. `ENCRYPTED` is hs-ntor's `X | C | MAC`, opaque here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Introduce {
    /// Which intro point (and so which service) this is for.
    pub auth_key: [u8; KEY_LEN],
    /// Extensions (none defined).
    pub extensions: Vec<Extension>,
    /// The client's encrypted part, only the service can read.
    pub encrypted: Vec<u8>,
}

impl Introduce {
    /// Everything before ENCRYPTED: the bytes hs-ntor's MAC covers besides ENCRYPTED itself,
    /// so that the intro point can change none of them unnoticed.
    pub fn header(&self) -> Result<Vec<u8>, CellError> {
        let mut out = vec![0u8; LEGACY_KEY_ID_LEN];
        put_auth_key(&mut out, &self.auth_key);
        put_extensions(&mut out, &self.extensions)?;
        Ok(out)
    }

    /// Encode; fails if the message exceeds one relay cell.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = self.header()?;
        out.extend_from_slice(&self.encrypted);
        fits_relay_cell("INTRODUCE", out)
    }

    /// Decode; refuses a legacy (nonzero LEGACY_KEY_ID) or non-Ed25519 introduction and an
    /// empty ENCRYPTED.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "INTRODUCE";
        let mut r = Reader::new(body, what);
        let legacy: [u8; LEGACY_KEY_ID_LEN] = r.array()?;
        if legacy != [0u8; LEGACY_KEY_ID_LEN] {
            return Err(CellError::Invalid {
                what,
                why: "legacy INTRODUCE (nonzero LEGACY_KEY_ID) is not supported",
            });
        }
        let auth_key = read_auth_key(&mut r, what)?;
        let extensions = read_extensions(&mut r)?;
        let encrypted = r.take(r.remaining())?.to_vec();
        if encrypted.is_empty() {
            return Err(CellError::Invalid {
                what,
                why: "no encrypted part",
            });
        }
        Ok(Introduce {
            auth_key,
            extensions,
            encrypted,
        })
    }
}

/// INTRODUCE_ACK status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntroduceAckStatus {
    /// 0: relayed to the service.
    Success,
    /// 1: no introduction circuit for this auth key.
    UnknownService,
    /// 2: the INTRODUCE1 did not parse.
    BadFormat,
    /// 3: the intro point could not relay it.
    CantRelay,
    /// Any other value, kept as is.
    Other(u16),
}

impl IntroduceAckStatus {
    /// The wire value.
    pub fn to_u16(self) -> u16 {
        match self {
            Self::Success => 0,
            Self::UnknownService => 1,
            Self::BadFormat => 2,
            Self::CantRelay => 3,
            Self::Other(v) => v,
        }
    }

    /// From the wire value.
    pub fn from_u16(v: u16) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::UnknownService,
            2 => Self::BadFormat,
            3 => Self::CantRelay,
            v => Self::Other(v),
        }
    }
}

/// INTRODUCE_ACK (intro point to client): `STATUS (2) N_EXTENSIONS (1)` extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntroduceAck {
    /// Whether the introduction was passed on.
    pub status: IntroduceAckStatus,
    /// Extensions (none defined).
    pub extensions: Vec<Extension>,
}

impl IntroduceAck {
    /// Encode.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = self.status.to_u16().to_be_bytes().to_vec();
        put_extensions(&mut out, &self.extensions)?;
        fits_relay_cell("INTRODUCE_ACK", out)
    }

    /// Decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "INTRODUCE_ACK");
        let status = IntroduceAckStatus::from_u16(r.u16()?);
        let extensions = read_extensions(&mut r)?;
        Ok(IntroduceAck { status, extensions })
    }
}

/// ESTABLISH_RENDEZVOUS (client to rendezvous point): the 20-byte cookie. Extra bytes are
/// ignored, as rend-spec asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EstablishRendezvous {
    /// The cookie the service will quote in RENDEZVOUS1.
    pub cookie: [u8; REND_COOKIE_LEN],
}

impl EstablishRendezvous {
    /// Encode.
    pub fn encode(&self) -> Vec<u8> {
        self.cookie.to_vec()
    }

    /// Decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(EstablishRendezvous {
            cookie: Reader::new(body, "ESTABLISH_RENDEZVOUS").array()?,
        })
    }
}

/// RENDEZVOUS_ESTABLISHED (rendezvous point to client): empty; extra bytes are ignored, so
/// there is nothing to decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RendezvousEstablished;

/// RENDEZVOUS1 (service to rendezvous point): `COOKIE (20) HANDSHAKE_INFO (to the end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous1 {
    /// The client's cookie, from the INTRODUCE plaintext.
    pub cookie: [u8; REND_COOKIE_LEN],
    /// hs-ntor's `Y | AUTH_INPUT_MAC`, passed to the client unchanged in RENDEZVOUS2.
    pub handshake_info: Vec<u8>,
}

impl Rendezvous1 {
    /// Encode; fails if the message exceeds one relay cell.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        let mut out = self.cookie.to_vec();
        out.extend_from_slice(&self.handshake_info);
        fits_relay_cell("RENDEZVOUS1", out)
    }

    /// Decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "RENDEZVOUS1");
        let cookie = r.array()?;
        let handshake_info = r.take(r.remaining())?.to_vec();
        Ok(Rendezvous1 {
            cookie,
            handshake_info,
        })
    }
}

/// RENDEZVOUS2 (rendezvous point to client): RENDEZVOUS1's HANDSHAKE_INFO, the whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous2 {
    /// hs-ntor's `Y | AUTH_INPUT_MAC`.
    pub handshake_info: Vec<u8>,
}

impl Rendezvous2 {
    /// Encode; fails if the message exceeds one relay cell.
    pub fn encode(&self) -> Result<Vec<u8>, CellError> {
        fits_relay_cell("RENDEZVOUS2", self.handshake_info.clone())
    }

    /// Decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(Rendezvous2 {
            handshake_info: body.to_vec(),
        })
    }
}

/// The decrypted plaintext of INTRODUCE2 ([PROCESS_INTRO2]): where the service meets the
/// client.
///
/// `RENDEZVOUS_COOKIE (20) N_EXTENSIONS (1) extensions ONION_KEY_TYPE (1) ONION_KEY_LEN (2)
/// ONION_KEY (32) NSPEC (1) link specifiers PAD (to the end, ignored)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntroducePlaintext {
    /// The cookie of the client's rendezvous circuit.
    pub cookie: [u8; REND_COOKIE_LEN],
    /// Extensions (none defined).
    pub extensions: Vec<Extension>,
    /// The rendezvous point's ntor onion key.
    pub onion_key: [u8; KEY_LEN],
    /// How to reach the rendezvous point; the service passes them on unchanged in EXTEND2.
    pub link_specifiers: Vec<LinkSpec>,
}

impl IntroducePlaintext {
    /// Encode, then pad with zeros to at least `pad_to` bytes (so that the ciphertext length
    /// says less about the rendezvous point; 0 for none).
    pub fn encode(&self, pad_to: usize) -> Result<Vec<u8>, CellError> {
        let mut out = self.cookie.to_vec();
        put_extensions(&mut out, &self.extensions)?;
        out.push(ONION_KEY_TYPE_NTOR);
        put_len16(&mut out, "onion key", KEY_LEN)?;
        out.extend_from_slice(&self.onion_key);
        put_len8(&mut out, "link specifiers", self.link_specifiers.len())?;
        for ls in &self.link_specifiers {
            ls.encode_into(&mut out)?;
        }
        if out.len() < pad_to {
            out.resize(pad_to, 0);
        }
        Ok(out)
    }

    /// Decode; refuses an onion key that is not a 32-byte ntor key.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let what = "INTRODUCE plaintext";
        let mut r = Reader::new(body, what);
        let cookie = r.array()?;
        let extensions = read_extensions(&mut r)?;
        let key_type = r.u8()?;
        let key_len = usize::from(r.u16()?);
        if key_type != ONION_KEY_TYPE_NTOR {
            return Err(CellError::Invalid {
                what,
                why: "onion key type is not ntor",
            });
        }
        if key_len != KEY_LEN {
            return Err(CellError::WrongLength {
                what: "INTRODUCE onion key",
                expected: KEY_LEN,
                got: key_len,
            });
        }
        let onion_key = r.array()?;
        let n = r.u8()?;
        let mut link_specifiers = Vec::with_capacity(usize::from(n).min(r.remaining() / 2));
        for _ in 0..n {
            link_specifiers.push(LinkSpec::read(&mut r)?);
        }
        Ok(IntroducePlaintext {
            cookie,
            extensions,
            onion_key,
            link_specifiers,
        })
    }
}

#[cfg(test)]
#[path = "onion_tests.rs"]
mod tests;
