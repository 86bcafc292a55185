//! What the driver sets and reads of circuit switching (paper 003, issue 16): the mode and
//! timeout it sets ([`SwitchSettings`]), the counters ([`SwitchStats`]) and one
//! [`SwitchRecord`] per switch this node started. The tables behind them are in `switch.rs`.

use std::time::{Duration, Instant};

use crate::{ChannelId, CircKey};

/// `CircuitSwitching`: which of the paper's two ways an entry uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SwitchMode {
    /// No switching; SWITCH_CONN is answered DISABLED.
    #[default]
    Off,
    /// Move the heaviest circuit onto a second connection to the same next hop.
    Connection,
    /// Ask the client to move its streams to a spare circuit (entry: CONGESTED; exit: answer
    /// CONFLUX_LINK and restore order; client: keep a linked spare).
    Path,
}

impl SwitchMode {
    /// Parse the option ("off", "connection", "path").
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SwitchMode::Off),
            "connection" => Ok(SwitchMode::Connection),
            "path" => Ok(SwitchMode::Path),
            other => Err(format!(
                "{other:?} is not one of \"off\", \"connection\", \"path\""
            )),
        }
    }

    /// The consensus parameter `CircuitSwitching` (0 off, 1 connection, 2 path).
    pub fn from_param(v: i32) -> Self {
        match v {
            1 => SwitchMode::Connection,
            2 => SwitchMode::Path,
            _ => SwitchMode::Off,
        }
    }

    /// The option's spelling.
    pub fn label(self) -> &'static str {
        match self {
            SwitchMode::Off => "off",
            SwitchMode::Connection => "connection",
            SwitchMode::Path => "path",
        }
    }
}

/// Switching settings of a core ([`Core::set_switching`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchSettings {
    /// Mode.
    pub mode: SwitchMode,
    /// The floor of how long a switch waits for its answer (`SwitchTimeoutMsec`): SWITCH_ACK
    /// (connection variant), SWITCH_CONFIRM (path variant); see `timeout_rtt_factor`.
    pub timeout: Duration,
    /// A switch waits for its answer `max(timeout, factor × the measured round trip)`
    /// ([`crate::switching::confirm_timeout`]): path variant (client), the linked set's;
    /// connection variant (entry), SWITCH_CONN → SWITCH_ACK to that peer. 0 keeps the
    /// fixed `timeout`. Default 3. In the lab's loaded runs with a fixed 2 s, 25 of 27 path
    /// switches timed out while the confirmation was on its way; with factor 4 none did, and
    /// the longest wait was 1.39 round trips (docs/protocol.md, "Path variant").
    pub timeout_rtt_factor: u32,
    /// The share of a congested connection's load, in thousandths, a circuit's weight must
    /// reach to be moved (`SwitchMinShareMilli`; see
    /// [`crate::switching::circuit_to_move`]).
    pub min_share_milli: u32,
    /// Path variant, client: how long it does not switch onto a leg after that leg's entry
    /// reported congestion or a switch onto it timed out (default 10 s). Moving onto a leg
    /// whose entry is still full only queues the CONFLUX_SWITCH behind that backlog: in the
    /// first full lab run 33 of 53 path switches went back onto the leg the client had left 3
    /// to 12 s before and timed out, each re-sending up to 500 cells on the leg it fell back
    /// to. Ten seconds covers those; a leg that drained is used again after it.
    pub leg_avoid: Duration,
    /// Path variant, client (`SwitchLighterLeg`, default on): a congestion report marks the
    /// current leg loaded, and moves the upload to the other leg unless that one measures
    /// heavier (smoothed round trip more than 10 % above the current leg's,
    /// [`crate::switching::SetRtt::heavier`]), as conflux's scheduler prefers the lower-RTT
    /// leg. With bulk uploads every entry reports congestion once the load is
    /// split, so without it clients moved on whichever report came first, not towards the
    /// lighter entry, and back again once `leg_avoid` ran out (docs/paper003-lab.md, "Never onto
    /// a heavier leg").
    pub lighter_leg_only: bool,
    /// Path variant, client (`SwitchLegProbe` 1 or 2; the core's default on, the client's option
    /// defaults to 0 since session 20; only with `lighter_leg_only`): on a
    /// congestion report, measure the other leg first instead of trusting its stale estimate:
    /// a LEG_PROBE on it, which the exit answers at once. An answer within 1.1 × the current
    /// leg's round trip moves the upload the moment it arrives; none by then means the other
    /// leg is heavier (stay). While a probe stays unanswered past that, later reports use the
    /// estimates as without probes. docs/protocol.md, "Path variant" (Probing the other leg).
    pub probe_legs: bool,
    /// Path variant, client (`SwitchLegProbe = 2`; only with `probe_legs`): keep the leg not in
    /// use measured ahead of any report, so a report is decided at once instead of after a
    /// probe's round trip. While the upload's leg carries data, each of its circuit SENDMEs may
    /// send a LEG_PROBE on the other leg (at most one per [`PROBE_AHEAD_EVERY`], one out at a
    /// time); a report within [`PROBE_FRESH`] of the other leg's last answer is decided by that
    /// answer. Without a fresh answer, a report probes as with `probe_legs` alone.
    pub probe_ahead: bool,
    /// Path variant, client (`SwitchLegUse`): whether the upload uses one leg at a time and
    /// moves whole on a congestion report (`whole`, the paper's design, default) or uses
    /// every leg with room at once (`stripe`, conflux-style; [`crate::switching::legs`]).
    pub leg_use: crate::switching::LegUse,
    /// Path variant, client, `stripe` (`SwitchStripeLegCells`): the most cells of a stream
    /// unacknowledged on one leg (0: no cap beyond the 500-cell per-leg stream window);
    /// [`crate::switching::MinRtt::leg_cells`].
    pub stripe_leg_cells: u32,
    /// Path variant, client, `stripe` (`SwitchStripeMoves`): how many moves between legs may
    /// wait for their confirmation at once (1: each waits for the previous one's; more: a
    /// move superseded before its confirmation is released, [`crate::switching::PathLimits`]
    /// `max_moves`).
    pub stripe_moves: u32,
}

/// With [`SwitchSettings::probe_ahead`]: the least time between two probes of the other leg.
/// About one circuit SENDME's spacing for one bulk upload at the lab's rates (100 cells at
/// 40–70 KB/s): a probe per second is two cells per 100 uploaded.
pub const PROBE_AHEAD_EVERY: Duration = Duration::from_secs(1);

/// With [`SwitchSettings::probe_ahead`]: how old the other leg's last probe answer may be to
/// decide a report alone. Two probe intervals: one answer may be late or lost, and other
/// clients move between entries on a scale of seconds (each entry reports at most once per
/// second).
pub const PROBE_FRESH: Duration = Duration::from_secs(2);

impl SwitchSettings {
    /// `min_share_milli` as a fraction.
    pub fn min_share(&self) -> f64 {
        f64::from(self.min_share_milli.min(1000)) / 1000.0
    }
}

impl Default for SwitchSettings {
    fn default() -> Self {
        SwitchSettings {
            mode: SwitchMode::Off,
            timeout: Duration::from_millis(2000),
            timeout_rtt_factor: 3,
            min_share_milli: 250,
            leg_avoid: Duration::from_secs(10),
            lighter_leg_only: true,
            probe_legs: true,
            probe_ahead: false,
            leg_use: crate::switching::LegUse::Whole,
            stripe_leg_cells: 0,
            stripe_moves: 1,
        }
    }
}

/// Switching counters ([`Core::switch_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Congestion reports that picked a circuit to move (mover).
    pub triggered: u64,
    /// Circuits whose cells started flowing on the new connection (mover): switches done.
    pub switches: u64,
    /// Switches whose both directions finished (mover).
    pub completed: u64,
    /// Switches the peer refused (DISABLED, or a DESTROY on the new id).
    pub refused: u64,
    /// Switches abandoned because no SWITCH_ACK came in time.
    pub timed_out: u64,
    /// Switches abandoned because the switch connection could not be opened or closed early.
    pub failed: u64,
    /// Circuits this node accepted onto a new connection (peer).
    pub accepted: u64,
    /// Switch requests refused as protocol violations (peer).
    pub violations: u64,
    /// Cells sent twice (the connection variant never re-sends; kept for the record format).
    pub cells_resent: u64,
    /// Cells lost: held cells dropped, or missing by a marker's count.
    pub cells_lost: u64,
    /// Cells that arrived on a new connection before its marker on the old one and were held
    /// back (both roles): how often the hold-back was needed for order.
    pub cells_held: u64,
    /// Path variant, entry: CONGESTED messages sent to clients.
    pub congested_sent: u64,
    /// Path variant, client: CONGESTED messages received (acted on or not).
    pub congested_received: u64,
    /// Path variant, client: CONGESTED messages not acted on because the other leg was
    /// congested lately too (its entry reported it, or a switch onto it timed out).
    pub congested_ignored: u64,
    /// Path variant, client: LEG_PROBEs sent on the other leg before acting on a CONGESTED.
    pub leg_probes: u64,
    /// Path variant, client, `SwitchLegUse = stripe`: moves of the upload to another leg
    /// the leg scheduler made (each a switch; confirmed ones count in `switches` too).
    pub stripe_moves: u64,
    /// Path variant, client: probes not answered within 1.1 × the current leg's round trip
    /// (the report was not acted on; counted in `congested_ignored` too).
    pub leg_probes_late: u64,
    /// Path variant, exit: LEG_PROBEs answered.
    pub leg_probes_answered: u64,
    /// Path variant, exit: cells that arrived ahead of their turn and were buffered.
    pub path_out_of_order: u64,
    /// Path variant, exit: copies dropped (a number already delivered or buffered).
    pub path_duplicates: u64,
    /// Path variant, exit: the most cells one set's out-of-order buffer held at once (SENDMEs
    /// are withheld from `PathLimits::withhold_above`, 1000; the hard limit is
    /// `PathLimits::max_buffered`, 5256 for two legs): how close honest traffic comes to it.
    pub path_out_of_order_peak: u64,
    /// Path variant, exit: circuit SENDMEs withheld on a leg that was ahead while the set's
    /// out-of-order buffer was high (each is sent once the leg is no longer ahead or the
    /// buffer went below the threshold).
    pub path_sendmes_withheld: u64,
    /// Switch connections closed after [`crate::SWITCH_IDLE_CLOSE`] without a circuit
    /// (mover).
    pub idle_closed: u64,
}

/// How a switch this node started ended (one [`SwitchRecord`] each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchOutcome {
    /// The first cell left on the new connection.
    Switched,
    /// The peer refused.
    Refused,
    /// No acknowledgement in time.
    TimedOut,
    /// The switch connection failed, or the circuit closed first.
    Failed,
}

impl SwitchOutcome {
    /// For metrics.
    pub fn label(self) -> &'static str {
        match self {
            SwitchOutcome::Switched => "switched",
            SwitchOutcome::Refused => "refused",
            SwitchOutcome::TimedOut => "timed_out",
            SwitchOutcome::Failed => "failed",
        }
    }
}

/// Path variant, client: why the first cell did not go on the new leg the moment CONGESTED
/// arrived (what the trigger→first-cell time waited for), checked right after the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchHold {
    /// The moved streams' 500-cell stream window was used up (or XOFF): the first cell waited
    /// for a stream SENDME (XON), which the exit sends as the old leg's backlog arrives.
    StreamWindow,
    /// The new leg's circuit window was closed.
    CircuitWindow,
    /// The new leg's queue at this client was above its high-water mark.
    Queue,
    /// The sender kept its limit of unconfirmed cells (an earlier switch).
    Kept,
    /// No stream had data waiting: the application had not written more yet.
    NoData,
}

impl SwitchHold {
    /// For metrics.
    pub fn label(self) -> &'static str {
        match self {
            SwitchHold::StreamWindow => "stream_window",
            SwitchHold::CircuitWindow => "circuit_window",
            SwitchHold::Queue => "queue",
            SwitchHold::Kept => "kept",
            SwitchHold::NoData => "no_data",
        }
    }
}

/// One switch started at this node, for the metrics' `switch` record. Connection variant: at
/// the entry, `ended` is when the circuit's first cell left on the new connection. Path
/// variant: at the client, `triggered` is CONGESTED's arrival and `ended` when the first cell
/// was queued on the new leg (recorded once the exit confirmed the switch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchRecord {
    /// The circuit moved.
    pub circ: CircKey,
    /// The connection it left.
    pub from: ChannelId,
    /// The connection it went to (None if none was open yet).
    pub to: Option<ChannelId>,
    /// When the congestion report chose it.
    pub triggered: Instant,
    /// When it ended (for `Switched`: its first cell left on the new connection).
    pub ended: Instant,
    /// For `Switched`: when the circuit's last cell before the switch left on the old
    /// connection (leg). `ended − last_old` is the paper's switch time ("from sending the last
    /// cell on the old circuit path up to when the first cell is sent to the new circuit");
    /// `ended − triggered` adds the wait from the congestion report to the cut-over.
    pub last_old: Option<Instant>,
    /// How.
    pub outcome: SwitchOutcome,
    /// Path variant: from the SWITCH going out to its confirmation (`Switched`) or to the
    /// fallback (`TimedOut`, `Failed`); None if no SWITCH went out, and in the connection
    /// variant.
    pub confirm_wait: Option<Duration>,
    /// Path variant: the confirmation timeout in force when it ended.
    pub confirm_timeout: Option<Duration>,
    /// Path variant, client: what held the first cell after CONGESTED (None: it went at once,
    /// or the connection variant).
    pub held_by: Option<SwitchHold>,
    /// Which variant: connection (`circ` moved to connection `to`) or path (the client moved
    /// home circuit `circ`'s streams to its other leg, whose first hop is on `to`).
    pub mode: SwitchMode,
}
