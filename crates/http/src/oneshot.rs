//! One complete exchange: connect, send, read the whole (bounded) answer, all under one
//! deadline. For small documents such as the directory's; `chive perf` streams instead.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::head::Head;
use crate::reader::{BodyError, Collect, Limits, ResponseReader};
use crate::HttpError;

/// Bounds on one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneShot {
    /// Whole-exchange deadline: connect, send, read the full response.
    pub timeout: Duration,
    /// Largest response head.
    pub max_head: usize,
    /// Largest response body.
    pub max_body: usize,
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Its head (status, headers).
    pub head: Head,
    /// Its body.
    pub body: Vec<u8>,
}

/// Send `head` (a complete request head, see [`crate::request_head`]) and `body` to
/// `addr` over a fresh connection, and read the final response. The head should say
/// `Connection: close`: one request per connection.
pub async fn request(
    addr: SocketAddr,
    head: &str,
    body: Option<&[u8]>,
    bounds: &OneShot,
) -> Result<Response, HttpError> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| HttpError::Connect(e.kind()))?;
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(HttpError::write)?;
        if let Some(b) = body {
            stream.write_all(b).await.map_err(HttpError::write)?;
        }
        stream.flush().await.map_err(HttpError::write)?;
        let limits = Limits {
            max_head: bounds.max_head,
            ..Limits::default()
        };
        let mut reader = ResponseReader::with_limits(stream, limits);
        let head = reader.read_final_head().await?;
        let mut sink = Collect::new(bounds.max_body);
        reader
            .read_body(&head, &mut sink)
            .await
            .map_err(|e| match e {
                BodyError::Http(e) | BodyError::Sink(e) => e,
            })?;
        Ok(Response {
            head,
            body: sink.body,
        })
    };
    tokio::time::timeout(bounds.timeout, exchange)
        .await
        .map_err(|_| HttpError::Timeout(bounds.timeout))?
}
