//! From the consensus's congestion-control parameters to the core's policy choice.
//!
//! chive-dir reads the parameters (names, ranges, defaults) and chive-core owns the
//! policies; neither depends on the other, so the translation lives here, where both meet.

use chive_core::cc::{CcKind, VegasParams};
use chive_dir::NetParams;

/// The congestion-control policy a consensus asks for (`cc_alg`: 0 fixed window, 2 Vegas).
pub fn congestion_control(params: &NetParams) -> CcKind {
    let c = params.congestion_control();
    match c.alg {
        2 => CcKind::Vegas(
            VegasParams {
                cwnd_init: c.cwnd_init,
                cwnd_min: c.cwnd_min,
                cwnd_max: c.cwnd_max,
                cwnd_inc: c.cwnd_inc,
                cwnd_inc_pct_ss: c.cwnd_inc_pct_ss,
                ss_max: c.ss_max,
                alpha: c.vegas_alpha,
                beta: c.vegas_beta,
                gamma: c.vegas_gamma,
                delta: c.vegas_delta,
                ewma_cwnd_pct: c.ewma_cwnd_pct,
            }
            .sanitized(),
        ),
        _ => CcKind::Fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, i64)]) -> NetParams {
        NetParams::from_map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()).unwrap()
    }

    #[test]
    fn fixed_window_unless_cc_alg_is_2() {
        assert_eq!(congestion_control(&NetParams::new()), CcKind::Fixed);
        assert_eq!(congestion_control(&params(&[("cc_alg", 1)])), CcKind::Fixed);
    }

    /// The consensus defaults are the core's defaults: the two crates do not drift apart.
    #[test]
    fn consensus_defaults_are_the_cores() {
        assert_eq!(
            congestion_control(&params(&[("cc_alg", 2)])),
            CcKind::Vegas(VegasParams::default())
        );
    }

    #[test]
    fn tunables_reach_the_policy_made_consistent() {
        let kind = congestion_control(&params(&[
            ("cc_alg", 2),
            ("cc_cwnd_init", 500),
            ("cc_cwnd_max", 300),
            ("cc_vegas_alpha_exit", 48),
        ]));
        let CcKind::Vegas(p) = kind else {
            panic!("{kind:?}")
        };
        assert_eq!((p.cwnd_init, p.cwnd_max, p.alpha), (300, 300, 48));
    }
}
