//! A stream's bytes read from its local socket and not yet packaged into DATA cells, kept in
//! the buffers the driver read them into: a bulk read (64 KB at an exit) is queued as it is
//! and copied once, into the DATA cells' queue slots, instead of first into a byte deque.

use std::collections::VecDeque;

/// The smallest buffer a small read is copied into: later small reads fill it up before
/// another is made, so a stream's small reads cost about one buffer per this many bytes.
const SMALL_BUF: usize = 4096;

/// Bytes in arrival order, as a queue of buffers.
#[derive(Default)]
pub(in crate::node) struct StreamBytes {
    bufs: VecDeque<Vec<u8>>,
    /// Bytes of the first buffer already taken.
    head: usize,
    /// Bytes held (not taken), over all buffers.
    len: usize,
}

impl StreamBytes {
    pub(in crate::node) fn len(&self) -> usize {
        self.len
    }

    pub(in crate::node) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append a buffer as read. Kept as it is (no copy) when at least half of it is used;
    /// else its bytes are copied (`extend_from_slice`), so that many small reads into large
    /// buffers do not pin those: the memory held stays within about twice the bytes held,
    /// plus the partly taken first buffer and one small buffer.
    pub(in crate::node) fn push(&mut self, buf: Vec<u8>) {
        if buf.is_empty() || buf.len() * 2 < buf.capacity() {
            return self.extend_from_slice(&buf);
        }
        self.len += buf.len();
        self.bufs.push_back(buf);
    }

    /// Append a copy of `data`: into the last buffer's spare room if it fits, else a new
    /// buffer of at least [`SMALL_BUF`] bytes.
    pub(in crate::node) fn extend_from_slice(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.len += data.len();
        if let Some(back) = self.bufs.back_mut() {
            if back.capacity() - back.len() >= data.len() {
                back.extend_from_slice(data);
                return;
            }
        }
        let mut buf = Vec::with_capacity(data.len().max(SMALL_BUF));
        buf.extend_from_slice(data);
        self.bufs.push_back(buf);
    }

    /// Move the first `out.len()` bytes into `out`, freeing the buffers emptied. The caller
    /// checked that there are that many; if there are fewer, the rest of `out` is left as
    /// it was.
    pub(in crate::node) fn take_into(&mut self, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let Some(front) = self.bufs.front() else {
                break;
            };
            let avail = &front[self.head..];
            let k = avail.len().min(out.len() - done);
            out[done..done + k].copy_from_slice(&avail[..k]);
            done += k;
            self.head += k;
            if self.head == front.len() {
                self.bufs.pop_front();
                self.head = 0;
            }
        }
        self.len -= done;
    }

    /// Bytes of buffer room held (for the memory accounting of tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.bufs.iter().map(Vec::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes come out in the order they went in, across buffers, whatever the pieces.
    #[test]
    fn bytes_come_out_in_order_across_buffers() {
        let mut b = StreamBytes::default();
        let mut big = Vec::with_capacity(1000);
        big.extend((0..1000u32).map(|i| i as u8));
        b.push(big);
        b.extend_from_slice(&[1, 2, 3]);
        let mut small = Vec::with_capacity(100);
        small.extend_from_slice(&[4, 5]);
        b.push(small);
        assert_eq!(b.len(), 1005);
        let mut out = [0u8; 998];
        b.take_into(&mut out);
        assert!(out.iter().enumerate().all(|(i, &x)| x == i as u8));
        let mut out = [0u8; 5];
        b.take_into(&mut out);
        assert_eq!(out, [230, 231, 1, 2, 3]);
        assert_eq!(b.len(), 2);
        let mut out = [0u8; 2];
        b.take_into(&mut out);
        assert_eq!(out, [4, 5]);
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 0, "emptied buffers are freed");
    }

    /// A full read's buffer is queued as it is; small reads into large buffers are copied
    /// and share small buffers, so 1000 one-byte reads into 64 KB buffers hold about 4 KB,
    /// not 64 MB.
    #[test]
    fn full_reads_are_kept_and_small_ones_copied() {
        let mut b = StreamBytes::default();
        let mut full = Vec::with_capacity(65536);
        full.resize(65536, 7);
        let ptr = full.as_ptr();
        b.push(full);
        assert_eq!(b.bufs.back().map(|v| v.as_ptr()), Some(ptr), "no copy");
        let mut b = StreamBytes::default();
        for i in 0..1000u32 {
            let mut one = Vec::with_capacity(65536);
            one.push(i as u8);
            b.push(one);
        }
        assert_eq!(b.len(), 1000);
        assert_eq!(b.capacity(), SMALL_BUF);
    }
}
