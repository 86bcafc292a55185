//! The circuit manager's predicted pinned exits ([`crate::predict`]) against a core with no
//! network (its circuits build only when a test says so, with `on_circuit_built`), on a
//! virtual clock. A pinned request attaching to a really built prebuilt circuit end to end:
//! `crates/chive/tests/it/predicted_exit_e2e.rs`.

use super::*;
use crate::predict::PREDICTION_WINDOW;
use chive_core::CoreConfig;
use chive_crypto::IdentityKeypair;
use chive_dir::RelayFlags;

const PORT: u16 = 80;

/// `n` running guard+exit relays r1..rn allowing port 80 only.
fn consensus(n: u8) -> Arc<Consensus> {
    crate::onion::test_net::consensus_of(
        n,
        RelayFlags::GUARD | RelayFlags::EXIT,
        &["accept *:80", "reject *:*"],
    )
}

fn id(i: u8) -> IdentityKey {
    IdentityKeypair::from_secret_bytes(&[i; 32]).public()
}

struct T {
    core: Core,
    mgr: CircuitManager,
    now: Instant,
}

impl T {
    fn new(relays: u8, cfg: CircMgrConfig) -> T {
        let mut core = Core::new(CoreConfig::default(), [1; 32]);
        let mut mgr = CircuitManager::new(cfg, [2; 32]);
        let now = Instant::now();
        mgr.set_consensus(&mut core, consensus(relays), now);
        T { core, mgr, now }
    }

    /// No preemptive circuits to any exit: only what requests and predictions launch.
    fn pinned_only(relays: u8) -> T {
        T::new(
            relays,
            CircMgrConfig {
                preemptive_circuits: 0,
                ..CircMgrConfig::default()
            },
        )
    }

    fn pinned(&mut self, exit: &str, user: &str) -> Ticket {
        let req = StreamRequest {
            host: format!("10.0.0.1.{exit}.exit"),
            port: PORT,
            isolation: user.as_bytes().to_vec(),
            kind: RequestKind::Connect,
        };
        self.mgr.request(&mut self.core, req, self.now)
    }

    fn tick(&mut self, after: Duration) {
        self.now += after;
        self.mgr.tick(&mut self.core, self.now);
    }

    /// Circuits launched for a prediction (still marked so: no stream yet).
    fn predicted(&self) -> Vec<CircKey> {
        let mut v: Vec<CircKey> = self
            .mgr
            .circuits
            .iter()
            .filter(|(_, c)| c.predicted.is_some())
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }

    /// Which circuit `ticket` waits for.
    fn waits_on(&self, ticket: Ticket) -> Option<CircKey> {
        self.mgr
            .circuits
            .iter()
            .find(|(_, c)| c.waiting.iter().any(|(t, _, _)| *t == ticket))
            .map(|(k, _)| *k)
    }
}

#[test]
fn a_pinned_request_keeps_two_clean_circuits_at_its_exit() {
    let mut t = T::pinned_only(6);
    assert_eq!(t.mgr.circuit_count(), 0);
    let first = t.pinned("r3", "a");
    // The first pinned request builds its own circuit (nothing was predicted yet) ...
    let own = t.waits_on(first).expect("the request waits for a circuit");
    assert_eq!(t.mgr.circuits[&own].exit, id(3));
    // ... and from the next tick two clean circuits at r3 are kept besides it.
    t.tick(Duration::from_millis(100));
    let pre = t.predicted();
    assert_eq!(pre.len(), 2);
    assert!(pre.iter().all(|k| t.mgr.circuits[k].exit == id(3)));
    assert_eq!(t.mgr.clean_circuits_at(&id(3)), 2);
    assert_eq!(t.mgr.predicted_exits(t.now), vec![(id(3), PORT)]);
    // A pinned request with other credentials takes one of them, launching nothing itself.
    let before = t.mgr.circuit_count();
    let second = t.pinned("R3", "b");
    let took = t.waits_on(second).expect("waits for a predicted circuit");
    assert!(pre.contains(&took), "{took:?} is not one of {pre:?}");
    assert_eq!(t.mgr.circuit_count(), before, "no circuit launched for it");
    // The next tick replaces the one taken; already full after that.
    t.tick(Duration::from_millis(100));
    assert_eq!(t.mgr.circuit_count(), before + 1);
    assert_eq!(t.mgr.clean_circuits_at(&id(3)), 2);
    t.tick(Duration::from_secs(1));
    assert_eq!(t.mgr.circuit_count(), before + 1);
    // Only r3 was pinned: no circuit ends elsewhere.
    assert!(t.mgr.circuits.values().all(|c| c.exit == id(3)));
}

#[test]
fn a_failing_prediction_backs_off_and_recovers_when_one_is_built() {
    let mut t = T::pinned_only(6);
    t.pinned("r2", "a");
    t.tick(Duration::ZERO);
    // Build timeouts (closed locally: no relay is blamed), twice in a row.
    let mut pauses = Vec::new();
    for round in 0..2 {
        let pre = t.predicted();
        assert_eq!(pre.len(), 2, "round {round}");
        for k in &pre {
            t.mgr
                .on_circuit_closed(&mut t.core, *k, CloseCause::Local, 1, t.now);
        }
        assert!(t.predicted().is_empty());
        // Nothing during the pause ...
        let mut waited = Duration::ZERO;
        while t.predicted().is_empty() {
            t.tick(Duration::from_millis(250));
            waited += Duration::from_millis(250);
            assert!(waited <= Duration::from_secs(10), "never relaunched");
        }
        pauses.push(waited);
    }
    // Two failures at once, then two more: the pause doubles per failure.
    assert!(
        pauses[0] >= Duration::from_secs(2) && pauses[1] >= Duration::from_secs(8),
        "pauses {pauses:?}"
    );
    // A built one resets the back-off: the next failure pauses 1 s again.
    let pre = t.predicted();
    t.mgr.on_circuit_built(&mut t.core, pre[0], t.now);
    t.mgr
        .on_circuit_closed(&mut t.core, pre[1], CloseCause::Local, 1, t.now);
    t.tick(Duration::from_millis(999));
    assert_eq!(t.predicted().len(), 1);
    t.tick(Duration::from_millis(2));
    assert_eq!(t.predicted().len(), 2);
}

#[test]
fn unused_circuits_close_when_the_prediction_is_over() {
    let mut t = T::pinned_only(6);
    t.pinned("r4", "a");
    t.tick(Duration::ZERO);
    let pre = t.predicted();
    for k in &pre {
        t.mgr.on_circuit_built(&mut t.core, *k, t.now);
    }
    t.tick(PREDICTION_WINDOW - Duration::from_secs(1));
    assert_eq!(t.predicted(), pre, "kept within the window");
    t.tick(Duration::from_secs(2));
    assert!(t.predicted().is_empty(), "closed after it");
    assert!(t.mgr.predicted_exits(t.now).is_empty());
    t.tick(Duration::from_secs(5));
    assert!(t.predicted().is_empty(), "and not replaced");
}

#[test]
fn predictions_stay_within_the_build_and_clean_circuit_limits() {
    let mut t = T::new(
        12,
        CircMgrConfig {
            preemptive_circuits: 0,
            max_building: 8,
            ..CircMgrConfig::default()
        },
    );
    for i in 1..=10 {
        t.pinned(&format!("r{i}"), &format!("u{i}"));
    }
    // Ten on-demand circuits are building already: no prediction launches.
    t.tick(Duration::ZERO);
    assert!(t.predicted().is_empty());
    // Once they are built (and taken), eight builds at most ...
    let keys: Vec<CircKey> = t.mgr.circuits.keys().copied().collect();
    for k in keys {
        t.mgr.circuits.get_mut(&k).unwrap().built = true;
        t.mgr.circuits.get_mut(&k).unwrap().waiting.clear();
        t.mgr.circuits.get_mut(&k).unwrap().isolation = Some(b"x".to_vec());
    }
    t.tick(Duration::ZERO);
    assert_eq!(t.predicted().len(), 8);
    // ... and, built, at most MAX_CLEAN clean circuits in all (eight predictions of the
    // ten are kept: the table's bound).
    for _ in 0..4 {
        for k in t.predicted() {
            t.mgr.circuits.get_mut(&k).unwrap().built = true;
        }
        t.tick(Duration::from_secs(1));
    }
    assert_eq!(t.predicted().len(), MAX_CLEAN);
    assert_eq!(
        t.mgr.predicted_exits(t.now).len(),
        crate::predict::MAX_PREDICTIONS
    );
}

#[test]
fn zero_keeps_no_circuits_for_pinned_exits() {
    let mut t = T::new(
        6,
        CircMgrConfig {
            preemptive_circuits: 0,
            pinned_exit_circuits: 0,
            ..CircMgrConfig::default()
        },
    );
    t.pinned("r3", "a");
    t.tick(Duration::from_secs(1));
    assert!(t.predicted().is_empty());
    assert_eq!(t.mgr.circuit_count(), 1, "only the request's own");
}

#[test]
fn a_pin_by_hex_identity_matches_its_circuits() {
    let mut t = T::pinned_only(6);
    let first = t.pinned(&id(5).to_hex(), "a");
    let own = t.waits_on(first).unwrap();
    assert_eq!(t.mgr.circuits[&own].exit, id(5));
    // A second request by hex, same credentials, waits for the same circuit (it did not match
    // by nickname before: every hex-pinned request built a circuit of its own).
    let second = t.pinned(&id(5).to_hex(), "a");
    assert_eq!(t.waits_on(second), Some(own));
    // The prediction is the relay's, however it was named.
    t.tick(Duration::ZERO);
    assert_eq!(t.mgr.predicted_exits(t.now), vec![(id(5), PORT)]);
    let third = t.pinned("r5", "c");
    assert!(t.predicted().contains(&t.waits_on(third).unwrap()));
}

#[test]
fn a_refused_port_is_not_predicted_into_circuits() {
    let mut t = T::pinned_only(6);
    let req = StreamRequest {
        host: "10.0.0.1.r3.exit".into(),
        port: 443,
        isolation: b"a".to_vec(),
        kind: RequestKind::Connect,
    };
    let ticket = t.mgr.request(&mut t.core, req, t.now);
    match t.mgr.poll_outcome() {
        Some((tk, Outcome::Failed(_))) => assert_eq!(tk, ticket),
        other => panic!("expected a failure, got {other:?}"),
    }
    t.tick(Duration::from_secs(1));
    assert_eq!(
        t.mgr.circuit_count(),
        0,
        "r3 refuses port 443: nothing to keep"
    );
}
