//! A byte stream made of the fuzzer's input, and a minimal executor for futures that only ever
//! wait on it. The stream is always ready, so no future here can pend: driving them needs no
//! runtime, which keeps each execution cheap.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reads yield `input` in pieces of at most `chunk` bytes, then EOF; writes are collected.
pub(crate) struct FuzzStream<'a> {
    input: &'a [u8],
    chunk: usize,
    /// Everything written to the stream (replies), for targets that check them.
    pub(crate) written: Vec<u8>,
    /// Writes past this many bytes fail (the peer stopped reading), so a server streaming a
    /// large body cannot make one execution slow.
    write_limit: usize,
}

impl<'a> FuzzStream<'a> {
    pub(crate) fn new(input: &'a [u8], chunk: usize) -> Self {
        FuzzStream {
            input,
            chunk: chunk.max(1),
            written: Vec::new(),
            write_limit: usize::MAX,
        }
    }

    /// Writes fail with a broken pipe once `limit` bytes were written.
    pub(crate) fn with_write_limit(mut self, limit: usize) -> Self {
        self.write_limit = limit;
        self
    }

    /// Input bytes not read yet.
    pub(crate) fn unread(&self) -> usize {
        self.input.len()
    }
}

impl AsyncRead for FuzzStream<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.input.len().min(self.chunk).min(buf.remaining());
        let (head, tail) = self.input.split_at(n);
        buf.put_slice(head);
        self.input = tail;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for FuzzStream<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.written.len() >= self.write_limit {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// Run `fut` to completion. Panics if it pends: with a [`FuzzStream`] nothing can make it
/// ready later, so pending would be a hang in the real code.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(NoopWake));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("future pending on an always-ready stream"),
    }
}

/// Remembers whether the future asked to be polled again.
struct FlagWake(AtomicBool);

impl Wake for FlagWake {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Run `fut` to completion for futures that yield (wake themselves and return pending, as
/// hyper's connection does every few reads), at most `max_polls` times. Panics if it pends
/// without having woken itself (nothing could make it ready later: a hang in the real code) or
/// needs more polls than that.
pub(crate) fn block_on_yielding<F: Future>(fut: F, max_polls: usize) -> F::Output {
    let flag = Arc::new(FlagWake(AtomicBool::new(false)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    for _ in 0..max_polls {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => {
                assert!(
                    flag.0.swap(false, Ordering::Relaxed),
                    "future pending on an always-ready stream without waking itself"
                );
            }
        }
    }
    panic!("future still pending after {max_polls} polls");
}
