//! The pieces of an onion-service connection fitted together, without circuits: address,
//! descriptor (chive-dir), relay messages (chive-cell) and hs-ntor with the replay cache
//! (chive-crypto). What an introduction point and a rendezvous point do is played by hand:
//! they only pass bytes on. The circuit state machines that will do this for real are in
//! chive-core (not yet written).

use chive_cell::{
    EstablishIntro, EstablishRendezvous, Introduce, IntroducePlaintext, LinkSpec, Rendezvous1,
    Rendezvous2, ESTABLISH_INTRO_SIG_PREFIX,
};
use chive_crypto::hs_ntor::{self, HsIntroSecret};
use chive_crypto::{
    IdentityKeypair, IntroReplayCache, NtorSecretKey, OnionAddress, Replay, Signature,
};
use chive_dir::{IntroPoint, OnionDescriptor};

const NOW: u64 = 1_700_000_000;

#[test]
fn client_and_service_meet_through_the_pieces() {
    let mut rng = rand::thread_rng();

    // The service: identity, address, one intro point with its own auth and encryption keys.
    let identity = IdentityKeypair::generate(&mut rng);
    let address = OnionAddress::from_key(identity.public());
    let auth = IdentityKeypair::generate(&mut rng);
    let intro_secret = HsIntroSecret {
        auth_key: auth.public(),
        enc_secret: NtorSecretKey::generate(&mut rng),
        subcredential: address.subcredential(),
    };
    let intro_relay = IdentityKeypair::generate(&mut rng);

    // ESTABLISH_INTRO, signed by the auth key; the intro point checks the signature.
    let mut est = EstablishIntro {
        auth_key: *auth.public().as_bytes(),
        extensions: vec![],
        handshake_auth: hs_ntor::sha3_mac(b"circuit KH", b"fields"),
        sig: [0; 64],
    };
    est.sig = auth.sign(&est.signed_bytes().unwrap()).0;
    let at_intro = EstablishIntro::decode(&est.encode().unwrap()).unwrap();
    let signed = at_intro.signed_bytes().unwrap();
    assert!(signed.starts_with(ESTABLISH_INTRO_SIG_PREFIX));
    chive_crypto::IdentityKey::from_bytes(&at_intro.auth_key)
        .unwrap()
        .verify(&signed, &Signature(at_intro.sig))
        .unwrap();

    // The descriptor, published and fetched by address.
    let desc = OnionDescriptor {
        address,
        revision: 1,
        valid_after: NOW,
        valid_until: NOW + 3600,
        intro_points: vec![IntroPoint {
            relay: intro_relay.public(),
            onion_key: NtorSecretKey::generate(&mut rng).public(),
            addresses: vec!["127.0.0.1:9001".parse().unwrap()],
            auth_key: auth.public(),
            enc_key: intro_secret.enc_secret.public(),
        }],
    };
    let doc = desc.sign(&identity).unwrap();
    let typed: OnionAddress = address.to_string().parse().unwrap();
    let fetched = OnionDescriptor::verify(&doc, &typed, NOW + 10).unwrap();
    let ip = &fetched.intro_points[0];

    // The client: a rendezvous cookie, then INTRODUCE1 encrypted to the intro point's keys.
    let cookie = [42u8; 20];
    let est_rend = EstablishRendezvous { cookie };
    assert_eq!(
        EstablishRendezvous::decode(&est_rend.encode()).unwrap(),
        est_rend
    );
    let rend_point = IdentityKeypair::generate(&mut rng);
    let plaintext = IntroducePlaintext {
        cookie,
        extensions: vec![],
        onion_key: [9; 32],
        link_specifiers: vec![
            LinkSpec::Ipv4("127.0.0.1:9002".parse().unwrap()),
            LinkSpec::LegacyId(rend_point.public().ntor_id()),
            LinkSpec::Ed25519Id(*rend_point.public().as_bytes()),
        ],
    };
    let public = hs_ntor::HsIntroPublic {
        auth_key: ip.auth_key,
        enc_key: ip.enc_key,
        subcredential: fetched.address.subcredential(),
    };
    let mut intro1 = Introduce {
        auth_key: *ip.auth_key.as_bytes(),
        extensions: vec![],
        encrypted: vec![],
    };
    let (client_state, encrypted) = hs_ntor::client_introduce(
        &mut rng,
        &public,
        &intro1.header().unwrap(),
        &plaintext.encode(200).unwrap(),
    )
    .unwrap();
    intro1.encrypted = encrypted;
    let wire = intro1.encode().unwrap();

    // The intro point passes the same bytes on as INTRODUCE2; the service checks, opens, and
    // remembers it.
    let mut replays = IntroReplayCache::new(16);
    let intro2 = Introduce::decode(&wire).unwrap();
    assert_eq!(intro2.auth_key, *intro_secret.auth_key.as_bytes());
    let opened = hs_ntor::service_open_introduce(
        &intro_secret,
        &intro2.header().unwrap(),
        &intro2.encrypted,
    )
    .unwrap();
    assert_eq!(replays.check_and_insert(&intro2.encrypted), Replay::Fresh);
    let got = IntroducePlaintext::decode(&opened.plaintext).unwrap();
    assert_eq!(got, plaintext);

    // The same INTRODUCE2 again is a replay.
    let again = Introduce::decode(&wire).unwrap();
    hs_ntor::service_open_introduce(&intro_secret, &again.header().unwrap(), &again.encrypted)
        .unwrap();
    assert_eq!(replays.check_and_insert(&again.encrypted), Replay::Replayed);

    // RENDEZVOUS1 to the rendezvous point, which passes HANDSHAKE_INFO on in RENDEZVOUS2.
    let (info, service_keys) =
        hs_ntor::service_rendezvous(&mut rng, &intro_secret, &opened.client_pk).unwrap();
    let r1 = Rendezvous1 {
        cookie: got.cookie,
        handshake_info: info.to_vec(),
    };
    let at_rp = Rendezvous1::decode(&r1.encode().unwrap()).unwrap();
    assert_eq!(
        at_rp.cookie, cookie,
        "the rendezvous point matches the cookie"
    );
    let r2 = Rendezvous2 {
        handshake_info: at_rp.handshake_info,
    };
    let at_client = Rendezvous2::decode(&r2.encode().unwrap()).unwrap();
    let client_keys = hs_ntor::client_rendezvous(client_state, &at_client.handshake_info).unwrap();
    assert_eq!(client_keys.0, service_keys.0);
}

#[test]
fn an_intro_point_that_changes_the_introduction_is_caught() {
    let mut rng = rand::thread_rng();
    let identity = IdentityKeypair::generate(&mut rng);
    let address = OnionAddress::from_key(identity.public());
    let secret = HsIntroSecret {
        auth_key: IdentityKeypair::generate(&mut rng).public(),
        enc_secret: NtorSecretKey::generate(&mut rng),
        subcredential: address.subcredential(),
    };
    let mut intro1 = Introduce {
        auth_key: *secret.auth_key.as_bytes(),
        extensions: vec![],
        encrypted: vec![],
    };
    let (_, enc) = hs_ntor::client_introduce(
        &mut rng,
        &secret.public(),
        &intro1.header().unwrap(),
        b"plaintext",
    )
    .unwrap();
    intro1.encrypted = enc;
    // The intro point adds an extension: the header changes, so the MAC fails.
    let mut changed = intro1.clone();
    changed.extensions.push(chive_cell::Extension {
        ty: 99,
        data: vec![1],
    });
    let wire = changed.encode().unwrap();
    let at_service = Introduce::decode(&wire).unwrap();
    assert!(hs_ntor::service_open_introduce(
        &secret,
        &at_service.header().unwrap(),
        &at_service.encrypted
    )
    .is_err());
}
