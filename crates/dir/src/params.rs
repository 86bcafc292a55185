//! Consensus network parameters (Tor's `params` line): named integers that every
//! relay and client reads from the consensus, with defaults and clamping on the reader's
//! side so a bad or missing value never takes a node out of its safe range.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

/// `circwindow`: the initial circuit-level SENDME window, in cells (tor-spec: 1000,
/// allowed 100..=1000).
pub const CIRCWINDOW: ParamSpec = ParamSpec {
    name: "circwindow",
    default: 1000,
    min: 100,
    max: 1000,
};

/// Every parameter this version knows, with its range. [`NetParams::check_known`]
/// refuses values outside these ranges (the authority uses it on its config, so an
/// operator's typo stops it instead of being silently clamped by every reader).
pub const KNOWN_PARAMS: &[ParamSpec] = &[
    CIRCWINDOW,
    CIRCUIT_PRIORITY_HALFLIFE_MSEC,
    OUTBUF_CELLS,
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
pub const CIRCUIT_PRIORITY_HALFLIFE_MSEC: ParamSpec = ParamSpec {
    name: "CircuitPriorityHalflifeMsec",
    default: 30_000,
    min: -1,
    max: i32::MAX as i64,
};

/// Cells a relay hands to a connection before they are written (the bounded output buffer,
/// so that the scheduler decides late). A relay's own `OutbufCells` overrides it.
pub const OUTBUF_CELLS: ParamSpec = ParamSpec {
    name: "OutbufCells",
    default: 64,
    min: 1,
    max: 10_000,
};

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
}
