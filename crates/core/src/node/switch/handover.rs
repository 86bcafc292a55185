//! Cells on a circuit in a connection-variant switch: interception of its endpoints' cells
//! ([`Core::sw_intercept`]), the mover's and the peer's handling of the new connection's cells
//! until the markers allow them, the markers themselves and the peer's answer to SWITCH_CONN.
//! The tables, the mover's start and timeouts are in the parent module (`node/switch.rs`).

use super::*;

impl Core {
    /// A cell on an endpoint of a circuit in a switch. Returns the cell if the ordinary path
    /// should still handle it.
    pub(in crate::node) fn sw_intercept(
        &mut self,
        chan: ChannelId,
        cell: Cell,
        now: Instant,
    ) -> Option<Cell> {
        let Some(&(key, end)) = self.sw.ends.get(&(chan, cell.circ_id)) else {
            return Some(cell);
        };
        let cmd = cell.command;
        if end == End::Old {
            if counted(cmd) {
                let r = if let Some(m) = self.sw.movers.get_mut(&key) {
                    m.ms.backward().on_old_cell()
                } else if let Some(p) = self.sw.peers.get_mut(&key) {
                    p.ps.on_old_cell()
                } else {
                    Ok(())
                };
                if let Err(v) = r {
                    self.sw_violation(key, &v, now);
                    return None;
                }
            }
            return Some(cell);
        }
        // The new endpoint.
        if self.sw.movers.contains_key(&key) {
            return self.mover_new_cell(key, cell, now);
        }
        if self.sw.peers.contains_key(&key) {
            self.peer_new_cell(key, cell, now);
            return None;
        }
        Some(cell)
    }

    fn mover_new_cell(&mut self, key: CircKey, cell: Cell, now: Instant) -> Option<Cell> {
        let m = self.sw.movers.get_mut(&key)?;
        let moved = m.ms.state() == crate::switching::MoverState::Moved;
        match cell.command {
            CellCommand::SWITCH_ACK => {
                let ack = match SwitchAck::decode(&cell.payload) {
                    Ok(a) => a,
                    Err(e) => {
                        self.sw_violation(key, &format!("malformed SWITCH_ACK: {e}"), now);
                        return None;
                    }
                };
                let sent = self
                    .circuits
                    .get(&key)
                    .map_or(0, |c| c.sw.sent[ix(Side::Next)]);
                if matches!(
                    m.ms.state(),
                    crate::switching::MoverState::AwaitingAck { .. }
                ) {
                    let sample = now.saturating_duration_since(m.ms.triggered_at());
                    if let Some(peer) = self.channels.get(&m.new.0).and_then(|c| c.peer) {
                        let e = self.sw.ack_rtt.entry(peer).or_insert((sample, sample));
                        e.0 = (e.0 * 7 + sample) / 8;
                        e.1 = sample;
                    }
                }
                let m = self.sw.movers.get_mut(&key)?;
                match m.ms.on_ack(ack, sent) {
                    Ok(AckOutcome::CutOver(marker)) => self.cut_over(key, marker, now),
                    Ok(AckOutcome::Refused(status)) => {
                        info!(?key, status = status.0, "switch refused by the next hop");
                        self.end_mover(key, SwitchOutcome::Refused, now);
                    }
                    Ok(AckOutcome::Late) => {}
                    Err(v) => self.sw_violation(key, &v, now),
                }
                None
            }
            CellCommand::DESTROY if !moved => {
                // The peer refused the request (or dropped the reservation): stay on C1.
                info!(
                    ?key,
                    "switch refused by the next hop (DESTROY on the new id)"
                );
                self.end_mover(key, SwitchOutcome::Refused, now);
                None
            }
            CellCommand::DESTROY => {
                // After the cut-over the new id is the circuit's: close it as usual.
                self.sw_forget_state(key);
                Some(cell)
            }
            c if counted(c) => match m.ms.on_new_cell(cell) {
                Ok(None) => None,
                Ok(Some(cell)) => Some(cell),
                Err(v) => {
                    self.sw_violation(key, &v, now);
                    None
                }
            },
            other => {
                self.sw_violation(
                    key,
                    &format!("unexpected {other} on the new connection"),
                    now,
                );
                None
            }
        }
    }

    fn peer_new_cell(&mut self, key: CircKey, cell: Cell, now: Instant) {
        let Some(p) = self.sw.peers.get_mut(&key) else {
            return;
        };
        match cell.command {
            CellCommand::DESTROY => match p.ps.cancel() {
                Some(PeerDrop::CloseCircuit) => {
                    let held = self.held_of(key);
                    self.sw.stats.cells_lost += held;
                    self.sw_violation(key, &"switch cancelled with cells held", now);
                }
                _ => {
                    debug!(?key, "switch reservation cancelled by the mover");
                    self.sw_forget_state(key);
                }
            },
            c if counted(c) => match p.ps.on_new_cell(cell) {
                Ok(None) => {}
                Ok(Some(mut cell)) => self.on_relay(cell_chan(&self.sw, key), &mut cell, now),
                Err(v) => self.sw_violation(key, &v, now),
            },
            other => self.sw_violation(
                key,
                &format!("unexpected {other} on the new connection"),
                now,
            ),
        }
    }

    pub(super) fn held_of(&self, key: CircKey) -> u64 {
        if let Some(p) = self.sw.peers.get(&key) {
            return p.ps.held() as u64;
        }
        0
    }

    /// Step 3: SWITCH_ACK(ACCEPTED): the marker closes C1 for the forward direction, later
    /// cells go on C2.
    fn cut_over(&mut self, key: CircKey, marker: SwitchMarker, now: Instant) {
        let Some(m) = self.sw.movers.get(&key) else {
            return;
        };
        let (old, new) = (m.old, m.new);
        let triggered = m.triggered;
        let last_old = m.last_old;
        self.send_marker(old.0, old.1, marker);
        self.rebind(key, Side::Next, new, now);
        self.sw
            .first_cell
            .insert(key, (triggered, old.0, new.0, last_old));
        info!(
            ?key,
            seq = marker.seq,
            cells = marker.cells,
            "circuit cut over to the switch connection"
        );
    }

    /// A SWITCH marker (cell command 138) on `chan`.
    pub(in crate::node) fn on_switch_marker(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let Some(key) = self.lookup(chan, cell.circ_id) else {
            debug!(
                ?chan,
                circ_id = cell.circ_id,
                "SWITCH for unknown circuit: dropped"
            );
            return;
        };
        let marker = match SwitchMarker::decode(&cell.payload) {
            Ok(m) => m,
            Err(e) => return self.sw_violation(key, &format!("malformed SWITCH: {e}"), now),
        };
        let at = (chan, cell.circ_id);
        if self.sw.peers.get(&key).is_some_and(|p| p.old == at) {
            return self.peer_marker(key, marker, now);
        }
        if self.sw.movers.get(&key).is_some_and(|m| m.old == at) {
            return self.mover_marker(key, marker, now);
        }
        self.sw_violation(key, &"SWITCH without an accepted switch", now);
    }

    /// Steps 4 and 5 at the peer: release the held forward cells, cut the backward direction
    /// over behind its own marker.
    fn peer_marker(&mut self, key: CircKey, marker: SwitchMarker, now: Instant) {
        let sent = self
            .circuits
            .get(&key)
            .map_or(0, |c| c.sw.sent[ix(Side::Prev)]);
        let Some(p) = self.sw.peers.get_mut(&key) else {
            return;
        };
        let (released, own) = match p.ps.on_marker(marker, sent) {
            Ok(r) => r,
            Err(v) => {
                if let ConnViolation::WrongCount { claimed, received } = v {
                    self.sw.stats.cells_lost += claimed.saturating_sub(received);
                }
                return self.sw_violation(key, &v, now);
            }
        };
        let (old, new) = (p.old, p.new);
        self.sw.peers.remove(&key);
        self.sw.ends.remove(&old);
        self.sw.ends.remove(&new);
        *self.sw.seq.entry(key).or_insert(0) += 1;
        self.send_marker(old.0, old.1, own);
        self.rebind(key, Side::Prev, new, now);
        if let Some(ch) = self.channels.get_mut(&old.0) {
            ch.circ_ids.remove(&old.1);
        }
        if let Some(c) = self.circuits.get_mut(&key) {
            c.sw.recv[ix(Side::Prev)] = 0;
        }
        self.sw.stats.accepted += 1;
        self.sw.stats.cells_held += released.len() as u64;
        info!(
            ?key,
            held = released.len(),
            "circuit moved to the new connection (peer)"
        );
        for mut cell in released {
            self.on_relay(new.0, &mut cell, now);
        }
    }

    /// Step 5 at the mover: the peer's marker ends the backward direction on C1.
    fn mover_marker(&mut self, key: CircKey, marker: SwitchMarker, now: Instant) {
        let Some(m) = self.sw.movers.get_mut(&key) else {
            return;
        };
        if m.ms.state() != crate::switching::MoverState::Moved {
            return self.sw_violation(key, &"SWITCH before the cut-over", now);
        }
        let released = match m.ms.backward().on_marker(marker) {
            Ok(r) => r,
            Err(v) => {
                if let ConnViolation::WrongCount { claimed, received } = v {
                    self.sw.stats.cells_lost += claimed.saturating_sub(received);
                }
                return self.sw_violation(key, &v, now);
            }
        };
        let (old, new) = (m.old, m.new);
        self.sw.movers.remove(&key);
        self.sw.ends.remove(&old);
        self.sw.ends.remove(&new);
        *self.sw.seq.entry(key).or_insert(0) += 1;
        if let Some(ch) = self.channels.get_mut(&old.0) {
            ch.circ_ids.remove(&old.1);
        }
        if let Some(c) = self.circuits.get_mut(&key) {
            c.sw.recv[ix(Side::Next)] = 0;
        }
        self.sw.stats.completed += 1;
        self.sw.stats.cells_held += released.len() as u64;
        debug!(
            ?key,
            held = released.len(),
            "switch complete in both directions"
        );
        for mut cell in released {
            self.on_relay(new.0, &mut cell, now);
        }
    }

    /// Step 2: SWITCH_CONN on `chan` with the new id the cell names.
    pub(in crate::node) fn on_switch_conn(&mut self, chan: ChannelId, cell: Cell, now: Instant) {
        let y = cell.circ_id;
        if y == 0 {
            debug!(?chan, "SWITCH_CONN on circuit id 0: dropped");
            return;
        }
        let refuse = |core: &mut Core, why: &str, kill: Option<CircKey>| {
            warn!(?chan, new_id = y, reason = why, "refusing SWITCH_CONN");
            core.sw.stats.violations += 1;
            core.send_destroy(chan, y, DestroyReason::PROTOCOL);
            if let Some(key) = kill {
                core.kill(key, &format!("bad SWITCH_CONN: {why}"), now);
            }
        };
        let Some(peer) = self.channels.get(&chan).and_then(|c| c.peer) else {
            return refuse(self, "from a client", None);
        };
        let req = match SwitchConn::decode(&cell.payload) {
            Ok(r) => r,
            Err(e) => return refuse(self, &format!("malformed: {e}"), None),
        };
        if let Some(key) = self.lookup(chan, y) {
            return refuse(self, "new circuit id already in use", Some(key));
        }
        if let Some(&(key, _)) = self.sw.ends.get(&(chan, y)) {
            return refuse(self, "new circuit id already in a switch", Some(key));
        }
        if self.sw.settings.mode != SwitchMode::Connection {
            let ack = SwitchAck {
                seq: req.seq,
                status: SwitchStatus::DISABLED,
            };
            if let Ok(c) = Cell::new(y, CellCommand::SWITCH_ACK, &ack.encode()) {
                self.push_urgent(chan, c);
            }
            return;
        }
        // The circuit: id X on another channel from the same peer, whose previous hop it is.
        let found = self.channels.iter().find_map(|(&c, ch)| {
            if c == chan || ch.peer != Some(peer) {
                return None;
            }
            ch.circ_ids.get(&req.old_circ_id).map(|k| (c, *k))
        });
        let Some((c1, key)) = found else {
            return refuse(self, "unknown circuit", None);
        };
        let Some(circ) = self.circuits.get(&key) else {
            return refuse(self, "unknown circuit", None);
        };
        if circ.prev != Some((c1, req.old_circ_id)) || circ.is_origin() {
            // The sender is the circuit's next hop (or it is ours): not the hop that may move it.
            return refuse(self, "the sender is not the circuit's previous hop", None);
        }
        let received_on_old = circ.sw.recv[ix(Side::Prev)];
        if self.sw.peers.contains_key(&key) || self.sw.movers.contains_key(&key) {
            return refuse(self, "circuit already in a switch", Some(key));
        }
        let expected = self.sw.seq.get(&key).copied().unwrap_or(0);
        if req.seq != expected {
            return refuse(
                self,
                &format!(
                    "switch number {} (expected {expected}): replayed or skipped",
                    req.seq
                ),
                Some(key),
            );
        }
        let pending = self
            .sw
            .peers
            .values()
            .filter(|p| self.channels.get(&p.new.0).and_then(|c| c.peer) == Some(peer))
            .count();
        if pending >= crate::switching::MAX_PENDING_PER_PEER {
            // An honest mover keeps within the limit itself.
            return refuse(self, "too many switches pending from this peer", None);
        }
        let (ps, ack) = PeerSwitch::accept(
            req.seq,
            received_on_old,
            self.cfg.max_circuit_queue,
            now,
            self.sw.settings.timeout,
        );
        self.sw.ends.insert((c1, req.old_circ_id), (key, End::Old));
        self.sw.ends.insert((chan, y), (key, End::New));
        self.sw.peers.insert(
            key,
            Peer {
                ps,
                old: (c1, req.old_circ_id),
                new: (chan, y),
            },
        );
        debug!(?key, seq = req.seq, "SWITCH_CONN accepted");
        if let Ok(c) = Cell::new(y, CellCommand::SWITCH_ACK, &ack.encode()) {
            self.push_urgent(chan, c);
        }
    }
}
