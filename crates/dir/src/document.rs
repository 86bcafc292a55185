//! The signed text format shared by descriptors and consensuses:
//!
//! ```text
//! <header line>\n
//! <JSON body on one line>\n
//! signature <128 lower-case hex digits: Ed25519 over every byte above>\n
//! ```
//!
//! The header names the document type (domain separation: a descriptor signature can
//! never pass as a consensus signature) and, for descriptors, the signing identity, so
//! the signature is checked before the body is interpreted.

use chive_crypto::{IdentityKey, IdentityKeypair, Signature};

const SIG_PREFIX: &str = "signature ";

/// Produce `header\nbody\nsignature <hex>\n`.
pub(crate) fn sign(header: &str, body: &str, key: &IdentityKeypair) -> String {
    let mut doc = String::with_capacity(header.len() + body.len() + 150);
    doc.push_str(header);
    doc.push('\n');
    doc.push_str(body);
    doc.push('\n');
    let sig = key.sign(doc.as_bytes());
    doc.push_str(SIG_PREFIX);
    doc.push_str(&sig.to_hex());
    doc.push('\n');
    doc
}

/// Whether `s` is exactly lower-case hex (upper case would let a changed byte still verify).
pub(crate) fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Split a document into (signed part, signature), or `None` if it is not framed as
/// a signed document.
pub(crate) fn split(doc: &str) -> Option<(&str, Signature)> {
    let without_nl = doc.strip_suffix('\n')?;
    let cut = without_nl.rfind('\n')? + 1;
    let signed = doc.get(..cut)?;
    let hex = without_nl.get(cut..)?.strip_prefix(SIG_PREFIX)?;
    if hex.len() != 2 * chive_crypto::identity::SIGNATURE_LEN || !is_lower_hex(hex) {
        return None;
    }
    Some((signed, Signature::from_hex(hex).ok()?))
}

/// Check the signature with `key`; on success return (header line, body) of the signed part.
pub(crate) fn verify<'a>(doc: &'a str, key: &IdentityKey) -> Option<(&'a str, &'a str)> {
    let (signed, sig) = split(doc)?;
    key.verify(signed.as_bytes(), &sig).ok()?;
    parts(signed)
}

/// (header line, body) of a signed part `header\nbody\n`.
pub(crate) fn parts(signed: &str) -> Option<(&str, &str)> {
    let (header, rest) = signed.split_once('\n')?;
    Some((header, rest.strip_suffix('\n')?))
}
