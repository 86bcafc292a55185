//! AES-NI and VAES counter mode for x86-64.
//!
//! Safety in one place: the `#[target_feature]` functions here may only run on a CPU with their
//! features. [`RoundKeys`] is the proof: its fields are private to this module and it is only
//! made by [`RoundKeys::expand`], after `is_x86_feature_detected!` saw `aes` and `ssse3` (and,
//! for `vaes: true`, also `avx2` and `vaes`). Every other `unsafe` block is an unaligned SIMD
//! load or store of exactly the bytes of an array reference (`&[u8; 16]` or `&[[u8; 16]; 2]`),
//! which the borrow checker has already shown to be valid and exclusively ours for writing.

use std::arch::x86_64::*;

use zeroize::Zeroize;

/// AES-128 has 10 rounds: 11 round keys.
const ROUNDS: usize = 10;

/// Blocks in flight per group: enough to cover `aesenc`'s latency on current cores (about 4
/// cycles at two per cycle), within the 16 vector registers beside the round keys.
const NI_GROUP: usize = 8;
/// YMM registers per VAES group: 16 blocks.
const VAES_REGS: usize = 8;

pub(crate) fn has_aesni() -> bool {
    is_x86_feature_detected!("aes") && is_x86_feature_detected!("ssse3")
}

pub(crate) fn has_vaes() -> bool {
    has_aesni() && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("vaes")
}

/// AES-128 encryption round keys, and the evidence that this CPU runs the code that uses them.
#[derive(Clone)]
pub(crate) struct RoundKeys {
    rk: [[u8; 16]; ROUNDS + 1],
    /// The CPU also has VAES and AVX2 (checked when this was made).
    vaes: bool,
}

impl Zeroize for RoundKeys {
    fn zeroize(&mut self) {
        self.rk.zeroize();
    }
}

impl RoundKeys {
    /// Expand `key`, for the VAES code if `vaes`; `None` if the CPU lacks the features.
    pub(crate) fn expand(key: &[u8; 16], vaes: bool) -> Option<RoundKeys> {
        if !has_aesni() || (vaes && !has_vaes()) {
            return None;
        }
        // SAFETY: has_aesni() just saw `aes` and `ssse3`, all that expand_ni enables.
        let rk = unsafe { expand_ni(key) };
        Some(RoundKeys { rk, vaes })
    }

    pub(crate) fn vaes(&self) -> bool {
        self.vaes
    }

    /// XOR the keystream from block `counter` on into `data` (not empty), advancing `counter`
    /// by the blocks used. When `data` ends inside a block, that block's keystream goes to
    /// `rest` and the bytes used of it are returned; otherwise 0.
    pub(crate) fn ctr(&self, counter: &mut u128, data: &mut [u8], rest: &mut [u8; 16]) -> usize {
        if self.vaes {
            // SAFETY: `vaes` is only true when expand() saw aes, ssse3, avx2 and vaes.
            unsafe { ctr_vaes(&self.rk, counter, data, rest) }
        } else {
            // SAFETY: a RoundKeys exists only when expand() saw aes and ssse3.
            unsafe { ctr_ni(&self.rk, counter, data, rest) }
        }
    }
}

#[inline(always)]
fn load(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement; SSE2 is part of
    // x86-64.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline(always)]
fn store(b: &mut [u8; 16], v: __m128i) {
    // SAFETY: `b` is 16 writable bytes we borrow exclusively; `storeu` has no alignment
    // requirement; SSE2 is part of x86-64.
    unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) }
}

/// The AES-128 key schedule (FIPS-197 5.2) with `aeskeygenassist`.
#[target_feature(enable = "aes,ssse3")]
fn expand_ni(key: &[u8; 16]) -> [[u8; 16]; ROUNDS + 1] {
    // One round of the schedule: `t`'s word 3 is SubWord(RotWord(w3)) ^ rcon; each word of the
    // new key is the previous key's words 0..=i XORed together, XOR that.
    #[target_feature(enable = "sse2")]
    fn next(k: __m128i, t: __m128i) -> __m128i {
        let t = _mm_shuffle_epi32::<0xff>(t);
        let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
        let k = _mm_xor_si128(k, _mm_slli_si128::<8>(k));
        _mm_xor_si128(k, t)
    }
    let mut rk = [[0u8; 16]; ROUNDS + 1];
    let mut k = load(key);
    store(&mut rk[0], k);
    macro_rules! round {
        ($i:literal, $rcon:literal) => {
            k = next(k, _mm_aeskeygenassist_si128::<$rcon>(k));
            store(&mut rk[$i], k);
        };
    }
    round!(1, 0x01);
    round!(2, 0x02);
    round!(3, 0x04);
    round!(4, 0x08);
    round!(5, 0x10);
    round!(6, 0x20);
    round!(7, 0x40);
    round!(8, 0x80);
    round!(9, 0x1b);
    round!(10, 0x36);
    rk
}

/// `W` big-endian counter blocks from `c` on, as `__m128i`s (little-endian lanes, byte-swapped
/// with `pshufb`). The common case adds in the low 64-bit lane; when that would carry within the
/// group, each block is built from the 128-bit sum instead.
macro_rules! counter_blocks {
    ($w:expr, $c:expr) => {{
        let c: u128 = $c;
        let swap = _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let mut x = [_mm_setzero_si128(); $w];
        if (c as u64).checked_add($w as u64 - 1).is_some() {
            let base = _mm_set_epi64x((c >> 64) as i64, c as i64);
            for (i, b) in x.iter_mut().enumerate() {
                *b = _mm_shuffle_epi8(_mm_add_epi64(base, _mm_set_epi64x(0, i as i64)), swap);
            }
        } else {
            for (i, b) in x.iter_mut().enumerate() {
                let ci = c.wrapping_add(i as u128);
                *b = _mm_shuffle_epi8(_mm_set_epi64x((ci >> 64) as i64, ci as i64), swap);
            }
        }
        x
    }};
}

/// Encrypt the blocks of array `$x` in place, round by round across the array so that the
/// blocks' `aesenc`s overlap.
macro_rules! encrypt_blocks {
    ($x:ident, $k:ident, $xor:ident, $enc:ident, $last:ident) => {
        for b in $x.iter_mut() {
            *b = $xor(*b, $k[0]);
        }
        for r in 1..ROUNDS {
            for b in $x.iter_mut() {
                *b = $enc(*b, $k[r]);
            }
        }
        for b in $x.iter_mut() {
            *b = $last(*b, $k[ROUNDS]);
        }
    };
}

/// The end of a call: `blocks` whole blocks and `tail` bytes (both fewer than a group), from
/// keystream blocks `ks` (at least `blocks + 1` of them when `tail` is not empty).
#[inline]
#[target_feature(enable = "sse2")]
fn finish(ks: &[__m128i], blocks: &mut [[u8; 16]], tail: &mut [u8], rest: &mut [u8; 16]) -> usize {
    for (b, k) in blocks.iter_mut().zip(ks) {
        store(b, _mm_xor_si128(load(b), *k));
    }
    if tail.is_empty() {
        return 0;
    }
    store(rest, ks[blocks.len()]);
    for (d, k) in tail.iter_mut().zip(rest.iter()) {
        *d ^= k;
    }
    tail.len()
}

#[target_feature(enable = "aes,ssse3")]
fn ctr_ni(
    rk: &[[u8; 16]; ROUNDS + 1],
    counter: &mut u128,
    data: &mut [u8],
    rest: &mut [u8; 16],
) -> usize {
    let mut k = [_mm_setzero_si128(); ROUNDS + 1];
    for (k, r) in k.iter_mut().zip(rk) {
        *k = load(r);
    }
    let (blocks, tail) = data.as_chunks_mut::<16>();
    let (groups, blocks) = blocks.as_chunks_mut::<NI_GROUP>();
    for g in groups {
        let mut x = counter_blocks!(NI_GROUP, *counter);
        *counter = counter.wrapping_add(NI_GROUP as u128);
        encrypt_blocks!(x, k, _mm_xor_si128, _mm_aesenc_si128, _mm_aesenclast_si128);
        for (b, x) in g.iter_mut().zip(x) {
            store(b, _mm_xor_si128(load(b), x));
        }
    }
    // The rest (up to 7 blocks and a partial one) still in parallel: a cell would otherwise
    // end with up to 7 blocks encrypted one after another, each waiting on its 10 rounds.
    let n = blocks.len() + usize::from(!tail.is_empty());
    *counter = counter.wrapping_add(n as u128);
    let c = counter.wrapping_sub(n as u128);
    if n > NI_GROUP / 2 {
        let mut x = counter_blocks!(NI_GROUP, c);
        encrypt_blocks!(x, k, _mm_xor_si128, _mm_aesenc_si128, _mm_aesenclast_si128);
        finish(&x, blocks, tail, rest)
    } else if n > 0 {
        let mut x = counter_blocks!(NI_GROUP / 2, c);
        encrypt_blocks!(x, k, _mm_xor_si128, _mm_aesenc_si128, _mm_aesenclast_si128);
        finish(&x, blocks, tail, rest)
    } else {
        0
    }
}

/// `2 * R` counter blocks from `c` on, two per YMM register (block `2i` in the low lane): as
/// `counter_blocks!`, with the adds and byte swaps done two blocks at a time.
macro_rules! counter_pairs {
    ($r:expr, $c:expr) => {{
        let c: u128 = $c;
        let mut x = [_mm256_setzero_si256(); $r];
        if (c as u64).checked_add(2 * $r as u64 - 1).is_some() {
            let base = _mm256_broadcastsi128_si256(_mm_set_epi64x((c >> 64) as i64, c as i64));
            let swap = _mm256_broadcastsi128_si256(_mm_set_epi8(
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
            ));
            for (i, y) in x.iter_mut().enumerate() {
                let step = _mm256_set_epi64x(0, 2 * i as i64 + 1, 0, 2 * i as i64);
                *y = _mm256_shuffle_epi8(_mm256_add_epi64(base, step), swap);
            }
        } else {
            let b: [__m128i; $r * 2] = counter_blocks!($r * 2, c);
            for (y, b) in x.iter_mut().zip(b.chunks_exact(2)) {
                *y = _mm256_set_m128i(b[1], b[0]);
            }
        }
        x
    }};
}

/// XOR 32 bytes of keystream into `p`.
#[inline]
#[target_feature(enable = "avx2")]
fn xor_pair(p: &mut [[u8; 16]; 2], ks: __m256i) {
    let p: *mut [[u8; 16]; 2] = p;
    // SAFETY: `p` points to 32 bytes we borrow exclusively; `loadu`/`storeu` have no
    // alignment requirement; this function runs with AVX2.
    unsafe {
        let d = _mm256_loadu_si256(p.cast());
        _mm256_storeu_si256(p.cast(), _mm256_xor_si256(d, ks));
    }
}

/// As [`finish`], from keystream in YMM registers: whole pairs of blocks 32 bytes at a time.
macro_rules! finish_pairs {
    ($x:ident, $blocks:ident, $tail:ident, $rest:ident) => {{
        let (pairs, single) = $blocks.as_chunks_mut::<2>();
        for (p, y) in pairs.iter_mut().zip($x) {
            xor_pair(p, y);
        }
        if single.is_empty() && $tail.is_empty() {
            0
        } else {
            // Blocks are left, so the group has a register past the whole pairs.
            let y = $x[pairs.len()];
            let lo = _mm256_castsi256_si128(y);
            let hi = _mm256_extracti128_si256::<1>(y);
            let partial = match single.first_mut() {
                Some(b) => {
                    store(b, _mm_xor_si128(load(b), lo));
                    hi
                }
                None => lo,
            };
            finish(&[partial], &mut [], $tail, $rest)
        }
    }};
}

#[target_feature(enable = "aes,ssse3,avx2,vaes")]
fn ctr_vaes(
    rk: &[[u8; 16]; ROUNDS + 1],
    counter: &mut u128,
    data: &mut [u8],
    rest: &mut [u8; 16],
) -> usize {
    let mut k = [_mm256_setzero_si256(); ROUNDS + 1];
    for (k, r) in k.iter_mut().zip(rk) {
        *k = _mm256_broadcastsi128_si256(load(r));
    }
    let (blocks, tail) = data.as_chunks_mut::<16>();
    let (pairs, _) = blocks.as_chunks_mut::<2>();
    let (groups, _) = pairs.as_chunks_mut::<VAES_REGS>();
    let grouped = groups.len() * 2 * VAES_REGS;
    for g in groups {
        let mut x = counter_pairs!(VAES_REGS, *counter);
        *counter = counter.wrapping_add(2 * VAES_REGS as u128);
        encrypt_blocks!(
            x,
            k,
            _mm256_xor_si256,
            _mm256_aesenc_epi128,
            _mm256_aesenclast_epi128
        );
        for (p, x) in g.iter_mut().zip(x) {
            xor_pair(p, x);
        }
    }
    // The rest, up to 15 whole blocks and a partial one, in one parallel group of 8 or 16.
    let blocks = &mut blocks[grouped..];
    let n = blocks.len() + usize::from(!tail.is_empty());
    *counter = counter.wrapping_add(n as u128);
    let c = counter.wrapping_sub(n as u128);
    if n > VAES_REGS {
        let mut x = counter_pairs!(VAES_REGS, c);
        encrypt_blocks!(
            x,
            k,
            _mm256_xor_si256,
            _mm256_aesenc_epi128,
            _mm256_aesenclast_epi128
        );
        finish_pairs!(x, blocks, tail, rest)
    } else if n > 0 {
        let mut x = counter_pairs!(VAES_REGS / 2, c);
        encrypt_blocks!(
            x,
            k,
            _mm256_xor_si256,
            _mm256_aesenc_epi128,
            _mm256_aesenclast_epi128
        );
        finish_pairs!(x, blocks, tail, rest)
    } else {
        0
    }
}
