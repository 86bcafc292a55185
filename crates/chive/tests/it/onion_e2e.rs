//! `.onion` names at a real `chive client` with a real authority (issue 19): a malformed
//! address fails with proposal 304's 0xF6 and an address the authority has no descriptor for
//! with 0xF0, each in under a second, over raw SOCKS5 and through curl --socks5-hostname.
//! And a real onion service: a file fetched byte-exact through `<addr>.onion`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{free_port, shared_turn, spawn, BIN};

/// A SOCKS5 CONNECT to `host:80`; returns the REP byte.
fn socks5_rep(socks: SocketAddr, host: &str) -> u8 {
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&80u16.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(rep[0], 5);
    rep[1]
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
    let authority: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let auth_cfg = dir.join("auth.toml");
    std::fs::write(
        &auth_cfg,
        format!(
            "Nickname = \"auth\"\nDataDirectory = \"{}\"\nDirPort = \"{authority}\"\n",
            dir.join("auth").display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args([
            "authority",
            "--config",
            auth_cfg.to_str().unwrap(),
            "--print-identity",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let authority_id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let socks: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let ccfg = dir.join("client.toml");
    std::fs::write(
        &ccfg,
        format!(
            "DataDirectory = \"{}\"\nSocksPort = \"{socks}\"\nAuthority = \"{authority}\"\nAuthorityIdentity = \"{authority_id}\"\n",
            dir.join("client").display()
        ),
    )
    .unwrap();
    let mut procs = Kill(Vec::new(), dir.clone());
    procs.0.push(spawn(
        &dir,
        "authority",
        &["authority", "--config", auth_cfg.to_str().unwrap()],
    ));
    procs.0.push(spawn(
        &dir,
        "client",
        &["client", "--config", ccfg.to_str().unwrap()],
    ));
    // Both listening.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(socks).is_err() || TcpStream::connect(authority).is_err() {
        assert!(
            Instant::now() < deadline,
            "client or authority did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

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
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "--socks5-hostname",
                &socks.to_string(),
                &format!("http://{}/", cases[0].0),
            ])
            .output()
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(out.status.code(), Some(97), "curl: proxy handshake error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("246"),
            "curl should report code 246 (0xF6): {err}"
        );
    }
}

/// SOCKS5 CONNECT to `host:port` (a domain name) through `socks`: the stream, or the REP code.
fn socks5_domain(socks: SocketAddr, host: &str, port: u16) -> Result<TcpStream, u8> {
    let mut s = TcpStream::connect(socks).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    if rep[1] != 0 {
        return Err(rep[1]);
    }
    Ok(s)
}

/// A real onion service: a second `chive client` with HiddenServiceDir / HiddenServicePort in
/// front of the e2e httpd, published at the authority; the test's client fetches 4 MiB through
/// `<addr>.onion` byte for byte (rendezvous, introduction, the virtual hop, BEGIN at the
/// service), then a second file on the same rendezvous circuit (one join in the log, and no
/// descriptor fetch or circuit build in between), then curl does the same.
#[test]
fn a_file_through_an_onion_service_is_byte_exact() {
    use crate::common::{body_of, pattern, Network};
    let t0 = Instant::now();
    let mut net = Network::start("onion-fetch", ["", "", ""]);
    let svc_dir = net.dir.join("service");
    let hs_dir = svc_dir.join("hs");
    let cfg = net.dir.join("service.toml");
    let socks2: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    std::fs::write(
        &cfg,
        format!(
            "DataDirectory = \"{}\"\nSocksPort = \"{socks2}\"\nAuthority = \"{}\"\n\
             AuthorityIdentity = \"{}\"\nLog = \"debug\"\nHiddenServiceDir = \"{}\"\n\
             HiddenServicePort = [\"80 {}\"]\n",
            svc_dir.display(),
            net.authority,
            net.authority_id,
            hs_dir.display(),
            net.http
        ),
    )
    .unwrap();
    let child = spawn(
        &net.dir,
        "service",
        &["client", "--config", cfg.to_str().unwrap()],
    );
    net.children.push(("service".into(), child));
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
        match socks5_domain(net.socks, &host, 80) {
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
    let mut s = socks5_domain(net.socks, &host, 80).expect("second connect");
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
    assert_eq!(socks5_domain(net.socks, &host, 81).err(), Some(2));

    // curl, through the same client.
    if Command::new("curl").arg("--version").output().is_ok() {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "--socks5-hostname",
                &net.socks.to_string(),
                &format!("http://{host}/bytes/300000"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == pattern(300_000), "curl: bytes differ");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
}
