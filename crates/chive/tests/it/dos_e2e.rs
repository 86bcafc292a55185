//! The memory cap and the circuit-creation defence on real processes (docs/security.md):
//!
//! - the sniper attack (Jansen et al., NDSS 2014): a client builds many circuits through a
//!   relay with `MaxMemInQueues = 16 MB`, opens bulk downloads on them and stops reading its
//!   link (SIGSTOP) before the source answers (a gated server in this test). The relay's RSS
//!   must stay under its RSS before the attack plus the cap plus a margin, the OOM handler
//!   must kill circuits (log and metrics), and an honest download through the same relay must
//!   complete byte-exact meanwhile;
//! - a CREATE2 flood from one address (127.0.0.2, three links) against a relay with
//!   `DoSCircuitCreationEnabled = 1`: beyond the burst and rate it gets DESTROY
//!   (RESOURCELIMIT); an honest client on another address (127.0.0.3) keeps getting CREATED2
//!   quickly, and the network keeps serving downloads.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use chive_cell::{AnyCell, Cell, CellCommand, Create2, DestroyReason};
use chive_crypto::ntor::{self, NtorPublicKey, NtorSecretKey, NTOR_HTYPE};
use chive_crypto::{IdentityKey, IdentityKeypair};

use crate::common::*;

const MIB: u64 = 1 << 20;

/// VmRSS of `pid` in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// User + system CPU seconds of `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the state.
    (ticks(11) + ticks(12)) / 100.0
}

fn pid_of(net: &Network, name: &str) -> u32 {
    net.children
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c.id())
        .unwrap()
}

/// A prometheus counter's value from a scrape.
fn counter(scrape: &str, name: &str) -> u64 {
    scrape
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Start a second SOCKS client whose circuits all enter through `entry`; its SOCKS address.
fn start_client(net: &mut Network, name: &str, entry: &str) -> SocketAddr {
    let socks = net.start_client(
        name,
        &format!("EntryNodes = [\"{entry}\"]\nCircuitBuildTimeout = 20"),
    )["SocksPort"];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fetch(socks, net.http, 1024, None) {
            Ok(b) if b == pattern(1024) => return socks,
            r => assert!(Instant::now() < deadline, "{name} not ready: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Circuits the sniper builds, and streams per circuit (two fill the 1000-cell circuit window
/// with their 500-cell stream windows).
const SNIPER_CIRCUITS: usize = 150;
const STREAMS_PER_CIRCUIT: usize = 2;
/// The relay's cap, and how far above `RSS before + cap` its RSS may go: the circuit queues'
/// spare capacity (a `VecDeque` doubles, so up to as much again as the cells counted),
/// allocator slack, per-circuit state, the honest transfer. Measured: peaks of 28-34 MiB
/// above the RSS before the attack with the handler on a multi-threaded runtime, and once 50
/// MiB in a clean-clone CI run on the single-threaded one; without the handler
/// (`CHIVE_SNIPER_MAXMEM="1 GB"`, which must make this test fail) the attack's ~75 MB of cells
/// sit in the queues: about 81 MiB above, beyond cap + margin.
const SNIPER_CAP: u64 = 16 * MIB;
const SNIPER_MARGIN: u64 = 48 * MIB;
/// How far above its RSS before the attack relay1 may stay once the attacker is gone (its
/// link closed, its circuits freed): the relay gives the freed queue memory back to the OS
/// (`chive_node::memtrim`, glibc's `malloc_trim`). Without that, freed memory below live heap
/// chunks stayed in the RSS: 24-209 MiB above the start after a 256 MB attack (session 15).
const SNIPER_AFTER_MARGIN: u64 = 5 * MIB;

/// The server the sniper's streams fetch from: it reads each request, counts it, and holds
/// every response until [`GatedSource::open`]. The attack's data must reach relay1 only once
/// the sniper has stopped reading its link: if it flowed while the streams were still being
/// opened (25 s in one clean-clone CI run), the sniper's client would take in every stream's
/// window before the stop, the exits would wait for SENDMEs, and nothing would queue at relay1.
struct GatedSource {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    gate: Arc<(Mutex<bool>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl GatedSource {
    /// Bytes each response promises: more than any window lets through.
    const BODY: u64 = 100_000_000;

    fn start() -> GatedSource {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let source = GatedSource {
            addr: listener.local_addr().unwrap(),
            requests: Arc::default(),
            gate: Arc::default(),
            stop: Arc::default(),
        };
        let (requests, gate, stop) = (
            source.requests.clone(),
            source.gate.clone(),
            source.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (requests, gate, stop) = (requests.clone(), gate.clone(), stop.clone());
                        std::thread::Builder::new()
                            .stack_size(256 * 1024)
                            .spawn(move || Self::serve(conn, &requests, &gate, &stop))
                            .unwrap();
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        source
    }

    /// One connection: read the request head, count it, wait for the gate, then send until
    /// the body is out, the peer is gone or the source is dropped.
    fn serve(
        mut conn: TcpStream,
        requests: &AtomicUsize,
        gate: &(Mutex<bool>, Condvar),
        stop: &AtomicBool,
    ) {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => return,
            }
        }
        requests.fetch_add(1, Ordering::Relaxed);
        let (open, cv) = gate;
        let mut is_open = open.lock().unwrap();
        while !*is_open {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            is_open = cv
                .wait_timeout(is_open, Duration::from_millis(200))
                .unwrap()
                .0;
        }
        drop(is_open);
        // A blocked write wakes every second to notice the drop of the source.
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        let header = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", Self::BODY);
        if conn.write_all(header.as_bytes()).is_err() {
            return;
        }
        let chunk = vec![0x5a; 64 * 1024];
        let mut sent = 0u64;
        while sent < Self::BODY && !stop.load(Ordering::Relaxed) {
            match conn.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// Let every held response (and every later one) go.
    fn open(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }
}

impl Drop for GatedSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.open();
    }
}

#[test]
fn sniper_attack_is_bounded_by_max_mem_in_queues() {
    // CHIVE_SNIPER_MAXMEM overrides the cap, to check that the test fails without it.
    let cap = std::env::var("CHIVE_SNIPER_MAXMEM").unwrap_or_else(|_| "16 MB".into());
    let mut net = Network::start_alone("sniper", [&format!("MaxMemInQueues = \"{cap}\""), "", ""]);
    let target = pid_of(&net, "relay1");
    let sniper_socks = start_client(&mut net, "sniper", "relay1");
    let sniper = pid_of(&net, "sniper");
    // Warm up the target (honest circuits and a transfer), then take its RSS as the baseline.
    assert!(fetch(net.socks, net.http, 2_000_000, None).unwrap() == pattern(2_000_000));
    let before = rss(target).unwrap();

    // Sample the target's RSS every 50 ms for the whole attack.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            let mut series = Vec::new();
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = rss(target) {
                    peak.fetch_max(r, Ordering::Relaxed);
                    series.push((t0.elapsed().as_secs_f64(), r));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            series
        })
    };

    // Open the bulk streams (one SOCKS username per circuit), in parallel, to the gated
    // source; keep the sockets open and never read them.
    let source = GatedSource::start();
    let t_attack = Instant::now();
    let http = source.addr;
    let openers: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for c in (t..SNIPER_CIRCUITS).step_by(8) {
                    let user = format!("sniper{c}");
                    for _ in 0..STREAMS_PER_CIRCUIT {
                        if let Ok(mut s) = socks_connect(sniper_socks, http, Some((&user, "x"))) {
                            let _ = write!(s, "GET /bytes/100000000 HTTP/1.0\r\n\r\n");
                            held.push(s);
                        }
                    }
                }
                held
            })
        })
        .collect();
    let held: Vec<TcpStream> = openers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        held.len() >= SNIPER_CIRCUITS * STREAMS_PER_CIRCUIT * 9 / 10,
        "only {} attack streams opened",
        held.len()
    );
    // Every request is through to the source before the sniper stops (a stopped client
    // would not forward the rest).
    let deadline = Instant::now() + Duration::from_secs(30);
    while source.requests() < held.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let requested = source.requests();
    assert!(
        requested >= SNIPER_CIRCUITS * STREAMS_PER_CIRCUIT * 9 / 10,
        "only {requested} of {} attack requests reached the source",
        held.len()
    );
    // The sniper stops reading its link, then the source answers: everything for the sniper
    // now queues at relay1.
    signal(sniper, "-STOP");
    source.open();
    let opened = t_attack.elapsed();

    // An honest download through the same relay while the queues fill.
    let t0 = Instant::now();
    let body = fetch(net.socks, net.http, 10_000_000, None).expect("honest download failed");
    let honest = t0.elapsed();
    assert!(
        body == pattern(10_000_000),
        "honest download not byte-exact"
    );
    // Let the attack run its course.
    std::thread::sleep(Duration::from_secs(8).saturating_sub(honest));
    net.check_alive();
    stop.store(true, Ordering::Relaxed);
    let series = sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let scrape = net.scrape(0);
    let killed = counter(&scrape, "chive_oom_circuits_killed_total");
    let freed = counter(&scrape, "chive_oom_bytes_freed_total");
    let mem = counter(&scrape, "chive_mem_in_queues_bytes");
    eprintln!(
        "sniper: {} streams opened and {requested} requests through in {:.1} s; honest 10 MB in {:.2} s; relay1 RSS before {} MiB, \
         peak {} MiB (limit {} MiB); OOM killed {killed} circuits, freed {} MiB; in queues now {} KiB",
        held.len(),
        opened.as_secs_f64(),
        honest.as_secs_f64(),
        before / MIB,
        peak / MIB,
        (before + SNIPER_CAP + SNIPER_MARGIN) / MIB,
        freed / MIB,
        mem / 1024,
    );
    let trace: Vec<String> = series
        .iter()
        .step_by(10)
        .map(|(t, r)| format!("{t:.1}s:{}MiB", r / MIB))
        .collect();
    eprintln!("relay1 RSS over time: {}", trace.join(" "));
    assert!(
        peak <= before + SNIPER_CAP + SNIPER_MARGIN,
        "relay1 RSS peaked at {} MiB, above {} MiB before + 16 MiB cap + {} MiB margin",
        peak / MIB,
        before / MIB,
        SNIPER_MARGIN / MIB
    );
    assert!(killed > 0, "the OOM handler never ran; metrics:\n{scrape}");
    assert!(
        net.log("relay1").contains("out of memory for queues"),
        "no OOM log line"
    );

    // The attacker goes away: its link closes, its circuits die, and relay1's RSS must come
    // back near where it started (the memory given back, not only freed). The relay gives
    // memory back at most once per `RELEASE_INTERVAL`: if it last did so during the attack
    // (after an OOM run), the release after the kill may come that long after it.
    signal(sniper, "-KILL");
    let t_kill = Instant::now();
    let wait = chive_node::memtrim::RELEASE_INTERVAL + Duration::from_secs(3);
    let mut after = rss(target).unwrap_or(u64::MAX);
    while after > before + SNIPER_AFTER_MARGIN && t_kill.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(100));
        after = rss(target).unwrap_or(u64::MAX);
    }
    eprintln!(
        "sniper killed: relay1 RSS {} MiB after {:.1} s (before the attack {} MiB)",
        after / MIB,
        t_kill.elapsed().as_secs_f64(),
        before / MIB
    );
    assert!(
        after <= before + SNIPER_AFTER_MARGIN,
        "relay1 RSS stayed at {} MiB after the attacker was killed, above {} MiB before + {} MiB",
        after / MIB,
        before / MIB,
        SNIPER_AFTER_MARGIN / MIB
    );
    drop(held);
}

/// A relay's identity and onion key, read from its key files.
fn relay_keys(net: &Network, i: usize) -> (IdentityKey, NtorPublicKey) {
    let keys = net.dir.join(format!("relay{i}")).join("keys");
    let read = |f: &str| -> [u8; 32] {
        let text = std::fs::read_to_string(keys.join(f)).unwrap();
        hex::decode(text.trim()).unwrap().try_into().unwrap()
    };
    let identity = IdentityKeypair::from_secret_bytes(&read("identity.key")).public();
    let ntor = NtorSecretKey::from_bytes(read("ntor.key")).public();
    (identity, ntor)
}

fn create2(id: u32, identity: &IdentityKey, key: &NtorPublicKey) -> Cell {
    let (_, onionskin) = ntor::client_create(&mut rand::rngs::OsRng, &identity.ntor_id(), key);
    let body = Create2 {
        handshake_type: NTOR_HTYPE,
        handshake: onionskin.to_vec(),
    }
    .encode()
    .unwrap();
    Cell::new(0x8000_0000 | id, CellCommand::CREATE2, &body).unwrap()
}

/// Answers to a flood, counted by its reader tasks.
#[derive(Default)]
struct Answers {
    created: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

/// One honest CREATE2 at a time on its own link from `from`, `n` of them `gap` apart; the
/// time from sending each to its CREATED2, in seconds.
async fn honest_creates(
    relay: SocketAddr,
    from: IpAddr,
    keys: &(IdentityKey, NtorPublicKey),
    first_id: u32,
    n: u32,
    gap: Duration,
) -> Vec<f64> {
    let link = chive_net::connect_from(Some(from), relay, Some(keys.0), &client_link_config())
        .await
        .expect("honest link");
    let (mut r, mut w) = link.split(chive_net::LinkLimits::default());
    let mut times = Vec::new();
    for i in 0..n {
        let cell = create2(first_id + i, &keys.0, &keys.1);
        let t0 = Instant::now();
        w.write_cells(&[cell]).await.unwrap();
        loop {
            let got = tokio::time::timeout(Duration::from_secs(10), r.read_cell())
                .await
                .expect("honest CREATE2 unanswered for 10 s")
                .unwrap()
                .expect("honest link closed");
            match got {
                AnyCell::Fixed(c) if c.command == CellCommand::CREATED2 => break,
                AnyCell::Fixed(c) if c.command == CellCommand::DESTROY => {
                    panic!("honest CREATE2 refused: reason {}", c.payload[0])
                }
                _ => {}
            }
        }
        times.push(t0.elapsed().as_secs_f64());
        tokio::time::sleep(gap).await;
    }
    times
}

#[test]
fn create2_flood_from_one_address_is_refused_and_others_build() {
    // 127.0.0.2 and .3 are loopback addresses too; the relays listen on 127.0.0.1.
    let net = Network::start_alone(
        "flood",
        [
            "DoSCircuitCreationEnabled = 1\nDoSCircuitCreationDefenseTimePeriod = 60\n\
             HeartbeatPeriod = 2",
            "",
            "",
        ],
    );
    let relay = net.relays[0];
    let keys = relay_keys(&net, 1);
    // The control: relay2, which the flood does not reach (see the bound below).
    let (control_relay, control_keys) = (net.relays[1], relay_keys(&net, 2));
    let target = pid_of(&net, "relay1");
    let honest_ip: IpAddr = "127.0.0.3".parse().unwrap();
    let flood_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Idle: honest CREATE2 round trips.
    let idle = rt.block_on(honest_creates(
        relay,
        honest_ip,
        &keys,
        1,
        15,
        Duration::from_millis(50),
    ));

    // The flood: three links from 127.0.0.2 (DoSCircuitCreationMinConnections), each
    // writing CREATE2 cells as fast as the relay takes them, for 6 s.
    const FLOOD: Duration = Duration::from_secs(6);
    let answers = Arc::new(Answers::default());
    let sent = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_seconds(target);
    let t_flood = Instant::now();
    let (during, control, flood_ok, flood_secs, cpu) = rt.block_on(async {
        // Every link is up before the first CREATE2: with fewer than MinConnections the
        // address cannot be marked, and its CREATE2 cells would all be served.
        let mut links = Vec::new();
        for _ in 0..3 {
            let link = chive_net::connect_from(Some(flood_ip), relay, None, &client_link_config())
                .await
                .expect("flood link");
            links.push(link);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut tasks = Vec::new();
        for (l, link) in (0u32..).zip(links) {
            let (mut r, mut w) = link.split(chive_net::LinkLimits::default());
            let answers = answers.clone();
            tokio::spawn(async move {
                while let Ok(Some(cell)) = r.read_cell().await {
                    match cell {
                        AnyCell::Fixed(c) if c.command == CellCommand::CREATED2 => {
                            answers.created.fetch_add(1, Ordering::Relaxed)
                        }
                        AnyCell::Fixed(c)
                            if c.command == CellCommand::DESTROY
                                && DestroyReason(c.payload[0]) == DestroyReason::RESOURCELIMIT =>
                        {
                            answers.refused.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => answers.other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
            let sent = sent.clone();
            tasks.push(tokio::spawn(async move {
                // One onionskin for every cell: the relay cannot tell, and the flood spends
                // its time sending rather than on key generation.
                let template = create2(0, &keys.0, &keys.1);
                let mut id = l << 24;
                while t_flood.elapsed() < FLOOD {
                    let batch: Vec<Cell> = (0..32)
                        .map(|_| {
                            id += 1;
                            Cell::from_payload(
                                0x8000_0000 | id,
                                CellCommand::CREATE2,
                                template.payload,
                            )
                        })
                        .collect();
                    if w.write_cells(&batch).await.is_err() {
                        return None;
                    }
                    sent.fetch_add(32, Ordering::Relaxed);
                }
                // The link stays open (w lives on) until the answers are in.
                Some(w)
            }));
        }
        // Honest round trips while the flood runs (after the flooder is marked), on their
        // own thread and runtime so the flood's tasks do not delay them in this process.
        let honest_keys = keys;
        let honest = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(honest_creates(
                relay,
                honest_ip,
                &honest_keys,
                1000,
                15,
                Duration::from_millis(200),
            ))
        });
        // The same round trips to relay2 at the same time: what the machine's load alone
        // does to them.
        let control = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(honest_creates(
                control_relay,
                honest_ip,
                &control_keys,
                1,
                15,
                Duration::from_millis(200),
            ))
        });
        let mut writers = Vec::new();
        for t in tasks {
            writers.push(t.await.ok().flatten());
        }
        let flood_secs = t_flood.elapsed().as_secs_f64();
        let cpu = cpu_seconds(target) - cpu0;
        let ok = writers.iter().all(Option::is_some);
        // Wait for the answers still on the way (the flooder's CREATED2 cells queue behind
        // its DESTROYs, which the relay sends first), at most 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && answers.created.load(Ordering::Relaxed)
                + answers.refused.load(Ordering::Relaxed)
                + answers.other.load(Ordering::Relaxed)
                < sent.load(Ordering::Relaxed)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(writers);
        (
            honest.join().unwrap(),
            control.join().unwrap(),
            ok,
            flood_secs,
            cpu,
        )
    });
    // The network keeps serving.
    let body = fetch(net.socks, net.http, 1_000_000, None).expect("download after the flood");
    assert!(body == pattern(1_000_000));
    let (created, refused, other) = (
        answers.created.load(Ordering::Relaxed),
        answers.refused.load(Ordering::Relaxed),
        answers.other.load(Ordering::Relaxed),
    );
    // The metrics page is refreshed once a second: wait for the refusals seen on the wire.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut scrape = net.scrape(0);
    while counter(&scrape, "chive_dos_circuits_refused_total") < refused
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
        scrape = net.scrape(0);
    }
    let (mi, md, mc) = (median(&idle), median(&during), median(&control));
    eprintln!(
        "flood: {} CREATE2 sent in {flood_secs:.1} s, {created} CREATED2, {refused} DESTROY \
         (RESOURCELIMIT), {other} other; relay1 CPU {cpu:.2} s ({:.0} %); honest CREATE2 round \
         trip median idle {:.2} ms, during the flood {:.2} ms ({:.2}x), to relay2 meanwhile \
         {:.2} ms",
        sent.load(Ordering::Relaxed),
        cpu / flood_secs * 100.0,
        mi * 1e3,
        md * 1e3,
        md / mi,
        mc * 1e3
    );
    assert!(flood_ok, "a flood link failed while writing");
    // Burst 90 plus 3 per second (whole seconds), and a margin for the answers' timing.
    assert!(
        created <= 90 + 3 * (flood_secs.ceil() as u64 + 1),
        "{created} CREATE2 accepted from the flooding address"
    );
    // Tor's rule: the CREATE2 that empties the bucket marks the address, so 89 pass.
    assert!(
        created >= 89,
        "only {created} CREATE2 served before the address was marked"
    );
    assert!(refused > 1000, "only {refused} CREATE2 refused");
    assert!(counter(&scrape, "chive_dos_circuits_refused_total") >= refused);
    assert_eq!(counter(&scrape, "chive_dos_addresses_marked_total"), 1);
    // 10 ms of slack for a shared 2-core machine (measured: 0.4 ms idle, 0.6 ms during the
    // flood); without the per-connection input credit the median was 18-41 ms. The figures
    // are printed above and reported in docs/security.md. The reference is the larger of the
    // idle median and the median to relay2 during the flood: on a loaded machine (other jobs,
    // the flood's own sender) every round trip grows, relay2's as much as relay1's, and the
    // bound failed at load 11-29 with idle measured before the load came. Without the input
    // credit it still fails: relay1's honest cells then wait behind the flood's queued input,
    // which relay2 does not see.
    let reference = mi.max(mc);
    assert!(
        md <= 2.0 * reference + 0.01,
        "honest CREATE2 median {md:.4} s during the flood vs {mi:.4} s idle, {mc:.4} s to relay2"
    );
    // The DoS heartbeat (HeartbeatPeriod = 2 s) counted the refusals: the largest "since
    // start" count of a beat after the flood must be the metrics' refusals. Polled rather
    // than a fixed 3 s sleep (one period and a margin): the beat usually comes sooner, and
    // 10 s leave a loaded machine room; without such a beat the assertion below fails.
    let since_start_counts = || -> Vec<u64> {
        net.log("relay1")
            .lines()
            .filter_map(|l| l.split("since start: ").nth(1))
            .filter_map(|rest| rest.split(" CREATE2 refused").next()?.parse().ok())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut since_start = since_start_counts();
    while since_start.iter().max().copied().unwrap_or(0) < refused && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        since_start = since_start_counts();
    }
    eprintln!("flood: heartbeat since-start CREATE2 refused counts: {since_start:?}");
    assert!(
        since_start.iter().max().copied().unwrap_or(0) >= refused,
        "no DoS heartbeat with {refused} CREATE2 refused in relay1's log"
    );
}
