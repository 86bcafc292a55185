//! Shared by the end-to-end test files: a whole chive network of real processes on loopback
//! (authority, three relays, client, `chive httpd`) on free ports, killed on drop, and small
//! SOCKS5/HTTP clients. Each test file uses what it needs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_chive");

/// The listen address every test node is given: port 0, so the kernel picks a free port when
/// the process binds, and the process reports it in its `PortsFile` (`wait_ports`). A port
/// probed free by the test and released before the node binds it could be taken in between
/// by a parallel test's node or by any outgoing connection ("Address already in use").
pub const ANY_PORT: &str = "127.0.0.1:0";

/// The `PortsFile` a node in `dir` named `name` writes its bound addresses to.
pub fn ports_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.ports.json"))
}

/// The addresses `name` wrote to its `PortsFile` (option name → bound address), read once the
/// file is there (it is renamed into place whole, after every listener is bound). Panics if the
/// process exits first or after 30 s.
pub fn wait_ports(dir: &Path, name: &str, child: &mut Child) -> HashMap<String, SocketAddr> {
    let path = ports_path(dir, name);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            let v: HashMap<String, String> = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}: {text:?}", path.display()));
            return v
                .into_iter()
                .map(|(k, a)| {
                    let addr = a.parse().unwrap_or_else(|e| panic!("{k} {a:?}: {e}"));
                    (k, addr)
                })
                .collect();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{name} exited before binding its ports ({status}): {}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{name} wrote no {} in 30 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `chive httpd` on a port the kernel picks; the address it printed on stdout.
pub fn spawn_httpd(dir: &Path) -> (Child, SocketAddr) {
    let log = std::fs::File::create(dir.join("httpd.log")).unwrap();
    let mut child = Command::new(BIN)
        .args(["httpd", "--listen", ANY_PORT])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start httpd: {e}"));
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    let _ = BufReader::new(stdout).read_line(&mut line);
    let addr = serde_json::from_str::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v["listening"].as_str()?.parse().ok());
    match addr {
        Some(addr) => (child, addr),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "httpd printed {line:?}, not its address: {}",
                std::fs::read_to_string(dir.join("httpd.log")).unwrap_or_default()
            )
        }
    }
}

/// Who may run beside whom. All end-to-end tests share one test binary, whose tests run on
/// parallel threads; the tests that measure timing under load (EWMA vs round-robin, the quiet
/// reserve) must have the CPU to themselves: under contention the relays fall behind and cells
/// queue in kernel socket buffers, where no scheduler can reorder them. So every test that
/// starts processes holds a turn: shared for ordinary tests, alone for the measuring ones.
static TURNS: RwLock<()> = RwLock::new(());

/// A held turn; the lock is released on drop. (A test that panicked poisons the lock; the
/// others still run, so the poison is ignored.)
pub enum Turn {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// A turn from `take` and how long it took to get it.
fn timed(take: fn() -> Turn) -> (Turn, Duration) {
    let t0 = Instant::now();
    (take(), t0.elapsed())
}

/// A turn beside the other ordinary tests (waits while a measuring test runs).
pub fn shared_turn() -> Turn {
    Turn::Shared(TURNS.read().unwrap_or_else(|e| e.into_inner()))
}

/// A turn with no other test of this binary running (waits for the running ones to finish).
pub fn turn_alone() -> Turn {
    Turn::Alone(TURNS.write().unwrap_or_else(|e| e.into_inner()))
}

pub struct Network {
    pub dir: PathBuf,
    pub children: Vec<(String, Child)>,
    pub socks: SocketAddr,
    pub http: SocketAddr,
    pub relays: Vec<SocketAddr>,
    /// Each relay's MetricsPort.
    pub metrics: Vec<SocketAddr>,
    /// The client's MetricsPort, where `client_extra` gave it one.
    pub client_metrics: Option<SocketAddr>,
    /// Each relay's config file and the text it was started with.
    pub relay_configs: Vec<(PathBuf, String)>,
    pub authority: SocketAddr,
    pub authority_id: String,
    /// Held until every process above is killed (`Drop` runs before the fields drop).
    pub(crate) _turn: Turn,
    /// Where the test's time went, printed when the network is dropped.
    pub(crate) times: StartTimes,
}

/// How long a test waited for its [`Turn`] and for its network to come up; printed (with the
/// time it then held the network) when the network is dropped, as one `[e2e-time]` line on
/// stderr: shown for a failing test, or for all with `-- --nocapture` (docs/testing.md).
pub struct StartTimes {
    test: String,
    alone: bool,
    turn_wait: Duration,
    start: Duration,
    ready_at: Instant,
}

impl Drop for Network {
    fn drop(&mut self) {
        let t = &self.times;
        eprintln!(
            "[e2e-time] {}: waited {:.1} s for its turn ({}), network up in {:.1} s, then held it {:.1} s",
            t.test,
            t.turn_wait.as_secs_f64(),
            if t.alone { "alone" } else { "shared" },
            t.start.as_secs_f64(),
            t.ready_at.elapsed().as_secs_f64(),
        );
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Keep the logs and metrics of a failed test for inspection; a passing one leaves
        // nothing behind.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The authority's identity (`chive authority --print-identity`), created if need be.
pub fn print_identity(auth_cfg: &Path) -> String {
    let out = output_ok(Command::new(BIN).args([
        "authority",
        "--config",
        auth_cfg.to_str().unwrap(),
        "--print-identity",
    ]));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs `cmd` to its end and returns what it printed; panics with its stderr if it failed.
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn spawn(dir: &Path, name: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

impl Network {
    /// Start an authority, three relays (`relay_extra[i]` appended to relay i+1's config), a
    /// client and `chive httpd`; return once a real fetch through the overlay works.
    pub fn start(test: &str, relay_extra: [&str; 3]) -> Network {
        Self::start_with(timed(shared_turn), test, &relay_extra, "")
    }

    /// [`Network::start`] with any number of relays and `client_extra` appended to the
    /// client's config.
    pub fn start_custom(test: &str, relay_extra: &[&str], client_extra: &str) -> Network {
        Self::start_with(timed(shared_turn), test, relay_extra, client_extra)
    }

    /// [`Network::start`] for a test that measures timing: it waits until no other test of
    /// this binary runs, and none starts until it is done.
    pub fn start_alone(test: &str, relay_extra: [&str; 3]) -> Network {
        Self::start_with(timed(turn_alone), test, &relay_extra, "")
    }

    /// [`Network::start_alone`] with `relays` relays (`relay1`..) and nothing added to their
    /// configs.
    pub fn start_alone_relays(test: &str, relays: usize) -> Network {
        Self::start_with(timed(turn_alone), test, &vec![""; relays], "")
    }

    /// [`Network::start_alone`] with `relays` relays, `extra` appended to every relay's config
    /// and to the client's.
    pub fn start_alone_relays_with(test: &str, relays: usize, extra: &str) -> Network {
        Self::start_with(timed(turn_alone), test, &vec![extra; relays], extra)
    }

    /// [`Network::start_alone`] with `relay_extra[i]` appended to relay i+1's config and
    /// `client_extra` to the client's.
    pub fn start_alone_custom(test: &str, relay_extra: &[&str], client_extra: &str) -> Network {
        Self::start_with(timed(turn_alone), test, relay_extra, client_extra)
    }

    fn start_with(
        (turn, turn_wait): (Turn, Duration),
        test: &str,
        relay_extra: &[&str],
        client_extra: &str,
    ) -> Network {
        let t0 = Instant::now();
        let dir = std::env::temp_dir().join(format!("chive-e2e-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let auth_cfg =
            write_authority_config(&dir, "ConsensusInterval = 2\nTestingAllGuards = true\n");
        let authority_id = print_identity(&auth_cfg);
        let unbound: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let mut net = Network {
            dir: dir.clone(),
            children: Vec::new(),
            socks: unbound,
            http: unbound,
            relays: Vec::new(),
            metrics: Vec::new(),
            client_metrics: None,
            relay_configs: Vec::new(),
            authority: unbound,
            authority_id: authority_id.clone(),
            times: StartTimes {
                test: test.to_string(),
                alone: matches!(turn, Turn::Alone(_)),
                turn_wait,
                start: Duration::ZERO,
                ready_at: t0,
            },
            _turn: turn,
        };
        let (httpd, http) = spawn_httpd(&dir);
        net.children.push(("httpd".into(), httpd));
        net.http = http;
        let auth = spawn(
            &dir,
            "authority",
            &["authority", "--config", auth_cfg.to_str().unwrap()],
        );
        // Each child joins `children` before anything may panic, so `Drop` kills it.
        net.children.push(("authority".into(), auth));
        let ports = wait_ports(&dir, "authority", &mut net.children[1].1);
        let authority = ports["DirPort"];
        net.authority = authority;
        for (i, relay_extra) in (1..).zip(relay_extra) {
            let cfg = dir.join(format!("relay{i}.toml"));
            let text = format!(
                "Nickname = \"relay{i}\"\nDataDirectory = \"{}\"\nORPort = \"{ANY_PORT}\"\nAuthority = \"{authority}\"\n\
                 AuthorityIdentity = \"{authority_id}\"\nExitPolicy = [\"accept 127.0.0.0/8:*\", \"reject *:*\"]\n\
                 ExitPolicyRejectPrivate = false\nMetricsPort = \"{ANY_PORT}\"\nMetricsFile = \"{}\"\nPortsFile = \"{}\"\n\
                 {relay_extra}\n",
                dir.join(format!("relay{i}")).display(),
                dir.join(format!("relay{i}.metrics.jsonl")).display(),
                ports_path(&dir, &format!("relay{i}")).display(),
            );
            std::fs::write(&cfg, &text).unwrap();
            net.relay_configs.push((cfg.clone(), text));
            net.children.push((
                format!("relay{i}"),
                spawn(
                    &dir,
                    &format!("relay{i}"),
                    &["relay", "--config", cfg.to_str().unwrap()],
                ),
            ));
        }
        for i in 1..=relay_extra.len() {
            let name = format!("relay{i}");
            let child = &mut net.children[i + 1].1;
            let ports = wait_ports(&dir, &name, child);
            net.relays.push(ports["ORPort"]);
            net.metrics.push(ports["MetricsPort"]);
        }
        let ports = net.start_client("client", &format!("Log = \"debug\"\n{client_extra}"));
        net.socks = ports["SocksPort"];
        net.client_metrics = ports.get("MetricsPort").copied();
        net.wait_ready();
        net.times.start = t0.elapsed();
        net.times.ready_at = Instant::now();
        net
    }

    /// Start another `chive client` named `name` (DataDirectory `dir/name`) on this network,
    /// `extra` appended to its config; the addresses it bound (`SocksPort`, `MetricsPort` if
    /// `extra` sets one), once it has. Not yet ready to fetch: its consensus may be on the way.
    pub fn start_client(&mut self, name: &str, extra: &str) -> HashMap<String, SocketAddr> {
        let cfg = self.dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "DataDirectory = \"{}\"\nSocksPort = \"{ANY_PORT}\"\nAuthority = \"{}\"\n\
                 AuthorityIdentity = \"{}\"\nPortsFile = \"{}\"\n{extra}\n",
                self.dir.join(name).display(),
                self.authority,
                self.authority_id,
                ports_path(&self.dir, name).display(),
            ),
        )
        .unwrap();
        let child = spawn(
            &self.dir,
            name,
            &["client", "--config", cfg.to_str().unwrap()],
        );
        self.children.push((name.to_string(), child));
        let child = &mut self.children.last_mut().expect("just pushed").1;
        wait_ports(&self.dir, name, child)
    }

    /// Ready when a real fetch through the overlay works.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            for (name, child) in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("{name} exited early ({status}); see {}", self.dir.display());
                }
            }
            match fetch(self.socks, self.http, 1024, None) {
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

    /// Rewrite every relay's config with `line` appended and send SIGHUP.
    pub fn reconfigure_relays(&self, line: &str) {
        for ((path, text), (name, child)) in self
            .relay_configs
            .iter()
            .zip(self.children.iter().filter(|(n, _)| n.starts_with("relay")))
        {
            std::fs::write(path, format!("{text}{line}\n")).unwrap();
            let status = Command::new("kill")
                .args(["-HUP", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "cannot signal {name}");
        }
    }

    /// Poll the relays' metrics until every one satisfies `ok` (a SIGHUP is applied
    /// asynchronously); panic with `what` after 10 s.
    pub fn wait_relays_report(&self, what: &str, ok: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(0..3).all(|i| ok(&self.scrape(i))) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn scrape(&self, i: usize) -> String {
        scrape_metrics(self.metrics[i]).expect("relay MetricsPort answers")
    }

    /// Panic if a node exited.
    pub fn check_alive(&mut self) {
        for (name, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{name} exited early ({status}); see {}", self.dir.display());
            }
        }
    }

    /// Every relay's log, concatenated.
    pub fn relay_logs(&self) -> String {
        (1..=self.relays.len())
            .map(|i| self.log(&format!("relay{i}")))
            .collect()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

/// Writes `dir/auth.toml`: an authority "auth" with its data in `dir/auth`, its DirPort on
/// port 0 reported in its PortsFile ([`wait_ports`] with "authority"), and `extra` lines.
pub fn write_authority_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("auth.toml");
    std::fs::write(
        &path,
        format!(
            "Nickname = \"auth\"\nDataDirectory = \"{}\"\nDirPort = \"{ANY_PORT}\"\nPortsFile = \"{}\"\n{extra}",
            dir.join("auth").display(),
            ports_path(dir, "authority").display(),
        ),
    )
    .unwrap();
    path
}

/// The content of `/bytes/N`: byte i is i mod 251.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A SOCKS5 CONNECT (RFC 1928) to `host:port`, the host sent as a name (ATYP 3), through
/// `socks`, with username/password (RFC 1929) when `auth` is given: the stream and the reply's
/// REP code (0 = succeeded), whatever it is. Err names the step that failed: I/O, a method
/// other than the one asked for, refused credentials, a reply that is not SOCKS5.
pub fn socks5_request(
    socks: SocketAddr,
    host: &str,
    port: u16,
    auth: Option<(&str, &str)>,
    timeout: Duration,
) -> Result<(TcpStream, u8), String> {
    fn e(what: &'static str) -> impl Fn(std::io::Error) -> String {
        move |err| format!("{what}: {err}")
    }
    let mut s = TcpStream::connect(socks).map_err(e("connect"))?;
    s.set_read_timeout(Some(timeout)).map_err(e("timeout"))?;
    let method = if auth.is_some() { 2 } else { 0 };
    s.write_all(&[5, 1, method]).map_err(e("greet"))?;
    let mut r = [0u8; 2];
    s.read_exact(&mut r).map_err(e("method"))?;
    if r != [5, method] {
        return Err(format!("method reply {r:?}, asked for {method}"));
    }
    if let Some((u, p)) = auth {
        let mut m = vec![1, u.len() as u8];
        m.extend_from_slice(u.as_bytes());
        m.push(p.len() as u8);
        m.extend_from_slice(p.as_bytes());
        s.write_all(&m).map_err(e("auth"))?;
        s.read_exact(&mut r).map_err(e("auth reply"))?;
        if r[1] != 0 {
            return Err("auth refused".into());
        }
    }
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).map_err(e("request"))?;
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).map_err(e("reply"))?;
    if rep[0] != 5 {
        return Err(format!("reply version {}", rep[0]));
    }
    Ok((s, rep[1]))
}

/// The Prometheus text a node's MetricsPort serves (`None` if it cannot be reached).
pub fn scrape_metrics(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    Some(out)
}

/// [`socks5_request`] to `host:port` as SOCKS user `user` (password "x", another isolation)
/// or none, waiting up to 60 s: the stream, or the REP code of a refusal. Panics on I/O errors.
pub fn socks5_name(
    socks: SocketAddr,
    host: &str,
    port: u16,
    user: Option<&str>,
) -> Result<TcpStream, u8> {
    let auth = user.map(|u| (u, "x"));
    match socks5_request(socks, host, port, auth, Duration::from_secs(60)) {
        Ok((s, 0)) => Ok(s),
        Ok((_, rep)) => Err(rep),
        Err(e) => panic!("SOCKS5 to {host}:{port} via {socks}: {e}"),
    }
}

/// A SOCKS5 connection (optionally with username/password) to `http` through the overlay.
pub fn socks_connect(
    socks: SocketAddr,
    http: SocketAddr,
    auth: Option<(&str, &str)>,
) -> Result<TcpStream, String> {
    let host = http.ip().to_string();
    match socks5_request(socks, &host, http.port(), auth, Duration::from_secs(60))? {
        (s, 0) => Ok(s),
        (_, rep) => Err(format!("SOCKS reply {rep}")),
    }
}

/// Body of an HTTP response read to EOF.
pub fn body_of(mut s: TcpStream) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    s.read_to_end(&mut all).map_err(|e| format!("body: {e}"))?;
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    Ok(all[split + 4..].to_vec())
}

/// GET /bytes/N through the overlay.
pub fn fetch(
    socks: SocketAddr,
    http: SocketAddr,
    n: usize,
    auth: Option<(&str, &str)>,
) -> Result<Vec<u8>, String> {
    let mut s = socks_connect(socks, http, auth)?;
    write!(s, "GET /bytes/{n} HTTP/1.0\r\nHost: x\r\n\r\n").map_err(|e| format!("http: {e}"))?;
    body_of(s)
}

/// POST /upload of `n` pattern bytes through the overlay (with SOCKS credentials `auth`, a
/// circuit of their own); returns the server's JSON reply.
pub fn upload(
    socks: SocketAddr,
    http: SocketAddr,
    n: usize,
    auth: Option<(&str, &str)>,
) -> Result<String, String> {
    let mut s = socks_connect(socks, http, auth)?;
    write!(
        s,
        "POST /upload HTTP/1.0\r\nHost: x\r\nContent-Length: {n}\r\n\r\n"
    )
    .map_err(|e| format!("http: {e}"))?;
    s.write_all(&pattern(n))
        .map_err(|e| format!("upload body: {e}"))?;
    Ok(String::from_utf8_lossy(&body_of(s)?).into_owned())
}

/// Download through SOCKS until `stop` is set, counting bytes.
pub fn bulk_loop(
    socks: SocketAddr,
    http: SocketAddr,
    user: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u64 {
    use std::sync::atomic::Ordering;
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(socks) else {
            return total;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut r = [0u8; 2];
        let mut m = vec![5, 1, 2];
        let _ = s.write_all(&m);
        if s.read_exact(&mut r).is_err() {
            continue;
        }
        m = vec![1, user.len() as u8];
        m.extend_from_slice(user.as_bytes());
        m.extend_from_slice(&[1, b'p']);
        let _ = s.write_all(&m);
        if s.read_exact(&mut r).is_err() {
            continue;
        }
        let host = http.ip().to_string();
        let mut req = vec![5, 1, 0, 3, host.len() as u8];
        req.extend_from_slice(host.as_bytes());
        req.extend_from_slice(&http.port().to_be_bytes());
        let _ = s.write_all(&req);
        let mut rep = [0u8; 10];
        if s.read_exact(&mut rep).is_err() || rep[1] != 0 {
            continue;
        }
        let _ = write!(s, "GET /bytes/1000000000 HTTP/1.0\r\n\r\n");
        let mut buf = vec![0u8; 65536];
        loop {
            if stop.load(Ordering::Relaxed) {
                return total;
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
    }
    total
}

/// One-sided Mann–Whitney U test (normal approximation): p-value for "a tends to be smaller than b".
pub fn mann_whitney_less(a: &[f64], b: &[f64]) -> f64 {
    let mut all: Vec<(f64, usize)> = a
        .iter()
        .map(|&x| (x, 0))
        .chain(b.iter().map(|&x| (x, 1)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut ranks = vec![0.0; all.len()];
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let r = (i + j) as f64 / 2.0 + 1.0;
        ranks[i..=j].fill(r);
        i = j + 1;
    }
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    let r1: f64 = all
        .iter()
        .zip(&ranks)
        .filter(|((_, g), _)| *g == 0)
        .map(|(_, r)| r)
        .sum();
    let u1 = r1 - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let sd = (n1 * n2 * (n1 + n2 + 1.0) / 12.0).sqrt();
    let z = (u1 - mean + 0.5) / sd;
    // Standard normal CDF via erf approximation (Abramowitz–Stegun 7.1.26).
    let phi = |z: f64| {
        let t = 1.0 / (1.0 + 0.3275911 * z.abs() / std::f64::consts::SQRT_2);
        let y = 1.0
            - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
                + 0.254829592)
                * t
                * (-(z * z) / 2.0).exp();
        if z >= 0.0 {
            (1.0 + y) / 2.0
        } else {
            (1.0 - y) / 2.0
        }
    };
    phi(z)
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

/// The verdict of an A/B run of fetches under bulk load: the bulk downloads ran (`moved`, the
/// bytes they carried, above 5 MB), and the fetch times `b` (named `b.0`) beat those of `a`:
/// a lower median, and a one-sided Mann–Whitney p below `alpha`. Prints both medians and p.
pub fn assert_faster_under_load(a: (&str, &[f64]), b: (&str, &[f64]), moved: u64, alpha: f64) {
    let ((a_name, a), (b_name, b)) = (a, b);
    let p = mann_whitney_less(b, a);
    eprintln!(
        "50 KiB under load: {a_name} median {:.3} s, {b_name} median {:.3} s, one-sided p = {p:.4}; bulk moved {moved} bytes",
        median(a),
        median(b)
    );
    assert!(
        moved > 5_000_000,
        "bulk downloads did not run ({moved} bytes)"
    );
    assert!(
        median(b) < median(a),
        "{b_name} median {} not below {a_name} median {}",
        median(b),
        median(a)
    );
    assert!(
        p < alpha,
        "{b_name} not significantly faster than {a_name} (p = {p})"
    );
}

/// Bulk downloads running in background threads (`bulk_loop`), one per SOCKS user, so the
/// relays stay saturated while a test measures.
pub struct BulkLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl BulkLoad {
    pub fn start(net: &Network, users: &[&'static str]) -> BulkLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = users
            .iter()
            .map(|&u| {
                let stop = stop.clone();
                let (socks, http) = (net.socks, net.http);
                std::thread::spawn(move || bulk_loop(socks, http, u, stop))
            })
            .collect();
        BulkLoad { stop, threads }
    }

    /// Stop the downloads; the bytes they moved in total.
    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.into_iter().map(|h| h.join().unwrap()).sum()
    }
}

/// Six 50 KiB fetches, each on a fresh circuit (SOCKS user `fresh{n}`, `n` counting on across
/// calls), 300 ms apart; their times in seconds.
pub fn timed_fresh_fetches(net: &Network, n: &mut usize) -> Vec<f64> {
    let mut times = Vec::new();
    for _ in 0..6 {
        *n += 1;
        let user = format!("fresh{n}");
        let t0 = Instant::now();
        let body = fetch(net.socks, net.http, 51_200, Some((&user, "x")))
            .unwrap_or_else(|e| panic!("50 KiB fetch as {user} failed: {e}"));
        assert_eq!(
            body.len(),
            51_200,
            "50 KiB fetch as {user} ended early; logs in {}",
            net.dir.display()
        );
        times.push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_millis(300));
    }
    times
}

/// Times to three decimals, for the per-block log lines.
pub fn fmt_times(times: &[f64]) -> Vec<String> {
    times.iter().map(|t| format!("{t:.3}")).collect()
}

/// The link settings of an anonymous client (no identity, no link features, kernel-sized
/// sockets): what a test that speaks the link protocol to a relay itself connects with.
pub fn client_link_config() -> chive_net::LinkConfig {
    chive_net::LinkConfig {
        identity: None,
        features: chive_net::FeatureSet::EMPTY,
        socket_buffer: None,
        unsent_limit: None,
        unsent_rtt_rate: None,
        congestion_control: None,
        record_layer: Default::default(),
    }
}
