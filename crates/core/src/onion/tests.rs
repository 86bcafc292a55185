//! The four roles together at the message level: client, intro point table, service,
//! rendezvous table; then every refusal the service counts.

use chive_cell::{Introduce, IntroduceAck, IntroduceAckStatus, RelayCommand};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::{IdentityKeypair, OnionAddress};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::service::{hop_from_link_specs, link_specs};
use super::*;
use crate::HopSpec;

fn same(a: &HopSpec, b: &HopSpec) -> bool {
    a.identity == b.identity && a.ntor_key.0 == b.ntor_key.0 && a.addr == b.addr
}

fn hop(rng: &mut StdRng, port: u16) -> HopSpec {
    HopSpec {
        identity: IdentityKeypair::generate(rng).public(),
        ntor_key: NtorSecretKey::generate(rng).public(),
        addr: ([127, 0, 0, 1], port).into(),
    }
}

struct World {
    rng: StdRng,
    service: OnionServiceIntro,
    intro_table: IntroPointTable<u32>,
    rend_table: RendezvousTable<u32>,
    rp: HopSpec,
}

/// Service circuit 1 established at the intro point with KH [7; 20].
fn world() -> World {
    let mut rng = StdRng::seed_from_u64(11);
    let id = IdentityKeypair::generate(&mut rng);
    let addr = OnionAddress::from_key(id.public());
    let service = OnionServiceIntro::generate(&mut rng, addr.subcredential(), 64);
    let mut intro_table = IntroPointTable::new(16);
    intro_table
        .establish(1, &[7; 20], &service.establish_intro(&[7; 20]))
        .unwrap();
    let rp = hop(&mut rng, 9100);
    World {
        rng,
        service,
        intro_table,
        rend_table: RendezvousTable::new(16),
        rp,
    }
}

#[test]
fn client_and_service_meet_and_agree_on_keys() {
    let mut w = world();
    let mut client = ClientRendezvous::new(&mut w.rng, w.service.public());
    // Client circuit 10 to the RP, circuit 11 to the intro point.
    w.rend_table
        .establish(10, &client.establish_rendezvous())
        .unwrap();
    let intro1 = client.introduce1(&mut w.rng, &w.rp).unwrap();
    assert!(intro1.len() <= chive_cell::RELAY_DATA_LEN);
    let (svc_circ, intro2) = w.intro_table.introduce1(&intro1).unwrap();
    assert_eq!(svc_circ, 1);
    let ack = IntroduceAck {
        status: IntroduceAckStatus::Success,
        extensions: vec![],
    }
    .encode()
    .unwrap();
    client.on_introduce_ack(&ack).unwrap();

    let acc = w.service.on_introduce2(&mut w.rng, &intro2).unwrap();
    assert!(same(&acc.rendezvous_point, &w.rp));
    assert_eq!(acc.rendezvous1.0, RelayCommand::RENDEZVOUS1);
    // Service circuit 20 at the RP.
    let (client_circ, r2) = w.rend_table.rendezvous1(20, &acc.rendezvous1.1).unwrap();
    assert_eq!(client_circ, 10);
    let keys = client.on_rendezvous2(&r2).unwrap();
    assert_eq!(keys.0, acc.keys.0);
    assert_eq!(w.service.stats.accepted, 1);
}

#[test]
fn undecryptable_replayed_and_foreign_introductions_are_dropped_and_counted() {
    let mut w = world();
    let mut client = ClientRendezvous::new(&mut w.rng, w.service.public());
    let intro1 = client.introduce1(&mut w.rng, &w.rp).unwrap();

    // Tampered by the intro point: the MAC fails.
    let mut bad = intro1.clone();
    let last = bad.len() - 40;
    bad[last] ^= 1;
    assert_eq!(
        w.service.on_introduce2(&mut w.rng, &bad).err(),
        Some(IntroduceError::Undecryptable)
    );
    assert_eq!(w.service.stats.undecryptable, 1);

    // Accepted once, then a replay.
    assert!(w.service.on_introduce2(&mut w.rng, &intro1).is_ok());
    assert_eq!(
        w.service.on_introduce2(&mut w.rng, &intro1).err(),
        Some(IntroduceError::Replayed)
    );
    assert_eq!(w.service.stats.replayed, 1);

    // For another auth key, and junk.
    let mut other = Introduce::decode(&intro1).unwrap();
    other.auth_key = [1; 32];
    assert_eq!(
        w.service
            .on_introduce2(&mut w.rng, &other.encode().unwrap())
            .err(),
        Some(IntroduceError::WrongAuthKey)
    );
    assert_eq!(
        w.service.on_introduce2(&mut w.rng, &[0; 10]).err(),
        Some(IntroduceError::Malformed)
    );
    assert_eq!(w.service.stats.malformed, 2);
    assert_eq!(w.service.stats.accepted, 1);
}

#[test]
fn a_forged_rendezvous2_fails_the_client() {
    let mut w = world();
    let mut client = ClientRendezvous::new(&mut w.rng, w.service.public());
    assert_eq!(
        client.on_rendezvous2(&[0; 64]).err(),
        Some(OnionClientError::RendezvousFailed),
        "RENDEZVOUS2 before INTRODUCE1"
    );
    client.introduce1(&mut w.rng, &w.rp).unwrap();
    let mut rng = StdRng::seed_from_u64(99);
    let mut fake = [0u8; 64];
    rand::RngCore::fill_bytes(&mut rng, &mut fake);
    assert_eq!(
        client.on_rendezvous2(&fake).err(),
        Some(OnionClientError::RendezvousFailed)
    );
    let nack = IntroduceAck {
        status: IntroduceAckStatus::UnknownService,
        extensions: vec![],
    }
    .encode()
    .unwrap();
    assert_eq!(
        client.on_introduce_ack(&nack),
        Err(OnionClientError::IntroFailed(
            IntroduceAckStatus::UnknownService
        ))
    );
}

#[test]
fn link_specifiers_round_trip_and_mismatches_are_refused() {
    let mut rng = StdRng::seed_from_u64(5);
    let h = hop(&mut rng, 9200);
    assert!(hop_from_link_specs(&link_specs(&h), h.ntor_key.0).is_some_and(|g| same(&g, &h)));
    let mut specs = link_specs(&h);
    specs[1] = chive_cell::LinkSpec::LegacyId([0; 20]);
    assert!(hop_from_link_specs(&specs, h.ntor_key.0).is_none());
    assert!(hop_from_link_specs(&specs[..1], h.ntor_key.0).is_none());
}
