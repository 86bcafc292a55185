//! The exit's stream-creation defence (`DoSStreamCreation*`, docs/security.md) on real
//! processes: a client opens streams as fast as it can on one circuit (one SOCKS username,
//! many threads) through relays with `DoSStreamCreationEnabled = 1` and a small bucket. The
//! exit must refuse what is past the bucket (END, reason MISC: the SOCKS request fails) and
//! count it in its metrics; an honest client's download through the same relays, on its own
//! circuit, must complete byte-exact during the flood; the exit must keep serving after it.
//! The deterministic rules (burst, refill, RESOLVE, type 3) are `chive-core`'s `dos_streams`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

/// The exit's bucket: small, so the flood is refused after a handful of streams.
const BURST: usize = 20;
const RATE: usize = 2;
/// Streams the flooder tries at least, and the threads that open them at once.
const FLOOD_STREAMS: usize = 300;
/// The honest download during the flood.
const HONEST_BYTES: usize = 5_000_000;
const FLOOD_THREADS: usize = 16;

/// The sum over every relay of a counter (the exit of a 3-hop circuit over 3 relays may be
/// any of them).
fn counter_sum(net: &Network, name: &str) -> u64 {
    (0..net.metrics.len())
        .map(|i| {
            net.scrape(i)
                .lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        })
        .sum()
}

#[test]
fn a_stream_flood_on_one_circuit_is_refused_at_the_exit_and_an_honest_fetch_completes() {
    let dos = format!(
        "DoSStreamCreationEnabled = 1\nDoSStreamCreationBurst = {BURST}\n\
         DoSStreamCreationRate = {RATE}\nDoSStreamCreationDefenseType = 2"
    );
    let mut net = Network::start("dos_streams", [&dos, &dos, &dos]);
    let (socks, http) = (net.socks, net.http);
    // Build the flooder's circuit first (one stream), so the flood is BEGINs, not a build.
    assert_eq!(
        fetch(socks, http, 1000, Some(("flood", "x"))).unwrap(),
        pattern(1000)
    );
    assert_eq!(counter_sum(&net, "chive_dos_streams_refused_total"), 0);

    // The flood: FLOOD_THREADS threads open streams on the one circuit until told to stop
    // (after the honest download and at least FLOOD_STREAMS tries).
    let t0 = Instant::now();
    let (opened, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..FLOOD_THREADS)
        .map(|_| {
            let (opened, failed, stop) = (opened.clone(), failed.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match socks_connect(socks, http, Some(("flood", "x"))) {
                        Ok(mut s) => {
                            opened.fetch_add(1, Ordering::Relaxed);
                            let _ = write!(s, "GET /bytes/1 HTTP/1.0\r\n\r\n");
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let tries = || opened.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
    // The honest client (its own circuit: another SOCKS username) while the flood runs.
    let t = Instant::now();
    let body = fetch(socks, http, HONEST_BYTES, Some(("honest", "x")));
    let honest_time = t.elapsed();
    let tries_during_honest = tries();
    while tries() < FLOOD_STREAMS && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let flood_time = t0.elapsed();
    let body = body.expect("honest download failed during the flood");
    assert!(
        body == pattern(HONEST_BYTES),
        "honest download not byte-exact"
    );
    assert!(
        tries_during_honest > 0,
        "the honest download ended before the flood began"
    );

    let (opened, failed) = (
        opened.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    // The relays publish their metrics about once a second: wait for the refusals to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut refused = 0;
    while Instant::now() < deadline {
        refused = counter_sum(&net, "chive_dos_streams_refused_total") as usize;
        if refused >= failed {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "stream flood: {} SOCKS requests on one circuit in {:.2} s: {opened} opened, \
         {failed} failed; exit refused {refused}; honest {HONEST_BYTES} bytes in {:.2} s, \
         while the flooder tried {tries_during_honest} streams",
        opened + failed,
        flood_time.as_secs_f64(),
        honest_time.as_secs_f64(),
    );
    // The flood and the warm-up's one stream together open at most the burst and the refill
    // during the flood.
    let allowed = BURST + RATE * (flood_time.as_secs() as usize + 1);
    assert!(
        opened < allowed,
        "{opened} flood streams opened (and the warm-up's), the bucket allows {allowed}"
    );
    assert!(
        opened + failed >= FLOOD_STREAMS && refused >= (opened + failed).saturating_sub(allowed),
        "the exit counted {refused} refused streams of {}",
        opened + failed
    );
    assert_eq!(
        refused, failed,
        "every refusal reached the SOCKS application, nothing else failed"
    );

    // The exit keeps serving: the honest circuit and a new one both fetch.
    assert_eq!(
        fetch(socks, http, 100_000, Some(("honest", "x"))).unwrap(),
        pattern(100_000)
    );
    assert_eq!(fetch(socks, http, 100_000, None).unwrap(), pattern(100_000));
    net.check_alive();
}
