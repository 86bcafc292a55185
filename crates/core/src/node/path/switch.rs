//! The client's side of a switch in the path variant: a CONGESTED report from the entry of the
//! leg in use, the checks that may keep the upload where it is (the avoid window, the lighter-leg
//! rule, the probe of the other leg: `probe.rs`), and the move onto the other leg with what held
//! its first cell. The tables are in the parent module (`node/path.rs`).

use super::*;

impl Core {
    /// Client: the entry of `key` reports its connection congested.
    pub(super) fn path_on_congested(&mut self, key: CircKey, now: Instant) {
        self.sw.stats_mut().congested_received += 1;
        if self.path_striping() {
            // Striping uses every leg with room already; a loaded entry shows in its leg's
            // round trip and window (`switching::legs`).
            debug!(?key, "CONGESTED while striping: nothing to move");
            return;
        }
        let Some(home) = self.path_home_of(key) else {
            debug!(?key, "CONGESTED on a circuit without a spare: ignored");
            return;
        };
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        let (Some(spare), Some(current)) = (set.spare, set.sender.current()) else {
            debug!(?key, "CONGESTED before the spare is linked: ignored");
            return;
        };
        set.avoid(key, now + self.sw.settings().leg_avoid, now);
        if current != key {
            // Not on this leg any more (or not yet): nothing to move.
            return;
        }
        let to = if key == home { spare } else { home };
        if set.avoided(to, now) {
            debug!(?home, from = ?key, ?to, "both legs congested lately: staying");
            self.sw.stats_mut().congested_ignored += 1;
            return;
        }
        if set.sender.is_pending() {
            // A switch waits for its confirmation: one at a time.
            return;
        }
        if self.sw.settings().lighter_leg_only && self.sw.settings().probe_legs {
            // Probed ahead, recently: that answer decides now, with no probe's wait.
            match self.path_fresh_answer(home, key, to, now) {
                Some(true) => {
                    info!(?home, from = ?key, ?to,
                          "entry congested, but the other leg's last probe is heavier: staying");
                    self.sw.stats_mut().congested_ignored += 1;
                    return;
                }
                Some(false) => return self.path_move(home, key, to, now, now),
                None => {}
            }
            if self.path_adopt_probe(home, key, to, now) {
                return;
            }
            let Some(set) = self.path.client.get_mut(&home) else {
                return;
            };
            match set.probe {
                Some(p) if p.deciding.is_some() => {
                    debug!(?home, from = ?key, "a probe of the other leg decides already");
                    return;
                }
                // An earlier probe is unanswered past its deadline: the estimates decide.
                Some(_) => {}
                None if set.rtt.probe_wait(key).is_some() => {
                    return self.path_send_probe(home, key, to, now);
                }
                // The current leg is unmeasured: nothing to compare an answer with.
                None => {}
            }
        }
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        if self.sw.settings().lighter_leg_only && set.rtt.heavier(to, key) {
            info!(
                ?home,
                from = ?key,
                ?to,
                from_rtt_ms = set.rtt.smoothed(key).map(|d| d.as_millis() as u64),
                to_rtt_ms = set.rtt.smoothed(to).map(|d| d.as_millis() as u64),
                "entry congested, but the other leg measures heavier: staying"
            );
            self.sw.stats_mut().congested_ignored += 1;
            return;
        }
        self.path_move(home, key, to, now, now);
    }

    /// Client: move `home`'s upload from leg `key` to leg `to` on a CONGESTED report that
    /// arrived at `triggered` (earlier than `now` if a probe of `to` decided).
    pub(super) fn path_move(
        &mut self,
        home: CircKey,
        key: CircKey,
        to: CircKey,
        triggered: Instant,
        now: Instant,
    ) {
        let from = self.first_chan(key);
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        if set.sender.switch_to(to, now).is_err() {
            // A switch waits for its confirmation: one at a time.
            return;
        }
        set.switch = Some(PendingRecord {
            triggered,
            from: from.unwrap_or(ChannelId(0)),
            to: None,
            first_cell: None,
            last_old: None,
            held_by: None,
        });
        let to_chan = self.first_chan(to);
        if let Some(rec) = self
            .path
            .client
            .get_mut(&home)
            .and_then(|s| s.switch.as_mut())
        {
            rec.to = to_chan;
        }
        self.sw.stats_mut().triggered += 1;
        let circ_id = self
            .circuits
            .get(&key)
            .and_then(|c| c.next)
            .map(|(_, id)| id);
        info!(?home, from = ?key, ?to, ?circ_id, "entry congested: moving the streams to the other leg");
        // Anything waiting (stream data) goes on the new leg now.
        self.package_all(home, now);
        let held_by = self.path_switch_hold(home, to);
        if let Some(rec) = self
            .path
            .client
            .get_mut(&home)
            .and_then(|s| s.switch.as_mut())
        {
            if rec.first_cell.is_none() {
                rec.held_by = held_by;
            }
        }
    }

    /// Client, right after a switch of `home`'s streams to `to` found no cell to send: what
    /// held it (for the switch record's breakdown of the trigger→first-cell time).
    fn path_switch_hold(&self, home: CircKey, to: CircKey) -> Option<SwitchHold> {
        let edge = self.circuits.get(&home)?.edge()?;
        let mut waiting = edge.streams.values().filter(|s| !s.pending.is_empty());
        let Some(first) = waiting.next() else {
            return Some(SwitchHold::NoData);
        };
        if !first.can_package_on(to) && waiting.all(|s| !s.can_package_on(to)) {
            return Some(SwitchHold::StreamWindow);
        }
        if self
            .path
            .client
            .get(&home)
            .is_some_and(|s| s.sender.is_blocked())
        {
            return Some(SwitchHold::Kept);
        }
        let leg = self.circuits.get(&to)?;
        if !leg.edge().is_some_and(|e| e.window.can_package()) {
            return Some(SwitchHold::CircuitWindow);
        }
        Some(SwitchHold::Queue)
    }
}
