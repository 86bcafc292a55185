//! `QuietReserve` end to end. It measures, so it starts its network with
//! `Network::start_alone`: no other test of this binary runs beside it (see sched_e2e.rs).

use std::time::Duration;

use crate::common;
use common::*;

/// The relays' `chive_quiet_cells_total`, summed.
fn quiet_cells(net: &Network) -> u64 {
    (0..3)
        .map(|i| {
            net.scrape(i)
                .lines()
                .find_map(|l| l.strip_prefix("chive_quiet_cells_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("relay metrics lack chive_quiet_cells_total")
        })
        .sum()
}

/// Relays at 1 MB/s under EWMA, two bulk downloads, 50 KiB fetches on fresh circuits. Blocks
/// of fetches alternate between `QuietReserve = 0` and 128 KiB, switched on the live relays by
/// SIGHUP: with the reserve the fetches must be faster (they no longer wait for tokens behind
/// bulk), quiet batches must appear only while it is on, and bulk must keep moving.
#[test]
fn quiet_reserve_lets_fresh_circuits_past_bulk_on_a_saturated_relay() {
    const RESERVE: u64 = 131_072;
    let net = Network::start_alone(
        "reserve",
        ["BandwidthRate = 1000000\nCrossChannelPriority = true\nScheduler = \"ewma\""; 3],
    );
    let bulk = BulkLoad::start(&net, &["bulk1", "bulk2"]);
    std::thread::sleep(Duration::from_secs(5));
    let mut times = [Vec::new(), Vec::new()]; // [off, on]
    let mut n = 0;
    // Blocks off, on, on, off, off, on, on, off: each setting as often early as late.
    for block in 0..8 {
        let on = matches!(block % 4, 1 | 2);
        let want = if on { RESERVE } else { 0 };
        net.reconfigure_relays(&format!("QuietReserve = {want}"));
        let gauge = format!("chive_quiet_reserve_bytes {want}");
        net.wait_relays_report(
            &format!("relays did not report QuietReserve = {want} after SIGHUP"),
            |m| m.lines().any(|l| l == gauge),
        );
        // Let the bulk downloads drain what they may of the bucket under the new setting.
        std::thread::sleep(Duration::from_secs(1));
        let quiet_before = quiet_cells(&net);
        let block_times = timed_fresh_fetches(&net, &mut n);
        let quiet = quiet_cells(&net) - quiet_before;
        eprintln!(
            "block {block} QuietReserve={want}: quiet cells {quiet}, 50 KiB times {:?}",
            fmt_times(&block_times)
        );
        if on {
            // Six 50 KiB responses alone are over 600 cells at the exit.
            assert!(quiet >= 100, "reserve on, but only {quiet} quiet cells");
        } else {
            assert_eq!(quiet, 0, "reserve off, but {quiet} quiet cells");
        }
        times[on as usize].extend(block_times);
    }
    let moved = bulk.stop();
    let (off, on) = (&times[0], &times[1]);
    assert_faster_under_load(("reserve off", off), ("reserve on", on), moved, 0.01);
}
