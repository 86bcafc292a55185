//! `.onion` names at a real `chive client` with a real authority (issue 19): a malformed
//! address fails with proposal 304's 0xF6 and an address the authority has no descriptor for
//! with 0xF0, each in under a second, over raw SOCKS5 and through curl --socks5-hostname.
//! And a real onion service: a file fetched byte-exact through `<addr>.onion`.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{
    output_ok, ports_path, print_identity, scrape_metrics, shared_turn, socks5_name,
    socks5_request, spawn, wait_ports, write_authority_config, ANY_PORT,
};

/// `curl -sS` of `url` through the SOCKS5 proxy `socks` (which resolves the name), given at
/// most `max_secs`.
fn curl(socks: SocketAddr, url: &str, max_secs: u32) -> Command {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", &max_secs.to_string()])
        .args(["--socks5-hostname", &socks.to_string(), url]);
    cmd
}

/// A SOCKS5 CONNECT to `host:80`; returns the REP byte.
fn socks5_rep(socks: SocketAddr, host: &str) -> u8 {
    socks5_request(socks, host, 80, None, Duration::from_secs(10))
        .unwrap()
        .1
}

struct Kill(Vec<std::process::Child>, std::path::PathBuf);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
}

#[test]
fn onion_names_fail_fast_with_proposal_304_codes() {
    let _turn = shared_turn();
    let dir = std::env::temp_dir().join(format!("chive-e2e-onion-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let auth_cfg = write_authority_config(&dir, "");
    let authority_id = print_identity(&auth_cfg);
    let mut procs = Kill(Vec::new(), dir.clone());
    procs.0.push(spawn(
        &dir,
        "authority",
        &["authority", "--config", auth_cfg.to_str().unwrap()],
    ));
    let authority = wait_ports(&dir, "authority", &mut procs.0[0])["DirPort"];
    let ccfg = dir.join("client.toml");
    std::fs::write(
        &ccfg,
        format!(
            "DataDirectory = \"{}\"\nSocksPort = \"{ANY_PORT}\"\nAuthority = \"{authority}\"\n\
             AuthorityIdentity = \"{authority_id}\"\nPortsFile = \"{}\"\n",
            dir.join("client").display(),
            ports_path(&dir, "client").display(),
        ),
    )
    .unwrap();
    procs.0.push(spawn(
        &dir,
        "client",
        &["client", "--config", ccfg.to_str().unwrap()],
    ));
    // Both listening: each wrote its PortsFile after binding.
    let socks = wait_ports(&dir, "client", &mut procs.0[1])["SocksPort"];

    // rend-spec's example address with its checksum broken, and a valid one nobody serves.
    let good = "pg6mmjiyjmcrsslvykfwnntlaru7p5svn6y2ymmju6nubxndf4pscryd.onion";
    let cases = [
        (good.replacen("cryd", "crya", 1), 0xF6u8),
        ("tooshort.onion".to_string(), 0xF6),
        (good.to_string(), 0xF0),
        (format!("www.{good}"), 0xF0),
    ];
    for (host, want) in &cases {
        let t = Instant::now();
        let rep = socks5_rep(socks, host);
        let took = t.elapsed();
        assert_eq!(rep, *want, "{host}");
        assert!(took < Duration::from_secs(1), "{host}: took {took:?}");
    }

    // curl sees the same refusal, fast.
    if Command::new("curl").arg("--version").output().is_ok() {
        let t = Instant::now();
        let out = curl(socks, &format!("http://{}/", cases[0].0), 5)
            .output()
            .unwrap();
        // The client's answer is timed above (< 1 s over raw SOCKS5); this also counts starting
        // curl, which took over 1 s on a loaded 2-core machine (session 14).
        let took = t.elapsed();
        assert!(took < Duration::from_secs(5), "curl took {took:?}");
        assert_eq!(out.status.code(), Some(97), "curl: proxy handshake error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("246"),
            "curl should report code 246 (0xF6): {err}"
        );
    }
}

/// A real onion service: a second `chive client` with HiddenServiceDir / HiddenServicePort in
/// front of the e2e httpd, published at the authority; the test's client fetches 4 MiB through
/// `<addr>.onion` byte for byte (rendezvous, introduction, the virtual hop, BEGIN at the
/// service), then a second file on the same rendezvous circuit (one join in the log, and no
/// descriptor fetch or circuit build in between), then curl does the same. Another SOCKS user
/// gets its own rendezvous with the cached descriptor (no second fetch); the client's and the
/// service's metrics count the joins, and each join has its set-up by step.
#[test]
fn a_file_through_an_onion_service_is_byte_exact() {
    use crate::common::{body_of, pattern, Network};
    let t0 = Instant::now();
    let mut net = Network::start_custom(
        "onion-fetch",
        &["", "", ""],
        &format!("MetricsFile = \"metrics.jsonl\"\nMetricsPort = \"{ANY_PORT}\""),
    );
    let client_metrics = net.client_metrics.expect("the client's MetricsPort");
    let svc_dir = net.dir.join("service");
    let hs_dir = svc_dir.join("hs");
    // The service's SOCKS port is unused: a client config needs one.
    net.start_client(
        "service",
        &format!(
            "Log = \"debug\"\nHiddenServiceDir = \"{}\"\nHiddenServicePort = [\"80 {}\"]\n\
             MetricsFile = \"metrics.jsonl\"",
            hs_dir.display(),
            net.http
        ),
    );
    // The address, from the hostname file.
    let deadline = Instant::now() + Duration::from_secs(10);
    let host = loop {
        if let Ok(h) = std::fs::read_to_string(hs_dir.join("hostname")) {
            if h.trim().ends_with(".onion") {
                break h.trim().to_string();
            }
        }
        net.check_alive();
        assert!(Instant::now() < deadline, "no hostname file");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Until the descriptor is up, the client answers 0xF0 (no descriptor).
    let deadline = Instant::now() + Duration::from_secs(20);
    let size = 4 << 20;
    let first = loop {
        net.check_alive();
        let t = Instant::now();
        match socks5_name(net.socks, &host, 80, None) {
            Ok(s) => break (s, t.elapsed()),
            Err(0xF0) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(code) => panic!(
                "onion connect failed with SOCKS {code:#x}; logs in {}",
                net.dir.display()
            ),
        }
    };
    let (mut s, setup) = first;
    write!(s, "GET /bytes/{size} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let body = body_of(s).unwrap();
    assert_eq!(body.len(), size);
    assert!(body == pattern(size), "bytes differ");

    // Second fetch: the joined circuit is reused.
    let t = Instant::now();
    let mut s = socks5_name(net.socks, &host, 80, None).expect("second connect");
    let reuse = t.elapsed();
    write!(s, "GET /bytes/100000 HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    assert!(body_of(s).unwrap() == pattern(100_000));
    let log = net.log("client");
    assert_eq!(
        log.matches("rendezvous joined").count(),
        1,
        "second stream should reuse the rendezvous circuit"
    );
    assert_eq!(net.log("service").matches("RENDEZVOUS1 sent").count(), 1);
    eprintln!("onion setup {setup:?}, second stream {reuse:?}");
    // A port the service does not offer: refused (END → SOCKS "not allowed").
    assert_eq!(socks5_name(net.socks, &host, 81, None).err(), Some(2));

    // curl, through the same client.
    if Command::new("curl").arg("--version").output().is_ok() {
        let out = output_ok(&mut curl(
            net.socks,
            &format!("http://{host}/bytes/300000"),
            20,
        ));
        assert!(out.stdout == pattern(300_000), "curl: bytes differ");
    }

    // Another SOCKS user: a rendezvous of its own, with the descriptor from the cache. Once
    // the client's predicted circuits are built (from the first connection on; two of each
    // kind), its rendezvous circuit is a built one whose last hop becomes the point.
    let metric = |name: &str| -> Option<f64> {
        let text = scrape_metrics(client_metrics)?;
        let line = text.lines().find(|l| l.starts_with(&format!("{name} ")))?;
        line.rsplit(' ').next()?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric("chive_onion_client_pool_ready").unwrap_or(0.0) < 4.0 {
        assert!(
            Instant::now() < deadline,
            "predicted circuits not built in 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut s = socks5_name(net.socks, &host, 80, Some("other")).expect("isolated connect");
    write!(s, "GET /bytes/1000 HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    assert!(body_of(s).unwrap() == pattern(1000));
    let log = net.log("client");
    assert_eq!(log.matches("rendezvous joined").count(), 2);
    assert_eq!(log.matches("onion descriptor fetched").count(), 1);
    assert_eq!(log.matches("onion descriptor from the cache").count(), 1);

    // The counters and the join records (written once a second).
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = scrape_metrics(client_metrics).expect("client MetricsPort answers");
        if text.contains("chive_onion_client_joined_total 2\n") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Predicted circuits (on by default) are counted; whether one fitted the point chosen is
    // chance on three relays, so only the counter's presence is checked here (the core's
    // `onion::a_stream_through_cannibalised_circuits_is_byte_exact` checks the extension).
    assert!(
        text.contains("\nchive_onion_client_predicted_used_total "),
        "{text}"
    );
    for line in [
        "chive_onion_client_joined_total 2\n",
        "chive_onion_client_descriptors_fetched_total 1\n",
        "chive_onion_client_descriptor_cache_hits_total 1\n",
        "chive_onion_client_requests_failed_total 0\n",
    ] {
        assert!(text.contains(line), "client metrics lack {line:?}:\n{text}");
    }
    let records = |path: std::path::PathBuf, kind: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["type"] == kind)
            .collect()
    };
    // The MetricsPort counts at once; the file gets its records at the next once-a-second
    // write, so wait for it too (CI saw the second record not yet written).
    let deadline = Instant::now() + Duration::from_secs(5);
    let joins = loop {
        let joins = records(net.dir.join("client").join("metrics.jsonl"), "onion_join");
        if joins.len() >= 2 || Instant::now() > deadline {
            break joins;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(joins.len(), 2, "one onion_join record per join");
    assert!(
        joins[1]["rend_predicted"] == true && joins[1]["rend_built_ms"].as_f64() == Some(0.0),
        "the second join's rendezvous circuit was a built predicted one: {}",
        joins[1]
    );
    for j in &joins {
        let ms = |k: &str| j[k].as_f64().unwrap_or_else(|| panic!("{k} in {j}"));
        assert!(ms("rend_built_ms") <= ms("rend_ready_ms"), "{j}");
        assert!(ms("rend_ready_ms") <= ms("introduced_ms"), "{j}");
        assert!(ms("intro_built_ms") <= ms("introduced_ms"), "{j}");
        assert!(ms("introduced_ms") <= ms("joined_ms"), "{j}");
        assert!(j["rend_predicted"].is_boolean(), "{j}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let svc = loop {
        let recs = records(svc_dir.join("metrics.jsonl"), "onion");
        let last = recs.last().cloned().unwrap_or_default();
        if last["service_rendezvous_joined"] == 2 || Instant::now() > deadline {
            break last;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(svc["service_rendezvous_joined"], 2, "{svc}");
    assert_eq!(svc["service_introduce2_accepted"], 2, "{svc}");
    assert_eq!(svc["service_introduce2_replayed"], 0, "{svc}");
    eprintln!(
        "predicted circuits used: client {:?} (joins {:?}), service {}",
        text.lines()
            .find(|l| l.starts_with("chive_onion_client_predicted_used_total")),
        joins
            .iter()
            .map(|j| (j["rend_predicted"].clone(), j["intro_predicted"].clone()))
            .collect::<Vec<_>>(),
        svc["service_predicted_used"]
    );
    assert!(svc["service_predicted_used"].is_u64(), "{svc}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}
