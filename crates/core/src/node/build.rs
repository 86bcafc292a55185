//! Building circuits: CREATE2 / CREATED2 and EXTEND2 / EXTENDED2 at a relay, TRUNCATE, and an
//! origin circuit's handshakes hop by hop (ntor), with its build deadline.

use std::net::SocketAddr;
use std::time::Instant;

use chive_cell::{
    Cell, CellCommand, Create2, Created2, DestroyReason, Extend2, Extended2, LinkSpec, RelayCommand,
};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
use chive_crypto::IdentityKey;
use tracing::warn;

use crate::flow::CircuitWindow;
use crate::{ChannelId, CircKey};

use super::circuit::{queue_id, Circuit, Role, Side};
use super::config::HopSpec;
use super::event::Event;
use super::queue::CellQueue;
use super::stream::Edge;
use super::switch::SwCounts;
use super::Core;
use crate::CoreError;

/// Longest origin circuit [`Core::extend_circuit`] makes: relays refuse a circuit's ninth
/// RELAY_EARLY cell, and each extension costs one.
pub const MAX_PATH_LEN: usize = 8;

impl Core {
    pub(super) fn on_create2(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let circ_id = cell.circ_id;
        if self.cfg.relay.is_none() {
            warn!(?chan, "CREATE2 sent to a client: refusing");
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        }
        // Counted before any check, as in Tor; refused after the checks that drop the cell.
        let dos_refused = self.dos_create_refused(chan, now);
        let Some(ch) = self.channels.get(&chan) else {
            return;
        };
        // The channel's initiator uses ids with the high bit set, the responder without.
        let peer_high_bit = !ch.initiator;
        if circ_id == 0 || (circ_id & 0x8000_0000 != 0) != peer_high_bit {
            warn!(
                ?chan,
                circ_id, "CREATE2 with an id from the wrong space: refusing"
            );
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        }
        if ch.circ_ids.contains_key(&circ_id) {
            warn!(?chan, circ_id, "CREATE2 for a circuit id in use: refusing");
            return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
        }
        if dos_refused {
            return self.send_destroy(chan, circ_id, DestroyReason::RESOURCELIMIT);
        }
        if ch.circ_ids.len() >= self.cfg.max_circuits_per_channel {
            warn!(?chan, "too many circuits on channel: refusing CREATE2");
            return self.send_destroy(chan, circ_id, DestroyReason::RESOURCELIMIT);
        }
        let create = match Create2::decode(&cell.payload) {
            Ok(c) => c,
            Err(e) => {
                warn!(?chan, error = %e, "malformed CREATE2");
                return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
            }
        };
        let answered = match self.answer_create2(&create) {
            Ok(a) => a,
            Err(e) => {
                warn!(?chan, htype = create.handshake_type, error = %e, "CREATE2 refused");
                return self.send_destroy(chan, circ_id, DestroyReason::PROTOCOL);
            }
        };
        let (reply, km) = (answered.reply, answered.km);
        let key = self.alloc_key();
        let created = Created2 { handshake: reply }.encode();
        self.circuits.insert(
            key,
            Box::new(Circuit {
                prev: Some((chan, circ_id)),
                next: None,
                q_prev: CellQueue::default(),
                q_next: CellQueue::default(),
                cells_sent: 0,
                sw: SwCounts::default(),
                role: Role::Relay {
                    crypto: RelayHopCrypto::new(&km),
                    edge: None,
                    pending_extend: None,
                    extending: false,
                },
                relay_early_seen: 0,
                kh: *km.kh(),
                vegas: answered.vegas,
            }),
        );
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.circ_ids.insert(circ_id, key);
        }
        match created.and_then(|body| Cell::new(circ_id, CellCommand::CREATED2, &body)) {
            Ok(cell) => self.enqueue(key, Side::Prev, cell, now),
            Err(e) => self.kill(key, &format!("cannot encode CREATED2: {e}"), now),
        }
    }

    pub(super) fn on_created2(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            return;
        };
        let created = match Created2::decode(&cell.payload) {
            Ok(c) => c,
            Err(e) => return self.kill(key, &format!("malformed CREATED2: {e}"), now),
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        if circ.next != Some((chan, cell.circ_id)) {
            return self.kill(key, "CREATED2 from the wrong side", now);
        }
        match &mut circ.role {
            Role::Relay { extending, .. } => {
                if !std::mem::take(extending) {
                    return self.kill(key, "unexpected CREATED2", now);
                }
                let body = Extended2 {
                    handshake: created.handshake,
                }
                .encode();
                match body {
                    Ok(body) => {
                        self.send_relay_backward(key, RelayCommand::EXTENDED2, 0, &body, now)
                    }
                    Err(e) => self.kill(key, &format!("cannot encode EXTENDED2: {e}"), now),
                }
            }
            Role::Origin { .. } => self.origin_hop_done(key, &created.handshake, now),
        }
    }

    pub(super) fn on_extend2(&mut self, key: CircKey, ext: Extend2, now: Instant) {
        let mut ed = None;
        let mut addr = None;
        for spec in &ext.link_specifiers {
            match spec {
                LinkSpec::Ed25519Id(id) => ed = IdentityKey::from_bytes(id).ok(),
                LinkSpec::Ipv4(a) if addr.is_none() => addr = Some(SocketAddr::V4(*a)),
                LinkSpec::Ipv6(a) if addr.is_none() => addr = Some(SocketAddr::V6(*a)),
                _ => {}
            }
        }
        let (Some(identity), Some(addr)) = (ed, addr) else {
            return self.kill(key, "EXTEND2 without an Ed25519 identity and address", now);
        };
        if Some(identity) == self.identity() {
            return self.kill(key, "EXTEND2 to ourselves", now);
        }
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        match &mut circ.role {
            Role::Relay {
                pending_extend,
                extending,
                ..
            } if circ.next.is_none() && pending_extend.is_none() && !*extending => {
                *pending_extend = Some((identity, ext.create2));
            }
            _ => return self.kill(key, "EXTEND2 on a circuit that already extends", now),
        }
        match self.chan_by_identity.get(&identity).copied() {
            Some(chan) => self.attach_to_channel(key, chan, now),
            None => self.wait_for_channel(key, identity, addr),
        }
    }

    /// Give circuit `key` an id on `chan` (toward the exit) and send its CREATE2.
    pub(super) fn attach_to_channel(&mut self, key: CircKey, chan: ChannelId, now: Instant) {
        let Some(circ_id) = self.alloc_circ_id(chan) else {
            return self.kill(key, "no circuit id available", now);
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let create = match &mut circ.role {
            Role::Relay {
                pending_extend,
                extending,
                ..
            } => match pending_extend.take() {
                Some((_, create)) => {
                    *extending = true;
                    create
                }
                None => return,
            },
            Role::Origin { path, .. } => {
                let Some(first) = path.first().cloned() else {
                    return;
                };
                let last = path.len() == 1;
                let (state, create) = self.hop_handshake(&first, last);
                let Some(Role::Origin { handshake, .. }) =
                    self.circuits.get_mut(&key).map(|c| &mut c.role)
                else {
                    return;
                };
                *handshake = Some(state);
                create
            }
        };
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        circ.next = Some((chan, circ_id));
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.circ_ids.insert(circ_id, key);
        }
        match create
            .encode()
            .and_then(|b| Cell::new(circ_id, CellCommand::CREATE2, &b))
        {
            Ok(cell) => self.enqueue(key, Side::Next, cell, now),
            Err(e) => self.kill(key, &format!("cannot encode CREATE2: {e}"), now),
        }
    }

    pub(super) fn on_truncate(&mut self, key: CircKey, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        if let Some((chan, id)) = circ.next.take() {
            let (dropped, cap) = (circ.q_next.len(), circ.q_next.capacity());
            circ.q_next.clear();
            self.stats.queued_cells = self.stats.queued_cells.saturating_sub(dropped);
            self.stats.queue_buffer_cells -= cap;
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.queued = ch.queued.saturating_sub(dropped);
                ch.circ_ids.remove(&id);
                ch.sched.deactivate(queue_id(key, Side::Next));
                ch.sched.forget(queue_id(key, Side::Next));
            }
            self.send_destroy(chan, id, DestroyReason::REQUESTED);
        }
        if let Some(Circuit {
            role:
                Role::Relay {
                    pending_extend,
                    extending,
                    ..
                },
            ..
        }) = self.circuits.get_mut(&key).map(Box::as_mut)
        {
            *pending_extend = None;
            *extending = false;
        }
        self.send_relay_backward(
            key,
            RelayCommand::TRUNCATED,
            0,
            &[DestroyReason::REQUESTED.0],
            now,
        );
    }

    /// Start building a circuit along `path` (guard first). Emits
    /// [`Event::CircuitBuilt`] or [`Event::CircuitClosed`] later.
    pub fn launch_circuit(&mut self, path: Vec<HopSpec>, now: Instant) -> CircKey {
        let key = self.alloc_key();
        let first = path.first().cloned();
        let hops = path.len();
        let window = self.new_circuit_window();
        self.circuits.insert(
            key,
            Box::new(Circuit {
                prev: None,
                next: None,
                q_prev: CellQueue::default(),
                q_next: CellQueue::default(),
                cells_sent: 0,
                sw: SwCounts::default(),
                role: Role::Origin {
                    crypto: ClientCircuitCrypto::with_hops(hops),
                    path,
                    handshake: None,
                    built: false,
                    edge: Edge::new(window),
                    deadline: now + self.cfg.circuit_build_timeout,
                },
                relay_early_seen: 0,
                kh: [0; 20],
                vegas: false,
            }),
        );
        match first {
            None => self.close_circuit_inner(key, DestroyReason::INTERNAL, None, now, "empty path"),
            Some(hop) => match self.chan_by_identity.get(&hop.identity).copied() {
                Some(chan) => self.attach_to_channel(key, chan, now),
                None => self.wait_for_channel(key, hop.identity, hop.addr),
            },
        }
        key
    }

    /// A CREATED2 or EXTENDED2 answered the pending handshake of an origin circuit.
    pub(super) fn origin_hop_done(&mut self, key: CircKey, reply: &[u8], now: Instant) {
        let circwindow = self.effective_circwindow();
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Role::Origin { handshake, .. } = &mut circ.role else {
            return;
        };
        let Some(state) = handshake.take() else {
            return self.kill(key, "handshake reply without a handshake", now);
        };
        let (asked, v3) = (state.asked_for_cc(), state.is_v3());
        let (km, agreed) = match Self::hop_finish(state, reply) {
            Ok(r) => r,
            Err(e) => {
                if v3 {
                    self.count_cc_answer(asked, Err(&e));
                }
                return self.kill(key, &e, now);
            }
        };
        if let Some(cc) = agreed {
            self.count_cc_answer(asked, Ok(matches!(cc, crate::cc::CcKind::Vegas(_))));
        }
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Role::Origin {
            crypto,
            path,
            built,
            edge,
            ..
        } = &mut circ.role
        else {
            return;
        };
        crypto.push_hop(ClientHopCrypto::new(&km));
        circ.kh = *km.kh();
        if crypto.len() >= path.len() {
            if let Some(cc) = agreed {
                // No cell was packaged yet: the window (and the streams' flow) starts as agreed.
                circ.vegas = matches!(cc, crate::cc::CcKind::Vegas(_));
                edge.window = CircuitWindow::with_policy(cc.build(circwindow));
            }
            *built = true;
            self.events.push_back(Event::CircuitBuilt { circ: key });
            return;
        }
        self.send_extend(key, now);
    }

    /// Send EXTEND2 for an origin circuit's next hop (`path[hops built]`) from its last hop.
    fn send_extend(&mut self, key: CircKey, now: Instant) {
        let Some(circ) = self.circuits.get_mut(&key) else {
            return;
        };
        let Role::Origin { crypto, path, .. } = &circ.role else {
            return;
        };
        let done = crypto.len();
        let Some(hop) = path.get(done).cloned() else {
            return;
        };
        let last = done + 1 == path.len();
        let (state, create2) = self.hop_handshake(&hop, last);
        if let Some(Role::Origin { handshake, .. }) =
            self.circuits.get_mut(&key).map(|c| &mut c.role)
        {
            *handshake = Some(state);
        }
        let mut specs = vec![LinkSpec::Ed25519Id(*hop.identity.as_bytes())];
        specs.push(match hop.addr {
            SocketAddr::V4(a) => LinkSpec::Ipv4(a),
            SocketAddr::V6(a) => LinkSpec::Ipv6(a),
        });
        specs.push(LinkSpec::LegacyId(hop.identity.ntor_id()));
        let ext = Extend2 {
            link_specifiers: specs,
            create2,
        };
        match ext.encode() {
            Ok(body) => {
                self.send_relay_forward(key, done - 1, RelayCommand::EXTEND2, 0, &body, true, now)
            }
            Err(e) => self.kill(key, &format!("cannot encode EXTEND2: {e}"), now),
        }
    }

    /// Extend a built, clean origin circuit by one hop to `hop` (EXTEND2 from its last hop):
    /// Tor's cannibalising of a predicted internal circuit for an introduction or rendezvous
    /// point. The circuit is not open again until the new hop answered; then
    /// [`Event::CircuitBuilt`] comes again, or [`Event::CircuitClosed`] if the extension fails
    /// or takes longer than the circuit build timeout (counted from now).
    ///
    /// Refused (the circuit is left as it was): no such origin circuit
    /// ([`CoreError::NoSuchCircuit`]), not built, with streams or a virtual hop, or already
    /// [`MAX_PATH_LEN`] hops long ([`CoreError::CircuitNotOpen`]).
    pub fn extend_circuit(
        &mut self,
        circ: CircKey,
        hop: HopSpec,
        now: Instant,
    ) -> Result<(), CoreError> {
        let timeout = self.cfg.circuit_build_timeout;
        let Some(c) = self.circuits.get_mut(&circ) else {
            return Err(CoreError::NoSuchCircuit);
        };
        let Role::Origin {
            crypto,
            path,
            built,
            edge,
            deadline,
            ..
        } = &mut c.role
        else {
            return Err(CoreError::NoSuchCircuit);
        };
        let clean = edge.streams.is_empty() && crypto.len() == path.len();
        if !*built || !clean || path.len() >= MAX_PATH_LEN {
            return Err(CoreError::CircuitNotOpen);
        }
        path.push(hop);
        *built = false;
        *deadline = now + timeout;
        self.send_extend(circ, now);
        Ok(())
    }

    /// Whether an origin circuit is built and usable.
    pub fn circuit_is_open(&self, circ: CircKey) -> bool {
        matches!(
            self.circuits.get(&circ).map(Box::as_ref),
            Some(Circuit {
                role: Role::Origin { built: true, .. },
                ..
            })
        )
    }
}
