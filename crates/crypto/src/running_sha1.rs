//! A running SHA-1 whose digest can be read without consuming it: tor1's per-hop digest,
//! which a cell recognized by a hop advances and a cell passing through must not.
//!
//! Why not `sha1::Sha1` itself: its `finalize` consumes the hasher, so reading the running
//! digest meant cloning the whole hasher first, and recognizing a cell meant two clones (one to
//! try the cell on, one to read the result), and `finalize` builds its output through
//! `GenericArray`'s iterator constructor. Here the state is the `sha1` crate's own parts, the
//! compression function (SHA-NI where the CPU has it) and the `block-buffer` buffer `Sha1`
//! wraps, so buffering and padding are that crate's; reading the digest pads a copy of the
//! partial block only. Tests check the result against `sha1::Sha1` at every length and split.

use sha1::digest::block_buffer::EagerBuffer;
use sha1::digest::typenum::U64;

/// SHA-1's block size in bytes.
const BLOCK: u64 = 64;

/// SHA-1's initial hash value (FIPS 180-4 5.3.1).
const INITIAL: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];

/// A SHA-1 computation in progress: the hash of every whole block so far, and the bytes of
/// the partial block after them.
#[derive(Clone)]
pub(crate) struct RunningSha1 {
    /// Chaining value after the last whole block.
    h: [u32; 5],
    /// Whole blocks hashed so far.
    blocks: u64,
    /// The partial block after them (eager: it never holds a whole block).
    partial: EagerBuffer<U64>,
}

impl RunningSha1 {
    /// The hash of nothing yet.
    pub(crate) fn new() -> Self {
        RunningSha1 {
            h: INITIAL,
            blocks: 0,
            partial: EagerBuffer::default(),
        }
    }

    /// Append `data` to the hashed message.
    pub(crate) fn update(&mut self, data: &[u8]) {
        let (h, blocks) = (&mut self.h, &mut self.blocks);
        self.partial.digest_blocks(data, |run| {
            *blocks = blocks.wrapping_add(run.len() as u64);
            sha1::compress(h, run);
        });
    }

    /// The SHA-1 of the message so far; the computation can go on after it.
    pub(crate) fn digest(&self) -> [u8; 20] {
        let mut h = self.h;
        let mut last = self.partial.clone();
        let bytes = self
            .blocks
            .wrapping_mul(BLOCK)
            .wrapping_add(last.get_pos() as u64);
        last.len64_padding_be(bytes.wrapping_mul(8), |block| {
            sha1::compress(&mut h, std::slice::from_ref(block))
        });
        let mut out = [0u8; 20];
        for (chunk, word) in out.chunks_exact_mut(4).zip(h) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha1::{Digest, Sha1};

    fn reference(data: &[u8]) -> [u8; 20] {
        Sha1::digest(data).into()
    }

    /// FIPS 180-2 appendix A vectors ("abc", the 448-bit message, a million 'a's).
    #[test]
    fn published_vectors() {
        let mut h = RunningSha1::new();
        h.update(b"abc");
        assert_eq!(
            hex::encode(h.digest()),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        let mut h = RunningSha1::new();
        h.update(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
        assert_eq!(
            hex::encode(h.digest()),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        let mut h = RunningSha1::new();
        for _ in 0..1000 {
            h.update(&[b'a'; 1000]);
        }
        assert_eq!(
            hex::encode(h.digest()),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
        assert_eq!(
            hex::encode(RunningSha1::new().digest()),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
    }

    /// Every message length across the padding's two cases (0..=200 bytes), fed in pieces of
    /// every size, read after every piece: equal to a fresh `sha1::Sha1` of the same prefix.
    #[test]
    fn equals_sha1_at_every_length_and_split() {
        let msg: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for piece in 1..=130 {
            let mut h = RunningSha1::new();
            let mut done = 0;
            for chunk in msg.chunks(piece) {
                h.update(chunk);
                done += chunk.len();
                assert_eq!(
                    h.digest(),
                    reference(&msg[..done]),
                    "piece {piece} at {done}"
                );
            }
        }
        for len in 0..=msg.len() {
            let mut h = RunningSha1::new();
            h.update(&msg[..len]);
            assert_eq!(h.digest(), reference(&msg[..len]), "length {len}");
        }
    }

    /// Reading the digest leaves the computation as it was; a copy runs on independently.
    #[test]
    fn digest_does_not_disturb_and_copies_are_independent() {
        let mut h = RunningSha1::new();
        h.update(&[7u8; 20]);
        let before = h.digest();
        assert_eq!(h.digest(), before);
        let mut fork = h.clone();
        fork.update(&[1u8; 509]);
        assert_eq!(h.digest(), before);
        h.update(&[1u8; 509]);
        assert_eq!(h.digest(), fork.digest());
        let mut msg = vec![7u8; 20];
        msg.extend_from_slice(&[1u8; 509]);
        assert_eq!(h.digest(), reference(&msg));
    }
}
