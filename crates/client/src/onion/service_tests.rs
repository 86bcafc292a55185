//! The service's policy against a core with no network: which circuits it builds, what it
//! publishes and when, and what it refuses. (The protocol through real relays is
//! `chive-core`'s `tests/it/onion.rs`; through real processes `chive`'s `onion_e2e`.)

use super::*;
use crate::onion::test_net::consensus;
use chive_core::CoreConfig;

const UNIX: u64 = 1_700_000_000;

fn service(n: usize) -> (OnionService, Core) {
    let identity = IdentityKeypair::from_secret_bytes(&[42; 32]);
    let svc = OnionService::new(
        ServiceConfig {
            identity,
            ports: vec![(80, "127.0.0.1:8080".parse().unwrap())],
            intro_points: n,
            descriptor_lifetime: Duration::from_secs(3600),
            paths: OnionPaths::default(),
            predicted: 0,
        },
        [7; 32],
    );
    (svc, Core::new(CoreConfig::default(), [1; 32]))
}

fn intro_circs(svc: &OnionService) -> Vec<CircKey> {
    svc.slots.iter().filter_map(|s| s.circ).collect()
}

#[test]
fn builds_intro_circuits_and_publishes_once_established() {
    let (mut svc, mut core) = service(3);
    let now = Instant::now();
    svc.set_consensus(&mut core, consensus(5), now);
    let circs = intro_circs(&svc);
    assert_eq!(circs.len(), 3);
    // Three distinct relays, each the last hop of its circuit; none published yet.
    let ids: HashSet<IdentityKey> = svc.slots.iter().map(|s| s.hop.identity).collect();
    assert_eq!(ids.len(), 3);
    svc.tick(&mut core, now, UNIX);
    assert_eq!(svc.poll_action(), None);

    // Two established: not yet (waits for all, or PUBLISH_SETTLE).
    for &c in &circs[..2] {
        svc.on_onion_message(&mut core, c, RelayCommand::INTRO_ESTABLISHED, &[], now);
    }
    svc.tick(&mut core, now, UNIX);
    assert_eq!(svc.poll_action(), None);
    svc.on_onion_message(
        &mut core,
        circs[2],
        RelayCommand::INTRO_ESTABLISHED,
        &[],
        now,
    );
    svc.tick(&mut core, now, UNIX);
    let Some(ServiceAction::Publish { doc, revision, .. }) = svc.poll_action() else {
        panic!("no descriptor published");
    };
    let desc = OnionDescriptor::verify(&doc, &svc.address(), UNIX).expect("verifies");
    assert_eq!(desc.intro_points.len(), 3);
    assert_eq!(desc.revision, revision);
    for s in &svc.slots {
        let ip = desc
            .intro_points
            .iter()
            .find(|p| p.relay == s.hop.identity)
            .expect("listed");
        assert_eq!(ip.auth_key, s.keys.public().auth_key);
    }
    // Nothing new: nothing published.
    svc.tick(&mut core, now + Duration::from_secs(1), UNIX + 1);
    assert_eq!(svc.poll_action(), None);

    // An intro circuit dies: rebuilt after its backoff, and the descriptor without it is
    // published PUBLISH_SETTLE later (the others are still up).
    svc.on_circuit_closed(circs[0], "test", now);
    assert_eq!(svc.established(), 2);
    let later = now + PUBLISH_SETTLE;
    svc.tick(&mut core, later, UNIX + 3);
    let Some(ServiceAction::Publish {
        doc, revision: r2, ..
    }) = svc.poll_action()
    else {
        panic!("no re-publish after losing an intro point");
    };
    assert!(r2 > revision);
    let desc = OnionDescriptor::verify(&doc, &svc.address(), UNIX + 3).unwrap();
    assert_eq!(desc.intro_points.len(), 2);
    assert_eq!(intro_circs(&svc).len(), 3, "the lost circuit was rebuilt");

    // Half the lifetime later: published again.
    let half = later + Duration::from_secs(1800);
    svc.tick(&mut core, half, UNIX + 1803);
    assert!(matches!(
        svc.poll_action(),
        Some(ServiceAction::Publish { .. })
    ));
    // A failed upload is retried after PUBLISH_RETRY.
    svc.publish_failed(half);
    svc.tick(&mut core, half + Duration::from_secs(1), UNIX + 1804);
    assert_eq!(svc.poll_action(), None);
    svc.tick(&mut core, half + PUBLISH_RETRY, UNIX + 1805);
    assert!(matches!(
        svc.poll_action(),
        Some(ServiceAction::Publish { .. })
    ));
}

#[test]
fn an_intro_point_that_keeps_failing_is_replaced() {
    let (mut svc, mut core) = service(1);
    let mut now = Instant::now();
    svc.set_consensus(&mut core, consensus(5), now);
    let first = svc.slots[0].hop.identity;
    for _ in 0..MAX_INTRO_FAILURES {
        let c = intro_circs(&svc)[0];
        svc.on_circuit_closed(c, "test", now);
        now += MAX_INTRO_BACKOFF;
        svc.tick(&mut core, now, UNIX);
    }
    assert_eq!(svc.slots.len(), 1);
    assert_ne!(
        svc.slots[0].hop.identity, first,
        "replaced by another relay"
    );
    assert!(svc.slots[0].circ.is_some());
    assert_eq!(
        svc.counters().intro_circuits_lost,
        u64::from(MAX_INTRO_FAILURES)
    );
}

#[test]
fn streams_only_through_joined_circuits_to_configured_ports() {
    let (mut svc, mut core) = service(1);
    let now = Instant::now();
    svc.set_consensus(&mut core, consensus(4), now);
    let intro = intro_circs(&svc)[0];
    // Not a rendezvous circuit: refused.
    assert_eq!(svc.stream_target(intro, 80), None);
    // A junk INTRODUCE2 is dropped and counted; no rendezvous circuit is built.
    svc.on_onion_message(&mut core, intro, RelayCommand::INTRODUCE2, &[1, 2, 3], now);
    assert!(svc.pending.is_empty());
    assert_eq!(svc.counters().introduce.malformed, 1);
    // A joined one: port 80 maps to the target, other ports are refused.
    let joined = CircKey(9999);
    svc.joined.insert(joined);
    assert_eq!(
        svc.stream_target(joined, 80),
        Some("127.0.0.1:8080".parse().unwrap())
    );
    assert_eq!(svc.stream_target(joined, 81), None);
}
