//! `chive perf`: the lab's traffic generator — torperf/OnionPerf-style timed
//! HTTP transfers through a SOCKS5 proxy.
//!
//! Each transfer connects to the proxy, does a SOCKS5 CONNECT with the URL's
//! host sent as given (a name is never resolved locally, like
//! `curl --socks5-hostname`), sends one HTTP/1.1 GET or POST with
//! `Connection: close`, reads the response, and prints one JSON line on stdout.
//!
//! `--parallel N` runs N independent transfer loops; each loop starts its
//! transfers one after the other, spaced by `--interval` (start to start),
//! `--pause` and `--think` (end to next start), until `--count` transfers or
//! `--duration` seconds. SIGTERM/SIGINT end the run cleanly: a transfer in
//! flight is recorded as "interrupted".
//!
//! Two kinds of JSON lines (see [`Record`] and [`ProgressRecord`]):
//! - `{"type":"transfer","class","loop","seq","url","start","socket_connected",
//!   "socks_connected","request_sent","first_byte","last_byte","bytes",
//!   "expected_bytes","status","error","socks_user","partials"}`, one per transfer;
//! - `{"type":"progress","class","loop","t","bytes","transfer"}`, every
//!   `--progress` seconds while a transfer runs.
//!
//! Times are UNIX seconds (µs precision) taken from one clock that never goes
//! backwards; a time is null if the transfer did not get that far. `bytes`
//! counts body bytes received (GET) or uploaded (POST); `expected_bytes` is the
//! response Content-Length (GET) or the upload size (POST).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use chive_tools::config::{init_logging, load_config};
use chive_tools::pattern::{first_mismatch, pattern, CHUNK, PERIOD};

/// Largest accepted HTTP response head (status line plus headers).
const MAX_HEAD: usize = 64 * 1024;
/// Largest chunk-size or trailer line in a chunked body.
const MAX_LINE: usize = 4096;
/// Largest response body kept for checking (the JSON reply of `/upload`).
const MAX_CAPTURE: usize = 64 * 1024;
/// Upper bound on the per-transfer time options (one day), to keep `Duration` math safe.
const MAX_SECS: f64 = 86_400.0;
/// Upper bound on `--duration` (30 days).
const MAX_DURATION_SECS: f64 = 30.0 * 86_400.0;
/// Smallest `--progress` period: bounds the rate of progress lines.
const MIN_PROGRESS_SECS: f64 = 0.01;
/// Largest `--parallel`.
const MAX_PARALLEL: u32 = 1024;
/// Longest `--label`.
const MAX_LABEL: usize = 255;
/// JSON lines queued between the transfer loops and the stdout writer.
const LINE_QUEUE: usize = 1024;
/// Body sizes (bytes) whose arrival time every transfer record reports under
/// "partials": 10/20/50/100/200/500 KiB and 1/2/5 MiB, as OnionPerf does.
pub const PARTIAL_SIZES: [u64; 9] = [
    10_240, 20_480, 51_200, 102_400, 204_800, 512_000, 1_048_576, 2_097_152, 5_242_880,
];

/// HTTP method used by `chive perf`.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HttpMethod {
    /// Download the URL.
    Get,
    /// Upload `--upload-bytes` bytes of the /bytes pattern to the URL.
    Post,
}

/// Distribution of think times (`--think`).
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Think {
    /// Exponentially distributed with mean `--think-mean` (web-like users).
    Exp,
    /// Always exactly `--think-mean`.
    Fixed,
}

/// Command-line arguments of `chive perf`: the [`Options`], boxed so the
/// binary's subcommand enum stays small.
#[derive(clap::Args, Debug, Default)]
#[command(after_help = PERF_HELP)]
pub struct Args {
    /// Every option.
    #[command(flatten)]
    pub opts: Box<Options>,
}

/// The options of `chive perf`. Every option may also be set in the
/// `--config` TOML file, keyed by its long name with '-' replaced by '_'
/// (e.g. `socks_user = "alice"`); flags given on the command line win.
#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Optional TOML config file: any option below, keyed by its long name with
    /// '_' for '-' (e.g. url = "http://...", think_mean = 2.0, cut_at_deadline = true).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// SOCKS5 proxy address [default: 127.0.0.1:9050].
    #[arg(long)]
    pub socks: Option<SocketAddr>,
    /// URL to fetch: http://HOST[:PORT]/PATH; HOST may be a name (resolved by the proxy) or an IP (required).
    #[arg(long)]
    pub url: Option<String>,
    /// Transfers per loop; 0 = until --duration ends or forever [default: 1, or 0 with --duration].
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop starting new transfers this many seconds after the run began (the
    /// start delay counts); a transfer running then is completed, see --cut-at-deadline.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// With --duration: abort a transfer still running at the deadline and record
    /// it with error "cut at deadline" and its partial bytes.
    #[arg(long)]
    pub cut_at_deadline: bool,
    /// Seconds between the STARTS of consecutive transfers of a loop [default: 0].
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// Seconds from the END of a transfer to the next start [default: 0].
    #[arg(long, value_name = "SECS")]
    pub pause: Option<f64>,
    /// Add a random think time after each transfer: exp (exponential) or fixed
    /// [default: exp if --think-mean is given, else none].
    #[arg(long, value_enum)]
    pub think: Option<Think>,
    /// Mean think time in seconds (needed by --think).
    #[arg(long, value_name = "SECS")]
    pub think_mean: Option<f64>,
    /// Seed of the think-time generator (loop i uses a seed derived from N and i)
    /// [default: from the clock, logged at info level].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Seconds to wait before the first transfer [default: 0].
    #[arg(long, value_name = "SECS")]
    pub start_delay: Option<f64>,
    /// Number of independent transfer loops in this process; records carry
    /// "loop": 0..N-1 [default: 1].
    #[arg(long, value_name = "N")]
    pub parallel: Option<u32>,
    /// Emit a progress record (cumulative bytes of the running transfer) every SECS per loop.
    #[arg(long, value_name = "SECS")]
    pub progress: Option<f64>,
    /// Class name copied into every record as "class" (e.g. web, bulk) [default: null].
    #[arg(long, value_name = "CLASS")]
    pub label: Option<String>,
    /// SOCKS5 username (username/password auth; distinct names isolate circuits).
    #[arg(long)]
    pub socks_user: Option<String>,
    /// SOCKS5 password (needs a username or --isolate) [default: empty].
    #[arg(long)]
    pub socks_pass: Option<String>,
    /// Use a fresh random SOCKS username per transfer, so each gets a fresh
    /// circuit; without it transfers reuse the client's circuits.
    #[arg(long)]
    pub isolate: bool,
    /// Seconds a whole transfer may take before it is recorded as "timeout" [default: 60].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// HTTP method [default: get].
    #[arg(long, value_enum)]
    pub method: Option<HttpMethod>,
    /// For POST: bytes to upload (the /bytes pattern, byte i = i % 251) [default: 0].
    #[arg(long)]
    pub upload_bytes: Option<u64>,
    /// Check the body against the /bytes pattern (GET) or the server's reported
    /// count and SHA-256 (POST to /upload); a mismatch is an error.
    #[arg(long)]
    pub verify: bool,
    /// Log filter for stderr [default: warn].
    #[arg(long)]
    pub log: Option<String>,
}

/// Shown after the option list of `chive perf --help`.
const PERF_HELP: &str = "\
Scheduling: each loop starts a transfer, waits for it to end, then starts the next one at
  max(previous start + --interval, previous end + --pause + think time).
Records (one JSON object per line on stdout; times are UNIX seconds or null):
  {\"type\":\"transfer\",\"class\",\"loop\",\"seq\",\"url\",\"start\",\"socket_connected\",
   \"socks_connected\",\"request_sent\",\"first_byte\",\"last_byte\",\"bytes\",\"expected_bytes\",
   \"status\",\"error\",\"socks_user\",\"partials\":{\"10240\":t,...,\"5242880\":t}}
  partials: when that many body bytes (GET) or upload bytes (POST) had arrived or been sent,
  for sizes <= the transfer's size (null if not reached).
  {\"type\":\"progress\",\"class\",\"loop\",\"t\",\"bytes\",\"transfer\"} with --progress.
SIGTERM/SIGINT: the transfer in flight is recorded with error \"interrupted\"; exit status 0 if
  every completed transfer succeeded (cut and interrupted transfers do not count).

Examples:
  # torperf-style: a 50 KiB fetch every 0.5 s, each on a fresh circuit, for 10 minutes
  chive perf --socks 127.0.0.1:9050 --url http://127.0.0.1:8080/bytes/51200 \\
      --interval 0.5 --isolate --duration 600 --label torperf

  # continuous bulk download: 5 MiB transfers back to back on reused circuits,
  # throughput sampled every second (use --method post --upload-bytes N for bulk uploads)
  chive perf --url http://127.0.0.1:8080/bytes/5242880 --count 0 --timeout 600 \\
      --progress 1 --label bulk

  # web-like clients: 87 KiB fetches with exponential think times (mean 5 s), 4 users
  chive perf --url http://127.0.0.1:8080/bytes/89088 --think exp --think-mean 5 \\
      --seed 1 --parallel 4 --duration 300 --cut-at-deadline --label web

  # the paper's 87 KB fetch with 20 s breaks
  chive perf --url http://127.0.0.1:8080/bytes/89088 --pause 20 --count 0 --label web
";

/// The `--config` file: the same options as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socks: Option<SocketAddr>,
    url: Option<String>,
    count: Option<u64>,
    duration: Option<f64>,
    cut_at_deadline: Option<bool>,
    interval: Option<f64>,
    pause: Option<f64>,
    think: Option<Think>,
    think_mean: Option<f64>,
    seed: Option<u64>,
    start_delay: Option<f64>,
    parallel: Option<u32>,
    progress: Option<f64>,
    label: Option<String>,
    socks_user: Option<String>,
    socks_pass: Option<String>,
    isolate: Option<bool>,
    timeout: Option<f64>,
    method: Option<HttpMethod>,
    upload_bytes: Option<u64>,
    verify: Option<bool>,
    log: Option<String>,
}

/// Validated settings for a run.
#[derive(Debug, Clone)]
struct Settings {
    socks: SocketAddr,
    url_text: String,
    url: HttpUrl,
    /// Transfers per loop; 0 = unbounded.
    count: u64,
    duration: Option<Duration>,
    cut_at_deadline: bool,
    interval: Duration,
    pause: Duration,
    think: Option<Think>,
    think_mean: Duration,
    seed: u64,
    start_delay: Duration,
    parallel: u32,
    progress: Option<Duration>,
    label: Option<String>,
    user: Option<String>,
    pass: String,
    isolate: bool,
    timeout: Duration,
    method: HttpMethod,
    upload_bytes: u64,
    verify: bool,
    log: String,
}

/// A number of seconds as a `Duration`, refusing NaN, negatives and values above `max`.
fn secs(name: &str, v: f64, max: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && (0.0..=max).contains(&v)) {
        bail!("--{name} must be between 0 and {max} seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

/// Like [`secs`] for an optional value.
fn opt_secs(name: &str, v: Option<f64>, max: f64) -> anyhow::Result<Option<Duration>> {
    v.map(|v| secs(name, v, max)).transpose()
}

/// Merge flags over the file and validate everything.
fn settings(args: Options) -> anyhow::Result<Settings> {
    let file: FileConfig = match &args.config {
        Some(path) => load_config(path)?,
        None => FileConfig::default(),
    };
    let url_text = args
        .url
        .or(file.url)
        .ok_or_else(|| anyhow!("--url is required (or `url` in the --config file)"))?;
    let url = parse_url(&url_text).map_err(|e| anyhow!("bad --url {url_text:?}: {e}"))?;
    let timeout = secs(
        "timeout",
        args.timeout.or(file.timeout).unwrap_or(60.0),
        MAX_SECS,
    )?;
    if timeout.is_zero() {
        bail!("--timeout must be positive");
    }
    let interval = secs(
        "interval",
        args.interval.or(file.interval).unwrap_or(0.0),
        MAX_SECS,
    )?;
    let pause = secs("pause", args.pause.or(file.pause).unwrap_or(0.0), MAX_SECS)?;
    let start_delay = secs(
        "start-delay",
        args.start_delay.or(file.start_delay).unwrap_or(0.0),
        MAX_SECS,
    )?;
    let duration = opt_secs(
        "duration",
        args.duration.or(file.duration),
        MAX_DURATION_SECS,
    )?;
    if duration.is_some_and(|d| d.is_zero()) {
        bail!("--duration must be positive");
    }
    let cut_at_deadline = args.cut_at_deadline || file.cut_at_deadline.unwrap_or(false);
    if cut_at_deadline && duration.is_none() {
        bail!("--cut-at-deadline needs --duration");
    }
    let think_mean = opt_secs("think-mean", args.think_mean.or(file.think_mean), MAX_SECS)?;
    let think = match (args.think.or(file.think), think_mean) {
        (Some(_), None) => bail!("--think needs --think-mean"),
        (None, Some(_)) => Some(Think::Exp),
        (t, _) => t,
    };
    let progress = opt_secs("progress", args.progress.or(file.progress), MAX_SECS)?;
    if progress.is_some_and(|p| p.as_secs_f64() < MIN_PROGRESS_SECS) {
        bail!("--progress must be at least {MIN_PROGRESS_SECS} seconds");
    }
    let parallel = args.parallel.or(file.parallel).unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        bail!("--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}");
    }
    let label = args.label.or(file.label);
    if label
        .as_ref()
        .is_some_and(|l| l.is_empty() || l.len() > MAX_LABEL)
    {
        bail!("--label must be 1 to {MAX_LABEL} bytes");
    }
    let user = args.socks_user.or(file.socks_user);
    let pass = args.socks_pass.or(file.socks_pass);
    let isolate = args.isolate || file.isolate.unwrap_or(false);
    if pass.is_some() && user.is_none() && !isolate {
        bail!("--socks-pass needs --socks-user or --isolate");
    }
    // RFC 1929 encodes each length in one byte.
    if user.as_ref().is_some_and(|u| u.is_empty() || u.len() > 255) {
        bail!("--socks-user must be 1 to 255 bytes");
    }
    if pass.as_ref().is_some_and(|p| p.len() > 255) {
        bail!("--socks-pass must be at most 255 bytes");
    }
    let method = args.method.or(file.method).unwrap_or(HttpMethod::Get);
    let upload_bytes = args.upload_bytes.or(file.upload_bytes);
    if upload_bytes.is_some() && method != HttpMethod::Post {
        bail!("--upload-bytes needs --method post");
    }
    // A run bounded by time is unbounded in count unless told otherwise.
    let default_count = if duration.is_some() { 0 } else { 1 };
    Ok(Settings {
        socks: args
            .socks
            .or(file.socks)
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9050))),
        url_text,
        url,
        count: args.count.or(file.count).unwrap_or(default_count),
        duration,
        cut_at_deadline,
        interval,
        pause,
        think,
        think_mean: think_mean.unwrap_or(Duration::ZERO),
        seed: args.seed.or(file.seed).unwrap_or_else(clock_seed),
        start_delay,
        parallel,
        progress,
        label,
        user,
        pass: pass.unwrap_or_default(),
        isolate,
        timeout,
        method,
        upload_bytes: upload_bytes.unwrap_or(0),
        verify: args.verify || file.verify.unwrap_or(false),
        log: args.log.or(file.log).unwrap_or_else(|| "warn".into()),
    })
}

/// A seed from the wall clock, for runs without `--seed`.
fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

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

/// A cancellation token: once cancelled, every transfer loop stops and a
/// transfer in flight is recorded as "interrupted". `run` cancels it on
/// SIGTERM/SIGINT; tests cancel it directly.
#[derive(Clone, Debug)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
}

impl Cancel {
    /// A token that is not cancelled yet.
    pub fn new() -> Self {
        Cancel {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Cancel; idempotent.
    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    /// Whether `cancel` was called.
    pub fn is_cancelled(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once cancelled (at once if already).
    pub async fn cancelled(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so this only returns when cancelled.
        let _ = rx.wait_for(|c| *c).await;
    }
}

/// Everything the transfer loops share.
struct Shared {
    settings: Settings,
    clock: Clock,
    cancel: Cancel,
    /// End of `--duration`: no transfer starts at or after it.
    deadline: Option<Instant>,
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
enum Ending {
    Done,
    Failed,
    Cut,
    Interrupted,
}

/// Run `chive perf`. Returns an error (exit code 1) if any completed transfer
/// failed; failed transfers never stop the sequence. SIGTERM or SIGINT stop it
/// cleanly; a second signal exits at once.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let settings = settings(*args.opts)?;
    init_logging(&settings.log);
    tracing::info!("think-time seed {}", settings.seed);
    let cancel = Cancel::new();
    let on_signal = cancel.clone();
    // Register the handlers before the first transfer, so an early SIGTERM is caught too.
    let signals = signals();
    let watcher = tokio::spawn(async move {
        match signals {
            Ok(mut next) => {
                let Some(name) = next.recv().await else {
                    return;
                };
                tracing::info!("{name} received: finishing the records");
                on_signal.cancel();
                if next.recv().await.is_some() {
                    eprintln!("chive perf: second signal, exiting at once");
                    std::process::exit(1);
                }
            }
            Err(e) => tracing::warn!("cannot watch SIGTERM/SIGINT: {e}"),
        }
    });
    let result = run_transfers(settings, &mut std::io::stdout(), cancel).await;
    watcher.abort();
    result
}

/// A stream of the names of received SIGTERM/SIGINT signals.
#[cfg(unix)]
fn signals() -> std::io::Result<mpsc::Receiver<&'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                Some(()) = term.recv() => "SIGTERM",
                Some(()) = int.recv() => "SIGINT",
                else => return,
            };
            if tx.send(name).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// A stream of Ctrl-C events.
#[cfg(not(unix))]
fn signals() -> std::io::Result<mpsc::Receiver<&'static str>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send("Ctrl-C").await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Run every transfer loop, writing their JSON lines to `out` as they come.
/// Returns an error if a completed transfer failed or `out` cannot be written.
async fn run_transfers(
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

/// What identifies a transfer in its records.
#[derive(Debug, Clone)]
struct Tag {
    class: Option<String>,
    loop_index: u32,
    seq: u64,
}

/// Run one transfer under its timeout, the deadline (with `--cut-at-deadline`)
/// and cancellation, emitting progress lines to `progress` if given. Never
/// fails: errors go in the record.
async fn guarded_transfer(
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

/// Wall-clock UNIX time that never goes backwards: the wall clock is read once,
/// then advanced by a monotonic clock, so recorded events stay ordered.
#[derive(Debug, Clone, Copy)]
struct Clock {
    base_us: u64,
    base: std::time::Instant,
}

impl Clock {
    fn new() -> Self {
        let base_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Clock {
            base_us,
            base: std::time::Instant::now(),
        }
    }

    /// UNIX seconds with microsecond precision.
    fn now(&self) -> f64 {
        let us = self.base_us + self.base.elapsed().as_micros() as u64;
        us as f64 / 1e6
    }
}

/// The outcome of one transfer: one JSON line with "type": "transfer".
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Record {
    /// Always "transfer".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `--label`, or null.
    pub class: Option<String>,
    /// Index of the transfer loop (0..`--parallel`).
    #[serde(rename = "loop")]
    pub loop_index: u32,
    /// Sequence number of the transfer within its loop (0, 1, ...).
    pub seq: u64,
    /// The URL fetched.
    pub url: String,
    /// When the transfer began.
    pub start: f64,
    /// TCP connection to the SOCKS proxy established.
    pub socket_connected: Option<f64>,
    /// SOCKS handshake succeeded (the stream through the overlay is open).
    pub socks_connected: Option<f64>,
    /// The whole HTTP request (including any upload body) was written.
    pub request_sent: Option<f64>,
    /// The first response byte arrived.
    pub first_byte: Option<f64>,
    /// The last body byte arrived.
    pub last_byte: Option<f64>,
    /// Body bytes received (GET) or uploaded (POST).
    pub bytes: u64,
    /// Response Content-Length (GET) or upload size (POST).
    pub expected_bytes: Option<u64>,
    /// HTTP status code.
    pub status: Option<u16>,
    /// Why the transfer failed or stopped ("timeout", "cut at deadline",
    /// "interrupted", or the failure), if it did.
    pub error: Option<String>,
    /// SOCKS username used.
    pub socks_user: Option<String>,
    /// Size in [`PARTIAL_SIZES`] (a JSON string key) -> UNIX time when that many
    /// body bytes had arrived (GET) or been sent (POST), or null if never. Only
    /// sizes up to the transfer's size (Content-Length or upload size; the bytes
    /// received when the length is unknown).
    pub partials: BTreeMap<u64, Option<f64>>,
    /// Arrival times of the [`PARTIAL_SIZES`], filled as bytes arrive.
    #[serde(skip)]
    reached: [Option<f64>; PARTIAL_SIZES.len()],
}

impl Record {
    /// A record for a transfer starting at `start`; nothing reached yet.
    fn new(tag: &Tag, url: String, start: f64, socks_user: Option<String>) -> Self {
        Record {
            kind: "transfer",
            class: tag.class.clone(),
            loop_index: tag.loop_index,
            seq: tag.seq,
            url,
            start,
            socket_connected: None,
            socks_connected: None,
            request_sent: None,
            first_byte: None,
            last_byte: None,
            bytes: 0,
            expected_bytes: None,
            status: None,
            error: None,
            socks_user,
            partials: BTreeMap::new(),
            reached: [None; PARTIAL_SIZES.len()],
        }
    }

    /// Publish the partial times for sizes up to `size` (or up to the bytes
    /// counted, if the size is unknown).
    fn fill_partials(&mut self, size: Option<u64>) {
        let size = size.unwrap_or(self.bytes);
        self.partials = PARTIAL_SIZES
            .iter()
            .zip(self.reached)
            .filter(|(&n, _)| n <= size)
            .map(|(&n, t)| (n, t))
            .collect();
    }
}

/// A progress line: cumulative bytes of the running transfer at time `t`.
#[derive(Serialize, Debug)]
pub struct ProgressRecord<'a> {
    /// Always "progress".
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `--label`, or null.
    pub class: Option<&'a str>,
    /// Index of the transfer loop.
    #[serde(rename = "loop")]
    pub loop_index: u32,
    /// UNIX time of the sample.
    pub t: f64,
    /// Body bytes of this transfer so far (received for GET, sent for POST).
    pub bytes: u64,
    /// `seq` of the transfer.
    pub transfer: u64,
}

/// Counts body bytes as they move: into the record (with partial times) and
/// into `live`, which the progress ticker reads while the transfer runs.
#[derive(Clone, Copy)]
struct Tally<'a> {
    clock: &'a Clock,
    live: &'a AtomicU64,
}

impl Tally<'_> {
    /// `total` body bytes have now arrived (or been sent).
    fn count(&self, rec: &mut Record, total: u64) {
        rec.bytes = total;
        self.live.store(total, Ordering::Relaxed);
        let mut now = None;
        for (slot, &n) in rec.reached.iter_mut().zip(PARTIAL_SIZES.iter()) {
            if slot.is_none() && total >= n {
                *slot = Some(*now.get_or_insert_with(|| self.clock.now()));
            }
        }
    }
}

/// The transfer itself; fills `rec` as it goes so a timeout or stop keeps the partial record.
async fn attempt(
    settings: &Settings,
    tally: Tally<'_>,
    creds: Option<(String, String)>,
    rec: &mut Record,
) -> Result<(), String> {
    let clock = tally.clock;
    let mut s = TcpStream::connect(settings.socks)
        .await
        .map_err(|e| format!("socks: cannot connect to proxy: {}", e.kind()))?;
    let _ = s.set_nodelay(true);
    rec.socket_connected = Some(clock.now());

    socks5_connect(&mut s, &settings.url, creds.as_ref()).await?;
    rec.socks_connected = Some(clock.now());

    let upload_digest = send_request(&mut s, settings, tally, rec).await?;
    rec.request_sent = Some(clock.now());

    let mut conn = Conn {
        s: &mut s,
        buf: Vec::new(),
    };
    let head = loop {
        let head = conn.read_head(clock, rec).await?;
        // Skip interim 1xx responses (e.g. an unsolicited 100 Continue).
        if !(100..200).contains(&head.status) {
            break head;
        }
    };
    rec.status = Some(head.status);
    let is_get = settings.method == HttpMethod::Get;
    if is_get {
        rec.expected_bytes = head.content_length;
    }
    let mut sink = Sink {
        received: 0,
        verify: settings.verify && is_get && (200..300).contains(&head.status),
        capture: Vec::new(),
        count_into_record: is_get,
        tally,
    };
    conn.read_body(&head, &mut sink, rec).await?;
    rec.last_byte = Some(clock.now());

    if !(200..300).contains(&head.status) {
        return Err(format!("http: status {}", head.status));
    }
    if let (true, Some(digest)) = (settings.verify, upload_digest) {
        check_upload_reply(&sink.capture, settings.upload_bytes, &digest)?;
    }
    Ok(())
}

async fn socks5_connect(
    s: &mut TcpStream,
    url: &HttpUrl,
    creds: Option<&(String, String)>,
) -> Result<(), String> {
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "socks: proxy closed the connection".to_string()
        } else {
            format!("socks: {}", e.kind())
        }
    };
    // Offer only user/pass when we have credentials: isolation must not
    // silently degrade to no-auth.
    let method = if creds.is_some() { 0x02 } else { 0x00 };
    s.write_all(&[5, 1, method]).await.map_err(io)?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.map_err(io)?;
    if choice[0] != 5 {
        return Err(format!("socks: bad reply version {}", choice[0]));
    }
    if choice[1] != method {
        return Err("socks: no acceptable authentication method".into());
    }
    if let Some((user, pass)) = creds {
        let mut msg = Vec::with_capacity(3 + user.len() + pass.len());
        msg.push(1);
        msg.push(u8::try_from(user.len()).map_err(|_| "socks: username too long")?);
        msg.extend_from_slice(user.as_bytes());
        msg.push(u8::try_from(pass.len()).map_err(|_| "socks: password too long")?);
        msg.extend_from_slice(pass.as_bytes());
        s.write_all(&msg).await.map_err(io)?;
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.map_err(io)?;
        if status[1] != 0 {
            return Err("socks: authentication failed".into());
        }
    }
    let mut req = vec![5, 1, 0];
    match &url.host {
        UrlHost::Ip(IpAddr::V4(ip)) => {
            req.push(1);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Ip(IpAddr::V6(ip)) => {
            req.push(4);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Name(name) => {
            req.push(3);
            // parse_url bounds names to 255 bytes.
            req.push(u8::try_from(name.len()).map_err(|_| "socks: hostname too long")?);
            req.extend_from_slice(name.as_bytes());
        }
    }
    req.extend_from_slice(&url.port.to_be_bytes());
    s.write_all(&req).await.map_err(io)?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(io)?;
    if head[0] != 5 {
        return Err(format!("socks: bad reply version {}", head[0]));
    }
    if head[1] != 0 {
        return Err(format!("socks: {}", socks5_reply_text(head[1])));
    }
    // Skip BND.ADDR and BND.PORT.
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => usize::from(s.read_u8().await.map_err(io)?),
        other => return Err(format!("socks: bad address type {other} in reply")),
    };
    let mut skip = [0u8; 255 + 2];
    s.read_exact(&mut skip[..addr_len + 2]).await.map_err(io)?;
    Ok(())
}

/// Human text for a SOCKS5 REP code (RFC 1928 section 6).
fn socks5_reply_text(code: u8) -> String {
    match code {
        1 => "general failure".into(),
        2 => "connection not allowed by ruleset".into(),
        3 => "network unreachable".into(),
        4 => "host unreachable".into(),
        5 => "connection refused".into(),
        6 => "TTL expired".into(),
        7 => "command not supported".into(),
        8 => "address type not supported".into(),
        other => format!("reply code {other}"),
    }
}

/// Write the request (and for POST, the pattern body, hashed as it goes).
/// Write the request (and for POST, the pattern body, hashed as it goes).
/// Returns the upload's SHA-256 for POST.
async fn send_request(
    s: &mut TcpStream,
    settings: &Settings,
    tally: Tally<'_>,
    rec: &mut Record,
) -> Result<Option<[u8; 32]>, String> {
    let io = |e: std::io::Error| format!("http: write failed: {}", e.kind());
    let url = &settings.url;
    let mut head = match settings.method {
        HttpMethod::Get => format!("GET {} HTTP/1.1\r\n", url.path),
        HttpMethod::Post => format!(
            "POST {} HTTP/1.1\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n",
            url.path, settings.upload_bytes
        ),
    };
    head.push_str(&format!(
        "Host: {}\r\nUser-Agent: chive-perf\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.authority
    ));
    s.write_all(head.as_bytes()).await.map_err(io)?;
    let digest = if settings.method == HttpMethod::Post {
        rec.expected_bytes = Some(settings.upload_bytes);
        let pat = pattern();
        let mut hasher = Sha256::new();
        let mut sent: u64 = 0;
        while sent < settings.upload_bytes {
            // End a write at each partial size, so its time is taken when
            // exactly that many bytes have been handed to the socket.
            let to_mark = PARTIAL_SIZES
                .iter()
                .find(|&&n| n > sent)
                .map_or(u64::MAX, |&n| n - sent);
            let len = (settings.upload_bytes - sent)
                .min(CHUNK as u64)
                .min(to_mark) as usize;
            let phase = (sent % PERIOD) as usize;
            let chunk = pat
                .get(phase..phase + len)
                .ok_or("internal: pattern slice")?;
            s.write_all(chunk).await.map_err(io)?;
            hasher.update(chunk);
            sent += len as u64;
            tally.count(rec, sent);
        }
        Some(hasher.finalize().into())
    } else {
        None
    };
    s.flush().await.map_err(io)?;
    Ok(digest)
}

/// For `--verify` with POST: the server's `{"bytes", "sha256"}` must match what was sent.
fn check_upload_reply(body: &[u8], sent: u64, digest: &[u8; 32]) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Reply {
        bytes: u64,
        sha256: String,
    }
    let reply: Reply = serde_json::from_slice(body)
        .map_err(|_| "verify: upload reply is not {\"bytes\", \"sha256\"} JSON".to_string())?;
    if reply.bytes != sent {
        return Err(format!(
            "verify: server received {} bytes, sent {sent}",
            reply.bytes
        ));
    }
    if !reply.sha256.eq_ignore_ascii_case(&hex::encode(digest)) {
        return Err("verify: upload digest mismatch".into());
    }
    Ok(())
}

/// Where body bytes go: counted, optionally verified, the first few KiB kept.
struct Sink<'a> {
    received: u64,
    verify: bool,
    capture: Vec<u8>,
    /// GET counts body bytes in the record; POST reports uploaded bytes instead.
    count_into_record: bool,
    tally: Tally<'a>,
}

impl Sink<'_> {
    fn feed(&mut self, data: &[u8], rec: &mut Record) -> Result<(), String> {
        if self.verify {
            if let Some(at) = first_mismatch(self.received, data) {
                return Err(format!("verify: mismatch at byte {at}"));
            }
        }
        let room = MAX_CAPTURE.saturating_sub(self.capture.len());
        self.capture
            .extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
        self.received += data.len() as u64;
        if self.count_into_record {
            self.tally.count(rec, self.received);
        }
        Ok(())
    }
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    content_length: Option<u64>,
    chunked: bool,
}

/// Parse a response head (everything before the blank line).
fn parse_head(raw: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "http: response head is not text")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !(version == "HTTP/1.1" || version == "HTTP/1.0")
        || code.len() != 3
        || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return Err("http: bad status line".into());
    }
    let status: u16 = code.parse().map_err(|_| "http: bad status line")?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or("http: bad header line")?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: u64 = value
                .parse()
                .map_err(|_| "http: bad Content-Length".to_string())?;
            if content_length.is_some_and(|old| old != n) {
                return Err("http: conflicting Content-Length".into());
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    if chunked {
        // RFC 9112 6.3: Transfer-Encoding overrides Content-Length.
        content_length = None;
    }
    Ok(Head {
        status,
        content_length,
        chunked,
    })
}

/// A response being read: the stream plus bytes read but not yet consumed.
struct Conn<'a> {
    s: &'a mut TcpStream,
    buf: Vec<u8>,
}

impl Conn<'_> {
    /// Read more bytes into `buf`; Ok(0) at EOF.
    async fn fill(&mut self) -> Result<usize, String> {
        self.buf.reserve(CHUNK);
        self.s
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| format!("http: read failed: {}", e.kind()))
    }

    /// Read and parse one response head; records the first byte's arrival.
    async fn read_head(&mut self, clock: &Clock, rec: &mut Record) -> Result<Head, String> {
        let mut searched = 0usize;
        loop {
            // Resume the search a little before where it stopped, in case the
            // terminator straddles two reads.
            let from = searched.saturating_sub(3);
            if let Some(p) = find(self.buf.get(from..).unwrap_or_default(), b"\r\n\r\n") {
                let end = from + p;
                let head = parse_head(self.buf.get(..end).unwrap_or_default())?;
                self.buf.drain(..end + 4);
                return Ok(head);
            }
            searched = self.buf.len();
            if self.buf.len() > MAX_HEAD {
                return Err("http: response head too large".into());
            }
            let n = self.fill().await?;
            if n == 0 {
                return Err(if rec.first_byte.is_none() {
                    "http: connection closed before a response".into()
                } else {
                    "http: connection closed in the response head".into()
                });
            }
            if rec.first_byte.is_none() {
                rec.first_byte = Some(clock.now());
            }
        }
    }

    /// Read the body as the head describes it, feeding `sink`.
    async fn read_body(
        &mut self,
        head: &Head,
        sink: &mut Sink<'_>,
        rec: &mut Record,
    ) -> Result<(), String> {
        if head.status == 204 || head.status == 304 {
            return Ok(());
        }
        if head.chunked {
            return self.read_chunked(sink, rec).await;
        }
        let limit = head.content_length;
        loop {
            let take = match limit {
                Some(len) => (len - sink.received).min(self.buf.len() as u64) as usize,
                None => self.buf.len(),
            };
            // Feed in place: the buffer is reused, never grown past one read.
            sink.feed(self.buf.get(..take).unwrap_or_default(), rec)?;
            if limit == Some(sink.received) {
                return Ok(());
            }
            self.buf.clear();
            if self.fill().await? == 0 {
                return match limit {
                    None => Ok(()),
                    Some(len) => Err(format!(
                        "http: connection closed after {} of {len} body bytes",
                        sink.received
                    )),
                };
            }
        }
    }

    /// Read a CRLF-terminated line (without the CRLF), bounded by MAX_LINE.
    async fn read_line(&mut self) -> Result<String, String> {
        loop {
            if let Some(p) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8(self.buf.drain(..p).collect())
                    .map_err(|_| "http: bad chunked encoding")?;
                self.buf.drain(..2);
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err("http: bad chunked encoding (line too long)".into());
            }
            if self.fill().await? == 0 {
                return Err("http: connection closed in a chunked body".into());
            }
        }
    }

    /// Decode `Transfer-Encoding: chunked` (RFC 9112 section 7.1).
    async fn read_chunked(&mut self, sink: &mut Sink<'_>, rec: &mut Record) -> Result<(), String> {
        loop {
            let line = self.read_line().await?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            if size_text.is_empty() || size_text.len() > 16 {
                return Err("http: bad chunk size".into());
            }
            let mut left =
                u64::from_str_radix(size_text, 16).map_err(|_| "http: bad chunk size")?;
            if left == 0 {
                // Trailer section, ended by an empty line.
                while !self.read_line().await?.is_empty() {}
                return Ok(());
            }
            while left > 0 {
                if self.buf.is_empty() && self.fill().await? == 0 {
                    return Err("http: connection closed in a chunked body".into());
                }
                let take = left.min(self.buf.len() as u64) as usize;
                sink.feed(self.buf.get(..take).unwrap_or_default(), rec)?;
                self.buf.drain(..take);
                left -= take as u64;
            }
            if !self.read_line().await?.is_empty() {
                return Err("http: bad chunked encoding (missing CRLF)".into());
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The host part of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UrlHost {
    Ip(IpAddr),
    Name(String),
}

/// An `http://` URL, split for the SOCKS request and the HTTP request line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpUrl {
    host: UrlHost,
    port: u16,
    /// `host[:port]` as written, for the Host header.
    authority: String,
    /// Path and query, starting with '/'.
    path: String,
}

/// Parse `http://HOST[:PORT][/PATH][?QUERY][#FRAGMENT]`.
fn parse_url(url: &str) -> Result<HttpUrl, &'static str> {
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .and_then(|_| url.get(7..))
        .ok_or("only http:// URLs are supported")?;
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if path.bytes().any(|b| b <= b' ' || b == 0x7F) {
        return Err("the path must not contain spaces or control characters");
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    if authority.contains('@') {
        return Err("user info in URLs is not supported");
    }
    let (host_text, port_text) = if let Some(inner) = authority.strip_prefix('[') {
        let (v6, after) = inner.split_once(']').ok_or("unterminated [IPv6] host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after [IPv6] host")?),
        };
        let ip: std::net::Ipv6Addr = v6.parse().map_err(|_| "bad IPv6 address")?;
        (UrlHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let host = if let Ok(ip) = h.parse::<std::net::Ipv4Addr>() {
            UrlHost::Ip(IpAddr::V4(ip))
        } else {
            if h.is_empty() || h.len() > 255 {
                return Err("the host must be 1 to 255 characters");
            }
            if !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            {
                return Err("bad character in host name");
            }
            UrlHost::Name(h.to_ascii_lowercase())
        };
        (host, p)
    };
    let port = match port_text {
        None => 80,
        // Digits only: u16::from_str would also take a leading '+'.
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(p) if p != 0 => p,
                _ => return Err("bad port"),
            }
        }
        Some(_) => return Err("bad port"),
    };
    Ok(HttpUrl {
        host: host_text,
        port,
        authority: authority.to_string(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_client::socks::{accept_socks, send_reply, SocksReply, SocksRequest, TargetAddr};
    use serde_json::Value;
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use tokio::net::TcpListener;

    /// One transfer with no loop around it: no deadline, no cancellation, no progress.
    async fn transfer(s: &Settings, clock: &Clock, user: Option<String>) -> Record {
        let shared = Shared {
            settings: s.clone(),
            clock: *clock,
            cancel: Cancel::new(),
            deadline: None,
        };
        let tag = Tag {
            class: None,
            loop_index: 0,
            seq: 0,
        };
        guarded_transfer(&shared, tag, user, None).await.0
    }

    /// Run the loops into a buffer; the outcome and every JSON line.
    async fn run_collect(s: Settings, cancel: Cancel) -> (anyhow::Result<()>, Vec<Value>) {
        let mut out = Vec::new();
        let r = run_transfers(s, &mut out, cancel).await;
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (r, lines)
    }

    /// The records of one "type".
    fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
        lines.iter().filter(|v| v["type"] == kind).collect()
    }

    fn f(v: &Value) -> f64 {
        v.as_f64().unwrap()
    }

    /// An HTTP server that sends `total` pattern bytes (with Content-Length),
    /// `piece` bytes every `every`, so transfers take a known time.
    async fn start_slow(total: usize, piece: usize, every: Duration) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 1024];
                    while find(&buf, b"\r\n\r\n").is_none() {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n");
                    if s.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let body: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
                    for c in body.chunks(piece) {
                        if s.write_all(c).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(every).await;
                    }
                });
            }
        });
        a
    }

    async fn start_httpd() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(chive_tools::httpd::serve(l));
        a
    }

    type Seen = Arc<Mutex<Vec<SocksRequest>>>;

    /// A tiny SOCKS server: accept_socks, then a direct TCP connect. Every domain
    /// maps to 127.0.0.1 (so tests also prove names are sent unresolved).
    async fn start_socks() -> (SocketAddr, Seen) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let seen2 = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let seen = seen2.clone();
                tokio::spawn(async move {
                    let Ok(req) = accept_socks(&mut s).await else {
                        return;
                    };
                    seen.lock().unwrap().push(req.clone());
                    let target = match &req.target {
                        TargetAddr::Ip(a) => *a,
                        TargetAddr::Domain(_, p) => SocketAddr::from(([127, 0, 0, 1], *p)),
                    };
                    match TcpStream::connect(target).await {
                        Ok(mut up) => {
                            let bound = up.local_addr().ok();
                            send_reply(&mut s, &req, SocksReply::Succeeded, bound)
                                .await
                                .unwrap();
                            let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                        }
                        Err(_) => {
                            let _ =
                                send_reply(&mut s, &req, SocksReply::ConnectionRefused, None).await;
                        }
                    }
                });
            }
        });
        (a, seen)
    }

    /// A one-shot raw HTTP server that reads a request head, then sends `reply` and closes.
    async fn start_raw(reply: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 1024];
                    while find(&buf, b"\r\n\r\n").is_none() {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let _ = s.write_all(reply).await;
                });
            }
        });
        a
    }

    fn base(socks: SocketAddr, url: String) -> Settings {
        Settings {
            socks,
            url: parse_url(&url).unwrap(),
            url_text: url,
            count: 1,
            duration: None,
            cut_at_deadline: false,
            interval: Duration::ZERO,
            pause: Duration::ZERO,
            think: None,
            think_mean: Duration::ZERO,
            seed: 1,
            start_delay: Duration::ZERO,
            parallel: 1,
            progress: None,
            label: None,
            user: None,
            pass: String::new(),
            isolate: false,
            timeout: Duration::from_secs(20),
            method: HttpMethod::Get,
            upload_bytes: 0,
            verify: true,
            log: "warn".into(),
        }
    }

    fn assert_monotonic(r: &Record) {
        let times = [
            Some(r.start),
            r.socket_connected,
            r.socks_connected,
            r.request_sent,
            r.first_byte,
            r.last_byte,
        ];
        let times: Vec<f64> = times
            .iter()
            .map(|t| t.expect("all times reached"))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        // Sanity: near the real clock.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - r.start).abs() < 60.0);
    }

    #[tokio::test]
    async fn get_through_socks_with_hostname() {
        let http = start_httpd().await;
        let (socks, seen) = start_socks().await;
        let url = format!("http://LocalHost:{}/bytes/1000000", http.port());
        let r = transfer(&base(socks, url.clone()), &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.status, Some(200));
        assert_eq!(r.bytes, 1_000_000);
        assert_eq!(r.expected_bytes, Some(1_000_000));
        assert_eq!(r.url, url);
        assert_eq!(r.socks_user, None);
        assert_monotonic(&r);
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen[0].target,
            TargetAddr::Domain("localhost".into(), http.port())
        );
        assert_eq!(seen[0].auth, None);
    }

    #[tokio::test]
    async fn post_upload_counts_and_verifies() {
        let http = start_httpd().await;
        let (socks, _) = start_socks().await;
        let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
        s.method = HttpMethod::Post;
        s.upload_bytes = 300_001;
        let r = transfer(&s, &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.bytes, 300_001);
        assert_eq!(r.expected_bytes, Some(300_001));
        assert_eq!(r.status, Some(200));
        assert_monotonic(&r);
    }

    #[tokio::test]
    async fn http_404_is_an_error_record() {
        let http = start_httpd().await;
        let (socks, _) = start_socks().await;
        let r = transfer(
            &base(socks, format!("http://127.0.0.1:{}/nope", http.port())),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("http: status 404"));
        assert_eq!(r.status, Some(404));
        assert!(r.last_byte.is_some());
    }

    #[tokio::test]
    async fn unreachable_socks_port_gives_error_record() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let r = transfer(
            &base(dead, "http://127.0.0.1:1/bytes/1".into()),
            &Clock::new(),
            None,
        )
        .await;
        let e = r.error.unwrap();
        assert!(e.starts_with("socks: cannot connect to proxy"), "{e}");
        assert_eq!(r.socket_connected, None);
        assert_eq!(r.bytes, 0);
    }

    #[tokio::test]
    async fn socks_refusal_is_reported() {
        let (socks, _) = start_socks().await;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let r = transfer(
            &base(socks, format!("http://{dead}/bytes/1")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("socks: connection refused"));
        assert!(r.socket_connected.is_some());
        assert_eq!(r.socks_connected, None);
    }

    #[tokio::test]
    async fn credentials_and_isolation_reach_the_proxy() {
        let http = start_httpd().await;
        let (socks, seen) = start_socks().await;
        let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/10", http.port()));
        s.pass = "pw".into();
        let clock = Clock::new();
        let a = transfer(&s, &clock, Some("alice".into())).await;
        let b = transfer(&s, &clock, Some("bob".into())).await;
        assert_eq!((a.error, b.error), (None, None));
        assert!(b.start >= a.last_byte.unwrap());
        assert_eq!(a.socks_user.as_deref(), Some("alice"));
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].auth, Some((b"alice".to_vec(), b"pw".to_vec())));
        assert_eq!(seen[1].auth, Some((b"bob".to_vec(), b"pw".to_vec())));
    }

    #[tokio::test]
    async fn verify_detects_mismatch_and_truncation() {
        let (socks, _) = start_socks().await;
        let bad =
            start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n\x00\x01\x02\x09\x04").await;
        let r = transfer(
            &base(socks, format!("http://{bad}/bytes/5")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("verify: mismatch at byte 3"));
        let short =
            start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n\x00\x01\x02\x03").await;
        let r = transfer(
            &base(socks, format!("http://{short}/bytes/10")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(
            r.error.as_deref(),
            Some("http: connection closed after 4 of 10 body bytes")
        );
        assert_eq!(r.bytes, 4);
        assert_eq!(r.last_byte, None);
    }

    #[tokio::test]
    async fn chunked_and_eof_delimited_bodies() {
        let (socks, _) = start_socks().await;
        let chunked = start_raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n\x00\x01\r\n3\r\n\x02\x03\x04\r\n0\r\nX-T: 1\r\n\r\n",
        )
        .await;
        let r = transfer(
            &base(socks, format!("http://{chunked}/")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error, None);
        assert_eq!((r.bytes, r.expected_bytes), (5, None));
        // Unknown length: only sizes reached are reported, here none.
        assert!(r.partials.is_empty());
        let eof = start_raw(b"HTTP/1.0 200 OK\r\n\r\n\x00\x01\x02").await;
        let r = transfer(&base(socks, format!("http://{eof}/")), &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.bytes, 3);
        let garbage = start_raw(b"SSH-2.0-OpenSSH\r\n\r\n").await;
        let r = transfer(
            &base(socks, format!("http://{garbage}/")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("http: bad status line"));
    }

    #[tokio::test]
    async fn timeout_keeps_partial_record() {
        // A "proxy" that accepts and never answers.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = l.accept().await.unwrap();
                held.push(s);
            }
        });
        let mut s = base(a, "http://127.0.0.1:1/".into());
        s.timeout = Duration::from_millis(200);
        let r = transfer(&s, &Clock::new(), None).await;
        assert_eq!(r.error.as_deref(), Some("timeout"));
        assert!(r.socket_connected.is_some());
        assert_eq!(r.socks_connected, None);
    }

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

    #[test]
    fn url_parsing() {
        let u = parse_url("http://example.com:8080/a/b?c=d#frag").unwrap();
        assert_eq!(u.host, UrlHost::Name("example.com".into()));
        assert_eq!(
            (u.port, u.authority.as_str(), u.path.as_str()),
            (8080, "example.com:8080", "/a/b?c=d")
        );
        let u = parse_url("HTTP://10.0.0.1").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("10.0.0.1".parse().unwrap()), 80, "/")
        );
        let u = parse_url("http://[::1]:81?q").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("::1".parse().unwrap()), 81, "/?q")
        );
        for bad in [
            "https://x/",
            "ftp://x",
            "http://",
            "http://a b/",
            "http://x:0/",
            "http://x:99999/",
            "http://x:/",
            "http://u@x/",
            "http://[::1/",
            "http://[zz]/",
            "http://x/a b",
            "http://x:+80/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn head_parsing() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y").unwrap();
        assert_eq!(
            h,
            Head {
                status: 200,
                content_length: Some(12),
                chunked: false
            }
        );
        let h = parse_head(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\nTransfer-Encoding: gzip, chunked",
        )
        .unwrap();
        assert_eq!(
            h,
            Head {
                status: 404,
                content_length: None,
                chunked: true
            }
        );
        for bad in [
            &b"HTTP/2 200 OK"[..],
            b"HTTP/1.1 20 OK",
            b"HTTP/1.1 abc",
            b"HTTP/1.1 200 OK\r\nnocolon",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
            b"\xff\xfe",
        ] {
            assert!(
                parse_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn settings_merge_file_and_flags() {
        let dir = std::env::temp_dir().join(format!("chive-perf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf.toml");
        std::fs::write(
            &path,
            "url = \"http://a/\"\ncount = 5\nsocks_user = \"u\"\nmethod = \"post\"\nupload_bytes = 7\nverify = true\n",
        )
        .unwrap();
        let s = settings(Options {
            config: Some(path.clone()),
            count: Some(2),
            ..Options::default()
        })
        .unwrap();
        assert_eq!(
            (
                s.count,
                s.user.as_deref(),
                s.method,
                s.upload_bytes,
                s.verify
            ),
            (2, Some("u"), HttpMethod::Post, 7, true)
        );
        assert_eq!(s.socks, "127.0.0.1:9050".parse().unwrap());
        assert_eq!(s.timeout, Duration::from_secs(60));
        std::fs::write(&path, "url = \"http://a/\"\nbogus = 1\n").unwrap();
        assert!(settings(Options {
            config: Some(path.clone()),
            ..Options::default()
        })
        .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(settings(Options::default()).is_err());
        let url = Some("http://a/".to_string());
        assert!(settings(Options {
            url: url.clone(),
            timeout: Some(0.0),
            ..Options::default()
        })
        .is_err());
        assert!(settings(Options {
            url: url.clone(),
            interval: Some(f64::NAN),
            ..Options::default()
        })
        .is_err());
        assert!(settings(Options {
            url: url.clone(),
            upload_bytes: Some(1),
            ..Options::default()
        })
        .is_err());
        assert!(settings(Options {
            url,
            socks_pass: Some("p".into()),
            ..Options::default()
        })
        .is_err());
    }

    #[tokio::test]
    async fn partials_are_monotonic_and_only_for_reached_sizes() {
        let http = start_httpd().await;
        let (socks, _) = start_socks().await;
        let r = transfer(
            &base(
                socks,
                format!("http://127.0.0.1:{}/bytes/600000", http.port()),
            ),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error, None);
        let keys: Vec<u64> = r.partials.keys().copied().collect();
        assert_eq!(keys, PARTIAL_SIZES[..6]);
        let times: Vec<f64> = r.partials.values().map(|t| t.unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        assert!(times[0] >= r.first_byte.unwrap());
        assert!(times[5] <= r.last_byte.unwrap());
        // In JSON the sizes are string keys; sizes above the transfer are absent.
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["partials"]["512000"].is_f64());
        assert!(v["partials"].get("1048576").is_none());

        // A size exactly on a boundary includes that boundary.
        let r = transfer(
            &base(
                socks,
                format!("http://127.0.0.1:{}/bytes/51200", http.port()),
            ),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(
            r.partials.keys().copied().collect::<Vec<_>>(),
            [10_240, 20_480, 51_200]
        );
        assert!(r.partials.values().all(|t| t.is_some()));

        // A truncated body: sizes within Content-Length but never reached are null.
        let mut reply = b"HTTP/1.1 200 OK\r\nContent-Length: 30000\r\n\r\n".to_vec();
        reply.extend((0..15_000u64).map(|i| (i % 251) as u8));
        let short = start_raw(Box::leak(reply.into_boxed_slice())).await;
        let r = transfer(
            &base(socks, format!("http://{short}/bytes/30000")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.bytes, 15_000);
        assert!(r.error.unwrap().contains("15000 of 30000"));
        assert!(r.partials[&10_240].is_some());
        assert_eq!(r.partials.get(&20_480), Some(&None));
        assert_eq!(r.partials.len(), 2);

        // Uploads: the times at which that many bytes were sent.
        let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
        s.method = HttpMethod::Post;
        s.upload_bytes = 300_001;
        let r = transfer(&s, &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(
            r.partials.keys().copied().collect::<Vec<_>>(),
            PARTIAL_SIZES[..5]
        );
        let times: Vec<f64> = r.partials.values().map(|t| t.unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        assert!(times[0] >= r.socks_connected.unwrap());
        assert!(times[4] <= r.request_sent.unwrap());
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

    #[test]
    fn settings_for_workloads() {
        let url = || Some("http://a/".to_string());
        let s = settings(Options {
            url: url(),
            duration: Some(2.5),
            think_mean: Some(1.5),
            label: Some("web".into()),
            parallel: Some(4),
            progress: Some(1.0),
            seed: Some(9),
            ..Options::default()
        })
        .unwrap();
        // A duration makes the count unbounded; a mean alone means exponential.
        assert_eq!(s.count, 0);
        assert_eq!(s.duration, Some(Duration::from_millis(2500)));
        assert_eq!(
            (s.think, s.think_mean),
            (Some(Think::Exp), Duration::from_millis(1500))
        );
        assert_eq!(
            (s.label.as_deref(), s.parallel, s.seed),
            (Some("web"), 4, 9)
        );
        assert_eq!(s.progress, Some(Duration::from_secs(1)));
        let s = settings(Options {
            url: url(),
            ..Options::default()
        })
        .unwrap();
        assert_eq!((s.count, s.parallel, s.think, s.label), (1, 1, None, None));
        let bad = [
            Options {
                think: Some(Think::Fixed),
                ..Options::default()
            },
            Options {
                cut_at_deadline: true,
                ..Options::default()
            },
            Options {
                duration: Some(0.0),
                ..Options::default()
            },
            Options {
                duration: Some(-1.0),
                ..Options::default()
            },
            Options {
                parallel: Some(0),
                ..Options::default()
            },
            Options {
                parallel: Some(MAX_PARALLEL + 1),
                ..Options::default()
            },
            Options {
                progress: Some(0.0),
                ..Options::default()
            },
            Options {
                pause: Some(f64::INFINITY),
                ..Options::default()
            },
            Options {
                think_mean: Some(-0.5),
                ..Options::default()
            },
            Options {
                start_delay: Some(1e9),
                ..Options::default()
            },
            Options {
                label: Some(String::new()),
                ..Options::default()
            },
        ];
        for (i, mut a) in bad.into_iter().enumerate() {
            a.url = url();
            assert!(settings(a).is_err(), "case {i}");
        }
        // The same options from a config file.
        let dir = std::env::temp_dir().join(format!("chive-perf-wl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf.toml");
        std::fs::write(
            &path,
            "url = \"http://a/\"\nlabel = \"bulk\"\nduration = 10.0\ncut_at_deadline = true\n\
             pause = 20.0\nthink = \"fixed\"\nthink_mean = 3.0\nstart_delay = 1.0\nparallel = 2\n\
             progress = 0.5\nseed = 5\ncount = 7\n",
        )
        .unwrap();
        let s = settings(Options {
            config: Some(path),
            parallel: Some(3),
            ..Options::default()
        })
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(s.label.as_deref(), Some("bulk"));
        assert!(s.cut_at_deadline);
        assert_eq!((s.count, s.parallel, s.seed), (7, 3, 5));
        assert_eq!(
            (s.pause, s.start_delay),
            (Duration::from_secs(20), Duration::from_secs(1))
        );
        assert_eq!(
            (s.think, s.think_mean),
            (Some(Think::Fixed), Duration::from_secs(3))
        );
        assert_eq!(s.progress, Some(Duration::from_millis(500)));
    }

    #[test]
    fn help_documents_every_option_and_the_examples() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        for opt in [
            "--duration",
            "--cut-at-deadline",
            "--pause",
            "--think ",
            "--think-mean",
            "--seed",
            "--start-delay",
            "--parallel",
            "--progress",
            "--label",
            "--isolate",
            "--interval",
            "--upload-bytes",
        ] {
            assert!(help.contains(opt), "{opt} missing from --help");
        }
        for example in [
            "--interval 0.5 --isolate",
            "--count 0",
            "--think exp --think-mean",
        ] {
            assert!(help.contains(example), "{example} missing from --help");
        }
    }
}
