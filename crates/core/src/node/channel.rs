//! Channels (links to neighbours): opening and closing them, choosing the one channel new
//! circuits to a peer go on, circuits waiting for a channel, circuit ids, DESTROY cells.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use chive_cell::{Cell, CellCommand, CircId, Destroy, DestroyReason};
use chive_crypto::IdentityKey;
use rand::Rng;

use crate::sched::CircuitScheduler;
use crate::{ChannelId, CircKey};

use super::circ_ids::CircIds;
use super::event::{CloseCause, Event};
use super::Core;

pub(super) struct Channel {
    pub(super) peer: Option<IdentityKey>,
    /// Whether this node opened the channel (decides the circuit id high bit).
    pub(super) initiator: bool,
    pub(super) circ_ids: CircIds,
    pub(super) sched: Box<dyn CircuitScheduler>,
    /// DESTROY cells: they bypass circuit queues because their circuit is gone.
    pub(super) urgent: VecDeque<Cell>,
    /// Bytes the driver holds for this channel ([`Core::channel_buffered`]), and since when.
    pub(super) buffered: usize,
    pub(super) buffered_since: Option<Instant>,
    /// The peer's address, if the driver told it ([`Core::set_channel_addr`]).
    pub(super) addr: Option<IpAddr>,
    /// Whether the DoS defences count this channel as a client connection of `addr`.
    pub(super) dos_tracked: bool,
    /// A client's channel, for `ChannelFairness` ([`Core::channel_is_client`]).
    pub(super) client: bool,
    /// Cells queued at this node toward this channel (every circuit queue whose end is here):
    /// what `PerClientQueueCells` bounds for a client's channel (`client_hold.rs`).
    pub(super) queued: usize,
}

impl Core {
    /// Whether `chan` is a client's channel: one we accepted from a peer that proved no relay
    /// identity (at first: none at all; the driver also names accepted channels whose identity
    /// no consensus lists, [`Core::set_channel_client`]). `ChannelFairness` ranks client
    /// channels by what each sent in all, relay channels by their best circuit.
    pub fn channel_is_client(&self, chan: ChannelId) -> bool {
        self.channels.get(&chan).is_some_and(|c| c.client)
    }

    /// Mark `chan` as a client's channel or not (see [`Core::channel_is_client`]); the driver
    /// decides for an accepted channel with an identity: a self-made one is no relay.
    pub fn set_channel_client(&mut self, chan: ChannelId, client: bool) {
        if let Some(c) = self.channels.get_mut(&chan) {
            c.client = client;
        }
    }

    /// A channel with nothing on it yet: to `peer` (None: an unauthenticated client's), opened
    /// by this node if `initiator`.
    pub(super) fn new_channel(&self, peer: Option<IdentityKey>, initiator: bool) -> Channel {
        Channel {
            peer,
            initiator,
            circ_ids: CircIds::default(),
            sched: self.cfg.scheduler.build(),
            urgent: VecDeque::new(),
            buffered: 0,
            buffered_since: None,
            addr: None,
            dos_tracked: false,
            client: peer.is_none() && !initiator,
            queued: 0,
        }
    }

    /// A link finished its handshake. `peer` is the authenticated identity (None
    /// for a client); `initiator` is true if this node opened it.
    pub fn channel_opened(
        &mut self,
        chan: ChannelId,
        peer: Option<IdentityKey>,
        initiator: bool,
        now: Instant,
    ) {
        self.channels
            .insert(chan, self.new_channel(peer, initiator));
        if let Some(id) = peer {
            // New circuits go on one channel per peer; old ones keep theirs. When both relays
            // opened a channel to each other at the same moment, both must pick the same one,
            // or each would send on its own and every connection would carry data one way
            // (split-direction by accident, with the ACK behaviour of paper 002's fix): prefer
            // the channel opened by the relay with the smaller identity, which both sides
            // agree on; otherwise the newest.
            let me = self.identity();
            let canonical = |c: &Channel| me.is_none_or(|me| c.initiator == (me < id));
            let keep_old = self
                .chan_by_identity
                .get(&id)
                .and_then(|old| self.channels.get(old))
                .zip(self.channels.get(&chan))
                .is_some_and(|(old, new)| canonical(old) && !canonical(new));
            if !keep_old {
                self.chan_by_identity.insert(id, chan);
            }
            if let Some(waiting) = self.waiting_for_channel.remove(&id) {
                for key in waiting {
                    self.attach_to_channel(key, chan, now);
                }
            }
        }
    }

    /// Connecting to `identity` failed: every circuit waiting for it fails.
    pub fn connect_failed(&mut self, identity: IdentityKey, now: Instant) {
        if let Some(waiting) = self.waiting_for_channel.remove(&identity) {
            for key in waiting {
                self.close_circuit_because(
                    key,
                    DestroyReason::CONNECTFAILED,
                    None,
                    now,
                    "connect failed",
                    CloseCause::LinkLost,
                );
            }
        }
    }

    /// A channel closed (EOF, error, or after [`Event::CloseChannel`]): every
    /// circuit on it goes, and relays tell the other side with DESTROY.
    pub fn channel_closed(&mut self, chan: ChannelId, now: Instant) {
        self.sw_channel_closed(chan, now);
        let Some(ch) = self.channels.remove(&chan) else {
            return;
        };
        if let Some(peer) = ch.peer {
            if self.chan_by_identity.get(&peer) == Some(&chan) {
                self.chan_by_identity.remove(&peer);
            }
        }
        self.ready_set.remove(&chan);
        self.driver_bytes -= ch.buffered;
        if ch.dos_tracked {
            if let Some(addr) = ch.addr {
                self.dos.client_disconnected(addr, now);
            }
        }
        let ends: Vec<(CircId, CircKey)> =
            ch.circ_ids.iter().map(|(&id, &key)| (id, key)).collect();
        for (id, key) in ends {
            self.close_circuit_because(
                key,
                DestroyReason::CHANNEL_CLOSED,
                Some((chan, id)),
                now,
                "channel closed",
                CloseCause::LinkLost,
            );
        }
    }

    pub(super) fn wait_for_channel(
        &mut self,
        key: CircKey,
        identity: IdentityKey,
        addr: SocketAddr,
    ) {
        let waiting = self.waiting_for_channel.entry(identity).or_default();
        if waiting.is_empty() {
            self.events.push_back(Event::Connect { addr, identity });
        }
        waiting.push(key);
    }

    pub(super) fn send_destroy(&mut self, chan: ChannelId, circ_id: CircId, reason: DestroyReason) {
        let Ok(cell) = Cell::new(circ_id, CellCommand::DESTROY, &Destroy { reason }.encode())
        else {
            return;
        };
        if let Some(ch) = self.channels.get_mut(&chan) {
            ch.urgent.push_back(cell);
            self.mark_ready(chan);
        }
    }

    /// A random unused circuit id in our half of `chan`'s id space.
    pub(super) fn alloc_circ_id(&mut self, chan: ChannelId) -> Option<CircId> {
        let ch = self.channels.get(&chan)?;
        let high = if ch.initiator { 0x8000_0000 } else { 0 };
        for _ in 0..64 {
            let id = (self.rng.gen::<u32>() & 0x7fff_ffff) | high;
            if id != 0 && !ch.circ_ids.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use chive_crypto::ntor::NtorSecretKey;
    use chive_crypto::IdentityKeypair;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::node::config::{CoreConfig, RelayKeys};

    fn relay(seed: u8) -> (Core, IdentityKey) {
        let mut rng = StdRng::seed_from_u64(u64::from(seed));
        let identity = IdentityKeypair::generate(&mut rng).public();
        let ntor = NtorSecretKey::generate(&mut rng);
        let cfg = CoreConfig {
            relay: Some(RelayKeys { identity, ntor }),
            ..CoreConfig::default()
        };
        (Core::new(cfg, [seed; 32]), identity)
    }

    /// Two relays that open channels to each other at the same moment must both send new
    /// circuits on the same TCP connection (the one opened by the smaller identity), whichever
    /// handshake finishes first on either side; otherwise each connection would carry data one
    /// way only.
    #[test]
    fn simultaneous_channels_between_two_relays_agree_on_one() {
        let now = Instant::now();
        for (first_a, first_b) in [(true, true), (true, false), (false, true), (false, false)] {
            let (mut a, ida) = relay(1);
            let (mut b, idb) = relay(2);
            // Channel 1 on each side is its own outbound connection, 2 the peer's.
            let open = |core: &mut Core, peer: IdentityKey, own_first: bool| {
                let order = if own_first {
                    [(1, true), (2, false)]
                } else {
                    [(2, false), (1, true)]
                };
                for (id, initiator) in order {
                    core.channel_opened(ChannelId(id), Some(peer), initiator, now);
                }
            };
            open(&mut a, idb, first_a);
            open(&mut b, ida, first_b);
            let a_own = a.chan_by_identity.get(&idb) == Some(&ChannelId(1));
            let b_own = b.chan_by_identity.get(&ida) == Some(&ChannelId(1));
            // Exactly one side uses its own connection: both use the same one.
            assert_ne!(a_own, b_own, "order {first_a}/{first_b}");
            assert_eq!(a_own, ida < idb, "the smaller identity's connection wins");
        }
    }
}
