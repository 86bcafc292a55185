//! Targets `consensus`, `descriptor` and `exit_policy`: chive-dir's documents as a client or the
//! authority reads them.
//!
//! Signed documents: a fuzzer cannot forge an Ed25519 signature, so most inputs are the signed
//! part of a document (`header\nbody`) and go through chive-dir's `fuzzing` entry points, which
//! run every check after the signature; the rest ("raw" mode) go through the real `verify` as
//! they are, for the framing and signature checks. Round trips sign with fixed keys.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use chive_crypto::IdentityKeypair;
use chive_dir::fuzzing::{consensus_unsigned, descriptor_unsigned};
use chive_dir::{Consensus, ExitPolicy, RelayDescriptor, KNOWN_PARAMS};

/// Secret seed of the authority key that signs consensus inputs.
pub(crate) const AUTHORITY_SEED: [u8; 32] = [3; 32];
/// Secret seed of the relay key that signs descriptor inputs.
pub(crate) const RELAY_SEED: [u8; 32] = [4; 32];
/// The verifier's clock for consensus inputs (UNIX seconds; the seeds are valid then).
pub(crate) const NOW: u64 = 1_700_000_000;

fn key(
    seed: &'static [u8; 32],
    cell: &'static OnceLock<IdentityKeypair>,
) -> &'static IdentityKeypair {
    cell.get_or_init(|| IdentityKeypair::from_secret_bytes(seed))
}

pub(crate) fn authority() -> &'static IdentityKeypair {
    static K: OnceLock<IdentityKeypair> = OnceLock::new();
    key(&AUTHORITY_SEED, &K)
}

pub(crate) fn relay_key() -> &'static IdentityKeypair {
    static K: OnceLock<IdentityKeypair> = OnceLock::new();
    key(&RELAY_SEED, &K)
}

/// `signed` (header line, body; no trailing newline) framed and signed as chive-dir does (for
/// checking that the seeds are what chive-dir's `sign` produces).
#[cfg(test)]
pub(crate) fn sign_document(signed: &str, key: &IdentityKeypair) -> String {
    let mut doc = String::with_capacity(signed.len() + 140);
    doc.push_str(signed);
    doc.push('\n');
    let sig = key.sign(doc.as_bytes());
    doc.push_str("signature ");
    doc.push_str(&sig.to_hex());
    doc.push('\n');
    doc
}

/// An input: the first byte selects raw mode (low two bits zero: the rest is a whole document
/// for the real `verify`) or unsigned mode (the rest is the signed part without its final
/// newline); the rest must be UTF-8.
pub(crate) enum Input {
    Raw(String),
    Unsigned(String),
}

pub(crate) fn input(data: &[u8]) -> Option<Input> {
    let (&mode, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?.to_owned();
    Some(if mode & 3 == 0 {
        Input::Raw(text)
    } else {
        Input::Unsigned(text + "\n")
    })
}

/// The signed part of a document made by chive-dir's `sign` (everything before the signature
/// line).
pub(crate) fn signed_part(doc: &str) -> &str {
    let without_nl = doc.strip_suffix('\n').unwrap_or(doc);
    let cut = without_nl.rfind('\n').map_or(0, |i| i + 1);
    &doc[..cut]
}

/// See [`Input`]; bits 2-3 of the first byte pick the verifier's clock ([`clock`]). Property: a
/// consensus that parses, signed again by the authority, parses to the same value, and that
/// text is a fixed point (parsing and signing it again gives the same text). (That a signed
/// document verifies is chive-dir's unit tests' business; verifying here too would cost a third
/// of the executions per second.) What a client reads from it (parameters, lookups) never
/// panics.
pub fn consensus(data: &[u8]) {
    let now = clock(data);
    let parsed = match input(data) {
        Some(Input::Raw(doc)) => Consensus::verify(&doc, &authority().public(), now),
        Some(Input::Unsigned(signed)) => consensus_unsigned(&signed, now),
        None => return,
    };
    let Ok(c) = parsed else {
        return;
    };
    read_like_a_client(&c);
    let text = c.sign(authority());
    let again =
        consensus_unsigned(signed_part(&text), now).expect("a re-signed consensus must parse");
    assert_eq!(again, c);
    assert_eq!(again.sign(authority()), text);
}

/// The verifier's clock for a consensus input: [`NOW`] (when the seeds are valid), or one far
/// before or after it, so that the validity checks are reached without the fuzzer having to
/// change three timestamps in step.
pub(crate) fn clock(data: &[u8]) -> u64 {
    match data.first().map_or(0, |m| (m >> 2) & 3) {
        0 => NOW,
        1 => 0,
        2 => NOW + 10 * 365 * 86_400,
        _ => u64::MAX,
    }
}

/// What clients and relays read from a consensus they accepted.
fn read_like_a_client(c: &Consensus) {
    let _ = c.params.circwindow();
    for spec in KNOWN_PARAMS {
        let v = c.params.get_spec(spec);
        assert!(
            (spec.min..=spec.max).contains(&v),
            "{} = {v} outside its range",
            spec.name
        );
    }
    let _ = c.params.check_known();
    for r in &c.relays {
        assert!(c.relay_by_identity(&r.identity).is_some());
        assert!(c.relay_by_nickname(&r.nickname).is_some());
        let _ = (
            r.flags.names(),
            r.exit_policy.is_exit(),
            r.exit_policy.allows_port_somewhere(443),
        );
    }
}

/// See [`Input`]. Property as for [`consensus`], for descriptors that name the relay key the
/// seeds use (a round trip needs the identity's secret key to sign).
pub fn descriptor(data: &[u8]) {
    let parsed = match input(data) {
        Some(Input::Raw(doc)) => RelayDescriptor::verify(&doc),
        Some(Input::Unsigned(signed)) => descriptor_unsigned(&signed),
        None => return,
    };
    let Ok(d) = parsed else {
        return;
    };
    if d.identity != relay_key().public() {
        return;
    }
    let text = d.sign(relay_key());
    let again = descriptor_unsigned(signed_part(&text)).expect("a re-signed descriptor must parse");
    assert_eq!(again, d);
    assert_eq!(again.sign(relay_key()), text);
}

/// First byte: bit 0 is `reject_private`; the rest: torrc policy lines. Properties: the parsed
/// rules, written out one per string and parsed again, give the same policy (also through
/// `Display` for a policy with rules); matching questions never panic.
pub fn exit_policy(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let lines: Vec<&str> = text.split('\n').collect();
    let Ok(p) = ExitPolicy::parse(&lines, mode & 1 == 1) else {
        return;
    };
    let strings: Vec<String> = p.clone().into();
    let again = ExitPolicy::try_from(strings).expect("rule strings must parse again");
    assert_eq!(again, p);
    if !p.rules().is_empty() {
        let shown: ExitPolicy = p.to_string().parse().expect("Display must parse again");
        assert_eq!(shown, p);
    }
    // Matching: a few addresses and ports taken from the input.
    let b = |i: usize| rest.get(i).copied().unwrap_or(0);
    let port = u16::from_be_bytes([b(0), b(1)]);
    let v4 = IpAddr::V4(Ipv4Addr::new(b(2), b(3), b(4), b(5)));
    let v6 = IpAddr::V6(Ipv6Addr::new(
        u16::from(b(6)) << 8,
        0,
        0,
        0,
        0,
        0xffff,
        u16::from(b(7)),
        u16::from(b(8)),
    ));
    for ip in [v4, v6] {
        let allowed = p.allows(ip, port);
        // An address the policy allows on `port` means some rule allows `port` somewhere.
        if allowed {
            assert!(p.allows_port_somewhere(port));
            assert!(p.is_exit());
        }
    }
}
