//! Reading one response from a stream: the head, then the body streamed into a sink, so
//! a caller can time each piece and check content without holding the body.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::head::{parse_head, Head};
use crate::HttpError;

/// How much is read from the stream at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Bounds on what a response may make the reader buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest response head (status line plus headers), and largest chunked trailer.
    pub max_head: usize,
    /// Largest chunk-size or trailer line in a chunked body.
    pub max_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 64 * 1024,
            max_line: 4096,
        }
    }
}

/// Where body bytes go as they arrive. A sink error ends the body read at once.
pub trait BodySink {
    /// Why the sink refuses data (e.g. content that fails a check).
    type Error;

    /// The next body bytes, in order; never empty.
    fn feed(&mut self, data: &[u8]) -> Result<(), Self::Error>;
}

/// A sink that keeps the body, refusing one larger than its limit.
#[derive(Debug, Clone, Default)]
pub struct Collect {
    /// The body so far.
    pub body: Vec<u8>,
    limit: usize,
}

impl Collect {
    /// An empty body that may grow to `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Collect {
            body: Vec::new(),
            limit,
        }
    }
}

impl BodySink for Collect {
    type Error = HttpError;

    fn feed(&mut self, data: &[u8]) -> Result<(), HttpError> {
        if data.len() > self.limit.saturating_sub(self.body.len()) {
            return Err(HttpError::BodyTooLarge(self.limit));
        }
        self.body.extend_from_slice(data);
        Ok(())
    }
}

/// Why reading a body stopped: the stream or framing, or the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError<E> {
    /// The response broke off or is malformed.
    Http(HttpError),
    /// The sink refused the data.
    Sink(E),
}

impl<E> From<HttpError> for BodyError<E> {
    fn from(e: HttpError) -> Self {
        BodyError::Http(e)
    }
}

/// A response being read: the stream plus bytes read but not yet consumed.
#[derive(Debug)]
pub struct ResponseReader<S> {
    stream: S,
    buf: Vec<u8>,
    limits: Limits,
    /// Whether any byte of a response arrived (tells "closed before a response" apart).
    received_any: bool,
}

impl<S: AsyncRead + Unpin> ResponseReader<S> {
    /// A reader with the default [`Limits`].
    pub fn new(stream: S) -> Self {
        Self::with_limits(stream, Limits::default())
    }

    /// A reader with the given limits.
    pub fn with_limits(stream: S, limits: Limits) -> Self {
        ResponseReader {
            stream,
            buf: Vec::new(),
            limits,
            received_any: false,
        }
    }

    /// Read more bytes into the buffer; Ok(0) at EOF.
    async fn fill(&mut self) -> Result<usize, HttpError> {
        self.buf.reserve(READ_CHUNK);
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(HttpError::read)?;
        self.received_any |= n > 0;
        Ok(n)
    }

    /// Wait until the server has sent something (returns at once if it has); a caller
    /// timing the response takes its first-byte time when this returns.
    pub async fn first_byte(&mut self) -> Result<(), HttpError> {
        while self.buf.is_empty() {
            if self.fill().await? == 0 {
                return Err(HttpError::ClosedBeforeResponse);
            }
        }
        Ok(())
    }

    /// Read and parse the next response head (an interim 1xx one included).
    pub async fn read_head(&mut self) -> Result<Head, HttpError> {
        let mut searched = 0usize;
        loop {
            // Resume the search a little before where it stopped, in case the
            // terminator straddles two reads.
            let from = searched.saturating_sub(3);
            if let Some(p) = find(self.buf.get(from..).unwrap_or_default(), b"\r\n\r\n") {
                let end = from + p;
                let head = parse_head(self.buf.get(..end).unwrap_or_default())?;
                self.buf.drain(..end + 4);
                return Ok(head);
            }
            searched = self.buf.len();
            if self.buf.len() > self.limits.max_head {
                return Err(HttpError::HeadTooLarge);
            }
            if self.fill().await? == 0 {
                return Err(if self.received_any {
                    HttpError::ClosedInHead
                } else {
                    HttpError::ClosedBeforeResponse
                });
            }
        }
    }

    /// Read heads until the final (non-1xx) one: interim responses such as an
    /// unsolicited `100 Continue` are skipped.
    pub async fn read_final_head(&mut self) -> Result<Head, HttpError> {
        loop {
            let head = self.read_head().await?;
            if !head.is_interim() {
                return Ok(head);
            }
        }
    }

    /// Read the body `head` announces into `sink`: Content-Length bytes, a chunked body,
    /// or everything up to EOF. Returns the body length. Call it only for a response that
    /// has a body ([`Head::has_body`], and the request was not HEAD); otherwise it
    /// returns 0 at once for 1xx, 204 and 304.
    pub async fn read_body<K: BodySink>(
        &mut self,
        head: &Head,
        sink: &mut K,
    ) -> Result<u64, BodyError<K::Error>> {
        if !head.has_body() {
            return Ok(0);
        }
        if head.chunked {
            return self.read_chunked(sink).await;
        }
        let limit = head.content_length;
        let mut received: u64 = 0;
        loop {
            let take = match limit {
                Some(len) => (len - received).min(self.buf.len() as u64) as usize,
                None => self.buf.len(),
            };
            if take > 0 {
                // Feed in place: the buffer is reused, never grown past one read.
                sink.feed(self.buf.get(..take).unwrap_or_default())
                    .map_err(BodyError::Sink)?;
                received += take as u64;
            }
            if limit == Some(received) {
                // Anything after the body stays unread in the buffer.
                self.buf.drain(..take);
                return Ok(received);
            }
            self.buf.clear();
            if self.fill().await? == 0 {
                return match limit {
                    None => Ok(received),
                    Some(expected) => Err(HttpError::ClosedInBody { received, expected }.into()),
                };
            }
        }
    }

    /// Read a CRLF-terminated line (without the CRLF), bounded by the line limit.
    async fn read_line(&mut self) -> Result<String, HttpError> {
        loop {
            if let Some(p) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8(self.buf.drain(..p).collect())
                    .map_err(|_| HttpError::BadChunkedEncoding)?;
                self.buf.drain(..2);
                return Ok(line);
            }
            if self.buf.len() > self.limits.max_line {
                return Err(HttpError::ChunkLineTooLong);
            }
            if self.fill().await? == 0 {
                return Err(HttpError::ClosedInChunkedBody);
            }
        }
    }

    /// Decode `Transfer-Encoding: chunked` (RFC 9112 section 7.1).
    async fn read_chunked<K: BodySink>(
        &mut self,
        sink: &mut K,
    ) -> Result<u64, BodyError<K::Error>> {
        let mut received: u64 = 0;
        loop {
            let line = self.read_line().await?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            if size_text.is_empty() || size_text.len() > 16 {
                return Err(HttpError::BadChunkSize.into());
            }
            let mut left =
                u64::from_str_radix(size_text, 16).map_err(|_| HttpError::BadChunkSize)?;
            if left == 0 {
                // Trailer section, ended by an empty line; bounded like a head.
                let mut trailer = 0usize;
                loop {
                    let line = self.read_line().await?;
                    if line.is_empty() {
                        return Ok(received);
                    }
                    trailer += line.len() + 2;
                    if trailer > self.limits.max_head {
                        return Err(HttpError::TrailerTooLarge.into());
                    }
                }
            }
            while left > 0 {
                if self.buf.is_empty() && self.fill().await? == 0 {
                    return Err(HttpError::ClosedInChunkedBody.into());
                }
                let take = left.min(self.buf.len() as u64) as usize;
                sink.feed(self.buf.get(..take).unwrap_or_default())
                    .map_err(BodyError::Sink)?;
                self.buf.drain(..take);
                received += take as u64;
                left -= take as u64;
            }
            if !self.read_line().await?.is_empty() {
                return Err(HttpError::MissingChunkCrlf.into());
            }
        }
    }
}

/// Position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
