//! Exit policies in torrc syntax.
//!
//! A policy is an ordered list of rules such as `accept 127.0.0.0/8:*`,
//! `reject *:*`, `accept *:80`, `accept 10.0.0.1:8000-9000` or `reject [::1]/128:*`.
//! The first rule that matches an (address, port) pair decides; if none matches the
//! connection is rejected (an implicit final `reject *:*`). Unlike Tor, chive does not
//! append a built-in default exit policy: a relay is an exit only where its operator
//! says so.
//!
//! Accepted grammar (one rule; lines may hold several, separated by commas):
//! `accept|reject|accept6|reject6 ADDR[/MASK][:PORT]` where ADDR is `*`, `*4`, `*6`,
//! an IPv4 address, a bracketed IPv6 address (`[::1]`) or `private`; MASK is a prefix
//! length or (IPv4) a dotted netmask; PORT is `*`, `N` or `N-M` and defaults to `*`.
//! `accept6`/`reject6` rules only apply to IPv6.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use serde::{Deserialize, Serialize};

use crate::DirError;

/// Most rules one policy may hold (after expanding `private`): keeps documents and
/// matching cost bounded.
pub const MAX_POLICY_RULES: usize = 1024;

/// Longest accepted single rule text, in bytes.
const MAX_RULE_LEN: usize = 256;

/// The networks Tor's `ExitPolicyRejectPrivate` (and the `private` keyword) covers.
const PRIVATE_NETS: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
];

/// Which addresses a rule covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrPattern {
    /// `*`: every IPv4 and IPv6 address.
    Any,
    /// `*4`: every IPv4 address.
    AnyV4,
    /// `*6`: every IPv6 address.
    AnyV6,
    /// One network (a single host is a full-length prefix).
    Net(IpNet),
}

/// An inclusive port range; `*` is `1-65535`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port (at least 1).
    pub lo: u16,
    /// Last port (at least `lo`).
    pub hi: u16,
}

/// One `accept`/`reject` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyRule {
    /// `true` for accept, `false` for reject.
    pub accept: bool,
    /// Addresses covered.
    pub addr: AddrPattern,
    /// Ports covered.
    pub ports: PortRange,
}

/// An ordered exit policy: first match wins, implicit `reject *:*` at the end.
///
/// Serialized (serde) as a list of rule strings; [`fmt::Display`] joins them with `, `.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "Vec<String>", try_from = "Vec<String>")]
pub struct ExitPolicy {
    rules: Vec<PolicyRule>,
}

impl PortRange {
    /// Every port, `*`.
    pub const ALL: PortRange = PortRange { lo: 1, hi: 65535 };

    /// Whether `port` is inside the range.
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }

    fn parse(s: &str) -> Result<PortRange, String> {
        if s == "*" {
            return Ok(PortRange::ALL);
        }
        let parse_one = |p: &str| -> Result<u16, String> {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(format!("bad port {p:?} (want 1-65535)")),
                Ok(v) => Ok(v),
            }
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (parse_one(a)?, parse_one(b)?),
            None => {
                let p = parse_one(s)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(format!("bad port range {s:?}: start after end"));
        }
        Ok(PortRange { lo, hi })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == PortRange::ALL {
            f.write_str("*")
        } else if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl AddrPattern {
    /// Whether `ip` (already canonical: IPv4-mapped IPv6 turned into IPv4) is covered.
    fn matches(&self, ip: IpAddr) -> bool {
        match self {
            AddrPattern::Any => true,
            AddrPattern::AnyV4 => ip.is_ipv4(),
            AddrPattern::AnyV6 => ip.is_ipv6(),
            AddrPattern::Net(net) => net.contains(&ip),
        }
    }

    /// Whether every address `other` covers is also covered by `self`.
    fn covers(&self, other: &AddrPattern) -> bool {
        match (self, other) {
            (AddrPattern::Any, _) => true,
            (AddrPattern::AnyV4, AddrPattern::AnyV4) => true,
            (AddrPattern::AnyV4, AddrPattern::Net(n)) => matches!(n, IpNet::V4(_)),
            (AddrPattern::AnyV6, AddrPattern::AnyV6) => true,
            (AddrPattern::AnyV6, AddrPattern::Net(n)) => matches!(n, IpNet::V6(_)),
            (AddrPattern::Net(IpNet::V4(a)), AddrPattern::Net(IpNet::V4(b))) => a.contains(b),
            (AddrPattern::Net(IpNet::V6(a)), AddrPattern::Net(IpNet::V6(b))) => a.contains(b),
            _ => false,
        }
    }
}

impl fmt::Display for AddrPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrPattern::Any => f.write_str("*"),
            AddrPattern::AnyV4 => f.write_str("*4"),
            AddrPattern::AnyV6 => f.write_str("*6"),
            AddrPattern::Net(IpNet::V4(n)) => write!(f, "{}/{}", n.addr(), n.prefix_len()),
            AddrPattern::Net(IpNet::V6(n)) => write!(f, "[{}]/{}", n.addr(), n.prefix_len()),
        }
    }
}

impl fmt::Display for PolicyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.accept { "accept" } else { "reject" };
        write!(f, "{verb} {}:{}", self.addr, self.ports)
    }
}

/// The private networks as address patterns.
fn private_patterns() -> Vec<AddrPattern> {
    PRIVATE_NETS
        .iter()
        .filter_map(|s| s.parse::<IpNet>().ok())
        .map(AddrPattern::Net)
        .collect()
}

/// Parse the address part (`*`, `*4`, `1.2.3.4/8`, `[::1]/128`, `private`, ...) of a rule.
/// Returns several patterns only for `private`.
fn parse_addr(spec: &str, v6_only: bool) -> Result<Vec<AddrPattern>, String> {
    let (addr, mask) = match spec.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("unclosed '[' in address {spec:?}"))?;
            let mask = match after {
                "" => None,
                m => Some(
                    m.strip_prefix('/')
                        .ok_or_else(|| format!("junk after ']' in address {spec:?}"))?,
                ),
            };
            let ip: std::net::Ipv6Addr = inside
                .parse()
                .map_err(|_| format!("bad IPv6 address {inside:?}"))?;
            (IpAddr::V6(ip), mask)
        }
        None => {
            let (a, m) = match spec.split_once('/') {
                Some((a, m)) => (a, Some(m)),
                None => (spec, None),
            };
            match (a, m) {
                ("*", None) => {
                    return Ok(vec![if v6_only {
                        AddrPattern::AnyV6
                    } else {
                        AddrPattern::Any
                    }])
                }
                ("*4", None) if !v6_only => return Ok(vec![AddrPattern::AnyV4]),
                ("*6", None) => return Ok(vec![AddrPattern::AnyV6]),
                ("private", None) => {
                    return Ok(private_patterns()
                        .into_iter()
                        .filter(|p| !v6_only || matches!(p, AddrPattern::Net(IpNet::V6(_))))
                        .collect())
                }
                _ => {}
            }
            if a.contains(':') {
                return Err(format!(
                    "IPv6 address {a:?} must be in brackets, like [::1]/128"
                ));
            }
            let ip: Ipv4Addr = a.parse().map_err(|_| format!("bad address {a:?}"))?;
            if v6_only {
                return Err(format!("IPv4 address {a:?} in an accept6/reject6 rule"));
            }
            (IpAddr::V4(ip), m)
        }
    };
    let max_len = if addr.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = match mask {
        None => max_len,
        Some(m) => {
            if let Ok(len) = m.parse::<u8>() {
                len
            } else if let (true, Ok(netmask)) = (addr.is_ipv4(), m.parse::<Ipv4Addr>()) {
                // Old-style dotted netmask: must be contiguous ones.
                let bits = u32::from(netmask);
                let ones = bits.leading_ones();
                if bits.checked_shl(ones).unwrap_or(0) != 0 {
                    return Err(format!("netmask {m:?} is not contiguous"));
                }
                ones as u8
            } else {
                return Err(format!("bad mask {m:?}"));
            }
        }
    };
    if prefix > max_len {
        return Err(format!("mask /{prefix} too long for {addr}"));
    }
    let net = match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::new(a, prefix).map_err(|e| e.to_string())?),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::new(a, prefix).map_err(|e| e.to_string())?),
    };
    // "10.0.0.1/8" means 10.0.0.0/8, as in Tor.
    Ok(vec![AddrPattern::Net(net.trunc())])
}

/// Parse one rule (`accept 1.2.3.4/8:80-90`); several rules only for `private`.
fn parse_rule(text: &str) -> Result<Vec<PolicyRule>, String> {
    if text.len() > MAX_RULE_LEN {
        return Err(format!("rule longer than {MAX_RULE_LEN} bytes"));
    }
    let mut words = text.split_whitespace();
    let verb = words.next().ok_or_else(|| "empty rule".to_string())?;
    let target = words
        .next()
        .ok_or_else(|| format!("rule {text:?} has no address:port"))?;
    if words.next().is_some() {
        return Err(format!("rule {text:?} has extra words"));
    }
    let (accept, v6_only) = match verb.to_ascii_lowercase().as_str() {
        "accept" => (true, false),
        "reject" => (false, false),
        "accept6" => (true, true),
        "reject6" => (false, true),
        _ => return Err(format!("rule {text:?} must start with accept or reject")),
    };
    // The port follows the last ':' that is not inside brackets.
    let addr_end = match target.rfind(']') {
        Some(i) => i + 1,
        None => 0,
    };
    let (addr, ports) = match target[addr_end..].rfind(':') {
        Some(i) => {
            let cut = addr_end + i;
            (&target[..cut], &target[cut + 1..])
        }
        None => (target, "*"),
    };
    let ports = PortRange::parse(ports).map_err(|e| format!("rule {text:?}: {e}"))?;
    let addrs = parse_addr(addr, v6_only).map_err(|e| format!("rule {text:?}: {e}"))?;
    Ok(addrs
        .into_iter()
        .map(|addr| PolicyRule {
            accept,
            addr,
            ports,
        })
        .collect())
}

/// Whether the union of `ranges` covers every port in `[lo, hi]`.
fn ranges_cover(ranges: &mut [PortRange], lo: u16, hi: u16) -> bool {
    ranges.sort_by_key(|r| r.lo);
    // `next` is the first port not yet known to be covered; u32 so hi + 1 cannot overflow.
    let mut next = u32::from(lo);
    for r in ranges.iter() {
        if u32::from(r.lo) > next {
            break;
        }
        next = next.max(u32::from(r.hi) + 1);
    }
    next > u32::from(hi)
}

impl ExitPolicy {
    /// Parse torrc-style lines (each may hold comma-separated rules; empty entries
    /// are ignored). With `reject_private`, rejects for the private networks
    /// (Tor's `ExitPolicyRejectPrivate`) come before the given rules.
    pub fn parse<S: AsRef<str>>(lines: &[S], reject_private: bool) -> Result<ExitPolicy, DirError> {
        let mut rules = Vec::new();
        if reject_private {
            rules.extend(private_patterns().into_iter().map(|addr| PolicyRule {
                accept: false,
                addr,
                ports: PortRange::ALL,
            }));
        }
        for line in lines {
            for part in line.as_ref().split(',') {
                let part = part.trim();
                if part.is_empty() {
                    continue;
                }
                rules.extend(parse_rule(part).map_err(DirError::BadPolicy)?);
                if rules.len() > MAX_POLICY_RULES {
                    return Err(DirError::BadPolicy(format!(
                        "more than {MAX_POLICY_RULES} rules"
                    )));
                }
            }
        }
        Ok(ExitPolicy { rules })
    }

    /// The policy of a non-exit relay: rejects everything.
    pub fn reject_all() -> ExitPolicy {
        ExitPolicy { rules: Vec::new() }
    }

    /// The rules, in order (without the implicit final `reject *:*`).
    pub fn rules(&self) -> &[PolicyRule] {
        &self.rules
    }

    /// Whether a connection to `ip:port` is allowed (first matching rule wins;
    /// IPv4-mapped IPv6 addresses are treated as the IPv4 address).
    pub fn allows(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.rules
            .iter()
            .find(|r| r.ports.contains(port) && r.addr.matches(ip))
            .is_some_and(|r| r.accept)
    }

    /// For a hostname whose address the client does not know: true if some address
    /// could be allowed on `port`, i.e. some accept rule covering `port` is not
    /// entirely shadowed by earlier reject rules.
    pub fn allows_port_somewhere(&self, port: u16) -> bool {
        self.rules.iter().enumerate().any(|(i, r)| {
            r.accept
                && r.ports.contains(port)
                && self.reachable(i, PortRange { lo: port, hi: port })
        })
    }

    /// Whether the policy accepts some address and port at all.
    pub fn is_exit(&self) -> bool {
        self.rules
            .iter()
            .enumerate()
            .any(|(i, r)| r.accept && self.reachable(i, r.ports))
    }

    /// Whether accept rule `idx` can decide some connection on a port in `ports`: not
    /// every such port is rejected by earlier reject rules covering all its addresses.
    /// (Conservative: several partial rejects that together cover the rule are not
    /// noticed, so this may say "reachable" for a rule that is not.)
    fn reachable(&self, idx: usize, ports: PortRange) -> bool {
        let Some(rule) = self.rules.get(idx) else {
            return false;
        };
        let mut blocking: Vec<PortRange> = self
            .rules
            .iter()
            .take(idx)
            .filter(|r| !r.accept && r.addr.covers(&rule.addr))
            .map(|r| r.ports)
            .collect();
        !ranges_cover(&mut blocking, ports.lo, ports.hi)
    }
}

impl fmt::Display for ExitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rules.is_empty() {
            return f.write_str("reject *:*");
        }
        for (i, r) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl From<ExitPolicy> for Vec<String> {
    fn from(p: ExitPolicy) -> Vec<String> {
        p.rules.iter().map(|r| r.to_string()).collect()
    }
}

impl TryFrom<Vec<String>> for ExitPolicy {
    type Error = DirError;
    fn try_from(lines: Vec<String>) -> Result<ExitPolicy, DirError> {
        if lines.len() > MAX_POLICY_RULES {
            return Err(DirError::BadPolicy(format!(
                "more than {MAX_POLICY_RULES} rules"
            )));
        }
        ExitPolicy::parse(&lines, false)
    }
}

impl std::str::FromStr for ExitPolicy {
    type Err = DirError;
    /// Parse one comma-separated line, without `reject_private`.
    fn from_str(s: &str) -> Result<ExitPolicy, DirError> {
        ExitPolicy::parse(&[s], false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pol(lines: &[&str], private: bool) -> ExitPolicy {
        ExitPolicy::parse(lines, private).unwrap()
    }

    #[test]
    fn matching_table() {
        let p = pol(
            &[
                "reject 127.0.0.5:*",
                "accept 127.0.0.0/8:*",
                "accept 10.0.0.1:8000-9000, reject 10.0.0.0/8:*",
                "accept *:80",
                "reject [::1]/128:*",
                "accept [2001:db8::]/32:443",
                "reject *:*",
            ],
            false,
        );
        let table: &[(&str, u16, bool)] = &[
            ("127.0.0.1", 1, true),
            ("127.255.255.255", 65535, true),
            ("127.0.0.5", 80, false), // first match: the earlier reject wins
            ("10.0.0.1", 8000, true),
            ("10.0.0.1", 9000, true),
            ("10.0.0.1", 7999, false),
            ("10.0.0.1", 9001, false),
            ("10.0.0.2", 8500, false),
            ("10.0.0.2", 80, false), // reject 10/8 comes before accept *:80
            ("8.8.8.8", 80, true),
            ("8.8.8.8", 81, false),
            ("::1", 80, true), // accept *:80 is before reject [::1]
            ("::1", 22, false),
            ("2001:db8::7", 443, true),
            ("2001:db9::7", 443, false),
            ("::ffff:127.0.0.1", 22, true), // IPv4-mapped is treated as IPv4
        ];
        for &(a, port, want) in table {
            assert_eq!(p.allows(ip(a), port), want, "{a}:{port}");
        }
    }

    #[test]
    fn implicit_reject_and_reject_all() {
        let p = pol(&["accept *:443"], false);
        assert!(p.allows(ip("1.1.1.1"), 443));
        assert!(
            !p.allows(ip("1.1.1.1"), 80),
            "no rule matched: implicit reject"
        );
        let r = ExitPolicy::reject_all();
        assert!(!r.allows(ip("1.1.1.1"), 80));
        assert!(!r.is_exit());
        assert!(!r.allows_port_somewhere(80));
        assert_eq!(r.to_string(), "reject *:*");
    }

    #[test]
    fn reject_private_comes_first() {
        let lines = ["accept 127.0.0.0/8:*", "accept *:*"];
        let open = pol(&lines, false);
        let guarded = pol(&lines, true);
        assert!(open.allows(ip("127.0.0.1"), 80));
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.0.1",
            "100.64.0.1",
            "0.1.2.3",
            "::1",
            "fc00::1",
            "fdff::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!guarded.allows(ip(a), 80), "{a} should be rejected");
        }
        for a in ["172.32.0.1", "8.8.8.8", "100.128.0.1", "2001:db8::1"] {
            assert!(guarded.allows(ip(a), 80), "{a} should be allowed");
        }
        // Only loopback accepted, but private rejected first: not an exit at all.
        let loopback_only = pol(&["accept 127.0.0.0/8:*", "reject *:*"], true);
        assert!(!loopback_only.is_exit());
        assert!(pol(&["accept 127.0.0.0/8:*", "reject *:*"], false).is_exit());
    }

    #[test]
    fn wildcards_and_v6_rules() {
        let p = pol(&["accept *4:80", "accept6 *:443", "reject *:*"], false);
        assert!(p.allows(ip("1.2.3.4"), 80));
        assert!(!p.allows(ip("::2"), 80));
        assert!(p.allows(ip("::2"), 443));
        assert!(!p.allows(ip("1.2.3.4"), 443));
        assert!(ExitPolicy::parse(&["accept6 1.2.3.4:80"], false).is_err());
        let priv_kw = pol(&["reject private:*", "accept *:*"], false);
        assert!(!priv_kw.allows(ip("192.168.0.1"), 1));
        assert!(priv_kw.allows(ip("1.1.1.1"), 1));
        let mask = pol(&["accept 10.0.0.0/255.255.0.0:*"], false);
        assert!(mask.allows(ip("10.0.200.1"), 5));
        assert!(!mask.allows(ip("10.1.0.1"), 5));
        // No port means every port.
        assert!(pol(&["accept 1.2.3.4"], false).allows(ip("1.2.3.4"), 65535));
    }

    #[test]
    fn port_somewhere_and_is_exit() {
        let p = pol(&["reject *:25", "accept 1.2.3.4:*", "reject *:*"], false);
        assert!(
            !p.allows_port_somewhere(25),
            "reject *:25 shadows everything"
        );
        assert!(p.allows_port_somewhere(80));
        assert!(p.is_exit());
        let q = pol(&["reject 1.2.3.4:*", "accept *:80"], false);
        assert!(
            q.allows_port_somewhere(80),
            "narrow reject does not shadow *"
        );
        assert!(!q.allows_port_somewhere(81));
        let shadowed = pol(
            &["reject *:1-100", "reject *:101-65535", "accept *:*"],
            false,
        );
        assert!(!shadowed.is_exit());
        let partly = pol(
            &["reject *:1-100", "reject *:102-65535", "accept *:*"],
            false,
        );
        assert!(partly.is_exit());
        assert!(partly.allows_port_somewhere(101));
        assert!(!partly.allows_port_somewhere(100));
    }

    #[test]
    fn bad_rules_rejected() {
        for bad in [
            "allow *:*",
            "accept",
            "accept *:0",
            "accept *:70000",
            "accept *:90-80",
            "accept 1.2.3:*",
            "accept 1.2.3.4/33:*",
            "accept ::1:*",
            "accept [::1:*",
            "accept [::1]/129:*",
            "accept 10.0.0.0/255.0.255.0:*",
            "accept *:* extra",
        ] {
            assert!(
                matches!(
                    ExitPolicy::parse(&[bad], false),
                    Err(DirError::BadPolicy(_))
                ),
                "{bad:?} should fail"
            );
        }
        let many: Vec<String> = (0..MAX_POLICY_RULES + 1)
            .map(|_| "accept *:1".into())
            .collect();
        assert!(ExitPolicy::parse(&many, false).is_err());
    }

    #[test]
    fn display_and_serde_round_trip() {
        let p = pol(
            &[
                "accept 127.0.0.1/8:*, reject [::1]:22",
                "accept *:80-443",
                "reject *:*",
            ],
            false,
        );
        assert_eq!(
            p.to_string(),
            "accept 127.0.0.0/8:*, reject [::1]/128:22, accept *:80-443, reject *:*"
        );
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"["accept 127.0.0.0/8:*","reject [::1]/128:22","accept *:80-443","reject *:*"]"#
        );
        let back: ExitPolicy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        assert_eq!(p.to_string().parse::<ExitPolicy>().unwrap(), p);
        assert!(serde_json::from_str::<ExitPolicy>(r#"["accept nonsense"]"#).is_err());
    }
}
