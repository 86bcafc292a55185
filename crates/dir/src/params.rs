//! Consensus network parameters (Tor's `params` line): named integers that every
//! relay and client reads from the consensus, with defaults and clamping on the reader's
//! side so a bad or missing value never takes a node out of its safe range.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dos_params as dos;
use crate::DirError;

/// Most parameters one consensus may carry.
pub const MAX_PARAMS: usize = 256;
/// Longest parameter name.
const MAX_NAME_LEN: usize = 64;

/// A known parameter: its name, default and allowed range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// Name as written in the consensus and the authority's `[NetworkParameters]`.
    pub name: &'static str,
    /// Value when the consensus does not set it.
    pub default: i64,
    /// Smallest allowed value (smaller ones are raised to it).
    pub min: i64,
    /// Largest allowed value (larger ones are lowered to it).
    pub max: i64,
}

impl ParamSpec {
    /// `name` with its `default` and its allowed range `min..=max`.
    pub const fn new(name: &'static str, default: i64, min: i64, max: i64) -> Self {
        ParamSpec {
            name,
            default,
            min,
            max,
        }
    }
}

/// `circwindow`: the initial circuit-level SENDME window, in cells (tor-spec: 1000,
/// allowed 100..=1000).
pub const CIRCWINDOW: ParamSpec = ParamSpec::new("circwindow", 1000, 100, 1000);

/// Every parameter this version knows, with its range. [`NetParams::check_known`]
/// refuses values outside these ranges (the authority uses it on its config, so an
/// operator's typo stops it instead of being silently clamped by every reader).
pub const KNOWN_PARAMS: &[ParamSpec] = &[
    CIRCWINDOW,
    CIRCUIT_PRIORITY_HALFLIFE_MSEC,
    OUTBUF_CELLS,
    CHANNEL_FAIRNESS,
    PER_CLIENT_QUEUE_CELLS,
    CLIENT_CIRCUIT_WINDOW,
    CIRCUIT_SWITCHING,
    SWITCH_GAMMA_MILLI,
    SWITCH_ALPHA_MILLI,
    SWITCH_BETA_MILLI,
    SWITCH_SAMPLE_INTERVAL_MSEC,
    SWITCH_BUFFER_BYTES,
    SWITCH_TIMEOUT_MSEC,
    SWITCH_TIMEOUT_RTT_FACTOR,
    SWITCH_MIN_SHARE_MILLI,
    SWITCH_NETWORK_QUEUE,
    SWITCH_LEG_USE,
    SWITCH_STRIPE_LEG_CELLS,
    SWITCH_STRIPE_MOVES,
    // The DoS defences (crate::dos_params).
    dos::DOS_CC_ENABLED,
    dos::DOS_CC_MIN_CONNECTIONS,
    dos::DOS_CC_RATE,
    dos::DOS_CC_BURST,
    dos::DOS_CC_DEFENSE_TYPE,
    dos::DOS_CC_DEFENSE_TIME_PERIOD,
    dos::DOS_CONN_ENABLED,
    dos::DOS_CONN_MAX_CONCURRENT_COUNT,
    dos::DOS_CONN_DEFENSE_TYPE,
    dos::DOS_CONN_CONNECT_RATE,
    dos::DOS_CONN_CONNECT_BURST,
    dos::DOS_CONN_CONNECT_DEFENSE_TIME_PERIOD,
    dos::DOS_STREAM_ENABLED,
    dos::DOS_STREAM_RATE,
    dos::DOS_STREAM_BURST,
    dos::DOS_STREAM_DEFENSE_TYPE,
    dos::DOS_REFUSE_SINGLE_HOP,
    crate::cc_params::CC_ALG,
    crate::cc_params::CC_CWND_INIT,
    crate::cc_params::CC_CWND_MIN,
    crate::cc_params::CC_CWND_MAX,
    crate::cc_params::CC_CWND_INC,
    crate::cc_params::CC_CWND_INC_PCT_SS,
    crate::cc_params::CC_SS_MAX,
    crate::cc_params::CC_VEGAS_ALPHA_EXIT,
    crate::cc_params::CC_VEGAS_BETA_EXIT,
    crate::cc_params::CC_VEGAS_GAMMA_EXIT,
    crate::cc_params::CC_VEGAS_DELTA_EXIT,
    crate::cc_params::CC_EWMA_CWND_PCT,
];

/// EWMA half-life in milliseconds (Tor's name); 0 or less turns EWMA off (round-robin).
/// A relay's own `CircuitPriorityHalflife` (seconds) overrides it.
pub const CIRCUIT_PRIORITY_HALFLIFE_MSEC: ParamSpec =
    ParamSpec::new("CircuitPriorityHalflifeMsec", 30_000, -1, i32::MAX as i64);

/// Cells a relay hands to a connection before they are written (the bounded output buffer,
/// so that the scheduler decides late). A relay's own `OutbufCells` overrides it, and so does a
/// `BandwidthRate` (10 ms of the rate, 8..=64 cells). The default, for unlimited nodes, is one
/// read's worth (128 cells, as a link reader's batch and an exit's stream read): with 64 most
/// reads left as two writes. On an unlimited link the bound does not bound a cell's wait: the
/// kernel's autotuned send buffer holds far more than 128 cells (docs/scheduling.md,
/// "The output bound of an unlimited relay").
pub const OUTBUF_CELLS: ParamSpec = ParamSpec::new("OutbufCells", 128, 1, 10_000);

/// `ChannelFairness`: 1 = under `CrossChannelPriority`, a rate-limited relay ranks each
/// *client's* channel by its total recent cells (as one circuit) before EWMA picks among a
/// channel's circuits, so spreading bulk over many circuits wins no larger share; relay
/// channels keep their best circuit's rank (docs/security.md, "EWMA gaming"). 0 = off (rank
/// every channel by its best circuit). Default 1 since session 17, with
/// [`PER_CLIENT_QUEUE_CELLS`]: together they met both EWMA-gaming targets. A relay's own option
/// overrides it.
pub const CHANNEL_FAIRNESS: ParamSpec = ParamSpec::new("ChannelFairness", 1, 0, 1);

/// `PerClientQueueCells`: at an entry, once this many cells are queued toward one client's
/// channel, the client's upstream cells on its circuits with cells queued there are held back
/// and let go as the queue drains (its windows stop refilling: a client spreading a download
/// over many circuits keeps its excess at the entry instead of in the middles; docs/security.md,
/// "EWMA gaming"). 0 = off. Default 2 000 cells (about 1 MB: two fixed circuit windows, four
/// stream windows), so a one-circuit download never reaches it. A relay's own option overrides
/// it.
pub const PER_CLIENT_QUEUE_CELLS: ParamSpec =
    ParamSpec::new("PerClientQueueCells", 2000, 0, 1_000_000);

/// `ClientCircuitWindow`: with [`PER_CLIENT_QUEUE_CELLS`] on, the cells an entry takes each
/// circuit of a client to have in flight toward it after the client's latest relay cell on
/// it (less what arrived since); the per-client bound counts the queue plus that estimate, so
/// a client opening many circuits cannot set more than the bound moving before anything
/// waits at the entry (docs/security.md, "EWMA gaming"). 0 = off (the queue alone). Default 0
/// (off): at 500 cells (a stream window) it met the gaming target with fixed windows, but a
/// client with many busy circuits on a fast relay still crawls under it (the sniper e2e test
/// could not open its streams, also after session 20 charged a whole window only to a
/// circuit owing nothing). A relay's own option overrides it.
pub const CLIENT_CIRCUIT_WINDOW: ParamSpec = ParamSpec::new("ClientCircuitWindow", 0, 0, 100_000);

// Congestion-triggered circuit switching (paper 003, issue 16). The fractions γ, α and β are
// carried in thousandths because consensus parameters are integers (Tor does the same with its
// `cc_*` percentages). Semantics: docs/protocol.md, "Circuit switching".

/// `CircuitSwitching`: 0 = off, 1 = connection (the entry moves a circuit to a new TCP connection
/// to the same next hop), 2 = path (the client moves its stream to a spare circuit). A relay's
/// own `CircuitSwitching` option overrides it. See [`SwitchingMode`].
pub const CIRCUIT_SWITCHING: ParamSpec = ParamSpec::new("CircuitSwitching", 0, 0, 2);

/// γ of the output-buffer EWMA, B_t = γ·B_{t−1} + (1−γ)·B_sample, in thousandths (paper: 0.7).
/// 0 and 1000 are excluded: the paper requires 0 < γ < 1 (γ = 1 would never move).
pub const SWITCH_GAMMA_MILLI: ParamSpec = ParamSpec::new("SwitchGammaMilli", 700, 1, 999);

/// α in thousandths of the output buffer (paper: 0.1): below α·buffer the connection is
/// underfull and the detector re-arms after a switch.
pub const SWITCH_ALPHA_MILLI: ParamSpec = ParamSpec::new("SwitchAlphaMilli", 100, 0, 1000);

/// β in thousandths of the output buffer (paper: 0.5): above β·buffer the connection is
/// congested. A consensus with α > β is read with α lowered to β.
pub const SWITCH_BETA_MILLI: ParamSpec = ParamSpec::new("SwitchBetaMilli", 500, 1, 1000);

/// `SwitchSampleInterval` in milliseconds: how often an entry samples each connection's
/// output-buffer occupancy.
pub const SWITCH_SAMPLE_INTERVAL_MSEC: ParamSpec =
    ParamSpec::new("SwitchSampleIntervalMsec", 100, 10, 60_000);

/// The output buffer α and β are fractions of, in bytes (paper: 32 KB per connection).
pub const SWITCH_BUFFER_BYTES: ParamSpec =
    ParamSpec::new("SwitchBufferBytes", 32_768, 1024, 16 << 20);

/// How long a switch may wait for its acknowledgement before it is abandoned (the circuit or
/// stream stays on, or returns to, the old connection or circuit), in milliseconds.
pub const SWITCH_TIMEOUT_MSEC: ParamSpec = ParamSpec::new("SwitchTimeoutMsec", 2_000, 100, 120_000);

/// Path switching: a switch waits for its confirmation `max(SwitchTimeoutMsec, factor × the
/// round trip measured on the client's linked circuits)`; 0 keeps the fixed timeout (default 3:
/// the longest confirmation of session 14's kept run took 1.39 round trips; why a multiple:
/// `chive_core::switching::confirm_timeout`).
pub const SWITCH_TIMEOUT_RTT_FACTOR: ParamSpec = ParamSpec::new("SwitchTimeoutRttFactor", 3, 0, 20);

/// The share of a congested connection's load, in thousandths, a circuit must be able to account
/// for before an entry moves it (connection mode) or warns its client (path mode): its EWMA cell
/// count plus queued cells against the detector's occupancy estimate in cells plus every queued
/// cell (default 250: a quarter; 0 = always move the heaviest, as the paper does). Why:
/// `chive_core::switching::circuit_to_move`.
pub const SWITCH_MIN_SHARE_MILLI: ParamSpec = ParamSpec::new("SwitchMinShareMilli", 250, 0, 1000);

/// Whether an entry's congestion detector counts the bytes queued on the path beyond the socket
/// (TCP_INFO: in flight × (srtt − min_rtt) / srtt) in a connection's occupancy (1, the default)
/// or only chive's outbuf and the kernel's unsent bytes (0). docs/protocol.md, "Detection".
pub const SWITCH_NETWORK_QUEUE: ParamSpec = ParamSpec::new("SwitchNetworkQueue", 1, 0, 1);

/// Path switching, client: how an upload uses its linked circuits (`SwitchLegUse`): 0 = whole
/// (one at a time, moved on the entry's congestion report: the paper's), 1 = stripe (every
/// circuit with room at once, conflux-style; the default since session 25: with a cap of 100
/// cells per leg and 4 moves unconfirmed it met paper 003's targets in two batches,
/// results/paper003-switching-stripe-several-moves-meets-targets). The client's own
/// `SwitchLegUse` overrides it.
pub const SWITCH_LEG_USE: ParamSpec = ParamSpec::new("SwitchLegUse", 1, 0, 1);

/// Path switching, client, stripe (`SwitchStripeLegCells`): the most cells of an upload
/// unacknowledged on one circuit; 0 = no cap beyond the 500-cell stream window; 1..49 are
/// read as 50 (two capped legs must hold one stream SENDME's worth:
/// `chive_core::switching::MIN_LEG_CELLS`). The client's own option overrides it.
pub const SWITCH_STRIPE_LEG_CELLS: ParamSpec = ParamSpec::new("SwitchStripeLegCells", 100, 0, 500);

/// Path switching, client, stripe (`SwitchStripeMoves`): how many moves between circuits may
/// wait for their confirmations at once (`chive_core::switching::MAX_STRIPE_MOVES`). The
/// client's own option overrides it.
pub const SWITCH_STRIPE_MOVES: ParamSpec = ParamSpec::new("SwitchStripeMoves", 4, 1, 16);

/// The `CircuitSwitching` setting: which of paper 003's two mechanisms a node uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SwitchingMode {
    /// No switching (the default until measured).
    #[default]
    Off,
    /// The entry moves the heaviest circuit to a new TCP connection to the same next hop.
    Connection,
    /// The client moves its stream to a spare circuit through another entry and middle to the
    /// same exit; the exit restores order by sequence numbers.
    Path,
}

impl SwitchingMode {
    /// Parse the relay option's value: "off", "connection" or "path".
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SwitchingMode::Off),
            "connection" => Ok(SwitchingMode::Connection),
            "path" => Ok(SwitchingMode::Path),
            other => Err(format!(
                "{other:?} is not one of \"off\", \"connection\", \"path\""
            )),
        }
    }

    /// The consensus number of this mode (see [`CIRCUIT_SWITCHING`]).
    pub fn number(self) -> i64 {
        match self {
            SwitchingMode::Off => 0,
            SwitchingMode::Connection => 1,
            SwitchingMode::Path => 2,
        }
    }

    /// The mode with this consensus number (already clamped to 0..=2).
    fn from_number(n: i64) -> Self {
        match n {
            1 => SwitchingMode::Connection,
            2 => SwitchingMode::Path,
            _ => SwitchingMode::Off,
        }
    }
}

/// The switching parameters a consensus sets, clamped to their ranges (see the `SWITCH_*`
/// specs). Fractions stay in thousandths; the core's detector converts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchingParams {
    /// `CircuitSwitching`.
    pub mode: SwitchingMode,
    /// γ in thousandths.
    pub gamma_milli: u32,
    /// α in thousandths of the buffer; never above `beta_milli`.
    pub alpha_milli: u32,
    /// β in thousandths of the buffer.
    pub beta_milli: u32,
    /// Sample interval in milliseconds.
    pub sample_interval_ms: u32,
    /// The buffer α and β refer to, in bytes.
    pub buffer_bytes: u32,
    /// Acknowledgement timeout in milliseconds (path variant: the floor).
    pub timeout_ms: u32,
    /// Path variant: the confirmation timeout is at least this many measured round trips.
    pub timeout_rtt_factor: u32,
    /// The least share of a congested connection's load a moved circuit carries, thousandths.
    pub min_share_milli: u32,
    /// The detector counts the bytes queued on the path beyond the socket.
    pub network_queue: bool,
    /// `SwitchLegUse`: the client stripes its uploads over its linked circuits.
    pub leg_stripe: bool,
    /// `SwitchStripeLegCells` (0: no cap).
    pub stripe_leg_cells: u32,
    /// `SwitchStripeMoves`.
    pub stripe_moves: u32,
}

/// Network parameters: name to integer. Unknown names are kept and passed on (a newer
/// authority may set parameters this version does not know).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "BTreeMap<String, i64>", try_from = "BTreeMap<String, i64>")]
pub struct NetParams {
    map: BTreeMap<String, i64>,
}

/// Whether `name` is a well-formed parameter name: 1-64 of `[A-Za-z0-9_]`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl NetParams {
    /// No parameters: every reader uses its defaults.
    pub fn new() -> NetParams {
        NetParams::default()
    }

    /// Build from a map (e.g. the authority config's `[NetworkParameters]` table),
    /// checking names and the count.
    pub fn from_map(map: BTreeMap<String, i64>) -> Result<NetParams, DirError> {
        if map.len() > MAX_PARAMS {
            return Err(DirError::BadParam(format!(
                "more than {MAX_PARAMS} parameters"
            )));
        }
        if let Some(bad) = map.keys().find(|k| !valid_name(k)) {
            return Err(DirError::BadParam(format!(
                "name {bad:?} must be 1-{MAX_NAME_LEN} ASCII letters, digits or '_'"
            )));
        }
        Ok(NetParams { map })
    }

    /// Check that every known parameter that is set lies in its allowed range.
    pub fn check_known(&self) -> Result<(), DirError> {
        for spec in KNOWN_PARAMS {
            if let Some(v) = self.get_raw(spec.name) {
                if v < spec.min || v > spec.max {
                    return Err(DirError::BadParam(format!(
                        "{} = {v} is outside its allowed range {}..={}",
                        spec.name, spec.min, spec.max
                    )));
                }
            }
        }
        Ok(())
    }

    /// Set one parameter.
    pub fn set(&mut self, name: &str, value: i64) -> Result<(), DirError> {
        if !valid_name(name) {
            return Err(DirError::BadParam(format!("bad name {name:?}")));
        }
        if !self.map.contains_key(name) && self.map.len() >= MAX_PARAMS {
            return Err(DirError::BadParam(format!(
                "more than {MAX_PARAMS} parameters"
            )));
        }
        self.map.insert(name.to_string(), value);
        Ok(())
    }

    /// The value of `name` clamped to `min..=max`, or `default` (as given) if absent.
    /// If `min > max` (a caller bug) a set value comes out as `max`; this never panics,
    /// unlike `i64::clamp`.
    pub fn get(&self, name: &str, default: i64, min: i64, max: i64) -> i64 {
        match self.map.get(name) {
            Some(&v) => v.max(min).min(max),
            None => default,
        }
    }

    /// [`NetParams::get`] with a [`ParamSpec`].
    pub fn get_spec(&self, spec: &ParamSpec) -> i64 {
        self.get(spec.name, spec.default, spec.min, spec.max)
    }

    /// The raw value as the authority set it, unclamped.
    pub fn get_raw(&self, name: &str) -> Option<i64> {
        self.map.get(name).copied()
    }

    /// The initial circuit window, `circwindow` (default 1000, clamped to 100..=1000).
    pub fn circwindow(&self) -> u16 {
        // Clamped to 100..=1000 above, so the conversion cannot fail.
        u16::try_from(self.get_spec(&CIRCWINDOW)).unwrap_or(1000)
    }

    /// The circuit-switching parameters (defaults: off, γ 0.7, α 0.1, β 0.5, 100 ms, 32 KB,
    /// 2 s, 4 round trips, share 0.25). α above β is read as β, so the "no action" band is never inverted.
    pub fn switching(&self) -> SwitchingParams {
        // Every spec's range lies within 0..=i32::MAX, so the conversions cannot fail.
        let get = |spec: &ParamSpec| u32::try_from(self.get_spec(spec)).unwrap_or(0);
        let beta_milli = get(&SWITCH_BETA_MILLI);
        SwitchingParams {
            mode: SwitchingMode::from_number(self.get_spec(&CIRCUIT_SWITCHING)),
            gamma_milli: get(&SWITCH_GAMMA_MILLI),
            alpha_milli: get(&SWITCH_ALPHA_MILLI).min(beta_milli),
            beta_milli,
            sample_interval_ms: get(&SWITCH_SAMPLE_INTERVAL_MSEC),
            buffer_bytes: get(&SWITCH_BUFFER_BYTES),
            timeout_ms: get(&SWITCH_TIMEOUT_MSEC),
            timeout_rtt_factor: get(&SWITCH_TIMEOUT_RTT_FACTOR),
            min_share_milli: get(&SWITCH_MIN_SHARE_MILLI),
            network_queue: get(&SWITCH_NETWORK_QUEUE) != 0,
            leg_stripe: get(&SWITCH_LEG_USE) != 0,
            stripe_leg_cells: get(&SWITCH_STRIPE_LEG_CELLS),
            stripe_moves: get(&SWITCH_STRIPE_MOVES),
        }
    }

    /// All parameters, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.map.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no parameter is set.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl From<NetParams> for BTreeMap<String, i64> {
    fn from(p: NetParams) -> Self {
        p.map
    }
}

impl TryFrom<BTreeMap<String, i64>> for NetParams {
    type Error = DirError;
    fn try_from(map: BTreeMap<String, i64>) -> Result<Self, DirError> {
        NetParams::from_map(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, i64)]) -> NetParams {
        NetParams::from_map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()).unwrap()
    }

    #[test]
    fn clamping_and_defaults() {
        assert_eq!(NetParams::new().circwindow(), 1000);
        assert_eq!(params(&[("circwindow", 101)]).circwindow(), 101);
        assert_eq!(params(&[("circwindow", 5)]).circwindow(), 100);
        assert_eq!(params(&[("circwindow", 100_000)]).circwindow(), 1000);
        assert_eq!(params(&[("circwindow", -1)]).circwindow(), 100);
        let p = params(&[("x", 7)]);
        assert_eq!(p.get("x", 0, 0, 5), 5);
        assert_eq!(p.get("x", 0, 10, 20), 10);
        assert_eq!(p.get("y", 3, 10, 20), 3, "absent: default as given");
        assert_eq!(p.get("x", 0, 20, 10), 10, "inverted bounds do not panic");
        assert_eq!(p.get_raw("x"), Some(7));
    }

    #[test]
    fn unknown_names_pass_through_and_bad_names_fail() {
        let p = params(&[("CircuitPriorityHalflife", 30_000), ("circwindow", 1000)]);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"CircuitPriorityHalflife":30000,"circwindow":1000}"#
        );
        assert_eq!(serde_json::from_str::<NetParams>(&json).unwrap(), p);
        assert!(serde_json::from_str::<NetParams>(r#"{"a b":1}"#).is_err());
        assert!(
            serde_json::from_str::<NetParams>(r#"{"x":"1"}"#).is_err(),
            "integers only"
        );
        assert!(
            serde_json::from_str::<NetParams>(r#"{"x":1.5}"#).is_err(),
            "integers only"
        );
        assert!(params(&[("circwindow", 100), ("unknown", 1 << 40)])
            .check_known()
            .is_ok());
        let err = params(&[("circwindow", 5000)]).check_known().unwrap_err();
        assert!(err.to_string().contains("circwindow = 5000"), "{err}");
        assert!(params(&[("circwindow", 99)]).check_known().is_err());
        let mut q = NetParams::new();
        assert!(q.set("", 1).is_err());
        assert!(q.set(&"a".repeat(65), 1).is_err());
        q.set("ok_1", 1).unwrap();
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![("ok_1", 1)]);
    }

    #[test]
    fn switching_defaults_and_ranges() {
        let d = NetParams::new().switching();
        assert_eq!(
            d,
            SwitchingParams {
                mode: SwitchingMode::Off,
                gamma_milli: 700,
                alpha_milli: 100,
                beta_milli: 500,
                sample_interval_ms: 100,
                buffer_bytes: 32_768,
                timeout_ms: 2_000,
                timeout_rtt_factor: 3,
                min_share_milli: 250,
                network_queue: true,
                leg_stripe: true,
                stripe_leg_cells: 100,
                stripe_moves: 4,
            }
        );
        let p = params(&[
            ("CircuitSwitching", 2),
            ("SwitchGammaMilli", 1000),
            ("SwitchAlphaMilli", -5),
            ("SwitchBetaMilli", 2000),
            ("SwitchSampleIntervalMsec", 1),
            ("SwitchBufferBytes", 1 << 40),
            ("SwitchTimeoutMsec", 0),
            ("SwitchTimeoutRttFactor", 99),
            ("SwitchMinShareMilli", 1001),
            ("SwitchLegUse", 7),
            ("SwitchStripeLegCells", 9000),
            ("SwitchStripeMoves", 0),
        ]);
        let s = p.switching();
        assert_eq!(s.mode, SwitchingMode::Path);
        assert_eq!(s.gamma_milli, 999, "γ = 1 is excluded");
        assert_eq!(s.alpha_milli, 0);
        assert_eq!(s.beta_milli, 1000);
        assert_eq!(s.sample_interval_ms, 10);
        assert_eq!(s.buffer_bytes, 16 << 20);
        assert_eq!(s.timeout_ms, 100);
        assert_eq!(s.timeout_rtt_factor, 20);
        assert_eq!(s.min_share_milli, 1000);
        assert!(s.leg_stripe);
        assert_eq!((s.stripe_leg_cells, s.stripe_moves), (500, 1));
        let s = params(&[("SwitchStripeLegCells", 250), ("SwitchStripeMoves", 99)]).switching();
        assert_eq!(
            (s.leg_stripe, s.stripe_leg_cells, s.stripe_moves),
            (true, 250, 16)
        );
        assert_eq!(
            params(&[("CircuitSwitching", 9)]).switching().mode,
            SwitchingMode::Path
        );
        assert_eq!(
            params(&[("CircuitSwitching", -1)]).switching().mode,
            SwitchingMode::Off
        );
        assert_eq!(
            params(&[("CircuitSwitching", 1)]).switching().mode,
            SwitchingMode::Connection
        );
        // An inverted band is read with α lowered to β.
        let inv = params(&[("SwitchAlphaMilli", 800), ("SwitchBetaMilli", 300)]).switching();
        assert_eq!((inv.alpha_milli, inv.beta_milli), (300, 300));
        // The authority refuses out-of-range values, naming them.
        for (name, bad) in [
            ("CircuitSwitching", 3),
            ("SwitchGammaMilli", 0),
            ("SwitchGammaMilli", 1000),
            ("SwitchAlphaMilli", 1001),
            ("SwitchBetaMilli", 0),
            ("SwitchSampleIntervalMsec", 9),
            ("SwitchBufferBytes", 1023),
            ("SwitchTimeoutMsec", 120_001),
            ("SwitchTimeoutRttFactor", -1),
            ("SwitchLegUse", 2),
            ("SwitchStripeLegCells", 501),
            ("SwitchStripeMoves", 17),
        ] {
            let err = params(&[(name, bad)]).check_known().unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
        assert!(
            params(&[("CircuitSwitching", 1), ("SwitchGammaMilli", 999)])
                .check_known()
                .is_ok()
        );
    }

    #[test]
    fn switching_mode_names() {
        for m in [
            SwitchingMode::Off,
            SwitchingMode::Connection,
            SwitchingMode::Path,
        ] {
            let name = format!("{m:?}").to_lowercase();
            assert_eq!(SwitchingMode::parse(&name), Ok(m));
            assert_eq!(SwitchingMode::from_number(m.number()), m);
        }
        assert!(SwitchingMode::parse("Path").is_err());
        assert!(SwitchingMode::parse("").is_err());
        assert_eq!(SwitchingMode::default(), SwitchingMode::Off);
    }
}
