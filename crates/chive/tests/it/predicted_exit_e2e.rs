//! Predicted pinned exits end to end (`chive_client::predict`): after one request pinned to an
//! exit (`host.relay3.exit`) the client keeps clean circuits built to relay3, and a later
//! pinned request with other SOCKS credentials attaches to one of them: that circuit was
//! launched and built before the request came, so no CREATE was on the request's path.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common;
use common::*;

fn fetch_pinned(net: &Network, user: &str, exit: &str, n: usize) {
    let host = format!("{}.{exit}.exit", net.http.ip());
    let mut s =
        socks5_name(net.socks, &host, net.http.port(), Some(user)).expect("pinned request failed");
    write!(s, "GET /bytes/{n} HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(body_of(s).unwrap(), pattern(n), "{user}'s download differs");
}

/// The value of `name=` in a log line.
fn field(line: &str, name: &str) -> Option<String> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    Some(line[at..].split_whitespace().next()?.to_string())
}

#[test]
fn a_pinned_request_attaches_to_a_circuit_built_before_it() {
    // No preemptive circuits to random exits: only requests and predictions build.
    let net = Network::start_custom("pinpred", &["", "", ""], "PreemptiveCircuits = 0");
    fetch_pinned(&net, "first", "relay3", 1000);
    // The first pinned request predicts relay3: two clean circuits to it get built.
    let deadline = Instant::now() + Duration::from_secs(30);
    let built_before = loop {
        let log = net.log("client");
        let built: Vec<String> = log
            .lines()
            .filter(|l| l.contains("circuit for a predicted exit built"))
            .filter_map(|l| field(l, "circ"))
            .collect();
        if built.len() >= 2 {
            break (log.len(), built);
        }
        assert!(
            Instant::now() < deadline,
            "no two predicted circuits built in 30 s; logs in {}",
            net.dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (prefix_len, built) = built_before;
    fetch_pinned(&net, "second", "relay3", 1000);
    let log = net.log("client");
    let key = log
        .lines()
        .filter(|l| {
            l.contains("stream attached") && field(l, "isolation").as_deref() == Some("second")
        })
        .find_map(|l| field(l, "key"))
        .unwrap_or_else(|| panic!("no stream of 'second' attached: {log}"));
    assert!(
        built.contains(&key),
        "'second' went on {key}, not on a predicted circuit built before it ({built:?}); log: {log}"
    );
    // That circuit was launched for the prediction and ends at relay3, before the request.
    let launch = log[..prefix_len]
        .lines()
        .find(|l| l.contains("launching circuit") && field(l, "key").as_deref() == Some(&key))
        .unwrap_or_else(|| panic!("{key} not launched before the request: {log}"));
    assert!(launch.contains("predicted"), "{launch}");
    assert!(launch.trim_end().ends_with(",relay3"), "{launch}");
    // Nothing was launched for the second request itself.
    assert!(
        !log[prefix_len..]
            .lines()
            .any(|l| l.contains("launching circuit") && l.contains("why=request")),
        "a circuit was built for the second request: {}",
        &log[prefix_len..]
    );
}
