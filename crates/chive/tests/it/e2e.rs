//! End-to-end tests with real processes on loopback: an authority, three
//! relays, a client and `chive httpd`, talking TLS and SOCKS for real.
//!
//! Every test starts its own network on free ports and kills it on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::*;

#[test]
fn download_is_byte_exact_and_usernames_isolate_circuits() {
    let net = Network::start("isolation", [""; 3]);
    let body = fetch(net.socks, net.http, 3_000_000, None).unwrap();
    assert!(body == pattern(3_000_000), "3 MB download differs");
    // Two SOCKS identities, two fetches each: each identity keeps its circuit,
    // and the two never share one.
    for _ in 0..2 {
        for who in ["alice", "bob"] {
            assert_eq!(
                fetch(net.socks, net.http, 5000, Some((who, "pw"))).unwrap(),
                pattern(5000)
            );
        }
    }
    let log = net.log("client");
    let circuit_of = |who: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("stream attached") && l.contains(&format!("isolation={who}")))
            .filter_map(|l| {
                l.split("key=")
                    .nth(1)
                    .map(|k| k.split_whitespace().next().unwrap_or("").to_string())
            })
            .collect()
    };
    let (a, b) = (circuit_of("alice"), circuit_of("bob"));
    assert_eq!(a.len(), 2, "client log: {log}");
    assert_eq!(b.len(), 2);
    assert_eq!(a[0], a[1], "alice's streams should share her circuit");
    assert_eq!(b[0], b[1], "bob's streams should share his circuit");
    assert_ne!(a[0], b[0], "alice and bob must not share a circuit");
}

#[test]
fn download_is_byte_exact_over_links_on_mixed_record_layers() {
    // Guard and exit on rustls's TLS records, the middle on chive-net's own (the default; the
    // wire is TLS 1.3 either way, so every mix must work), the client on rustls too: every
    // other e2e test runs on the own layer only.
    let rustls = "LinkRecordLayer = \"rustls\"";
    let net = Network::start_custom("mixed-records", &[rustls, "", rustls], rustls);
    let body = fetch(net.socks, net.http, 3_000_000, None).unwrap();
    assert!(body == pattern(3_000_000), "3 MB download differs");
}

#[test]
fn hostile_input_does_not_disturb_a_concurrent_transfer() {
    let net = Network::start("hostile", [""; 3]);
    let (socks, http) = (net.socks, net.http);
    let transfer = std::thread::spawn(move || fetch(socks, http, 20_000_000, None));
    // Garbage and oversized requests on the SOCKS port.
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[5, 255][..],
        &[4, 1, 0, 80, 0, 0, 0, 1][..],
        &[0u8; 600][..],
    ] {
        if let Ok(mut s) = TcpStream::connect(net.socks) {
            let _ = s.write_all(junk);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.read_to_end(&mut sink);
        }
    }
    let mut long = vec![5, 1, 0, 5, 1, 0, 3, 255];
    long.extend(std::iter::repeat_n(b'a', 255));
    long.extend_from_slice(&[0, 80]);
    if let Ok(mut s) = TcpStream::connect(net.socks) {
        let _ = s.write_all(&long);
    }
    // Garbage instead of TLS on every relay's ORPort, and a TLS link that sends junk cells.
    for relay in &net.relays {
        if let Ok(mut s) = TcpStream::connect(relay) {
            let _ = s.write_all(&[0x16, 3, 1, 0, 5, 1, 2, 3, 4, 5]);
            let _ = s.write_all(&[0xff; 4096]);
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = client_link_config();
        for relay in &net.relays {
            let Ok(link) = chive_net::connect(*relay, None, &cfg).await else {
                continue;
            };
            let (_r, mut w) = link.split(chive_net::LinkLimits::default());
            use chive_cell::{Cell, CellCommand};
            let cells = vec![
                // RELAY cell for a circuit that does not exist.
                Cell::new(0x8000_0001, CellCommand::RELAY, &[7; 509]).unwrap(),
                // CREATE2 with a garbage handshake.
                Cell::new(0x8000_0002, CellCommand::CREATE2, &[0, 2, 0, 84, 1, 2, 3]).unwrap(),
                // CREATE2 with an id from the wrong half of the id space.
                Cell::new(0x0000_0003, CellCommand::CREATE2, &[0, 2, 0, 84]).unwrap(),
                // Unknown command.
                Cell::new(0x8000_0004, CellCommand(77), &[0; 10]).unwrap(),
                // DESTROY for nothing.
                Cell::new(0x8000_0005, CellCommand::DESTROY, &[1]).unwrap(),
            ];
            let _ = w.write_cells(&cells).await;
            // Truncated TLS: close in the middle of a cell.
            drop(w);
        }
    });
    let body = transfer
        .join()
        .unwrap()
        .expect("concurrent transfer failed");
    assert!(
        body == pattern(20_000_000),
        "concurrent transfer was not byte-exact"
    );
    // Every process is still serving.
    assert_eq!(
        fetch(net.socks, net.http, 100_000, None).unwrap(),
        pattern(100_000)
    );
    let logs: String = (1..=3).map(|i| net.log(&format!("relay{i}"))).collect();
    assert!(
        logs.contains("incoming link failed"),
        "garbage link should be logged"
    );
    assert!(
        net.log("client").contains("bad SOCKS request"),
        "garbage SOCKS should be logged"
    );
}

/// Many short fetches next to bulk ones on two busy circuits: every SOCKS request is answered
/// promptly. Regression (a race, so this catches it only sometimes: 1 run in 2-5 on a loaded
/// 2-core machine with the old code): the client driver handles a batch of inputs before it polls its circuit manager,
/// and within one batch a stream's BEGIN could leave and its CONNECTED come back; the
/// CONNECTED was then handled before the stream was registered and the SOCKS reply was lost
/// (the application waited until the exit's HTTP server dropped the idle connection, 30 s).
/// Seen as 1-3 stalls per two minutes with two fetch loops sharing a guard.
#[test]
fn socks_replies_are_not_lost_while_the_circuit_is_busy() {
    const LOOPS: usize = 6;
    let net = Network::start("socks-busy", [""; 3]);
    let stop = Instant::now() + Duration::from_secs(12);
    let loops: Vec<_> = (0..LOOPS)
        .map(|i| {
            let (socks, http) = (net.socks, net.http);
            // Two SOCKS identities: two circuits sharing the client's guard channel, each
            // with one bulk loop keeping it busy and two loops of small fetches (many
            // SOCKS requests while cells flow).
            let user = if i % 2 == 0 { "even" } else { "odd" };
            let size: usize = if i < 2 { 5_000_000 } else { 20_000 };
            std::thread::spawn(move || -> Result<(usize, Duration), String> {
                let (mut done, mut slowest) = (0, Duration::ZERO);
                while Instant::now() < stop {
                    let t0 = Instant::now();
                    let mut s = socks_connect(socks, http, Some((user, "pw")))
                        .map_err(|e| format!("fetch {done}: {e} after {:?}", t0.elapsed()))?;
                    slowest = slowest.max(t0.elapsed());
                    write!(s, "GET /bytes/{size} HTTP/1.0\r\nHost: x\r\n\r\n")
                        .map_err(|e| format!("http: {e}"))?;
                    if body_of(s)? != pattern(size) {
                        return Err(format!("fetch {done}: wrong body"));
                    }
                    done += 1;
                }
                Ok((done, slowest))
            })
        })
        .collect();
    let mut total = 0;
    for (i, h) in loops.into_iter().enumerate() {
        let (done, slowest) = h
            .join()
            .expect("fetch loop panicked")
            .unwrap_or_else(|e| panic!("loop {i}: {e}; logs in {}", net.dir.display()));
        // Loopback with unlimited relays answers a SOCKS request in milliseconds; a lost reply
        // takes 30 s.
        assert!(
            slowest < Duration::from_secs(5),
            "loop {i}: a SOCKS reply took {slowest:?}; logs in {}",
            net.dir.display()
        );
        total += done;
    }
    assert!(total >= 100, "only {total} fetches in 12 s");
}

#[test]
fn broken_config_is_refused_with_the_option_named() {
    let _turn = shared_turn(); // it starts chive processes too
    let dir = std::env::temp_dir().join(format!("chive-e2e-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("relay", "Nickname = \"r\"\nDataDirectory = \"/nonexistent/chive-x\"\nORPort = \"127.0.0.1:1\"\nAuthority = \"127.0.0.1:2\"\nAuthorityIdentity = \"00\"\nBandwidthRat = 5\n", "BandwidthRat"),
        ("relay", "Nickname = \"r\"\nDataDirectory = \"/nonexistent/chive-x\"\nORPort = \"127.0.0.1:1\"\nAuthority = \"127.0.0.1:2\"\nAuthorityIdentity = \"00\"\nExitPolicy = [\"acept *:*\"]\n", "ExitPolicy"),
        ("relay", "Nickname = \"r\"\nDataDirectory = \"/nonexistent/chive-x\"\nORPort = \"not an address\"\n", "ORPort"),
        ("relay", "Nickname = \"r\"\nDataDirectory = \"/nonexistent/chive-x\"\nORPort = \"127.0.0.1:1\"\nAuthority = \"127.0.0.1:2\"\nAuthorityIdentity = \"00\"\nBandwidthRate = 100000\nQuietReserve = 60000\n", "QuietReserve"),
        ("client", "DataDirectory = \"/nonexistent/chive-x\"\nSocksPort = \"127.0.0.1:1\"\nAuthority = \"127.0.0.1:2\"\nAuthorityIdentity = \"xyz\"\n", "AuthorityIdentity"),
        ("authority", "Nickname = \"a\"\nDataDirectory = \"/nonexistent/chive-x\"\nDirPort = \"127.0.0.1:1\"\n[NetworkParameters]\ncircwindow = 5000\n", "circwindow"),
    ];
    for (i, (cmd, text, option)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let (ok, err) = run_briefly(&[cmd, "--config", path.to_str().unwrap()]);
        assert!(!ok, "{cmd} accepted a broken config: {text}");
        assert!(
            err.contains(option),
            "{cmd}: error should name {option}, got: {err}"
        );
    }
    let (ok, err) = run_briefly(&["relay", "--config", "/nonexistent/chive.toml"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/chive.toml"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run the binary expecting it to exit by itself within 10 s (killed otherwise,
/// which counts as "accepted"). Returns (exited successfully, stderr).
fn run_briefly(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.success(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (true, "still running after 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn exit_notation_pins_the_exit_and_policy_refusals_fail_cleanly() {
    let net = Network::start("exitpin", [""; 3]);
    // host.<nickname>.exit goes through that exit.
    let host = format!("{}.relay2.exit", net.http.ip());
    let (mut s, reply) = socks5_request(
        net.socks,
        &host,
        net.http.port(),
        None,
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(reply, 0, "pinned exit request failed");
    write!(s, "GET /bytes/1000 HTTP/1.0\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    assert!(all.ends_with(&pattern(1000)));
    let log = net.log("client");
    let launched = log
        .lines()
        .filter(|l| l.contains("launching circuit"))
        .collect::<Vec<_>>();
    assert!(
        launched.iter().any(|l| l.trim_end().ends_with(",relay2")),
        "no circuit ends at relay2: {launched:?}"
    );
    // A target no exit allows (a non-loopback address) is refused, not hung.
    let mut s = TcpStream::connect(net.socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    s.write_all(&[5, 1, 0, 1, 192, 0, 2, 1, 0, 80]).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    assert_ne!(rep[1], 0, "a target every exit rejects must fail");
    let _ = (&net.authority, &net.authority_id);
}

#[test]
fn entry_and_middle_nodes_pin_every_circuit() {
    let mut net = Network::start("entrynodes", [""; 3]);
    // A second client on the same network, restricted to relay2 -> relay3 -> exit.
    // relay2 and relay3 are exits too, so the only possible exit is relay1.
    let socks2 = net.start_client(
        "client2",
        "Log = \"debug\"\nEntryNodes = [\"relay2\"]\nMiddleNodes = [\"RELAY3\"]",
    )["SocksPort"];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        net.check_alive();
        let last = match fetch(socks2, net.http, 1000, None) {
            Ok(body) if body == pattern(1000) => break,
            Ok(_) => "wrong content".to_string(),
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "restricted client not ready: {last}; logs in {}",
            net.dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for who in ["a", "b", "c"] {
        assert_eq!(
            fetch(socks2, net.http, 2000, Some((who, "pw"))).unwrap(),
            pattern(2000)
        );
    }
    // Pinning relay3 (the only middle) as exit leaves no middle: refused cleanly.
    let host = format!("{}.relay3.exit", net.http.ip());
    let (_s, reply) = socks5_request(
        socks2,
        &host,
        net.http.port(),
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_ne!(reply, 0, "a path with no possible middle must fail");

    let log = net.log("client2");
    let paths: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("launching circuit"))
        .filter_map(|l| l.split("path=").nth(1))
        .filter_map(|p| p.split_whitespace().next())
        .collect();
    // At least the preemptive circuits and one per SOCKS identity.
    assert!(paths.len() >= 4, "too few circuits: {log}");
    for p in &paths {
        assert_eq!(*p, "relay2,relay3,relay1", "unrestricted path; log: {log}");
    }
    assert!(
        log.contains("MiddleNodes"),
        "the refusal should name MiddleNodes: {log}"
    );

    // A malformed entry is refused at startup with the option named.
    let bad = net.dir.join("bad-entry.toml");
    std::fs::write(
        &bad,
        format!(
            "DataDirectory = \"{}\"\nSocksPort = \"{ANY_PORT}\"\nAuthority = \"{}\"\nAuthorityIdentity = \"{}\"\n\
             EntryNodes = [\"relay-2\"]\n",
            net.dir.join("bad").display(),
            net.authority,
            net.authority_id,
        ),
    )
    .unwrap();
    let (ok, err) = run_briefly(&["client", "--config", bad.to_str().unwrap()]);
    assert!(!ok, "a malformed EntryNodes entry was accepted");
    assert!(
        err.contains("EntryNodes"),
        "error should name EntryNodes: {err}"
    );
}
