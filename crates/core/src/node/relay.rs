//! Relay cells: counting RELAY_EARLY, adding or removing this node's layer of tor1 crypto,
//! passing cells on, dispatching those recognized here, and originating relay cells (toward
//! the client at a relay, to any hop at the client).

use std::time::Instant;

use chive_cell::{
    parse_relay, relay_payload, wire_circ_id, Cell, CellCommand, DestroyReason, Extend2, Extended2,
    RelayCommand, CELL_LEN, PAYLOAD_LEN,
};
use tracing::debug;

use crate::{ChannelId, CircKey};

use super::circuit::{Role, Side};
use super::event::Event;
use super::queue::{QueueCell, WireCell};
use super::Core;

/// RELAY_EARLY cells allowed per circuit (tor-spec).
const MAX_RELAY_EARLY: u8 = 8;

impl Core {
    /// A relay cell, by reference: passed on, it is copied once, into its queue.
    pub(super) fn on_relay(&mut self, chan: ChannelId, cell: &mut Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            debug!(
                ?chan,
                circ_id = cell.circ_id,
                "relay cell for unknown circuit: dropped"
            );
            return;
        };
        // A client past its queue cap: its cell waits at this entry (`client_hold.rs`).
        if self.hold_upstream(chan, key, cell.circ_id, || cell.clone(), now) {
            return;
        }
        self.relay_in(chan, key, cell, now);
    }

    /// A relay cell a relay passes on, from its wire bytes as read (`wire`, a RELAY or
    /// RELAY_EARLY cell): copied once, into its slot in the circuit queue it leaves by, and its
    /// onion layer applied there (no decoded `Cell` on the way). Returns false, having done
    /// nothing, for the cells [`Core::on_relay`] must see decoded: unknown circuits, the
    /// client's, the last hop's forward cells (recognized there), inbound RELAY_EARLY.
    pub(super) fn relay_wire(
        &mut self,
        chan: ChannelId,
        wire: &[u8; CELL_LEN],
        now: Instant,
    ) -> bool {
        let circ_id = wire_circ_id(wire);
        let early = wire[4] == CellCommand::RELAY_EARLY.0;
        let Some(key) = self.lookup(chan, circ_id) else {
            return false;
        };
        let Some(circ) = self.circuits.get(&key) else {
            return false;
        };
        if circ.is_origin() {
            return false;
        }
        // The direction is the end the cell's id names (see `relay_in`).
        let from_prev = circ.prev == Some((chan, circ_id));
        let side = if from_prev { Side::Next } else { Side::Prev };
        let Some((_, out_id)) = circ.endpoint(side) else {
            return false;
        };
        if early && !from_prev {
            return false;
        }
        self.stats.cells_received += 1;
        let decoded = || Cell::from_wire(wire);
        if self.hold_upstream(chan, key, circ_id, decoded, now) {
            return true;
        }
        let Some(circ) = self.circuits.get_mut(&key) else {
            return true;
        };
        circ.sw.recv[usize::from(!from_prev)] += 1;
        if early {
            circ.relay_early_seen += 1;
            if circ.relay_early_seen > MAX_RELAY_EARLY {
                self.kill(key, "too many RELAY_EARLY cells", now);
                return true;
            }
        }
        self.stats.cells_in_place += 1;
        let fill = |role: &mut Role, slot: &mut [u8; CELL_LEN]| {
            WireCell {
                wire,
                circ_id: out_id,
            }
            .write_to(slot);
            let Role::Relay { crypto, .. } = role else {
                return None;
            };
            let (_, payload) = slot.split_first_chunk_mut::<5>()?;
            let payload: &mut [u8; PAYLOAD_LEN] = payload.try_into().ok()?;
            if !from_prev {
                crypto.encrypt_backward(payload);
                return None;
            }
            // Recognized here (this hop's own cell, e.g. a path command): not passed on.
            crypto
                .decrypt_forward(payload)
                .then(|| (*payload, crypto.last_forward_digest()))
        };
        if let Some((payload, digest)) = self.enqueue_with(key, side, now, fill) {
            self.stats.cells_in_place -= 1;
            self.relay_cell_for_us(key, &payload, digest, early, now);
        }
        true
    }

    /// A relay cell of circuit `key` from `chan`, taken in (now, or let go after being held).
    pub(super) fn relay_in(
        &mut self,
        chan: ChannelId,
        key: CircKey,
        cell: &mut Cell,
        now: Instant,
    ) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        // Both ends of a circuit may be on one channel (a hop extended back to the relay before it):
        // the direction is the end the cell's id names, not its channel.
        let from_prev = circ.prev == Some((chan, cell.circ_id)) && !circ.is_origin();
        // Relay cells per direction on the current connection (circuit switching's markers).
        circ.sw.recv[usize::from(!from_prev)] += 1;
        let early = cell.command == CellCommand::RELAY_EARLY;
        if early && !from_prev {
            // tor-spec §5.6: an inbound RELAY_EARLY MUST close the circuit (C tor does, at
            // relays and clients). Passed on, it would let a relay mark a circuit for a relay
            // nearer the client to see (the 2014 relay-early traffic confirmation attack).
            return self.kill(key, "RELAY_EARLY toward the client", now);
        }
        if early {
            circ.relay_early_seen += 1;
            if circ.relay_early_seen > MAX_RELAY_EARLY {
                return self.kill(key, "too many RELAY_EARLY cells", now);
            }
        }
        match &mut circ.role {
            Role::Relay { crypto, .. } => {
                if from_prev {
                    if crypto.decrypt_forward(&mut cell.payload) {
                        let digest = crypto.last_forward_digest();
                        self.relay_cell_for_us(key, &cell.payload, digest, early, now);
                    } else if let Some((_, next_id)) = circ.next {
                        cell.circ_id = next_id;
                        self.enqueue(key, Side::Next, &*cell, now);
                    } else if let Some(partner) = self.spliced_partner(key) {
                        self.splice_forward(partner, cell, now);
                    } else {
                        self.kill(key, "unrecognized relay cell at the last hop", now);
                    }
                } else {
                    crypto.encrypt_backward(&mut cell.payload);
                    if let Some((_, prev_id)) = circ.prev {
                        cell.circ_id = prev_id;
                        self.enqueue(key, Side::Prev, &*cell, now);
                    }
                }
            }
            Role::Origin { crypto, .. } => match crypto.decrypt_from_any(&mut cell.payload) {
                Some((hop, digest)) => {
                    self.origin_cell_for_us(key, hop, &cell.payload, digest, now)
                }
                None => self.kill(key, "unrecognized relay cell at the client", now),
            },
        }
    }

    /// A forward relay cell recognized at this relay.
    pub(super) fn relay_cell_for_us(
        &mut self,
        key: CircKey,
        payload: &[u8; PAYLOAD_LEN],
        digest: [u8; 20],
        early: bool,
        now: Instant,
    ) {
        let msg = match parse_relay(payload) {
            Ok(m) => m,
            Err(e) => return self.kill(key, &format!("malformed relay cell: {e}"), now),
        };
        let (cmd, sid, data) = (msg.command, msg.stream_id, msg.data);
        if super::path::is_path_command(cmd) {
            return self.path_relay_message(key, cmd, data, now);
        }
        // A leg of a linked set: multiplexed cells are put in order across the legs first
        // (DATA counted in this leg's circuit window); other stream cells act on the home.
        if let Some(set) = self.path_exit_set(key) {
            if super::path::multiplexed(cmd) {
                // The circuit SENDME goes (or is withheld) once the cell is sequenced.
                let mut sendme = None;
                if cmd == RelayCommand::DATA {
                    match self.edge_data_count(key, digest, now) {
                        None => return,
                        Some(d) => sendme = d,
                    }
                }
                return self.path_exit_cell(set, key, cmd, sid, data, sendme, now);
            }
            if sid != 0 {
                if let Some(home) = self.path_home_of(key) {
                    return self.relay_stream_cell(home, cmd, sid, data, now);
                }
            }
        }
        match cmd {
            RelayCommand::EXTEND2 => {
                if !early {
                    return self.kill(key, "EXTEND2 not in a RELAY_EARLY cell", now);
                }
                match Extend2::decode(data) {
                    Ok(ext) => self.on_extend2(key, ext, now),
                    Err(e) => self.kill(key, &format!("malformed EXTEND2: {e}"), now),
                }
            }
            RelayCommand::BEGIN => self.on_begin(key, sid, data, now),
            RelayCommand::RESOLVE => self.on_resolve(key, sid, data, now),
            RelayCommand::DATA => self.edge_data(key, sid, data, digest, now),
            RelayCommand::END => self.edge_end(key, sid, data, now),
            RelayCommand::SENDME => self.edge_sendme(key, sid, data, now),
            RelayCommand::XON | RelayCommand::XOFF => self.edge_xon_xoff(key, cmd, sid, data, now),
            RelayCommand::TRUNCATE => self.on_truncate(key, now),
            RelayCommand::ESTABLISH_INTRO
            | RelayCommand::INTRODUCE1
            | RelayCommand::ESTABLISH_RENDEZVOUS
            | RelayCommand::RENDEZVOUS1 => self.on_onion_request(key, cmd, data, now),
            RelayCommand::DROP => {}
            other => {
                debug!(?key, command = %other, "ignoring relay command");
            }
        }
    }

    /// A stream-level cell that is not sequenced (stream SENDME, XON, XOFF) for a linked
    /// set's home, whichever leg it came on.
    fn relay_stream_cell(
        &mut self,
        home: CircKey,
        cmd: RelayCommand,
        sid: u16,
        data: &[u8],
        now: Instant,
    ) {
        match cmd {
            RelayCommand::SENDME => self.edge_sendme(home, sid, data, now),
            RelayCommand::XON | RelayCommand::XOFF => self.edge_xon_xoff(home, cmd, sid, data, now),
            RelayCommand::DROP => {}
            other => {
                debug!(?home, command = %other, "ignoring relay command on a linked leg");
            }
        }
    }

    /// A backward relay cell recognized at the client, from hop `hop`.
    pub(super) fn origin_cell_for_us(
        &mut self,
        key: CircKey,
        hop: usize,
        payload: &[u8; PAYLOAD_LEN],
        digest: [u8; 20],
        now: Instant,
    ) {
        let msg = match parse_relay(payload) {
            Ok(m) => m,
            Err(e) => return self.kill(key, &format!("malformed relay cell: {e}"), now),
        };
        let (cmd, sid, data) = (msg.command, msg.stream_id, msg.data);
        let last_hop = self.circuits.get(&key).and_then(|c| match &c.role {
            Role::Origin { crypto, .. } => Some(crypto.len().saturating_sub(1)),
            _ => None,
        });
        match cmd {
            RelayCommand::EXTENDED2 => match Extended2::decode(data) {
                Ok(ext) => self.origin_hop_done(key, &ext.handshake, now),
                Err(e) => self.kill(key, &format!("malformed EXTENDED2: {e}"), now),
            },
            RelayCommand::TRUNCATED => {
                self.close_circuit_inner(key, DestroyReason::FINISHED, None, now, "truncated")
            }
            cmd if super::path::is_path_command(cmd) => {
                self.path_client_message(key, hop, last_hop, cmd, data, now)
            }
            _ if Some(hop) != last_hop => {
                self.kill(key, &format!("{cmd} from hop {hop}, not the exit"), now)
            }
            cmd if super::onion::is_onion_reply(cmd) => {
                self.events.push_back(Event::OnionMessage {
                    circ: key,
                    command: cmd,
                    body: data.to_vec(),
                })
            }
            RelayCommand::BEGIN => self.on_service_begin(key, sid, data, now),
            // A leg of a linked set: stream cells act on the home's streams, whichever leg
            // the exit sent them on; circuit-level flow control stays with the leg.
            cmd if sid != 0 && self.path_home_of(key).is_some_and(|h| h != key) => {
                let home = self.path_home_of(key).unwrap_or(key);
                match cmd {
                    RelayCommand::DATA => {
                        if self.edge_data_window(key, digest, now) {
                            self.edge_data_stream(home, sid, data, now)
                        }
                    }
                    RelayCommand::CONNECTED => self.client_connected(home, sid, data, now),
                    RelayCommand::RESOLVED => self.client_resolved(home, sid, data, now),
                    RelayCommand::END => self.edge_end(home, sid, data, now),
                    other => self.relay_stream_cell(home, other, sid, data, now),
                }
            }
            RelayCommand::CONNECTED => self.client_connected(key, sid, data, now),
            RelayCommand::RESOLVED => self.client_resolved(key, sid, data, now),
            RelayCommand::DATA => self.edge_data(key, sid, data, digest, now),
            RelayCommand::END => self.edge_end(key, sid, data, now),
            RelayCommand::SENDME => self.edge_sendme(key, sid, data, now),
            RelayCommand::XON | RelayCommand::XOFF => self.edge_xon_xoff(key, cmd, sid, data, now),
            RelayCommand::DROP => {}
            other => {
                debug!(?key, command = %other, "ignoring relay command");
            }
        }
    }

    /// Originate a relay cell at this relay, toward the client.
    pub(super) fn send_relay_backward(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        now: Instant,
    ) {
        let Ok(mut payload) = relay_payload(cmd, sid, body) else {
            return self.kill(key, "relay message too long", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let (Role::Relay { crypto, edge, .. }, Some((_, prev_id))) = (&mut circ.role, circ.prev)
        else {
            return;
        };
        let digest = crypto.originate_backward(&mut payload);
        if cmd == RelayCommand::DATA {
            if let Some(edge) = edge {
                edge.window.on_data_sent(digest, now);
            }
        }
        let cell = Cell::from_payload(prev_id, CellCommand::RELAY, payload);
        self.enqueue(key, Side::Prev, cell, now);
    }

    /// Originate a relay cell at the client, addressed to hop `hop`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_relay_forward(
        &mut self,
        key: CircKey,
        hop: usize,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        early: bool,
        now: Instant,
    ) {
        let Ok(mut payload) = relay_payload(cmd, sid, body) else {
            return self.kill(key, "relay message too long", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let (Role::Origin { crypto, edge, .. }, Some((_, next_id))) = (&mut circ.role, circ.next)
        else {
            return;
        };
        let digest = match crypto.encrypt_to(hop, &mut payload) {
            Ok(d) => d,
            Err(_) => return self.kill(key, "no such hop", now),
        };
        if cmd == RelayCommand::DATA {
            edge.window.on_data_sent(digest, now);
        }
        let command = if early {
            CellCommand::RELAY_EARLY
        } else {
            CellCommand::RELAY
        };
        let cell = Cell::from_payload(next_id, command, payload);
        self.enqueue(key, Side::Next, cell, now);
    }
}
