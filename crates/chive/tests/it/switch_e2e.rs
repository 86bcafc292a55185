//! Circuit switching end to end (paper 003, issue 16, connection variant): real processes on
//! loopback, three relays with `CircuitSwitching = "connection"` and a detector that calls any
//! queued byte congestion (α = β = 0), so the entry moves circuits while uploads run. Every
//! upload must arrive byte-exact (SHA-256 at the httpd's upload endpoint), and the relays'
//! metrics must show switches and no lost cell.

use std::time::Duration;

use crate::common::*;

use sha2::{Digest, Sha256};

/// The value of an unlabelled Prometheus sample.
fn value(scrape: &str, name: &str) -> u64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in metrics")) as u64
}

/// One upload of `n` pattern bytes per SOCKS user in `users`, all at once (a circuit each);
/// every one must arrive byte-exact (length and SHA-256 at the httpd).
fn uploads_arrive_byte_exact(net: &Network, n: usize, users: &[String]) {
    let expected = hex::encode(Sha256::digest(pattern(n)));
    let threads: Vec<_> = users
        .iter()
        .map(|user| {
            let (socks, http, user) = (net.socks, net.http, user.clone());
            std::thread::spawn(move || upload(socks, http, n, Some((&user, "x"))))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let reply = t
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("upload {i}: {e}; logs in {}", net.dir.display()));
        let v: serde_json::Value = serde_json::from_str(reply.trim())
            .unwrap_or_else(|e| panic!("upload {i}: reply {reply:?}: {e}"));
        assert_eq!(v["bytes"].as_u64(), Some(n as u64), "upload {i} length");
        assert_eq!(
            v["sha256"].as_str(),
            Some(expected.as_str()),
            "upload {i} is not byte-exact; logs in {}",
            net.dir.display()
        );
    }
}

/// Each relay's metrics, scraped after the counters' 500 ms refresh.
fn scrapes_after_refresh(net: &Network, relays: usize) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(1200));
    (0..relays).map(|i| net.scrape(i)).collect()
}

/// The switch records of a JSON-lines metrics file (none if it is missing).
fn switch_records(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"type\":\"switch\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn uploads_stay_byte_exact_while_the_entry_switches_circuits() {
    let opts = "CircuitSwitching = \"connection\"\nSwitchAlpha = 0.0\nSwitchBeta = 0.0\n\
                SwitchSampleIntervalMsec = 20\n";
    let net = Network::start("switch", [opts; 3]);
    // Eight circuits (SOCKS isolation): over three relays, at least two share an entry and a
    // middle, so some entry's connection carries two circuits to separate.
    let users: Vec<String> = (0..8).map(|i| format!("sw{i}")).collect();
    // A switch is counted when the circuit's first cell leaves on the new connection. The
    // detector may fire only as an upload ends (its last cell cut over, nothing after it), so
    // upload again on the same circuits (bounded) until one is counted: the next round's cells
    // complete a pending switch or trigger a new one.
    let mut scrapes = Vec::new();
    for round in 1..=3 {
        uploads_arrive_byte_exact(&net, 3_000_000, &users);
        scrapes = scrapes_after_refresh(&net, 3);
        let switches: u64 = scrapes
            .iter()
            .map(|s| value(s, "chive_switches_total"))
            .sum();
        eprintln!("round {round}: {switches} switches");
        if switches >= 1 {
            break;
        }
    }
    let sum = |name: &str| scrapes.iter().map(|s| value(s, name)).sum::<u64>();
    assert!(
        sum("chive_switches_total") >= 1,
        "no switch happened in three rounds of uploads; logs in {}",
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
    // The JSON-lines file has the switch records with their times. A record is written when its
    // switch ends and the file is flushed on the metrics tick, so on a loaded machine the last
    // switches' records may come a few seconds after the counters: wait for them (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let (records, switched) = loop {
        let records: Vec<serde_json::Value> = (1..=3)
            .flat_map(|i| switch_records(&net.dir.join(format!("relay{i}.metrics.jsonl"))))
            .collect();
        let switched: Vec<f64> = records
            .iter()
            .filter(|r| r["outcome"] == "switched")
            .map(|r| r["switch_time_s"].as_f64().unwrap())
            .collect();
        if !switched.is_empty() || std::time::Instant::now() > deadline {
            break (records, switched);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
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
/// on four circuits, and the exit must put every byte back in order. `SwitchLegUse = "whole"`
/// (the paper's): the entries keep telling the client to move and the client keeps moving the
/// upload between legs.
#[test]
fn uploads_stay_byte_exact_while_the_client_switches_paths() {
    let (net, records, _) = path_uploads("switch-path", "SwitchLegUse = \"whole\"\n");
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
        "path switches: {} (other outcomes: {}); switch times (s): {:?}",
        switched.len(),
        records.len() - switched.len(),
        &switched[..switched.len().min(20)],
    );
}

/// The same with the client's defaults (`SwitchLegUse = stripe`, 100 cells per leg, 4 moves
/// unconfirmed): every upload goes over both legs at once, cell by cell.
#[test]
fn uploads_stay_byte_exact_while_the_client_stripes_legs() {
    let (net, _, client) = path_uploads("switch-stripe", "");
    let moves = value(&client, "chive_switch_stripe_moves_total");
    assert!(
        moves >= 1,
        "the client never moved an upload between legs; logs in {}",
        net.dir.display()
    );
    eprintln!("stripe moves: {moves}");
}

/// Five path-mode relays with a hair-trigger detector, a path-mode client with `client_opts`
/// too, four concurrent 3 MB uploads that must arrive byte-exact; no protocol violation, no
/// circuit killed. Returns the network, the client's switch records and its metrics scrape.
fn path_uploads(name: &str, client_opts: &str) -> (Network, Vec<serde_json::Value>, String) {
    let opts = "CircuitSwitching = \"path\"\nSwitchAlpha = 0.0\nSwitchBeta = 0.0\n\
                SwitchSampleIntervalMsec = 20\n";
    let net = Network::start_custom(
        name,
        &[opts; 5],
        &format!(
            "CircuitSwitching = \"path\"\nMetricsFile = \"client.metrics.jsonl\"\n\
             MetricsPort = \"{ANY_PORT}\"\n{client_opts}"
        ),
    );
    const UPLOADS: usize = 4;
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
    let users: Vec<String> = (0..UPLOADS).map(|i| format!("path{i}")).collect();
    uploads_arrive_byte_exact(&net, 3_000_000, &users);
    let scrapes = scrapes_after_refresh(&net, 5);
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
    let records = switch_records(&net.dir.join("client").join("client.metrics.jsonl"));
    eprintln!(
        "cells buffered out of order at exits: {}; duplicates dropped: {}",
        sum("chive_switch_path_out_of_order_total"),
        sum("chive_switch_path_duplicates_total"),
    );
    let client = scrape_metrics(net.client_metrics.expect("the client's MetricsPort"))
        .expect("client MetricsPort answers");
    (net, records, client)
}
