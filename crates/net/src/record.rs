//! An own TLS 1.3 record layer for the data path, after rustls has done the handshake (sans-IO).
//!
//! rustls keeps the handshake, certificate checks, the exporter and the key schedule; once the
//! handshake is done its traffic secrets are extracted (`dangerous_into_kernel_connection`, the
//! API rustls offers for kTLS) and records are sealed and opened here, in place, in buffers the
//! caller owns: no deframer buffer, no per-record `Vec`, no plaintext queue between TLS and the
//! cell framer (docs/performance.md, "The own record layer").
//!
//! - [`RecordSealer`]: application data, a KeyUpdate or an alert into TLS 1.3 records appended to
//!   a `Vec<u8>` (header, payload, inner content type, no padding, sealed in place, tag).
//! - [`RecordOpener`]: the first record of a byte buffer, opened in place: nonce = IV XOR the
//!   64-bit sequence number, additional data = the 5-byte header, padding and inner content type
//!   stripped, the plaintext's range returned ([`Opened`]).
//!
//! Sequence numbers never repeat under one key: each seal or open takes the next one, a sealer
//! refuses to seal past the suite's confidentiality limit (the caller sends a KeyUpdate before,
//! [`RecordSealer::needs_key_update`]), and a new key starts again at the sequence number
//! rustls's `update_tx_secret` / `update_rx_secret` returns (0).
//!
//! Not here: the I/O and the key schedule (the caller holds rustls's `KernelConnection` and hands
//! each new secret to [`RecordSealer::rekey`] / [`RecordOpener::rekey`]); TLS 1.2; handshake
//! messages fragmented across records (a post-handshake message must fit in one record: rustls
//! sends a KeyUpdate in one, chive's responders send no tickets).

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::ConnectionTrafficSecrets;

/// Bytes of a TLS record header: content type, legacy version (2), length (2).
pub(crate) const HEADER_LEN: usize = 5;
/// Bytes of an AEAD tag (all three TLS 1.3 suites chive offers).
pub(crate) const TAG_LEN: usize = 16;
/// Most plaintext bytes in one record (RFC 8446 §5.1: 2^14).
pub(crate) const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes after the header of a protected record (RFC 8446 §5.2: 2^14 + 256).
pub(crate) const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Most bytes of one whole record on the wire.
pub(crate) const MAX_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT;
/// Bytes a record adds to its payload when sealed here: header, inner content type, tag.
pub(crate) const RECORD_OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;
/// The legacy record version of every TLS 1.3 record after the ClientHello.
const LEGACY_VERSION: [u8; 2] = [0x03, 0x03];
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;
const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// TLS alert descriptions this layer sends or recognises (RFC 8446 §6).
pub(crate) mod alert {
    /// The sender closes its direction cleanly.
    pub const CLOSE_NOTIFY: u8 = 0;
    /// A record of an unexpected type.
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    /// A record that failed authentication.
    pub const BAD_RECORD_MAC: u8 = 20;
    /// A record longer than the protocol allows.
    pub const RECORD_OVERFLOW: u8 = 22;
    /// A malformed record or message.
    pub const DECODE_ERROR: u8 = 50;
    /// Something went wrong in this implementation.
    pub const INTERNAL_ERROR: u8 = 80;
    /// The sender cancels (a warning, followed by close_notify).
    pub const USER_CANCELED: u8 = 90;
}

/// Why a record could not be sealed or opened. Every one but [`RecordError::Incomplete`] is
/// fatal for the connection: the caller sends [`RecordError::alert`] (if any) and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The header is not that of a TLS 1.3 protected record (type 23, version 0x0303).
    #[error("bad record header (type {ty}, version {version:#06x})")]
    BadHeader {
        /// The outer content type.
        ty: u8,
        /// The legacy version field.
        version: u16,
    },
    /// The record's length field is over 2^14 + 256, or its plaintext over 2^14.
    #[error("record too long ({0} bytes)")]
    Overflow(usize),
    /// The record is too short to hold a tag and a content type.
    #[error("record too short ({0} bytes)")]
    TooShort(usize),
    /// The AEAD tag did not verify (tampered, truncated, or a wrong key or sequence number).
    #[error("record failed authentication (sequence number {0})")]
    BadRecordMac(u64),
    /// The decrypted record has no inner content type (all zeros).
    #[error("record without an inner content type")]
    NoContentType,
    /// An inner content type or handshake message not allowed after the handshake.
    #[error("unexpected {0} after the handshake")]
    Unexpected(String),
    /// A malformed alert or handshake message.
    #[error("malformed {0}")]
    Decode(&'static str),
    /// The peer sent a fatal alert (its description).
    #[error("peer sent alert {0} ({name})", name = alert_name(*.0))]
    PeerAlert(u8),
    /// The traffic secrets are of a suite this layer does not implement.
    #[error("unsupported traffic secrets: {0}")]
    Unsupported(&'static str),
    /// Sealing one more record would pass the key's confidentiality limit (no KeyUpdate sent).
    #[error("record sequence number {0} at the key's limit")]
    KeyExhausted(u64),
}

impl RecordError {
    /// The alert to send the peer before closing (`None`: the peer is gone or closed, or the
    /// failure is ours to log, not the peer's to learn).
    pub fn alert(&self) -> Option<u8> {
        match self {
            RecordError::BadHeader { .. } | RecordError::TooShort(_) | RecordError::Decode(_) => {
                Some(alert::DECODE_ERROR)
            }
            RecordError::Overflow(_) => Some(alert::RECORD_OVERFLOW),
            RecordError::BadRecordMac(_) => Some(alert::BAD_RECORD_MAC),
            RecordError::NoContentType | RecordError::Unexpected(_) => {
                Some(alert::UNEXPECTED_MESSAGE)
            }
            RecordError::Unsupported(_) | RecordError::KeyExhausted(_) => {
                Some(alert::INTERNAL_ERROR)
            }
            RecordError::PeerAlert(_) => None,
        }
    }
}

/// A short name for an alert description, for logs.
pub(crate) fn alert_name(desc: u8) -> &'static str {
    match desc {
        0 => "close_notify",
        10 => "unexpected_message",
        20 => "bad_record_mac",
        22 => "record_overflow",
        40 => "handshake_failure",
        47 => "illegal_parameter",
        50 => "decode_error",
        51 => "decrypt_error",
        80 => "internal_error",
        90 => "user_canceled",
        _ => "other",
    }
}

/// One direction's key, static IV and next sequence number.
struct DirectionKey {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    /// Records this key may protect ([`rustls::CipherSuiteCommon::confidentiality_limit`]).
    limit: u64,
}

/// Shows the sequence number only: the key and IV stay out of logs.
impl std::fmt::Debug for DirectionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectionKey")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl DirectionKey {
    fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<Self, RecordError> {
        let (alg, key, iv, limit) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&aead::AES_128_GCM, key, iv, 1u64 << 24)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&aead::AES_256_GCM, key, iv, 1u64 << 24)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv, u64::MAX)
            }
            _ => return Err(RecordError::Unsupported("not a TLS 1.3 AEAD suite")),
        };
        let unbound = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| RecordError::Unsupported("key length"))?;
        let iv: [u8; NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| RecordError::Unsupported("IV length"))?;
        Ok(DirectionKey {
            key: LessSafeKey::new(unbound),
            iv,
            seq,
            limit,
        })
    }

    /// The nonce of the next record (RFC 8446 §5.3: the sequence number, big-endian, left-padded
    /// to the IV's length, XORed with the IV).
    fn nonce(&self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        Nonce::assume_unique_for_key(nonce)
    }
}

/// Seals TLS 1.3 records of one direction (the writer's half of a link).
#[derive(Debug)]
pub struct RecordSealer {
    key: DirectionKey,
}

impl RecordSealer {
    /// A sealer whose next record has sequence number `seq`, under `secrets` (the `tx` half of
    /// rustls's `ExtractedSecrets`).
    pub fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<Self, RecordError> {
        Ok(RecordSealer {
            key: DirectionKey::new(seq, secrets)?,
        })
    }

    /// The next record's sequence number.
    pub fn seq(&self) -> u64 {
        self.key.seq
    }

    /// Whether the key is close enough to its confidentiality limit that the caller should send
    /// a KeyUpdate ([`RecordSealer::seal_key_update`]) before more data: within 1/16 of it, as
    /// rustls's own soft limit (far more records than one batch needs).
    pub fn needs_key_update(&self) -> bool {
        self.key.seq >= self.key.limit - self.key.limit / 16
    }

    /// Seal `data` as application-data records (at most [`MAX_PLAINTEXT`] bytes each) appended
    /// to `out`. `data` may be empty (no record).
    pub fn seal_app_data(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        out.reserve(data.len() + data.len().div_ceil(MAX_PLAINTEXT) * RECORD_OVERHEAD);
        for chunk in data.chunks(MAX_PLAINTEXT) {
            self.seal(CONTENT_APPLICATION_DATA, chunk, out)?;
        }
        Ok(())
    }

    /// Seal a KeyUpdate handshake message (`update_requested`: the peer must answer with its
    /// own) under the current key. The caller then switches to the next key
    /// ([`RecordSealer::rekey`] with `KernelConnection::update_tx_secret`'s result).
    pub fn seal_key_update(
        &mut self,
        update_requested: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let msg = [HANDSHAKE_KEY_UPDATE, 0, 0, 1, u8::from(update_requested)];
        self.seal(CONTENT_HANDSHAKE, &msg, out)
    }

    /// Seal an alert: `close_notify` (and `user_canceled`) as a warning, anything else fatal.
    pub fn seal_alert(&mut self, description: u8, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let level = match description {
            alert::CLOSE_NOTIFY | alert::USER_CANCELED => 1,
            _ => 2,
        };
        self.seal(CONTENT_ALERT, &[level, description], out)
    }

    /// Switch to a new key (after sending a KeyUpdate); its records start at `seq`.
    pub fn rekey(
        &mut self,
        seq: u64,
        secrets: &ConnectionTrafficSecrets,
    ) -> Result<(), RecordError> {
        self.key = DirectionKey::new(seq, secrets)?;
        Ok(())
    }

    /// Seal, where they lie, application-data records laid out back to back in `buf` by the
    /// writer's caller ([`crate::RECORD_HEAD`] bytes of room, the plaintext, then
    /// [`crate::RECORD_TAIL`] bytes of room): every record's plaintext is `plain` bytes but the
    /// last one's, which is what is left. So a batch encoded with gaps is sealed without the
    /// copy into a record buffer that [`RecordSealer::seal_app_data`] makes. Fails if `plain`
    /// is over [`MAX_PLAINTEXT`] or the end of `buf` cannot hold a record.
    pub fn seal_framed(&mut self, buf: &mut [u8], plain: usize) -> Result<(), RecordError> {
        if plain == 0 || plain > MAX_PLAINTEXT {
            return Err(RecordError::Unsupported("framed record size"));
        }
        let mut rest = buf;
        while !rest.is_empty() {
            let p = plain.min(rest.len().saturating_sub(RECORD_OVERHEAD));
            if p == 0 {
                return Err(RecordError::Unsupported("framed batch layout"));
            }
            let (record, tail) = rest.split_at_mut(p + RECORD_OVERHEAD);
            self.seal_in_place(CONTENT_APPLICATION_DATA, record)?;
            rest = tail;
        }
        Ok(())
    }

    fn seal(&mut self, ty: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        let start = out.len();
        out.resize(start + HEADER_LEN, 0);
        out.extend_from_slice(payload);
        out.resize(out.len() + 1 + TAG_LEN, 0);
        self.seal_in_place(ty, &mut out[start..])
    }

    /// Seal the one record `record` (header room, payload, room for the content type and the
    /// tag) in place.
    fn seal_in_place(&mut self, ty: u8, record: &mut [u8]) -> Result<(), RecordError> {
        let payload_len = record.len().saturating_sub(RECORD_OVERHEAD);
        debug_assert!(payload_len <= MAX_PLAINTEXT);
        if self.key.seq >= self.key.limit {
            return Err(RecordError::KeyExhausted(self.key.seq));
        }
        let len = (payload_len + 1 + TAG_LEN) as u16;
        let (header, body) = record.split_at_mut(HEADER_LEN);
        header[0] = CONTENT_APPLICATION_DATA;
        header[1..3].copy_from_slice(&LEGACY_VERSION);
        header[3..5].copy_from_slice(&len.to_be_bytes());
        let (inner, tag_room) = body.split_at_mut(payload_len + 1);
        inner[payload_len] = ty;
        let tag = self
            .key
            .key
            .seal_in_place_separate_tag(self.key.nonce(), Aad::from(&*header), inner)
            .map_err(|_| RecordError::Unsupported("seal failed"))?;
        tag_room.copy_from_slice(tag.as_ref());
        self.key.seq += 1;
        Ok(())
    }
}

/// What one opened record held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Application data: its plaintext is at this range of the buffer given to
    /// [`RecordOpener::open`] (possibly empty).
    Data(std::ops::Range<usize>),
    /// The peer switched to its next key: the caller must [`RecordOpener::rekey`] with
    /// `KernelConnection::update_rx_secret`'s result before opening the next record, and if
    /// `update_requested`, send a KeyUpdate of its own.
    KeyUpdate {
        /// The peer asks for our KeyUpdate in return.
        update_requested: bool,
    },
    /// The peer's close_notify: its direction has ended cleanly.
    CloseNotify,
    /// A record that carries nothing for the caller (a `user_canceled` warning, a
    /// NewSessionTicket).
    Nothing,
}

/// Opens TLS 1.3 records of one direction (the reader's half of a link).
#[derive(Debug)]
pub struct RecordOpener {
    key: DirectionKey,
    /// A KeyUpdate was opened and no new key given yet: opening another record is refused.
    awaiting_rekey: bool,
}

/// How many bytes the record starting at `buf[0]` occupies, once its header is there (`None`:
/// fewer than [`HEADER_LEN`] bytes). Checks the header.
pub(crate) fn record_len(buf: &[u8]) -> Result<Option<usize>, RecordError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let version = u16::from_be_bytes([header[1], header[2]]);
    if header[0] != CONTENT_APPLICATION_DATA || header[1..3] != LEGACY_VERSION {
        return Err(RecordError::BadHeader {
            ty: header[0],
            version,
        });
    }
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_CIPHERTEXT {
        return Err(RecordError::Overflow(len));
    }
    if len < TAG_LEN + 1 {
        return Err(RecordError::TooShort(len));
    }
    Ok(Some(HEADER_LEN + len))
}

impl RecordOpener {
    /// An opener whose next record has sequence number `seq`, under `secrets` (the `rx` half
    /// of rustls's `ExtractedSecrets`).
    pub fn new(seq: u64, secrets: &ConnectionTrafficSecrets) -> Result<Self, RecordError> {
        Ok(RecordOpener {
            key: DirectionKey::new(seq, secrets)?,
            awaiting_rekey: false,
        })
    }

    /// The next record's sequence number.
    pub fn seq(&self) -> u64 {
        self.key.seq
    }

    /// Switch to the peer's next key (after [`Opened::KeyUpdate`]); its records start at `seq`.
    pub fn rekey(
        &mut self,
        seq: u64,
        secrets: &ConnectionTrafficSecrets,
    ) -> Result<(), RecordError> {
        self.key = DirectionKey::new(seq, secrets)?;
        self.awaiting_rekey = false;
        Ok(())
    }

    /// Open the record at the start of `buf` in place. `Ok(None)`: the record is not complete
    /// yet (read more; nothing changed). Otherwise the record's length on the wire (the caller
    /// drops that many bytes once done with the plaintext) and what it held; the plaintext of
    /// [`Opened::Data`] lies inside `buf`, decrypted.
    ///
    /// An error is fatal: the buffer's contents are then undefined and the connection must
    /// close (after sending [`RecordError::alert`]).
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Option<(usize, Opened)>, RecordError> {
        let Some(len) = self.complete(buf)? else {
            return Ok(None);
        };
        let header = header_of(buf);
        let (_, body) = buf[..len].split_at_mut(HEADER_LEN);
        let opened = self.open_body(header, body, 0)?;
        Ok(Some((len, shifted(opened, HEADER_LEN))))
    }

    /// Open the record at `buf[at..]` with its plaintext moved to `buf[to..]` (`to <= at`):
    /// ring decrypts straight there, so the plaintext of records read back to back comes out
    /// packed together, with no copy (the record stream opens records this way in its caller's
    /// buffer). Returns as [`open`](Self::open): the record's length on the wire (from `at`),
    /// and [`Opened::Data`]'s range in `buf` (from `to`). Bytes from `to` up to the record's
    /// end are undefined afterwards, except that plaintext.
    pub fn open_into(
        &mut self,
        buf: &mut [u8],
        to: usize,
        at: usize,
    ) -> Result<Option<(usize, Opened)>, RecordError> {
        if to > at || at > buf.len() {
            return Err(RecordError::Unsupported("plaintext after its record"));
        }
        let Some(len) = self.complete(&buf[at..])? else {
            return Ok(None);
        };
        let header = header_of(&buf[at..]);
        let opened = self.open_body(header, &mut buf[to..at + len], at - to + HEADER_LEN)?;
        Ok(Some((len, shifted(opened, to))))
    }

    /// The length of the complete record at the start of `buf` (`None`: not complete yet).
    fn complete(&self, buf: &[u8]) -> Result<Option<usize>, RecordError> {
        let Some(len) = record_len(buf)? else {
            return Ok(None);
        };
        if buf.len() < len {
            return Ok(None);
        }
        if self.awaiting_rekey {
            return Err(RecordError::Unexpected("record before the new key".into()));
        }
        Ok(Some(len))
    }

    /// Decrypt `in_out[src..]` (body and tag) to the start of `in_out`; strip the padding and
    /// the inner content type. A `Data` range is relative to `in_out`.
    fn open_body(
        &mut self,
        header: [u8; HEADER_LEN],
        in_out: &mut [u8],
        src: usize,
    ) -> Result<Opened, RecordError> {
        let seq = self.key.seq;
        let plain_len = self
            .key
            .key
            .open_within(self.key.nonce(), Aad::from(header), in_out, src..)
            .map_err(|_| RecordError::BadRecordMac(seq))?
            .len();
        self.key.seq += 1;
        // Strip the zero padding; the last non-zero byte is the inner content type.
        let inner = &in_out[..plain_len];
        let Some(type_at) = inner.iter().rposition(|&b| b != 0) else {
            return Err(RecordError::NoContentType);
        };
        if type_at > MAX_PLAINTEXT {
            return Err(RecordError::Overflow(type_at));
        }
        let content = &inner[..type_at];
        Ok(match inner[type_at] {
            CONTENT_APPLICATION_DATA => Opened::Data(0..type_at),
            CONTENT_ALERT => match content {
                [_, alert::CLOSE_NOTIFY] => Opened::CloseNotify,
                [_, alert::USER_CANCELED] => Opened::Nothing,
                [_, desc] => return Err(RecordError::PeerAlert(*desc)),
                _ => return Err(RecordError::Decode("alert")),
            },
            CONTENT_HANDSHAKE => self.handshake(content)?,
            other => return Err(RecordError::Unexpected(format!("content type {other}"))),
        })
    }

    /// Post-handshake messages in one record: a KeyUpdate (which must end the record, RFC 8446
    /// §5.1) or NewSessionTickets (ignored: chive never resumes).
    fn handshake(&mut self, mut msgs: &[u8]) -> Result<Opened, RecordError> {
        if msgs.is_empty() {
            return Err(RecordError::Decode("empty handshake record"));
        }
        let mut opened = Opened::Nothing;
        while !msgs.is_empty() {
            let [ty, a, b, c, rest @ ..] = msgs else {
                return Err(RecordError::Decode("handshake message header"));
            };
            let len = u32::from_be_bytes([0, *a, *b, *c]) as usize;
            let (body, rest) = rest.split_at_checked(len).ok_or(RecordError::Decode(
                "handshake message split across records",
            ))?;
            msgs = rest;
            match (*ty, body) {
                (HANDSHAKE_KEY_UPDATE, [req @ (0 | 1)]) if msgs.is_empty() => {
                    opened = Opened::KeyUpdate {
                        update_requested: *req == 1,
                    };
                    self.awaiting_rekey = true;
                }
                (HANDSHAKE_KEY_UPDATE, [0 | 1]) => {
                    return Err(RecordError::Unexpected(
                        "data after a KeyUpdate in its record".into(),
                    ))
                }
                (HANDSHAKE_KEY_UPDATE, _) => return Err(RecordError::Decode("KeyUpdate")),
                (HANDSHAKE_NEW_SESSION_TICKET, _) => {}
                (other, _) => {
                    return Err(RecordError::Unexpected(format!(
                        "handshake message type {other}"
                    )))
                }
            }
        }
        Ok(opened)
    }
}

/// The header of the record at the start of `buf` (at least [`HEADER_LEN`] bytes: checked by
/// [`record_len`]).
fn header_of(buf: &[u8]) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(&buf[..HEADER_LEN]);
    header
}

/// `opened` with a `Data` range moved by `by`.
fn shifted(opened: Opened, by: usize) -> Opened {
    match opened {
        Opened::Data(r) => Opened::Data(r.start + by..r.end + by),
        other => other,
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
