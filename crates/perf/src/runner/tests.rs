//! The loop runner against a local httpd and SOCKS proxy: schedules, deadlines,
//! cancellation, parallel loops, progress records.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::*;
use crate::testutil::*;

#[tokio::test]
async fn run_reports_failure_but_completes_the_sequence() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    let mut s = base(dead, "http://example.invalid/".into());
    s.count = 3;
    let (r, lines) = run_collect(s, Cancel::new()).await;
    assert_eq!(r.unwrap_err().to_string(), "3 of 3 transfers failed");
    assert_eq!(lines.len(), 3);
    assert!(lines[2]["error"].as_str().unwrap().starts_with("socks:"));
    assert!(lines[2]["socket_connected"].is_null());

    let http = start_httpd().await;
    let (socks, seen) = start_socks().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/100", http.port()));
    s.count = 2;
    s.isolate = true;
    s.interval = Duration::from_millis(300);
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    // The interval separates transfer starts, and no pause follows the last one.
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(550),
        "{took:?}"
    );
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0]["bytes"], 100);
    assert_eq!(recs[0]["status"], 200);
    assert!(recs[0]["error"].is_null());
    let keys: BTreeSet<&str> = recs[0]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let expected: BTreeSet<&str> = [
        "type",
        "class",
        "loop",
        "seq",
        "url",
        "start",
        "socket_connected",
        "socks_connected",
        "request_sent",
        "first_byte",
        "last_byte",
        "bytes",
        "expected_bytes",
        "status",
        "error",
        "socks_user",
        "partials",
    ]
    .into();
    assert_eq!(keys, expected);
    assert_eq!(recs[0]["type"], "transfer");
    assert!(recs[0]["class"].is_null());
    assert_eq!((&recs[0]["loop"], &recs[0]["seq"]), (&0.into(), &0.into()));
    assert_eq!(recs[1]["seq"], 1);
    // 100 bytes is below every partial size.
    assert_eq!(recs[0]["partials"], serde_json::json!({}));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let (u0, u1) = (
        seen[0].auth.clone().unwrap().0,
        seen[1].auth.clone().unwrap().0,
    );
    assert!(u0.starts_with(b"chive-perf-") && u0 != u1);
    assert_eq!(recs[1]["socks_user"].as_str().unwrap().as_bytes(), &u1[..]);
}

#[tokio::test]
async fn duration_stops_starting_transfers() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(
        socks,
        format!("http://127.0.0.1:{}/bytes/1000", http.port()),
    );
    s.count = 0;
    s.duration = Some(Duration::from_millis(400));
    s.interval = Duration::from_millis(100);
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, Cancel::new()).await;
    let took = t0.elapsed();
    r.unwrap();
    // Starts at about 0, 100, 200, 300 ms; none at or after 400 ms.
    assert!((3..=4).contains(&recs.len()), "{}", recs.len());
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(900),
        "{took:?}"
    );
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r["seq"], i);
        assert!(r["error"].is_null());
    }
    let span = f(&recs[recs.len() - 1]["start"]) - f(&recs[0]["start"]);
    assert!(span < 0.4, "{span}");
}

#[tokio::test]
async fn deadline_completes_or_cuts_the_running_transfer() {
    let (socks, _) = start_socks().await;
    // 100 kB in 10 kB pieces every 100 ms: about one second.
    let slow = start_slow(100_000, 10_000, Duration::from_millis(100)).await;
    let mut s = base(socks, format!("http://{slow}/bytes/100000"));
    s.duration = Some(Duration::from_millis(300));
    s.count = 0;

    let t0 = Instant::now();
    let (r, recs) = run_collect(s.clone(), Cancel::new()).await;
    r.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(850));
    assert_eq!(recs.len(), 1);
    assert!(recs[0]["error"].is_null());
    assert_eq!(recs[0]["bytes"], 100_000);

    s.cut_at_deadline = true;
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, Cancel::new()).await;
    // A cut transfer is not a failure.
    r.unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(700),
        "{took:?}"
    );
    assert_eq!(recs.len(), 1);
    let rec = &recs[0];
    assert_eq!(rec["error"], "cut at deadline");
    let bytes = rec["bytes"].as_u64().unwrap();
    assert!((10_000..100_000).contains(&bytes), "{bytes}");
    assert!(rec["last_byte"].is_null());
    assert!(rec["partials"]["10240"].is_f64());
    assert!(rec["partials"]["51200"].is_null());
    assert!(rec["partials"].get("102400").is_none());
}

#[test]
fn next_start_takes_the_later_of_interval_and_gap() {
    let t = Instant::now();
    let ms = Duration::from_millis;
    // Short transfer: the interval from the start governs.
    assert_eq!(next_start(t, t + ms(10), ms(500), ms(100)), t + ms(500));
    // Long transfer: the pause after its end governs.
    assert_eq!(next_start(t, t + ms(450), ms(500), ms(100)), t + ms(550));
    assert_eq!(next_start(t, t + ms(30), ms(0), ms(0)), t + ms(30));
}

#[tokio::test]
async fn pause_separates_end_from_next_start() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(
        socks,
        format!("http://127.0.0.1:{}/bytes/1000", http.port()),
    );
    s.count = 3;
    s.pause = Duration::from_millis(200);
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1000),
        "{took:?}"
    );
    assert_eq!(recs.len(), 3);
    for w in recs.windows(2) {
        let gap = f(&w[1]["start"]) - f(&w[0]["last_byte"]);
        assert!((0.199..0.4).contains(&gap), "{gap}");
    }
}

#[test]
fn think_times_follow_their_distribution() {
    let mean = Duration::from_secs(2);
    let mut rng = StdRng::seed_from_u64(loop_seed(7, 0));
    assert_eq!(think_time(None, mean, &mut rng), Duration::ZERO);
    assert_eq!(think_time(Some(Think::Fixed), mean, &mut rng), mean);
    let n = 20_000;
    let xs: Vec<f64> = (0..n)
        .map(|_| think_time(Some(Think::Exp), mean, &mut rng).as_secs_f64())
        .collect();
    let avg = xs.iter().sum::<f64>() / n as f64;
    assert!((avg - 2.0).abs() < 0.06, "{avg}");
    // P(X > mean) = 1/e for an exponential.
    let above = xs.iter().filter(|&&x| x > 2.0).count() as f64 / n as f64;
    assert!((above - (-1.0f64).exp()).abs() < 0.02, "{above}");
    assert!(xs.iter().all(|&x| x >= 0.0));
    // Reproducible from the seed; distinct per loop.
    let draw = |seed| {
        let mut r = StdRng::seed_from_u64(seed);
        (0..5)
            .map(|_| think_time(Some(Think::Exp), mean, &mut r))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(loop_seed(7, 1)), draw(loop_seed(7, 1)));
    assert_ne!(draw(loop_seed(7, 0)), draw(loop_seed(7, 1)));
    assert_ne!(draw(loop_seed(7, 0)), draw(loop_seed(8, 0)));
}

#[tokio::test]
async fn think_times_are_the_seeded_samples() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(
        socks,
        format!("http://127.0.0.1:{}/bytes/1000", http.port()),
    );
    s.count = 4;
    s.pause = Duration::from_millis(50);
    s.think = Some(Think::Exp);
    s.think_mean = Duration::from_millis(80);
    s.seed = 42;
    let (r, recs) = run_collect(s.clone(), Cancel::new()).await;
    r.unwrap();
    assert_eq!(recs.len(), 4);
    let mut rng = StdRng::seed_from_u64(loop_seed(42, 0));
    for w in recs.windows(2) {
        let want = (s.pause + think_time(s.think, s.think_mean, &mut rng)).as_secs_f64();
        let gap = f(&w[1]["start"]) - f(&w[0]["last_byte"]);
        assert!(gap >= want - 0.001 && gap < want + 0.15, "{gap} vs {want}");
    }
}

#[tokio::test]
async fn parallel_loops_are_independent() {
    let http = start_httpd().await;
    let (socks, seen) = start_socks().await;
    let mut s = base(
        socks,
        format!("http://127.0.0.1:{}/bytes/20000", http.port()),
    );
    s.parallel = 3;
    s.count = 2;
    s.isolate = true;
    s.label = Some("web".into());
    s.interval = Duration::from_millis(100);
    let (r, recs) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    assert_eq!(recs.len(), 6);
    for lp in 0..3u64 {
        let mine: Vec<&Value> = recs.iter().filter(|r| r["loop"] == lp).collect();
        let seqs: Vec<u64> = mine.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, [0, 1], "loop {lp}");
    }
    assert!(recs
        .iter()
        .all(|r| r["class"] == "web" && r["error"].is_null() && r["bytes"] == 20_000));
    // The loops run side by side: their first transfers start together.
    let firsts: Vec<f64> = recs
        .iter()
        .filter(|r| r["seq"] == 0)
        .map(|r| f(&r["start"]))
        .collect();
    let spread = firsts.iter().cloned().fold(f64::MIN, f64::max)
        - firsts.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread < 0.09, "{spread}");
    let users: BTreeSet<&str> = recs
        .iter()
        .map(|r| r["socks_user"].as_str().unwrap())
        .collect();
    assert_eq!(users.len(), 6);
    assert_eq!(seen.lock().unwrap().len(), 6);
}

#[tokio::test]
async fn continuous_uploads() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
    s.method = HttpMethod::Post;
    s.upload_bytes = 120_000;
    s.count = 3;
    s.label = Some("bulk-up".into());
    let (r, recs) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert_eq!(
            (&r["bytes"], &r["expected_bytes"]),
            (&120_000.into(), &120_000.into())
        );
        assert_eq!(r["status"], 200);
        assert!(r["partials"]["102400"].is_f64());
        assert!(r["partials"].get("204800").is_none());
    }
}

#[tokio::test]
async fn progress_records_increase_while_a_transfer_runs() {
    let (socks, _) = start_socks().await;
    let slow = start_slow(60_000, 10_000, Duration::from_millis(100)).await;
    let mut s = base(socks, format!("http://{slow}/bytes/60000"));
    s.progress = Some(Duration::from_millis(100));
    s.label = Some("bulk".into());
    let (r, lines) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    let transfers = of_type(&lines, "transfer");
    let progress = of_type(&lines, "progress");
    assert_eq!(transfers.len(), 1);
    assert_eq!(lines.len(), transfers.len() + progress.len());
    // Progress comes while the transfer runs, so before its record.
    assert_eq!(lines.last().unwrap()["type"], "transfer");
    assert!(progress.len() >= 4, "{}", progress.len());
    let keys: BTreeSet<&str> = progress[0]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        ["type", "class", "loop", "t", "bytes", "transfer"].into()
    );
    let t = transfers[0];
    for p in &progress {
        assert_eq!(
            (&p["class"], &p["loop"], &p["transfer"]),
            (&"bulk".into(), &0.into(), &0.into())
        );
        assert!(f(&p["t"]) >= f(&t["start"]) && f(&p["t"]) <= f(&t["last_byte"]));
    }
    assert!(progress.windows(2).all(|w| f(&w[0]["t"]) < f(&w[1]["t"])));
    let bytes: Vec<u64> = progress
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .collect();
    assert!(bytes.windows(2).all(|w| w[0] <= w[1]), "{bytes:?}");
    assert!(bytes[0] < *bytes.last().unwrap(), "{bytes:?}");
    assert!(*bytes.last().unwrap() <= 60_000);
}

#[tokio::test]
async fn cancel_records_interrupted_transfers_and_ends_pauses() {
    let (socks, _) = start_socks().await;
    // About five seconds per transfer.
    let slow = start_slow(1_000_000, 10_000, Duration::from_millis(50)).await;
    let mut s = base(socks, format!("http://{slow}/bytes/1000000"));
    s.parallel = 2;
    s.count = 0;
    let cancel = Cancel::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.cancel();
    });
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, cancel).await;
    // Interrupted transfers are not failures.
    r.unwrap();
    assert!(t0.elapsed() < Duration::from_millis(1500));
    assert_eq!(recs.len(), 2);
    let loops: BTreeSet<u64> = recs.iter().map(|r| r["loop"].as_u64().unwrap()).collect();
    assert_eq!(loops, [0, 1].into());
    for r in &recs {
        assert_eq!(r["error"], "interrupted");
        let bytes = r["bytes"].as_u64().unwrap();
        assert!(bytes > 0 && bytes < 1_000_000, "{bytes}");
        assert!(r["last_byte"].is_null());
        assert!(r["partials"]["10240"].is_f64());
        assert!(r["partials"]["1048576"].is_null() || r["partials"].get("1048576").is_none());
    }

    // Cancelled during a long pause: stops at once, the finished transfer stands.
    let http = start_httpd().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/10", http.port()));
    s.count = 0;
    s.pause = Duration::from_secs(30);
    let cancel = Cancel::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.cancel();
    });
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, cancel).await;
    r.unwrap();
    assert!(t0.elapsed() < Duration::from_millis(1000));
    assert_eq!(recs.len(), 1);
    assert!(recs[0]["error"].is_null());

    // Cancelled before the start delay ends: nothing runs.
    let mut s = base(socks, "http://127.0.0.1:1/".into());
    s.start_delay = Duration::from_secs(30);
    let cancel = Cancel::new();
    cancel.cancel();
    let (r, recs) = run_collect(s, cancel).await;
    r.unwrap();
    assert!(recs.is_empty());
}

#[tokio::test]
async fn start_delay_postpones_the_first_transfer() {
    let http = start_httpd().await;
    let (socks, _) = start_socks().await;
    let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/10", http.port()));
    s.start_delay = Duration::from_millis(250);
    let before = Clock::new().now();
    let (r, recs) = run_collect(s.clone(), Cancel::new()).await;
    r.unwrap();
    let waited = f(&recs[0]["start"]) - before;
    assert!((0.245..0.6).contains(&waited), "{waited}");
    // A start delay beyond the duration: nothing starts.
    s.start_delay = Duration::from_millis(500);
    s.duration = Some(Duration::from_millis(100));
    let t0 = Instant::now();
    let (r, recs) = run_collect(s, Cancel::new()).await;
    r.unwrap();
    assert!(recs.is_empty());
    assert!(t0.elapsed() < Duration::from_millis(300));
}
