//! Relay failure end to end: a relay of a running download's circuit is killed with SIGKILL
//! (the entry, the middle, the exit). The SOCKS application must see its connection close
//! within 5 s (no hang), the client must mark the relay (down for the guard, suspect for a
//! later hop; see chive_client::down), and the next fetch must succeed on a path without the
//! dead relay within 5 s. Five relays, so that a full path remains after one dies.
//!
//! A hung relay (SIGSTOP: its sockets stay open, nothing is answered) is found by the link
//! liveness check instead (`LinkKeepalive`, `LinkIdleTimeout`; here 1 s and 3 s so the test is
//! short): the same error, blame and recovery, within the idle timeout plus 5 s.
//!
//! A stream opened on a circuit through a relay that hung *before* the fetch gets no CONNECTED:
//! the client's BEGIN timeout (`CircuitStreamTimeout`, here 2 s) ends it and retries it on a
//! circuit without the hung middle and exit; the application sees the fetch succeed.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;

const RELAYS: usize = 5;

/// A network of five relays (`relay1`..`relay5`), started alone, so the 5 s bounds measure the
/// code, not several networks fighting over two cores; ready once every relay is listed.
/// `extra` goes into every relay's and the client's config.
fn start(test: &str, extra: &str) -> Network {
    let net = Network::start_alone_relays_with(test, RELAYS, extra);
    wait_all_relays_listed(&net);
    net
}

/// How a relay fails.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Failure {
    /// SIGKILL: the kernel closes its sockets (FIN/RST).
    Kill,
    /// SIGSTOP: its sockets stay open and nothing is answered.
    Stop,
}

/// The liveness settings of the SIGSTOP test (short, so the test is).
const FAST_LIVENESS: &str = "LinkKeepalive = 1\nLinkIdleTimeout = 3\n";
/// `LinkIdleTimeout` in [`FAST_LIVENESS`].
const FAST_IDLE_TIMEOUT: Duration = Duration::from_secs(3);

/// Wait until the client uses a consensus that lists all five relays (it logs each consensus
/// it takes, at debug; ConsensusInterval is 2 s). This waited for the authority's consensus and
/// then slept 3 s for the client to fetch it: watching the client is both sooner and sure.
fn wait_all_relays_listed(net: &Network) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = format!("using new consensus relays={RELAYS}");
    while !net.log("client").lines().any(|l| l.contains(&want)) {
        assert!(
            Instant::now() < deadline,
            "the client took no consensus listing all {RELAYS} relays in 30 s; logs in {}",
            net.dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The nicknames of the circuit carrying the streams of SOCKS user `user`, from the client's
/// log ("stream attached" names the circuit, "launching circuit" its path).
fn path_of(dir: &Path, user: &str) -> Option<Vec<String>> {
    let log = std::fs::read_to_string(dir.join("client.log")).ok()?;
    let field = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!("{name}="))? + name.len() + 1;
        Some(line[at..].split_whitespace().next()?.to_string())
    };
    let key = log
        .lines()
        .filter(|l| l.contains("stream attached") && field(l, "isolation").as_deref() == Some(user))
        .filter_map(|l| field(l, "key"))
        .next_back()?;
    let path = log
        .lines()
        .filter(|l| l.contains("launching circuit") && field(l, "key").as_deref() == Some(&key))
        .filter_map(|l| field(l, "path"))
        .next_back()?;
    Some(path.split(',').map(str::to_string).collect())
}

/// Kill hop `hop` (0 = entry) of a running download's circuit; check the error, the mark and
/// the recovery.
fn kill_hop(test: &str, hop: usize) {
    fail_hop(test, hop, Failure::Kill);
}

fn fail_hop(test: &str, hop: usize, how: Failure) {
    let (extra, grace) = match how {
        Failure::Kill => ("", Duration::ZERO),
        Failure::Stop => (FAST_LIVENESS, FAST_IDLE_TIMEOUT),
    };
    let limit = grace + Duration::from_secs(5);
    let mut net = start(test, extra);
    // The victim: a 1 GB download, read slowly so it is mid-transfer when the relay dies.
    let mut s = socks_connect(net.socks, net.http, Some(("victim", "x"))).expect("victim connect");
    write!(s, "GET /bytes/1000000000 HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = vec![0u8; 65536];
    let mut got = 0usize;
    while got < 300_000 {
        got += s.read(&mut buf).expect("victim download did not start");
    }
    let path = path_of(&net.dir, "victim").expect("no circuit for the victim in the client log");
    assert_eq!(path.len(), 3, "{path:?}");
    let dead = path[hop].clone();
    let killed = match how {
        Failure::Kill => {
            let (_, mut child) = net.children.remove(child_of(&net, &dead));
            child.kill().unwrap(); // SIGKILL
            let killed = Instant::now();
            let _ = child.wait();
            killed
        }
        Failure::Stop => {
            stop_relay(&net, &dead);
            Instant::now()
        }
    };
    eprintln!("{test}: {how:?} {dead} (hop {hop} of {path:?}) after {got} bytes");

    // The application's connection must end within 5 s, short of the full body.
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let ended = loop {
        match s.read(&mut buf) {
            Ok(0) => break "EOF".to_string(),
            Ok(n) => got += n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => break format!("error: {e}"),
        }
        assert!(
            killed.elapsed() < limit,
            "{test}: the SOCKS connection still open {limit:?} after {dead} failed; logs in {}",
            net.dir.display()
        );
    };
    let error_after = killed.elapsed();
    assert!(got < 1_000_000_000);
    eprintln!("{test}: the application saw {ended} {error_after:?} after the {how:?}");

    // The next fetch works, on a path without the dead relay, within 5 s.
    let t0 = Instant::now();
    let body = fetch(net.socks, net.http, 100_000, Some(("after", "x"))).unwrap_or_else(|e| {
        panic!(
            "{test}: fetch after the kill failed: {e}; logs in {}",
            net.dir.display()
        )
    });
    let recovery = t0.elapsed();
    assert_eq!(body, pattern(100_000));
    assert!(
        recovery < Duration::from_secs(5),
        "{test}: the next fetch took {recovery:?}"
    );
    let new_path = path_of(&net.dir, "after").expect("no circuit for the second fetch");
    assert!(
        !new_path.contains(&dead),
        "{test}: new path {new_path:?} uses the dead {dead}"
    );
    eprintln!("{test}: next fetch on {new_path:?} took {recovery:?}");

    // The client said which relay it blames, and how: the entry is surely down (its link
    // closed); a later hop is at least suspect (a DESTROY does not say which hop died; it is
    // surely down if it was also the first hop of another circuit).
    let log = net.log("client");
    let blames: &[&str] = if hop == 0 {
        &["Down"]
    } else {
        &["Down", "Suspect"]
    };
    assert!(
        log.lines().any(|l| l.contains("marking relay down")
            && l.contains(&format!("relay={dead} "))
            && blames.iter().any(|b| l.contains(&format!("blame={b}")))),
        "{test}: the client did not mark {dead} {blames:?}; logs in {}",
        net.dir.display()
    );
    if how == Failure::Stop {
        // The relays next to it said why they closed their links.
        assert!(
            net.relay_logs().contains("peer presumed hung"),
            "{test}: no relay logged the hung link; logs in {}",
            net.dir.display()
        );
        reap_relay(&mut net, &dead);
    }
    net.check_alive();
}

#[test]
fn killing_the_entry_mid_download_fails_the_stream_fast_and_the_next_fetch_works() {
    kill_hop("kill-entry", 0);
}

#[test]
fn killing_the_middle_mid_download_fails_the_stream_fast_and_the_next_fetch_works() {
    kill_hop("kill-middle", 1);
}

#[test]
fn killing_the_exit_mid_download_fails_the_stream_fast_and_the_next_fetch_works() {
    kill_hop("kill-exit", 2);
}

#[test]
fn a_hung_middle_mid_download_fails_the_stream_after_the_idle_timeout_and_the_next_fetch_works() {
    fail_hop("stop-middle", 1, Failure::Stop);
}

/// The index of relay `name`'s process in `net.children`.
fn child_of(net: &Network, name: &str) -> usize {
    net.children
        .iter()
        .position(|(n, _)| n == name)
        .expect("relay process")
}

/// SIGSTOP relay `name` (it stays in `children`: the network's drop kills it; SIGKILL works on
/// a stopped process).
fn stop_relay(net: &Network, name: &str) {
    let pid = net.children[child_of(net, name)].1.id().to_string();
    let ok = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -STOP {pid}");
}

/// Kill relay `name` and wait for it (a stopped one included).
fn reap_relay(net: &mut Network, name: &str) {
    let (_, mut child) = net.children.remove(child_of(net, name));
    let _ = child.kill();
    let _ = child.wait();
}

/// `CircuitStreamTimeout` of the BEGIN-timeout tests (Tor's default is 10 s, then 15 s).
const STREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// SIGSTOP hop `hop` of a finished fetch's circuit, then fetch again with the same SOCKS user
/// (so on the same, now hung, circuit): the BEGIN times out and the stream is retried on a
/// path without the hung relay; the fetch succeeds within the timeout plus 5 s.
fn stop_before_fetch(test: &str, hop: usize) {
    let extra = format!("CircuitStreamTimeout = {}\n", STREAM_TIMEOUT.as_secs());
    let mut net = Network::start_alone_custom(test, &[""; RELAYS], &extra);
    wait_all_relays_listed(&net);
    let user = Some(("probe", "x"));
    let body = fetch(net.socks, net.http, 100_000, user).expect("first fetch");
    assert_eq!(body, pattern(100_000));
    let path = path_of(&net.dir, "probe").expect("no circuit for the first fetch");
    assert_eq!(path.len(), 3, "{path:?}");
    let hung = path[hop].clone();
    stop_relay(&net, &hung);
    eprintln!("{test}: stopped {hung} (hop {hop} of {path:?})");

    let t0 = Instant::now();
    let body = fetch(net.socks, net.http, 100_000, user).unwrap_or_else(|e| {
        panic!(
            "{test}: fetch through the hung {hung} failed: {e}; logs in {}",
            net.dir.display()
        )
    });
    let took = t0.elapsed();
    assert_eq!(body, pattern(100_000));
    let new_path = path_of(&net.dir, "probe").expect("no circuit for the retried stream");
    eprintln!("{test}: fetch succeeded on {new_path:?} {took:?} after the BEGIN");
    assert!(
        !new_path.contains(&hung),
        "{test}: retried on {new_path:?}, through the hung {hung}"
    );
    assert!(
        took >= STREAM_TIMEOUT,
        "{test}: {took:?}: the first circuit answered; was {hung} stopped?"
    );
    assert!(
        took < STREAM_TIMEOUT + Duration::from_secs(5),
        "{test}: the fetch took {took:?}; logs in {}",
        net.dir.display()
    );
    let log = net.log("client");
    assert!(
        log.contains("stream got no CONNECTED in time"),
        "{test}: the client did not log the BEGIN timeout; logs in {}",
        net.dir.display()
    );
    reap_relay(&mut net, &hung);
    net.check_alive();
}

#[test]
fn a_begin_through_a_middle_hung_before_the_fetch_is_retried_on_another_path() {
    stop_before_fetch("begin-timeout-middle", 1);
}

#[test]
fn a_begin_through_an_exit_hung_before_the_fetch_is_retried_on_another_path() {
    stop_before_fetch("begin-timeout-exit", 2);
}
