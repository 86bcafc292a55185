//! The DoS defences' parameters (Tor's dos.c names, defaults and ranges): consensus parameters
//! an authority may set for every relay, and the same names as a relay's own options, which
//! override the consensus (as Tor's torrc `DoS*` options do). The relay core's
//! `chive_core::dos::DosConfig` is built from them; see docs/security.md.

use crate::params::ParamSpec;

/// The largest value Tor accepts for a count or a time (`INT32_MAX`).
const MAX: i64 = i32::MAX as i64;

/// `DoSCircuitCreationEnabled`: 1 turns the circuit-creation defence on (default 0, as Tor;
/// Tor's live consensus sets 1).
pub const DOS_CC_ENABLED: ParamSpec = ParamSpec::new("DoSCircuitCreationEnabled", 0, 0, 1);

/// `DoSCircuitCreationMinConnections`: client connections an address must have open before
/// its circuit creation can be judged a flood.
pub const DOS_CC_MIN_CONNECTIONS: ParamSpec =
    ParamSpec::new("DoSCircuitCreationMinConnections", 3, 1, MAX);

/// `DoSCircuitCreationRate`: CREATE2 tokens an address gets back per second.
pub const DOS_CC_RATE: ParamSpec = ParamSpec::new("DoSCircuitCreationRate", 3, 1, MAX);

/// `DoSCircuitCreationBurst`: the size of an address's CREATE2 bucket.
pub const DOS_CC_BURST: ParamSpec = ParamSpec::new("DoSCircuitCreationBurst", 90, 1, MAX);

/// `DoSCircuitCreationDefenseType`: 1 none (detect only), 2 refuse CREATE2 with DESTROY.
pub const DOS_CC_DEFENSE_TYPE: ParamSpec = ParamSpec::new("DoSCircuitCreationDefenseType", 2, 1, 2);

/// `DoSCircuitCreationDefenseTimePeriod`: seconds a flooding address stays refused (plus a
/// random part of up to half again).
pub const DOS_CC_DEFENSE_TIME_PERIOD: ParamSpec =
    ParamSpec::new("DoSCircuitCreationDefenseTimePeriod", 60 * 60, 0, MAX);

/// `DoSConnectionEnabled`: 1 turns the connection defence on (default 0, as Tor).
pub const DOS_CONN_ENABLED: ParamSpec = ParamSpec::new("DoSConnectionEnabled", 0, 0, 1);

/// `DoSConnectionMaxConcurrentCount`: above this many open client connections an address may
/// not open another.
pub const DOS_CONN_MAX_CONCURRENT_COUNT: ParamSpec =
    ParamSpec::new("DoSConnectionMaxConcurrentCount", 100, 1, MAX);

/// `DoSConnectionDefenseType`: 1 none (detect only), 2 close the connection.
pub const DOS_CONN_DEFENSE_TYPE: ParamSpec = ParamSpec::new("DoSConnectionDefenseType", 2, 1, 2);

/// `DoSConnectionConnectRate`: new client connections an address may open per second.
pub const DOS_CONN_CONNECT_RATE: ParamSpec = ParamSpec::new("DoSConnectionConnectRate", 20, 1, MAX);

/// `DoSConnectionConnectBurst`: the size of an address's connect bucket.
pub const DOS_CONN_CONNECT_BURST: ParamSpec =
    ParamSpec::new("DoSConnectionConnectBurst", 40, 1, MAX);

/// `DoSConnectionConnectDefenseTimePeriod`: seconds an address that connected too fast may not
/// connect (plus up to half again); at least 10 s, since the random part needs room.
pub const DOS_CONN_CONNECT_DEFENSE_TIME_PERIOD: ParamSpec = ParamSpec::new(
    "DoSConnectionConnectDefenseTimePeriod",
    24 * 60 * 60,
    10,
    MAX,
);

/// `DoSStreamCreationEnabled`: 1 turns the exit's per-circuit stream-creation defence on
/// (default 0; Tor 0.4.9).
pub const DOS_STREAM_ENABLED: ParamSpec = ParamSpec::new("DoSStreamCreationEnabled", 0, 0, 1);

/// `DoSStreamCreationRate`: BEGIN/RESOLVE tokens a circuit gets back per second.
pub const DOS_STREAM_RATE: ParamSpec = ParamSpec::new("DoSStreamCreationRate", 100, 1, MAX);

/// `DoSStreamCreationBurst`: the size of a circuit's stream bucket.
pub const DOS_STREAM_BURST: ParamSpec = ParamSpec::new("DoSStreamCreationBurst", 300, 1, MAX);

/// `DoSStreamCreationDefenseType`: 1 none, 2 refuse the stream (END), 3 close the circuit.
pub const DOS_STREAM_DEFENSE_TYPE: ParamSpec =
    ParamSpec::new("DoSStreamCreationDefenseType", 2, 1, 3);

/// `DoSRefuseSingleHopClientRendezvous`: 1 makes a rendezvous point drop, silently, an
/// ESTABLISH_RENDEZVOUS on a circuit that a client built straight to it (default 0, as Tor).
pub const DOS_REFUSE_SINGLE_HOP: ParamSpec =
    ParamSpec::new("DoSRefuseSingleHopClientRendezvous", 0, 0, 1);

/// Every DoS parameter.
pub const DOS_PARAMS: [ParamSpec; 17] = [
    DOS_CC_ENABLED,
    DOS_CC_MIN_CONNECTIONS,
    DOS_CC_RATE,
    DOS_CC_BURST,
    DOS_CC_DEFENSE_TYPE,
    DOS_CC_DEFENSE_TIME_PERIOD,
    DOS_CONN_ENABLED,
    DOS_CONN_MAX_CONCURRENT_COUNT,
    DOS_CONN_DEFENSE_TYPE,
    DOS_CONN_CONNECT_RATE,
    DOS_CONN_CONNECT_BURST,
    DOS_CONN_CONNECT_DEFENSE_TIME_PERIOD,
    DOS_STREAM_ENABLED,
    DOS_STREAM_RATE,
    DOS_STREAM_BURST,
    DOS_STREAM_DEFENSE_TYPE,
    DOS_REFUSE_SINGLE_HOP,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{NetParams, KNOWN_PARAMS};

    #[test]
    fn every_dos_param_is_known_with_its_default_in_range() {
        for spec in DOS_PARAMS {
            assert!(KNOWN_PARAMS.contains(&spec), "{} not known", spec.name);
            assert!(
                spec.min <= spec.default && spec.default <= spec.max,
                "{spec:?}"
            );
            assert_eq!(NetParams::new().get_spec(&spec), spec.default);
        }
    }

    #[test]
    fn out_of_range_dos_values_are_refused_by_the_authority_and_clamped_by_readers() {
        for (name, bad) in [
            ("DoSCircuitCreationDefenseType", 3),
            ("DoSCircuitCreationBurst", 0),
            ("DoSConnectionConnectDefenseTimePeriod", 9),
            ("DoSConnectionEnabled", 2),
            ("DoSStreamCreationDefenseType", 4),
            ("DoSStreamCreationRate", 0),
        ] {
            let mut p = NetParams::new();
            p.set(name, bad).unwrap();
            let err = p.check_known().unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
        let mut p = NetParams::new();
        p.set("DoSConnectionConnectDefenseTimePeriod", 1).unwrap();
        assert_eq!(p.get_spec(&DOS_CONN_CONNECT_DEFENSE_TIME_PERIOD), 10);
        p.set("DoSCircuitCreationBurst", 1 << 40).unwrap();
        assert_eq!(p.get_spec(&DOS_CC_BURST), i64::from(i32::MAX));
    }
}
