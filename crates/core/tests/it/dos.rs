//! The DoS defences through a relay core: CREATE2 cells from a flooding address are answered
//! with DESTROY (RESOURCELIMIT) once its bucket is spent, an honest address and an
//! authenticated relay keep building, the defence ends after its time period, and the
//! connection defence answers `allow_connection`. Virtual clock.

use crate::common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use chive_cell::{CellCommand, DestroyReason};
use chive_core::dos::{CircuitCreationConfig, ConnectionConfig, DosConfig};
use chive_core::{ChannelId, CoreConfig};
use common::{create2_cell, destroys, drain, relay, Relay};
use rand::rngs::StdRng;
use rand::SeedableRng;

const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));
const HONEST: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7));

/// What a CREATE2 got.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Created,
    Destroyed(DestroyReason),
}

struct Bench {
    r: Relay,
    now: Instant,
    rng: StdRng,
    next_id: u32,
}

impl Bench {
    fn new(dos: DosConfig) -> Bench {
        Bench {
            r: relay(
                1,
                CoreConfig {
                    dos,
                    ..CoreConfig::default()
                },
            ),
            now: Instant::now(),
            rng: StdRng::seed_from_u64(5),
            next_id: 1,
        }
    }

    /// A client channel (no identity) accepted from `addr`.
    fn client_channel(&mut self, chan: u64, addr: IpAddr) -> ChannelId {
        let chan = ChannelId(chan);
        self.r.core.channel_opened(chan, None, false, self.now);
        self.r.core.set_channel_addr(chan, addr, false, self.now);
        chan
    }

    /// A channel from the relay `peer` (a proven identity) accepted from `addr`; `known`: the
    /// consensus lists it.
    fn relay_channel(
        &mut self,
        chan: u64,
        peer: chive_crypto::IdentityKey,
        addr: IpAddr,
        known: bool,
    ) {
        let chan = ChannelId(chan);
        self.r
            .core
            .channel_opened(chan, Some(peer), false, self.now);
        self.r.core.set_channel_addr(chan, addr, known, self.now);
    }

    /// Send one CREATE2 on `chan` (opened by the peer, so its ids have the high bit set).
    fn create(&mut self, chan: ChannelId) -> Answer {
        let id = 0x8000_0000 | self.next_id;
        self.next_id += 1;
        let (cell, _) = create2_cell(&mut self.rng, &self.r, id);
        self.r.core.handle_cell(chan, cell, self.now);
        let out = drain(&mut self.r.core, chan, self.now);
        match (out.as_slice(), destroys(&out).as_slice()) {
            ([c], []) if c.command == CellCommand::CREATED2 && c.circ_id == id => Answer::Created,
            ([_], [(got, reason)]) if *got == id => Answer::Destroyed(*reason),
            _ => panic!("unexpected answer {out:?}"),
        }
    }
}

/// The connection defence on, at most `max_concurrent` client channels per address.
fn conn(max_concurrent: u32) -> DosConfig {
    DosConfig {
        connection: ConnectionConfig {
            enabled: true,
            max_concurrent,
            ..ConnectionConfig::default()
        },
        ..DosConfig::default()
    }
}

fn cc(burst: u32, rate: u32, defense_time: u64) -> DosConfig {
    DosConfig {
        circuit_creation: CircuitCreationConfig {
            enabled: true,
            burst,
            rate,
            defense_time: Duration::from_secs(defense_time),
            ..CircuitCreationConfig::default()
        },
        ..DosConfig::default()
    }
}

/// A flooder on three connections gets burst - 1 circuits, then DESTROY (RESOURCELIMIT)
/// without a circuit being made; an honest address and a relay from the same address as the
/// flooder keep building; after the defence period the flooder builds again.
#[test]
fn a_create2_flood_is_refused_and_others_keep_building() {
    let mut b = Bench::new(cc(10, 1, 60));
    let flood: Vec<ChannelId> = (10..13).map(|c| b.client_channel(c, FLOODER)).collect();
    let honest = b.client_channel(20, HONEST);
    // A relay (authenticated identity) behind the flooder's address: not limited.
    let peer = relay(3, CoreConfig::default()).hop.identity;
    let relay_chan = ChannelId(30);
    b.r.core
        .channel_opened(relay_chan, Some(peer), false, b.now);
    b.r.core.set_channel_addr(relay_chan, FLOODER, true, b.now);

    for i in 0..9 {
        assert_eq!(b.create(flood[i % 3]), Answer::Created, "CREATE2 {i}");
    }
    for i in 0..50 {
        assert_eq!(
            b.create(flood[i % 3]),
            Answer::Destroyed(DestroyReason::RESOURCELIMIT),
            "flood CREATE2 {i}"
        );
        if i % 10 == 0 {
            assert_eq!(b.create(honest), Answer::Created);
            assert_eq!(b.create(relay_chan), Answer::Created);
        }
    }
    let stats = b.r.core.stats();
    assert_eq!(
        stats.circuits,
        9 + 5 + 5,
        "refused CREATE2s made no circuit"
    );
    assert_eq!(stats.circuits_killed, 0);
    let dos = b.r.core.dos_stats();
    assert_eq!((dos.addresses_marked, dos.circuits_refused), (1, 50));

    // The flooder stops. Within the period it is still refused; after 1.5 periods it builds.
    b.now += Duration::from_secs(60);
    assert_eq!(
        b.create(flood[0]),
        Answer::Destroyed(DestroyReason::RESOURCELIMIT)
    );
    b.now += Duration::from_secs(31);
    assert_eq!(b.create(flood[0]), Answer::Created);
}

/// An address that builds at the rate is never refused, however long it goes on, even with
/// many connections.
#[test]
fn building_at_the_rate_is_never_refused() {
    let mut b = Bench::new(cc(10, 1, 60));
    let chans: Vec<ChannelId> = (10..15).map(|c| b.client_channel(c, HONEST)).collect();
    for i in 0..300 {
        assert_eq!(b.create(chans[i % 5]), Answer::Created, "CREATE2 {i}");
        b.now += Duration::from_secs(1);
    }
    assert_eq!(b.r.core.dos_stats().circuits_refused, 0);
}

/// Closing channels lowers the address's count: with fewer than
/// `DoSCircuitCreationMinConnections` open, an empty bucket no longer marks it.
#[test]
fn closed_channels_stop_counting() {
    let mut b = Bench::new(cc(5, 1, 60));
    let chans: Vec<ChannelId> = (10..13).map(|c| b.client_channel(c, FLOODER)).collect();
    b.r.core.channel_closed(chans[1], b.now);
    for _ in 0..30 {
        assert_eq!(b.create(chans[0]), Answer::Created);
    }
    assert_eq!(b.r.core.dos_stats().addresses_marked, 0);
}

/// The connection defence through the core: over `DoSConnectionMaxConcurrentCount` client
/// channels from one address, `allow_connection` says no; relays' channels do not count.
#[test]
fn allow_connection_counts_client_channels_per_address() {
    let mut b = Bench::new(conn(2));
    let peer = relay(3, CoreConfig::default()).hop.identity;
    for c in 30..35 {
        b.relay_channel(c, peer, FLOODER, true);
    }
    assert!(b.r.core.allow_connection(FLOODER, b.now));
    for c in 10..13 {
        b.client_channel(c, FLOODER);
    }
    assert!(!b.r.core.allow_connection(FLOODER, b.now));
    assert!(b.r.core.allow_connection(HONEST, b.now));
    b.r.core.channel_closed(ChannelId(10), b.now);
    assert!(b.r.core.allow_connection(FLOODER, b.now));
}

/// A proven identity alone exempts nobody: the driver says which channels come from known
/// relays (listed in the consensus). A self-made "relay" is counted as a client until a
/// consensus lists it; then it stops counting.
#[test]
fn only_known_relays_are_exempt() {
    let mut b = Bench::new(conn(2));
    let stranger = relay(4, CoreConfig::default()).hop.identity;
    for c in 40..43 {
        b.relay_channel(c, stranger, FLOODER, false);
        assert!(b.r.core.channel_dos_tracked(ChannelId(c)));
    }
    assert!(!b.r.core.allow_connection(FLOODER, b.now));
    // A newer consensus lists it: its channels no longer count.
    b.r.core.set_channel_known_relay(ChannelId(40), b.now);
    assert!(!b.r.core.channel_dos_tracked(ChannelId(40)));
    assert!(b.r.core.allow_connection(FLOODER, b.now));
    // Untracking twice, or closing afterwards, does not count the address down again.
    b.r.core.set_channel_known_relay(ChannelId(40), b.now);
    b.r.core.channel_closed(ChannelId(40), b.now);
    b.client_channel(50, FLOODER);
    assert!(!b.r.core.allow_connection(FLOODER, b.now));
}

/// `DoSRefuseSingleHopClientRendezvous`: a rendezvous point drops, silently and counted, an
/// ESTABLISH_RENDEZVOUS on a circuit a client built straight to it; one that came through
/// another relay is served; off (the default), the single-hop one is served too.
#[test]
fn single_hop_rendezvous_is_dropped_when_refused() {
    use chive_cell::RelayCommand;
    use common::{Circ, Path};

    /// `circ` asks its hop `hop` to be a rendezvous point (the cookie: 20 bytes `cookie`).
    fn establish(p: &mut Path, circ: &mut Circ, hop: usize, cookie: u8) {
        let cmd = RelayCommand::ESTABLISH_RENDEZVOUS;
        p.send(circ, hop, cmd, 0, &[cookie; 20], false);
    }

    let on = DosConfig {
        refuse_single_hop_rendezvous: true,
        ..DosConfig::default()
    };
    let mut p = Path::new(CoreConfig::default());
    p.r.core.set_dos_config(on);
    p.x.core.set_dos_config(on);
    // One hop: client → R. R drops it, answers nothing, keeps the circuit.
    let mut one = p.create();
    establish(&mut p, &mut one, 0, 7);
    assert!(p.read(&mut one).is_empty(), "a silent drop");
    assert_eq!(p.r.core.dos_stats().single_hop_refused, 1);
    assert_eq!(p.r.core.stats().circuits, 1, "the circuit is still up");
    // Two hops: X sees it from R, a relay: served.
    let mut two = p.create2();
    establish(&mut p, &mut two, 1, 8);
    p.r_to_x();
    p.x_to_r();
    let got: Vec<_> = p.read(&mut two).into_iter().map(|m| m.cmd).collect();
    assert_eq!(got, [RelayCommand::RENDEZVOUS_ESTABLISHED]);
    assert_eq!(p.x.core.dos_stats().single_hop_refused, 0);
    // Off: the single-hop one is served.
    let mut p = Path::new(CoreConfig::default());
    let mut one = p.create();
    establish(&mut p, &mut one, 0, 7);
    let got: Vec<_> = p.read(&mut one).into_iter().map(|m| m.cmd).collect();
    assert_eq!(got, [RelayCommand::RENDEZVOUS_ESTABLISHED]);
    assert_eq!(p.r.core.dos_stats().single_hop_refused, 0);
}
