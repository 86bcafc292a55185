//! A relay's memory cap and DoS options, with torrc's names and semantics: `MaxMemInQueues`
//! (a size with Tor's units) and the sixteen `DoSCircuitCreation*` / `DoSConnection*` /
//! `DoSStreamCreation*` options,
//! which override the consensus parameters of the same names (`chive_dir::dos_params`). The
//! rules they set live in the core (`chive_core::dos`, the OOM handler); this file only turns
//! options into the core's settings, with the option named in every error.

use std::time::Duration;

use chive_core::dos::{
    CircuitCreationConfig, ConnectionConfig, DefenseType, DosConfig, StreamCreationConfig,
    StreamDefense,
};
use chive_core::{max_mem_in_queues_auto, DEFAULT_MAX_MEM_IN_QUEUES, MIN_MAX_MEM_IN_QUEUES};
use chive_dir::dos_params::*;
use chive_dir::{NetParams, ParamSpec};
use serde::Deserialize;

/// The smallest `MaxMemInQueues` chive accepts: 1 MiB. Tor raises anything below 256 MB to
/// 256 MB; chive lets tests and small machines go lower, with a warning (see [`MemSize`]).
pub const MIN_CONFIGURED_MEM: u64 = 1 << 20;

/// A size in a config file: a number of bytes, or a string with Tor's units ("256 MB",
/// "1 GB", "512 KBytes"; K/M/G/T are powers of 1024, as in torrc; "bits" units are refused).
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum MemSize {
    Bytes(u64),
    Text(String),
}

impl MemSize {
    /// The size in bytes.
    pub fn bytes(&self) -> Result<u64, String> {
        let text = match self {
            MemSize::Bytes(b) => return Ok(*b),
            MemSize::Text(t) => t.trim(),
        };
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (num, unit) = text.split_at(split);
        let num: u64 = num
            .parse()
            .map_err(|_| format!("{text:?} is not a size (e.g. 268435456 or \"256 MB\")"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" | "byte" | "bytes" => 0,
            "kb" | "kbyte" | "kbytes" | "kilobyte" | "kilobytes" | "kib" => 10,
            "m" | "mb" | "mbyte" | "mbytes" | "megabyte" | "megabytes" | "mib" => 20,
            "gb" | "gbyte" | "gbytes" | "gigabyte" | "gigabytes" | "gib" => 30,
            "tb" | "tbyte" | "tbytes" | "terabyte" | "terabytes" | "tib" => 40,
            other => return Err(format!("unknown unit {other:?} in {text:?}")),
        };
        num.checked_mul(1u64 << shift)
            .ok_or_else(|| format!("{text:?} is too large"))
    }
}

/// `MaxMemInQueues` in bytes from the option: unset = chive's default (256 MiB, Tor's floor;
/// docs/security.md says why not Tor's automatic rule), 0 = Tor's automatic rule from the
/// machine's RAM, else at least [`MIN_CONFIGURED_MEM`]. The second value is a warning to log
/// (a limit below Tor's 256 MB floor).
pub fn max_mem_in_queues(opt: Option<&MemSize>) -> Result<(usize, Option<String>), String> {
    let Some(opt) = opt else {
        return Ok((DEFAULT_MAX_MEM_IN_QUEUES, None));
    };
    let bytes = opt.bytes().map_err(|e| format!("MaxMemInQueues: {e}"))?;
    if bytes == 0 {
        let auto = max_mem_in_queues_auto(total_ram());
        return Ok((usize::try_from(auto).unwrap_or(usize::MAX), None));
    }
    if bytes < MIN_CONFIGURED_MEM {
        return Err(format!(
            "MaxMemInQueues: {bytes} bytes is below the minimum of 1 MiB (0 = automatic)"
        ));
    }
    let warning = (bytes < MIN_MAX_MEM_IN_QUEUES).then(|| {
        format!(
            "MaxMemInQueues {bytes} bytes is below Tor's floor of 256 MB (Tor would raise it); \
             fine for tests, small for a public relay"
        )
    });
    Ok((usize::try_from(bytes).unwrap_or(usize::MAX), warning))
}

/// The on/off options (the three `*Enabled` and `DoSRefuseSingleHopClientRendezvous`, 0..=1;
/// torrc also takes "auto", which is chive's unset), the only ones where 0 is a value of its
/// own rather than "use the consensus".
fn is_switch(spec: &ParamSpec) -> bool {
    (spec.min, spec.max) == (0, 1)
}

/// MemTotal from /proc/meminfo, if readable.
fn total_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A relay's own `DoS*` options: the ones set, each overriding the consensus parameter of the
/// same name (as torrc's `DoS*` options do in Tor).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DosOptions {
    set: Vec<(ParamSpec, i64)>,
}

impl DosOptions {
    /// The options set, as (name, value); a value outside the parameter's range is an error
    /// naming the option (Tor refuses such a torrc, while a consensus value is clamped). As in
    /// torrc, 0 for any option but the on/off ones (the `*Enabled` three and
    /// `DoSRefuseSingleHopClientRendezvous`) means "use the consensus parameter" (tor's man
    /// page), the same as unset; an on/off option set to 0 turns its defence off whatever the
    /// consensus says.
    pub fn new(values: &[(&str, Option<i64>)]) -> Result<DosOptions, String> {
        let mut set = Vec::new();
        for &(name, value) in values {
            let Some(v) = value else { continue };
            let spec = DOS_PARAMS
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| format!("{name}: not a DoS option"))?;
            if v == 0 && !is_switch(spec) {
                continue;
            }
            if !(spec.min..=spec.max).contains(&v) {
                return Err(format!(
                    "{name}: {v} is out of range {}..={}",
                    spec.min, spec.max
                ));
            }
            set.push((*spec, v));
        }
        Ok(DosOptions { set })
    }

    /// The value in force for `spec`: ours, else the consensus's (clamped), else the default.
    fn get(&self, spec: &ParamSpec, params: Option<&NetParams>) -> i64 {
        if let Some((_, v)) = self.set.iter().find(|(s, _)| s.name == spec.name) {
            return *v;
        }
        params.map_or(spec.default, |p| p.get_spec(spec))
    }

    /// The core's DoS settings from these options and the latest consensus parameters.
    pub fn config(&self, params: Option<&NetParams>) -> Result<DosConfig, String> {
        // Every range lies within 0..=i32::MAX, so the conversions cannot fail.
        let u = |spec: &ParamSpec| u32::try_from(self.get(spec, params)).unwrap_or(u32::MAX);
        let secs = |spec: &ParamSpec| Duration::from_secs(u64::from(u(spec)));
        let defense = |spec: &ParamSpec| {
            DefenseType::from_tor(self.get(spec, params))
                .ok_or_else(|| format!("{}: must be 1 or 2", spec.name))
        };
        Ok(DosConfig {
            circuit_creation: CircuitCreationConfig {
                enabled: self.get(&DOS_CC_ENABLED, params) == 1,
                min_connections: u(&DOS_CC_MIN_CONNECTIONS),
                rate: u(&DOS_CC_RATE),
                burst: u(&DOS_CC_BURST),
                defense: defense(&DOS_CC_DEFENSE_TYPE)?,
                defense_time: secs(&DOS_CC_DEFENSE_TIME_PERIOD),
            },
            connection: ConnectionConfig {
                enabled: self.get(&DOS_CONN_ENABLED, params) == 1,
                max_concurrent: u(&DOS_CONN_MAX_CONCURRENT_COUNT),
                defense: defense(&DOS_CONN_DEFENSE_TYPE)?,
                connect_rate: u(&DOS_CONN_CONNECT_RATE),
                connect_burst: u(&DOS_CONN_CONNECT_BURST),
                connect_defense_time: secs(&DOS_CONN_CONNECT_DEFENSE_TIME_PERIOD),
            },
            stream_creation: StreamCreationConfig {
                enabled: self.get(&DOS_STREAM_ENABLED, params) == 1,
                rate: u(&DOS_STREAM_RATE),
                burst: u(&DOS_STREAM_BURST),
                defense: StreamDefense::from_tor(self.get(&DOS_STREAM_DEFENSE_TYPE, params))
                    .ok_or_else(|| {
                        format!("{}: must be 1, 2 or 3", DOS_STREAM_DEFENSE_TYPE.name)
                    })?,
            },
            refuse_single_hop_rendezvous: self.get(&DOS_REFUSE_SINGLE_HOP, params) == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_tors_units() {
        let t = |s: &str| MemSize::Text(s.into()).bytes();
        assert_eq!(MemSize::Bytes(12345).bytes(), Ok(12345));
        assert_eq!(t("256 MB"), Ok(256 << 20));
        assert_eq!(t("16MBytes"), Ok(16 << 20));
        assert_eq!(t("1 GB"), Ok(1 << 30));
        assert_eq!(t("512 KB"), Ok(512 << 10));
        assert_eq!(t("4096"), Ok(4096));
        assert!(t("lots").is_err());
        assert!(t("5 parsecs").unwrap_err().contains("unit"));
        assert!(t("99999999999999 TB").unwrap_err().contains("too large"));
    }

    #[test]
    fn max_mem_in_queues_defaults_auto_and_bounds() {
        assert_eq!(
            max_mem_in_queues(None).unwrap(),
            (DEFAULT_MAX_MEM_IN_QUEUES, None)
        );
        let (auto, _) = max_mem_in_queues(Some(&MemSize::Bytes(0))).unwrap();
        assert!(auto >= MIN_MAX_MEM_IN_QUEUES as usize, "{auto}");
        let (small, warning) = max_mem_in_queues(Some(&MemSize::Text("16 MB".into()))).unwrap();
        assert_eq!(small, 16 << 20);
        assert!(warning.is_some());
        let (big, warning) = max_mem_in_queues(Some(&MemSize::Text("1 GB".into()))).unwrap();
        assert_eq!((big, warning), (1 << 30, None));
        let err = max_mem_in_queues(Some(&MemSize::Bytes(1000))).unwrap_err();
        assert!(err.starts_with("MaxMemInQueues: "), "{err}");
        let err = max_mem_in_queues(Some(&MemSize::Text("x".into()))).unwrap_err();
        assert!(err.starts_with("MaxMemInQueues: "), "{err}");
    }

    #[test]
    fn dos_options_override_the_consensus_which_overrides_defaults() {
        let none = DosOptions::default();
        assert_eq!(none.config(None).unwrap(), DosConfig::default());
        let mut params = NetParams::new();
        params.set("DoSCircuitCreationEnabled", 1).unwrap();
        params.set("DoSCircuitCreationBurst", 50).unwrap();
        params.set("DoSConnectionMaxConcurrentCount", 0).unwrap(); // clamped to 1
        let c = none.config(Some(&params)).unwrap();
        assert!(c.circuit_creation.enabled);
        assert_eq!(c.circuit_creation.burst, 50);
        assert_eq!(c.connection.max_concurrent, 1);
        let ours = DosOptions::new(&[
            ("DoSCircuitCreationBurst", Some(20)),
            ("DoSCircuitCreationEnabled", Some(0)),
            ("DoSConnectionDefenseType", Some(1)),
            ("DoSCircuitCreationRate", None),
        ])
        .unwrap();
        let c = ours.config(Some(&params)).unwrap();
        assert!(!c.circuit_creation.enabled);
        assert_eq!(c.circuit_creation.burst, 20);
        assert_eq!(c.circuit_creation.rate, 3);
        assert_eq!(c.connection.defense, DefenseType::None);
        assert_eq!(c.circuit_creation.defense_time, Duration::from_secs(3600));
    }

    #[test]
    fn out_of_range_dos_options_are_errors_naming_them() {
        for (name, bad) in [
            ("DoSCircuitCreationDefenseType", 3),
            ("DoSCircuitCreationBurst", -1),
            ("DoSConnectionConnectDefenseTimePeriod", 9),
            ("DoSConnectionEnabled", 2),
        ] {
            let err = DosOptions::new(&[(name, Some(bad))]).unwrap_err();
            assert!(err.starts_with(&format!("{name}: ")), "{err}");
        }
    }

    /// Every `DoS*` option: its range's ends are taken, one past either end is refused with
    /// the option named (0 aside, which is "the consensus's value" for all but `*Enabled`).
    #[test]
    fn every_dos_option_takes_its_range_and_refuses_past_it() {
        assert_eq!(
            DOS_PARAMS.len(),
            17,
            "a new DoS option needs its range tested"
        );
        for spec in DOS_PARAMS.iter() {
            for ok in [spec.min, spec.max] {
                let o = DosOptions::new(&[(spec.name, Some(ok))]);
                let o = o.unwrap_or_else(|e| panic!("{} = {ok}: {e}", spec.name));
                o.config(None)
                    .unwrap_or_else(|e| panic!("{} = {ok}: {e}", spec.name));
                if ok != 0 || is_switch(spec) {
                    assert_eq!(o.get(spec, None), ok, "{}", spec.name);
                }
            }
            let mut bad = vec![spec.max + 1, -1, i64::MIN];
            if spec.min > 1 || (spec.min == 1 && is_switch(spec)) {
                bad.push(spec.min - 1);
            }
            for v in bad {
                let err = DosOptions::new(&[(spec.name, Some(v))])
                    .expect_err(&format!("{} = {v} must be refused", spec.name));
                assert!(err.starts_with(&format!("{}: {v} ", spec.name)), "{err}");
            }
        }
    }

    /// As in torrc, 0 means "use the consensus" for every option but the switches, where it
    /// turns the defence off.
    #[test]
    fn zero_means_the_consensus_value_except_for_the_switches() {
        let mut params = NetParams::new();
        params.set("DoSStreamCreationEnabled", 1).unwrap();
        params.set("DoSStreamCreationRate", 7).unwrap();
        params.set("DoSStreamCreationDefenseType", 3).unwrap();
        params
            .set("DoSConnectionConnectDefenseTimePeriod", 600)
            .unwrap();
        let zeros: Vec<(&str, Option<i64>)> =
            DOS_PARAMS.iter().map(|s| (s.name, Some(0))).collect();
        let c = DosOptions::new(&zeros)
            .unwrap()
            .config(Some(&params))
            .unwrap();
        assert!(
            !c.stream_creation.enabled,
            "Enabled = 0 is off, whatever the consensus"
        );
        assert!(!c.circuit_creation.enabled && !c.connection.enabled);
        assert!(!c.refuse_single_hop_rendezvous);
        assert_eq!(c.stream_creation.rate, 7);
        assert_eq!(c.stream_creation.burst, 300);
        assert_eq!(c.stream_creation.defense, StreamDefense::CloseCircuit);
        assert_eq!(c.connection.connect_defense_time, Duration::from_secs(600));
        assert_eq!(c.circuit_creation.rate, 3);
        assert_eq!(c.circuit_creation.defense, DefenseType::Refuse);
        let no_consensus = DosOptions::new(&zeros).unwrap().config(None).unwrap();
        assert_eq!(no_consensus, DosConfig::default());
    }

    /// `MaxMemInQueues`: 1 MiB is the least taken (with a warning below 256 MiB), one byte
    /// less is refused, as are sizes that overflow and units of bits; each error names it.
    #[test]
    fn max_mem_in_queues_range_ends() {
        let mem = |m: MemSize| max_mem_in_queues(Some(&m));
        let (v, warning) = mem(MemSize::Bytes(MIN_CONFIGURED_MEM)).unwrap();
        assert_eq!(v as u64, MIN_CONFIGURED_MEM);
        assert!(warning.is_some());
        let (_, warning) = mem(MemSize::Bytes(MIN_MAX_MEM_IN_QUEUES - 1)).unwrap();
        assert!(warning.is_some());
        let (_, warning) = mem(MemSize::Bytes(MIN_MAX_MEM_IN_QUEUES)).unwrap();
        assert!(warning.is_none());
        let (v, _) = mem(MemSize::Bytes(u64::MAX)).unwrap();
        assert_eq!(v, usize::try_from(u64::MAX).unwrap_or(usize::MAX));
        for bad in [
            MemSize::Bytes(MIN_CONFIGURED_MEM - 1),
            MemSize::Bytes(1),
            MemSize::Text("1023 KB".into()),
            MemSize::Text("17179869184 GB".into()),
            MemSize::Text("256 Mbits".into()),
            MemSize::Text("-5 MB".into()),
            MemSize::Text("".into()),
        ] {
            let err = mem(bad.clone()).expect_err(&format!("{bad:?}"));
            assert!(err.starts_with("MaxMemInQueues: "), "{bad:?}: {err}");
        }
    }
}
