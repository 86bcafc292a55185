//! The consensus parameters of circuit congestion control (Tor's proposal 324 names), read
//! into [`CongestionParams`]. The core's policies (`chive_core::cc`) say what each does;
//! the defaults here are theirs, and a test in chive-client holds the two to each other.

use crate::params::{NetParams, ParamSpec};

/// The largest window any parameter may ask for (the core's `CC_CWND_LIMIT`: below the
/// relays' per-circuit queue limit of 2500 cells).
const CWND_LIMIT: i64 = 2000;

/// `cc_alg`: 0 = fixed window (`circwindow`), 2 = Vegas. 1 (Tor's retired Westwood) is read
/// as 0.
pub const CC_ALG: ParamSpec = ParamSpec::new("cc_alg", 0, 0, 2);
/// `cc_cwnd_init`: Vegas's first window, in cells.
pub const CC_CWND_INIT: ParamSpec = ParamSpec::new("cc_cwnd_init", 200, 100, CWND_LIMIT);
/// `cc_cwnd_min`: the smallest window (at least one SENDME increment, 100).
pub const CC_CWND_MIN: ParamSpec = ParamSpec::new("cc_cwnd_min", 100, 100, CWND_LIMIT);
/// `cc_cwnd_max`: the largest window.
pub const CC_CWND_MAX: ParamSpec = ParamSpec::new("cc_cwnd_max", CWND_LIMIT, 100, CWND_LIMIT);
/// `cc_cwnd_inc`: the steady-state step, once per round trip.
pub const CC_CWND_INC: ParamSpec = ParamSpec::new("cc_cwnd_inc", 100, 1, 1000);
/// `cc_cwnd_inc_pct_ss`: slow-start growth per round trip, percent of the window.
pub const CC_CWND_INC_PCT_SS: ParamSpec = ParamSpec::new("cc_cwnd_inc_pct_ss", 100, 1, 500);
/// `cc_ss_max`: the window at which slow start ends at the latest.
pub const CC_SS_MAX: ParamSpec = ParamSpec::new("cc_ss_max", CWND_LIMIT, 100, CWND_LIMIT);
/// `cc_vegas_alpha_exit`: below this many queued cells, Vegas grows.
pub const CC_VEGAS_ALPHA_EXIT: ParamSpec = ParamSpec::new("cc_vegas_alpha_exit", 64, 0, CWND_LIMIT);
/// `cc_vegas_beta_exit`: above this many queued cells, Vegas shrinks.
pub const CC_VEGAS_BETA_EXIT: ParamSpec = ParamSpec::new("cc_vegas_beta_exit", 192, 0, CWND_LIMIT);
/// `cc_vegas_gamma_exit`: slow start ends when this many cells are queued.
pub const CC_VEGAS_GAMMA_EXIT: ParamSpec =
    ParamSpec::new("cc_vegas_gamma_exit", 128, 0, CWND_LIMIT);
/// `cc_vegas_delta_exit`: above this many queued cells, Vegas cuts hard.
pub const CC_VEGAS_DELTA_EXIT: ParamSpec =
    ParamSpec::new("cc_vegas_delta_exit", 320, 0, CWND_LIMIT);
/// `cc_ewma_cwnd_pct`: the smoothed RTT averages over this percent of a window's SENDMEs.
pub const CC_EWMA_CWND_PCT: ParamSpec = ParamSpec::new("cc_ewma_cwnd_pct", 50, 1, 100);

/// Congestion-control settings as a consensus gives them, each clamped to its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // each field is the parameter of the same name above
pub struct CongestionParams {
    /// `cc_alg` (0 or 2; 1 reads as 0).
    pub alg: u8,
    pub cwnd_init: u32,
    pub cwnd_min: u32,
    pub cwnd_max: u32,
    pub cwnd_inc: u32,
    pub cwnd_inc_pct_ss: u32,
    pub ss_max: u32,
    pub vegas_alpha: u32,
    pub vegas_beta: u32,
    pub vegas_gamma: u32,
    pub vegas_delta: u32,
    pub ewma_cwnd_pct: u32,
}

impl NetParams {
    /// The congestion-control parameters (defaults where absent, clamped where out of range).
    pub fn congestion_control(&self) -> CongestionParams {
        // Every range above lies within 0..=u32::MAX, so the conversions cannot fail.
        let get = |s: &ParamSpec| u32::try_from(self.get_spec(s)).unwrap_or(0);
        CongestionParams {
            alg: match self.get_spec(&CC_ALG) {
                2 => 2,
                _ => 0,
            },
            cwnd_init: get(&CC_CWND_INIT),
            cwnd_min: get(&CC_CWND_MIN),
            cwnd_max: get(&CC_CWND_MAX),
            cwnd_inc: get(&CC_CWND_INC),
            cwnd_inc_pct_ss: get(&CC_CWND_INC_PCT_SS),
            ss_max: get(&CC_SS_MAX),
            vegas_alpha: get(&CC_VEGAS_ALPHA_EXIT),
            vegas_beta: get(&CC_VEGAS_BETA_EXIT),
            vegas_gamma: get(&CC_VEGAS_GAMMA_EXIT),
            vegas_delta: get(&CC_VEGAS_DELTA_EXIT),
            ewma_cwnd_pct: get(&CC_EWMA_CWND_PCT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, i64)]) -> NetParams {
        NetParams::from_map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()).unwrap()
    }

    #[test]
    fn defaults_and_algorithm_numbers() {
        let d = NetParams::new().congestion_control();
        assert_eq!(d.alg, 0, "fixed window unless the consensus says otherwise");
        assert_eq!((d.cwnd_init, d.cwnd_min, d.cwnd_max), (200, 100, 2000));
        assert_eq!(params(&[("cc_alg", 2)]).congestion_control().alg, 2);
        assert_eq!(params(&[("cc_alg", 1)]).congestion_control().alg, 0);
        assert_eq!(params(&[("cc_alg", 7)]).congestion_control().alg, 2);
    }

    #[test]
    fn out_of_range_is_clamped_by_readers_and_refused_by_authorities() {
        let p = params(&[("cc_cwnd_max", 1_000_000), ("cc_vegas_beta_exit", -5)]);
        let c = p.congestion_control();
        assert_eq!((c.cwnd_max, c.vegas_beta), (2000, 0));
        let err = p.check_known().unwrap_err().to_string();
        assert!(err.contains("cc_cwnd_max = 1000000"), "{err}");
        assert!(params(&[("cc_alg", 2), ("cc_vegas_alpha_exit", 100)])
            .check_known()
            .is_ok());
    }
}
