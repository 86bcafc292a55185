//! Tests of the onion-service relay messages: rend-spec's bytes, round trips, refusals and
//! hostile input.

use std::net::{Ipv4Addr, SocketAddrV4};

use proptest::prelude::*;

use super::*;
use crate::RelayCommand;

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The INTRODUCE1 header of rend-spec v3's hs-ntor test vector (Appendix G.1).
const SPEC_HEADER: &str = "000000000000000000000000000000000000000002002034E171E4358E501BFF
                           21ED907E96AC6BFEF697C779D040BBAF49ACC30FC5D21F00";
/// The decrypted INTRODUCE plaintext of the same vector.
const SPEC_PLAINTEXT: &str = "6BD364C12638DD5C3BE23D76ACA05B04E6CE932C0101000100200DE6130E4FCA
    C4EDDA24E21220CC3EADAE403EF6B7D11C8273AC71908DE565450300067F0000
    0113890214F823C4F8CC085C792E0AEE0283FE00AD7520B37D0320728D5DF39B
    7B7077A0118A900FF4456C382F0041300ACF9C58E51C392795EF870000000000
    0000000000000000000000000000000000000000000000000000000000000000
    000000000000000000000000000000000000000000000000000000000000";

#[test]
fn relay_command_numbers_are_tors() {
    let expect = [
        (RelayCommand::ESTABLISH_INTRO, 32, "ESTABLISH_INTRO"),
        (
            RelayCommand::ESTABLISH_RENDEZVOUS,
            33,
            "ESTABLISH_RENDEZVOUS",
        ),
        (RelayCommand::INTRODUCE1, 34, "INTRODUCE1"),
        (RelayCommand::INTRODUCE2, 35, "INTRODUCE2"),
        (RelayCommand::RENDEZVOUS1, 36, "RENDEZVOUS1"),
        (RelayCommand::RENDEZVOUS2, 37, "RENDEZVOUS2"),
        (RelayCommand::INTRO_ESTABLISHED, 38, "INTRO_ESTABLISHED"),
        (
            RelayCommand::RENDEZVOUS_ESTABLISHED,
            39,
            "RENDEZVOUS_ESTABLISHED",
        ),
        (RelayCommand::INTRODUCE_ACK, 40, "INTRODUCE_ACK"),
    ];
    for (cmd, n, name) in expect {
        assert_eq!(cmd.0, n);
        assert_eq!(cmd.name(), Some(name));
    }
}

#[test]
fn introduce_header_matches_rend_spec() {
    let header = unhex(SPEC_HEADER);
    let intro = Introduce {
        auth_key: header[23..55].try_into().unwrap(),
        extensions: vec![],
        encrypted: vec![0xee; 100],
    };
    assert_eq!(intro.header().unwrap(), header);
    let wire = intro.encode().unwrap();
    assert_eq!(wire[..header.len()], header[..]);
    assert_eq!(Introduce::decode(&wire).unwrap(), intro);
}

#[test]
fn introduce_plaintext_matches_rend_spec() {
    let p = unhex(SPEC_PLAINTEXT);
    let pt = IntroducePlaintext::decode(&p).unwrap();
    assert_eq!(pt.cookie[..], p[..20]);
    assert_eq!(
        pt.extensions,
        vec![Extension {
            ty: 1,
            data: vec![]
        }]
    );
    assert_eq!(pt.onion_key[..], p[26..58]);
    assert_eq!(pt.link_specifiers.len(), 3);
    assert_eq!(
        pt.link_specifiers[0],
        LinkSpec::Ipv4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 5001))
    );
    assert!(matches!(pt.link_specifiers[1], LinkSpec::LegacyId(_)));
    assert!(matches!(pt.link_specifiers[2], LinkSpec::Ed25519Id(_)));
    // Re-encoding with the same padding gives C tor's bytes back.
    assert_eq!(pt.encode(p.len()).unwrap(), p);
}

fn establish_intro() -> EstablishIntro {
    EstablishIntro {
        auth_key: [3; 32],
        extensions: vec![Extension {
            ty: 9,
            data: vec![1, 2, 3],
        }],
        handshake_auth: [4; 32],
        sig: [5; 64],
    }
}

#[test]
fn establish_intro_round_trip_and_signed_part() {
    let m = establish_intro();
    let wire = m.encode().unwrap();
    assert_eq!(wire.len(), 3 + 32 + 1 + 5 + 32 + 2 + 64);
    assert_eq!(EstablishIntro::decode(&wire).unwrap(), m);
    // The signature covers the prefix and everything up to HANDSHAKE_AUTH, not SIG_LEN/SIG.
    let signed = m.signed_bytes().unwrap();
    assert!(signed.starts_with(b"Tor establish-intro cell v1"));
    assert_eq!(
        signed[ESTABLISH_INTRO_SIG_PREFIX.len()..],
        wire[..wire.len() - 66]
    );
    assert_eq!(m.mac_bytes().unwrap(), wire[..wire.len() - 98]);
}

#[test]
fn establish_intro_refusals() {
    let wire = establish_intro().encode().unwrap();
    let mut rsa = wire.clone();
    rsa[0] = 1;
    assert!(matches!(
        EstablishIntro::decode(&rsa),
        Err(CellError::Invalid { .. })
    ));
    let mut long_key = wire.clone();
    long_key[2] = 33;
    assert!(matches!(
        EstablishIntro::decode(&long_key),
        Err(CellError::WrongLength { .. })
    ));
    let mut sig_len = wire.clone();
    let at = wire.len() - 65;
    sig_len[at] = 63;
    assert!(matches!(
        EstablishIntro::decode(&sig_len),
        Err(CellError::WrongLength { .. })
    ));
    for cut in [0, 10, 40, wire.len() - 1] {
        assert!(matches!(
            EstablishIntro::decode(&wire[..cut]),
            Err(CellError::Truncated { .. })
        ));
    }
    // Too many extensions to fit one relay cell.
    let mut big = establish_intro();
    big.extensions = vec![
        Extension {
            ty: 1,
            data: vec![0; 200],
        };
        2
    ];
    assert!(matches!(big.encode(), Err(CellError::TooLong { .. })));
    let mut huge_ext = establish_intro();
    huge_ext.extensions[0].data = vec![0; 256];
    assert!(matches!(huge_ext.encode(), Err(CellError::TooLong { .. })));
}

#[test]
fn introduce_refusals() {
    let m = Introduce {
        auth_key: [8; 32],
        extensions: vec![],
        encrypted: vec![1; 150],
    };
    let wire = m.encode().unwrap();
    let mut legacy = wire.clone();
    legacy[5] = 1;
    assert!(matches!(
        Introduce::decode(&legacy),
        Err(CellError::Invalid { .. })
    ));
    let mut rsa = wire.clone();
    rsa[20] = 0;
    assert!(matches!(
        Introduce::decode(&rsa),
        Err(CellError::Invalid { .. })
    ));
    // Nothing after the header.
    assert!(matches!(
        Introduce::decode(&m.header().unwrap()),
        Err(CellError::Invalid { .. })
    ));
    // An extension count that promises more than the body holds.
    let mut count = m.header().unwrap();
    *count.last_mut().unwrap() = 200;
    count.extend_from_slice(&[1, 0, 2, 0]);
    assert!(matches!(
        Introduce::decode(&count),
        Err(CellError::Truncated { .. })
    ));
    let too_big = Introduce {
        encrypted: vec![0; RELAY_DATA_LEN],
        ..m
    };
    assert!(matches!(too_big.encode(), Err(CellError::TooLong { .. })));
}

#[test]
fn small_messages_round_trip() {
    for status in [0u16, 1, 2, 3, 77] {
        let ack = IntroduceAck {
            status: IntroduceAckStatus::from_u16(status),
            extensions: vec![],
        };
        assert_eq!(ack.status.to_u16(), status);
        assert_eq!(IntroduceAck::decode(&ack.encode().unwrap()).unwrap(), ack);
    }
    assert_eq!(
        IntroduceAckStatus::from_u16(1),
        IntroduceAckStatus::UnknownService
    );
    assert!(IntroduceAck::decode(&[0]).is_err());

    let est = IntroEstablished::default();
    assert_eq!(est.encode().unwrap(), vec![0]);
    assert_eq!(IntroEstablished::decode(&[]).unwrap(), est);
    assert_eq!(IntroEstablished::decode(&[0]).unwrap(), est);

    let er = EstablishRendezvous { cookie: [6; 20] };
    assert_eq!(EstablishRendezvous::decode(&er.encode()).unwrap(), er);
    let mut extra = er.encode();
    extra.extend_from_slice(b"ignored");
    assert_eq!(EstablishRendezvous::decode(&extra).unwrap(), er);
    assert!(EstablishRendezvous::decode(&[6; 19]).is_err());

    let r1 = Rendezvous1 {
        cookie: [7; 20],
        handshake_info: vec![9; 64],
    };
    let wire = r1.encode().unwrap();
    assert_eq!(wire.len(), 84);
    assert_eq!(Rendezvous1::decode(&wire).unwrap(), r1);
    assert!(Rendezvous1::decode(&wire[..19]).is_err());
    let r2 = Rendezvous2 {
        handshake_info: r1.handshake_info.clone(),
    };
    assert_eq!(r2.encode().unwrap(), r1.handshake_info);
    assert_eq!(Rendezvous2::decode(&r2.encode().unwrap()).unwrap(), r2);
    let r2_big = Rendezvous2 {
        handshake_info: vec![0; RELAY_DATA_LEN + 1],
    };
    assert!(r2_big.encode().is_err());
}

#[test]
fn introduce_plaintext_refusals() {
    let pt = IntroducePlaintext {
        cookie: [1; 20],
        extensions: vec![],
        onion_key: [2; 32],
        link_specifiers: vec![LinkSpec::LegacyId([3; 20])],
    };
    let wire = pt.encode(0).unwrap();
    assert_eq!(IntroducePlaintext::decode(&wire).unwrap(), pt);
    assert_eq!(pt.encode(200).unwrap().len(), 200);
    assert_eq!(
        IntroducePlaintext::decode(&pt.encode(200).unwrap()).unwrap(),
        pt
    );
    let mut tap = wire.clone();
    tap[21] = 0;
    assert!(matches!(
        IntroducePlaintext::decode(&tap),
        Err(CellError::Invalid { .. })
    ));
    let mut short_key = wire.clone();
    short_key[23] = 31;
    assert!(matches!(
        IntroducePlaintext::decode(&short_key),
        Err(CellError::WrongLength { .. })
    ));
    assert!(IntroducePlaintext::decode(&wire[..wire.len() - 1]).is_err());
}

proptest! {
    /// No decoder panics on any input, and what decodes re-encodes to a prefix of its input
    /// (trailing bytes are the only thing a decoder may drop).
    #[test]
    fn onion_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(m) = EstablishIntro::decode(&bytes) {
            if let Ok(wire) = m.encode() {
                prop_assert!(bytes.starts_with(&wire));
            }
        }
        if let Ok(m) = Introduce::decode(&bytes) {
            if let Ok(wire) = m.encode() {
                prop_assert_eq!(wire, bytes.clone());
            }
        }
        let _ = IntroEstablished::decode(&bytes);
        let _ = IntroduceAck::decode(&bytes);
        let _ = EstablishRendezvous::decode(&bytes);
        let _ = Rendezvous1::decode(&bytes);
        let _ = Rendezvous2::decode(&bytes);
        if let Ok(m) = IntroducePlaintext::decode(&bytes) {
            let wire = m.encode(0).unwrap();
            prop_assert!(bytes.starts_with(&wire));
        }
    }
}
