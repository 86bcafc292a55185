//! Read-side cell framing: a fixed buffer filled in large chunks, decoded many cells at a time.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use chive_cell::{decode_cell, frame_len, AnyCell, MAX_VAR_PAYLOAD, VAR_CELL_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::LinkError;

/// Largest possible cell on the wire (a var cell with a maximal payload).
const MAX_CELL_WIRE: usize = VAR_CELL_HEADER_LEN + MAX_VAR_PAYLOAD;
/// Minimum free space offered to each read, so that one syscall can bring in many cells.
const MIN_READ: usize = 64 * 1024;
/// Buffer size: a partial maximal cell can never starve a read of MIN_READ bytes.
const BUF_LEN: usize = MAX_CELL_WIRE + MIN_READ;

/// A batch this many cells or longer leaves in the read buffer itself (handed over, the reader
/// taking a spare buffer from the pool); a shorter one is copied out (a copy of a few cells
/// costs less than holding a pool buffer of [`BUF_LEN`] for it).
const HANDOVER_MIN_CELLS: usize = 16;

/// Read buffers that link readers hand over with their cells ([`CellBatch`]) and get back once
/// the cells were handled, so that a read batch reaches its handler without being copied out
/// of the buffer the socket (or the record layer) wrote it into, and without a fresh buffer to
/// zero per read. Bounded: besides the one buffer every reader always holds, at most `cap`
/// buffers of [`BUF_LEN`] exist (free here or out in batches); when none can be had the reader
/// copies its cells out instead, as it does without a pool.
pub struct BatchPool {
    inner: Mutex<PoolInner>,
    cap: usize,
}

struct PoolInner {
    free: Vec<Vec<u8>>,
    /// Buffers out in batches (not yet dropped).
    out: usize,
}

impl BatchPool {
    /// A pool of at most `cap` spare buffers of [`BUF_LEN`] (~130 KiB) each, made when first
    /// needed and kept.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(BatchPool {
            inner: Mutex::new(PoolInner {
                free: Vec::new(),
                out: 0,
            }),
            cap,
        })
    }

    /// A spare for a reader about to hand its buffer over in a batch ([`BUF_LEN`] long,
    /// contents unspecified): a free one, or a new zeroed one while fewer than `cap` exist;
    /// `None` when all are out. Counts the batch as out.
    fn take_for_handover(&self) -> Option<Vec<u8>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let spare = match inner.free.pop() {
            Some(buf) => buf,
            None if inner.out < self.cap => vec![0u8; BUF_LEN],
            None => return None,
        };
        inner.out += 1;
        Some(spare)
    }

    /// A handed-over batch's buffer comes back (kept while fewer than `cap` are free, which
    /// `take_for_handover`'s count makes always true).
    fn give_back(&self, buf: Vec<u8>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.out = inner.out.saturating_sub(1);
        if buf.len() == BUF_LEN && inner.free.len() + inner.out < self.cap {
            inner.free.push(buf);
        }
    }

    /// Spare buffers in existence: free ones plus those out in batches (at most `cap`).
    pub fn buffers(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.free.len() + inner.out
    }
}

impl std::fmt::Debug for BatchPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPool")
            .field("cap", &self.cap)
            .field("buffers", &self.buffers())
            .finish()
    }
}

/// Whole cells' wire bytes from one read ([`crate::LinkReader::read_cell_batch`]), derefs to
/// them. Either a read buffer handed over by the reader (given back to its [`BatchPool`] when
/// dropped) or a copy.
pub struct CellBatch {
    buf: Vec<u8>,
    range: Range<usize>,
    home: Option<Arc<BatchPool>>,
}

impl CellBatch {
    /// A batch of bytes copied from elsewhere (no pool).
    pub fn copied(bytes: Vec<u8>) -> Self {
        let range = 0..bytes.len();
        CellBatch {
            buf: bytes,
            range,
            home: None,
        }
    }

    /// Whether these bytes are a handed-over read buffer (not a copy).
    pub fn is_handed_over(&self) -> bool {
        self.home.is_some()
    }
}

impl std::ops::Deref for CellBatch {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.buf.get(self.range.clone()).unwrap_or_default()
    }
}

impl Drop for CellBatch {
    fn drop(&mut self) {
        if let Some(pool) = self.home.take() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

impl std::fmt::Debug for CellBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellBatch")
            .field("len", &self.range.len())
            .field("handed_over", &self.home.is_some())
            .finish()
    }
}

/// Bytes received but not yet decoded into cells.
pub(crate) struct CellBuf {
    /// Always [`BUF_LEN`] long (a `Vec` so that it can be handed over in a [`CellBatch`]).
    buf: Vec<u8>,
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
            buf: vec![0u8; BUF_LEN],
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

    /// Up to `max` whole buffered cells as a [`CellBatch`], and how many. With `pool` and at
    /// least [`HANDOVER_MIN_CELLS`] cells, the buffer itself is handed over and a spare from
    /// the pool takes its place (only the bytes after the batch, a partial cell or cells
    /// beyond `max`, are copied into it); otherwise the cells are copied out. `None`: no whole
    /// cell is buffered (or `max` is 0).
    pub(crate) fn take_batch(
        &mut self,
        max: usize,
        pool: Option<&Arc<BatchPool>>,
    ) -> Option<(CellBatch, usize)> {
        let (span, cells) = self.whole_cells(max);
        if cells == 0 {
            return None;
        }
        let batch = self.start..self.start + span;
        let spare = pool
            .filter(|_| cells >= HANDOVER_MIN_CELLS)
            .and_then(|p| p.take_for_handover().map(|b| (p, b)));
        let Some((pool, mut spare)) = spare else {
            let copy = CellBatch::copied(self.buf[batch.clone()].to_vec());
            self.consume(span);
            return Some((copy, cells));
        };
        let rest = batch.end..self.end;
        spare[..rest.len()].copy_from_slice(&self.buf[rest.clone()]);
        let full = std::mem::replace(&mut self.buf, spare);
        self.start = 0;
        self.end = rest.len();
        Some((
            CellBatch {
                buf: full,
                range: batch,
                home: Some(pool.clone()),
            },
            cells,
        ))
    }

    /// The length of the first up to `max` whole buffered cells, and their number.
    fn whole_cells(&self, max: usize) -> (usize, usize) {
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
        (span, cells)
    }

    /// Drop the first `span` buffered bytes.
    fn consume(&mut self, span: usize) {
        self.start += span;
        if self.start >= self.end {
            self.start = 0;
            self.end = 0;
        }
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

    fn numbered(range: std::ops::Range<u32>) -> Vec<u8> {
        let mut wire = Vec::new();
        for i in range {
            Cell::new(i, CellCommand::RELAY, &i.to_be_bytes())
                .unwrap()
                .encode_into(&mut wire);
        }
        wire
    }

    /// Reads `wire` (sent in `piece`-byte writes) through `take_batch` with `max` and `pool`,
    /// checking every batch holds whole cells only and the pool stays within its cap; returns
    /// the bytes in order and how many batches were handed over.
    async fn read_all(
        wire: Vec<u8>,
        piece: usize,
        max: usize,
        keep: usize,
        pool: Option<&Arc<BatchPool>>,
    ) -> (Vec<u8>, usize) {
        let (mut tx, mut rx) = tokio::io::duplex(piece);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&wire).await.unwrap();
        });
        let mut cb = CellBuf::new();
        let (mut got, mut handed) = (Vec::new(), 0);
        // Batches are kept alive `keep` at a time, as a driver holds them while it works.
        let mut alive = std::collections::VecDeque::new();
        loop {
            while let Some((batch, n)) = cb.take_batch(max, pool) {
                assert!(n >= 1 && n <= max, "{n} cells, max {max}");
                assert_eq!(batch.len(), n * chive_cell::CELL_LEN, "whole cells only");
                handed += usize::from(batch.is_handed_over());
                got.extend_from_slice(&batch);
                alive.push_back(batch);
                if alive.len() > keep {
                    alive.pop_front();
                }
                if let Some(p) = pool {
                    assert!(p.buffers() <= p.cap, "{} spare buffers", p.buffers());
                }
            }
            match cb.fill(&mut rx).await.unwrap() {
                Fill::Read(_) => {}
                Fill::Eof => break,
            }
        }
        writer.await.unwrap();
        (got, handed)
    }

    #[tokio::test]
    async fn handed_over_batches_carry_exactly_the_cells_in_order() {
        let wire = numbered(0..2000);
        let pool = BatchPool::new(2);
        // Odd-sized pieces leave partial cells behind each batch; max 100 leaves whole cells
        // behind some; two batches alive at once use both spares.
        let (got, handed) = read_all(wire.clone(), 40_000, 100, 2, Some(&pool)).await;
        assert_eq!(got, wire);
        assert!(handed > 0, "no batch was handed over");
        assert!(pool.buffers() <= 2);
    }

    #[tokio::test]
    async fn a_drained_pool_means_copies_not_lost_cells() {
        let wire = numbered(0..3000);
        let pool = BatchPool::new(1);
        // Every batch kept alive: after the only spare is out, batches must be copies.
        let (got, handed) = read_all(wire.clone(), 65_536, 128, usize::MAX, Some(&pool)).await;
        assert_eq!(got, wire);
        assert_eq!(
            handed, 1,
            "one spare allows one handed-over batch while all are kept"
        );
        assert_eq!(pool.buffers(), 1);
    }

    #[tokio::test]
    async fn short_batches_and_no_pool_are_copied() {
        let wire = numbered(0..500);
        let pool = BatchPool::new(4);
        // Pieces of under 16 cells: every batch is short.
        let (got, handed) = read_all(wire.clone(), 5 * 514, 128, 1, Some(&pool)).await;
        assert_eq!(got, wire);
        assert_eq!((handed, pool.buffers()), (0, 0));
        let (got, handed) = read_all(wire.clone(), 65_536, 128, 1, None).await;
        assert_eq!((got, handed), (wire, 0));
    }

    #[tokio::test]
    async fn returned_buffers_are_reused_and_bounded() {
        let pool = BatchPool::new(2);
        let wire = numbered(0..4000);
        // One batch alive at a time: the spares circulate, at most two ever made.
        let (got, handed) = read_all(wire.clone(), 65_536, 128, 1, Some(&pool)).await;
        assert_eq!(got, wire);
        assert!(handed >= 10, "{handed} handed over");
        assert!(pool.buffers() <= 2, "{} buffers", pool.buffers());
        let free = pool.inner.lock().unwrap().free.len();
        assert_eq!(
            free,
            pool.buffers(),
            "every batch dropped, every spare back"
        );
    }
}
