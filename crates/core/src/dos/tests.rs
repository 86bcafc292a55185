//! The DoS rules on their own, on a virtual clock: buckets, marking, the defence period, the
//! connection limits and the sweep.

use std::net::Ipv4Addr;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn cc_on() -> DosConfig {
    DosConfig {
        circuit_creation: CircuitCreationConfig {
            enabled: true,
            ..CircuitCreationConfig::default()
        },
        ..DosConfig::default()
    }
}

/// A guard with `cfg` where `addr` has `conns` client connections open.
fn guard_with(cfg: DosConfig, addr: IpAddr, conns: u32, now: Instant) -> (DosGuard, StdRng) {
    let mut g = DosGuard::new(cfg);
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..conns {
        assert!(g.client_connected(addr, now, &mut rng));
    }
    (g, rng)
}

/// One CREATE2 as the core handles it: counted, then judged.
fn create(g: &mut DosGuard, addr: IpAddr, now: Instant, rng: &mut StdRng) -> bool {
    g.on_create(addr, now, rng);
    !g.refuse_create(addr, now)
}

/// Tor's own test: burst - 1 CREATE2s pass at once, the one that empties the bucket is refused
/// (the address is marked by it), and so is everything after it.
#[test]
fn a_flood_is_refused_once_the_burst_is_spent() {
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cc_on(), A, 3, t0);
    for i in 0..89 {
        assert!(create(&mut g, A, t0, &mut rng), "CREATE2 {i} passes");
    }
    assert!(
        !create(&mut g, A, t0, &mut rng),
        "the 90th empties the bucket"
    );
    assert!(!create(&mut g, A, t0, &mut rng));
    let s = g.stats();
    assert_eq!((s.addresses_marked, s.circuits_refused), (1, 2));
}

/// Below `DoSCircuitCreationMinConnections` an address is never marked, however fast it
/// creates (one client connection is what every honest client has).
#[test]
fn fewer_connections_than_the_minimum_are_never_marked() {
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cc_on(), A, 2, t0);
    for _ in 0..1000 {
        assert!(create(&mut g, A, t0, &mut rng));
    }
    assert_eq!(g.stats().addresses_marked, 0);
    // A third connection makes the empty bucket count.
    g.client_connected(A, t0, &mut rng);
    assert!(!create(&mut g, A, t0, &mut rng));
}

/// The bucket refills at `DoSCircuitCreationRate` per whole second: with burst 10 and rate 3,
/// after 2.5 s of an empty bucket 6 tokens are back (the half second carries over).
#[test]
fn the_bucket_refills_at_the_rate_in_whole_seconds() {
    let mut cfg = cc_on();
    cfg.circuit_creation.burst = 10;
    cfg.circuit_creation.rate = 3;
    cfg.circuit_creation.min_connections = 100; // never marked: watch the bucket only
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cfg, A, 1, t0);
    for _ in 0..10 {
        g.on_create(A, t0, &mut rng);
    }
    let tokens = |g: &DosGuard| g.addrs[&A].circuits.tokens;
    assert_eq!(tokens(&g), 0);
    g.on_create(A, t0 + Duration::from_millis(2500), &mut rng);
    assert_eq!(tokens(&g), 6 - 1);
    // The remaining half second plus half a second more is one more second: 3 tokens.
    g.on_create(A, t0 + secs(3), &mut rng);
    assert_eq!(tokens(&g), 5 + 3 - 1);
    // Never above the burst.
    g.on_create(A, t0 + secs(1000), &mut rng);
    assert_eq!(tokens(&g), 10 - 1);
}

/// An honest address keeps building while another is refused: the state is per address.
#[test]
fn an_honest_address_is_not_affected() {
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cc_on(), A, 3, t0);
    g.client_connected(B, t0, &mut rng);
    for _ in 0..200 {
        create(&mut g, A, t0, &mut rng);
    }
    assert!(!create(&mut g, A, t0, &mut rng));
    // B builds a circuit every 10 s for a while, far below the rate.
    for i in 0..30 {
        assert!(create(&mut g, B, t0 + secs(10 * i), &mut rng));
    }
}

/// The defence lasts `DoSCircuitCreationDefenseTimePeriod` plus up to half again, then ends:
/// an address that stopped flooding builds again (its bucket has refilled meanwhile).
#[test]
fn the_defence_ends_after_its_time_period() {
    let mut cfg = cc_on();
    cfg.circuit_creation.defense_time = secs(100);
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cfg, A, 3, t0);
    while create(&mut g, A, t0, &mut rng) {}
    // Refused through the whole period, even though tokens came back.
    assert!(g.refuse_create(A, t0 + secs(100)));
    assert!(
        !g.refuse_create(A, t0 + secs(151)),
        "over after 1.5 periods"
    );
    assert!(create(&mut g, A, t0 + secs(151), &mut rng));
}

/// A client that keeps creating while marked stays marked (Tor re-marks at every CREATE2 with
/// an empty bucket).
#[test]
fn flooding_while_marked_extends_the_defence() {
    let mut cfg = cc_on();
    cfg.circuit_creation.defense_time = secs(100);
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cfg, A, 3, t0);
    let mut t = t0;
    // Faster than the rate (3/s) for 300 s: the bucket never fills.
    while t < t0 + secs(300) {
        for _ in 0..10 {
            create(&mut g, A, t, &mut rng);
        }
        t += secs(1);
    }
    assert!(g.refuse_create(A, t0 + secs(350)));
    assert_eq!(g.stats().addresses_marked, 1, "one mark, extended");
}

/// Defence type 1 (none) detects and counts but refuses nothing.
#[test]
fn defence_type_none_only_counts() {
    let mut cfg = cc_on();
    cfg.circuit_creation.defense = DefenseType::None;
    cfg.connection = ConnectionConfig {
        enabled: true,
        max_concurrent: 1,
        defense: DefenseType::None,
        ..ConnectionConfig::default()
    };
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cfg, A, 3, t0);
    for _ in 0..200 {
        assert!(create(&mut g, A, t0, &mut rng));
    }
    assert!(g.allow_connection(A, t0));
    let s = g.stats();
    assert_eq!(s.addresses_marked, 1);
    assert!(s.circuits_refused > 0 && s.connections_refused_concurrent == 1);
}

/// Everything off (the default): nothing is tracked, nothing refused.
#[test]
fn disabled_defences_track_nothing() {
    let t0 = Instant::now();
    let mut g = DosGuard::new(DosConfig::default());
    let mut rng = StdRng::seed_from_u64(1);
    assert!(!g.client_connected(A, t0, &mut rng));
    for _ in 0..1000 {
        assert!(create(&mut g, A, t0, &mut rng));
        assert!(g.allow_connection(A, t0));
    }
    assert_eq!(g.stats(), DosStats::default());
}

fn conn_on(max_concurrent: u32) -> DosConfig {
    DosConfig {
        connection: ConnectionConfig {
            enabled: true,
            max_concurrent,
            ..ConnectionConfig::default()
        },
        ..DosConfig::default()
    }
}

/// `DoSConnectionMaxConcurrentCount`: refused once more than the maximum are open (Tor's `>`),
/// allowed again when one closes.
#[test]
fn too_many_concurrent_connections_are_refused() {
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(conn_on(5), A, 5, t0);
    assert!(g.allow_connection(A, t0), "5 open: a 6th may come");
    g.client_connected(A, t0, &mut rng);
    assert!(!g.allow_connection(A, t0), "6 open: refused");
    assert!(
        g.allow_connection(B, t0),
        "other addresses are not affected"
    );
    g.client_disconnected(A, t0);
    assert!(g.allow_connection(A, t0));
    assert_eq!(g.stats().connections_refused_concurrent, 1);
}

/// `DoSConnectionConnectRate` / `Burst`: the connection that empties the bucket marks the
/// address for `DoSConnectionConnectDefenseTimePeriod` (plus up to half again); then it may not
/// connect at all, even with no connection open.
#[test]
fn connecting_too_fast_marks_the_address() {
    let mut cfg = conn_on(1000);
    cfg.connection.connect_defense_time = secs(60);
    let t0 = Instant::now();
    let (mut g, mut rng) = guard_with(cfg, A, 39, t0);
    assert!(g.allow_connection(A, t0));
    g.client_connected(A, t0, &mut rng);
    for _ in 0..40 {
        g.client_disconnected(A, t0);
    }
    assert!(!g.allow_connection(A, t0 + secs(60)));
    assert!(g.allow_connection(A, t0 + secs(91)), "the mark ran out");
    assert_eq!(g.stats().connections_refused_rate, 1);
    // 20 per second is allowed without a mark.
    for i in 0..100 {
        let t = t0 + secs(100) + Duration::from_millis(50 * i);
        assert!(g.allow_connection(A, t), "connection {i}");
        g.client_connected(A, t, &mut rng);
        g.client_disconnected(A, t);
    }
}

/// Idle addresses are forgotten once their buckets are full again; busy, marked or
/// not-yet-refilled ones are kept.
#[test]
fn the_sweep_forgets_idle_addresses_only() {
    let t0 = Instant::now();
    let mut cfg = cc_on();
    cfg.connection.enabled = true;
    let (mut g, mut rng) = guard_with(cfg, A, 3, t0);
    g.client_connected(B, t0, &mut rng);
    let c = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
    g.client_connected(c, t0, &mut rng);
    while create(&mut g, A, t0, &mut rng) {}
    for _ in 0..3 {
        g.client_disconnected(A, t0);
    }
    g.client_disconnected(c, t0);
    // At 61 s a new address D connects, and the sweep runs: A is marked for an hour or more,
    // B still has its connection, C is idle with full buckets again.
    let d = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 4));
    g.client_connected(d, t0 + secs(61), &mut rng);
    assert_eq!(g.stats().tracked_addresses, 3, "C is gone");
    assert!(g.addrs.contains_key(&A) && g.addrs.contains_key(&B) && !g.addrs.contains_key(&c));
    // Long after A's mark: A and a closed B are forgotten, D (open) stays until it closes.
    g.client_disconnected(B, t0 + secs(3 * 3600));
    assert_eq!(g.stats().tracked_addresses, 1);
    g.client_disconnected(d, t0 + secs(4 * 3600));
    assert_eq!(g.stats().tracked_addresses, 0);
}

#[test]
fn stats_since_counts_growth_and_keeps_the_gauge() {
    let earlier = DosStats {
        circuits_refused: 5,
        streams_refused: 2,
        tracked_addresses: 9,
        ..DosStats::default()
    };
    let now = DosStats {
        circuits_refused: 8,
        streams_refused: 1, // shrank (never does): saturates
        connections_refused_rate: 4,
        tracked_addresses: 3,
        ..DosStats::default()
    };
    assert_eq!(
        now.since(&earlier),
        DosStats {
            circuits_refused: 3,
            connections_refused_rate: 4,
            tracked_addresses: 3,
            ..DosStats::default()
        }
    );
}
