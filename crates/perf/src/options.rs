//! The options of `chive perf`: the clap flags, the same keys in a `--config` TOML file,
//! and their validation into the [`Settings`] a run uses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail};
use chive_http::{parse_url, HttpUrl};
use chive_tools::config::load_config;
use serde::Deserialize;

/// Upper bound on the per-transfer time options (one day), to keep `Duration` math safe.
pub(crate) const MAX_SECS: f64 = 86_400.0;

/// Upper bound on `--duration` (30 days).
const MAX_DURATION_SECS: f64 = 30.0 * 86_400.0;

/// Smallest `--progress` period: bounds the rate of progress lines.
const MIN_PROGRESS_SECS: f64 = 0.01;

/// Largest `--parallel`.
const MAX_PARALLEL: u32 = 1024;

/// Longest `--label`.
const MAX_LABEL: usize = 255;

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
pub(crate) struct Settings {
    pub(crate) socks: SocketAddr,
    pub(crate) url_text: String,
    pub(crate) url: HttpUrl,
    /// Transfers per loop; 0 = unbounded.
    pub(crate) count: u64,
    pub(crate) duration: Option<Duration>,
    pub(crate) cut_at_deadline: bool,
    pub(crate) interval: Duration,
    pub(crate) pause: Duration,
    pub(crate) think: Option<Think>,
    pub(crate) think_mean: Duration,
    pub(crate) seed: u64,
    pub(crate) start_delay: Duration,
    pub(crate) parallel: u32,
    pub(crate) progress: Option<Duration>,
    pub(crate) label: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) pass: String,
    pub(crate) isolate: bool,
    pub(crate) timeout: Duration,
    pub(crate) method: HttpMethod,
    pub(crate) upload_bytes: u64,
    pub(crate) verify: bool,
    pub(crate) log: String,
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
pub(crate) fn settings(args: Options) -> anyhow::Result<Settings> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
