//! What can go wrong talking HTTP. The texts are part of `chive perf`'s records (its
//! "error" field), so they stay short, stable and free of peer-controlled bytes.

use std::io;

/// A failed request or a response this client refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The TCP connection could not be opened.
    #[error("http: cannot connect: {0}")]
    Connect(io::ErrorKind),
    /// Writing the request failed.
    #[error("http: write failed: {0}")]
    Write(io::ErrorKind),
    /// Reading the response failed.
    #[error("http: read failed: {0}")]
    Read(io::ErrorKind),
    /// The whole exchange did not finish within the deadline.
    #[error("http: no complete answer within {0:?}")]
    Timeout(std::time::Duration),
    /// A request line or header would carry CR, LF or another control character.
    #[error("http: control character in the request's {0}")]
    BadRequest(&'static str),
    /// The server closed the connection without sending anything.
    #[error("http: connection closed before a response")]
    ClosedBeforeResponse,
    /// The server closed the connection in the middle of a response head.
    #[error("http: connection closed in the response head")]
    ClosedInHead,
    /// The response head grew past its limit without ending.
    #[error("http: response head too large")]
    HeadTooLarge,
    /// The response head is not UTF-8.
    #[error("http: response head is not text")]
    HeadNotText,
    /// The status line is not `HTTP/1.0|1.1 DDD ...`.
    #[error("http: bad status line")]
    BadStatusLine,
    /// A header line without a colon.
    #[error("http: bad header line")]
    BadHeaderLine,
    /// A Content-Length that is not a decimal number.
    #[error("http: bad Content-Length")]
    BadContentLength,
    /// Two Content-Length headers that disagree.
    #[error("http: conflicting Content-Length")]
    ConflictingContentLength,
    /// The server closed the connection before the Content-Length was reached.
    #[error("http: connection closed after {received} of {expected} body bytes")]
    ClosedInBody {
        /// Body bytes received.
        received: u64,
        /// The Content-Length.
        expected: u64,
    },
    /// The server closed the connection inside a chunked body.
    #[error("http: connection closed in a chunked body")]
    ClosedInChunkedBody,
    /// A chunk-size or trailer line that is not text.
    #[error("http: bad chunked encoding")]
    BadChunkedEncoding,
    /// A chunk-size or trailer line longer than the line limit.
    #[error("http: bad chunked encoding (line too long)")]
    ChunkLineTooLong,
    /// A chunk's data not followed by CRLF.
    #[error("http: bad chunked encoding (missing CRLF)")]
    MissingChunkCrlf,
    /// A chunk size that is not 1 to 16 hex digits.
    #[error("http: bad chunk size")]
    BadChunkSize,
    /// The trailer section after the last chunk grew past the head limit.
    #[error("http: chunked trailer too large")]
    TrailerTooLarge,
    /// The body is larger than the caller accepts.
    #[error("http: response body larger than {0} bytes")]
    BodyTooLarge(usize),
}

impl HttpError {
    /// A read error, keeping only its kind (the OS text may vary and is not needed).
    pub(crate) fn read(e: io::Error) -> Self {
        HttpError::Read(e.kind())
    }

    /// A write error, keeping only its kind.
    pub(crate) fn write(e: io::Error) -> Self {
        HttpError::Write(e.kind())
    }
}
