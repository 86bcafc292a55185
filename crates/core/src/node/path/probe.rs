//! Path variant, client: measuring the leg it is not using before acting on a CONGESTED
//! report. The upload's leg is measured all the time (its circuit SENDMEs); the other leg only
//! when it last carried data, or at its LINK, so its estimate is stale: a leg left loaded still
//! looks heavy after others left it, a never-used spare looks idle. So the client sends a
//! LEG_PROBE on the other leg when the report arrives, the exit answers it at once on the same
//! leg, and the answer decides: within 1.1 × the current leg's round trip (`SetRtt::probe_wait`)
//! the upload moves the moment it arrives; by then nothing means the other leg is heavier (the
//! client stays; a late answer still updates the estimate). While a probe stays unanswered
//! (the exit does not answer, or the leg is very slow), later reports fall back to the
//! estimates (`SetRtt::heavier`) and no new probe goes out; so do reports while the current
//! leg is measured only at its LINK (`SetRtt::probe_wait` is None: nothing loaded to compare
//! with). With `probe_ahead` (`SwitchLegProbe = 2`) the other leg is probed while the upload
//! runs (on the current leg's circuit SENDMEs, at most once per `PROBE_AHEAD_EVERY`), so a
//! report finds a fresh answer and is decided at once: the probe's round trip leaves the
//! switch time. docs/protocol.md, "Path variant".

use chive_cell::LegProbe;

use super::*;
use crate::node::switch_report::{PROBE_AHEAD_EVERY, PROBE_FRESH};

/// The client's probe on one leg.
#[derive(Clone, Copy, Debug)]
pub(super) struct Probe {
    /// The leg probed (the one the upload is not on).
    pub(super) leg: CircKey,
    /// Its id (the answer must carry it).
    pub(super) id: u64,
    /// When it went out.
    pub(super) sent: Instant,
    /// While the answer decides a report: until when, and the report.
    pub(super) deciding: Option<Deciding>,
}

/// A CONGESTED report waiting for a probe's answer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deciding {
    /// No answer by then: the probed leg is heavier.
    pub(super) deadline: Instant,
    /// The leg reported congested (the upload's).
    pub(super) from: CircKey,
    /// When the report arrived (the switch record's trigger).
    pub(super) reported: Instant,
}

impl Core {
    /// Client: a CONGESTED report for `from` (the upload's leg); measure `to` before acting.
    pub(super) fn path_send_probe(
        &mut self,
        home: CircKey,
        from: CircKey,
        to: CircKey,
        now: Instant,
    ) {
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        let Some(wait) = set.rtt.probe_wait(from) else {
            return;
        };
        set.probe_id = set.probe_id.wrapping_add(1);
        let id = set.probe_id;
        set.probe_sent = Some(now);
        set.probe = Some(Probe {
            leg: to,
            id,
            sent: now,
            deciding: Some(Deciding {
                deadline: now + wait,
                from,
                reported: now,
            }),
        });
        self.sw.stats_mut().leg_probes += 1;
        debug!(
            ?home,
            ?from,
            ?to,
            ?wait,
            "entry congested: probing the other leg first"
        );
        let body = LegProbe { id }.encode();
        self.send_to_exit(to, RelayCommand::LEG_PROBE, 0, &body, now);
    }

    /// Client: LEG_PROBE from the last hop of `key`: the answer to our probe on that leg. An
    /// answer to nothing we sent (another leg, another id, no probe out) closes that circuit.
    pub(super) fn path_on_probe_answer(&mut self, key: CircKey, data: &[u8], now: Instant) {
        let id = match LegProbe::decode(data) {
            Ok(p) => p.id,
            Err(e) => {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, &format!("malformed LEG_PROBE: {e}"), now);
            }
        };
        let home = self.path_home_of(key);
        let probe = home
            .and_then(|h| self.path.client.get(&h))
            .and_then(|s| s.probe)
            .filter(|p| p.leg == key && p.id == id);
        let (Some(home), Some(probe)) = (home, probe) else {
            self.sw.stats_mut().violations += 1;
            return self.kill(
                key,
                "LEG_PROBE answer to no probe sent on that circuit",
                now,
            );
        };
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        set.probe = None;
        set.probe_answer = Some((key, now));
        let rtt = now.saturating_duration_since(probe.sent);
        set.rtt.probed(key, rtt);
        let Some(d) = probe.deciding else {
            debug!(?home, leg = ?key, ?rtt, "late probe answer: estimate updated");
            return;
        };
        // The upload may have moved meanwhile (a fallback): then there is nothing to decide.
        if set.sender.current() != Some(d.from) || set.sender.is_pending() {
            return;
        }
        if set.rtt.heavier_now(key, d.from) {
            info!(?home, from = ?d.from, to = ?key, to_rtt_ms = rtt.as_millis() as u64,
                  from_rtt_ms = set.rtt.now(d.from).map(|r| r.as_millis() as u64),
                  "entry congested, but the probed leg is heavier: staying");
            self.sw.stats_mut().congested_ignored += 1;
            return;
        }
        debug!(?home, from = ?d.from, to = ?key, ?rtt, "the probed leg is lighter: moving");
        self.path_move(home, d.from, key, d.reported, now);
    }

    /// Client, with `probe_ahead`: a circuit SENDME came on `key`. If `key` carries its set's
    /// upload, no probe is out and the last went out at least `PROBE_AHEAD_EVERY` ago,
    /// probe the other leg now (no report waits for it: its answer only updates the estimate
    /// and is what the next report is decided by, while fresh).
    pub(in crate::node) fn path_probe_ahead(&mut self, key: CircKey, now: Instant) {
        let st = self.sw.settings();
        if !(st.lighter_leg_only && st.probe_legs && st.probe_ahead) {
            return;
        }
        let Some(home) = self.path_home_of(key) else {
            return;
        };
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        let (Some(spare), Some(current)) = (set.spare, set.sender.current()) else {
            return;
        };
        if current != key || set.sender.is_pending() || set.probe.is_some() {
            return;
        }
        let last = set.probe_sent;
        if last.is_some_and(|t| now.saturating_duration_since(t) < PROBE_AHEAD_EVERY) {
            return;
        }
        let to = if key == home { spare } else { home };
        set.probe_id = set.probe_id.wrapping_add(1);
        let id = set.probe_id;
        set.probe = Some(Probe {
            leg: to,
            id,
            sent: now,
            deciding: None,
        });
        set.probe_sent = Some(now);
        self.sw.stats_mut().leg_probes += 1;
        let body = LegProbe { id }.encode();
        self.send_to_exit(to, RelayCommand::LEG_PROBE, 0, &body, now);
    }

    /// Client, with `probe_ahead`: a report for `from` (the upload's leg) finds the other
    /// leg `to` answered a probe within `PROBE_FRESH`: Some(whether `to` is heavier now), to
    /// decide at once; None: no fresh answer (probe as without `probe_ahead`).
    pub(super) fn path_fresh_answer(
        &self,
        home: CircKey,
        from: CircKey,
        to: CircKey,
        now: Instant,
    ) -> Option<bool> {
        if !self.sw.settings().probe_ahead {
            return None;
        }
        let set = self.path.client.get(&home)?;
        let (leg, at) = set.probe_answer?;
        if leg != to || now.saturating_duration_since(at) > PROBE_FRESH {
            return None;
        }
        Some(set.rtt.heavier_now(to, from))
    }

    /// Client, with `probe_ahead`: a report for `from` finds a probe of `to` out, sent within
    /// `PROBE_FRESH` and not answered yet. It decides the report as a probe sent at that
    /// moment would have: its answer still due within 1.1 × `from`'s round trip of its sending
    /// moves the upload when it comes; past that, `to` is at least that slow and the client
    /// stays. Returns whether it handled the report (false: no such probe, or `from` is
    /// unmeasured; the caller goes on as without `probe_ahead`).
    pub(super) fn path_adopt_probe(
        &mut self,
        home: CircKey,
        from: CircKey,
        to: CircKey,
        now: Instant,
    ) -> bool {
        if !self.sw.settings().probe_ahead {
            return false;
        }
        let Some(set) = self.path.client.get_mut(&home) else {
            return false;
        };
        let (Some(p), Some(wait)) = (set.probe.as_mut(), set.rtt.probe_wait(from)) else {
            return false;
        };
        if p.leg != to
            || p.deciding.is_some()
            || now.saturating_duration_since(p.sent) > PROBE_FRESH
        {
            return false;
        }
        let deadline = p.sent + wait;
        if deadline > now {
            p.deciding = Some(Deciding {
                deadline,
                from,
                reported: now,
            });
            return true;
        }
        info!(
            ?home,
            ?from,
            ?to,
            out_ms = now.saturating_duration_since(p.sent).as_millis() as u64,
            "entry congested, but the other leg's probe is still unanswered: staying"
        );
        self.sw.stats_mut().leg_probes_late += 1;
        self.sw.stats_mut().congested_ignored += 1;
        true
    }

    /// Client: time passed; a probe that did not answer in time says its leg is heavier.
    pub(super) fn path_probe_timeout(&mut self, home: CircKey, now: Instant) {
        let Some(set) = self.path.client.get_mut(&home) else {
            return;
        };
        let Some(p) = set.probe.as_mut() else {
            return;
        };
        let Some(d) = p.deciding.filter(|d| d.deadline <= now) else {
            return;
        };
        p.deciding = None;
        info!(?home, from = ?d.from, to = ?p.leg,
              waited_ms = now.saturating_duration_since(p.sent).as_millis() as u64,
              "entry congested, but the other leg did not answer its probe in time: staying");
        self.sw.stats_mut().leg_probes_late += 1;
        self.sw.stats_mut().congested_ignored += 1;
    }

    /// Exit: LEG_PROBE from the client on `key`: answer at once with the same body on the same
    /// leg (one cell back per cell received, as RESOLVE → RESOLVED). Only on a linked leg; a
    /// probe on another circuit, or a malformed one, closes that circuit.
    pub(super) fn path_exit_on_probe(&mut self, key: CircKey, data: &[u8], now: Instant) {
        if !self.path.exit_leg.contains_key(&key) {
            self.sw.stats_mut().violations += 1;
            return self.kill(key, "LEG_PROBE on a circuit that is not linked", now);
        }
        let probe = match LegProbe::decode(data) {
            Ok(p) => p,
            Err(e) => {
                self.sw.stats_mut().violations += 1;
                return self.kill(key, &format!("malformed LEG_PROBE: {e}"), now);
            }
        };
        self.sw.stats_mut().leg_probes_answered += 1;
        let body = probe.encode();
        self.send_relay_backward(key, RelayCommand::LEG_PROBE, 0, &body, now);
    }
}
