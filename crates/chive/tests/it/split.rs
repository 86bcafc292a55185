//! Split-direction connections end to end (issue 6): real processes on loopback, an authority,
//! three relays with per-relay `SplitDirection` settings, a client and `chive httpd`.
//!
//! Every test starts its own network on free ports and kills it on drop. The Network helper is
//! shared with e2e.rs (tests/common).

use std::time::{Duration, Instant};

use crate::common;
use common::*;

use sha2::{Digest, Sha256};

/// Log lines the driver writes (tests look for these).
const WE_SPLIT: &str = "channel went split: we write on our own connection";
const PEER_SPLIT: &str = "channel went split: peer writes on its own connection";
const WE_MERGED_IDLE: &str = "channel back to one connection: second connection idle";
const PEER_MERGED: &str = "channel back to one connection: peer writes on ours again";

impl Network {
    /// How many lines of all relay logs contain `what`.
    fn count(&self, what: &str) -> usize {
        self.relay_logs()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }

    /// Wait until `count(what) >= n`, or panic after `secs`.
    fn wait_for(&self, what: &str, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.count(what) < n {
            assert!(
                Instant::now() < deadline,
                "expected {n} × {what:?} in relay logs within {secs} s, saw {}; logs in {}",
                self.count(what),
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A relay's identity (hex) from its "relay listening" line.
    fn identity(&self, relay: usize) -> String {
        let log = self.log(&format!("relay{relay}"));
        log.lines()
            .find(|l| l.contains("relay listening"))
            .and_then(|l| l.split("identity=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no identity in relay{relay}'s log"))
            .to_string()
    }

    /// No relay logged a warning about the split protocol.
    fn assert_no_split_trouble(&self) {
        let logs = self.relay_logs();
        for bad in [
            "broke the hand-off rules",
            "refusing BIND",
            "second connection failed",
        ] {
            assert!(
                !logs.contains(bad),
                "relay logs contain {bad:?}; logs in {}",
                self.dir.display()
            );
        }
    }
}

fn assert_byte_exact(got: Result<Vec<u8>, String>, n: usize, net: &Network) {
    let body =
        got.unwrap_or_else(|e| panic!("download failed: {e}; logs in {}", net.dir.display()));
    assert_eq!(body.len(), n, "download length");
    assert!(
        body == pattern(n),
        "download of {n} bytes is not byte-exact"
    );
}

#[test]
fn always_split_download_is_byte_exact() {
    let net = Network::start("always", [r#"SplitDirection = "always""#; 3]);
    // The client's circuit crosses two relay-to-relay channels: both split, seen from each end.
    net.wait_for(WE_SPLIT, 2, 20);
    net.wait_for(PEER_SPLIT, 2, 20);
    assert_byte_exact(
        fetch(net.socks, net.http, 20_000_000, None),
        20_000_000,
        &net,
    );
    // Every relay link between these relays negotiated the feature.
    let logs = net.relay_logs();
    assert!(logs
        .lines()
        .any(|l| l.contains("relay link up") && l.contains("split=true")));
    assert!(!logs
        .lines()
        .any(|l| l.contains("relay link up") && l.contains("split=false")));
    net.assert_no_split_trouble();
}

#[test]
fn split_relays_interoperate_with_one_that_has_it_off() {
    let net = Network::start(
        "mixed",
        [
            r#"SplitDirection = "always""#,
            r#"SplitDirection = "off""#,
            r#"SplitDirection = "always""#,
        ],
    );
    assert_byte_exact(
        fetch(net.socks, net.http, 20_000_000, None),
        20_000_000,
        &net,
    );
    // relay2 never splits, and every link it has, seen from either end, stays single.
    let relay2 = net.log("relay2");
    assert!(
        !relay2.contains("channel went split"),
        "relay2 split a channel"
    );
    let ups: Vec<&str> = relay2
        .lines()
        .filter(|l| l.contains("relay link up"))
        .collect();
    assert!(!ups.is_empty(), "relay2 has no relay links");
    assert!(ups.iter().all(|l| l.contains("split=false")), "{ups:?}");
    let id2 = net.identity(2);
    let mut seen = 0;
    for i in [1, 3] {
        for l in net.log(&format!("relay{i}")).lines() {
            if l.contains("relay link up") && l.contains(&id2) {
                seen += 1;
                assert!(l.contains("split=false"), "relay{i}: {l}");
            }
        }
    }
    // The 3-hop circuit passes relay2, so at least one of them has a link with it.
    assert!(seen > 0, "no link from relay1/relay3 to relay2");
    // A channel between relay1 and relay3 (if the path used one) may split; none with relay2.
    for l in net.relay_logs().lines() {
        if l.contains("channel went split") {
            assert!(!l.contains(&id2));
        }
    }
    net.assert_no_split_trouble();
}

#[test]
fn dynamic_splits_under_bidirectional_bulk_and_merges_when_idle() {
    // Rate-limited relays keep the transfers running for several seconds, so the 3 s of
    // sustained bidirectional bulk that "dynamic" waits for happen mid-transfer.
    let cfg = "SplitDirection = \"dynamic\"\nSplitThreshold = 100000\nSplitIdle = 3\n\
               BandwidthRate = 3000000\nBandwidthBurst = 3000000";
    let net = Network::start("dynamic", [cfg; 3]);
    assert_eq!(net.count("channel went split"), 0, "split before any bulk");
    let (socks, http) = (net.socks, net.http);
    const N: usize = 12_000_000;
    let down = std::thread::spawn(move || fetch(socks, http, N, None));
    let up = std::thread::spawn(move || upload(socks, http, N, None));
    let reply = up.join().unwrap().expect("upload failed");
    let want = hex::encode(Sha256::digest(pattern(N)));
    assert!(
        reply.contains(&format!("\"bytes\":{N}")) && reply.contains(&want),
        "upload reply {reply}"
    );
    assert_byte_exact(down.join().unwrap(), N, &net);
    // Split happened during the transfers (each split channel logs it at both ends).
    assert!(
        net.count(WE_SPLIT) >= 1 && net.count(PEER_SPLIT) >= 1,
        "no channel split under bidirectional bulk; logs in {}",
        net.dir.display()
    );
    // Idle now: every split channel goes back to one connection after SplitIdle (3 s).
    let splits = net.count(WE_SPLIT);
    net.wait_for(WE_MERGED_IDLE, splits, 15);
    net.wait_for(PEER_MERGED, splits, 5);
    // The merged channels still carry traffic correctly.
    assert_byte_exact(fetch(net.socks, net.http, 1_000_000, None), 1_000_000, &net);
    net.assert_no_split_trouble();
}
