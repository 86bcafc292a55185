//! Read-side cell framing: a fixed buffer filled in large chunks, decoded many cells at a time.

use chive_cell::{decode_cell, frame_len, AnyCell, MAX_VAR_PAYLOAD, VAR_CELL_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::LinkError;

/// Largest possible cell on the wire (a var cell with a maximal payload).
const MAX_CELL_WIRE: usize = VAR_CELL_HEADER_LEN + MAX_VAR_PAYLOAD;
/// Minimum free space offered to each read, so that one syscall can bring in many cells.
const MIN_READ: usize = 64 * 1024;
/// Buffer size: a partial maximal cell can never starve a read of MIN_READ bytes.
const BUF_LEN: usize = MAX_CELL_WIRE + MIN_READ;

/// Bytes received but not yet decoded into cells.
pub(crate) struct CellBuf {
    buf: Box<[u8]>,
    /// Start of undecoded bytes.
    start: usize,
    /// End of valid bytes.
    end: usize,
}

/// The result of one [`CellBuf::fill`].
pub(crate) enum Fill {
    /// This many new bytes were read.
    Read(usize),
    /// The peer closed the stream and no partial cell is pending.
    Eof,
}

impl CellBuf {
    pub(crate) fn new() -> Self {
        CellBuf {
            buf: vec![0u8; BUF_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Decode the next complete cell from buffered bytes, if there is one.
    pub(crate) fn next_cell(&mut self) -> Result<Option<AnyCell>, LinkError> {
        let pending = self.buf.get(self.start..self.end).unwrap_or(&[]);
        match decode_cell(pending)? {
            Some((cell, used)) => {
                // decode_cell never reports more than it was given; clamp anyway so a bug there
                // cannot push `start` past `end`.
                self.start = (self.start + used).min(self.end);
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(cell))
            }
            None => Ok(None),
        }
    }

    /// Append the wire bytes of up to `max` whole buffered cells to `out` (one copy of the
    /// span, no decoding: [`frame_len`] reads only their headers) and drop them from the buffer.
    /// Returns how many cells were appended; a partial cell stays buffered.
    pub(crate) fn take_frames(&mut self, out: &mut Vec<u8>, max: usize) -> usize {
        let pending = self.buf.get(self.start..self.end).unwrap_or(&[]);
        let (mut span, mut cells) = (0, 0);
        while cells < max {
            match pending.get(span..).and_then(frame_len) {
                Some(len) => {
                    span += len;
                    cells += 1;
                }
                None => break,
            }
        }
        out.extend_from_slice(&pending[..span]);
        self.start += span;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        cells
    }

    /// How many undecoded bytes are buffered.
    pub(crate) fn pending_len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether undecoded bytes remain (a partial cell, or cells not yet taken).
    pub(crate) fn has_pending(&self) -> bool {
        self.end > self.start
    }

    /// Read more bytes from `io` (one read call, at least MIN_READ bytes of room).
    ///
    /// A connection closed without TLS close_notify is treated like a clean close when it falls on
    /// a cell boundary: cells are self-delimiting, so nothing can have been cut off.
    pub(crate) async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
    ) -> Result<Fill, LinkError> {
        if BUF_LEN - self.end < MIN_READ {
            // Move the partial cell to the front. It is shorter than MAX_CELL_WIRE (else it would
            // have decoded or failed), so MIN_READ bytes are free afterwards.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buf.get_mut(self.end..).unwrap_or(&mut []);
        let n = match io.read(room).await {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            if self.has_pending() {
                return Err(LinkError::Protocol(format!(
                    "connection closed in the middle of a cell ({} bytes pending)",
                    self.end - self.start
                )));
            }
            return Ok(Fill::Eof);
        }
        self.end += n;
        Ok(Fill::Read(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_cell::{Cell, CellCommand, VarCell};

    #[tokio::test]
    async fn decodes_across_reads_and_detects_truncation() {
        let mut wire = Vec::new();
        for i in 0..300u32 {
            Cell::new(i, CellCommand::RELAY, &i.to_be_bytes())
                .unwrap()
                .encode_into(&mut wire);
        }
        VarCell {
            circ_id: 0,
            command: CellCommand::VPADDING,
            payload: vec![7; MAX_VAR_PAYLOAD],
        }
        .encode_into(&mut wire)
        .unwrap();
        // Deliver in odd-sized pieces to exercise partial cells and compaction.
        let (mut tx, mut rx) = tokio::io::duplex(777);
        let sent = wire.clone();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&sent).await.unwrap();
            tx.write_all(&[1, 2, 3]).await.unwrap(); // trailing partial cell
        });
        let mut cb = CellBuf::new();
        let mut fixed = 0u32;
        let mut var = 0;
        let err = loop {
            while let Some(cell) = cb.next_cell().unwrap() {
                match cell {
                    AnyCell::Fixed(c) => {
                        assert_eq!(c.circ_id, fixed);
                        assert_eq!(&c.payload[..4], &fixed.to_be_bytes());
                        fixed += 1;
                    }
                    AnyCell::Var(v) => {
                        assert_eq!(v.payload.len(), MAX_VAR_PAYLOAD);
                        var += 1;
                    }
                }
            }
            match cb.fill(&mut rx).await {
                Ok(Fill::Read(_)) => {}
                Ok(Fill::Eof) => panic!("EOF with partial cell must be an error"),
                Err(e) => break e,
            }
        };
        writer.await.unwrap();
        assert_eq!((fixed, var), (300, 1));
        assert!(matches!(err, LinkError::Protocol(_)), "{err}");
    }
}
