//! The content `chive httpd` serves at `/bytes/<N>` and `chive perf` uploads and
//! verifies: byte i is `i % 251`. A prime period, so the content never lines up with
//! cell, chunk or packet boundaries and a shifted or repeated piece is detected.
//! (`lab/chive_lab/content.py` is the lab's copy of this definition.)

use std::sync::OnceLock;

use bytes::Bytes;

/// Size of each body chunk `chive httpd` hands to hyper and `chive perf` writes.
pub const CHUNK: usize = 64 * 1024;
/// The content pattern's period: byte i is `i % PERIOD`.
pub const PERIOD: u64 = 251;

/// `CHUNK + PERIOD` bytes of the pattern: any chunk starting at any phase is
/// a contiguous slice of it, so chunks are refcounted slices, never copies.
pub fn pattern() -> &'static Bytes {
    static PATTERN: OnceLock<Bytes> = OnceLock::new();
    PATTERN.get_or_init(|| {
        (0..CHUNK as u64 + PERIOD)
            .map(|i| (i % PERIOD) as u8)
            .collect::<Vec<u8>>()
            .into()
    })
}

/// The pattern bytes at offsets `offset..offset + len`, for `len <= CHUNK`.
pub fn slice_at(offset: u64, len: usize) -> Option<&'static [u8]> {
    let phase = (offset % PERIOD) as usize;
    pattern().get(phase..phase.checked_add(len)?)
}

/// The absolute offset of the first byte of `data` (starting at `offset`) that
/// differs from the pattern, compared a chunk at a time.
pub fn first_mismatch(offset: u64, data: &[u8]) -> Option<u64> {
    let mut pos = 0usize;
    for piece in data.chunks(CHUNK) {
        let at = offset + pos as u64;
        let expected = slice_at(at, piece.len())?;
        if piece != expected {
            let i = piece.iter().zip(expected).position(|(a, b)| a != b)?;
            return Some(at + i as u64);
        }
        pos += piece.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_follow_the_pattern_at_any_phase() {
        for offset in [0u64, 1, 250, 251, 1_000_003] {
            let s = slice_at(offset, CHUNK).unwrap();
            assert!(s
                .iter()
                .enumerate()
                .all(|(i, &b)| u64::from(b) == (offset + i as u64) % PERIOD));
        }
        assert!(slice_at(1, CHUNK + PERIOD as usize).is_none());
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
}
