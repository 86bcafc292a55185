//! `chive perf`: torperf/OnionPerf-style timed HTTP transfers through a SOCKS5 proxy.
//!
//! Each transfer connects to the proxy, does a SOCKS5 CONNECT with the URL's
//! host sent as given (a name is never resolved locally, like
//! `curl --socks5-hostname`), sends one HTTP/1.1 GET or POST with
//! `Connection: close`, reads the response, and prints one JSON line on stdout:
//! `url, start, socket_connected, socks_connected, request_sent, first_byte,
//! last_byte, bytes, expected_bytes, status, error, socks_user`. Times are UNIX
//! seconds (µs precision) taken from one clock that never goes backwards; a
//! time is null if the transfer did not get that far.
//!
//! `bytes` counts body bytes received (GET) or uploaded (POST); `expected_bytes`
//! is the response Content-Length (GET) or the upload size (POST).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::httpd::{pattern, CHUNK, PERIOD};

/// Largest accepted HTTP response head (status line plus headers).
const MAX_HEAD: usize = 64 * 1024;
/// Largest chunk-size or trailer line in a chunked body.
const MAX_LINE: usize = 4096;
/// Largest response body kept for checking (the JSON reply of `/upload`).
const MAX_CAPTURE: usize = 64 * 1024;
/// Upper bound on `--timeout` and `--interval` (one day), to keep `Duration` math safe.
const MAX_SECS: f64 = 86_400.0;

/// HTTP method used by `chive perf`.
#[derive(clap::ValueEnum, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HttpMethod {
    /// Download the URL.
    Get,
    /// Upload `--upload-bytes` bytes of the /bytes pattern to the URL.
    Post,
}

/// Command-line arguments of `chive perf`. Every option may also be set in the
/// `--config` TOML file, keyed by its long name with '-' replaced by '_'
/// (e.g. `socks_user = "alice"`); flags given on the command line win.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Optional TOML config file (keys: socks, url, count, interval, socks_user,
    /// socks_pass, isolate, timeout, method, upload_bytes, verify, log).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// SOCKS5 proxy address [default: 127.0.0.1:9050].
    #[arg(long)]
    pub socks: Option<SocketAddr>,
    /// URL to fetch: http://HOST[:PORT]/PATH; HOST may be a name (resolved by the proxy) or an IP (required).
    #[arg(long)]
    pub url: Option<String>,
    /// Number of transfers; 0 = run forever [default: 1].
    #[arg(long)]
    pub count: Option<u64>,
    /// Seconds between the starts of consecutive transfers [default: 0].
    #[arg(long)]
    pub interval: Option<f64>,
    /// SOCKS5 username (username/password auth; distinct names isolate circuits).
    #[arg(long)]
    pub socks_user: Option<String>,
    /// SOCKS5 password (needs a username or --isolate) [default: empty].
    #[arg(long)]
    pub socks_pass: Option<String>,
    /// Use a fresh random SOCKS username per transfer, so each gets a fresh circuit.
    #[arg(long)]
    pub isolate: bool,
    /// Seconds a whole transfer may take before it is recorded as "timeout" [default: 60].
    #[arg(long)]
    pub timeout: Option<f64>,
    /// HTTP method [default: get].
    #[arg(long, value_enum)]
    pub method: Option<HttpMethod>,
    /// For POST: bytes to upload (the /bytes pattern, byte i = i % 251) [default: 0].
    #[arg(long)]
    pub upload_bytes: Option<u64>,
    /// Check the body against the /bytes pattern (GET) or the server's reported
    /// count and SHA-256 (POST to /upload); a mismatch is an error.
    #[arg(long)]
    pub verify: bool,
    /// Log filter for stderr [default: warn].
    #[arg(long)]
    pub log: Option<String>,
}

/// The `--config` file: the same options as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socks: Option<SocketAddr>,
    url: Option<String>,
    count: Option<u64>,
    interval: Option<f64>,
    socks_user: Option<String>,
    socks_pass: Option<String>,
    isolate: Option<bool>,
    timeout: Option<f64>,
    method: Option<HttpMethod>,
    upload_bytes: Option<u64>,
    verify: Option<bool>,
    log: Option<String>,
}

/// Validated settings for a run.
#[derive(Debug, Clone)]
struct Settings {
    socks: SocketAddr,
    url_text: String,
    url: HttpUrl,
    count: u64,
    interval: Duration,
    user: Option<String>,
    pass: String,
    isolate: bool,
    timeout: Duration,
    method: HttpMethod,
    upload_bytes: u64,
    verify: bool,
    log: String,
}

/// Merge flags over the file and validate everything.
fn settings(args: Args) -> anyhow::Result<Settings> {
    let file: FileConfig = match &args.config {
        Some(path) => crate::common::load_config(path)?,
        None => FileConfig::default(),
    };
    let url_text = args
        .url
        .or(file.url)
        .ok_or_else(|| anyhow!("--url is required (or `url` in the --config file)"))?;
    let url = parse_url(&url_text).map_err(|e| anyhow!("bad --url {url_text:?}: {e}"))?;
    let secs = |name: &str, v: f64| -> anyhow::Result<Duration> {
        if !(v.is_finite() && (0.0..=MAX_SECS).contains(&v)) {
            bail!("--{name} must be between 0 and {MAX_SECS} seconds, got {v}");
        }
        Ok(Duration::from_secs_f64(v))
    };
    let timeout = secs("timeout", args.timeout.or(file.timeout).unwrap_or(60.0))?;
    if timeout.is_zero() {
        bail!("--timeout must be positive");
    }
    let interval = secs("interval", args.interval.or(file.interval).unwrap_or(0.0))?;
    let user = args.socks_user.or(file.socks_user);
    let pass = args.socks_pass.or(file.socks_pass);
    let isolate = args.isolate || file.isolate.unwrap_or(false);
    if pass.is_some() && user.is_none() && !isolate {
        bail!("--socks-pass needs --socks-user or --isolate");
    }
    // RFC 1929 encodes each length in one byte.
    if user.as_ref().is_some_and(|u| u.is_empty() || u.len() > 255) {
        bail!("--socks-user must be 1 to 255 bytes");
    }
    if pass.as_ref().is_some_and(|p| p.len() > 255) {
        bail!("--socks-pass must be at most 255 bytes");
    }
    let method = args.method.or(file.method).unwrap_or(HttpMethod::Get);
    let upload_bytes = args.upload_bytes.or(file.upload_bytes);
    if upload_bytes.is_some() && method != HttpMethod::Post {
        bail!("--upload-bytes needs --method post");
    }
    Ok(Settings {
        socks: args
            .socks
            .or(file.socks)
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9050))),
        url_text,
        url,
        count: args.count.or(file.count).unwrap_or(1),
        interval,
        user,
        pass: pass.unwrap_or_default(),
        isolate,
        timeout,
        method,
        upload_bytes: upload_bytes.unwrap_or(0),
        verify: args.verify || file.verify.unwrap_or(false),
        log: args.log.or(file.log).unwrap_or_else(|| "warn".into()),
    })
}

/// Run `chive perf`. Returns an error (exit code 1) if any transfer failed;
/// failed transfers never stop the sequence.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let settings = settings(args)?;
    crate::common::init_logging(&settings.log);
    run_transfers(&settings, &mut std::io::stdout()).await
}

/// Run the configured sequence of transfers, writing one JSON line per transfer to `out`.
async fn run_transfers(settings: &Settings, out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let clock = Clock::new();
    let mut done: u64 = 0;
    let mut failed: u64 = 0;
    loop {
        let started = tokio::time::Instant::now();
        let user = if settings.isolate {
            let mut r = [0u8; 8];
            rand::thread_rng().fill_bytes(&mut r);
            Some(format!("chive-perf-{}", hex::encode(r)))
        } else {
            settings.user.clone()
        };
        let rec = transfer(settings, &clock, user).await;
        if let Some(e) = &rec.error {
            tracing::warn!("transfer {done} failed: {e}");
            failed += 1;
        }
        print_record(out, &rec)?;
        done += 1;
        if settings.count != 0 && done >= settings.count {
            break;
        }
        tokio::time::sleep_until(started + settings.interval).await;
    }
    if failed > 0 {
        bail!("{failed} of {done} transfers failed");
    }
    Ok(())
}

/// Write one JSON line and flush it, so consumers see each record at once.
fn print_record(out: &mut impl std::io::Write, rec: &Record) -> anyhow::Result<()> {
    let line = serde_json::to_string(rec)?;
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Wall-clock UNIX time that never goes backwards: the wall clock is read once,
/// then advanced by a monotonic clock, so recorded events stay ordered.
struct Clock {
    base_us: u64,
    base: Instant,
}

impl Clock {
    fn new() -> Self {
        let base_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Clock {
            base_us,
            base: Instant::now(),
        }
    }

    /// UNIX seconds with microsecond precision.
    fn now(&self) -> f64 {
        let us = self.base_us + self.base.elapsed().as_micros() as u64;
        us as f64 / 1e6
    }
}

/// The outcome of one transfer: one JSON line.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Record {
    /// The URL fetched.
    pub url: String,
    /// When the transfer began.
    pub start: f64,
    /// TCP connection to the SOCKS proxy established.
    pub socket_connected: Option<f64>,
    /// SOCKS handshake succeeded (the stream through the overlay is open).
    pub socks_connected: Option<f64>,
    /// The whole HTTP request (including any upload body) was written.
    pub request_sent: Option<f64>,
    /// The first response byte arrived.
    pub first_byte: Option<f64>,
    /// The last body byte arrived.
    pub last_byte: Option<f64>,
    /// Body bytes received (GET) or uploaded (POST).
    pub bytes: u64,
    /// Response Content-Length (GET) or upload size (POST).
    pub expected_bytes: Option<u64>,
    /// HTTP status code.
    pub status: Option<u16>,
    /// Why the transfer failed, if it did.
    pub error: Option<String>,
    /// SOCKS username used.
    pub socks_user: Option<String>,
}

/// Run one transfer under the overall timeout; never fails, errors go in the record.
async fn transfer(settings: &Settings, clock: &Clock, user: Option<String>) -> Record {
    let mut rec = Record {
        url: settings.url_text.clone(),
        start: clock.now(),
        socket_connected: None,
        socks_connected: None,
        request_sent: None,
        first_byte: None,
        last_byte: None,
        bytes: 0,
        expected_bytes: None,
        status: None,
        error: None,
        socks_user: user.clone(),
    };
    let creds = user.map(|u| (u, settings.pass.clone()));
    let outcome =
        tokio::time::timeout(settings.timeout, attempt(settings, clock, creds, &mut rec)).await;
    rec.error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some("timeout".into()),
    };
    rec
}

/// The transfer itself; fills `rec` as it goes so a timeout keeps the partial record.
async fn attempt(
    settings: &Settings,
    clock: &Clock,
    creds: Option<(String, String)>,
    rec: &mut Record,
) -> Result<(), String> {
    let mut s = TcpStream::connect(settings.socks)
        .await
        .map_err(|e| format!("socks: cannot connect to proxy: {}", e.kind()))?;
    let _ = s.set_nodelay(true);
    rec.socket_connected = Some(clock.now());

    socks5_connect(&mut s, &settings.url, creds.as_ref()).await?;
    rec.socks_connected = Some(clock.now());

    let upload_digest = send_request(&mut s, settings, rec).await?;
    rec.request_sent = Some(clock.now());

    let mut conn = Conn {
        s: &mut s,
        buf: Vec::new(),
    };
    let head = loop {
        let head = conn.read_head(clock, rec).await?;
        // Skip interim 1xx responses (e.g. an unsolicited 100 Continue).
        if !(100..200).contains(&head.status) {
            break head;
        }
    };
    rec.status = Some(head.status);
    let is_get = settings.method == HttpMethod::Get;
    if is_get {
        rec.expected_bytes = head.content_length;
    }
    let mut sink = Sink {
        received: 0,
        verify: settings.verify && is_get && (200..300).contains(&head.status),
        capture: Vec::new(),
        count_into_record: is_get,
    };
    conn.read_body(&head, &mut sink, rec).await?;
    rec.last_byte = Some(clock.now());

    if !(200..300).contains(&head.status) {
        return Err(format!("http: status {}", head.status));
    }
    if let (true, Some(digest)) = (settings.verify, upload_digest) {
        check_upload_reply(&sink.capture, settings.upload_bytes, &digest)?;
    }
    Ok(())
}

/// SOCKS5 client handshake (RFC 1928/1929): CONNECT to the URL's host, sent as
/// a domain name unless it is an IP literal.
async fn socks5_connect(
    s: &mut TcpStream,
    url: &HttpUrl,
    creds: Option<&(String, String)>,
) -> Result<(), String> {
    let io = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "socks: proxy closed the connection".to_string()
        } else {
            format!("socks: {}", e.kind())
        }
    };
    // Offer only user/pass when we have credentials: isolation must not
    // silently degrade to no-auth.
    let method = if creds.is_some() { 0x02 } else { 0x00 };
    s.write_all(&[5, 1, method]).await.map_err(io)?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await.map_err(io)?;
    if choice[0] != 5 {
        return Err(format!("socks: bad reply version {}", choice[0]));
    }
    if choice[1] != method {
        return Err("socks: no acceptable authentication method".into());
    }
    if let Some((user, pass)) = creds {
        let mut msg = Vec::with_capacity(3 + user.len() + pass.len());
        msg.push(1);
        msg.push(u8::try_from(user.len()).map_err(|_| "socks: username too long")?);
        msg.extend_from_slice(user.as_bytes());
        msg.push(u8::try_from(pass.len()).map_err(|_| "socks: password too long")?);
        msg.extend_from_slice(pass.as_bytes());
        s.write_all(&msg).await.map_err(io)?;
        let mut status = [0u8; 2];
        s.read_exact(&mut status).await.map_err(io)?;
        if status[1] != 0 {
            return Err("socks: authentication failed".into());
        }
    }
    let mut req = vec![5, 1, 0];
    match &url.host {
        UrlHost::Ip(IpAddr::V4(ip)) => {
            req.push(1);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Ip(IpAddr::V6(ip)) => {
            req.push(4);
            req.extend_from_slice(&ip.octets());
        }
        UrlHost::Name(name) => {
            req.push(3);
            // parse_url bounds names to 255 bytes.
            req.push(u8::try_from(name.len()).map_err(|_| "socks: hostname too long")?);
            req.extend_from_slice(name.as_bytes());
        }
    }
    req.extend_from_slice(&url.port.to_be_bytes());
    s.write_all(&req).await.map_err(io)?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(io)?;
    if head[0] != 5 {
        return Err(format!("socks: bad reply version {}", head[0]));
    }
    if head[1] != 0 {
        return Err(format!("socks: {}", socks5_reply_text(head[1])));
    }
    // Skip BND.ADDR and BND.PORT.
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => usize::from(s.read_u8().await.map_err(io)?),
        other => return Err(format!("socks: bad address type {other} in reply")),
    };
    let mut skip = [0u8; 255 + 2];
    s.read_exact(&mut skip[..addr_len + 2]).await.map_err(io)?;
    Ok(())
}

/// Human text for a SOCKS5 REP code (RFC 1928 section 6).
fn socks5_reply_text(code: u8) -> String {
    match code {
        1 => "general failure".into(),
        2 => "connection not allowed by ruleset".into(),
        3 => "network unreachable".into(),
        4 => "host unreachable".into(),
        5 => "connection refused".into(),
        6 => "TTL expired".into(),
        7 => "command not supported".into(),
        8 => "address type not supported".into(),
        other => format!("reply code {other}"),
    }
}

/// Write the request (and for POST, the pattern body, hashed as it goes).
/// Returns the upload's SHA-256 for POST.
async fn send_request(
    s: &mut TcpStream,
    settings: &Settings,
    rec: &mut Record,
) -> Result<Option<[u8; 32]>, String> {
    let io = |e: std::io::Error| format!("http: write failed: {}", e.kind());
    let url = &settings.url;
    let mut head = match settings.method {
        HttpMethod::Get => format!("GET {} HTTP/1.1\r\n", url.path),
        HttpMethod::Post => format!(
            "POST {} HTTP/1.1\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n",
            url.path, settings.upload_bytes
        ),
    };
    head.push_str(&format!(
        "Host: {}\r\nUser-Agent: chive-perf\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.authority
    ));
    s.write_all(head.as_bytes()).await.map_err(io)?;
    let digest = if settings.method == HttpMethod::Post {
        rec.expected_bytes = Some(settings.upload_bytes);
        let pat = pattern();
        let mut hasher = Sha256::new();
        let mut sent: u64 = 0;
        while sent < settings.upload_bytes {
            let len = (settings.upload_bytes - sent).min(CHUNK as u64) as usize;
            let phase = (sent % PERIOD) as usize;
            let chunk = pat
                .get(phase..phase + len)
                .ok_or("internal: pattern slice")?;
            s.write_all(chunk).await.map_err(io)?;
            hasher.update(chunk);
            sent += len as u64;
            rec.bytes = sent;
        }
        Some(hasher.finalize().into())
    } else {
        None
    };
    s.flush().await.map_err(io)?;
    Ok(digest)
}

/// For `--verify` with POST: the server's `{"bytes", "sha256"}` must match what was sent.
fn check_upload_reply(body: &[u8], sent: u64, digest: &[u8; 32]) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Reply {
        bytes: u64,
        sha256: String,
    }
    let reply: Reply = serde_json::from_slice(body)
        .map_err(|_| "verify: upload reply is not {\"bytes\", \"sha256\"} JSON".to_string())?;
    if reply.bytes != sent {
        return Err(format!(
            "verify: server received {} bytes, sent {sent}",
            reply.bytes
        ));
    }
    if !reply.sha256.eq_ignore_ascii_case(&hex::encode(digest)) {
        return Err("verify: upload digest mismatch".into());
    }
    Ok(())
}

/// Where body bytes go: counted, optionally verified, the first few KiB kept.
struct Sink {
    received: u64,
    verify: bool,
    capture: Vec<u8>,
    /// GET counts body bytes in the record; POST reports uploaded bytes instead.
    count_into_record: bool,
}

impl Sink {
    fn feed(&mut self, data: &[u8], rec: &mut Record) -> Result<(), String> {
        if self.verify {
            if let Some(at) = first_mismatch(self.received, data) {
                return Err(format!("verify: mismatch at byte {at}"));
            }
        }
        let room = MAX_CAPTURE.saturating_sub(self.capture.len());
        self.capture
            .extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
        self.received += data.len() as u64;
        if self.count_into_record {
            rec.bytes = self.received;
        }
        Ok(())
    }
}

/// The absolute offset of the first byte of `data` (starting at `offset`) that
/// differs from the /bytes pattern, compared a chunk at a time.
fn first_mismatch(offset: u64, data: &[u8]) -> Option<u64> {
    let pat = pattern();
    let mut pos = 0usize;
    for piece in data.chunks(CHUNK) {
        let at = offset + pos as u64;
        let phase = (at % PERIOD) as usize;
        let expected = pat.get(phase..phase + piece.len())?;
        if piece != expected {
            let i = piece.iter().zip(expected).position(|(a, b)| a != b)?;
            return Some(at + i as u64);
        }
        pos += piece.len();
    }
    None
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    content_length: Option<u64>,
    chunked: bool,
}

/// Parse a response head (everything before the blank line).
fn parse_head(raw: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "http: response head is not text")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !(version == "HTTP/1.1" || version == "HTTP/1.0")
        || code.len() != 3
        || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return Err("http: bad status line".into());
    }
    let status: u16 = code.parse().map_err(|_| "http: bad status line")?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or("http: bad header line")?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: u64 = value
                .parse()
                .map_err(|_| "http: bad Content-Length".to_string())?;
            if content_length.is_some_and(|old| old != n) {
                return Err("http: conflicting Content-Length".into());
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    if chunked {
        // RFC 9112 6.3: Transfer-Encoding overrides Content-Length.
        content_length = None;
    }
    Ok(Head {
        status,
        content_length,
        chunked,
    })
}

/// A response being read: the stream plus bytes read but not yet consumed.
struct Conn<'a> {
    s: &'a mut TcpStream,
    buf: Vec<u8>,
}

impl Conn<'_> {
    /// Read more bytes into `buf`; Ok(0) at EOF.
    async fn fill(&mut self) -> Result<usize, String> {
        self.buf.reserve(CHUNK);
        self.s
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| format!("http: read failed: {}", e.kind()))
    }

    /// Read and parse one response head; records the first byte's arrival.
    async fn read_head(&mut self, clock: &Clock, rec: &mut Record) -> Result<Head, String> {
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
            if self.buf.len() > MAX_HEAD {
                return Err("http: response head too large".into());
            }
            let n = self.fill().await?;
            if n == 0 {
                return Err(if rec.first_byte.is_none() {
                    "http: connection closed before a response".into()
                } else {
                    "http: connection closed in the response head".into()
                });
            }
            if rec.first_byte.is_none() {
                rec.first_byte = Some(clock.now());
            }
        }
    }

    /// Read the body as the head describes it, feeding `sink`.
    async fn read_body(
        &mut self,
        head: &Head,
        sink: &mut Sink,
        rec: &mut Record,
    ) -> Result<(), String> {
        if head.status == 204 || head.status == 304 {
            return Ok(());
        }
        if head.chunked {
            return self.read_chunked(sink, rec).await;
        }
        let limit = head.content_length;
        loop {
            let take = match limit {
                Some(len) => (len - sink.received).min(self.buf.len() as u64) as usize,
                None => self.buf.len(),
            };
            let data: Vec<u8> = self.buf.drain(..take).collect();
            sink.feed(&data, rec)?;
            if limit == Some(sink.received) {
                return Ok(());
            }
            self.buf.clear();
            if self.fill().await? == 0 {
                return match limit {
                    None => Ok(()),
                    Some(len) => Err(format!(
                        "http: connection closed after {} of {len} body bytes",
                        sink.received
                    )),
                };
            }
        }
    }

    /// Read a CRLF-terminated line (without the CRLF), bounded by MAX_LINE.
    async fn read_line(&mut self) -> Result<String, String> {
        loop {
            if let Some(p) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8(self.buf.drain(..p).collect())
                    .map_err(|_| "http: bad chunked encoding")?;
                self.buf.drain(..2);
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err("http: bad chunked encoding (line too long)".into());
            }
            if self.fill().await? == 0 {
                return Err("http: connection closed in a chunked body".into());
            }
        }
    }

    /// Decode `Transfer-Encoding: chunked` (RFC 9112 section 7.1).
    async fn read_chunked(&mut self, sink: &mut Sink, rec: &mut Record) -> Result<(), String> {
        loop {
            let line = self.read_line().await?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            if size_text.is_empty() || size_text.len() > 16 {
                return Err("http: bad chunk size".into());
            }
            let mut left =
                u64::from_str_radix(size_text, 16).map_err(|_| "http: bad chunk size")?;
            if left == 0 {
                // Trailer section, ended by an empty line.
                while !self.read_line().await?.is_empty() {}
                return Ok(());
            }
            while left > 0 {
                if self.buf.is_empty() && self.fill().await? == 0 {
                    return Err("http: connection closed in a chunked body".into());
                }
                let take = left.min(self.buf.len() as u64) as usize;
                let data: Vec<u8> = self.buf.drain(..take).collect();
                sink.feed(&data, rec)?;
                left -= take as u64;
            }
            if !self.read_line().await?.is_empty() {
                return Err("http: bad chunked encoding (missing CRLF)".into());
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The host part of a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UrlHost {
    Ip(IpAddr),
    Name(String),
}

/// An `http://` URL, split for the SOCKS request and the HTTP request line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpUrl {
    host: UrlHost,
    port: u16,
    /// `host[:port]` as written, for the Host header.
    authority: String,
    /// Path and query, starting with '/'.
    path: String,
}

/// Parse `http://HOST[:PORT][/PATH][?QUERY][#FRAGMENT]`.
fn parse_url(url: &str) -> Result<HttpUrl, &'static str> {
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .and_then(|_| url.get(7..))
        .ok_or("only http:// URLs are supported")?;
    let rest = rest.split('#').next().unwrap_or_default();
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if path.bytes().any(|b| b <= b' ' || b == 0x7F) {
        return Err("the path must not contain spaces or control characters");
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    if authority.contains('@') {
        return Err("user info in URLs is not supported");
    }
    let (host_text, port_text) = if let Some(inner) = authority.strip_prefix('[') {
        let (v6, after) = inner.split_once(']').ok_or("unterminated [IPv6] host")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after [IPv6] host")?),
        };
        let ip: std::net::Ipv6Addr = v6.parse().map_err(|_| "bad IPv6 address")?;
        (UrlHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let host = if let Ok(ip) = h.parse::<std::net::Ipv4Addr>() {
            UrlHost::Ip(IpAddr::V4(ip))
        } else {
            if h.is_empty() || h.len() > 255 {
                return Err("the host must be 1 to 255 characters");
            }
            if !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
            {
                return Err("bad character in host name");
            }
            UrlHost::Name(h.to_ascii_lowercase())
        };
        (host, p)
    };
    let port = match port_text {
        None => 80,
        // Digits only: u16::from_str would also take a leading '+'.
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            match p.parse::<u16>() {
                Ok(p) if p != 0 => p,
                _ => return Err("bad port"),
            }
        }
        Some(_) => return Err("bad port"),
    };
    Ok(HttpUrl {
        host: host_text,
        port,
        authority: authority.to_string(),
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_client::socks::{accept_socks, send_reply, SocksReply, SocksRequest, TargetAddr};
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    async fn start_httpd() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(crate::httpd::serve(l));
        a
    }

    type Seen = Arc<Mutex<Vec<SocksRequest>>>;

    /// A tiny SOCKS server: accept_socks, then a direct TCP connect. Every domain
    /// maps to 127.0.0.1 (so tests also prove names are sent unresolved).
    async fn start_socks() -> (SocketAddr, Seen) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        let seen: Seen = Arc::default();
        let seen2 = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let seen = seen2.clone();
                tokio::spawn(async move {
                    let Ok(req) = accept_socks(&mut s).await else {
                        return;
                    };
                    seen.lock().unwrap().push(req.clone());
                    let target = match &req.target {
                        TargetAddr::Ip(a) => *a,
                        TargetAddr::Domain(_, p) => SocketAddr::from(([127, 0, 0, 1], *p)),
                    };
                    match TcpStream::connect(target).await {
                        Ok(mut up) => {
                            let bound = up.local_addr().ok();
                            send_reply(&mut s, &req, SocksReply::Succeeded, bound)
                                .await
                                .unwrap();
                            let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                        }
                        Err(_) => {
                            let _ =
                                send_reply(&mut s, &req, SocksReply::ConnectionRefused, None).await;
                        }
                    }
                });
            }
        });
        (a, seen)
    }

    /// A one-shot raw HTTP server that reads a request head, then sends `reply` and closes.
    async fn start_raw(reply: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 1024];
                    while find(&buf, b"\r\n\r\n").is_none() {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let _ = s.write_all(reply).await;
                });
            }
        });
        a
    }

    fn base(socks: SocketAddr, url: String) -> Settings {
        Settings {
            socks,
            url: parse_url(&url).unwrap(),
            url_text: url,
            count: 1,
            interval: Duration::ZERO,
            user: None,
            pass: String::new(),
            isolate: false,
            timeout: Duration::from_secs(20),
            method: HttpMethod::Get,
            upload_bytes: 0,
            verify: true,
            log: "warn".into(),
        }
    }

    fn assert_monotonic(r: &Record) {
        let times = [
            Some(r.start),
            r.socket_connected,
            r.socks_connected,
            r.request_sent,
            r.first_byte,
            r.last_byte,
        ];
        let times: Vec<f64> = times
            .iter()
            .map(|t| t.expect("all times reached"))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        // Sanity: near the real clock.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - r.start).abs() < 60.0);
    }

    #[tokio::test]
    async fn get_through_socks_with_hostname() {
        let http = start_httpd().await;
        let (socks, seen) = start_socks().await;
        let url = format!("http://LocalHost:{}/bytes/1000000", http.port());
        let r = transfer(&base(socks, url.clone()), &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.status, Some(200));
        assert_eq!(r.bytes, 1_000_000);
        assert_eq!(r.expected_bytes, Some(1_000_000));
        assert_eq!(r.url, url);
        assert_eq!(r.socks_user, None);
        assert_monotonic(&r);
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen[0].target,
            TargetAddr::Domain("localhost".into(), http.port())
        );
        assert_eq!(seen[0].auth, None);
    }

    #[tokio::test]
    async fn post_upload_counts_and_verifies() {
        let http = start_httpd().await;
        let (socks, _) = start_socks().await;
        let mut s = base(socks, format!("http://127.0.0.1:{}/upload", http.port()));
        s.method = HttpMethod::Post;
        s.upload_bytes = 300_001;
        let r = transfer(&s, &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.bytes, 300_001);
        assert_eq!(r.expected_bytes, Some(300_001));
        assert_eq!(r.status, Some(200));
        assert_monotonic(&r);
    }

    #[tokio::test]
    async fn http_404_is_an_error_record() {
        let http = start_httpd().await;
        let (socks, _) = start_socks().await;
        let r = transfer(
            &base(socks, format!("http://127.0.0.1:{}/nope", http.port())),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("http: status 404"));
        assert_eq!(r.status, Some(404));
        assert!(r.last_byte.is_some());
    }

    #[tokio::test]
    async fn unreachable_socks_port_gives_error_record() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let r = transfer(
            &base(dead, "http://127.0.0.1:1/bytes/1".into()),
            &Clock::new(),
            None,
        )
        .await;
        let e = r.error.unwrap();
        assert!(e.starts_with("socks: cannot connect to proxy"), "{e}");
        assert_eq!(r.socket_connected, None);
        assert_eq!(r.bytes, 0);
    }

    #[tokio::test]
    async fn socks_refusal_is_reported() {
        let (socks, _) = start_socks().await;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let r = transfer(
            &base(socks, format!("http://{dead}/bytes/1")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("socks: connection refused"));
        assert!(r.socket_connected.is_some());
        assert_eq!(r.socks_connected, None);
    }

    #[tokio::test]
    async fn credentials_and_isolation_reach_the_proxy() {
        let http = start_httpd().await;
        let (socks, seen) = start_socks().await;
        let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/10", http.port()));
        s.pass = "pw".into();
        let clock = Clock::new();
        let a = transfer(&s, &clock, Some("alice".into())).await;
        let b = transfer(&s, &clock, Some("bob".into())).await;
        assert_eq!((a.error, b.error), (None, None));
        assert!(b.start >= a.last_byte.unwrap());
        assert_eq!(a.socks_user.as_deref(), Some("alice"));
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].auth, Some((b"alice".to_vec(), b"pw".to_vec())));
        assert_eq!(seen[1].auth, Some((b"bob".to_vec(), b"pw".to_vec())));
    }

    #[tokio::test]
    async fn verify_detects_mismatch_and_truncation() {
        let (socks, _) = start_socks().await;
        let bad =
            start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n\x00\x01\x02\x09\x04").await;
        let r = transfer(
            &base(socks, format!("http://{bad}/bytes/5")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("verify: mismatch at byte 3"));
        let short =
            start_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n\x00\x01\x02\x03").await;
        let r = transfer(
            &base(socks, format!("http://{short}/bytes/10")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(
            r.error.as_deref(),
            Some("http: connection closed after 4 of 10 body bytes")
        );
        assert_eq!(r.bytes, 4);
        assert_eq!(r.last_byte, None);
    }

    #[tokio::test]
    async fn chunked_and_eof_delimited_bodies() {
        let (socks, _) = start_socks().await;
        let chunked = start_raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\n\x00\x01\r\n3\r\n\x02\x03\x04\r\n0\r\nX-T: 1\r\n\r\n",
        )
        .await;
        let r = transfer(
            &base(socks, format!("http://{chunked}/")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error, None);
        assert_eq!((r.bytes, r.expected_bytes), (5, None));
        let eof = start_raw(b"HTTP/1.0 200 OK\r\n\r\n\x00\x01\x02").await;
        let r = transfer(&base(socks, format!("http://{eof}/")), &Clock::new(), None).await;
        assert_eq!(r.error, None);
        assert_eq!(r.bytes, 3);
        let garbage = start_raw(b"SSH-2.0-OpenSSH\r\n\r\n").await;
        let r = transfer(
            &base(socks, format!("http://{garbage}/")),
            &Clock::new(),
            None,
        )
        .await;
        assert_eq!(r.error.as_deref(), Some("http: bad status line"));
    }

    #[tokio::test]
    async fn timeout_keeps_partial_record() {
        // A "proxy" that accepts and never answers.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = l.accept().await.unwrap();
                held.push(s);
            }
        });
        let mut s = base(a, "http://127.0.0.1:1/".into());
        s.timeout = Duration::from_millis(200);
        let r = transfer(&s, &Clock::new(), None).await;
        assert_eq!(r.error.as_deref(), Some("timeout"));
        assert!(r.socket_connected.is_some());
        assert_eq!(r.socks_connected, None);
    }

    #[tokio::test]
    async fn run_reports_failure_but_completes_the_sequence() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let mut s = base(dead, "http://example.invalid/".into());
        s.count = 3;
        let mut out = Vec::new();
        let err = run_transfers(&s, &mut out).await.unwrap_err();
        assert_eq!(err.to_string(), "3 of 3 transfers failed");
        let lines: Vec<serde_json::Value> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[2]["error"].as_str().unwrap().starts_with("socks:"));
        assert!(lines[2]["socket_connected"].is_null());

        let http = start_httpd().await;
        let (socks, seen) = start_socks().await;
        let mut s = base(socks, format!("http://127.0.0.1:{}/bytes/100", http.port()));
        s.count = 2;
        s.isolate = true;
        s.interval = Duration::from_millis(300);
        let mut out = Vec::new();
        let t0 = Instant::now();
        run_transfers(&s, &mut out).await.unwrap();
        // The interval separates transfer starts, and no pause follows the last one.
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(550),
            "{took:?}"
        );
        let text = String::from_utf8(out).unwrap();
        let recs: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0]["bytes"], 100);
        assert_eq!(recs[0]["status"], 200);
        assert!(recs[0]["error"].is_null());
        let keys: Vec<&String> = recs[0].as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 12);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let (u0, u1) = (
            seen[0].auth.clone().unwrap().0,
            seen[1].auth.clone().unwrap().0,
        );
        assert!(u0.starts_with(b"chive-perf-") && u0 != u1);
        assert_eq!(recs[1]["socks_user"].as_str().unwrap().as_bytes(), &u1[..]);
    }

    #[test]
    fn url_parsing() {
        let u = parse_url("http://example.com:8080/a/b?c=d#frag").unwrap();
        assert_eq!(u.host, UrlHost::Name("example.com".into()));
        assert_eq!(
            (u.port, u.authority.as_str(), u.path.as_str()),
            (8080, "example.com:8080", "/a/b?c=d")
        );
        let u = parse_url("HTTP://10.0.0.1").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("10.0.0.1".parse().unwrap()), 80, "/")
        );
        let u = parse_url("http://[::1]:81?q").unwrap();
        assert_eq!(
            (u.host, u.port, u.path.as_str()),
            (UrlHost::Ip("::1".parse().unwrap()), 81, "/?q")
        );
        for bad in [
            "https://x/",
            "ftp://x",
            "http://",
            "http://a b/",
            "http://x:0/",
            "http://x:99999/",
            "http://x:/",
            "http://u@x/",
            "http://[::1/",
            "http://[zz]/",
            "http://x/a b",
            "http://x:+80/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn head_parsing() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y").unwrap();
        assert_eq!(
            h,
            Head {
                status: 200,
                content_length: Some(12),
                chunked: false
            }
        );
        let h = parse_head(
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\nTransfer-Encoding: gzip, chunked",
        )
        .unwrap();
        assert_eq!(
            h,
            Head {
                status: 404,
                content_length: None,
                chunked: true
            }
        );
        for bad in [
            &b"HTTP/2 200 OK"[..],
            b"HTTP/1.1 20 OK",
            b"HTTP/1.1 abc",
            b"HTTP/1.1 200 OK\r\nnocolon",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
            b"\xff\xfe",
        ] {
            assert!(
                parse_head(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn mismatch_finder() {
        let good: Vec<u8> = (1000..200_000u64).map(|i| (i % 251) as u8).collect();
        assert_eq!(first_mismatch(1000, &good), None);
        let mut bad = good.clone();
        bad[150_000] ^= 1;
        assert_eq!(first_mismatch(1000, &bad), Some(151_000));
        assert_eq!(first_mismatch(0, &good), Some(0));
    }

    #[test]
    fn settings_merge_file_and_flags() {
        let dir = std::env::temp_dir().join(format!("chive-perf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("perf.toml");
        std::fs::write(
            &path,
            "url = \"http://a/\"\ncount = 5\nsocks_user = \"u\"\nmethod = \"post\"\nupload_bytes = 7\nverify = true\n",
        )
        .unwrap();
        let s = settings(Args {
            config: Some(path.clone()),
            count: Some(2),
            ..Args::default()
        })
        .unwrap();
        assert_eq!(
            (
                s.count,
                s.user.as_deref(),
                s.method,
                s.upload_bytes,
                s.verify
            ),
            (2, Some("u"), HttpMethod::Post, 7, true)
        );
        assert_eq!(s.socks, "127.0.0.1:9050".parse().unwrap());
        assert_eq!(s.timeout, Duration::from_secs(60));
        std::fs::write(&path, "url = \"http://a/\"\nbogus = 1\n").unwrap();
        assert!(settings(Args {
            config: Some(path.clone()),
            ..Args::default()
        })
        .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(settings(Args::default()).is_err());
        let url = Some("http://a/".to_string());
        assert!(settings(Args {
            url: url.clone(),
            timeout: Some(0.0),
            ..Args::default()
        })
        .is_err());
        assert!(settings(Args {
            url: url.clone(),
            interval: Some(f64::NAN),
            ..Args::default()
        })
        .is_err());
        assert!(settings(Args {
            url: url.clone(),
            upload_bytes: Some(1),
            ..Args::default()
        })
        .is_err());
        assert!(settings(Args {
            url,
            socks_pass: Some("p".into()),
            ..Args::default()
        })
        .is_err());
    }
}
