//! ntor v3: the published test vector (tor's `test_ntor3_testvecs`, arti's
//! `test_ntor3_testvec`: the same keys and messages), a round trip, and refusals.

use rand::rngs::OsRng;

use super::*;

fn h32(s: &str) -> [u8; 32] {
    hex::decode(s).expect("hex").try_into().expect("32 bytes")
}

#[test]
fn matches_the_published_test_vector() {
    let b = NtorSecretKey::from_bytes(h32(
        "4051daa5921cfa2a1c27b08451324919538e79e788a81b38cbed097a5dff454a",
    ));
    let id = h32("9fad2af287ef942632833d21f946c6260c33fae6172b60006e86e4a6911753a2");
    let x = h32("b825a3719147bcbe5fb1d0b0fcb9c09e51948048e2e3283d2ab7b45b5ef38b49");
    let y = h32("4865a5b7689dafd978f529291c7171bc159be076b92186405d13220b80e2a053");
    let client_message = hex::decode("68656c6c6f20776f726c64").unwrap();
    let verification = hex::decode("78797a7a79").unwrap();
    let server_message = hex::decode("486f6c61204d756e646f").unwrap();

    let (state, create) =
        client_create_with_secret(x, &id, &b.public(), &client_message, &verification);
    assert_eq!(
        hex::encode(&create),
        "9fad2af287ef942632833d21f946c6260c33fae6172b60006e86e4a6911753a2\
         f8307a2bc1870b00b828bb74dbb8fd88e632a6375ab3bcd1ae706aaa8b6cdd1d\
         252fe9ae91264c91d4ecb8501f79d0387e34ad8ca0f7c995184f7d11d5da4f46\
         3bebd9151fd3b47c180abc9e044d53565f04d82bbb3bebed3d06cea65db8be9c\
         72b68cd461942088502f67"
    );
    let opened = server_open_with_secret(y, &id, &b, &create, &verification).unwrap();
    assert_eq!(opened.message, client_message);
    let (reply, server_km) = opened.finish(&server_message).unwrap();
    assert_eq!(
        hex::encode(&reply),
        "4bf4814326fdab45ad5184f5518bd7fae25dc59374062698201a50a22954246d\
         2fc5f8773ca824542bc6cf6f57c7c29bbf4e5476461ab130c5b18ab0a9127665\
         1202c3e1e87c0d32054c"
    );
    let (got, client_km) = client_finish(state, &reply).unwrap();
    assert_eq!(got, server_message);
    // The first 92 bytes of the published 256-byte key stream.
    let keys = "9c19b631fd94ed86a817e01f6c80b0743a43f5faebd39cfaa8b00fa8bcc65c3b\
                feaa403d91acbd68a821bf6ee8504602b094a254392a07737d5662768c7a9fb1\
                b2814bb34780eaee6e867c773e28c212ead563e98a1cd5d5b4576f5e";
    assert_eq!(hex::encode(client_km.0), keys);
    assert_eq!(hex::encode(server_km.0), keys);
}

fn relay() -> (NtorSecretKey, [u8; 32]) {
    (NtorSecretKey::generate(&mut OsRng), [7u8; 32])
}

#[test]
fn round_trip_with_empty_and_long_messages() {
    let (b, id) = relay();
    for (cm, sm) in [(vec![], vec![]), (vec![1u8; 300], vec![2u8; 400])] {
        let (state, create) =
            client_create(&mut OsRng, &id, &b.public(), &cm, CIRCUIT_VERIFICATION);
        assert_eq!(create.len(), NTOR_V3_CLIENT_OVERHEAD + cm.len());
        let opened = server_open(&mut OsRng, &id, &b, &create, CIRCUIT_VERIFICATION).unwrap();
        assert_eq!(opened.message, cm);
        let (reply, skm) = opened.finish(&sm).unwrap();
        let (got, ckm) = client_finish(state, &reply).unwrap();
        assert_eq!(got, sm);
        assert_eq!(skm.0, ckm.0);
    }
}

#[test]
fn the_relay_refuses_other_keys_bad_macs_and_short_input() {
    let (b, id) = relay();
    let (_, create) = client_create(&mut OsRng, &id, &b.public(), b"m", CIRCUIT_VERIFICATION);
    let open = |h: &[u8], v: &[u8]| server_open(&mut OsRng, &id, &b, h, v).map(|_| ());
    assert_eq!(
        server_open(&mut OsRng, &[8u8; 32], &b, &create, CIRCUIT_VERIFICATION).map(|_| ()),
        Err(CryptoError::WrongRelayKey)
    );
    assert_eq!(open(&create, b"other"), Err(CryptoError::HandshakeFailed));
    for i in [96, 97, create.len() - 1] {
        let mut bad = create.clone();
        bad[i] ^= 1;
        assert_eq!(
            open(&bad, CIRCUIT_VERIFICATION),
            Err(CryptoError::HandshakeFailed)
        );
    }
    assert!(matches!(
        open(&create[..127], CIRCUIT_VERIFICATION),
        Err(CryptoError::BadLength { .. })
    ));
    // A small-order X (all zeros) gives an all-zero Bx: refused.
    let mut zero_x = create.clone();
    zero_x[64..96].fill(0);
    assert!(open(&zero_x, CIRCUIT_VERIFICATION).is_err());
}

#[test]
fn the_client_refuses_a_forged_or_short_reply() {
    let (b, id) = relay();
    let run = |tamper: &dyn Fn(&mut Vec<u8>)| {
        let (state, create) =
            client_create(&mut OsRng, &id, &b.public(), b"", CIRCUIT_VERIFICATION);
        let opened = server_open(&mut OsRng, &id, &b, &create, CIRCUIT_VERIFICATION).unwrap();
        let (mut reply, _) = opened.finish(b"reply").unwrap();
        tamper(&mut reply);
        client_finish(state, &reply).map(|(m, _)| m)
    };
    assert_eq!(run(&|_| {}), Ok(b"reply".to_vec()));
    assert_eq!(run(&|r| r[40] ^= 1), Err(CryptoError::HandshakeFailed));
    assert_eq!(run(&|r| r[66] ^= 1), Err(CryptoError::HandshakeFailed));
    assert_eq!(run(&|r| r.push(0)), Err(CryptoError::HandshakeFailed));
    assert_eq!(run(&|r| r[..32].fill(0)), Err(CryptoError::HandshakeFailed));
    assert!(matches!(
        run(&|r| r.truncate(63)),
        Err(CryptoError::BadLength { .. })
    ));
}
