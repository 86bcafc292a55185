//! Circuit switching end to end (paper 003, issue 16, connection variant): real processes on
//! loopback, three relays with `CircuitSwitching = "connection"` and a detector that calls any
//! queued byte congestion (α = β = 0), so the entry moves circuits while uploads run. Every
//! upload must arrive byte-exact (SHA-256 at the httpd's upload endpoint), and the relays'
//! metrics must show switches and no lost cell.

use std::io::Write;
use std::time::Duration;

use crate::common::*;

use sha2::{Digest, Sha256};

/// POST /upload of `n` pattern bytes on a circuit of its own (SOCKS user `user`).
fn upload_as(
    socks: std::net::SocketAddr,
    http: std::net::SocketAddr,
    n: usize,
    user: &str,
) -> Result<String, String> {
    let mut s = socks_connect(socks, http, Some((user, "x")))?;
    write!(
        s,
        "POST /upload HTTP/1.0\r\nHost: x\r\nContent-Length: {n}\r\n\r\n"
    )
    .map_err(|e| format!("http: {e}"))?;
    s.write_all(&pattern(n))
        .map_err(|e| format!("upload body: {e}"))?;
    Ok(String::from_utf8_lossy(&body_of(s)?).into_owned())
}

/// The value of an unlabelled Prometheus sample.
fn value(scrape: &str, name: &str) -> u64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in metrics")) as u64
}

#[test]
fn uploads_stay_byte_exact_while_the_entry_switches_circuits() {
    let opts = "CircuitSwitching = \"connection\"\nSwitchAlpha = 0.0\nSwitchBeta = 0.0\n\
                SwitchSampleIntervalMsec = 20\n";
    let net = Network::start("switch", [opts; 3]);
    const N: usize = 3_000_000;
    const UPLOADS: usize = 8;
    let expected = hex::encode(Sha256::digest(pattern(N)));
    // Eight circuits (SOCKS isolation): over three relays, at least two share an entry and a
    // middle, so some entry's connection carries two circuits to separate.
    let threads: Vec<_> = (0..UPLOADS)
        .map(|i| {
            let (socks, http) = (net.socks, net.http);
            std::thread::spawn(move || upload_as(socks, http, N, &format!("sw{i}")))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let reply = t
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("upload {i}: {e}; logs in {}", net.dir.display()));
        let v: serde_json::Value = serde_json::from_str(reply.trim())
            .unwrap_or_else(|e| panic!("upload {i}: reply {reply:?}: {e}"));
        assert_eq!(v["bytes"].as_u64(), Some(N as u64), "upload {i} length");
        assert_eq!(
            v["sha256"].as_str(),
            Some(expected.as_str()),
            "upload {i} is not byte-exact; logs in {}",
            net.dir.display()
        );
    }
    // Counters are refreshed every 500 ms.
    std::thread::sleep(Duration::from_millis(1200));
    let scrapes: Vec<String> = (0..3).map(|i| net.scrape(i)).collect();
    let sum = |name: &str| scrapes.iter().map(|s| value(s, name)).sum::<u64>();
    assert!(
        sum("chive_switches_total") >= 1,
        "no switch happened; logs in {}",
        net.dir.display()
    );
    assert!(
        sum("chive_switch_accepted_total") >= 1,
        "no next hop accepted a move"
    );
    assert_eq!(sum("chive_switch_cells_lost_total"), 0, "cells lost");
    assert_eq!(
        sum("chive_switch_violations_total"),
        0,
        "switch protocol violations"
    );
    assert_eq!(sum("chive_circuits_killed_total"), 0, "circuits killed");
    // The JSON-lines file has the switch records with their times.
    let records: Vec<serde_json::Value> = (1..=3)
        .flat_map(|i| {
            std::fs::read_to_string(net.dir.join(format!("relay{i}.metrics.jsonl")))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("\"type\":\"switch\""))
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    let switched: Vec<f64> = records
        .iter()
        .filter(|r| r["outcome"] == "switched")
        .map(|r| r["switch_time_s"].as_f64().unwrap())
        .collect();
    assert!(!switched.is_empty(), "no switch record: {records:?}");
    // On loopback the old connection rarely has a backlog, so cells seldom overtake the marker
    // (tests/switching.rs in chive-core forces that case); reported for the record.
    eprintln!(
        "switch times (s): {switched:?}; cells held back: {}",
        sum("chive_switch_cells_held_total")
    );
}

/// Path variant: five relays (every one an exit), all with `CircuitSwitching = "path"` and the
/// same hair-trigger detector; the client with `CircuitSwitching = "path"` links each exit
/// circuit to a spare through the two relays its home circuit does not use. Concurrent uploads
/// on four circuits: the entries keep telling the client to move, the client keeps switching
/// legs, and the exit must put every byte back in order.
#[test]
fn uploads_stay_byte_exact_while_the_client_switches_paths() {
    let opts = "CircuitSwitching = \"path\"\nSwitchAlpha = 0.0\nSwitchBeta = 0.0\n\
                SwitchSampleIntervalMsec = 20\n";
    let net = Network::start_custom(
        "switch-path",
        &[opts; 5],
        "CircuitSwitching = \"path\"\nMetricsFile = \"client.metrics.jsonl\"\n",
    );
    const N: usize = 3_000_000;
    const UPLOADS: usize = 4;
    let expected = hex::encode(Sha256::digest(pattern(N)));
    // A spare needs two relays the home circuit does not use: wait for all five in the
    // client's consensus, then give each upload's circuit (SOCKS isolation) time to link one.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !net.log("client").contains("using new consensus relays=5") {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never saw five relays; logs in {}",
            net.dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..UPLOADS {
        let user = format!("path{i}");
        fetch(net.socks, net.http, 1024, Some((&user, "x")))
            .unwrap_or_else(|e| panic!("warm-up fetch {i}: {e}"));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let threads: Vec<_> = (0..UPLOADS)
        .map(|i| {
            let (socks, http) = (net.socks, net.http);
            std::thread::spawn(move || upload_as(socks, http, N, &format!("path{i}")))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let reply = t
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("upload {i}: {e}; logs in {}", net.dir.display()));
        let v: serde_json::Value = serde_json::from_str(reply.trim())
            .unwrap_or_else(|e| panic!("upload {i}: reply {reply:?}: {e}"));
        assert_eq!(v["bytes"].as_u64(), Some(N as u64), "upload {i} length");
        assert_eq!(
            v["sha256"].as_str(),
            Some(expected.as_str()),
            "upload {i} is not byte-exact; logs in {}",
            net.dir.display()
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    let scrapes: Vec<String> = (0..5).map(|i| net.scrape(i)).collect();
    let sum = |name: &str| scrapes.iter().map(|s| value(s, name)).sum::<u64>();
    assert!(
        sum("chive_switch_congested_sent_total") >= 1,
        "no entry reported congestion; logs in {}",
        net.dir.display()
    );
    assert_eq!(
        sum("chive_switch_violations_total"),
        0,
        "switch protocol violations"
    );
    assert_eq!(sum("chive_circuits_killed_total"), 0, "circuits killed");
    let records: Vec<serde_json::Value> =
        std::fs::read_to_string(net.dir.join("client").join("client.metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"type\":\"switch\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let switched: Vec<f64> = records
        .iter()
        .filter(|r| r["outcome"] == "switched" && r["mode"] == "path")
        .map(|r| r["switch_time_s"].as_f64().unwrap())
        .collect();
    assert!(
        !switched.is_empty(),
        "the client made no path switch: {records:?}; logs in {}",
        net.dir.display()
    );
    eprintln!(
        "path switches: {} (other outcomes: {}); switch times (s): {:?}; cells buffered out of \
         order at exits: {}; duplicates dropped: {}",
        switched.len(),
        records.len() - switched.len(),
        &switched[..switched.len().min(20)],
        sum("chive_switch_path_out_of_order_total"),
        sum("chive_switch_path_duplicates_total"),
    );
}
