//! `chive httpd`: a small real HTTP/1.1 server (hyper, keep-alive) used as the
//! far end of measurements.
//!
//! - `GET|HEAD /bytes/<N>`: N bytes (N ≤ 10 GiB) whose byte at offset i is
//!   `i % 251`, streamed in 64 KiB chunks sliced from one precomputed pattern
//!   buffer, so memory use does not depend on N.
//! - `POST /upload`: the body is hashed while it streams in; the reply is
//!   `{"bytes": N, "sha256": "<hex>"}`.
//! - `GET /`: plain-text help. Unknown paths: 404; wrong method on a known path: 405.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::config::{init_logging, load_config};
use crate::pattern::{pattern, CHUNK, PERIOD};

/// Largest size served by `/bytes/<N>`: 10 GiB.
pub const MAX_BYTES: u64 = 10 * 1024 * 1024 * 1024;
/// How long a client may take to send a request head (slow-loris bound).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Command-line arguments of `chive httpd`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TOML config file with keys `Listen` (e.g. "127.0.0.1:8080") and `Log`
    /// (a tracing filter, default "info").
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, overriding `Listen` from the config
    /// (`127.0.0.1:0` picks a free port; the chosen address is printed as JSON on stdout).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// The `chive httpd` config file.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
struct Config {
    /// Address to listen on.
    listen: Option<SocketAddr>,
    /// Log filter.
    log: Option<String>,
}

/// Run `chive httpd` until killed.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let config: Config = match &args.config {
        Some(path) => load_config(path)?,
        None => Config::default(),
    };
    let listen = args.listen.or(config.listen).ok_or_else(|| {
        anyhow!("no listen address: pass --listen ADDR or set Listen in the --config file")
    })?;
    init_logging(config.log.as_deref().unwrap_or("info"));
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    tracing::info!("listening on {local}");
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}",
            serde_json::json!({ "listening": local.to_string() })
        )?;
        out.flush()?;
    }
    serve(listener).await
}

/// Accept connections on `listener` forever, one task per connection.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Typically EMFILE: back off instead of spinning or exiting.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle));
            if let Err(e) = conn.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
}

/// Serve one connection on `io` with the request handler, as [`serve`] does (without the
/// header-read timeout, which needs a timer). For the fuzz targets (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub async fn serve_connection_for_fuzzing<S>(io: S) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), hyper::service::service_fn(handle))
        .await
}

/// Response body type: either a streamed pattern or a small fixed body.
type RespBody = BoxBody<Bytes, Infallible>;

/// Route one request.
async fn handle(req: Request<Incoming>) -> Result<Response<RespBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let resp = if path == "/" {
        match method {
            Method::GET | Method::HEAD => text(StatusCode::OK, HELP),
            _ => not_allowed("GET, HEAD"),
        }
    } else if let Some(n) = path.strip_prefix("/bytes/") {
        match method {
            Method::GET | Method::HEAD => bytes_response(n),
            _ => not_allowed("GET, HEAD"),
        }
    } else if path == "/upload" {
        match method {
            Method::POST => upload(req.into_body()).await,
            _ => not_allowed("POST"),
        }
    } else {
        text(StatusCode::NOT_FOUND, "not found; see / for help\n")
    };
    tracing::debug!("{method} {path} -> {}", resp.status());
    Ok(resp)
}

const HELP: &str = "chive httpd\n\
GET  /bytes/<N>  N bytes (N <= 10737418240), byte i = i % 251\n\
POST /upload     replies {\"bytes\": N, \"sha256\": \"<hex>\"}\n";

fn text(status: StatusCode, msg: &'static str) -> Response<RespBody> {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn not_allowed(allow: &'static str) -> Response<RespBody> {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

/// Parse N strictly (decimal digits only, no sign, bounded) and serve the pattern.
fn bytes_response(n: &str) -> Response<RespBody> {
    let parsed = if !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()) {
        n.parse::<u64>().ok()
    } else {
        None
    };
    match parsed {
        None => text(
            StatusCode::BAD_REQUEST,
            "bad size: /bytes/<N> wants a decimal number of bytes\n",
        ),
        Some(len) if len > MAX_BYTES => text(
            StatusCode::BAD_REQUEST,
            "bad size: at most 10737418240 bytes (10 GiB)\n",
        ),
        Some(len) => {
            // The body reports an exact size hint, so hyper sends Content-Length
            // (and for HEAD sends the header without the body).
            let mut r = Response::new(PatternBody::new(len).boxed());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
    }
}

/// Hash and count a streamed request body.
async fn upload(mut body: Incoming) -> Response<RespBody> {
    let mut hasher = Sha256::new();
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    hasher.update(data);
                    total = total.saturating_add(data.len() as u64);
                }
            }
            Err(e) => {
                tracing::debug!("upload aborted after {total} bytes: {e}");
                return text(StatusCode::BAD_REQUEST, "upload body could not be read\n");
            }
        }
    }
    let json = serde_json::json!({ "bytes": total, "sha256": hex::encode(hasher.finalize()) });
    let mut r = Response::new(Full::new(Bytes::from(json.to_string())).boxed());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A body of `remaining` pattern bytes starting at `offset`.
struct PatternBody {
    offset: u64,
    remaining: u64,
}

impl PatternBody {
    fn new(len: u64) -> Self {
        PatternBody {
            offset: 0,
            remaining: len,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let len = self.remaining.min(CHUNK as u64) as usize;
        let phase = (self.offset % PERIOD) as usize;
        let chunk = pattern().slice(phase..phase + len);
        self.offset += len as u64;
        self.remaining -= len as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_http::{Collect, Head, ResponseReader};
    use tokio::io::AsyncWriteExt;
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::TcpStream;

    async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener));
        addr
    }

    /// A response: its head and body.
    struct Resp {
        status: u16,
        head: Head,
        body: Vec<u8>,
    }

    impl Resp {
        fn header(&self, name: &str) -> Option<&str> {
            self.head.header(name)
        }
    }

    /// One keep-alive connection: requests go out on one half, responses are read on the
    /// other (bytes after one response stay in the reader for the next).
    struct Client {
        reader: ResponseReader<OwnedReadHalf>,
        writer: OwnedWriteHalf,
    }

    impl Client {
        async fn connect(addr: SocketAddr) -> Self {
            let (rd, writer) = TcpStream::connect(addr).await.unwrap().into_split();
            Client {
                reader: ResponseReader::new(rd),
                writer,
            }
        }

        async fn send(&mut self, req: &[u8]) {
            self.writer.write_all(req).await.unwrap();
        }

        /// Read one response (`head_only` for HEAD requests, which have no body).
        async fn response(&mut self, head_only: bool) -> Resp {
            let head = self.reader.read_final_head().await.unwrap();
            let mut body = Collect::new(usize::MAX);
            if !head_only {
                self.reader.read_body(&head, &mut body).await.unwrap();
            }
            Resp {
                status: head.status,
                head,
                body: body.body,
            }
        }
    }

    async fn request(addr: SocketAddr, req: &[u8], head_only: bool) -> Resp {
        let mut c = Client::connect(addr).await;
        c.send(req).await;
        c.response(head_only).await
    }

    async fn get(addr: SocketAddr, path: &str) -> Resp {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        request(addr, req.as_bytes(), false).await
    }

    #[tokio::test]
    async fn bytes_exact_content_and_length() {
        let addr = start().await;
        for n in [0u64, 1, 250, 251, 1_000_000] {
            let r = get(addr, &format!("/bytes/{n}")).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-length"), Some(n.to_string().as_str()));
            assert_eq!(r.body.len() as u64, n);
            let expected: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            assert!(r.body == expected, "content mismatch for n = {n}");
        }
    }

    #[tokio::test]
    async fn head_has_length_but_no_body() {
        let addr = start().await;
        let mut c = Client::connect(addr).await;
        c.send(b"HEAD /bytes/12345 HTTP/1.1\r\nHost: x\r\n\r\nGET /bytes/3 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let r = c.response(true).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some("12345"));
        // The next response follows immediately: no body bytes were sent for HEAD.
        let r = c.response(false).await;
        assert_eq!(r.body, [0, 1, 2]);
    }

    #[tokio::test]
    async fn large_size_is_streamed_not_buffered() {
        // 10 GiB is accepted: only the head is read, which proves the server did not
        // need to materialise the body first.
        let addr = start().await;
        let r = request(
            addr,
            b"HEAD /bytes/10737418240 HTTP/1.1\r\nHost: x\r\n\r\n",
            true,
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some("10737418240"));
    }

    #[tokio::test]
    async fn bad_sizes_are_400_and_unknown_paths_404() {
        let addr = start().await;
        for bad in [
            "/bytes/",
            "/bytes/abc",
            "/bytes/-1",
            "/bytes/+5",
            "/bytes/1e3",
            "/bytes/10737418241",
            "/bytes/99999999999999999999999",
        ] {
            let r = get(addr, bad).await;
            assert_eq!(r.status, 400, "{bad}");
            assert!(
                String::from_utf8_lossy(&r.body).contains("bad size"),
                "{bad}"
            );
        }
        assert_eq!(get(addr, "/nope").await.status, 404);
        assert_eq!(get(addr, "/bytes").await.status, 404);
        let r = get(addr, "/").await;
        assert_eq!(r.status, 200);
        assert!(String::from_utf8_lossy(&r.body).contains("/bytes/<N>"));
        let r = request(addr, b"GET /upload HTTP/1.1\r\nHost: x\r\n\r\n", false).await;
        assert_eq!(r.status, 405);
        assert_eq!(r.header("allow"), Some("POST"));
    }

    #[tokio::test]
    async fn upload_digest_matches() {
        let addr = start().await;
        let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let mut c = Client::connect(addr).await;
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        c.send(head.as_bytes()).await;
        c.send(&body).await;
        let r = c.response(false).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["bytes"], 300_000);
        assert_eq!(v["sha256"], hex::encode(Sha256::digest(&body)));

        // Chunked upload, empty body as well.
        let r = request(
            addr,
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            false,
        )
        .await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["bytes"], 5);
        assert_eq!(v["sha256"], hex::encode(Sha256::digest(b"abcde")));
        let r = request(
            addr,
            b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["bytes"], 0);
    }

    #[tokio::test]
    async fn keep_alive_two_requests_one_connection() {
        let addr = start().await;
        let mut c = Client::connect(addr).await;
        c.send(b"GET /bytes/300 HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let r1 = c.response(false).await;
        assert_eq!(r1.body.len(), 300);
        assert_eq!(r1.body[299], (299 % 251) as u8);
        c.send(b"GET /bytes/70000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let r2 = c.response(false).await;
        assert_eq!(r2.status, 200);
        assert_eq!(r2.body.len(), 70000);
        assert!(r2
            .body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8));
    }

    #[test]
    fn config_parsing() {
        let c: Config = toml::from_str("Listen = \"127.0.0.1:8080\"\nLog = \"debug\"").unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(c.log.as_deref(), Some("debug"));
        assert!(toml::from_str::<Config>("Listen = \"127.0.0.1:8080\"\nPort = 1").is_err());
        assert!(toml::from_str::<Config>("Listen = \"not an address\"").is_err());
    }

    #[tokio::test]
    async fn run_requires_a_listen_address() {
        let err = run(Args {
            config: None,
            listen: None,
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
    }
}
