//! The extensions an ntor v3 handshake carries, encrypted and authenticated, in CREATE2 (the
//! client's request) and CREATED2 (the relay's answer): proposal 332's list format with
//! proposal 324's congestion-control fields.
//!
//! ```text
//! N_EXTENSIONS (1) | N × [ EXT_FIELD_TYPE (1) | EXT_FIELD_LEN (1) | EXT_FIELD (EXT_FIELD_LEN) ]
//! 0x01 CC_REQUEST  (client → exit): empty — "use congestion control on this circuit"
//! 0x02 CC_RESPONSE (exit → client): SENDME_INC (1) — yes, acknowledging every SENDME_INC cells
//! ```
//! Unknown types are kept as [`CircExt::Unknown`] (the caller ignores them, as tor does).
//! Refused: a known field of the wrong length, a known type twice, and bytes after the
//! announced list (the list is authenticated, so only a faulty or hostile peer sends those).

use crate::reader::Reader;
use crate::CellError;

/// EXT_FIELD_TYPE of the congestion-control request (proposal 324).
pub const EXT_CC_REQUEST: u8 = 0x01;
/// EXT_FIELD_TYPE of the congestion-control response (proposal 324).
pub const EXT_CC_RESPONSE: u8 = 0x02;

/// One ntor v3 extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CircExt {
    /// The client asks for congestion control on this circuit.
    CcRequest,
    /// The exit agrees, and acknowledges every `sendme_inc` cells.
    CcResponse {
        /// Cells per circuit SENDME.
        sendme_inc: u8,
    },
    /// A type this version does not know.
    Unknown {
        /// EXT_FIELD_TYPE.
        ext_type: u8,
        /// EXT_FIELD.
        body: Vec<u8>,
    },
}

impl CircExt {
    fn ext_type(&self) -> u8 {
        match self {
            CircExt::CcRequest => EXT_CC_REQUEST,
            CircExt::CcResponse { .. } => EXT_CC_RESPONSE,
            CircExt::Unknown { ext_type, .. } => *ext_type,
        }
    }

    /// Encode a list (at most 255 extensions, each field at most 255 bytes).
    pub fn encode_list(exts: &[CircExt]) -> Result<Vec<u8>, CellError> {
        let n = u8::try_from(exts.len()).map_err(|_| CellError::TooLong {
            what: "ntor v3 extensions",
            max: 255,
            got: exts.len(),
        })?;
        let mut out = vec![n];
        for e in exts {
            let body: &[u8] = match e {
                CircExt::CcRequest => &[],
                CircExt::CcResponse { sendme_inc } => std::slice::from_ref(sendme_inc),
                CircExt::Unknown { body, .. } => body,
            };
            let len = u8::try_from(body.len()).map_err(|_| CellError::TooLong {
                what: "ntor v3 extension field",
                max: 255,
                got: body.len(),
            })?;
            out.extend_from_slice(&[e.ext_type(), len]);
            out.extend_from_slice(body);
        }
        Ok(out)
    }

    /// Decode a list (see the module docs for what is refused).
    pub fn decode_list(buf: &[u8]) -> Result<Vec<CircExt>, CellError> {
        const WHAT: &str = "ntor v3 extensions";
        let mut r = Reader::new(buf, WHAT);
        let n = r.u8()?;
        let mut out = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let ext_type = r.u8()?;
            let len = r.u8()?;
            let body = r.take(usize::from(len))?;
            let ext = match (ext_type, body) {
                (EXT_CC_REQUEST, []) => CircExt::CcRequest,
                (EXT_CC_RESPONSE, [inc]) => CircExt::CcResponse { sendme_inc: *inc },
                (EXT_CC_REQUEST | EXT_CC_RESPONSE, _) => {
                    return Err(CellError::Invalid {
                        what: WHAT,
                        why: "congestion-control field of the wrong length",
                    })
                }
                _ => CircExt::Unknown {
                    ext_type,
                    body: body.to_vec(),
                },
            };
            let known = !matches!(ext, CircExt::Unknown { .. });
            if known && out.iter().any(|e: &CircExt| e.ext_type() == ext_type) {
                return Err(CellError::Invalid {
                    what: WHAT,
                    why: "the same field twice",
                });
            }
            out.push(ext);
        }
        if r.remaining() != 0 {
            return Err(CellError::Invalid {
                what: WHAT,
                why: "bytes after the list",
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_in_proposal_324_numbers() {
        let exts = vec![
            CircExt::CcRequest,
            CircExt::Unknown {
                ext_type: 9,
                body: vec![1, 2, 3],
            },
        ];
        let b = CircExt::encode_list(&exts).unwrap();
        assert_eq!(b, [2, 0x01, 0, 9, 3, 1, 2, 3]);
        assert_eq!(CircExt::decode_list(&b).unwrap(), exts);
        let resp = CircExt::encode_list(&[CircExt::CcResponse { sendme_inc: 100 }]).unwrap();
        assert_eq!(resp, [1, 0x02, 1, 100]);
        assert_eq!(CircExt::decode_list(&[0]).unwrap(), vec![]);
    }

    #[test]
    fn malformed_lists_are_refused() {
        for bad in [
            &[][..],
            &[1],
            &[1, 0x01],
            &[1, 0x01, 1, 0],
            &[1, 0x02, 0],
            &[1, 0x02, 2, 1, 1],
            &[2, 0x01, 0, 0x01, 0],
            &[1, 0x01, 0, 0],
            &[1, 7, 3, 1],
        ] {
            assert!(CircExt::decode_list(bad).is_err(), "{bad:?}");
        }
        let long = vec![
            CircExt::Unknown {
                ext_type: 5,
                body: vec![]
            };
            256
        ];
        assert!(CircExt::encode_list(&long).is_err());
    }
}
