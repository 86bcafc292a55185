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
//!
//! Parts: `options` (flags, config file, validation), `runner` (the loops and their
//! schedule), `cancel` (stopping on signals), `record` (the JSON lines and their clock),
//! `socks` (the SOCKS5 client), `transfer` (one timed request and response).

mod cancel;
mod options;
mod record;
mod runner;
mod socks;
mod transfer;

#[cfg(test)]
mod testutil;

pub use cancel::Cancel;
pub use options::{Args, HttpMethod, Options, Think};
pub use record::{ProgressRecord, Record, PARTIAL_SIZES};

use chive_tools::config::init_logging;

use crate::cancel::signals;
use crate::options::settings;
use crate::runner::run_transfers;

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
