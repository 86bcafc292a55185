//! The `chive` binary: one executable, one subcommand per role. The node roles live in
//! chive-node; this is their command line.

use chive_node::{authority, client, relay};

use clap::{Parser, Subcommand};

/// chive: an onion-routing overlay whose relays stay fast for interactive users
/// while bulk users share them.
#[derive(Parser, Debug)]
#[command(name = "chive", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Directory authority: collects signed relay descriptors, publishes a signed consensus.
    Authority(authority::Args),
    /// Onion relay (and exit, if its exit policy allows).
    Relay(relay::Args),
    /// Client: a SOCKS4a/5 proxy that builds circuits through the overlay.
    Client(client::Args),
    /// Small HTTP/1.1 server for measurements: /bytes/<N> downloads, POST /upload.
    Httpd(chive_tools::httpd::Args),
    /// Timed transfers over SOCKS, one JSON line per transfer (torperf-style).
    Perf(chive_perf::Args),
    /// Install, print (--dry-run) or remove ACK prioritisation on an interface (paper 002).
    Shape(chive_tools::shape::Args),
    /// User-space one-way delay line between two interfaces (for the lab; no netem needed).
    Delayline(chive_tools::delay::Args),
}

/// Give the memory glibc's malloc holds free back to the kernel (`malloc_trim(0)`: free pages
/// anywhere in its heaps, not only at the top). The driver calls it, rate-limited, after the
/// queues counted against `MaxMemInQueues` fell far (chive_node::memtrim); without it a relay
/// kept up to ~200 MiB of freed queue memory in its RSS after a sniper attack.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_freed_memory() {
    // SAFETY: malloc_trim takes no pointers and only walks glibc's own arenas under their
    // locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    chive_node::memtrim::set_release(release_freed_memory);
    // One thread runs every task. A node's core is one task anyway (the driver), and its link
    // reader and writer tasks hand it batches of cells: on a multi-threaded runtime each
    // hand-off between the driver (then on the main thread) and an IO task on a worker was a
    // futex wake-up and a context switch, ~300 per relayed MB and a fifth of a relay's CPU
    // (docs/performance.md). On one thread a hand-off is a queue push. Blocking work
    // (DNS lookups) still goes to tokio's blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("chive: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Authority(a) => authority::run(a).await,
            Command::Relay(a) => relay::run(a).await,
            Command::Client(a) => client::run(a).await,
            Command::Httpd(a) => chive_tools::httpd::run(a).await,
            Command::Perf(a) => chive_perf::run(a).await,
            Command::Shape(a) => chive_tools::shape::run(a).await,
            Command::Delayline(a) => chive_tools::delay::run(a).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chive: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
