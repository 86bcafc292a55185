//! The loop runner: `--parallel` transfer loops, each starting its transfers as
//! scheduled (interval, pause, think times) until the count, the `--duration` deadline or
//! cancellation; one transfer at a time under its timeout, with progress records, and
//! one writer that keeps the JSON lines whole.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cancel::Cancel;
use crate::options::{HttpMethod, Settings, Think, MAX_SECS};
use crate::record::{Clock, ProgressRecord, Record, Tag, Tally};
use crate::transfer::attempt;

/// JSON lines queued between the transfer loops and the stdout writer.
const LINE_QUEUE: usize = 1024;

/// The think-time seed of loop `index`: distinct per loop, reproducible from `--seed`.
fn loop_seed(seed: u64, index: u32) -> u64 {
    // Golden-ratio increment (as in SplitMix64), so nearby seeds and loops do not collide.
    seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// One think time: none, the mean, or an exponential sample with that mean.
fn think_time(kind: Option<Think>, mean: Duration, rng: &mut impl Rng) -> Duration {
    match kind {
        None => Duration::ZERO,
        Some(Think::Fixed) => mean,
        Some(Think::Exp) => {
            // Inverse transform: 1 - U is in (0, 1], so ln is finite and <= 0.
            let u: f64 = rng.gen();
            let x = -(1.0 - u).ln() * mean.as_secs_f64();
            Duration::try_from_secs_f64(x.min(MAX_SECS)).unwrap_or(Duration::ZERO)
        }
    }
}

/// When a loop's next transfer starts: `interval` after the previous start and
/// `gap` (pause plus think time) after the previous end, whichever is later.
fn next_start(started: Instant, ended: Instant, interval: Duration, gap: Duration) -> Instant {
    (started + interval).max(ended + gap)
}

/// Everything the transfer loops share.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) clock: Clock,
    pub(crate) cancel: Cancel,
    /// End of `--duration`: no transfer starts at or after it.
    pub(crate) deadline: Option<Instant>,
}

impl Shared {
    /// Sleep until `when`; false if cancelled first.
    async fn sleep_until(&self, when: Instant) -> bool {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => false,
            () = tokio::time::sleep_until(when) => true,
        }
    }

    /// Whether a transfer may start at `at`.
    fn may_start(&self, at: Instant) -> bool {
        !self.cancel.is_cancelled() && !matches!(self.deadline, Some(d) if at >= d)
    }
}

/// Transfers of one loop (or a whole run), by how they ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    ok: u64,
    failed: u64,
    /// Cut at the deadline or interrupted: not completed, not failures.
    stopped: u64,
}

/// How one transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Done,
    Failed,
    Cut,
    Interrupted,
}

/// Run every transfer loop, writing their JSON lines to `out` as they come.
/// Returns an error if a completed transfer failed or `out` cannot be written.
pub(crate) async fn run_transfers(
    settings: Settings,
    out: &mut impl std::io::Write,
    cancel: Cancel,
) -> anyhow::Result<()> {
    let deadline = settings.duration.map(|d| Instant::now() + d);
    let shared = Arc::new(Shared {
        settings,
        clock: Clock::new(),
        cancel,
        deadline,
    });
    let (tx, mut rx) = mpsc::channel::<String>(LINE_QUEUE);
    let mut loops = tokio::task::JoinSet::new();
    for index in 0..shared.settings.parallel {
        loops.spawn(run_loop(shared.clone(), index, tx.clone()));
    }
    drop(tx);
    // One writer keeps lines whole; flush once the queue is empty, so
    // consumers see each record promptly without a flush per line under load.
    while let Some(line) = rx.recv().await {
        writeln!(out, "{line}")?;
        while let Ok(line) = rx.try_recv() {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
    }
    let mut total = Counts::default();
    while let Some(joined) = loops.join_next().await {
        let c = joined.map_err(|e| anyhow!("internal: a transfer loop died: {e}"))?;
        total.ok += c.ok;
        total.failed += c.failed;
        total.stopped += c.stopped;
    }
    if total.failed > 0 {
        bail!(
            "{} of {} transfers failed",
            total.failed,
            total.ok + total.failed
        );
    }
    Ok(())
}

/// One transfer loop: transfers one after the other, as scheduled, until the
/// count, the deadline or cancellation. Records go to `tx` as JSON lines.
async fn run_loop(shared: Arc<Shared>, index: u32, tx: mpsc::Sender<String>) -> Counts {
    let s = &shared.settings;
    let mut rng = StdRng::seed_from_u64(loop_seed(s.seed, index));
    let mut counts = Counts::default();
    let first = Instant::now() + s.start_delay;
    if !shared.may_start(first) || !shared.sleep_until(first).await {
        return counts;
    }
    let mut seq: u64 = 0;
    while shared.may_start(Instant::now()) {
        let started = Instant::now();
        let user = if s.isolate {
            let mut r = [0u8; 8];
            rand::thread_rng().fill_bytes(&mut r);
            Some(format!("chive-perf-{}", hex::encode(r)))
        } else {
            s.user.clone()
        };
        let tag = Tag {
            class: s.label.clone(),
            loop_index: index,
            seq,
        };
        let progress = s.progress.is_some().then_some(&tx);
        let (rec, ending) = guarded_transfer(&shared, tag, user, progress).await;
        match ending {
            Ending::Done => counts.ok += 1,
            Ending::Failed => {
                counts.failed += 1;
                tracing::warn!(
                    "loop {index} transfer {seq} failed: {}",
                    rec.error.as_deref().unwrap_or("?")
                );
            }
            Ending::Cut | Ending::Interrupted => counts.stopped += 1,
        }
        match serde_json::to_string(&rec) {
            Ok(line) => {
                if tx.send(line).await.is_err() {
                    break;
                }
            }
            Err(e) => tracing::error!("cannot encode a record: {e}"),
        }
        seq += 1;
        if matches!(ending, Ending::Cut | Ending::Interrupted) || (s.count != 0 && seq >= s.count) {
            break;
        }
        let gap = s.pause + think_time(s.think, s.think_mean, &mut rng);
        let next = next_start(started, Instant::now(), s.interval, gap);
        if !shared.may_start(next) || !shared.sleep_until(next).await {
            break;
        }
    }
    counts
}

/// Run one transfer under its timeout, the deadline (with `--cut-at-deadline`)
/// and cancellation, emitting progress lines to `progress` if given. Never
/// fails: errors go in the record.
pub(crate) async fn guarded_transfer(
    shared: &Shared,
    tag: Tag,
    user: Option<String>,
    progress: Option<&mpsc::Sender<String>>,
) -> (Record, Ending) {
    let s = &shared.settings;
    let started = Instant::now();
    let mut rec = Record::new(&tag, s.url_text.clone(), shared.clock.now(), user.clone());
    let live = AtomicU64::new(0);
    let creds = user.map(|u| (u, s.pass.clone()));
    let cut_at = if s.cut_at_deadline {
        shared.deadline
    } else {
        None
    };
    let stopped = {
        let tally = Tally {
            clock: &shared.clock,
            live: &live,
        };
        let work = attempt(s, tally, creds, &mut rec);
        tokio::pin!(work);
        let timeout = tokio::time::sleep_until(started + s.timeout);
        tokio::pin!(timeout);
        let mut ticker = s.progress.map(|p| {
            let mut t = tokio::time::interval_at(started + p, p);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            t
        });
        loop {
            tokio::select! {
                // Finishing wins over a stop that happens at the same moment.
                biased;
                r = &mut work => break r.err().map(|e| (e, Ending::Failed)),
                () = shared.cancel.cancelled() => break Some(("interrupted".into(), Ending::Interrupted)),
                () = sleep_until_opt(cut_at) => break Some(("cut at deadline".into(), Ending::Cut)),
                () = &mut timeout => break Some(("timeout".into(), Ending::Failed)),
                () = tick_opt(&mut ticker) => {
                    if let Some(tx) = progress {
                        let p = ProgressRecord {
                            kind: "progress",
                            class: tag.class.as_deref(),
                            loop_index: tag.loop_index,
                            t: shared.clock.now(),
                            bytes: live.load(Ordering::Relaxed),
                            transfer: tag.seq,
                        };
                        if let Ok(line) = serde_json::to_string(&p) {
                            let _ = tx.send(line).await;
                        }
                    }
                }
            }
        }
    };
    let ending = match stopped {
        None => Ending::Done,
        Some((e, ending)) => {
            rec.error = Some(e);
            ending
        }
    };
    let size = match s.method {
        HttpMethod::Get => rec.expected_bytes,
        HttpMethod::Post => Some(s.upload_bytes),
    };
    rec.fill_partials(size);
    (rec, ending)
}

/// Sleep until `at`, or forever if there is no `at`.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next tick of `ticker`, or never if there is none.
async fn tick_opt(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
