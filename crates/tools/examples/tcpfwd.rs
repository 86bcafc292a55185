//! A plain TCP forwarder: the IO floor of a relay (issue 20, `lab/scripts/relay_cpu.py --impl io`).
//!
//! It does what a chive relay must do with a relayed byte minus the crypto and the cells: read it
//! from one loopback TCP connection and write it to the next, on a tokio current-thread runtime
//! as the node runs, with reads of at most the node's read batch (128 cells of 514 bytes) and the
//! link sockets' options (`TCP_NODELAY`, `TCP_NOTSENT_LOWAT` 64 KiB). A chain of these in place
//! of the relays measures what loopback TCP, the wake-ups and the scheduling of the processes on
//! this machine cost per byte, so that a relay's CPU per byte can be split into that floor, the
//! crypto floor and what is left: chive's own work.
//!
//!     tcpfwd --to 127.0.0.1:8080 [--listen 127.0.0.1:0] [--read-size 65792] [--write-size 0]
//!
//! Prints `{"listening": "ADDR"}` on stdout once bound. Each accepted connection gets a
//! connection to `--to` and a task per direction that reads, then writes what it read (in
//! pieces of `--write-size` if non-zero, as a relay's writer hands the kernel at most
//! `OutbufCells` cells at a time); an end of file is passed on as a shutdown of the write side.

use std::net::SocketAddr;

use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser, Debug)]
struct Args {
    /// Where every accepted connection is forwarded to.
    #[arg(long)]
    to: SocketAddr,
    /// Address to listen on (`127.0.0.1:0` picks a free port, printed as JSON on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Most bytes one read may bring (the node's read batch: 128 cells of 514 bytes).
    #[arg(long, default_value_t = 128 * 514)]
    read_size: usize,
    /// Largest single write, 0 = the whole read at once.
    #[arg(long, default_value_t = 0)]
    write_size: usize,
    /// TCP_NOTSENT_LOWAT on both sockets, 0 = leave unset (the node's link default: 64 KiB).
    #[arg(long, default_value_t = 64 * 1024)]
    unsent_limit: u32,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.read_size > 0, "--read-size must be positive");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "{}",
        serde_json::json!({ "listening": listener.local_addr()?.to_string() })
    );
    loop {
        let (inbound, _) = listener.accept().await?;
        let (to, read_size, write_size, unsent) =
            (args.to, args.read_size, args.write_size, args.unsent_limit);
        tokio::spawn(async move {
            let outbound = match TcpStream::connect(to).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("tcpfwd: connect {to}: {e}");
                    return;
                }
            };
            for s in [&inbound, &outbound] {
                // Best effort, as the node's link setup: a socket without them still forwards.
                let _ = s.set_nodelay(true);
                if unsent > 0 {
                    let _ = socket2::SockRef::from(s).set_tcp_notsent_lowat(unsent);
                }
            }
            let (in_rd, in_wr) = inbound.into_split();
            let (out_rd, out_wr) = outbound.into_split();
            tokio::spawn(pump(out_rd, in_wr, read_size, write_size));
            pump(in_rd, out_wr, read_size, write_size).await;
        });
    }
}

/// Copy `rd` to `wr` until end of file or an error, then shut `wr` down.
async fn pump(mut rd: OwnedReadHalf, mut wr: OwnedWriteHalf, read_size: usize, write_size: usize) {
    let mut buf = vec![0u8; read_size];
    let piece = if write_size == 0 {
        read_size
    } else {
        write_size
    };
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for chunk in buf[..n].chunks(piece) {
            if wr.write_all(chunk).await.is_err() {
                return;
            }
        }
    }
    let _ = wr.shutdown().await;
}
