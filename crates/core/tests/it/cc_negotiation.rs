//! Per-circuit congestion-control agreement (ntor v3 + proposal 324's extension): both ends
//! of a circuit use what the client asked for and the exit answered, whatever each read in
//! its own consensus. The failure this prevents (paper 003's kept run): an exit without a
//! consensus yet built fixed-window circuits while the client used Vegas with XON/XOFF, sent
//! stream SENDMEs, and the client closed the circuit ("unexpected stream SENDME").

use std::time::Instant;

use chive_cell::{CellCommand, CircExt, DestroyReason};
use chive_core::cc::{CcKind, VegasParams};
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event};
use chive_crypto::ntor_v3::{self, CIRCUIT_VERIFICATION, NTOR_V3_HTYPE};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::common::{create2_v3_cell, destroys, drain, relay, PlayedRelay, R_CLIENT};
use crate::sim::{pattern, Sim};

const CLIENT: usize = 0;
const EXIT: usize = 3;
fn vegas() -> CcKind {
    CcKind::Vegas(VegasParams::default())
}

/// A client with `client_cc` and three exit relays; `relay_consensus`: what the relays'
/// consensus set (`None`: they have none yet).
fn net(client_cc: CcKind, relay_consensus: Option<CcKind>) -> Sim {
    let cfg = |cc, exit| CoreConfig {
        congestion_control: cc,
        exit,
        ..CoreConfig::default()
    };
    let mut sim = Sim::overlay(11, vec![cfg(client_cc, false)], 3, |_| {
        cfg(CcKind::Fixed, true)
    });
    if let Some(kind) = relay_consensus {
        for n in 1..=3 {
            sim.nodes[n].set_congestion_control(kind);
        }
    }
    sim
}

/// Echo `total` bytes through a three-hop circuit (upload and download); returns the
/// client's circuit and whether the client's and the exit's ends use congestion control.
fn echo(sim: &mut Sim, total: usize) -> (CircKey, bool, bool) {
    let circ = sim.build_through(CLIENT, &[0, 1, 2], 1000);
    let s = sim.open_on(CLIENT, circ, 1000);
    assert!(sim.connected(CLIENT, s), "{:?}", sim.events);
    let streams = [(s, pattern(total, 3))];
    sim.echo_transfer(CLIENT, &streams, 200_000, |_, _| {});
    assert_eq!(sim.killed(), 0, "{:?}", sim.events);
    assert!(
        sim.got(CLIENT, s) == streams[0].1,
        "bytes differ or missing"
    );
    let client = sim.nodes[CLIENT].circuit_uses_congestion_control(circ);
    let exit_circs: Vec<bool> = sim.nodes[EXIT]
        .circuit_stats(sim.now)
        .iter()
        .filter_map(|c| sim.nodes[EXIT].circuit_uses_congestion_control(c.circ))
        .collect();
    assert_eq!(exit_circs.len(), 1);
    (circ, client.unwrap(), exit_circs[0])
}

/// The kept run's failure: the client's consensus says Vegas, the exit has none yet. The exit
/// agrees (default parameters), both ends use Vegas and XON/XOFF, the transfer completes.
#[test]
fn a_vegas_client_and_an_exit_without_a_consensus_agree_and_the_transfer_completes() {
    let mut sim = net(vegas(), None);
    let (_, client, exit) = echo(&mut sim, 600_000);
    assert!(client && exit);
}

/// An exit whose consensus turned congestion control off declines: both ends use the fixed
/// window (and stream SENDMEs), whatever the client's consensus said.
#[test]
fn an_exit_whose_consensus_says_off_declines_and_both_ends_use_the_fixed_window() {
    let mut sim = net(vegas(), Some(CcKind::Fixed));
    let (_, client, exit) = echo(&mut sim, 600_000);
    assert!(!client && !exit);
}

/// A client that does not ask gets the fixed window even through a Vegas exit.
#[test]
fn a_client_that_does_not_ask_gets_the_fixed_window_from_a_vegas_exit() {
    let mut sim = net(CcKind::Fixed, Some(vegas()));
    let (_, client, exit) = echo(&mut sim, 600_000);
    assert!(!client && !exit);
}

/// Both on Vegas by their consensuses: agreed, as before negotiation existed.
#[test]
fn both_on_vegas_agree() {
    let mut sim = net(vegas(), Some(vegas()));
    let (_, client, exit) = echo(&mut sim, 600_000);
    assert!(client && exit);
}

/// A client core building one-hop circuits to a relay the test plays.
struct FakeRelay {
    client: Core,
    relay: PlayedRelay,
    now: Instant,
}

impl FakeRelay {
    fn new(client_cc: CcKind) -> Self {
        let now = Instant::now();
        let mut client = Core::new(
            CoreConfig {
                congestion_control: client_cc,
                ..CoreConfig::default()
            },
            [9; 32],
        );
        let relay = PlayedRelay::facing(&mut client, ChannelId(1), 5, 9300, now);
        FakeRelay { client, relay, now }
    }

    /// Launch a one-hop circuit and answer its CREATE2 with `exts` (raw; `None`: the honest
    /// answer). Returns the circuit, what the CREATE2 asked, and the client's events.
    fn build(&mut self, exts: Option<&[u8]>) -> (CircKey, Vec<CircExt>, Vec<Event>) {
        let key = self
            .client
            .launch_circuit(vec![self.relay.hop.clone()], self.now);
        let (id, body) = self.relay.take_create2(&mut self.client, self.now);
        assert_eq!(
            body.handshake_type, NTOR_V3_HTYPE,
            "the last hop uses ntor v3"
        );
        // What the client asked (the test reads it as the relay would).
        let r = &mut self.relay;
        let opened = ntor_v3::server_open(
            &mut r.rng,
            r.hop.identity.as_bytes(),
            &r.ntor,
            &body.handshake,
            CIRCUIT_VERIFICATION,
        )
        .unwrap();
        let asked = CircExt::decode_list(&opened.message).unwrap();
        self.relay
            .answer(&mut self.client, id, &body, exts, self.now);
        let events = std::iter::from_fn(|| self.client.poll_event()).collect();
        (key, asked, events)
    }
}

fn closed(events: &[Event], key: CircKey) -> Option<&str> {
    events.iter().find_map(|e| match e {
        Event::CircuitClosed { circ, reason, .. } if *circ == key => Some(reason.as_str()),
        _ => None,
    })
}

/// The client asks only when its policy is Vegas, and takes the answer.
#[test]
fn the_client_asks_only_under_vegas_and_follows_the_answer() {
    let mut f = FakeRelay::new(vegas());
    let (key, asked, events) = f.build(None);
    assert_eq!(asked, vec![CircExt::CcRequest]);
    assert!(
        events.contains(&Event::CircuitBuilt { circ: key }),
        "{events:?}"
    );
    assert_eq!(f.client.circuit_uses_congestion_control(key), Some(true));
    // Declined (an empty list): the fixed window.
    let (key, _, events) = f.build(Some(&[0]));
    assert!(
        events.contains(&Event::CircuitBuilt { circ: key }),
        "{events:?}"
    );
    assert_eq!(f.client.circuit_uses_congestion_control(key), Some(false));
    // An unknown extension beside the answer is ignored.
    let (key, _, events) = f.build(Some(&[2, 0x02, 1, 100, 0x7f, 2, 1, 2]));
    assert!(
        events.contains(&Event::CircuitBuilt { circ: key }),
        "{events:?}"
    );
    assert_eq!(f.client.circuit_uses_congestion_control(key), Some(true));

    let mut f = FakeRelay::new(CcKind::Fixed);
    let (key, asked, events) = f.build(None);
    assert_eq!(asked, vec![]);
    assert!(
        events.contains(&Event::CircuitBuilt { circ: key }),
        "{events:?}"
    );
    assert_eq!(f.client.circuit_uses_congestion_control(key), Some(false));
}

/// A CREATED2 that agrees to what was not asked, names another SENDME increment, or is
/// malformed closes that circuit with a protocol error; the client's other circuits live on.
#[test]
fn a_hostile_created2_closes_only_its_circuit() {
    let mut f = FakeRelay::new(CcKind::Fixed);
    let (good, _, _) = f.build(None);
    let (key, _, events) = f.build(Some(&[1, 0x02, 1, 100]));
    let why = closed(&events, key).expect("unasked answer closes the circuit");
    assert!(why.contains("did not ask"), "{why}");

    let mut f2 = FakeRelay::new(vegas());
    for (bad, expect) in [
        (&[1, 0x02, 1, 31][..], "SENDME_INC"),
        (&[1, 0x02, 0][..], "malformed"),
        (&[1, 0x02, 2, 100, 0][..], "malformed"),
        (&[2, 0x02, 1, 100, 0x02, 1, 100][..], "malformed"),
        (&[][..], "malformed"),
        (&[0, 0][..], "malformed"),
    ] {
        let (key, _, events) = f2.build(Some(bad));
        let why = closed(&events, key).unwrap_or_else(|| panic!("{bad:?} not closed"));
        assert!(why.contains(expect), "{bad:?}: {why}");
        assert!(!f2.client.circuit_is_open(key));
    }
    assert!(f.client.circuit_is_open(good));
    assert_eq!(f.client.stats().circuits_killed, 1);
}

/// A relay refuses (DESTROY, protocol) a CREATE2 whose ntor v3 message is not a valid list,
/// and answers the next honest one.
#[test]
fn a_relay_refuses_a_create2_with_malformed_extensions() {
    let mut r = relay(3, CoreConfig::default());
    let now = Instant::now();
    r.core.channel_opened(R_CLIENT, None, false, now);
    let mut rng = StdRng::seed_from_u64(8);
    for (i, msg) in [&[1u8, 0x01, 1, 0][..], &[2, 0x01, 0, 0x01, 0], &[], &[0]]
        .into_iter()
        .enumerate()
    {
        let id = 0x8000_0001 + i as u32;
        let (cell, _) = create2_v3_cell(&mut rng, &r, id, msg);
        r.core.handle_cell(R_CLIENT, cell, now);
        let cells = drain(&mut r.core, R_CLIENT, now);
        if msg == [0] {
            assert_eq!(cells[0].command, CellCommand::CREATED2, "{cells:?}");
        } else {
            assert_eq!(
                destroys(&cells),
                vec![(id, DestroyReason::PROTOCOL)],
                "{msg:?}"
            );
        }
    }
}

/// The agreement counters (`Core::cc_agreement_stats`; Prometheus `chive_cc_*_total`, the
/// `relay` record's `cc_agreement`): every outcome on each side is counted once, a handshake
/// that did not ask is not counted.
#[test]
fn agreement_outcomes_are_counted_on_both_sides() {
    let counts = |c: chive_core::CcAgreementStats| {
        (
            (c.client_agreed, c.client_declined, c.client_refused),
            (c.relay_agreed, c.relay_declined, c.relay_refused),
        )
    };
    // Client side, against a relay the test plays.
    let mut f = FakeRelay::new(vegas());
    f.build(None);
    f.build(Some(&[0]));
    f.build(Some(&[1, 0x02, 1, 31]));
    f.build(Some(&[1, 0x02, 0]));
    assert_eq!(
        counts(f.client.cc_agreement_stats()),
        ((1, 1, 2), (0, 0, 0))
    );
    let mut f = FakeRelay::new(CcKind::Fixed);
    f.build(None);
    f.build(Some(&[1, 0x02, 1, 100]));
    assert_eq!(
        counts(f.client.cc_agreement_stats()),
        ((0, 0, 1), (0, 0, 0))
    );
    // Both sides through real cores: the exit (ntor v3) counts, the earlier hops (ntor v1) not.
    for (consensus, agreed) in [(None, true), (Some(CcKind::Fixed), false)] {
        let mut sim = net(vegas(), consensus);
        echo(&mut sim, 10_000);
        let one = (u64::from(agreed), u64::from(!agreed), 0);
        assert_eq!(
            counts(sim.nodes[CLIENT].cc_agreement_stats()),
            (one, (0, 0, 0))
        );
        assert_eq!(
            counts(sim.nodes[EXIT].cc_agreement_stats()),
            ((0, 0, 0), one)
        );
        for n in 1..EXIT {
            assert_eq!(
                sim.nodes[n].cc_agreement_stats(),
                Default::default(),
                "hop {n}"
            );
        }
    }
    // A relay refusing a malformed list.
    let mut r = relay(3, CoreConfig::default());
    let now = Instant::now();
    r.core.channel_opened(R_CLIENT, None, false, now);
    let mut rng = StdRng::seed_from_u64(8);
    let (cell, _) = create2_v3_cell(&mut rng, &r, 0x8000_0001, &[1, 0x01, 1, 0]);
    r.core.handle_cell(R_CLIENT, cell, now);
    assert_eq!(counts(r.core.cc_agreement_stats()), ((0, 0, 0), (0, 0, 1)));
}
