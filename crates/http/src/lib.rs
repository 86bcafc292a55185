//! A deliberately small HTTP/1.1 client for chive's tools and its directory client.
//!
//! One request per connection (`Connection: close`), bounded head, line and body sizes,
//! and no `unwrap` on anything the server sends: the server may be hostile or broken.
//!
//! - [`request_head`] formats a request head; [`parse_head`] parses a response head
//!   into a [`Head`] (status, headers, Content-Length, chunked).
//! - [`ResponseReader`] reads a response from any stream as it arrives:
//!   [`ResponseReader::first_byte`], [`ResponseReader::read_head`], then
//!   [`ResponseReader::read_body`] into a [`BodySink`], piece by piece, for Content-Length,
//!   chunked and EOF-delimited bodies. `chive perf` times and verifies bodies this way.
//! - [`request`] is one whole exchange under a deadline with the body collected, for
//!   small documents (the directory client's).
//! - [`parse_url`] splits an `http://` URL for a SOCKS CONNECT and the request.
//!
//! Not here: TLS, keep-alive and pipelining, redirects, compression, proxies (`chive perf`
//! speaks SOCKS itself), and servers (`chive httpd` and the authority use hyper).

mod error;
mod head;
mod oneshot;
mod reader;
mod url;

pub use error::HttpError;
pub use head::{parse_head, request_head, Head};
pub use oneshot::{request, OneShot, Response};
pub use reader::{BodyError, BodySink, Collect, Limits, ResponseReader};
pub use url::{parse_url, HttpUrl, UrlHost};
