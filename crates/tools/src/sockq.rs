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

/// The smoothed round trip of TCP socket `fd` (Linux TCP_INFO `tcpi_rtt`; right after the
/// handshake, its sample), `None` if the call fails or the kernel has no sample yet. Used to
/// size a rate-limited relay's `TCP_NOTSENT_LOWAT` per link (`chive_net::LinkConfig::unsent_rtt_rate`).
pub fn tcp_rtt(fd: RawFd) -> Option<std::time::Duration> {
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
    (rc == 0 && info.tcpi_rtt > 0)
        .then(|| std::time::Duration::from_micros(u64::from(info.tcpi_rtt)))
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
    }
}
