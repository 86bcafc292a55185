//! The exit's side of the path variant: a LINK makes or joins a set, the client's
//! multiplexed cells from any leg are put back in order, SWITCH_CONFIRM acknowledgements move
//! stream-level flow control, and a violation dissolves the set. The tables and the client's
//! side are in the parent module (`node/path.rs`).

use super::*;

impl Core {
    /// Exit: close every leg of set `id` (`why`: a protocol violation, logged; None: the home
    /// closed and took the set with it).
    pub(super) fn path_exit_dissolve(&mut self, id: u64, why: Option<&str>, now: Instant) {
        let Some(set) = self.path_exit_remove(id) else {
            return;
        };
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

    /// Exit: take set `id` out of the tables (its buffer no longer counts).
    fn path_exit_remove(&mut self, id: u64) -> Option<ExitSet> {
        let set = self.path.exit.remove(&id)?;
        self.path.exit_buffered = self.path.exit_buffered.saturating_sub(set.recv.buffered());
        self.path.exit_nonce.retain(|_, v| *v != id);
        for leg in &set.legs {
            self.path.exit_leg.remove(leg);
        }
        Some(set)
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
                set.peak_legs = set.peak_legs.max(set.legs.len());
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
                        withheld: Vec::new(),
                        pending_data: HashMap::new(),
                        peak_legs: 1,
                    },
                );
                id
            }
        };
        self.path.exit_leg.insert(key, id);
        // Every leg keeps its own circuit window for the DATA it carries, as it agreed.
        let window = self.agreed_window(key);
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

    /// Exit: a multiplexed cell arrived on leg `key` of set `id` (counted in `key`'s circuit
    /// window already; `sendme`: the circuit SENDME that count made due, to send now or to
    /// withhold while `key` is ahead and the buffer high): sequence it and act on what is
    /// now in order.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::node) fn path_exit_cell(
        &mut self,
        id: u64,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        data: &[u8],
        sendme: Option<[u8; 20]>,
        now: Instant,
    ) {
        let Some(set) = self.path.exit.get_mut(&id) else {
            return;
        };
        let before = set.recv.buffered();
        let arrival = set.recv.on_cell(key, (now, (cmd, sid, data.to_vec())));
        let after = set.recv.buffered();
        self.path.exit_buffered = (self.path.exit_buffered + after).saturating_sub(before);
        let accepted = match arrival {
            Ok(Arrival::Accepted) => {
                if after > before {
                    let st = self.sw.stats_mut();
                    st.path_out_of_order += 1;
                    st.path_out_of_order_peak = st.path_out_of_order_peak.max(after as u64);
                }
                true
            }
            Ok(Arrival::Duplicate) => {
                self.sw.stats_mut().path_duplicates += 1;
                false
            }
            Err(e) => return self.path_exit_dissolve(id, Some(&e.to_string()), now),
        };
        if let Some(digest) = sendme {
            self.path_exit_sendme(id, key, digest, now);
        }
        if !accepted {
            return;
        }
        if cmd == RelayCommand::DATA && !self.path_exit_stream_bound(id, sid, now) {
            return;
        }
        let home = set_home(&self.path, id);
        let mut delivered = false;
        while let Some((_, (cmd, sid, data))) = self
            .path
            .exit
            .get_mut(&id)
            .and_then(|s| s.recv.poll_deliver())
        {
            delivered = true;
            match cmd {
                RelayCommand::BEGIN => self.on_begin(home, sid, &data, now),
                RelayCommand::RESOLVE => self.on_resolve(home, sid, &data, now),
                RelayCommand::DATA => {
                    let limit = self.path_exit_delivered(id, sid);
                    if let Some(st) = self.stream_mut(home, sid) {
                        st.flow.set_receive_limit(limit);
                    }
                    self.edge_data_stream(home, sid, &data, now)
                }
                RelayCommand::END => self.edge_end(home, sid, &data, now),
                other => self.kill(home, &format!("{other} toward the exit"), now),
            }
        }
        if delivered {
            self.path_exit_release(id, now);
        }
        if after > before {
            self.check_mem_in_queues(now);
        }
    }

    /// Exit: a DATA cell of stream `sid` was accepted by set `id`'s receiver. Count it, and
    /// check the stream's bound: its client keeps a 500-cell stream window per leg (fixed
    /// windows; `crate::streamflow::LegWindows`), and every cell it charged and the exit has
    /// not acknowledged is either held here out of order or delivered and unacknowledged,
    /// so together they stay within one window per leg the set has had. More is a client
    /// that ignored its windows: the set closes (logged), the exit's other circuits go on.
    /// False if it closed. Streams under XON/XOFF (congestion control) have no stream window:
    /// the set's own bound ([`PathLimits::max_buffered`]) covers them.
    fn path_exit_stream_bound(&mut self, id: u64, sid: u16, now: Instant) -> bool {
        let edge = self
            .circuits
            .get(&set_home(&self.path, id))
            .and_then(|c| c.edge());
        let windowed = edge.is_some_and(|e| e.window.policy().keeps_stream_window());
        let delivered = edge
            .and_then(|e| e.streams.get(&sid))
            .and_then(|st| st.flow.received_unacked())
            .unwrap_or(0);
        let Some(set) = self.path.exit.get_mut(&id) else {
            return false;
        };
        let held = set.pending_data.entry(sid).or_insert(0);
        *held += 1;
        let held = *held;
        let bound = stream_bound(set.peak_legs);
        if windowed && u64::from(held) + u64::from(delivered) > u64::from(bound) {
            let why = format!(
                "stream {sid}: {held} cells held out of order and {delivered} delivered \
                 unacknowledged, beyond one stream window per leg ({bound})"
            );
            self.path_exit_dissolve(id, Some(&why), now);
            return false;
        }
        true
    }

    /// Exit: a DATA cell of stream `sid` leaves set `id`'s receiver in order. Returns the
    /// receive limit of the stream's window: one window per leg the set has had.
    fn path_exit_delivered(&mut self, id: u64, sid: u16) -> u32 {
        let Some(set) = self.path.exit.get_mut(&id) else {
            return crate::flow::STREAM_WINDOW;
        };
        if let Some(n) = set.pending_data.get_mut(&sid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                set.pending_data.remove(&sid);
            }
        }
        stream_bound(set.peak_legs)
    }

    /// Exit: the circuit SENDME `digest` is due on leg `key` of set `id`: send it, or keep it
    /// while the leg is ahead and the set's buffer is high, so the client's window on that
    /// leg stops refilling (see [`crate::switching::PathLimits`]).
    fn path_exit_sendme(&mut self, id: u64, key: CircKey, digest: [u8; 20], now: Instant) {
        let Some(set) = self.path.exit.get_mut(&id) else {
            return;
        };
        let earlier = set.withheld.iter().any(|(l, w)| *l == key && !w.is_empty());
        if earlier || set.recv.withholds(key) {
            // Behind earlier withheld ones too: the sender expects its SENDMEs in order.
            match set.withheld.iter_mut().find(|(l, _)| *l == key) {
                Some((_, w)) => w.push(digest),
                None => set.withheld.push((key, vec![digest])),
            }
            self.sw.stats_mut().path_sendmes_withheld += 1;
            if !set.recv.withholds(key) {
                self.path_exit_release(id, now);
            }
            return;
        }
        let body = Sendme {
            digest: Some(digest),
        }
        .encode();
        self.send_edge(key, RelayCommand::SENDME, 0, &body, now);
    }

    /// Exit: send the withheld SENDMEs of every leg of set `id` that is no longer held back
    /// (the buffer went below the threshold, or the leg is not ahead any more).
    fn path_exit_release(&mut self, id: u64, now: Instant) {
        let Some(set) = self.path.exit.get_mut(&id) else {
            return;
        };
        let mut release = Vec::new();
        for (leg, digests) in &mut set.withheld {
            if !digests.is_empty() && !set.recv.withholds(*leg) {
                release.push((*leg, std::mem::take(digests)));
            }
        }
        set.withheld.retain(|(_, w)| !w.is_empty());
        for (leg, digests) in release {
            debug!(
                set = id,
                ?leg,
                n = digests.len(),
                "releasing withheld circuit SENDMEs"
            );
            for digest in digests {
                let body = Sendme {
                    digest: Some(digest),
                }
                .encode();
                self.send_edge(leg, RelayCommand::SENDME, 0, &body, now);
            }
        }
    }

    /// Exit: cells buffered out of order over every linked set (for `MaxMemInQueues`).
    pub(in crate::node) fn path_exit_buffered(&self) -> usize {
        self.path.exit_buffered
    }

    /// Exit, for the OOM handler: each set with a non-empty buffer, the arrival of its oldest
    /// buffered cell and how many cells it buffers.
    pub(in crate::node) fn path_exit_oom_candidates(&self) -> Vec<(u64, Instant, usize)> {
        self.path
            .exit
            .iter()
            .filter_map(|(&id, set)| {
                let oldest = set.recv.buffered_cells().map(|(at, _)| *at).min()?;
                Some((id, oldest, set.recv.buffered()))
            })
            .collect()
    }

    /// Exit, OOM handler: close set `id` (every leg, DESTROY with RESOURCELIMIT) to free its
    /// out-of-order buffer.
    pub(in crate::node) fn path_exit_oom_kill(&mut self, id: u64, now: Instant) {
        let Some(set) = self.path_exit_remove(id) else {
            return;
        };
        warn!(home = ?set.home, legs = set.legs.len(), buffered = set.recv.buffered(),
              "linked set closed: out of memory (MaxMemInQueues), its out-of-order buffer held the oldest data");
        for leg in set.legs {
            self.kill_with(
                leg,
                DestroyReason::RESOURCELIMIT,
                "out of memory (MaxMemInQueues): its linked set's out-of-order buffer held the oldest data",
                now,
            );
        }
    }
}

/// The most DATA cells a set's stream may have unacknowledged at the exit: one stream window
/// per leg (`legs` capped at [`crate::switching::path::MAX_LEGS`]).
fn stream_bound(legs: usize) -> u32 {
    let legs = legs.clamp(1, crate::switching::path::MAX_LEGS) as u32;
    legs * crate::flow::STREAM_WINDOW
}

fn set_home(tables: &PathTables, id: u64) -> CircKey {
    tables.exit.get(&id).map_or(CircKey(0), |s| s.home)
}
