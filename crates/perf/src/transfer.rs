//! One transfer: connect to the proxy, SOCKS CONNECT, send the request (streaming the
//! upload for POST), then read the response with `chive-http`, timing each step and
//! counting and checking body bytes as they arrive.

use chive_http::{request_head, BodyError, BodySink, HttpError, ResponseReader};
use chive_tools::pattern::{first_mismatch, slice_at, CHUNK};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::options::{HttpMethod, Settings};
use crate::record::{Record, Tally, PARTIAL_SIZES};
use crate::socks::socks5_connect;

/// Largest response body kept for checking (the JSON reply of `/upload`).
const MAX_CAPTURE: usize = 64 * 1024;

/// The transfer itself; fills `rec` as it goes so a timeout or stop keeps the partial record.
pub(crate) async fn attempt(
    settings: &Settings,
    tally: Tally<'_>,
    creds: Option<(String, String)>,
    rec: &mut Record,
) -> Result<(), String> {
    let clock = tally.clock;
    let mut s = TcpStream::connect(settings.socks)
        .await
        .map_err(|e| format!("socks: cannot connect to proxy: {}", e.kind()))?;
    let _ = s.set_nodelay(true);
    rec.socket_connected = Some(clock.now());

    socks5_connect(&mut s, &settings.url, creds.as_ref()).await?;
    rec.socks_connected = Some(clock.now());

    let upload_digest = send_request(&mut s, settings, tally, rec).await?;
    rec.request_sent = Some(clock.now());

    let mut reader = ResponseReader::new(&mut s);
    reader.first_byte().await.map_err(|e| e.to_string())?;
    rec.first_byte = Some(clock.now());
    // Interim 1xx responses (e.g. an unsolicited 100 Continue) are skipped.
    let head = reader.read_final_head().await.map_err(|e| e.to_string())?;
    rec.status = Some(head.status);
    let is_get = settings.method == HttpMethod::Get;
    if is_get {
        rec.expected_bytes = head.content_length;
    }
    let mut sink = Sink {
        received: 0,
        verify: settings.verify && is_get && head.is_success(),
        capture: Vec::new(),
        count_into_record: is_get,
        tally,
        rec,
    };
    let body = reader.read_body(&head, &mut sink).await;
    let capture = sink.capture;
    body.map_err(|e| match e {
        BodyError::Http(e) => e.to_string(),
        BodyError::Sink(e) => e,
    })?;
    rec.last_byte = Some(clock.now());

    if !head.is_success() {
        return Err(format!("http: status {}", head.status));
    }
    if let (true, Some(digest)) = (settings.verify, upload_digest) {
        check_upload_reply(&capture, settings.upload_bytes, &digest)?;
    }
    Ok(())
}

/// Write the request (and for POST, the pattern body, hashed as it goes).
/// Returns the upload's SHA-256 for POST.
async fn send_request(
    s: &mut TcpStream,
    settings: &Settings,
    tally: Tally<'_>,
    rec: &mut Record,
) -> Result<Option<[u8; 32]>, String> {
    let io = |e: std::io::Error| HttpError::Write(e.kind()).to_string();
    let url = &settings.url;
    let length = settings.upload_bytes.to_string();
    let mut headers = match settings.method {
        HttpMethod::Get => vec![],
        HttpMethod::Post => vec![
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", length.as_str()),
        ],
    };
    headers.extend([
        ("Host", url.authority.as_str()),
        ("User-Agent", "chive-perf"),
        ("Accept", "*/*"),
        ("Connection", "close"),
    ]);
    let method = match settings.method {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
    };
    let head = request_head(method, &url.path, &headers).map_err(|e| e.to_string())?;
    s.write_all(head.as_bytes()).await.map_err(io)?;
    let digest = if settings.method == HttpMethod::Post {
        rec.expected_bytes = Some(settings.upload_bytes);
        let mut hasher = Sha256::new();
        let mut sent: u64 = 0;
        while sent < settings.upload_bytes {
            // End a write at each partial size, so its time is taken when
            // exactly that many bytes have been handed to the socket.
            let to_mark = PARTIAL_SIZES
                .iter()
                .find(|&&n| n > sent)
                .map_or(u64::MAX, |&n| n - sent);
            let len = (settings.upload_bytes - sent)
                .min(CHUNK as u64)
                .min(to_mark) as usize;
            let chunk = slice_at(sent, len).ok_or("internal: pattern slice")?;
            s.write_all(chunk).await.map_err(io)?;
            hasher.update(chunk);
            sent += len as u64;
            tally.count(rec, sent);
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

/// Where body bytes go: counted into the record, optionally verified against the
/// pattern, the first few KiB kept (for the upload reply).
struct Sink<'a> {
    received: u64,
    verify: bool,
    capture: Vec<u8>,
    /// GET counts body bytes in the record; POST reports uploaded bytes instead.
    count_into_record: bool,
    tally: Tally<'a>,
    rec: &'a mut Record,
}

impl BodySink for Sink<'_> {
    type Error = String;

    fn feed(&mut self, data: &[u8]) -> Result<(), String> {
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
            self.tally.count(self.rec, self.received);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
