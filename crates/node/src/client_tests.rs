//! Tests of the client configuration (`client.rs`): options, defaults and refusals.

use super::*;
use crate::test_support::{
    assert_congestion_control_checked, assert_refused_naming, assert_unsent_limit_range_checked,
};

fn parse(extra: &str) -> Result<ClientConfig, toml::de::Error> {
    toml::from_str(&format!(
        "DataDirectory = \"/tmp/x\"\nSocksPort = \"127.0.0.1:1\"\n\
         Authority = \"127.0.0.1:2\"\nAuthorityIdentity = \"{}\"\n{extra}",
        "00".repeat(32)
    ))
}

fn config(extra: &str) -> ClientConfig {
    parse(extra).expect("test config parses")
}

#[test]
fn unknown_and_misspelt_options_are_refused_beside_the_link_options() {
    // The Link* options are declared by a macro beside the others: the file still refuses
    // what nobody reads, and a value of the wrong type names its option, inside the Link*
    // block or not.
    for bad in [
        "LinkKeepAlive = 5",
        "NoSuchOption = 1",
        "LinkKeepalive = \"x\"",
        "OutbufCells = \"x\"",
    ] {
        let err = parse(bad).unwrap_err();
        let name = bad.split(' ').next().unwrap();
        assert!(err.to_string().contains(name), "{bad}: {err}");
    }
    let cfg = config("LinkKeepalive = 2\nLinkIdleTimeout = 7");
    assert_eq!((cfg.link_keepalive, cfg.link_idle_timeout), (2, 7));
}

#[test]
fn link_sockets_keep_their_backlog_small_by_default() {
    // A client uploading over a slow uplink would otherwise queue its download SENDMEs
    // behind the whole autotuned send buffer.
    assert_eq!(config("").link_config().unsent_limit, Some(65_536));
    assert_eq!(
        config("LinkUnsentLimit = 8192").link_config().unsent_limit,
        Some(8192)
    );
    assert_eq!(
        config("LinkUnsentLimit = 0").link_config().unsent_limit,
        None
    );
    assert_eq!(config("").link_config().socket_buffer, None);
    assert_unsent_limit_range_checked(|c| config(c).validate());
}

#[test]
fn hidden_service_options_are_checked_at_start() {
    assert!(config("").service_ports().unwrap().is_empty());
    let ok = config(
        "HiddenServiceDir = \"/tmp/hs\"\nHiddenServicePort = [\"80 127.0.0.1:8080\", \"22\"]",
    );
    assert_eq!(
        ok.service_ports().unwrap(),
        vec![
            (80, "127.0.0.1:8080".parse().unwrap()),
            (22, "127.0.0.1:22".parse().unwrap())
        ]
    );
    assert_eq!(ok.hidden_service_intro_points, 3);
    assert_refused_naming(
        |c| config(c).validate(),
        &[
        ("HiddenServicePort = [\"80\"]", "HiddenServiceDir"),
        ("HiddenServiceDir = \"/tmp/hs\"", "HiddenServicePort"),
        (
            "HiddenServiceDir = \"/tmp/hs\"\nHiddenServicePort = [\"80 nowhere\"]",
            "HiddenServicePort",
        ),
        (
            "HiddenServiceDir = \"/tmp/hs\"\nHiddenServicePort = [\"80\", \"80 127.0.0.1:1\"]",
            "twice",
        ),
        (
            "HiddenServiceDir = \"/tmp/hs\"\nHiddenServicePort = [\"80\"]\nHiddenServiceNumIntroductionPoints = 11",
            "HiddenServiceNumIntroductionPoints",
        ),
        ],
    );
}

#[test]
fn predicted_onion_circuits_are_an_option() {
    let p = |c: &ClientConfig| c.connector_config(OnionPaths::default()).predicted;
    assert_eq!(p(&config("")), 2);
    let c = config("OnionPredictedCircuits = 0");
    assert!(c.validate().is_ok());
    assert_eq!(p(&c), 0);
    assert_refused_naming(
        |c| config(c).validate(),
        &[("OnionPredictedCircuits = 9", "OnionPredictedCircuits")],
    );
}

#[test]
fn pinned_exit_circuits_are_an_option() {
    assert_eq!(config("").pinned_exit_circuits, 2);
    let c = config("PinnedExitCircuits = 0");
    assert!(c.validate().is_ok());
    assert_eq!(c.pinned_exit_circuits, 0);
    assert_refused_naming(
        |c| config(c).validate(),
        &[("PinnedExitCircuits = 9", "PinnedExitCircuits")],
    );
}

#[test]
fn the_onion_attempt_timeout_is_an_option() {
    let t = |c: &ClientConfig| c.connector_config(OnionPaths::default()).attempt_timeout;
    assert_eq!(t(&config("")), Duration::from_secs(30));
    let c = config("OnionAttemptTimeout = 7");
    assert!(c.validate().is_ok());
    assert_eq!(t(&c), Duration::from_secs(7));
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("OnionAttemptTimeout = 0", "OnionAttemptTimeout"),
            ("OnionAttemptTimeout = 121", "OnionAttemptTimeout"),
        ],
    );
}

#[test]
fn link_congestion_control_is_checked_at_start() {
    assert_eq!(config("").link_config().congestion_control, None);
    let cc = config("LinkCongestionControl = \"reno\"");
    assert_eq!(cc.link_config().congestion_control.as_deref(), Some("reno"));
    assert_congestion_control_checked(|c| config(c).validate());
}

#[test]
fn switch_lighter_leg_is_checked_and_passed_on() {
    assert_eq!(config("").switch_options().unwrap().lighter_leg, None);
    let off = config("SwitchLighterLeg = 0").switch_options().unwrap();
    assert_eq!(off.lighter_leg, Some(false));
    let on = config("SwitchLighterLeg = 1").switch_options().unwrap();
    assert_eq!(on.lighter_leg, Some(true));
    assert_refused_naming(
        |c| config(c).validate(),
        &[("SwitchLighterLeg = 2", "SwitchLighterLeg")],
    );
}

#[test]
fn switch_leg_probe_is_checked_and_passed_on() {
    assert_eq!(config("").switch_options().unwrap().leg_probe, None);
    for v in 0..=2u8 {
        let o = config(&format!("SwitchLegProbe = {v}"))
            .switch_options()
            .unwrap();
        assert_eq!(o.leg_probe, Some(v));
    }
    assert_refused_naming(
        |c| config(c).validate(),
        &[("SwitchLegProbe = 3", "SwitchLegProbe")],
    );
}

#[test]
fn switch_leg_use_is_checked_and_passed_on() {
    use chive_core::switching::LegUse;
    assert_eq!(config("").switch_options().unwrap().leg_use, None);
    for u in [LegUse::Whole, LegUse::Stripe] {
        let o = config(&format!("SwitchLegUse = \"{}\"", u.label()))
            .switch_options()
            .unwrap();
        assert_eq!(o.leg_use, Some(u));
    }
    assert_refused_naming(
        |c| config(c).validate(),
        &[("SwitchLegUse = \"both\"", "SwitchLegUse")],
    );
}

#[test]
fn switch_stripe_leg_cells_is_checked_and_passed_on() {
    assert_eq!(config("").switch_options().unwrap().stripe_leg_cells, None);
    for n in [0, 50, 120, 500] {
        let o = config(&format!("SwitchStripeLegCells = {n}"))
            .switch_options()
            .unwrap();
        assert_eq!(o.stripe_leg_cells, Some(n));
    }
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("SwitchStripeLegCells = 49", "SwitchStripeLegCells"),
            ("SwitchStripeLegCells = 501", "SwitchStripeLegCells"),
        ],
    );
}

#[test]
fn switch_stripe_moves_is_checked_and_passed_on() {
    assert_eq!(config("").switch_options().unwrap().stripe_moves, None);
    for n in [1, 4, 16] {
        let o = config(&format!("SwitchStripeMoves = {n}"))
            .switch_options()
            .unwrap();
        assert_eq!(o.stripe_moves, Some(n));
    }
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("SwitchStripeMoves = 0", "SwitchStripeMoves"),
            ("SwitchStripeMoves = 17", "SwitchStripeMoves"),
        ],
    );
}
