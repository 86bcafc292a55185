//! Onion services in the core: the relay's introduction-point and rendezvous-point roles
//! (tables in `crate::onion`), the splice of two circuits at a rendezvous point, and for
//! origin circuits the hooks a client or service driver uses: send an onion message to the
//! last hop, read the last hop's KH, attach the end-to-end virtual hop, and (service side)
//! answer BEGINs that arrive through it.
//!
//! Only the relay roles are decided here. The service and client protocols (which intro
//! points, when to build, INTRODUCE2 checks) are the driver's, using `crate::onion`'s state
//! machines; the core reports their messages as [`Event::OnionMessage`].

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chive_cell::{Begin, EndReason, IntroEstablished, IntroduceAck, IntroduceAckStatus};
use chive_cell::{Connected, RelayCommand};
use chive_crypto::hs_ntor::HsKeyMaterial;
use chive_crypto::relay::ClientHopCrypto;
use tracing::debug;

use crate::onion::intro::DEFAULT_MAX_INTRO_CIRCUITS;
use crate::onion::rend::DEFAULT_MAX_REND_CIRCUITS;
use crate::onion::{IntroPointTable, RendezvousTable};
use crate::CircKey;

use super::circuit::{Role, Side};
use super::event::{CoreError, Event};
use super::exit::BegunAt;
use super::Core;

/// The core's onion-service state.
pub(super) struct OnionTables {
    intro: IntroPointTable<CircKey>,
    rend: RendezvousTable<CircKey>,
    /// Joined circuit pairs at this rendezvous point (both directions).
    spliced: HashMap<CircKey, CircKey>,
    /// Origin circuits whose virtual hop this node attached as the service: BEGINs arriving
    /// through it open streams to the service's local port.
    service: HashSet<CircKey>,
}

impl Default for OnionTables {
    fn default() -> Self {
        OnionTables {
            intro: IntroPointTable::new(DEFAULT_MAX_INTRO_CIRCUITS),
            rend: RendezvousTable::new(DEFAULT_MAX_REND_CIRCUITS),
            spliced: HashMap::new(),
            service: HashSet::new(),
        }
    }
}

/// Counters of the relay roles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OnionRelayStats {
    /// Introduction circuits registered here.
    pub intro_circuits: usize,
    /// INTRODUCE1 passed on as INTRODUCE2.
    pub introduced: u64,
    /// INTRODUCE1 refused (unparsable, unknown auth key).
    pub intro_refused: u64,
    /// Client circuits waiting here with a cookie.
    pub rend_waiting: usize,
    /// Circuit pairs joined here.
    pub rend_joined: u64,
}

/// Is `cmd` one of the onion messages an origin circuit may send to its last hop?
fn is_onion_request(cmd: RelayCommand) -> bool {
    matches!(
        cmd,
        RelayCommand::ESTABLISH_INTRO
            | RelayCommand::ESTABLISH_RENDEZVOUS
            | RelayCommand::INTRODUCE1
            | RelayCommand::RENDEZVOUS1
    )
}

/// Is `cmd` one of the onion messages a relay sends back to an origin?
pub(super) fn is_onion_reply(cmd: RelayCommand) -> bool {
    matches!(
        cmd,
        RelayCommand::INTRO_ESTABLISHED
            | RelayCommand::INTRODUCE2
            | RelayCommand::INTRODUCE_ACK
            | RelayCommand::RENDEZVOUS_ESTABLISHED
            | RelayCommand::RENDEZVOUS2
    )
}

impl Core {
    /// A relay-side onion message recognized at this relay (the circuit's last hop).
    pub(super) fn on_onion_request(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        data: &[u8],
        now: Instant,
    ) {
        let Some(circ) = self.circuits.get(&key) else {
            return;
        };
        if circ.next.is_some() || circ.edge().is_some_and(|e| !e.streams.is_empty()) {
            return self.kill(
                key,
                &format!("{cmd} on a circuit that is not idle here"),
                now,
            );
        }
        if self.onion.spliced.contains_key(&key) {
            return self.kill(key, &format!("{cmd} on a joined rendezvous circuit"), now);
        }
        let kh = circ.kh;
        match cmd {
            RelayCommand::ESTABLISH_INTRO => match self.onion.intro.establish(key, &kh, data) {
                Ok(old) => {
                    if let Some(old) = old {
                        self.kill(old, "replaced by a newer introduction circuit", now);
                    }
                    let body = IntroEstablished::default().encode().unwrap_or_default();
                    self.send_relay_backward(key, RelayCommand::INTRO_ESTABLISHED, 0, &body, now);
                }
                Err(e) => self.kill(key, &e.to_string(), now),
            },
            RelayCommand::INTRODUCE1 => {
                if self.onion.intro.is_intro_circuit(key) {
                    return self.kill(key, "INTRODUCE1 on an introduction circuit", now);
                }
                let status = match self.onion.intro.introduce1(data) {
                    Ok((svc, body)) => {
                        self.send_relay_backward(svc, RelayCommand::INTRODUCE2, 0, &body, now);
                        IntroduceAckStatus::Success
                    }
                    Err(status) => status,
                };
                let ack = IntroduceAck {
                    status,
                    extensions: vec![],
                }
                .encode()
                .unwrap_or_default();
                self.send_relay_backward(key, RelayCommand::INTRODUCE_ACK, 0, &ack, now);
            }
            RelayCommand::ESTABLISH_RENDEZVOUS if self.single_hop_client(key) => {
                if self.dos.refuse_single_hop_rendezvous() {
                    // Tor: a silent drop, so the client has to time out before moving on.
                    debug!(
                        ?key,
                        "DoS: ESTABLISH_RENDEZVOUS from a single-hop client dropped"
                    );
                    return;
                }
                self.establish_rendezvous(key, data, now);
            }
            RelayCommand::ESTABLISH_RENDEZVOUS => self.establish_rendezvous(key, data, now),
            RelayCommand::RENDEZVOUS1 => match self.onion.rend.rendezvous1(key, data) {
                Ok((client, r2)) => {
                    // RENDEZVOUS2 is the last cell this relay originates on the client's
                    // circuit; from now on it only passes ciphertext between the two.
                    self.send_relay_backward(client, RelayCommand::RENDEZVOUS2, 0, &r2, now);
                    if self.circuits.contains_key(&client) {
                        self.onion.spliced.insert(key, client);
                        self.onion.spliced.insert(client, key);
                    }
                }
                Err(e) => self.kill(key, &e.to_string(), now),
            },
            _ => {}
        }
    }

    /// ESTABLISH_RENDEZVOUS on `key`: keep its cookie and answer RENDEZVOUS_ESTABLISHED.
    fn establish_rendezvous(&mut self, key: CircKey, data: &[u8], now: Instant) {
        match self.onion.rend.establish(key, data) {
            Ok(()) => {
                self.send_relay_backward(key, RelayCommand::RENDEZVOUS_ESTABLISHED, 0, &[], now)
            }
            Err(e) => self.kill(key, &e.to_string(), now),
        }
    }

    /// Whether `key` came to this relay straight from a client's channel (Tor's
    /// `channel_is_client(circ->p_chan)`): a circuit of one hop.
    fn single_hop_client(&self, key: CircKey) -> bool {
        self.circuits
            .get(&key)
            .and_then(|c| c.prev)
            .is_some_and(|(chan, _)| self.channel_is_client(chan))
    }

    /// The circuit this one is joined to at this rendezvous point, if any.
    pub(super) fn spliced_partner(&self, key: CircKey) -> Option<CircKey> {
        self.onion.spliced.get(&key).copied()
    }

    /// A forward cell on a joined circuit that this relay did not recognize: pass it down the
    /// partner circuit toward its origin, under the partner's backward layer.
    pub(super) fn splice_forward(
        &mut self,
        partner: CircKey,
        cell: &mut chive_cell::Cell,
        now: Instant,
    ) {
        let Some(circ) = self.circuits.get_mut(&partner) else {
            return;
        };
        let (Role::Relay { crypto, .. }, Some((_, prev_id))) = (&mut circ.role, circ.prev) else {
            return;
        };
        crypto.encrypt_backward(&mut cell.payload);
        cell.circ_id = prev_id;
        cell.command = chive_cell::CellCommand::RELAY;
        self.enqueue(partner, Side::Prev, &*cell, now);
    }

    /// A circuit is gone: forget it in the tables, and close its rendezvous partner (the
    /// joined pair lives and dies together, as in C tor).
    pub(super) fn onion_circuit_gone(&mut self, key: CircKey, now: Instant) {
        self.onion.intro.circuit_closed(key);
        self.onion.rend.circuit_closed(key);
        self.onion.service.remove(&key);
        if let Some(partner) = self.onion.spliced.remove(&key) {
            self.onion.spliced.remove(&partner);
            self.kill(partner, "rendezvous partner circuit closed", now);
        }
    }

    /// Service side: a BEGIN arrived through the virtual hop of a rendezvous circuit. Opens a
    /// stream on the origin circuit and asks the driver for a connection to the service's
    /// local port ([`Event::OnionStreamRequest`]; answer with `exit_connected` / `exit_failed`).
    pub(super) fn on_service_begin(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        if !self.onion.service.contains(&key) {
            return self.kill(key, "BEGIN at a client", now);
        }
        if sid == 0 {
            return self.kill(key, "BEGIN with stream id 0", now);
        }
        let port = match Begin::decode(data) {
            Ok(b) => b.port,
            Err(e) => {
                debug!(?key, error = %e, "malformed BEGIN at the service");
                return self.send_end(key, sid, EndReason::TORPROTOCOL, now);
            }
        };
        let Ok(handle) = self.open_begun_stream(key, sid, BegunAt::Service, now) else {
            return;
        };
        self.events.push_back(Event::OnionStreamRequest {
            circ: key,
            stream: handle,
            port,
        });
    }

    /// Is this an origin circuit serving as an onion service's rendezvous circuit?
    pub(super) fn is_service_circuit(&self, key: CircKey) -> bool {
        self.onion.service.contains(&key)
    }

    /// CONNECTED for a service stream: empty, so that the service's address is not told
    /// (rend-spec; C tor does the same).
    pub(super) fn service_connected_body() -> Vec<u8> {
        Connected { addr: None, ttl: 0 }.encode()
    }

    /// Send an onion message (ESTABLISH_INTRO, ESTABLISH_RENDEZVOUS, INTRODUCE1, RENDEZVOUS1)
    /// to the last hop of built origin circuit `circ`. Replies come as
    /// [`Event::OnionMessage`].
    pub fn send_onion_message(
        &mut self,
        circ: CircKey,
        cmd: RelayCommand,
        body: &[u8],
        now: Instant,
    ) -> Result<(), CoreError> {
        if !is_onion_request(cmd) {
            return Err(CoreError::NotOnionMessage);
        }
        let c = self.circuits.get(&circ).ok_or(CoreError::NoSuchCircuit)?;
        let Role::Origin {
            crypto,
            built: true,
            ..
        } = &c.role
        else {
            return Err(CoreError::CircuitNotOpen);
        };
        let last = crypto.len() - 1;
        self.send_relay_forward(circ, last, cmd, 0, body, false, now);
        Ok(())
    }

    /// KH of the last hop of origin circuit `circ` (what ESTABLISH_INTRO's HANDSHAKE_AUTH is
    /// keyed with).
    pub fn last_hop_kh(&self, circ: CircKey) -> Option<[u8; 20]> {
        let c = self.circuits.get(&circ)?;
        c.is_origin().then_some(c.kh)
    }

    /// Append the end-to-end virtual hop to built origin circuit `circ` after RENDEZVOUS2 (the
    /// client, `service_side = false`) or after sending RENDEZVOUS1 (the service, `true`).
    /// Streams then go to the virtual hop; at the service, BEGINs through it are answered.
    pub fn attach_virtual_hop(
        &mut self,
        circ: CircKey,
        keys: &HsKeyMaterial,
        service_side: bool,
    ) -> Result<(), CoreError> {
        let c = self
            .circuits
            .get_mut(&circ)
            .ok_or(CoreError::NoSuchCircuit)?;
        let Role::Origin {
            crypto,
            built: true,
            ..
        } = &mut c.role
        else {
            return Err(CoreError::CircuitNotOpen);
        };
        crypto.push_hop(ClientHopCrypto::new_hs(keys, service_side));
        if service_side {
            self.onion.service.insert(circ);
        }
        Ok(())
    }

    /// Counters of this relay's introduction and rendezvous roles.
    pub fn onion_relay_stats(&self) -> OnionRelayStats {
        OnionRelayStats {
            intro_circuits: self.onion.intro.len(),
            introduced: self.onion.intro.introduced,
            intro_refused: self.onion.intro.refused,
            rend_waiting: self.onion.rend.len(),
            rend_joined: self.onion.rend.joined,
        }
    }
}
