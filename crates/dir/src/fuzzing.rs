//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, off in every build of the
//! relay and the authority): a fuzzer cannot forge Ed25519 signatures, so these run everything
//! [`Consensus::verify`], [`RelayDescriptor::verify`] and [`OnionDescriptor::verify`] do *after* the signature check, on the
//! signed part of a document (`header\nbody\n`). Nothing here is part of the stable API.

use chive_crypto::OnionAddress;

use crate::{document, Consensus, DirError, OnionDescriptor, RelayDescriptor};

/// [`Consensus::verify`] without the size limit and the signature check.
pub fn consensus_unsigned(signed: &str, now: u64) -> Result<Consensus, DirError> {
    let (header, body) = document::parts(signed).ok_or(DirError::BadSignature)?;
    Consensus::parse_signed(header, body, now)
}

/// [`RelayDescriptor::verify`] without the size limit and the signature check.
pub fn descriptor_unsigned(signed: &str) -> Result<RelayDescriptor, DirError> {
    let (header, body) = document::parts(signed).ok_or(DirError::BadDescriptorSignature)?;
    let (id_hex, identity) = RelayDescriptor::header_identity(header)?;
    RelayDescriptor::parse_signed(id_hex, identity, body)
}

/// [`OnionDescriptor::verify`] for `expected` without the size limit and the signature check.
pub fn onion_descriptor_unsigned(
    signed: &str,
    expected: &OnionAddress,
    now: u64,
) -> Result<OnionDescriptor, DirError> {
    let (header, body) = document::parts(signed).ok_or(DirError::BadOnionSignature)?;
    let label = OnionDescriptor::header_label(header, expected)?;
    OnionDescriptor::parse_signed(label, body, expected, now)
}
