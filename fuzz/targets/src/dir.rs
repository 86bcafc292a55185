//! Targets `consensus`, `descriptor` and `exit_policy`: chive-dir's documents as a client or the
//! authority reads them.
//!
//! Signed documents: a fuzzer cannot forge an Ed25519 signature, so in "signed" mode the target
//! signs the input itself (with a fixed key) and the parser gets past the signature check to the
//! body; "raw" mode hands the input over as it is, for the framing and signature checks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use chive_crypto::IdentityKeypair;
use chive_dir::{Consensus, ExitPolicy, RelayDescriptor};

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

/// `signed` (header line, body; no trailing newline) framed and signed as chive-dir does.
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

/// Split the mode byte off and turn the rest into the document to parse: in mode 1 the rest
/// (header line and body) signed by `key`, in mode 0 the rest as it is. `None` for non-UTF-8.
fn document(data: &[u8], key: &IdentityKeypair) -> Option<String> {
    let (&mode, rest) = data.split_first()?;
    let text = std::str::from_utf8(rest).ok()?;
    Some(if mode & 1 == 1 {
        sign_document(text, key)
    } else {
        text.to_owned()
    })
}

/// First byte: mode (bit 0: the target signs the rest with the authority key); the rest: a
/// consensus document. Property: a consensus that verifies, signed again by the authority,
/// verifies to the same value, and that text is a fixed point (signing the result again gives
/// the same text).
pub fn consensus(data: &[u8]) {
    let Some(doc) = document(data, authority()) else {
        return;
    };
    let Ok(c) = Consensus::verify(&doc, &authority().public(), NOW) else {
        return;
    };
    let text = c.sign(authority());
    let again = Consensus::verify(&text, &authority().public(), NOW)
        .expect("a re-signed consensus must verify");
    assert_eq!(again, c);
    assert_eq!(again.sign(authority()), text);
}

/// First byte: mode (bit 0: the target signs the rest with the relay key named in the seeds'
/// header); the rest: a descriptor. Property as for [`consensus`].
pub fn descriptor(data: &[u8]) {
    let Some(doc) = document(data, relay_key()) else {
        return;
    };
    let Ok(d) = RelayDescriptor::verify(&doc) else {
        return;
    };
    assert_eq!(
        d.identity,
        relay_key().public(),
        "verified under a key we did not sign with"
    );
    let text = d.sign(relay_key());
    let again = RelayDescriptor::verify(&text).expect("a re-signed descriptor must verify");
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
