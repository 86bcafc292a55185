//! Targets `http_server` and `http_response`: HTTP requests as the authority's DirPort and
//! `chive httpd` parse and answer them (hyper plus chive's handlers), and HTTP responses as
//! chive's client (chive-http: the directory client, `chive perf`) reads them.

use chive_http::{parse_head, Collect, HttpError, Limits, ResponseReader};

use crate::io::{block_on, block_on_yielding, FuzzStream};

/// Read sizes the request or response can arrive in.
const CHUNKS: [usize; 4] = [1, 7, 512, 1 << 20];
/// Secret seed of the authority identity in `http_server` (any fixed key).
const AUTHORITY_SEED: [u8; 32] = [6; 32];
/// What a server may write in one execution before the fuzzer "stops reading" (a request for
/// `/bytes/10737418240` would otherwise stream 10 GiB).
const WRITE_LIMIT: usize = 256 * 1024;
/// Polls of a server connection: hyper yields every 16 reads or so; inputs are at most a few
/// KiB, so this bounds a runaway loop, not an honest exchange.
const MAX_POLLS: usize = 100_000;
/// Largest body `http_response` collects.
const BODY_LIMIT: usize = 64 * 1024;

/// First byte: bit 0 the server (0: the authority, 1: `chive httpd`), bits 1-2 the read size;
/// the rest is what a client sends on one connection (pipelined requests included).
/// Properties: no panic; the connection finishes (no hang) once the input ends; whatever the
/// server wrote starts with a parseable HTTP/1.1 response head, and no handler answered 500.
pub fn http_server(data: &[u8]) {
    let Some((&mode, request)) = data.split_first() else {
        return;
    };
    let chunk = CHUNKS[usize::from(mode >> 1) % CHUNKS.len()];
    let mut io = FuzzStream::new(request, chunk).with_write_limit(WRITE_LIMIT);
    // Errors (malformed requests, the write limit) are the connection's business: hyper
    // answers or closes. What matters is that it ends and what it wrote.
    let _ = if mode & 1 == 0 {
        block_on_yielding(
            chive_node::fuzzing::authority_http(&mut io, &AUTHORITY_SEED),
            MAX_POLLS,
        )
    } else {
        block_on_yielding(
            chive_tools::httpd::serve_connection_for_fuzzing(&mut io),
            MAX_POLLS,
        )
    };
    let written = io.written;
    if written.is_empty() {
        return;
    }
    // hyper answers an HTTP/1.0 request in HTTP/1.0 (the first run's only finding: the target's
    // property, not the server, was wrong).
    assert!(
        written.starts_with(b"HTTP/1.1 ") || written.starts_with(b"HTTP/1.0 "),
        "reply does not start with a status line: {:?}",
        String::from_utf8_lossy(&written[..written.len().min(64)])
    );
    let end = written
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a reply head ends with a blank line");
    let head = parse_head(&written[..end]).expect("the server's reply head parses");
    assert!(
        head.status >= 100,
        "status {} is not an HTTP status",
        head.status
    );
    assert_ne!(head.status, 500, "a handler failed");
}

/// Outcome of reading one response: the head's status and the body (or the error).
type Outcome = Result<(u16, Vec<u8>), String>;

fn read_response(input: &[u8], chunk: usize, limits: Limits) -> Outcome {
    let io = FuzzStream::new(input, chunk);
    let mut reader = ResponseReader::with_limits(io, limits);
    block_on(async {
        let head = reader.read_final_head().await.map_err(|e| e.to_string())?;
        let mut sink = Collect::new(BODY_LIMIT);
        let n = reader
            .read_body(&head, &mut sink)
            .await
            .map_err(|e| format!("{e:?}"))?;
        assert_eq!(n, sink.body.len() as u64, "body length miscounted");
        if let (Some(len), false) = (head.content_length, head.chunked) {
            if head.has_body() {
                assert_eq!(n, len, "Content-Length body of another length");
            }
        }
        Ok((head.status, sink.body))
    })
}

/// First byte: bits 0-1 the read size, bit 2 small limits (64-byte head, 16-byte lines); the
/// rest is what a server sends. Properties: no panic, no pending on a complete input; the
/// outcome (status and body, or the error) is the same whatever the read size; a
/// Content-Length body has exactly that length.
pub fn http_response(data: &[u8]) {
    let Some((&mode, response)) = data.split_first() else {
        return;
    };
    let limits = if mode & 4 == 0 {
        Limits::default()
    } else {
        Limits {
            max_head: 64,
            max_line: 16,
        }
    };
    let chunk = CHUNKS[usize::from(mode & 3)];
    let got = read_response(response, chunk, limits);
    // Limits are checked per read, so only compare read sizes that both stay under them.
    let whole = read_response(response, usize::MAX, limits);
    let too_large = |o: &Outcome| {
        o.as_ref().err().is_some_and(|e| {
            e.contains(&HttpError::HeadTooLarge.to_string())
                || e.contains("ChunkLineTooLong")
                || e.contains("TrailerTooLarge")
        })
    };
    if !too_large(&got) && !too_large(&whole) {
        assert_eq!(got, whole, "outcome depends on how the bytes arrive");
    }
}
