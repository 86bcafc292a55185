//! The connector's policy against a core with no network: every request ends, with the right
//! proposal 304 code, after bounded retries; requests for the same service wait on one
//! attempt. (Joining through real relays: `chive`'s `onion_e2e`.)

use super::*;
use crate::onion::test_net::consensus;
use chive_core::onion::OnionServiceIntro;
use chive_core::{CoreConfig, Event};
use chive_crypto::IdentityKeypair;
use chive_dir::IntroPoint;

fn descriptor(intro_points: usize) -> OnionDescriptor {
    descriptor_at(&(0..intro_points).collect::<Vec<_>>())
}

/// A descriptor whose introduction points are the test consensus's relays `at`.
fn descriptor_at(at: &[usize]) -> OnionDescriptor {
    let id = IdentityKeypair::from_secret_bytes(&[42; 32]);
    let address = OnionAddress::from_key(id.public());
    let mut rng = StdRng::seed_from_u64(5);
    let cons = consensus(5);
    OnionDescriptor {
        address,
        revision: 1,
        valid_after: 0,
        valid_until: 3600,
        intro_points: at
            .iter()
            .map(|&i| &cons.relays[i])
            .map(|r| {
                let keys = OnionServiceIntro::generate(&mut rng, address.subcredential(), 16);
                let p = keys.public();
                IntroPoint {
                    relay: r.identity,
                    onion_key: chive_crypto::ntor::NtorPublicKey(r.ntor_key),
                    addresses: vec![r.address],
                    auth_key: p.auth_key,
                    enc_key: p.enc_key,
                }
            })
            .collect(),
    }
}

fn connector(max_attempts: u32) -> (OnionConnector, Core) {
    connector_with(max_attempts, Duration::from_secs(5))
}

fn connector_with(max_attempts: u32, attempt_timeout: Duration) -> (OnionConnector, Core) {
    let mut c = OnionConnector::new(
        ConnectorConfig {
            max_attempts,
            attempt_timeout,
            ..ConnectorConfig::default()
        },
        [3; 32],
    );
    c.set_consensus(consensus(5));
    (c, Core::new(CoreConfig::default(), [1; 32]))
}

/// The introduction point of `k`'s attempt answers INTRODUCE_ACK "unknown service" (status 1).
fn refuse_introduction(c: &mut OnionConnector, core: &mut Core, k: &ConnectKey, now: Instant) {
    let intro = c.attempts[k].intro.unwrap();
    let nack = chive_cell::IntroduceAck {
        status: chive_cell::IntroduceAckStatus::UnknownService,
        extensions: vec![],
    }
    .encode()
    .unwrap();
    c.on_onion_message(core, intro, RelayCommand::INTRODUCE_ACK, &nack, now);
}

/// A RENDEZVOUS2 arrives on `k`'s rendezvous circuit without INTRODUCE1 sent: it cannot
/// authenticate.
fn unauthenticated_rendezvous2(
    c: &mut OnionConnector,
    core: &mut Core,
    k: &ConnectKey,
    now: Instant,
) {
    let rend = c.attempts[k].rend;
    c.on_onion_message(core, rend, RelayCommand::RENDEZVOUS2, &[0; 148], now);
}

fn key(desc: &OnionDescriptor) -> ConnectKey {
    ConnectKey {
        address: desc.address,
        isolation: vec![],
    }
}

#[test]
fn an_attempt_that_never_finishes_times_out_with_f7_after_retries() {
    let (mut c, mut core) = connector(2);
    let desc = descriptor(2);
    let k = key(&desc);
    let now = Instant::now();
    assert_eq!(c.attach(&mut core, &k, "x.onion", 80, now), None);
    let t1 = c.connect(&mut core, k.clone(), desc, "x.onion", 80, now);
    // A second request waits on the same attempt.
    let t2 = c.attach(&mut core, &k, "x.onion", 80, now).expect("waits");
    assert_eq!(
        c.circs.len(),
        2,
        "one rendezvous and one introduction circuit"
    );
    let first_intro = c.attempts[&k].tried[0];
    c.tick(&mut core, now + Duration::from_secs(4));
    assert!(c.poll_outcome().is_none());
    // Attempt 1 times out: attempt 2 starts, with the other introduction point.
    c.tick(&mut core, now + Duration::from_secs(5));
    assert!(c.poll_outcome().is_none());
    assert_eq!(c.attempts[&k].number, 2);
    assert_ne!(c.attempts[&k].tried[1], first_intro);
    assert_eq!(c.circs.len(), 2, "the first attempt's circuits were closed");
    // Attempt 2 times out: both requests fail with 0xF7.
    c.tick(&mut core, now + Duration::from_secs(10));
    let mut got = vec![c.poll_outcome().unwrap(), c.poll_outcome().unwrap()];
    got.sort_by_key(|(t, _)| *t);
    let f7 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::IntroTimedOut));
    assert_eq!(got, vec![(t1, f7.clone()), (t2, f7)]);
    assert!(c.attempts.is_empty() && c.circs.is_empty());
    assert_eq!(c.counters.requests_failed, 2);
    assert_eq!((c.counters.attempts, c.counters.timed_out), (2, 2));
}

#[test]
fn lost_circuits_fail_with_an_onion_code_after_bounded_attempts() {
    let (mut c, mut core) = connector(3);
    let desc = descriptor(1);
    let now = Instant::now();
    let t = c.connect(&mut core, key(&desc), desc, "x.onion", 80, now);
    // Every link the core asks for fails; feed its circuit closures back.
    for _ in 0..100 {
        let mut any = false;
        while let Some(ev) = core.poll_event() {
            any = true;
            match ev {
                Event::Connect { identity, .. } => core.connect_failed(identity, now),
                Event::CircuitClosed { circ, reason, .. } => {
                    c.on_circuit_closed(&mut core, circ, &reason, now)
                }
                _ => {}
            }
        }
        if !any {
            break;
        }
    }
    let (ticket, outcome) = c.poll_outcome().expect("the request ended");
    assert_eq!(ticket, t);
    let OnionOutcome::Failed(SocksReply::Onion(code)) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        matches!(
            code,
            OnionSocksError::IntroFailed | OnionSocksError::RendezvousFailed
        ),
        "{code:?}"
    );
    assert!(c.attempts.is_empty());
}

#[test]
fn an_introduce_ack_that_says_no_moves_on_and_a_bad_rendezvous2_fails_f3() {
    let (mut c, mut core) = connector(1);
    let desc = descriptor(1);
    let k = key(&desc);
    let now = Instant::now();
    let t = c.connect(&mut core, k.clone(), desc.clone(), "x.onion", 80, now);
    // INTRODUCE_ACK "unknown service" (status 1): the only attempt fails with 0xF2.
    refuse_introduction(&mut c, &mut core, &k, now);
    assert_eq!(
        c.poll_outcome(),
        Some((
            t,
            OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::IntroFailed))
        ))
    );
    // A RENDEZVOUS2 that comes without INTRODUCE1 sent cannot authenticate: 0xF3.
    let t = c.connect(&mut core, k.clone(), desc, "x.onion", 80, now);
    unauthenticated_rendezvous2(&mut c, &mut core, &k, now);
    assert_eq!(
        c.poll_outcome(),
        Some((
            t,
            OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::RendezvousFailed))
        ))
    );
    assert!(c.joined_circuit(&k).is_none());
}

#[test]
fn a_cached_descriptor_serves_until_it_expires_or_an_introduction_fails() {
    let (mut c, mut core) = connector(1);
    let desc = descriptor(1);
    let k = key(&desc);
    let now = Instant::now();
    c.store_descriptor(desc.clone(), 10);
    assert_eq!(c.cached_descriptor(&desc.address, 20), Some(desc.clone()));
    assert_eq!(c.counters.descriptor_cache_hits, 1);
    assert_eq!(c.cached_descriptor(&desc.address, 3600), None, "expired");
    // A rendezvous failure (0xF3) says nothing about the descriptor: it stays.
    c.store_descriptor(desc.clone(), 10);
    let t = c.connect(&mut core, k.clone(), desc.clone(), "x.onion", 80, now);
    unauthenticated_rendezvous2(&mut c, &mut core, &k, now);
    let f3 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::RendezvousFailed));
    assert_eq!(c.poll_outcome(), Some((t, f3)));
    assert!(c.cached_descriptor(&desc.address, 20).is_some());
    // An introduction refused (0xF2): the service may have moved; the next request fetches.
    let t = c.connect(&mut core, k.clone(), desc.clone(), "x.onion", 80, now);
    refuse_introduction(&mut c, &mut core, &k, now);
    let f2 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::IntroFailed));
    assert_eq!(c.poll_outcome(), Some((t, f2)));
    assert_eq!(c.cached_descriptor(&desc.address, 20), None);
    let n = c.counters;
    assert_eq!(
        (
            n.descriptors_fetched,
            n.descriptor_cache_hits,
            n.descriptors_dropped
        ),
        (2, 2, 1)
    );
    assert_eq!(
        (
            n.attempts,
            n.intro_failed,
            n.rendezvous_failed,
            n.requests_failed
        ),
        (2, 1, 1, 2)
    );
    // A timed-out attempt (0xF7) drops it too.
    c.store_descriptor(desc.clone(), 10);
    c.connect(&mut core, k, desc.clone(), "x.onion", 80, now);
    c.tick(&mut core, now + Duration::from_secs(5));
    assert!(c.poll_outcome().is_some());
    assert_eq!(c.cached_descriptor(&desc.address, 20), None);
    assert_eq!(
        (c.counters.timed_out, c.counters.descriptors_dropped),
        (1, 2)
    );
}

#[test]
fn the_attempt_timeout_is_the_configured_one() {
    let (mut c, mut core) = connector_with(1, Duration::from_millis(1500));
    let desc = descriptor(1);
    let now = Instant::now();
    let t = c.connect(&mut core, key(&desc), desc, "x.onion", 80, now);
    c.tick(&mut core, now + Duration::from_millis(1499));
    assert!(c.poll_outcome().is_none());
    c.tick(&mut core, now + Duration::from_millis(1500));
    let f7 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::IntroTimedOut));
    assert_eq!(c.poll_outcome(), Some((t, f7)));
}

#[test]
fn predicted_circuits_are_built_once_onion_connections_start() {
    let (mut c, mut core) = connector(1);
    let now = Instant::now();
    c.tick(&mut core, now);
    assert!(
        c.pool.is_empty(),
        "no onion connection yet: nothing predicted"
    );
    let desc = descriptor(1);
    c.connect(&mut core, key(&desc), desc, "x.onion", 80, now);
    // Nothing was built, so the attempt's two circuits are fresh ones.
    assert_eq!((c.circs.len(), c.counters.predicted_used), (2, 0));
    c.tick(&mut core, now);
    // Rendezvous and introduction kinds, DEFAULT_PREDICTED each, owned by the connector.
    assert_eq!(c.pool.len(), 2 * DEFAULT_PREDICTED);
    assert_eq!(c.pool_counters().launched, 2 * DEFAULT_PREDICTED as u64);
    assert_eq!(c.predicted_ready(), 0);
}

#[test]
fn a_built_predicted_circuit_is_the_rendezvous_circuit_and_its_last_hop_the_point() {
    let (mut c, mut core) = connector(1);
    let now = Instant::now();
    let desc = descriptor(1);
    let k = key(&desc);
    // A first connection starts the pool; it fails here (no network), as any would.
    c.connect(&mut core, k.clone(), desc.clone(), "x.onion", 80, now);
    c.tick(&mut core, now);
    let whole = c.pool.whole_circuits();
    assert_eq!(
        whole.len(),
        DEFAULT_PREDICTED,
        "rendezvous circuits are built whole"
    );
    for (circ, _) in &whole {
        c.on_circuit_built(&mut core, *circ, now);
    }
    c.tick(&mut core, now + Duration::from_secs(6));
    while c.poll_outcome().is_some() {}
    let used = c.counters.predicted_used;
    let k2 = ConnectKey {
        isolation: b"second".to_vec(),
        ..k
    };
    let t = c.connect(
        &mut core,
        k2.clone(),
        desc.clone(),
        "x.onion",
        80,
        now + Duration::from_secs(6),
    );
    let a = &c.attempts.get(&k2);
    // The core of this test never built the circuit, so ESTABLISH_RENDEZVOUS is refused the
    // moment it is sent, before any circuit-built event: it went at the attempt's start.
    assert!(a.is_none(), "the attempt ended at once");
    let f3 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::RendezvousFailed));
    assert_eq!(c.poll_outcome(), Some((t, f3)));
    assert_eq!(
        c.counters.predicted_used,
        used + 1,
        "the whole circuit was used"
    );
    let taken: Vec<_> = whole
        .iter()
        .filter(|(circ, _)| !c.pool.owns(*circ))
        .collect();
    assert_eq!(taken.len(), 1);
    assert_ne!(
        taken[0].1.identity, desc.intro_points[0].relay,
        "not the intro point"
    );
}

#[test]
fn the_intro_point_is_one_a_built_rendezvous_circuit_does_not_end_at() {
    let cons = consensus(5);
    // Several seeds: without the preference half of them would pick the circuit's end.
    for seed in 0..8u8 {
        let mut c = OnionConnector::new(
            ConnectorConfig {
                max_attempts: 1,
                ..ConnectorConfig::default()
            },
            [seed; 32],
        );
        c.set_consensus(cons.clone());
        let mut core = Core::new(CoreConfig::default(), [1; 32]);
        let now = Instant::now();
        let first = descriptor(1);
        c.connect(&mut core, key(&first), first, "x.onion", 80, now);
        c.tick(&mut core, now);
        // One whole circuit built; the service's intro points: its end and one other relay.
        let (circ, end) = c.pool.whole_circuits()[0].clone();
        c.on_circuit_built(&mut core, circ, now);
        let end_at = cons
            .relays
            .iter()
            .position(|r| r.identity == end.identity)
            .unwrap();
        let other = (0..5).find(|i| *i != end_at).unwrap();
        let desc = descriptor_at(&[end_at, other]);
        let k = ConnectKey {
            address: desc.address,
            isolation: b"second".to_vec(),
        };
        let used = c.counters.predicted_used;
        let t = c.connect(&mut core, k.clone(), desc, "x.onion", 80, now);
        // The whole circuit was taken (so the intro point is `other`): ESTABLISH_RENDEZVOUS
        // went at once and the core, which never built it, refused it.
        assert_eq!(c.counters.predicted_used, used + 1, "seed {seed}");
        assert!(!c.pool.owns(circ));
        let f3 = OnionOutcome::Failed(SocksReply::Onion(OnionSocksError::RendezvousFailed));
        assert_eq!(c.poll_outcome(), Some((t, f3)), "seed {seed}");
    }
}
