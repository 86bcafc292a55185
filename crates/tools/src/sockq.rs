//! Kernel socket queue sizes, for instrumentation that must see past the application's own
//! buffers (circuit switching's congestion detector, paper 003: "the output buffer" includes
//! what the kernel still holds). Here because this crate is the one allowed `unsafe` for libc.

use std::os::fd::RawFd;

/// Bytes written to TCP socket `fd` that the kernel has not sent yet (Linux SIOCOUTQ, which is
/// TIOCOUTQ for sockets), or 0 if the call fails (a closed descriptor, not a socket).
pub fn tcp_unsent_bytes(fd: RawFd) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer, which points at a live local; a bad
    // descriptor makes the call fail without touching memory.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    if rc == 0 && n > 0 {
        n as u64
    } else {
        0
    }
}

/// What TCP socket `fd` holds beyond the application: see [`tcp_queue`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpQueue {
    /// Bytes sent and not yet acknowledged (`tcpi_unacked` segments of `tcpi_snd_mss`).
    pub in_flight_bytes: u64,
    /// The smoothed round trip (`tcpi_rtt`).
    pub srtt: std::time::Duration,
    /// The lowest round trip seen (`tcpi_min_rtt`): the path without queues.
    pub min_rtt: std::time::Duration,
}

impl TcpQueue {
    /// The bytes in flight that wait in a queue on the path rather than travel: by Little's law
    /// `in flight × (srtt − min_rtt) / srtt` (the sending rate is in flight / srtt, and each
    /// byte spends srtt − min_rtt queued). What a bottleneck's queue downstream of the socket
    /// holds (a shaper's, a router's), which SIOCOUTQ's unsent bytes do not show until the
    /// congestion window is full. 0 without samples.
    pub fn queued_bytes(&self) -> u64 {
        let srtt = self.srtt.as_micros();
        let min = self.min_rtt.as_micros();
        if srtt == 0 || min == 0 || min >= srtt {
            return 0;
        }
        let q = u128::from(self.in_flight_bytes) * (srtt - min) / srtt;
        u64::try_from(q).unwrap_or(u64::MAX)
    }
}

/// In-flight bytes and round trips of TCP socket `fd` (Linux TCP_INFO), `None` if the call
/// fails.
pub fn tcp_queue(fd: RawFd) -> Option<TcpQueue> {
    let info = tcp_info(fd)?;
    Some(TcpQueue {
        in_flight_bytes: u64::from(info.tcpi_unacked) * u64::from(info.tcpi_snd_mss),
        srtt: std::time::Duration::from_micros(u64::from(info.tcpi_rtt)),
        min_rtt: std::time::Duration::from_micros(u64::from(info.tcpi_min_rtt)),
    })
}

fn tcp_info(fd: RawFd) -> Option<libc::tcp_info> {
    // SAFETY: `info` is a plain C struct of integers, valid when zeroed; the kernel writes at
    // most `len` bytes (its size) into it; a bad descriptor makes the call fail untouched.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

/// The smoothed round trip of TCP socket `fd` (Linux TCP_INFO `tcpi_rtt`; right after the
/// handshake, its sample), `None` if the call fails or the kernel has no sample yet. Used to
/// size a rate-limited relay's `TCP_NOTSENT_LOWAT` per link (`chive_net::LinkConfig::unsent_rtt_rate`).
pub fn tcp_rtt(fd: RawFd) -> Option<std::time::Duration> {
    let info = tcp_info(fd)?;
    (info.tcpi_rtt > 0).then(|| std::time::Duration::from_micros(u64::from(info.tcpi_rtt)))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    /// A connected socket whose peer does not read keeps what did not fit the peer's window;
    /// a fresh one holds nothing; a bad descriptor reads 0.
    #[test]
    fn counts_unsent_bytes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _peer = l.accept().unwrap();
        assert_eq!(tcp_unsent_bytes(c.as_raw_fd()), 0);
        c.set_nonblocking(true).unwrap();
        let chunk = vec![0u8; 65536];
        let mut written = 0usize;
        while written < 64 << 20 {
            match c.write(&chunk) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        assert!(tcp_unsent_bytes(c.as_raw_fd()) > 0, "wrote {written} bytes");
        assert_eq!(tcp_unsent_bytes(-1), 0);
        // A connected socket has a round-trip sample from its handshake (loopback: well
        // under a second); a bad descriptor has none.
        let rtt = tcp_rtt(c.as_raw_fd()).expect("a handshake sample");
        assert!(rtt < std::time::Duration::from_secs(1), "{rtt:?}");
        assert_eq!(tcp_rtt(-1), None);
        // Unacknowledged bytes of a peer that does not read: in flight, with round trips.
        let q = tcp_queue(c.as_raw_fd()).expect("TCP_INFO");
        assert!(q.srtt > std::time::Duration::ZERO, "{q:?}");
        assert_eq!(tcp_queue(-1), None);
    }

    /// Little's law: with srtt = 4 × min_rtt, three quarters of what is in flight is queued.
    #[test]
    fn queued_bytes_are_the_in_flight_share_of_the_queueing_delay() {
        let ms = std::time::Duration::from_millis;
        let q = |inflight, srtt, min| TcpQueue {
            in_flight_bytes: inflight,
            srtt: ms(srtt),
            min_rtt: ms(min),
        };
        assert_eq!(q(100_000, 400, 100).queued_bytes(), 75_000);
        assert_eq!(q(100_000, 100, 100).queued_bytes(), 0, "no queue");
        assert_eq!(
            q(100_000, 90, 100).queued_bytes(),
            0,
            "srtt below min: none"
        );
        assert_eq!(q(100_000, 0, 0).queued_bytes(), 0, "no samples");
    }
}
