//! The end-to-end ("virtual") hop of an onion-service circuit (rend-spec v3, "NTOR_KEY_SEED"
//! expansion; C tor's `relay_crypto_init(.., is_hs_v3 = true)` and `create_rend_cpath`):
//! AES-256-CTR with a zero IV and running SHA3-256 digests seeded with the 32-byte Df / Db, the
//! service using the keys in the opposite direction to the client.

use aes::cipher::{KeyIvInit, StreamCipher};
use chive_crypto::hs_ntor::{self, HsIntroSecret, HsKeyMaterial};
use chive_crypto::ntor::{KeyMaterial, NtorSecretKey};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
use chive_crypto::{IdentityKeypair, OnionAddress};
use sha3::{Digest, Sha3_256};

const PAYLOAD_LEN: usize = 509;
type Aes256Ctr = ctr::Ctr128BE<aes::Aes256>;

fn hs_km(seed: u8) -> HsKeyMaterial {
    let mut k = [0u8; 128];
    for (i, b) in k.iter_mut().enumerate() {
        *b = seed.wrapping_mul(29).wrapping_add(i as u8);
    }
    HsKeyMaterial(k)
}

/// A relay payload: command DATA, stream 1, the rest filled with `tag`.
fn payload(tag: u8) -> [u8; PAYLOAD_LEN] {
    let mut p = [tag; PAYLOAD_LEN];
    p[0] = 2;
    p[1..3].fill(0);
    p[3..5].copy_from_slice(&1u16.to_be_bytes());
    p[5..9].fill(0);
    p[9..11].copy_from_slice(&498u16.to_be_bytes());
    p
}

/// NIST SP 800-38A F.5.5 (CTR-AES256.Encrypt): the cipher the virtual hop uses is AES-256 in
/// big-endian counter mode.
#[test]
fn aes256_ctr_nist_vector() {
    let key =
        hex::decode("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4").unwrap();
    let iv = hex::decode("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff").unwrap();
    let mut buf = hex::decode(concat!(
        "6bc1bee22e409f96e93d7e117393172a",
        "ae2d8a571e03ac9c9eb76fac45af8e51",
        "30c81c46a35ce411e5fbc1191a0a52ef",
        "f69f2445df4f9b17ad2b417be66c3710"
    ))
    .unwrap();
    Aes256Ctr::new(key.as_slice().into(), iv.as_slice().into()).apply_keystream(&mut buf);
    assert_eq!(
        hex::encode(buf),
        concat!(
            "601ec313775789a5b7a7f504bbf3d228",
            "f443e3ca4d62b59aca84e990cacaf5c5",
            "2b0930daa23de94ce87017ba2d84988d",
            "dfc9c58db67aada613c2dd08457941a6"
        )
    );
}

/// The first two cells a client originates on the virtual hop, computed from rend-spec's
/// description alone: digest field = first 4 bytes of SHA3-256(Df | cell with digest zeroed
/// | ...) running across cells, then AES-256-CTR under Kf with one keystream across cells.
#[test]
fn client_cells_match_the_spec_description() {
    let km = hs_km(3);
    let mut client = ClientHopCrypto::new_hs(&km, false);

    let mut digest = Sha3_256::new();
    digest.update(km.df());
    let mut cipher = Aes256Ctr::new(km.kf().into(), &[0u8; 16].into());
    for tag in [0x41u8, 0x42] {
        let mut ours = payload(tag);
        let full = client.originate_forward(&mut ours);

        let mut expect = payload(tag);
        digest.update(expect);
        let d = digest.clone().finalize();
        expect[5..9].copy_from_slice(&d[..4]);
        cipher.apply_keystream(&mut expect);
        assert_eq!(ours[..], expect[..], "cell {tag:#x}");
        // The SENDME v1 digest is SHA3-256 truncated to 20 bytes, as C tor records it.
        assert_eq!(full[..], d[..20]);
    }
}

/// The service's direction is the client's reversed: a cell the service originates is
/// encrypted under Kb with the Db digest.
#[test]
fn service_sends_with_the_backward_keys() {
    let km = hs_km(9);
    let mut service = ClientHopCrypto::new_hs(&km, true);
    let mut ours = payload(0x55);
    service.originate_forward(&mut ours);

    let mut expect = payload(0x55);
    let mut digest = Sha3_256::new();
    digest.update(km.db());
    digest.update(expect);
    expect[5..9].copy_from_slice(&digest.finalize()[..4]);
    Aes256Ctr::new(km.kb().into(), &[0u8; 16].into()).apply_keystream(&mut expect);
    assert_eq!(ours[..], expect[..]);
}

#[test]
fn client_and_service_recognize_each_other_and_agree_on_digests() {
    let km = hs_km(1);
    let mut client = ClientHopCrypto::new_hs(&km, false);
    let mut service = ClientHopCrypto::new_hs(&km, true);
    for i in 0..60u8 {
        let mut p = payload(i);
        let sent = client.originate_forward(&mut p);
        assert!(service.decrypt_backward(&mut p), "client cell {i}");
        assert_eq!(p[11..], payload(i)[11..]);
        assert_eq!(sent, service.last_backward_digest());

        let mut q = payload(i ^ 0xff);
        let sent = service.originate_forward(&mut q);
        assert!(client.decrypt_backward(&mut q), "service cell {i}");
        assert_eq!(q[11..], payload(i ^ 0xff)[11..]);
        assert_eq!(sent, client.last_backward_digest());
    }
}

#[test]
fn tampered_or_misdirected_cells_are_not_recognized() {
    let km = hs_km(5);
    let mut client = ClientHopCrypto::new_hs(&km, false);
    let mut service = ClientHopCrypto::new_hs(&km, true);
    let mut p = payload(7);
    client.originate_forward(&mut p);
    p[100] ^= 1;
    assert!(!service.decrypt_backward(&mut p));

    // Both ends keyed as the client: each would read its own direction's keys.
    let mut a = ClientHopCrypto::new_hs(&km, false);
    let mut b = ClientHopCrypto::new_hs(&km, false);
    let mut p = payload(8);
    a.originate_forward(&mut p);
    assert!(!b.decrypt_backward(&mut p));

    // Other key material.
    let mut c = ClientHopCrypto::new_hs(&km, false);
    let mut s = ClientHopCrypto::new_hs(&hs_km(6), true);
    let mut p = payload(9);
    c.originate_forward(&mut p);
    assert!(!s.decrypt_backward(&mut p));
}

fn tor1_km(seed: u8) -> KeyMaterial {
    let mut k = [0u8; 72];
    for (i, b) in k.iter_mut().enumerate() {
        *b = seed.wrapping_mul(31).wrapping_add(i as u8);
    }
    KeyMaterial::from_tor1_keys(&k)
}

/// The whole path: client -> 3 tor1 hops (the third is the rendezvous point) -> virtual hop,
/// and the service's own 3-hop circuit to the same rendezvous point. The rendezvous point sees
/// only ciphertext it does not recognize; it re-encrypts onto the other circuit.
#[test]
fn cells_cross_the_rendezvous_point_as_ciphertext() {
    let mut rng = rand::thread_rng();
    // Real hs-ntor key material.
    let service_id = IdentityKeypair::generate(&mut rng);
    let addr = OnionAddress::from_key(service_id.public());
    let intro = HsIntroSecret {
        auth_key: IdentityKeypair::generate(&mut rng).public(),
        enc_secret: NtorSecretKey::generate(&mut rng),
        subcredential: addr.subcredential(),
    };
    let header = b"intro header";
    let (state, enc) =
        hs_ntor::client_introduce(&mut rng, &intro.public(), header, b"rendezvous info").unwrap();
    let opened = hs_ntor::service_open_introduce(&intro, header, &enc).unwrap();
    let (info, service_km) =
        hs_ntor::service_rendezvous(&mut rng, &intro, &opened.client_pk).unwrap();
    let client_km = hs_ntor::client_rendezvous(state, &info).unwrap();

    let mut client = ClientCircuitCrypto::new();
    let mut client_relays = Vec::new();
    let mut service = ClientCircuitCrypto::new();
    let mut service_relays = Vec::new();
    for i in 0..3 {
        client.push_hop(ClientHopCrypto::new(&tor1_km(i)));
        client_relays.push(RelayHopCrypto::new(&tor1_km(i)));
        service.push_hop(ClientHopCrypto::new(&tor1_km(10 + i)));
        service_relays.push(RelayHopCrypto::new(&tor1_km(10 + i)));
    }
    client.push_hop(ClientHopCrypto::new_hs(&client_km, false));
    service.push_hop(ClientHopCrypto::new_hs(&service_km, true));

    for i in 0..20u8 {
        // Client -> service.
        let mut p = payload(i);
        client.encrypt_to(3, &mut p).unwrap();
        for r in client_relays.iter_mut() {
            assert!(!r.decrypt_forward(&mut p), "a relay recognized an e2e cell");
        }
        assert_ne!(
            p[11..],
            payload(i)[11..],
            "the rendezvous point saw plaintext"
        );
        for r in service_relays.iter_mut().rev() {
            r.encrypt_backward(&mut p);
        }
        assert_eq!(service.decrypt_from_any(&mut p).map(|(h, _)| h), Some(3));
        assert_eq!(p[11..], payload(i)[11..]);

        // Service -> client.
        let mut q = payload(!i);
        service.encrypt_to(3, &mut q).unwrap();
        for r in service_relays.iter_mut() {
            assert!(!r.decrypt_forward(&mut q));
        }
        for r in client_relays.iter_mut().rev() {
            r.encrypt_backward(&mut q);
        }
        assert_eq!(client.decrypt_from_any(&mut q).map(|(h, _)| h), Some(3));
        assert_eq!(q[11..], payload(!i)[11..]);
    }
}
