//! ResponseReader on in-memory streams: good responses in any read sizes, and hostile ones.

use std::pin::Pin;
use std::task::{Context, Poll};

use chive_http::{BodyError, BodySink, Collect, HttpError, Limits, ResponseReader};
use tokio::io::{AsyncRead, ReadBuf};

/// A stream that hands out `data` at most `piece` bytes per read, then EOF.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    piece: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let end = (self.at + self.piece)
            .min(self.data.len())
            .min(self.at + buf.remaining());
        let at = self.at;
        buf.put_slice(&self.data[at..end]);
        self.at = end;
        Poll::Ready(Ok(()))
    }
}

fn reader(data: &[u8], piece: usize) -> ResponseReader<Trickle> {
    ResponseReader::new(Trickle {
        data: data.to_vec(),
        at: 0,
        piece,
    })
}

/// Head and body of the one response in `data`, read `piece` bytes at a time.
async fn read_all(data: &[u8], piece: usize) -> Result<(u16, Vec<u8>), HttpError> {
    let mut r = reader(data, piece);
    r.first_byte().await?;
    let head = r.read_final_head().await?;
    let mut sink = Collect::new(1 << 20);
    r.read_body(&head, &mut sink).await.map_err(|e| match e {
        BodyError::Http(e) | BodyError::Sink(e) => e,
    })?;
    Ok((head.status, sink.body))
}

const PIECES: [usize; 4] = [1, 2, 7, 1 << 16];

#[tokio::test]
async fn bodies_by_length_chunks_and_eof() {
    let cases: [(&[u8], u16, &[u8]); 5] = [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            200,
            b"hello",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\nX-T: 1\r\n\r\n",
            200,
            b"abcdefg",
        ),
        (b"HTTP/1.0 503 X\r\n\r\nno consensus yet\n", 503, b"no consensus yet\n"),
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
            201,
            b"ok",
        ),
        (
            b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n",
            204,
            b"",
        ),
    ];
    for (raw, status, body) in cases {
        for piece in PIECES {
            let got = read_all(raw, piece).await;
            assert_eq!(
                got,
                Ok((status, body.to_vec())),
                "{:?} in pieces of {piece}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}

#[tokio::test]
async fn bytes_after_a_body_stay_for_the_next_response() {
    let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 404 Not Found\r\nContent-Length: 1\r\n\r\nx";
    for piece in PIECES {
        let mut r = reader(raw, piece);
        let h = r.read_head().await.unwrap();
        let mut a = Collect::new(100);
        assert_eq!(r.read_body(&h, &mut a).await, Ok(3));
        let h = r.read_head().await.unwrap();
        assert_eq!(h.status, 404);
        assert_eq!(h.header("content-length"), Some("1"));
        let mut b = Collect::new(100);
        assert_eq!(r.read_body(&h, &mut b).await, Ok(1));
        assert_eq!(
            (a.body.as_slice(), b.body.as_slice()),
            (&b"abc"[..], &b"x"[..])
        );
    }
}

#[tokio::test]
async fn hostile_and_broken_responses_are_errors() {
    let huge_chunk = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab";
    let mut long_line = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1".to_vec();
    long_line.extend([b';'; 5000]);
    let mut long_trailer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
    for _ in 0..40 {
        long_trailer.extend_from_slice(format!("X: {}\r\n", "y".repeat(2000)).as_bytes());
    }
    let mut no_end = b"HTTP/1.1 200 OK\r\n".to_vec();
    no_end.extend(vec![b'a'; 70 * 1024]);
    let cases: Vec<(&[u8], HttpError)> = vec![
        (b"", HttpError::ClosedBeforeResponse),
        (b"HTTP/1.1 200 OK\r\n", HttpError::ClosedInHead),
        (&no_end, HttpError::HeadTooLarge),
        (b"garbage\r\n\r\n", HttpError::BadStatusLine),
        (b"SSH-2.0-OpenSSH\r\n\r\n", HttpError::BadStatusLine),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            HttpError::ClosedInBody {
                received: 5,
                expected: 10,
            },
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            HttpError::BadChunkSize,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            HttpError::BadChunkSize,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
            HttpError::BadChunkSize,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            HttpError::ClosedInChunkedBody,
        ),
        (huge_chunk, HttpError::ClosedInChunkedBody),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n0\r\n\r\n",
            HttpError::MissingChunkCrlf,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\xff\r\n",
            HttpError::BadChunkedEncoding,
        ),
        (&long_line, HttpError::ChunkLineTooLong),
        (&long_trailer, HttpError::TrailerTooLarge),
    ];
    for (raw, want) in cases {
        for piece in PIECES {
            assert_eq!(
                read_all(raw, piece).await,
                Err(want.clone()),
                "{:?} in pieces of {piece}",
                String::from_utf8_lossy(&raw[..raw.len().min(80)])
            );
        }
    }
}

#[tokio::test]
async fn limits_bound_the_head_and_the_collected_body() {
    let mut r = ResponseReader::with_limits(
        Trickle {
            data: b"HTTP/1.1 200 OK\r\nX: 0123456789\r\n\r\n".to_vec(),
            at: 0,
            piece: 4,
        },
        Limits {
            max_head: 16,
            max_line: 16,
        },
    );
    assert_eq!(r.read_head().await, Err(HttpError::HeadTooLarge));
    let raw = b"HTTP/1.1 200 OK\r\n\r\n0123456789";
    let mut r = reader(raw, 3);
    let head = r.read_head().await.unwrap();
    let mut sink = Collect::new(9);
    assert_eq!(
        r.read_body(&head, &mut sink).await,
        Err(BodyError::Sink(HttpError::BodyTooLarge(9)))
    );
}

/// A sink that refuses a byte value, like perf's content check.
struct NoZ(u64);

impl BodySink for NoZ {
    type Error = String;

    fn feed(&mut self, data: &[u8]) -> Result<(), String> {
        if let Some(i) = data.iter().position(|&b| b == b'Z') {
            return Err(format!("Z at {}", self.0 + i as u64));
        }
        self.0 += data.len() as u64;
        Ok(())
    }
}

#[tokio::test]
async fn a_sink_error_stops_the_body_with_its_own_error() {
    for piece in PIECES {
        let mut r = reader(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabcZef", piece);
        let head = r.read_head().await.unwrap();
        assert_eq!(
            r.read_body(&head, &mut NoZ(0)).await,
            Err(BodyError::Sink("Z at 3".to_string()))
        );
    }
}
