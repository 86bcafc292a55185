//! Circuit switching, path variant, at the client, cell by cell: a real client core in front of a
//! fake one-hop relay (the test answers CREATE2 with ntor and holds the relay's crypto), so the
//! test can send the client what no honest exit or entry would. Each unexpected or malformed
//! message closes its circuit (or, for a confirmation of a number never sent, the linked set).

use std::time::{Duration, Instant};

use chive_cell::{
    parse_relay, relay_payload, Cell, CellCommand, ConfluxLink, Create2, RelayCommand,
    SwitchConfirm, PAYLOAD_LEN,
};
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event};
use chive_crypto::relay::RelayHopCrypto;

use crate::common::{drain, PlayedRelay};

/// A client core in front of a one-hop relay the test plays.
pub(crate) struct Fake {
    pub(crate) core: Core,
    relay: PlayedRelay,
    pub(crate) now: Instant,
    /// The relay side of each circuit: (client's circuit, its id, the hop's crypto).
    circs: Vec<(CircKey, u32, RelayHopCrypto)>,
}

impl Fake {
    pub(crate) fn new() -> Fake {
        let now = Instant::now();
        let mut core = Core::new(CoreConfig::default(), [7; 32]);
        let relay = PlayedRelay::facing(&mut core, ChannelId(1), 5, 9200, now);
        Fake {
            core,
            relay,
            now,
            circs: Vec::new(),
        }
    }

    /// A one-hop circuit, built.
    pub(crate) fn build(&mut self) -> CircKey {
        let key = self
            .core
            .launch_circuit(vec![self.relay.hop.clone()], self.now);
        let (id, body) = self.relay.take_create2(&mut self.core, self.now);
        let km = self.relay.answer(&mut self.core, id, &body, None, self.now);
        assert!(self.events().contains(&Event::CircuitBuilt { circ: key }));
        self.circs.push((key, id, RelayHopCrypto::new(&km)));
        key
    }

    pub(crate) fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.core.poll_event()).collect()
    }

    fn hop(&mut self, key: CircKey) -> &mut (CircKey, u32, RelayHopCrypto) {
        self.circs.iter_mut().find(|c| c.0 == key).unwrap()
    }

    /// The relay messages the client sent on `key` since the last call.
    pub(crate) fn read(&mut self, key: CircKey) -> Vec<(RelayCommand, Vec<u8>)> {
        let cells = drain(&mut self.core, self.relay.chan, self.now);
        let (_, id, crypto) = self.hop(key);
        let id = *id;
        cells
            .into_iter()
            .filter(|c| c.circ_id == id && c.command == CellCommand::RELAY)
            .map(|c| {
                let mut p: [u8; PAYLOAD_LEN] = c.payload;
                assert!(crypto.decrypt_forward(&mut p));
                let m = parse_relay(&p).unwrap();
                (m.command, m.data.to_vec())
            })
            .collect()
    }

    /// The fake relay sends `cmd` to the client on `key`.
    pub(crate) fn send(&mut self, key: CircKey, cmd: RelayCommand, body: &[u8]) {
        let mut payload = relay_payload(cmd, 0, body).unwrap();
        let (_, id, crypto) = self.hop(key);
        crypto.originate_backward(&mut payload);
        let cell = Cell::from_payload(*id, CellCommand::RELAY, payload);
        let now = self.now;
        self.core.handle_cell(self.relay.chan, cell, now);
    }

    pub(crate) fn closed(&mut self, key: CircKey) -> bool {
        self.events()
            .iter()
            .any(|e| matches!(e, Event::CircuitClosed { circ, .. } if *circ == key))
    }

    /// Home and spare, both linked (LINKED echoed by the fake exit).
    pub(crate) fn linked(&mut self) -> (CircKey, CircKey, Vec<u8>) {
        let home = self.build();
        self.core.path_link(home, self.now).unwrap();
        let msgs = self.read(home);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].0, RelayCommand::CONFLUX_LINK);
        let link = msgs[0].1.clone();
        // The home's LINK takes 50 ms, the spare's none: the spare does not measure heavier,
        // so a CONGESTED on the home moves the upload (`SwitchSettings::lighter_leg_only`).
        self.now += Duration::from_millis(50);
        self.send(home, RelayCommand::CONFLUX_LINKED, &link);
        let spare = self.build();
        self.core.path_add_spare(home, spare, self.now).unwrap();
        assert_eq!(
            self.read(spare),
            vec![(RelayCommand::CONFLUX_LINK, link.clone())]
        );
        self.send(spare, RelayCommand::CONFLUX_LINKED, &link);
        assert_eq!(self.core.path_set_of(home), Some(Some(spare)));
        (home, spare, link)
    }
}

#[test]
fn a_linked_with_another_nonce_closes_the_spare() {
    let mut f = Fake::new();
    let home = f.build();
    f.core.path_link(home, f.now).unwrap();
    f.read(home);
    let spare = f.build();
    f.core.path_add_spare(home, spare, f.now).unwrap();
    let other = ConfluxLink {
        nonce: [9; 32],
        last_seqno_sent: 0,
        last_seqno_recv: 0,
        desired_ux: 0,
    }
    .encode();
    f.send(spare, RelayCommand::CONFLUX_LINKED, &other);
    assert!(f.closed(spare));
    assert_eq!(f.core.path_set_of(home), Some(None));
}

#[test]
fn unexpected_confirmations_close_the_circuit_or_the_set() {
    // On a circuit that is not linked.
    let mut f = Fake::new();
    let (_home, _spare, _) = f.linked();
    let lone = f.build();
    f.send(
        lone,
        RelayCommand::SWITCH_CONFIRM,
        &SwitchConfirm { seq: 0 }.encode(),
    );
    assert!(f.closed(lone));
    // Malformed.
    let mut f = Fake::new();
    let (home, _spare, _) = f.linked();
    f.send(home, RelayCommand::SWITCH_CONFIRM, &[1, 2]);
    assert!(f.closed(home));
    // A number never sent: the set fails, both legs close.
    let mut f = Fake::new();
    let (home, spare, _) = f.linked();
    f.send(
        home,
        RelayCommand::SWITCH_CONFIRM,
        &SwitchConfirm { seq: 99 }.encode(),
    );
    let ev = f.events();
    for c in [home, spare] {
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::CircuitClosed { circ, .. } if *circ == c)),
            "{c:?} not closed: {ev:?}"
        );
    }
    assert!(f.core.switch_stats().violations >= 1);
}

#[test]
fn malformed_or_repeated_path_messages_close_the_circuit() {
    // CONGESTED without its reason byte.
    let mut f = Fake::new();
    let (home, _spare, _) = f.linked();
    f.send(home, RelayCommand::CONGESTED, &[]);
    assert!(f.closed(home));
    // LINKED again on a linked spare.
    let mut f = Fake::new();
    let (_home, spare, link) = f.linked();
    f.send(spare, RelayCommand::CONFLUX_LINKED, &link);
    assert!(f.closed(spare));
    // LINKED on a circuit that never sent LINK.
    let mut f = Fake::new();
    let lone = f.build();
    f.send(lone, RelayCommand::CONFLUX_LINKED, &[0; 50]);
    assert!(f.closed(lone));
    // A LINK or SWITCH sent toward the client.
    for cmd in [RelayCommand::CONFLUX_LINK, RelayCommand::CONFLUX_SWITCH] {
        let mut f = Fake::new();
        let (home, _spare, _) = f.linked();
        f.send(home, cmd, &[0; 50]);
        assert!(f.closed(home), "{cmd}");
    }
}

#[test]
fn congested_moves_the_next_cell_to_the_spare_with_a_switch() {
    let mut f = Fake::new();
    let (home, spare, _) = f.linked();
    let s = f.core.open_stream(home, "127.0.0.1", 80, f.now).unwrap();
    assert_eq!(f.read(home)[0].0, RelayCommand::BEGIN);
    f.send(home, RelayCommand::CONGESTED, &[0]);
    assert_eq!(f.core.path_current_leg(home), Some(spare));
    // The stream's END (the next multiplexed cell) goes on the spare behind a SWITCH that
    // jumps the spare's counter past the BEGIN.
    f.core.stream_error(s, f.now);
    let got = f.read(spare);
    assert_eq!(
        got.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![RelayCommand::CONFLUX_SWITCH, RelayCommand::END]
    );
    assert_eq!(got[0].1, 1u32.to_be_bytes());
}

#[test]
fn congested_from_a_hop_other_than_the_entry_closes_the_circuit() {
    // Client → R (a real relay core) → F (a fake last hop held by the test), so a relay that
    // is not the entry can send CONGESTED.
    let (c_to_r, r_from_c, r_to_f) = (ChannelId(1), ChannelId(1), ChannelId(2));
    let mut r = crate::common::relay(3, CoreConfig::default());
    let now = Instant::now();
    let mut client = Core::new(CoreConfig::default(), [8; 32]);
    client.channel_opened(c_to_r, Some(r.hop.identity), true, now);
    r.core.channel_opened(r_from_c, None, false, now);
    let mut f = PlayedRelay::facing(&mut r.core, r_to_f, 6, 9201, now);
    let circ = client.launch_circuit(vec![r.hop.clone(), f.hop.clone()], now);
    let mut f_side = None;
    for _ in 0..10 {
        for cell in drain(&mut client, c_to_r, now) {
            r.core.handle_cell(r_from_c, cell, now);
        }
        for cell in drain(&mut r.core, r_from_c, now) {
            client.handle_cell(c_to_r, cell, now);
        }
        for cell in drain(&mut r.core, r_to_f, now) {
            if cell.command == CellCommand::CREATE2 {
                let body = Create2::decode(&cell.payload).unwrap();
                let km = f.answer(&mut r.core, cell.circ_id, &body, None, now);
                f_side = Some((cell.circ_id, RelayHopCrypto::new(&km)));
            }
        }
    }
    let events: Vec<Event> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(events.contains(&Event::CircuitBuilt { circ }), "{events:?}");
    let (id, mut crypto) = f_side.expect("R extended to F");
    let mut payload = relay_payload(RelayCommand::CONGESTED, 0, &[0]).unwrap();
    crypto.originate_backward(&mut payload);
    r.core.handle_cell(
        r_to_f,
        Cell::from_payload(id, CellCommand::RELAY, payload),
        now,
    );
    for cell in drain(&mut r.core, r_from_c, now) {
        client.handle_cell(c_to_r, cell, now);
    }
    let events: Vec<Event> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CircuitClosed { circ: c, .. } if *c == circ)),
        "{events:?}"
    );
    assert_eq!(client.switch_stats().violations, 1);
}
