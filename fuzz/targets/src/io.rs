//! A byte stream made of the fuzzer's input, and a minimal executor for futures that only ever
//! wait on it. The stream is always ready, so no future here can pend: driving them needs no
//! runtime, which keeps each execution cheap.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reads yield `input` in pieces of at most `chunk` bytes, then EOF; writes are collected.
pub(crate) struct FuzzStream<'a> {
    input: &'a [u8],
    chunk: usize,
    /// Everything written to the stream (replies), for targets that check them.
    pub(crate) written: Vec<u8>,
}

impl<'a> FuzzStream<'a> {
    pub(crate) fn new(input: &'a [u8], chunk: usize) -> Self {
        FuzzStream {
            input,
            chunk: chunk.max(1),
            written: Vec::new(),
        }
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
