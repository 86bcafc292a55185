//! The exit's side of the path variant: a LINK makes or joins a set, the client's
//! multiplexed cells from any leg are put back in order, SWITCH_CONFIRM acknowledgements move
//! stream-level flow control, and a violation dissolves the set. The tables and the client's
//! side are in the parent module (`node/path.rs`).

use super::*;

impl Core {
    /// Exit: close every leg of set `id` (`why`: a protocol violation, logged; None: the home
    /// closed and took the set with it).
    pub(super) fn path_exit_dissolve(&mut self, id: u64, why: Option<&str>, now: Instant) {
        let Some(set) = self.path.exit.remove(&id) else {
            return;
        };
        self.path.exit_nonce.retain(|_, v| *v != id);
        for leg in &set.legs {
            self.path.exit_leg.remove(leg);
        }
        if let Some(why) = why {
            self.sw.stats_mut().violations += 1;
            warn!(home = ?set.home, legs = set.legs.len(), reason = why,
                  "linked set closed for a protocol violation");
        }
        for leg in set.legs {
            match why {
                Some(w) => self.kill(leg, &format!("linked set: {w}"), now),
                None => self.close_circuit_inner(
                    leg,
                    DestroyReason::FINISHED,
                    None,
                    now,
                    "its linked set's home closed",
                ),
            }
        }
    }

    /// Exit: the client acknowledges our SWITCH_CONFIRM on leg `key` (it echoes the number):
    /// it will not fall back from `key` any more, so stream-level flow control may go there.
    /// An acknowledgement of nothing we sent on that leg closes the set.
    pub(super) fn path_exit_on_ack(&mut self, key: CircKey, data: &[u8], now: Instant) {
        let Some(&id) = self.path.exit_leg.get(&key) else {
            self.sw.stats_mut().violations += 1;
            return self.kill(key, "SWITCH_CONFIRM on a circuit that is not linked", now);
        };
        let seq = match SwitchConfirm::decode(data) {
            Ok(c) => c.seq,
            Err(e) => {
                return self.path_exit_dissolve(
                    id,
                    Some(&format!("malformed SWITCH_CONFIRM acknowledgement: {e}")),
                    now,
                )
            }
        };
        let Some(set) = self.path.exit.get_mut(&id) else {
            return;
        };
        let Some(i) = set.unacked.iter().position(|&u| u == (key, seq)) else {
            return self.path_exit_dissolve(
                id,
                Some("SWITCH_CONFIRM acknowledges no confirmation sent on that leg"),
                now,
            );
        };
        set.unacked.swap_remove(i);
        // Acknowledgements of two legs may cross: the later switch wins.
        if seq >= set.control.1 {
            set.control = (key, seq);
        }
    }

    pub(super) fn path_on_link(&mut self, key: CircKey, data: &[u8], now: Instant) {
        if self.sw.settings().mode != SwitchMode::Path {
            debug!(?key, "CONFLUX_LINK while path switching is off: ignored");
            return;
        }
        let link = match ConfluxLink::decode(data) {
            Ok(l) => l,
            Err(e) => return self.kill(key, &format!("malformed CONFLUX_LINK: {e}"), now),
        };
        let Some(circ) = self.circuits.get(&key) else {
            return;
        };
        match &circ.role {
            Role::Relay { edge: None, .. } if circ.next.is_none() && self.cfg.exit => {}
            Role::Relay { edge: Some(_), .. } => {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, "CONFLUX_LINK on a circuit that carried streams", now);
            }
            _ => {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, "CONFLUX_LINK at a relay that is not the exit", now);
            }
        }
        if self.path.exit_leg.contains_key(&key) {
            self.sw.stats_mut().violations += 1;
            return self.kill(key, "CONFLUX_LINK repeated", now);
        }
        let limits = self.path_limits();
        let id = match self.path.exit_nonce.get(&link.nonce) {
            Some(&id) => {
                let Some(set) = self.path.exit.get_mut(&id) else {
                    return;
                };
                if let Err(e) = set.recv.add_leg(key) {
                    self.sw.stats_mut().violations += 1;
                    return self.kill(key, &format!("CONFLUX_LINK refused: {e}"), now);
                }
                set.legs.push(key);
                id
            }
            None => {
                let id = self.path.next_set;
                self.path.next_set += 1;
                self.path.exit_nonce.insert(link.nonce, id);
                self.path.exit.insert(
                    id,
                    ExitSet {
                        home: key,
                        control: (key, 0),
                        unacked: Vec::new(),
                        legs: vec![key],
                        recv: PathReceiver::new(key, limits),
                    },
                );
                id
            }
        };
        self.path.exit_leg.insert(key, id);
        // Every leg keeps its own circuit window for the DATA it carries.
        let window = self.new_circuit_window();
        if let Some(Role::Relay { edge, .. }) = self.circuits.get_mut(&key).map(|c| &mut c.role) {
            edge.get_or_insert_with(|| crate::node::stream::Edge::new(window));
        }
        debug!(?key, set = id, "circuit linked");
        let body = ConfluxLink {
            last_seqno_sent: 0,
            last_seqno_recv: 0,
            ..link
        }
        .encode();
        self.send_relay_backward(key, RelayCommand::CONFLUX_LINKED, 0, &body, now);
    }

    /// Exit: whether `key` is a leg of a linked set (its multiplexed cells are sequenced).
    pub(in crate::node) fn path_exit_set(&self, key: CircKey) -> Option<u64> {
        self.path.exit_leg.get(&key).copied()
    }

    /// Exit: a multiplexed cell arrived on leg `key` of set `id` (its circuit-level flow
    /// control is already counted on `key`): sequence it and act on what is now in order.
    pub(in crate::node) fn path_exit_cell(
        &mut self,
        id: u64,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        data: &[u8],
        now: Instant,
    ) {
        let Some(set) = self.path.exit.get_mut(&id) else {
            return;
        };
        let before = set.recv.buffered();
        match set.recv.on_cell(key, (cmd, sid, data.to_vec())) {
            Ok(Arrival::Accepted) => {
                let now_buffered = set.recv.buffered();
                if now_buffered > before {
                    let st = self.sw.stats_mut();
                    st.path_out_of_order += 1;
                    st.path_out_of_order_peak = st.path_out_of_order_peak.max(now_buffered as u64);
                }
            }
            Ok(Arrival::Duplicate) => {
                self.sw.stats_mut().path_duplicates += 1;
                return;
            }
            Err(e) => return self.path_exit_dissolve(id, Some(&e.to_string()), now),
        }
        let home = set.home;
        while let Some((cmd, sid, data)) = self
            .path
            .exit
            .get_mut(&id)
            .and_then(|s| s.recv.poll_deliver())
        {
            match cmd {
                RelayCommand::BEGIN => self.on_begin(home, sid, &data, now),
                RelayCommand::RESOLVE => self.on_resolve(home, sid, &data, now),
                RelayCommand::DATA => self.edge_data_stream(home, sid, &data, now),
                RelayCommand::END => self.edge_end(home, sid, &data, now),
                other => self.kill(home, &format!("{other} toward the exit"), now),
            }
        }
    }
}
