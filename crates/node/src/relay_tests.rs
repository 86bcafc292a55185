//! Tests of the relay configuration (`relay.rs`): options, defaults, refusals and reloads.

use super::*;
use crate::driver::Liveness;
use crate::test_support::{
    assert_congestion_control_checked, assert_refused_naming, assert_unsent_limit_range_checked,
};

fn config(extra: &str) -> RelayConfig {
    toml::from_str(&format!(
        "Nickname = \"r\"\nDataDirectory = \"/tmp/x\"\nORPort = \"127.0.0.1:1\"\n\
         Authority = \"127.0.0.1:2\"\nAuthorityIdentity = \"{}\"\n{extra}",
        "00".repeat(32)
    ))
    .expect("test config parses")
}

#[test]
fn link_liveness_and_heartbeat_options_are_checked_and_named() {
    assert!(config("").validate().is_ok());
    assert_eq!(config("").link().liveness().unwrap(), Liveness::default());
    let off = config("LinkKeepalive = 0\nLinkIdleTimeout = 0")
        .link()
        .liveness()
        .unwrap();
    assert_eq!((off.keepalive, off.idle_timeout), (None, None));
    let fast = config("LinkKeepalive = 1\nLinkIdleTimeout = 3")
        .link()
        .liveness()
        .unwrap();
    assert_eq!(fast.idle_timeout, Some(Duration::from_secs(3)));
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("LinkIdleTimeout = 1", "LinkIdleTimeout"),
            (
                "LinkKeepalive = 10\nLinkIdleTimeout = 15",
                "LinkIdleTimeout",
            ),
            ("LinkKeepalive = 4000\nLinkIdleTimeout = 0", "LinkKeepalive"),
            ("HeartbeatPeriod = 99999999", "HeartbeatPeriod"),
            ("OutbufMaxMsec = 1001", "OutbufMaxMsec"),
        ],
    );
    assert!(config("HeartbeatPeriod = 0").validate().is_ok());
    assert!(config("OutbufMaxMsec = 0").validate().is_ok());
    let t = config("OutbufMaxMsec = 50").tunables().unwrap();
    assert_eq!(t.outbuf_max(), Duration::from_millis(50));
}

#[test]
fn switching_options_are_checked_and_named() {
    let c = config("CircuitSwitching = \"connection\"\nSwitchAlpha = 0.05\nSwitchBeta = 0.1");
    assert!(c.validate().is_ok());
    let o = c.switch_options().unwrap();
    assert_eq!(o.mode, Some(chive_dir::SwitchingMode::Connection));
    assert_eq!((o.alpha, o.beta), (Some(0.05), Some(0.1)));
    assert_eq!(
        config("SwitchMinShare = 0.1")
            .switch_options()
            .unwrap()
            .min_share,
        Some(0.1)
    );
    assert_eq!(
        config("").switch_options().unwrap().mode,
        None,
        "consensus decides"
    );
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("CircuitSwitching = \"sometimes\"", "CircuitSwitching"),
            ("SwitchGamma = 1.0", "SwitchGamma"),
            ("SwitchBeta = 1.5", "SwitchBeta"),
            ("SwitchAlpha = 0.6\nSwitchBeta = 0.5", "SwitchAlpha"),
            ("SwitchSampleIntervalMsec = 5", "SwitchSampleIntervalMsec"),
            ("SwitchBufferBytes = 10", "SwitchBufferBytes"),
            ("SwitchTimeoutMsec = 50", "SwitchTimeoutMsec"),
            ("SwitchMinShare = 1.5", "SwitchMinShare"),
            ("SwitchMinShare = -0.1", "SwitchMinShare"),
        ],
    );
}

#[test]
fn quiet_reserve_defaults_follow_the_rate_and_burst() {
    // Unlimited: no reserve.
    assert_eq!(config("").quiet_reserve(), 0);
    // 1 MB/s (burst = rate): the default 128 KiB.
    assert_eq!(config("BandwidthRate = 1000000").quiet_reserve(), 131_072);
    // A small burst caps the default at a quarter of it.
    assert_eq!(config("BandwidthRate = 100000").quiet_reserve(), 25_000);
    // Explicit values win, 0 turns it off.
    let c = config("BandwidthRate = 1000000\nQuietReserve = 0");
    assert_eq!(c.quiet_reserve(), 0);
    assert!(c.validate().is_ok());
    let c = config("BandwidthRate = 1000000\nQuietReserve = 500000");
    assert_eq!(c.quiet_reserve(), 500_000);
    assert!(c.validate().is_ok());
    // More than half the burst would starve bulk: refused, naming the option.
    assert_refused_naming(
        |c| config(c).validate(),
        &[(
            "BandwidthRate = 1000000\nQuietReserve = 500001",
            "QuietReserve",
        )],
    );
}

#[test]
fn unsent_limit_defaults_to_64k_without_a_rate() {
    // Unlimited relay, kernel-sized buffers: the default limit.
    assert_eq!(config("").socket_buffer(), None);
    assert_eq!(config("").unsent_limit(), Some(65_536));
    // Explicit values win; 0 means no limit.
    assert_eq!(config("LinkUnsentLimit = 0").unsent_limit(), None);
    assert_eq!(config("LinkUnsentLimit = 8192").unsent_limit(), Some(8192));
    assert_unsent_limit_range_checked(|c| config(c).validate());
}

#[test]
fn a_rate_leaves_socket_buffers_autotuned_and_bounds_the_unsent_bytes() {
    // Under a rate: no SO_SNDBUF/SO_RCVBUF (a fixed buffer caps a link at size / RTT), and
    // 10 ms of the rate unsent, between 4 KiB and 64 KiB.
    let sockets = |extra: &str| {
        let c = config(extra);
        (c.socket_buffer(), c.unsent_limit())
    };
    assert_eq!(sockets("BandwidthRate = 500000"), (None, Some(5000)));
    // ... growing per link by the rate times twice its round trip (chive-net's
    // `rtt_scaled_unsent`), unless the limit is set or the sockets are constrained.
    let rtt_rate = |extra: &str| config(extra).unsent_rtt_rate();
    assert_eq!(rtt_rate("BandwidthRate = 500000"), Some(500_000));
    assert_eq!(rtt_rate(""), None);
    assert_eq!(
        rtt_rate("BandwidthRate = 500000\nLinkUnsentLimit = 8192"),
        None
    );
    assert_eq!(
        rtt_rate("BandwidthRate = 500000\nConstrainedSockets = true"),
        None
    );
    assert_eq!(sockets("BandwidthRate = 1000000"), (None, Some(10_000)));
    assert_eq!(sockets("BandwidthRate = 100000"), (None, Some(4096)));
    assert_eq!(sockets("BandwidthRate = 50000000"), (None, Some(65_536)));
    assert_eq!(
        sockets("BandwidthRate = 500000\nConstrainedSockets = false"),
        (None, Some(5000))
    );
    // An explicit limit wins over the rate's; 0 turns it off.
    assert_eq!(
        sockets("BandwidthRate = 500000\nLinkUnsentLimit = 65536"),
        (None, Some(65_536))
    );
    assert_eq!(
        sockets("BandwidthRate = 500000\nLinkUnsentLimit = 0"),
        (None, None)
    );
}

#[test]
fn constrained_sockets_keep_the_old_behaviour() {
    // `ConstrainedSockets = true` is the default before session 15: buffers of 10 ms of the
    // rate (at least 8 KiB), no unsent limit unless set.
    let sockets = |extra: &str| {
        let c = config(extra);
        (c.socket_buffer(), c.unsent_limit())
    };
    assert_eq!(
        sockets("BandwidthRate = 1000000\nConstrainedSockets = true"),
        (Some(10_000), None)
    );
    assert_eq!(
        sockets("BandwidthRate = 500000\nConstrainedSockets = true"),
        (Some(8192), None)
    );
    assert_eq!(sockets("ConstrainedSockets = true"), (Some(8192), None));
    assert_eq!(
        sockets("BandwidthRate = 500000\nConstrainedSockets = true\nConstrainedSockSize = 30000"),
        (Some(30_000), None)
    );
    assert_eq!(
        sockets("BandwidthRate = 500000\nConstrainedSockets = true\nLinkUnsentLimit = 4096"),
        (Some(8192), Some(4096))
    );
    // The size alone does not switch constraining on.
    assert_eq!(
        sockets("BandwidthRate = 500000\nConstrainedSockSize = 30000"),
        (None, Some(5000))
    );
}

#[test]
fn circuit_window_is_checked() {
    assert_eq!(config("CircuitWindow = 101").circuit_window, Some(101));
    assert!(config("CircuitWindow = 101").validate().is_ok());
    assert_eq!(config("").circuit_window, None);
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("CircuitWindow = 99", "CircuitWindow"),
            ("CircuitWindow = 1001", "CircuitWindow"),
        ],
    );
}

#[test]
fn link_congestion_control_is_checked_at_start() {
    assert_congestion_control_checked(|c| config(c).validate());
}

#[test]
fn link_record_layer_is_parsed_and_checked_at_start() {
    use chive_net::RecordLayer;
    assert_eq!(config("").link().record_layer().unwrap(), RecordLayer::Own);
    for (line, want) in [
        ("LinkRecordLayer = \"rustls\"", RecordLayer::Rustls),
        ("LinkRecordLayer = \"own\"", RecordLayer::Own),
    ] {
        let cfg = config(line);
        assert!(cfg.validate().is_ok(), "{line}");
        assert_eq!(cfg.link().record_layer().unwrap(), want);
    }
    let err = config("LinkRecordLayer = \"ktls\"")
        .validate()
        .expect_err("an unknown record layer is refused");
    assert!(format!("{err:#}").contains("LinkRecordLayer"), "{err:#}");
}

#[test]
fn memory_and_dos_options_are_checked_naming_them() {
    let t = config("MaxMemInQueues = \"16 MB\"\nDoSCircuitCreationEnabled = 1")
        .tunables()
        .unwrap();
    assert_eq!(t.max_mem_in_queues, Some(16 << 20));
    assert!(t.dos_config(None).unwrap().circuit_creation.enabled);
    assert_eq!(
        config("").tunables().unwrap().max_mem_in_queues,
        Some(chive_core::DEFAULT_MAX_MEM_IN_QUEUES)
    );
    assert_refused_naming(
        |c| config(c).validate(),
        &[
            ("MaxMemInQueues = 100", "MaxMemInQueues"),
            ("MaxMemInQueues = \"3 furlongs\"", "MaxMemInQueues"),
            ("DoSCircuitCreationBurst = -1", "DoSCircuitCreationBurst"),
            ("DoSConnectionDefenseType = 3", "DoSConnectionDefenseType"),
            ("DoSStreamCreationEnabled = 2", "DoSStreamCreationEnabled"),
            ("DoSStreamCreationRate = -3", "DoSStreamCreationRate"),
            (
                "DoSStreamCreationBurst = 2147483648",
                "DoSStreamCreationBurst",
            ),
            (
                "DoSStreamCreationDefenseType = 4",
                "DoSStreamCreationDefenseType",
            ),
        ],
    );
    // 0 is torrc's "use the consensus" (the defaults here), except for the switches.
    let t = config("DoSStreamCreationEnabled = 1\nDoSStreamCreationRate = 0\nDoSStreamCreationBurst = 0\nDoSStreamCreationDefenseType = 0")
        .tunables()
        .unwrap();
    let sc = t.dos_config(None).unwrap().stream_creation;
    assert!(sc.enabled);
    assert_eq!((sc.rate, sc.burst), (100, 300));
    assert_eq!(sc.defense, chive_core::dos::StreamDefense::RefuseStream);
}
