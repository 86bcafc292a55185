//! Split-direction connections end to end (issue 6): real processes on loopback, an authority,
//! three relays with per-relay `SplitDirection` settings, a client and `chive httpd`.
//!
//! Every test starts its own network on free ports and kills it on drop. The Network helper is
//! a trimmed copy of the one in e2e.rs (per-relay config lines added).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_chive");

/// Log lines the driver writes (tests look for these).
const WE_SPLIT: &str = "channel went split: we write on our own connection";
const PEER_SPLIT: &str = "channel went split: peer writes on its own connection";
const WE_MERGED_IDLE: &str = "channel back to one connection: second connection idle";
const PEER_MERGED: &str = "channel back to one connection: peer writes on ours again";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Network {
    dir: PathBuf,
    children: Vec<(String, Child)>,
    socks: SocketAddr,
    http: SocketAddr,
}

impl Drop for Network {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(dir: &Path, name: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

impl Network {
    /// `relay_extra[i]` is appended to relay i+1's config.
    fn start(test: &str, relay_extra: [&str; 3]) -> Network {
        let dir = std::env::temp_dir().join(format!("chive-split-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let authority: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let auth_cfg = dir.join("auth.toml");
        std::fs::write(
            &auth_cfg,
            format!(
                "Nickname = \"auth\"\nDataDirectory = \"{}\"\nDirPort = \"{authority}\"\nConsensusInterval = 2\nTestingAllGuards = true\n",
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
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let authority_id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let mut net = Network {
            dir: dir.clone(),
            children: Vec::new(),
            socks: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        };
        net.children.push((
            "authority".into(),
            spawn(
                &dir,
                "authority",
                &["authority", "--config", auth_cfg.to_str().unwrap()],
            ),
        ));
        for (i, extra) in (1..=3).zip(relay_extra) {
            let or: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let cfg = dir.join(format!("relay{i}.toml"));
            let text = format!(
                "Nickname = \"relay{i}\"\nDataDirectory = \"{}\"\nORPort = \"{or}\"\nAuthority = \"{authority}\"\n\
                 AuthorityIdentity = \"{authority_id}\"\nExitPolicy = [\"accept 127.0.0.0/8:*\", \"reject *:*\"]\n\
                 ExitPolicyRejectPrivate = false\n{extra}\n",
                dir.join(format!("relay{i}")).display(),
            );
            std::fs::write(&cfg, &text).unwrap();
            net.children.push((
                format!("relay{i}"),
                spawn(
                    &dir,
                    &format!("relay{i}"),
                    &["relay", "--config", cfg.to_str().unwrap()],
                ),
            ));
        }
        let ccfg = dir.join("client.toml");
        std::fs::write(
            &ccfg,
            format!(
                "DataDirectory = \"{}\"\nSocksPort = \"{}\"\nAuthority = \"{authority}\"\nAuthorityIdentity = \"{authority_id}\"\n",
                dir.join("client").display(),
                net.socks
            ),
        )
        .unwrap();
        net.children.push((
            "client".into(),
            spawn(
                &dir,
                "client",
                &["client", "--config", ccfg.to_str().unwrap()],
            ),
        ));
        let http = net.http.to_string();
        net.children.push((
            "httpd".into(),
            spawn(&dir, "httpd", &["httpd", "--listen", &http]),
        ));
        net.wait_ready();
        net
    }

    /// Ready when a real fetch through the overlay works.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            self.check_alive();
            match fetch(self.socks, self.http, 1024) {
                Ok(body) if body == pattern(1024) => return,
                Ok(_) => last = "wrong content".into(),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "network not ready after 60 s: {last}; logs in {}",
            self.dir.display()
        );
    }

    fn check_alive(&mut self) {
        for (name, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{name} exited early ({status}); see {}", self.dir.display());
            }
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn relay_logs(&self) -> String {
        (1..=3).map(|i| self.log(&format!("relay{i}"))).collect()
    }

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

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A SOCKS5 connection to the HTTP server through the overlay.
fn socks_connect(socks: SocketAddr, http: SocketAddr) -> Result<TcpStream, String> {
    let e = |what: &'static str| move |err: std::io::Error| format!("{what}: {err}");
    let mut s = TcpStream::connect(socks).map_err(e("connect"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(e("timeout"))?;
    s.write_all(&[5, 1, 0]).map_err(e("greet"))?;
    let mut r = [0u8; 2];
    s.read_exact(&mut r).map_err(e("method"))?;
    let host = http.ip().to_string();
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&http.port().to_be_bytes());
    s.write_all(&req).map_err(e("request"))?;
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).map_err(e("reply"))?;
    if rep[1] != 0 {
        return Err(format!("SOCKS reply {}", rep[1]));
    }
    Ok(s)
}

/// Body of an HTTP response read to EOF.
fn body_of(mut s: TcpStream) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    s.read_to_end(&mut all).map_err(|e| format!("body: {e}"))?;
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    Ok(all[split + 4..].to_vec())
}

/// GET /bytes/N through the overlay.
fn fetch(socks: SocketAddr, http: SocketAddr, n: usize) -> Result<Vec<u8>, String> {
    let mut s = socks_connect(socks, http)?;
    write!(s, "GET /bytes/{n} HTTP/1.0\r\nHost: x\r\n\r\n").map_err(|e| format!("http: {e}"))?;
    body_of(s)
}

/// POST /upload of `n` pattern bytes through the overlay; returns the server's JSON reply.
fn upload(socks: SocketAddr, http: SocketAddr, n: usize) -> Result<String, String> {
    let mut s = socks_connect(socks, http)?;
    write!(
        s,
        "POST /upload HTTP/1.0\r\nHost: x\r\nContent-Length: {n}\r\n\r\n"
    )
    .map_err(|e| format!("http: {e}"))?;
    s.write_all(&pattern(n))
        .map_err(|e| format!("upload body: {e}"))?;
    Ok(String::from_utf8_lossy(&body_of(s)?).into_owned())
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
    assert_byte_exact(fetch(net.socks, net.http, 20_000_000), 20_000_000, &net);
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
    assert_byte_exact(fetch(net.socks, net.http, 20_000_000), 20_000_000, &net);
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
    let down = std::thread::spawn(move || fetch(socks, http, N));
    let up = std::thread::spawn(move || upload(socks, http, N));
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
    assert_byte_exact(fetch(net.socks, net.http, 1_000_000), 1_000_000, &net);
    net.assert_no_split_trouble();
}
