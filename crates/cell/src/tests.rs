//! Unit tests: known byte layouts, round trips, framing under arbitrary splits, and
//! robustness of every decoder against truncated or random input.

use super::*;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

#[test]
fn sizes_match_tor_spec() {
    assert_eq!(CELL_LEN, 4 + 1 + PAYLOAD_LEN);
    assert_eq!(RELAY_DATA_LEN, 498);
    assert_eq!(RELAY_HEADER_LEN + RELAY_DATA_LEN, PAYLOAD_LEN);
    assert_eq!(RELAY_LENGTH_RANGE.end, RELAY_HEADER_LEN);
}

#[test]
fn variable_commands() {
    assert!(CellCommand::VERSIONS.is_variable());
    assert!(CellCommand::VPADDING.is_variable());
    assert!(CellCommand::LINK_FEATURES.is_variable());
    assert!(CellCommand(255).is_variable());
    assert!(!CellCommand::RELAY.is_variable());
    assert!(!CellCommand::CREATE2.is_variable());
    assert!(!CellCommand(127).is_variable());
    assert_eq!(CellCommand::CREATED2.to_string(), "CREATED2");
    assert_eq!(CellCommand(200).to_string(), "CMD(200)");
}

/// The in-place wire form agrees with `encode_into` / `decode`, and the circuit-id helpers
/// touch only the first four bytes.
#[test]
fn wire_form_in_place_matches_encode_and_decode() {
    let cell = Cell::new(0x0102_0304, CellCommand::RELAY_EARLY, b"in place").unwrap();
    let mut encoded = Vec::new();
    cell.encode_into(&mut encoded);
    let mut wire = [0xAAu8; CELL_LEN];
    cell.write_wire(&mut wire);
    assert_eq!(&wire[..], &encoded[..]);
    let (a, b) = (Cell::from_wire(&wire), Cell::decode(&encoded).unwrap());
    assert_eq!(
        (a.circ_id, a.command, a.payload),
        (b.circ_id, b.command, b.payload)
    );
    assert_eq!(wire_circ_id(&wire), 0x0102_0304);
    set_wire_circ_id(&mut wire, 9);
    assert_eq!(wire_circ_id(&wire), 9);
    assert_eq!(&wire[4..], &encoded[4..]);
}

#[test]
fn fixed_cell_layout() {
    let c = Cell::new(0x0102_0304, CellCommand::RELAY, b"abc").unwrap();
    let mut out = vec![0xEE];
    c.encode_into(&mut out);
    assert_eq!(out.len(), 1 + CELL_LEN);
    assert_eq!(&out[..9], &[0xEE, 1, 2, 3, 4, 3, b'a', b'b', b'c']);
    assert!(out[9..].iter().all(|&b| b == 0));
    let back = Cell::decode(&out[1..]).unwrap();
    assert_eq!(back.circ_id, 0x0102_0304);
    assert_eq!(back.command, CellCommand::RELAY);
    assert_eq!(back.payload, c.payload);
    let dbg = format!("{back:?}");
    assert!(
        dbg.contains("16909060") && dbg.contains("RELAY") && dbg.contains("61626300"),
        "{dbg}"
    );
}

#[test]
fn fixed_cell_errors() {
    assert_eq!(
        Cell::new(1, CellCommand::RELAY, &[0; 510]).unwrap_err(),
        CellError::TooLong {
            what: "fixed cell body",
            max: 509,
            got: 510
        }
    );
    assert!(Cell::new(1, CellCommand::RELAY, &[0; 509]).is_ok());
    assert!(Cell::new(1, CellCommand::VERSIONS, &[]).is_err());
    assert!(matches!(
        Cell::decode(&[0; 513]),
        Err(CellError::WrongLength { .. })
    ));
    assert!(matches!(
        Cell::decode(&[0; 515]),
        Err(CellError::WrongLength { .. })
    ));
    let mut var = vec![0u8; CELL_LEN];
    var[4] = 129;
    assert_eq!(
        Cell::decode(&var).unwrap_err(),
        CellError::VariableCommandInFixedCell(129)
    );
}

#[test]
fn var_cell_layout() {
    let v = VarCell {
        circ_id: 0,
        command: CellCommand::VERSIONS,
        payload: vec![0, 4, 0, 5],
    };
    let mut out = Vec::new();
    v.encode_into(&mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 0, 7, 0, 4, 0, 4, 0, 5]);
    let (cell, used) = decode_cell(&out).unwrap().unwrap();
    assert_eq!(used, out.len());
    match cell {
        AnyCell::Var(back) => assert_eq!(back, v),
        AnyCell::Fixed(_) => panic!("expected a variable cell"),
    }
    let big = VarCell {
        circ_id: 0,
        command: CellCommand::VPADDING,
        payload: vec![0; 65536],
    };
    assert!(matches!(
        big.encode_into(&mut Vec::new()),
        Err(CellError::TooLong { .. })
    ));
    let max = VarCell {
        circ_id: 0,
        command: CellCommand::VPADDING,
        payload: vec![0; 65535],
    };
    assert!(max.encode_into(&mut Vec::new()).is_ok());
    let wrong = VarCell {
        circ_id: 0,
        command: CellCommand::RELAY,
        payload: vec![],
    };
    assert_eq!(
        wrong.encode_into(&mut Vec::new()),
        Err(CellError::FixedCommandInVarCell(3))
    );
}

#[test]
fn decode_cell_needs_whole_cell() {
    let mut out = Vec::new();
    Cell::new(7, CellCommand::DESTROY, &[3])
        .unwrap()
        .encode_into(&mut out);
    VarCell {
        circ_id: 0,
        command: CellCommand::CERTS,
        payload: vec![9; 300],
    }
    .encode_into(&mut out)
    .unwrap();
    for n in 0..CELL_LEN {
        assert!(decode_cell(&out[..n]).unwrap().is_none(), "prefix {n}");
        assert_eq!(frame_len(&out[..n]), None, "prefix {n}");
    }
    assert_eq!(frame_len(&out), Some(CELL_LEN));
    let (c, used) = decode_cell(&out).unwrap().unwrap();
    assert_eq!(used, CELL_LEN);
    assert_eq!((c.circ_id(), c.command()), (7, CellCommand::DESTROY));
    let rest = &out[used..];
    for n in 0..rest.len() {
        assert!(decode_cell(&rest[..n]).unwrap().is_none(), "var prefix {n}");
        assert_eq!(frame_len(&rest[..n]), None, "var prefix {n}");
    }
    assert_eq!(frame_len(rest), Some(7 + 300));
    let (c, used) = decode_cell(rest).unwrap().unwrap();
    assert_eq!(used, 7 + 300);
    assert_eq!(c.command(), CellCommand::CERTS);
}

#[test]
fn relay_payload_layout() {
    let p = relay_payload(RelayCommand::DATA, 0x1234, b"hello").unwrap();
    assert_eq!(
        &p[..16],
        &[2, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 5, b'h', b'e', b'l', b'l', b'o']
    );
    assert!(p[16..].iter().all(|&b| b == 0));
    let v = parse_relay(&p).unwrap();
    assert_eq!(v.command, RelayCommand::DATA);
    assert_eq!((v.recognized, v.stream_id, v.digest), (0, 0x1234, [0; 4]));
    assert_eq!(v.data, b"hello");

    let full = relay_payload(RelayCommand::DATA, 1, &[7; 498]).unwrap();
    assert_eq!(parse_relay(&full).unwrap().data.len(), 498);
    assert!(matches!(
        relay_payload(RelayCommand::DATA, 1, &[7; 499]),
        Err(CellError::TooLong { .. })
    ));

    let mut bad = p;
    bad[RELAY_LENGTH_RANGE].copy_from_slice(&499u16.to_be_bytes());
    assert_eq!(
        parse_relay(&bad).unwrap_err(),
        CellError::BadRelayLength(499)
    );
    bad[RELAY_LENGTH_RANGE].copy_from_slice(&0xFFFFu16.to_be_bytes());
    assert!(parse_relay(&bad).is_err());
    assert_eq!(RelayCommand::EXTENDED2.to_string(), "EXTENDED2");
}

#[test]
fn create2_and_created2() {
    let c = Create2 {
        handshake_type: 2,
        handshake: vec![0xAB; 84],
    };
    let enc = c.encode().unwrap();
    assert_eq!(&enc[..4], &[0, 2, 0, 84]);
    assert_eq!(enc.len(), 88);
    // Decoding from a padded cell payload ignores the padding.
    let cell = Cell::new(5, CellCommand::CREATE2, &enc).unwrap();
    assert_eq!(Create2::decode(&cell.payload).unwrap(), c);
    assert!(matches!(
        Create2::decode(&enc[..87]),
        Err(CellError::Truncated { .. })
    ));
    assert!(Create2::decode(&[0, 2]).is_err());

    let r = Created2 {
        handshake: vec![1; 64],
    };
    let enc = r.encode().unwrap();
    assert_eq!(&enc[..2], &[0, 64]);
    assert_eq!(Created2::decode(&enc).unwrap(), r);
    assert!(Created2::decode(&enc[..40]).is_err());
    let e: Extended2 = r.clone().into();
    assert_eq!(Extended2::decode(&e.encode().unwrap()).unwrap(), e);
    assert_eq!(e.encode().unwrap(), enc);
    assert!(Create2 {
        handshake_type: 2,
        handshake: vec![0; 70000]
    }
    .encode()
    .is_err());
}

#[test]
fn destroy_and_reasons() {
    let d = Destroy {
        reason: DestroyReason::FINISHED,
    };
    assert_eq!(d.encode(), [9]);
    let cell = Cell::new(1, CellCommand::DESTROY, &d.encode()).unwrap();
    assert_eq!(Destroy::decode(&cell.payload).unwrap(), d);
    assert!(Destroy::decode(&[]).is_err());
    assert_eq!(DestroyReason::OR_IDENTITY.to_string(), "OR_IDENTITY");
    assert_eq!(DestroyReason(99).to_string(), "UNKNOWN(99)");
}

#[test]
fn extend2_layout() {
    let e = Extend2 {
        link_specifiers: vec![
            LinkSpec::Ipv4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9001)),
            LinkSpec::LegacyId([0x11; 20]),
            LinkSpec::Ed25519Id([0x22; 32]),
            LinkSpec::Ipv6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 443, 0, 0)),
            LinkSpec::Unrecognized {
                ty: 9,
                data: vec![1, 2, 3],
            },
        ],
        create2: Create2 {
            handshake_type: 2,
            handshake: vec![0x33; 84],
        },
    };
    let enc = e.encode().unwrap();
    assert_eq!(&enc[..9], &[5, 0, 6, 127, 0, 0, 1, 0x23, 0x29]);
    assert_eq!(&enc[9..11], &[2, 20]);
    assert_eq!(Extend2::decode(&enc).unwrap(), e);
    // Every truncation fails cleanly.
    for n in 0..enc.len() {
        assert!(Extend2::decode(&enc[..n]).is_err(), "prefix {n}");
    }
    // A known type with the wrong length is rejected.
    let bad = [1, 0, 5, 127, 0, 0, 1, 0, 0, 2, 0, 0];
    assert!(matches!(
        Extend2::decode(&bad),
        Err(CellError::WrongLength { expected: 6, .. })
    ));
    let too_many = Extend2 {
        link_specifiers: vec![LinkSpec::LegacyId([0; 20]); 256],
        create2: e.create2.clone(),
    };
    assert!(too_many.encode().is_err());
    let fake = Extend2 {
        link_specifiers: vec![LinkSpec::Unrecognized {
            ty: 2,
            data: vec![],
        }],
        create2: e.create2,
    };
    assert!(fake.encode().is_err());
}

#[test]
fn begin_formats() {
    let b = Begin {
        host: "example.com".into(),
        port: 80,
        flags: 0,
    };
    assert_eq!(b.encode().unwrap(), b"example.com:80\0");
    assert_eq!(Begin::decode(b"example.com:80\0").unwrap(), b);

    let v6 = Begin {
        host: "2001:db8::1".into(),
        port: 443,
        flags: 1,
    };
    let enc = v6.encode().unwrap();
    assert_eq!(enc, b"[2001:db8::1]:443\0\0\0\0\x01");
    assert_eq!(Begin::decode(&enc).unwrap(), v6);
    // Padding after the flags and a short flags field are tolerated.
    assert_eq!(Begin::decode(b"a:1\0\0\0\0\x05\0\0").unwrap().flags, 5);
    assert_eq!(Begin::decode(b"a:1\0\0\0").unwrap().flags, 0);

    for bad in [
        &b"example.com:80"[..],
        b"example.com\0",
        b"example.com:\0",
        b"example.com:0\0",
        b"example.com:65536\0",
        b"example.com:+80\0",
        b":80\0",
        b"2001:db8::1:80\0",
        b"[2001:db8::1:80\0",
        b"[nothost]:80\0",
        b"\xff\xfe:80\0",
        b"",
    ] {
        assert!(
            Begin::decode(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(Begin {
        host: "".into(),
        port: 1,
        flags: 0
    }
    .encode()
    .is_err());
    assert!(Begin {
        host: "a".into(),
        port: 0,
        flags: 0
    }
    .encode()
    .is_err());
    assert!(Begin {
        host: "a:b".into(),
        port: 1,
        flags: 0
    }
    .encode()
    .is_err());
    assert!(Begin {
        host: "a\0b".into(),
        port: 1,
        flags: 0
    }
    .encode()
    .is_err());
}

#[test]
fn connected_formats() {
    assert_eq!(
        Connected::decode(&[]).unwrap(),
        Connected { addr: None, ttl: 0 }
    );
    assert!(Connected { addr: None, ttl: 5 }.encode().is_empty());
    let v4 = Connected {
        addr: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
        ttl: 300,
    };
    assert_eq!(v4.encode(), [10, 0, 0, 2, 0, 0, 1, 44]);
    assert_eq!(Connected::decode(&v4.encode()).unwrap(), v4);
    let v6 = Connected {
        addr: Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ttl: 7,
    };
    let enc = v6.encode();
    assert_eq!(enc.len(), 25);
    assert_eq!(&enc[..5], &[0, 0, 0, 0, 6]);
    assert_eq!(Connected::decode(&enc).unwrap(), v6);
    assert!(Connected::decode(&enc[..24]).is_err());
    assert!(Connected::decode(&[10, 0, 0]).is_err());
    let mut wrong_type = enc.clone();
    wrong_type[4] = 4;
    assert!(Connected::decode(&wrong_type).is_err());
}

#[test]
fn end_and_sendme() {
    assert_eq!(End::decode(&[]).unwrap().reason, EndReason::MISC);
    assert_eq!(End::decode(&[6, 1, 2, 3]).unwrap().reason, EndReason::DONE);
    assert_eq!(
        End {
            reason: EndReason::EXITPOLICY
        }
        .encode(),
        [4]
    );
    assert_eq!(EndReason::TORPROTOCOL.to_string(), "TORPROTOCOL");

    assert_eq!(Sendme::decode(&[]).unwrap().digest, None);
    assert_eq!(Sendme::decode(&[0, 0, 0]).unwrap().digest, None);
    let s = Sendme {
        digest: Some([0x5A; 20]),
    };
    let enc = s.encode();
    assert_eq!(&enc[..3], &[1, 0, 20]);
    assert_eq!(enc.len(), 23);
    assert_eq!(Sendme::decode(&enc).unwrap(), s);
    assert!(Sendme::decode(&enc[..22]).is_err());
    assert!(Sendme::decode(&[1, 0, 19]).is_err());
    assert!(Sendme::decode(&[2]).is_err());
    assert!(Sendme { digest: None }.encode().is_empty());
}

#[test]
fn resolve_and_resolved() {
    let r = Resolve {
        host: "example.org".into(),
    };
    assert_eq!(r.encode().unwrap(), b"example.org\0");
    assert_eq!(Resolve::decode(b"example.org\0\0\0").unwrap(), r);
    assert!(Resolve::decode(b"example.org").is_err());
    assert!(Resolve::decode(b"\0").is_err());

    let answers = Resolved {
        answers: vec![
            ResolvedAnswer::Ip(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)), 60),
            ResolvedAnswer::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST), 61),
            ResolvedAnswer::Hostname("h.example".into(), 62),
            ResolvedAnswer::TransientError(0),
            ResolvedAnswer::NontransientError(1),
        ],
    };
    let enc = answers.encode().unwrap();
    assert_eq!(&enc[..10], &[4, 4, 1, 2, 3, 4, 0, 0, 0, 60]);
    assert_eq!(Resolved::decode(&enc).unwrap(), answers);
    for n in 1..enc.len() {
        if Resolved::decode(&enc[..n]).is_ok() {
            // Only cuts at answer boundaries decode.
            assert!([10, 32, 47, 53].contains(&n), "prefix {n}");
        }
    }
    // Unknown answer types are skipped.
    let mut with_unknown = vec![0x77, 2, 9, 9, 0, 0, 0, 0];
    with_unknown.extend_from_slice(&enc[..10]);
    assert_eq!(Resolved::decode(&with_unknown).unwrap().answers.len(), 1);
    assert!(Resolved::decode(&[4, 3, 1, 2, 3, 0, 0, 0, 0]).is_err());
    assert!(Resolved {
        answers: vec![ResolvedAnswer::Hostname("x".repeat(256), 0)]
    }
    .encode()
    .is_err());
}

#[test]
fn link_messages() {
    let v = Versions {
        versions: vec![4, 5],
    };
    assert_eq!(v.encode(), [0, 4, 0, 5]);
    assert_eq!(Versions::decode(&[0, 4, 0, 5]).unwrap(), v);
    assert!(Versions::decode(&[0, 4, 0]).is_err());
    assert_eq!(
        v.best_common(&Versions {
            versions: vec![3, 4]
        }),
        Some(4)
    );
    assert_eq!(v.best_common(&Versions { versions: vec![3] }), None);

    let f = LinkFeatures {
        features: 0x0102_0304_0506_0708,
    };
    assert_eq!(f.encode(), [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        LinkFeatures::decode(&[1, 2, 3, 4, 5, 6, 7, 8, 0xFF, 0xFF]).unwrap(),
        f
    );
    assert!(LinkFeatures::decode(&[1, 2, 3]).is_err());

    // Split-direction messages: exact layouts.
    let b = Bind {
        token: [9; 32],
        seq: Some(0x0102_0304),
    };
    let mut wire = vec![9; 32];
    wire.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(b.encode(), wire);
    assert_eq!(Bind::decode(&wire).unwrap(), b);
    // An earlier version's BIND: the token only.
    let v1 = Bind {
        token: [9; 32],
        seq: None,
    };
    assert_eq!(v1.encode(), vec![9; 32]);
    assert_eq!(Bind::decode(&[9; 32]).unwrap(), v1);
    for len in [31, 33, 35, 37] {
        assert!(Bind::decode(&vec![9; len]).is_err(), "{len} bytes");
    }
    assert!(CellCommand::BIND.is_variable() && CellCommand::HANDOFF.is_variable());
    assert_eq!(CellCommand::HANDOFF.to_string(), "HANDOFF");
    let h = Handoff {
        seq: 0x0102_0304,
        cells: 0x1112_1314_1516_1718,
        flags: Handoff::RECOVERY,
    };
    assert_eq!(
        h.encode(),
        [1, 2, 3, 4, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 1]
    );
    let mut long = h.encode();
    long.extend_from_slice(&[0xAA, 0xBB]);
    assert_eq!(Handoff::decode(&long).unwrap(), h);
    assert!(h.is_recovery());
    assert!(Handoff::decode(&h.encode()[..12]).is_err());

    let a = Authenticate {
        identity: [1; 32],
        signature: [2; 64],
    };
    let enc = a.encode();
    assert_eq!(enc.len(), 96);
    assert_eq!(Authenticate::decode(&enc).unwrap(), a);
    assert!(Authenticate::decode(&enc[..95]).is_err());
    assert!(Authenticate::decode(&[0; 97]).is_err());
}

/// A cell for the framing property test.
fn arb_cell() -> impl Strategy<Value = AnyCell> {
    prop_oneof![
        (
            any::<u32>(),
            0u8..128,
            proptest::collection::vec(any::<u8>(), 0..=PAYLOAD_LEN)
        )
            .prop_map(|(id, cmd, body)| {
                let cmd = if cmd == 7 { 3 } else { cmd };
                AnyCell::Fixed(Cell::new(id, CellCommand(cmd), &body).unwrap())
            }),
        (
            any::<u32>(),
            128u8..=255,
            proptest::collection::vec(any::<u8>(), 0..2000)
        )
            .prop_map(|(id, cmd, payload)| AnyCell::Var(VarCell {
                circ_id: id,
                command: CellCommand(cmd),
                payload
            })),
        proptest::collection::vec(any::<u8>(), 0..100).prop_map(|payload| AnyCell::Var(VarCell {
            circ_id: 0,
            command: CellCommand::VERSIONS,
            payload
        })),
    ]
}

/// Field-by-field equality (Cell has no PartialEq: comparing payload arrays is enough).
fn same(a: &AnyCell, b: &AnyCell) -> bool {
    match (a, b) {
        (AnyCell::Fixed(x), AnyCell::Fixed(y)) => {
            x.circ_id == y.circ_id && x.command == y.command && x.payload == y.payload
        }
        (AnyCell::Var(x), AnyCell::Var(y)) => x == y,
        _ => false,
    }
}

proptest! {
    /// Any sequence of cells, delivered in chunks split at arbitrary points, decodes back.
    #[test]
    fn framing_survives_arbitrary_splits(
        cells in proptest::collection::vec(arb_cell(), 0..12),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut wire = Vec::new();
        for c in &cells {
            c.encode_into(&mut wire).unwrap();
        }
        let mut cut_points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        cut_points.push(wire.len());
        cut_points.sort_unstable();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        let mut start = 0;
        for cut in cut_points {
            buf.extend_from_slice(&wire[start..cut]);
            start = cut;
            while let Some((cell, used)) = decode_cell(&buf).unwrap() {
                prop_assert_eq!(frame_len(&buf), Some(used));
                got.push(cell);
                buf.drain(..used);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got.len(), cells.len());
        for (a, b) in got.iter().zip(&cells) {
            prop_assert!(same(a, b));
        }
    }

    /// Random bytes never panic any decoder.
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_cell(&bytes);
        // Framing agrees with decoding: a whole cell exactly when one decodes.
        let framed = frame_len(&bytes);
        let decoded = decode_cell(&bytes).ok().flatten().map(|(_, used)| used);
        prop_assert_eq!(framed, decoded);
        // Decoding into a reused cell agrees with decoding a new one, and leaves the cell
        // unchanged on error.
        let mut reused = Cell::new(7, CellCommand::RELAY, b"before").unwrap();
        let before = reused.clone();
        match Cell::decode(&bytes) {
            Ok(cell) => {
                prop_assert!(reused.decode_from(&bytes).is_ok());
                prop_assert!(same_fixed(&reused, &cell));
            }
            Err(_) => {
                prop_assert!(reused.decode_from(&bytes).is_err());
                prop_assert!(same_fixed(&reused, &before));
            }
        }
        if let Some(whole) = bytes.get(..CELL_LEN) {
            if let Ok(cell) = Cell::decode(whole) {
                prop_assert!(reused.decode_from(whole).is_ok());
                prop_assert!(same_fixed(&reused, &cell));
            }
        }
        let _ = Create2::decode(&bytes);
        let _ = Created2::decode(&bytes);
        let _ = Extended2::decode(&bytes);
        let _ = Extend2::decode(&bytes);
        let _ = Destroy::decode(&bytes);
        let _ = Begin::decode(&bytes);
        let _ = Connected::decode(&bytes);
        let _ = End::decode(&bytes);
        let _ = Sendme::decode(&bytes);
        let _ = Resolve::decode(&bytes);
        let _ = Resolved::decode(&bytes);
        let _ = Versions::decode(&bytes);
        let _ = LinkFeatures::decode(&bytes);
        let _ = Authenticate::decode(&bytes);
        let _ = Bind::decode(&bytes);
        let _ = Handoff::decode(&bytes);
        let mut p = [0u8; PAYLOAD_LEN];
        let n = bytes.len().min(PAYLOAD_LEN);
        p[..n].copy_from_slice(&bytes[..n]);
        if let Ok(v) = parse_relay(&p) {
            prop_assert!(v.data.len() <= RELAY_DATA_LEN);
        }
    }

    /// BEGIN round-trips for any valid host name and port.
    #[test]
    fn begin_roundtrip(host in "[a-z0-9.-]{1,60}", port in 1u16.., flags in any::<u32>()) {
        let b = Begin { host, port, flags };
        prop_assert_eq!(Begin::decode(&b.encode().unwrap()).unwrap(), b);
    }
}

#[test]
fn xon_xoff_bodies() {
    // tor-spec's numbers: XON = 43, XOFF = 44.
    assert_eq!(RelayCommand::XON.0, 43);
    assert_eq!(RelayCommand::XOFF.0, 44);
    assert_eq!(RelayCommand::XON.name(), Some("XON"));
    assert_eq!(Xoff.encode(), vec![0]);
    assert_eq!(Xoff::decode(&[0, 0, 0]).unwrap(), Xoff);
    assert!(Xoff::decode(&[1]).is_err(), "unknown version");
    assert!(Xoff::decode(&[]).is_err(), "no version");
    let x = Xon {
        kbps_ewma: 0x0102_0304,
    };
    assert_eq!(x.encode(), vec![0, 1, 2, 3, 4]);
    assert_eq!(Xon::decode(&x.encode()).unwrap(), x);
    assert!(Xon::decode(&[0, 1, 2]).is_err(), "truncated rate");
    assert!(Xon::decode(&[2, 0, 0, 0, 0]).is_err(), "unknown version");
}

fn same_fixed(a: &Cell, b: &Cell) -> bool {
    (a.circ_id, a.command, a.payload) == (b.circ_id, b.command, b.payload)
}

/// A relay cell built in place over a slot holding an old cell's bytes is byte for byte the
/// one built by `relay_payload` and `Cell::write_wire`, for every body length.
#[test]
fn relay_cell_written_in_place_equals_the_built_one() {
    for len in [0, 1, 5, 497, 498] {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let built = Cell::from_payload(
            0x8000_0042,
            CellCommand::RELAY,
            relay_payload(RelayCommand::DATA, 0x1234, &body).unwrap(),
        );
        let mut want = [0u8; CELL_LEN];
        built.write_wire(&mut want);

        let mut slot = [0xa5u8; CELL_LEN];
        let payload = write_fixed_header(&mut slot, 0x8000_0042, CellCommand::RELAY);
        payload[RELAY_HEADER_LEN..RELAY_HEADER_LEN + len].copy_from_slice(&body);
        write_relay_header(payload, RelayCommand::DATA, 0x1234, len).unwrap();
        assert_eq!(slot, want, "body of {len} bytes");
    }
    let mut p = [0xa5u8; PAYLOAD_LEN];
    assert!(matches!(
        write_relay_header(&mut p, RelayCommand::DATA, 1, 499),
        Err(CellError::TooLong { .. })
    ));
    assert_eq!(p, [0xa5u8; PAYLOAD_LEN], "unchanged on error");
}
