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
    }
}
