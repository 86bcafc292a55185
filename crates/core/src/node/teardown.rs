//! Closing circuits: DESTROY received, a client's close, and kills for protocol violations
//! or resource limits. Sends DESTROY on the other sides and closes the circuit's streams.

use std::time::Instant;

use chive_cell::{Cell, CircId, Destroy, DestroyReason, EndReason};
use tracing::{debug, info, warn};

use crate::{ChannelId, CircKey};

use super::circuit::{queue_id, Role, Side};
use super::event::{CloseCause, Event};
use super::Core;

impl Core {
    pub(super) fn on_destroy(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            return;
        };
        let reason = Destroy::decode(&cell.payload)
            .map(|d| d.reason)
            .unwrap_or(DestroyReason::NONE);
        debug!(?key, %reason, "DESTROY received");
        let why = format!("destroyed by peer ({reason})");
        let except = Some((chan, cell.circ_id));
        let cause = CloseCause::Destroyed(reason);
        self.close_circuit_because(key, reason, except, now, &why, cause);
    }

    /// Close an origin circuit (for example when it is too dirty and idle).
    pub fn close_circuit(&mut self, circ: CircKey, now: Instant) {
        self.close_circuit_inner(circ, DestroyReason::FINISHED, None, now, "closed by client");
    }

    /// Close a circuit for a protocol violation or resource limit, with a log line.
    pub(super) fn kill(&mut self, key: CircKey, why: &str, now: Instant) {
        self.kill_with(key, DestroyReason::PROTOCOL, why, now);
    }

    /// [`Core::kill`] with the DESTROY reason given (RESOURCELIMIT for the OOM handler).
    pub(super) fn kill_with(
        &mut self,
        key: CircKey,
        reason: DestroyReason,
        why: &str,
        now: Instant,
    ) {
        if !self.circuits.contains_key(&key) {
            return;
        }
        warn!(?key, reason = why, "closing circuit");
        self.stats.circuits_killed += 1;
        self.close_circuit_inner(key, reason, None, now, why);
    }

    /// Remove a circuit, send DESTROY on every end except `except` (the channel and id a
    /// DESTROY came from), close its streams, and tell the driver if it was ours.
    pub(super) fn close_circuit_inner(
        &mut self,
        key: CircKey,
        reason: DestroyReason,
        except: Option<(ChannelId, CircId)>,
        now: Instant,
        why: &str,
    ) {
        self.close_circuit_because(key, reason, except, now, why, CloseCause::Local);
    }

    /// [`Core::close_circuit_inner`] naming who ended the circuit (for an origin circuit's
    /// [`Event::CircuitClosed`]).
    pub(super) fn close_circuit_because(
        &mut self,
        key: CircKey,
        reason: DestroyReason,
        except: Option<(ChannelId, CircId)>,
        now: Instant,
        why: &str,
        cause: CloseCause,
    ) {
        let extra_ends = self.sw_circuit_closing(key);
        let Some(circ) = self.circuits.remove(&key) else {
            return;
        };
        for end in extra_ends {
            if Some(end) != except {
                self.send_destroy(end.0, end.1, reason);
            }
        }
        self.onion_circuit_gone(key, now);
        self.path_circuit_gone(key, now);
        self.stats.queued_cells = self
            .stats
            .queued_cells
            .saturating_sub(circ.q_prev.len() + circ.q_next.len());
        self.stats.queue_buffer_cells -= circ.q_prev.capacity() + circ.q_next.capacity();
        self.hold_circuit_gone(key);
        for (side, end) in [(Side::Prev, circ.prev), (Side::Next, circ.next)] {
            let Some((chan, id)) = end else { continue };
            if let Some(ch) = self.channels.get_mut(&chan) {
                ch.queued = ch.queued.saturating_sub(circ.queue_len(side));
                ch.circ_ids.remove(&id);
                ch.sched.deactivate(queue_id(key, side));
                ch.sched.forget(queue_id(key, side));
            }
            if Some((chan, id)) != except {
                // Relays pass on the reason as tor-spec asks; a client says FINISHED.
                let r = if circ.is_origin() {
                    DestroyReason::FINISHED
                } else {
                    reason
                };
                self.send_destroy(chan, id, r);
            }
        }
        for waiting in self.waiting_for_channel.values_mut() {
            waiting.retain(|k| *k != key);
        }
        let (edge, origin, hops) = match circ.role {
            Role::Relay { edge, .. } => (edge, false, 0),
            Role::Origin { edge, crypto, .. } => (Some(edge), true, crypto.len()),
        };
        if let Some(edge) = edge {
            for s in edge.streams.into_values() {
                self.streams.remove(&s.handle);
                self.events.push_back(Event::StreamClosed {
                    stream: s.handle,
                    reason: EndReason::DESTROY,
                });
            }
        }
        if origin {
            info!(?key, reason = why, "circuit closed");
            self.events.push_back(Event::CircuitClosed {
                circ: key,
                reason: why.to_string(),
                cause,
                hops,
            });
        }
    }
}
