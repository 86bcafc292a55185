//! `chive delayline`: a user-space one-way delay line between two interfaces.
//!
//! The lab's kernel has no netem, so a delayed link is built by putting this
//! forwarder in the path: every frame that arrives on `--a` is sent out of
//! `--b` after the configured delay, and every frame arriving on `--b` leaves
//! through `--a` after the (possibly different) delay of that direction.
//! Every frame is delayed, pure ACKs included, and frames of one direction
//! leave in the order they arrived (a jittered deadline is never earlier than
//! the one before it).
//!
//! Design, per direction: a reader thread blocks in `recvmsg` on an
//! `AF_PACKET` socket, takes the kernel's receive timestamp (so its own
//! scheduling latency does not count), computes the deadline and hands the
//! frame to a bounded FIFO; a writer thread sleeps with `clock_nanosleep`
//! until the head's deadline and sends it. Frames are read with a virtio-net
//! header (`PACKET_VNET_HDR`) and written back with it, so checksum offload
//! and GSO state survive the copy. When the FIFO is full the frame is dropped,
//! like a full interface queue.
//!
//! Linux only. Needs CAP_NET_RAW (root in the lab's namespaces).

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use anyhow::{bail, Context};
use rand::Rng;

/// Largest frame read: a 64 KiB GSO frame plus the Ethernet and vnet headers.
const FRAME_BUF: usize = 65536 + 64;
/// Size of `struct virtio_net_hdr`.
const VNET_HDR_LEN: usize = 10;
/// `PACKET_IGNORE_OUTGOING` (Linux 4.20+); libc may not export it.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// Upper bound for `--delay` and `--jitter` (one minute).
const MAX_DELAY_MS: f64 = 60_000.0;
/// Socket buffers large enough for a 100 Mbit/s burst of several hundred ms.
const SOCK_BUF: libc::c_int = 16 * 1024 * 1024;

/// Command-line arguments of `chive delayline`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// First interface (e.g. the switch end of a host's veth).
    #[arg(long)]
    pub a: String,
    /// Second interface (e.g. a veth whose peer is a bridge port).
    #[arg(long)]
    pub b: String,
    /// One-way delay in milliseconds, each direction.
    #[arg(long, default_value_t = 0.0)]
    pub delay: f64,
    /// One-way delay from --b to --a in milliseconds [default: --delay].
    #[arg(long)]
    pub delay_back: Option<f64>,
    /// Uniform jitter: each frame's delay is drawn from delay ± jitter
    /// (clamped at 0 and never reordering).
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    /// Loss probability per frame, 0..1, each direction.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Most frames held per direction; more are dropped.
    #[arg(long, default_value_t = 50_000)]
    pub limit: usize,
    /// Do not try to raise the threads to SCHED_FIFO.
    #[arg(long)]
    pub no_realtime: bool,
}

/// Per-direction parameters, checked.
#[derive(Debug, Clone, Copy)]
struct DirCfg {
    delay_ns: i64,
    jitter_ns: i64,
    loss: f64,
    limit: usize,
    realtime: bool,
}

/// Counters of one direction, printed at the end of each stats line.
#[derive(Default)]
struct Stats {
    forwarded: AtomicU64,
    dropped_full: AtomicU64,
    dropped_loss: AtomicU64,
    send_errors: AtomicU64,
}

/// A bounded FIFO of (deadline ns, frame) with blocking pop.
struct Fifo {
    q: Mutex<VecDeque<(i64, Vec<u8>)>>,
    cv: Condvar,
    limit: usize,
}

impl Fifo {
    fn push(&self, item: (i64, Vec<u8>)) -> bool {
        let Ok(mut q) = self.q.lock() else {
            return false;
        };
        if q.len() >= self.limit {
            return false;
        }
        q.push_back(item);
        drop(q);
        self.cv.notify_one();
        true
    }

    fn pop(&self) -> Option<(i64, Vec<u8>)> {
        let mut q = self.q.lock().ok()?;
        loop {
            if let Some(item) = q.pop_front() {
                return Some(item);
            }
            q = self.cv.wait(q).ok()?;
        }
    }
}

fn ms_to_ns(name: &str, ms: f64) -> anyhow::Result<i64> {
    if !ms.is_finite() || !(0.0..=MAX_DELAY_MS).contains(&ms) {
        bail!("--{name} must be within 0..={MAX_DELAY_MS} ms, got {ms}");
    }
    Ok((ms * 1e6).round() as i64)
}

fn check_ifname(name: &str) -> anyhow::Result<CString> {
    if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains('\0') {
        bail!("invalid interface name {name:?}");
    }
    Ok(CString::new(name)?)
}

/// `CLOCK_REALTIME` in ns: the clock of `SO_TIMESTAMPNS`.
fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn sleep_until_ns(deadline: i64) {
    let ts = libc::timespec {
        tv_sec: deadline.div_euclid(1_000_000_000),
        tv_nsec: deadline.rem_euclid(1_000_000_000),
    };
    loop {
        // SAFETY: ts is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_REALTIME,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

fn setsockopt_int(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value points to a live c_int of the given length.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens an `AF_PACKET` socket bound to `ifname`, promiscuous, with vnet
/// headers and kernel receive timestamps, ignoring frames it sends itself.
fn open_packet_socket(ifname: &str) -> anyhow::Result<OwnedFd> {
    let cname = check_ifname(ifname)?;
    // SAFETY: plain FFI call with a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface {ifname:?}: {}", io::Error::last_os_error());
    }
    let proto = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
    // SAFETY: plain FFI call; the result is checked before use.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if raw < 0 {
        bail!(
            "socket(AF_PACKET) for {ifname}: {}",
            io::Error::last_os_error()
        );
    }
    // SAFETY: raw is a fresh, valid descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // The vnet header must be enabled before bind.
    setsockopt_int(&fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1)
        .with_context(|| format!("PACKET_VNET_HDR on {ifname}"))?;
    // Frames we transmit on this interface must not come back to our reader;
    // older kernels lack the option, so the reader also checks sll_pkttype.
    let _ = setsockopt_int(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
    setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
        .with_context(|| format!("SO_TIMESTAMPNS on {ifname}"))?;
    if setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, SOCK_BUF).is_err() {
        let _ = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCK_BUF);
    }
    if setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, SOCK_BUF).is_err() {
        let _ = setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCK_BUF);
    }
    // SAFETY: zeroed sockaddr_ll is a valid value; fields are set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: sll is a valid sockaddr_ll and the length matches it.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        bail!("bind to {ifname}: {}", io::Error::last_os_error());
    }
    // Promiscuous: frames for other hosts' MACs must be forwarded too.
    // SAFETY: zeroed packet_mreq is valid; fields are set below.
    let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
    mreq.mr_ifindex = ifindex as libc::c_int;
    mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
    // SAFETY: mreq is a valid packet_mreq and the length matches it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq as *const libc::packet_mreq as *const libc::c_void,
            std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        bail!(
            "promiscuous mode on {ifname}: {}",
            io::Error::last_os_error()
        );
    }
    Ok(fd)
}

/// Receives one frame into `buf`; returns (length, kernel timestamp ns,
/// whether it is a frame this host sent).
fn recv_frame(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, i64, bool)> {
    // SAFETY: zeroed sockaddr_ll / msghdr are valid values; all pointers set
    // below point to live buffers of the stated lengths.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut sll as *mut libc::sockaddr_ll as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: msg is fully initialised above.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ts = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled in,
    // bounded by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let t = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                ts = Some(t.tv_sec * 1_000_000_000 + t.tv_nsec);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let outgoing = sll.sll_pkttype == libc::PACKET_OUTGOING;
    Ok((n as usize, ts.unwrap_or_else(now_ns), outgoing))
}

fn send_frame(fd: &OwnedFd, frame: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: frame is a live buffer of frame.len() bytes.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn try_realtime() {
    let p = libc::sched_param { sched_priority: 10 };
    // SAFETY: plain FFI call on the calling thread; failure is harmless.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &p);
    }
}

/// Starts the reader and writer threads of one direction.
fn spawn_direction(
    name: String,
    rx: Arc<OwnedFd>,
    tx: Arc<OwnedFd>,
    cfg: DirCfg,
    stats: Arc<Stats>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let fifo = Arc::new(Fifo {
        q: Mutex::new(VecDeque::new()),
        cv: Condvar::new(),
        limit: cfg.limit,
    });
    let (f1, s1) = (fifo.clone(), stats.clone());
    let tx_name = format!("{name}-tx");
    let reader = std::thread::Builder::new()
        .name(format!("{name}-rx"))
        .spawn(move || {
            if cfg.realtime {
                try_realtime();
            }
            let mut rng = rand::thread_rng();
            let mut buf = vec![0u8; FRAME_BUF];
            let mut last_due = i64::MIN;
            loop {
                let (n, ts, outgoing) = match recv_frame(&rx, &mut buf) {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        eprintln!("chive delayline: {name}: receive failed: {e}");
                        std::process::exit(1);
                    }
                };
                if outgoing || n < VNET_HDR_LEN {
                    continue;
                }
                if cfg.loss > 0.0 && rng.gen::<f64>() < cfg.loss {
                    s1.dropped_loss.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let mut d = cfg.delay_ns;
                if cfg.jitter_ns > 0 {
                    d += rng.gen_range(-cfg.jitter_ns..=cfg.jitter_ns);
                }
                // Never earlier than the previous frame: keeps the order.
                let due = (ts + d.max(0)).max(last_due);
                last_due = due;
                let frame = buf.get(..n).map(<[u8]>::to_vec).unwrap_or_default();
                if !f1.push((due, frame)) {
                    s1.dropped_full.fetch_add(1, Ordering::Relaxed);
                }
            }
        })?;
    let writer = std::thread::Builder::new().name(tx_name).spawn(move || {
        if cfg.realtime {
            try_realtime();
        }
        while let Some((due, frame)) = fifo.pop() {
            if due > now_ns() {
                sleep_until_ns(due);
            }
            match send_frame(&tx, &frame) {
                Ok(()) => stats.forwarded.fetch_add(1, Ordering::Relaxed),
                // ENOBUFS and friends: the frame is lost, like on a wire.
                Err(_) => stats.send_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    })?;
    Ok(vec![reader, writer])
}

/// Entry point of `chive delayline` (blocks until killed).
pub async fn run(args: Args) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args)).await?
}

fn run_blocking(args: Args) -> anyhow::Result<()> {
    let delay = ms_to_ns("delay", args.delay)?;
    let back = ms_to_ns("delay-back", args.delay_back.unwrap_or(args.delay))?;
    let jitter = ms_to_ns("jitter", args.jitter)?;
    if !(0.0..=1.0).contains(&args.loss) {
        bail!("--loss must be within 0..=1, got {}", args.loss);
    }
    if args.limit == 0 || args.limit > 10_000_000 {
        bail!("--limit must be within 1..=10000000");
    }
    if args.a == args.b {
        bail!("--a and --b must differ");
    }
    let fa = Arc::new(open_packet_socket(&args.a)?);
    let fb = Arc::new(open_packet_socket(&args.b)?);
    let base = DirCfg {
        delay_ns: delay,
        jitter_ns: jitter,
        loss: args.loss,
        limit: args.limit,
        realtime: !args.no_realtime,
    };
    let ab = Arc::new(Stats::default());
    let ba = Arc::new(Stats::default());
    let mut threads = spawn_direction(
        format!("{}>{}", args.a, args.b),
        fa.clone(),
        fb.clone(),
        base,
        ab.clone(),
    )?;
    threads.extend(spawn_direction(
        format!("{}>{}", args.b, args.a),
        fb,
        fa,
        DirCfg {
            delay_ns: back,
            ..base
        },
        ba.clone(),
    )?);
    // The lab waits for this line before it sends traffic.
    println!(
        "{{\"ready\":true,\"a\":\"{}\",\"b\":\"{}\",\"delay_ms\":{},\"delay_back_ms\":{}}}",
        args.a,
        args.b,
        args.delay,
        args.delay_back.unwrap_or(args.delay)
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(10));
        if threads.iter().any(|t| t.is_finished()) {
            bail!("a forwarding thread stopped");
        }
        let line = |s: &Stats| {
            format!(
                "{{\"forwarded\":{},\"dropped_full\":{},\"dropped_loss\":{},\"send_errors\":{}}}",
                s.forwarded.load(Ordering::Relaxed),
                s.dropped_full.load(Ordering::Relaxed),
                s.dropped_loss.load(Ordering::Relaxed),
                s.send_errors.load(Ordering::Relaxed)
            )
        };
        eprintln!("{{\"a_to_b\":{},\"b_to_a\":{}}}", line(&ab), line(&ba));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_arguments() {
        assert!(ms_to_ns("delay", -1.0).is_err());
        assert!(ms_to_ns("delay", f64::NAN).is_err());
        assert!(ms_to_ns("delay", 1e9).is_err());
        assert_eq!(ms_to_ns("delay", 12.5).unwrap(), 12_500_000);
        assert!(check_ifname("").is_err());
        assert!(check_ifname("a/b").is_err());
        assert!(check_ifname("sixteen-chars-xx").is_err());
        assert!(check_ifname("vA").is_ok());
    }

    #[test]
    fn fifo_is_bounded_and_ordered() {
        let f = Fifo {
            q: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            limit: 2,
        };
        assert!(f.push((1, vec![1])));
        assert!(f.push((2, vec![2])));
        assert!(!f.push((3, vec![3])));
        assert_eq!(f.pop().map(|x| x.0), Some(1));
        assert_eq!(f.pop().map(|x| x.0), Some(2));
    }

    #[test]
    fn sleep_until_reaches_deadline() {
        let start = now_ns();
        sleep_until_ns(start + 2_000_000);
        let late = now_ns() - (start + 2_000_000);
        assert!(late >= 0, "woke {late} ns early");
    }
}
