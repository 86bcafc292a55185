//! Tests of onion service descriptors: round trip and one test per refusal.

use super::*;

const NOW: u64 = 1_700_000_000;

fn service(n: u8) -> (IdentityKeypair, OnionAddress) {
    let kp = IdentityKeypair::from_secret_bytes(&[n; 32]);
    let addr = OnionAddress::from_key(kp.public());
    (kp, addr)
}

fn intro(n: u8) -> IntroPoint {
    IntroPoint {
        relay: IdentityKeypair::from_secret_bytes(&[n; 32]).public(),
        onion_key: NtorPublicKey([n.wrapping_add(1); 32]),
        addresses: vec![format!("127.0.0.{n}:9001").parse().unwrap()],
        auth_key: IdentityKeypair::from_secret_bytes(&[n.wrapping_add(2); 32]).public(),
        enc_key: NtorPublicKey([n.wrapping_add(3); 32]),
    }
}

fn descriptor(addr: OnionAddress) -> OnionDescriptor {
    OnionDescriptor {
        address: addr,
        revision: 7,
        valid_after: NOW - 600,
        valid_until: NOW + 3 * 3600,
        intro_points: vec![intro(10), intro(11), intro(12)],
    }
}

/// Re-sign a descriptor whose JSON body was edited by `edit`.
fn resigned(kp: &IdentityKeypair, d: &OnionDescriptor, edit: impl Fn(&str) -> String) -> String {
    let doc = d.sign(kp).unwrap();
    let mut lines = doc.lines();
    let header = lines.next().unwrap();
    let body = edit(lines.next().unwrap());
    document::sign(header, &body, kp)
}

#[test]
fn round_trip() {
    let (kp, addr) = service(1);
    let d = descriptor(addr);
    let doc = d.sign(&kp).unwrap();
    assert!(doc.starts_with(&format!("chive-onion-descriptor 1 {}\n", addr.label())));
    assert_eq!(OnionDescriptor::verify(&doc, &addr, NOW).unwrap(), d);
    // Both edges of the window, and the skew beyond them.
    for now in [
        d.valid_after - 60,
        d.valid_after,
        d.valid_until,
        d.valid_until + 60,
    ] {
        assert!(
            OnionDescriptor::verify(&doc, &addr, now).is_ok(),
            "now {now}"
        );
    }
}

#[test]
fn refuses_a_bad_signature() {
    let (kp, addr) = service(1);
    let doc = descriptor(addr).sign(&kp).unwrap();
    // Any changed byte of the signed part or the signature.
    let tampered = doc.replacen("\"revision\":7", "\"revision\":8", 1);
    assert_ne!(tampered, doc);
    assert_eq!(
        OnionDescriptor::verify(&tampered, &addr, NOW),
        Err(DirError::BadOnionSignature)
    );
    let sig_at = doc.rfind("signature ").unwrap() + 12;
    let mut bytes = doc.clone().into_bytes();
    bytes[sig_at] = if bytes[sig_at] == b'0' { b'1' } else { b'0' };
    assert_eq!(
        OnionDescriptor::verify(&String::from_utf8(bytes).unwrap(), &addr, NOW),
        Err(DirError::BadOnionSignature)
    );
    // Unframed input.
    for junk in ["", "\n", "chive-onion-descriptor 1\n", "signature 00\n"] {
        assert_eq!(
            OnionDescriptor::verify(junk, &addr, NOW),
            Err(DirError::BadOnionSignature),
            "{junk:?}"
        );
    }
}

#[test]
fn refuses_a_descriptor_signed_by_someone_else() {
    // An attacker signs a descriptor naming the victim's address with its own key.
    let (_, victim) = service(1);
    let (attacker_kp, _) = service(2);
    let d = descriptor(victim);
    assert!(matches!(d.sign(&attacker_kp), Err(DirError::Malformed(_))));
    let forged = document::sign(
        &format!("chive-onion-descriptor 1 {}", victim.label()),
        "{}",
        &attacker_kp,
    );
    assert_eq!(
        OnionDescriptor::verify(&forged, &victim, NOW),
        Err(DirError::BadOnionSignature)
    );
}

#[test]
fn refuses_a_descriptor_for_another_address() {
    let (kp, addr) = service(1);
    let (_, other) = service(2);
    let doc = descriptor(addr).sign(&kp).unwrap();
    assert!(matches!(
        OnionDescriptor::verify(&doc, &other, NOW),
        Err(DirError::WrongOnionAddress { .. })
    ));
    // A header and body that disagree (signed by the right key, so only the body check
    // catches it).
    let (_, third) = service(3);
    let d = descriptor(addr);
    let doc = resigned(&kp, &d, |b| b.replace(&addr.label(), &third.label()));
    assert!(matches!(
        OnionDescriptor::verify(&doc, &addr, NOW),
        Err(DirError::Malformed(_))
    ));
}

#[test]
fn refuses_expired_and_not_yet_valid() {
    let (kp, addr) = service(1);
    let d = descriptor(addr);
    let doc = d.sign(&kp).unwrap();
    assert_eq!(
        OnionDescriptor::verify(&doc, &addr, d.valid_until + 61),
        Err(DirError::OnionExpired {
            valid_until: d.valid_until,
            now: d.valid_until + 61
        })
    );
    assert_eq!(
        OnionDescriptor::verify(&doc, &addr, d.valid_after - 61),
        Err(DirError::OnionNotYetValid {
            valid_after: d.valid_after,
            now: d.valid_after - 61
        })
    );
    // A window longer than 12 h, or reversed, is refused whatever the clock says.
    for (after, until) in [(NOW - 10, NOW + 13 * 3600), (NOW + 10, NOW - 10)] {
        let long = OnionDescriptor {
            valid_after: after,
            valid_until: until,
            ..d.clone()
        };
        assert!(matches!(
            OnionDescriptor::verify(&long.sign(&kp).unwrap(), &addr, NOW),
            Err(DirError::Malformed(_))
        ));
    }
}

#[test]
fn refuses_hostile_input() {
    let (kp, addr) = service(1);
    let d = descriptor(addr);
    let big = "x".repeat(MAX_ONION_DESCRIPTOR_LEN + 1);
    assert!(matches!(
        OnionDescriptor::verify(&big, &addr, NOW),
        Err(DirError::TooLarge { .. })
    ));
    // Too many intro points, none, an intro point without or with too many addresses.
    let many = OnionDescriptor {
        intro_points: (0..=MAX_INTRO_POINTS as u8).map(intro).collect(),
        ..d.clone()
    };
    let none = OnionDescriptor {
        intro_points: vec![],
        ..d.clone()
    };
    let mut no_addr = d.clone();
    no_addr.intro_points[0].addresses.clear();
    let mut many_addr = d.clone();
    many_addr.intro_points[0].addresses = vec![intro(1).addresses[0]; MAX_INTRO_ADDRESSES + 1];
    let mut port0 = d.clone();
    port0.intro_points[0].addresses = vec!["127.0.0.1:0".parse().unwrap()];
    for bad in [many, none, no_addr, many_addr, port0] {
        assert!(matches!(
            OnionDescriptor::verify(&bad.sign(&kp).unwrap(), &addr, NOW),
            Err(DirError::Malformed(_))
        ));
    }
    // Signed but broken bodies: unknown fields, bad hex, an invalid Ed25519 auth key, not JSON.
    let auth_hex = d.intro_points[0].auth_key.to_hex();
    let mut off_curve = None;
    for y in 2u8.. {
        let mut k = [0u8; 32];
        k[0] = y;
        if IdentityKey::from_bytes(&k).is_err() {
            off_curve = Some(hex::encode(k));
            break;
        }
    }
    let off_curve = off_curve.unwrap();
    type Edit<'a> = Box<dyn Fn(&str) -> String + 'a>;
    let edits: [Edit; 4] = [
        Box::new(|b: &str| b.replacen('{', "{\"extra\":1,", 1)),
        Box::new(|b: &str| b.replace(&auth_hex, &auth_hex.to_uppercase())),
        Box::new(|b: &str| b.replace(&auth_hex, &off_curve)),
        Box::new(|_: &str| "not json".to_string()),
    ];
    for edit in edits {
        let doc = resigned(&kp, &d, edit);
        assert!(matches!(
            OnionDescriptor::verify(&doc, &addr, NOW),
            Err(DirError::Malformed(_))
        ));
    }
}
