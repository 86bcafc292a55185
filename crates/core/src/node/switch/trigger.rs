//! The trigger of both switching modes: the driver's detector reports a congested connection
//! ([`Core::congested`]) and the entry picks the circuit to move (connection mode) or whose
//! client to warn (path mode). The moving itself is in the parent module (`node/switch.rs`)
//! and in `node/path.rs`.

use super::*;

impl Core {
    /// The circuit on `chan` this relay is the entry of to move (connection mode) or whose
    /// client to warn (path mode), `skip` left out: the one with the highest weight (EWMA
    /// count, or cells sent when the scheduler keeps none, plus its queued cells for `chan`),
    /// if that weight is at least the `min_share` setting of the connection's load
    /// (`occupancy_bytes`, the detector's estimate, in cells, plus every circuit's queued cells
    /// for `chan`). See [`crate::switching::circuit_to_move`] for why.
    pub(in crate::node) fn heaviest_entry_circuit(
        &self,
        chan: ChannelId,
        occupancy_bytes: f64,
        now: Instant,
        skip: impl Fn(CircKey) -> bool,
    ) -> Option<CircKey> {
        let ch = self.channels.get(&chan)?;
        let mut load = occupancy_bytes.max(0.0) / chive_cell::CELL_LEN as f64;
        let mut candidates = Vec::new();
        for (&id, &key) in &ch.circ_ids {
            let Some(circ) = self.circuits.get(&key) else {
                continue;
            };
            let side = if circ.next == Some((chan, id)) {
                Side::Next
            } else {
                Side::Prev
            };
            let queued = circ.queue_len(side) as f64;
            load += queued;
            if side != Side::Next || !self.is_entry_circuit(key, chan, id) || skip(key) {
                continue;
            }
            let count = ch
                .sched
                .ewma_count(queue_id(key, Side::Next), now)
                .unwrap_or(circ.cells_sent as f64);
            candidates.push((key, count + queued));
        }
        let key = crate::switching::circuit_to_move(
            candidates.iter().copied(),
            load,
            self.sw.settings.min_share(),
        );
        if key.is_none() && !candidates.is_empty() {
            debug!(
                ?chan,
                load_cells = load,
                heaviest = candidates.iter().map(|c| c.1).fold(0.0, f64::max),
                "connection congested, but no circuit carries a share worth moving"
            );
        }
        key
    }

    pub(in crate::node) fn is_entry_circuit(
        &self,
        key: CircKey,
        chan: ChannelId,
        id: CircId,
    ) -> bool {
        let Some(circ) = self.circuits.get(&key) else {
            return false;
        };
        matches!(circ.role, Role::Relay { .. })
            && circ.next == Some((chan, id))
            && circ
                .prev
                .and_then(|(c, _)| self.channels.get(&c))
                .is_some_and(|c| c.peer.is_none())
    }

    /// Connection mode: the driver's detector found `chan`'s smoothed occupancy at or above α
    /// (congestion building, not yet β). Open the switch connection to its peer now, so that
    /// a switch does not wait for TCP + TLS through the connection's full link: in the lab's
    /// loaded runs that handshake took 1.6 s and the first switch of every run timed out
    /// waiting for it. Asks only for a connection that is neither open nor being opened, and
    /// only where a switch could follow (`chan` is not a switch connection, carries two
    /// circuits or more and one this relay is the entry of). Returns whether it asked.
    /// The connection stays open like any switch connection (it is not closed when idle).
    /// After a failed connection opened ahead, not again to that peer for 30 s.
    pub fn congestion_building(&mut self, chan: ChannelId, now: Instant) -> bool {
        if self.sw.settings.mode != SwitchMode::Connection || !self.may_switch_from(chan) {
            return false;
        }
        let Some(ch) = self.channels.get(&chan) else {
            return false;
        };
        let Some(peer) = ch.peer else {
            return false;
        };
        if ch.circ_ids.len() < 2 || self.sw.spare.contains_key(&peer) {
            return false;
        }
        if self.sw.preopen_failed.get(&peer).is_some_and(|t| *t > now) {
            return false;
        }
        self.sw.spare.insert(peer, Spare::Opening(Vec::new()));
        self.events
            .push_back(Event::ConnectSwitch { identity: peer });
        info!(
            ?chan,
            "congestion building: opening the switch connection ahead"
        );
        true
    }

    /// The driver's detector found `chan` congested, holding `occupancy_bytes` (its estimate
    /// B_t): move the heaviest circuit this node is the entry of (highest EWMA count) to the
    /// switch connection to the same peer. Returns the circuit chosen, or None (mode not
    /// `connection`, a switch connection, fewer than two circuits on the connection, no entry
    /// circuit carrying a `min_share` of the load, or too many switches pending to the peer).
    pub fn congested(
        &mut self,
        chan: ChannelId,
        occupancy_bytes: f64,
        now: Instant,
    ) -> Option<CircKey> {
        if self.sw.settings.mode == SwitchMode::Path && !self.is_switch_channel(chan) {
            return self.path_congested(chan, occupancy_bytes, now);
        }
        if self.sw.settings.mode != SwitchMode::Connection || self.is_switch_channel(chan) {
            return None;
        }
        let ch = self.channels.get(&chan)?;
        let peer = ch.peer?;
        // Nothing to separate a lone circuit from.
        if ch.circ_ids.len() < 2 {
            return None;
        }
        let key = self.heaviest_entry_circuit(chan, occupancy_bytes, now, |k| {
            self.sw.movers.contains_key(&k)
        })?;
        let pending = self
            .sw
            .movers
            .values()
            .filter(|m| self.channels.get(&m.new.0).and_then(|c| c.peer) == Some(peer))
            .count();
        if pending >= crate::switching::MAX_PENDING_PER_PEER {
            return None;
        }
        self.sw.stats.triggered += 1;
        match self.sw.spare.get_mut(&peer) {
            Some(Spare::Open(c2)) => {
                let c2 = *c2;
                self.send_switch_conn(key, chan, c2, now, now);
            }
            Some(Spare::Opening(waiting)) => waiting.push((key, chan, now)),
            None => {
                self.sw
                    .spare
                    .insert(peer, Spare::Opening(vec![(key, chan, now)]));
                self.events
                    .push_back(Event::ConnectSwitch { identity: peer });
            }
        }
        info!(
            ?key,
            ?chan,
            "connection congested: switching its heaviest circuit"
        );
        Some(key)
    }
}
