//! `chive shape`: ACK prioritisation on an interface's egress (paper 002, Sec. IV).
//!
//! Marks, Tschorsch and Scheuermann show that when a node's incoming and
//! outgoing TCP transfers share one access link, the ACKs of the incoming
//! transfer queue behind the outgoing data and the incoming transfer collapses.
//! The remedy they measure, and that this command sets up with `tc`:
//!
//! * an HTB root throttled to 95% of the link rate, so the queue builds here,
//!   under our control, and not in the modem/NIC behind us;
//! * a high-priority class for TCP ACKs whose IP datagram is shorter than 64
//!   bytes (an IPv4 u32 filter: protocol TCP, header length 20, total length
//!   < 64, ACK flag set);
//! * a class for everything else limited to 0.9 of the link rate.
//!
//! The paper's data class is capped at its rate, which also caps each of two
//! flows leaving the host at 45% of the link on the wire. `--bulk-ceil` lets
//! the data class borrow what the ACK class leaves idle, up to the throttled
//! rate; ACKs still win every round (their class has priority and its own
//! guaranteed rate), so only idle ACK-class bandwidth goes to data.
//!
//! `--dry-run` prints the commands instead of running them; `--remove` deletes
//! the root qdisc again (the kernel's default qdisc comes back). IPv6 is not
//! classified: a pure IPv6 ACK with timestamps is 72 bytes, above the paper's
//! 64-byte bound, so it would never match anyway.

use std::process::Command;

use anyhow::{bail, Context};

/// Largest accepted link rate (1 Tbit/s), so the derived rates stay in u64.
const MAX_RATE: u64 = 1_000_000_000_000;
/// Smallest accepted link rate: below this HTB's arithmetic degenerates.
const MIN_RATE: u64 = 8_000;

/// Command-line arguments of `chive shape`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Interface whose egress is shaped (e.g. eth0).
    #[arg(long)]
    pub dev: String,
    /// Physical link rate: a number of bit/s with an optional SI unit
    /// (`10mbit`, `10M`, `500kbit`, `1gbit`). Byte units (`bps`) are refused
    /// because tc reads `bps` as bytes per second.
    #[arg(long, required_unless_present = "remove")]
    pub rate: Option<String>,
    /// Fraction of the link rate the whole interface is throttled to.
    #[arg(long, default_value_t = 0.95)]
    pub throttle: f64,
    /// Fraction of the link rate for the non-ACK class.
    #[arg(long, default_value_t = 0.9)]
    pub bulk_fraction: f64,
    /// Fraction of the link rate the non-ACK class may borrow up to when the
    /// ACK class leaves bandwidth idle (HTB ceil), between --bulk-fraction
    /// and --throttle. Default: --bulk-fraction, a hard cap as in the paper.
    #[arg(long)]
    pub bulk_ceil: Option<f64>,
    /// Packet limit of each class's FIFO (the paper-era txqueuelen).
    #[arg(long, default_value_t = 1000)]
    pub queue: u32,
    /// Print the tc commands (one per line) instead of running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the shaping (delete the root qdisc) instead of installing it.
    #[arg(long)]
    pub remove: bool,
    /// The tc binary to run.
    #[arg(long, default_value = "tc")]
    pub tc: String,
}

/// Parses a rate such as `10mbit`, `10M`, `9500000` or `1.5gbit` into bit/s.
pub fn parse_rate(text: &str) -> anyhow::Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num.len() > 20 {
        bail!("invalid rate {text:?}: expected a number of bit/s such as 10mbit");
    }
    let value: f64 = num
        .parse()
        .with_context(|| format!("invalid rate {text:?}"))?;
    let mult = match unit {
        "" | "bit" => 1.0,
        "k" | "kbit" => 1e3,
        "m" | "mbit" => 1e6,
        "g" | "gbit" => 1e9,
        u if u.ends_with("bps") || u.ends_with('b') => {
            bail!(
                "invalid rate {text:?}: byte units are ambiguous with tc, give bits (e.g. 10mbit)"
            )
        }
        _ => bail!("invalid rate {text:?}: unknown unit {unit:?} (use bit, kbit, mbit or gbit)"),
    };
    let bits = value * mult;
    if !bits.is_finite() || bits < MIN_RATE as f64 || bits > MAX_RATE as f64 {
        bail!("rate {text:?} out of range ({MIN_RATE} bit/s .. 1 Tbit/s)");
    }
    Ok(bits.round() as u64)
}

/// Checks an interface name as the kernel would (1..=15 bytes, no '/', no
/// whitespace), so it can be passed to tc and printed without quoting.
fn check_dev(dev: &str) -> anyhow::Result<()> {
    let ok = !dev.is_empty()
        && dev.len() <= 15
        && dev
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':'));
    if !ok {
        bail!("invalid interface name {dev:?}");
    }
    Ok(())
}

/// The tc argument vectors (without the `tc` program name) that install ACK
/// prioritisation on `dev` for a link of `rate` bit/s.
pub fn install_commands(
    dev: &str,
    rate: u64,
    throttle: f64,
    bulk_fraction: f64,
    bulk_ceil: f64,
    queue: u32,
) -> anyhow::Result<Vec<Vec<String>>> {
    check_dev(dev)?;
    if !(throttle > 0.0 && throttle <= 1.0) {
        bail!("--throttle must be in (0, 1], got {throttle}");
    }
    if !(bulk_fraction > 0.0 && bulk_fraction <= throttle) {
        bail!("--bulk-fraction must be in (0, throttle={throttle}], got {bulk_fraction}");
    }
    if !(bulk_ceil >= bulk_fraction && bulk_ceil <= throttle) {
        bail!("--bulk-ceil must be in [bulk-fraction={bulk_fraction}, throttle={throttle}], got {bulk_ceil}");
    }
    if queue == 0 || queue > 1_000_000 {
        bail!("--queue must be in 1..=1000000, got {queue}");
    }
    let total = (rate as f64 * throttle).round() as u64;
    let bulk = (rate as f64 * bulk_fraction).round() as u64;
    let bulk_ceil = (rate as f64 * bulk_ceil).round() as u64;
    // The ACK class is guaranteed what the bulk class leaves of the throttled
    // rate (at least 1% of it) and may borrow up to all of it; prio 0 makes it
    // win every borrowing round, which is what moves ACKs to the front.
    let ack = total.saturating_sub(bulk).max(total / 100).max(MIN_RATE);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let bit = |v: u64| format!("{v}bit");
    let q = queue.to_string();
    // An HTB class under `parent`; the root class has no prio.
    let class = |parent: &str, classid: &str, rate: u64, ceil: u64, prio: Option<&str>| {
        let (rate, ceil) = (bit(rate), bit(ceil));
        let mut v = s(&[
            "class", "add", "dev", dev, "parent", parent, "classid", classid, "htb", "rate", &rate,
            "ceil", &ceil,
        ]);
        if let Some(prio) = prio {
            v.extend(s(&["prio", prio]));
        }
        v
    };
    Ok(vec![
        // Start from the kernel default: `replace` cannot turn an existing HTB
        // root into ours. Its failure (nothing to delete) is ignored by `run`.
        s(&["qdisc", "del", "dev", dev, "root"]),
        s(&[
            "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20",
        ]),
        class("1:", "1:1", total, total, None),
        class("1:1", "1:10", ack, total, Some("0")),
        class("1:1", "1:20", bulk, bulk_ceil, Some("1")),
        s(&[
            "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "pfifo", "limit", &q,
        ]),
        s(&[
            "qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "pfifo", "limit", &q,
        ]),
        // IPv4, TCP, IHL = 5 (so byte 33 is the TCP flags), total length < 64
        // (the top 10 bits of the 16-bit length are zero), ACK flag set.
        s(&[
            "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "protocol", "6", "0xff", "match", "u8", "0x05", "0x0f", "at", "0",
            "match", "u16", "0x0000", "0xffc0", "at", "2", "match", "u8", "0x10", "0x10", "at",
            "33", "flowid", "1:10",
        ]),
    ])
}

/// The tc argument vector that removes the shaping from `dev`.
pub fn remove_commands(dev: &str) -> anyhow::Result<Vec<Vec<String>>> {
    check_dev(dev)?;
    Ok(vec![["qdisc", "del", "dev", dev, "root"]
        .iter()
        .map(|x| x.to_string())
        .collect()])
}

/// Entry point of `chive shape`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let cmds = if args.remove {
        remove_commands(&args.dev)?
    } else {
        let rate = parse_rate(args.rate.as_deref().unwrap_or_default())?;
        install_commands(
            &args.dev,
            rate,
            args.throttle,
            args.bulk_fraction,
            args.bulk_ceil.unwrap_or(args.bulk_fraction),
            args.queue,
        )?
    };
    if args.dry_run {
        for c in &cmds {
            println!("{} {}", args.tc, c.join(" "));
        }
        return Ok(());
    }
    for c in &cmds {
        let out = Command::new(&args.tc)
            .args(c)
            .output()
            .with_context(|| format!("cannot run {}", args.tc))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // Deleting a root qdisc that is not there is not an error: the
            // goal (no shaping) is reached.
            if c.get(1).map(String::as_str) == Some("del") {
                continue;
            }
            bail!("`{} {}` failed: {}", args.tc, c.join(" "), err.trim());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates() {
        assert_eq!(parse_rate("10mbit").unwrap(), 10_000_000);
        assert_eq!(parse_rate("10M").unwrap(), 10_000_000);
        assert_eq!(parse_rate("1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("9500000").unwrap(), 9_500_000);
        assert_eq!(parse_rate("500kbit").unwrap(), 500_000);
        assert!(parse_rate("10mbps").is_err());
        assert!(parse_rate("10MB").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("").is_err());
        assert!(parse_rate("1bit").is_err());
        assert!(parse_rate("99999999999999999999999").is_err());
    }

    #[test]
    fn install_matches_the_paper() {
        let cmds = install_commands("eth0", 10_000_000, 0.95, 0.9, 0.9, 1000).unwrap();
        let lines: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        // Root throttled by 5%.
        assert_eq!(lines[0], "qdisc del dev eth0 root");
        assert!(lines[2].contains("classid 1:1 htb rate 9500000bit ceil 9500000bit"));
        // ACK class: high priority, may use the whole throttled rate.
        assert!(lines[3].contains("classid 1:10 htb rate 500000bit ceil 9500000bit prio 0"));
        // Everything else at 0.9 of the link rate, and it is the default class.
        assert!(lines[4].contains("classid 1:20 htb rate 9000000bit ceil 9000000bit prio 1"));
        assert!(lines[1].ends_with("root handle 1: htb default 20"));
        // The filter: TCP, IHL 5, length < 64, ACK flag, into the ACK class.
        let f = &lines[7];
        assert!(f.contains("match ip protocol 6 0xff"));
        assert!(f.contains("match u16 0x0000 0xffc0 at 2"));
        assert!(f.contains("match u8 0x10 0x10 at 33"));
        assert!(f.ends_with("flowid 1:10"));
    }

    #[test]
    fn bulk_class_may_borrow_up_to_the_throttle() {
        let cmds = install_commands("eth0", 10_000_000, 0.95, 0.9, 0.95, 1000).unwrap();
        let lines: Vec<String> = cmds.iter().map(|c| c.join(" ")).collect();
        // Guaranteed 0.9 of the link, may borrow up to the root's 95%; the ACK
        // class and the root are as without borrowing.
        assert!(lines[4].contains("classid 1:20 htb rate 9000000bit ceil 9500000bit prio 1"));
        assert!(lines[3].contains("classid 1:10 htb rate 500000bit ceil 9500000bit prio 0"));
        assert!(lines[2].contains("classid 1:1 htb rate 9500000bit ceil 9500000bit"));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(install_commands("eth0; rm -rf /", 10_000_000, 0.95, 0.9, 0.9, 1000).is_err());
        assert!(
            install_commands("averyveryverylongname", 10_000_000, 0.95, 0.9, 0.9, 1000).is_err()
        );
        assert!(install_commands("eth0", 10_000_000, 1.5, 0.9, 0.9, 1000).is_err());
        assert!(install_commands("eth0", 10_000_000, 0.9, 0.95, 0.95, 1000).is_err());
        assert!(install_commands("eth0", 10_000_000, 0.95, 0.9, 0.9, 0).is_err());
        // The borrowing ceiling lies between the data class's rate and the throttle.
        assert!(install_commands("eth0", 10_000_000, 0.95, 0.9, 0.85, 1000).is_err());
        assert!(install_commands("eth0", 10_000_000, 0.95, 0.9, 0.96, 1000).is_err());
        assert!(install_commands("eth0", 10_000_000, 0.95, 0.9, f64::NAN, 1000).is_err());
        assert_eq!(
            remove_commands("eth0").unwrap()[0].join(" "),
            "qdisc del dev eth0 root"
        );
    }
}
