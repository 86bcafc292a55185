//! AES-128 in counter mode with a 128-bit big-endian counter: the keystream of tor1's onion
//! layer (tor-spec "Routing relay cells": zero IV, the counter carries across all 128 bits).
//!
//! Why a crate of its own: RustCrypto's `aes` + `ctr` (0.8 / 0.9) generate a batch of keystream
//! blocks into a buffer and XOR it in a second pass, dispatch on the CPU's features per call,
//! and finish a 509-byte cell with blocks encrypted one at a time; on relays that was 2.2 Ir per
//! byte and slower than the TLS record's AES-GCM, which does strictly more work. Here the
//! counter blocks are built in registers, 8 (AES-NI) or 16 (VAES + AVX2, two blocks per YMM
//! register) are encrypted interleaved, and the data is XORed from the same registers; the
//! last, short group of a call is still encrypted in parallel.
//!
//! The implementation is picked once, when a cipher is made: [`Impl::Vaes`] where the CPU has
//! `aes`, `vaes` and `avx2`, [`Impl::AesNi`] where it has `aes` and `ssse3`, otherwise
//! [`Impl::Soft`] (`aes` + `ctr`, their constant-time software AES). This crate holds chive's only
//! `unsafe` code, all of it in `x86.rs`: SIMD loads and stores within checked slices, and calls
//! of `#[target_feature]` functions after the CPU was seen to have the features.

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use aes::cipher::{KeyIvInit, StreamCipher};
#[cfg(target_arch = "x86_64")]
use zeroize::Zeroize;

#[cfg(target_arch = "x86_64")]
mod x86;

/// The block size of AES.
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 16;

/// Which implementation a cipher runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// VAES + AVX2: 16 blocks in flight, two per YMM register (x86-64).
    Vaes,
    /// AES-NI: 8 blocks in flight (x86-64).
    AesNi,
    /// RustCrypto `aes` + `ctr` (their run-time detection and software fallback).
    Soft,
}

impl Impl {
    /// The fastest implementation this CPU supports.
    pub fn best() -> Impl {
        [Impl::Vaes, Impl::AesNi]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Impl::Soft)
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Impl::Vaes => x86::has_vaes(),
            #[cfg(target_arch = "x86_64")]
            Impl::AesNi => x86::has_aesni(),
            #[cfg(not(target_arch = "x86_64"))]
            Impl::Vaes | Impl::AesNi => false,
            Impl::Soft => true,
        }
    }
}

/// The state of a hardware implementation: round keys, the next counter block, and the unused
/// tail of the last keystream block (a call that ends inside a block leaves the rest of it for
/// the next call: a 509-byte cell uses 13 bytes of its 32nd block).
#[cfg(target_arch = "x86_64")]
#[derive(Clone)]
struct Hw {
    keys: x86::RoundKeys,
    /// Counter of the next block to generate (big-endian on the wire, a number here).
    counter: u128,
    /// Keystream of the last block generated; bytes `used..` are still to be used.
    rest: [u8; BLOCK],
    used: usize,
}

#[derive(Clone)]
// The hardware state is the hot path of every relay: inline on purpose, the rare one boxed.
#[allow(clippy::large_enum_variant)]
enum Inner {
    #[cfg(target_arch = "x86_64")]
    Hw(Hw),
    /// Boxed: only on CPUs without AES-NI, where the hardware state is never made.
    Soft(Box<ctr::Ctr128BE<aes::Aes128>>),
}

/// An AES-128-CTR keystream (128-bit big-endian counter starting at the IV). CTR is its own
/// inverse: [`apply_keystream`](Self::apply_keystream) encrypts and decrypts. Calls continue the
/// one stream, split anywhere. Round keys and unused keystream are zeroed on drop.
#[derive(Clone)]
pub struct Aes128Ctr {
    inner: Inner,
}

impl Aes128Ctr {
    /// A keystream under `key` whose first block is the encryption of `iv`, run by
    /// [`Impl::best`].
    pub fn new(key: &[u8; 16], iv: &[u8; 16]) -> Self {
        match Self::with_impl(key, iv, Impl::best()) {
            Some(c) => c,
            None => Self::soft(key, iv),
        }
    }

    /// As [`new`](Self::new) with a given implementation; `None` if this CPU cannot run it
    /// (for tests and benchmarks that compare them).
    pub fn with_impl(key: &[u8; 16], iv: &[u8; 16], imp: Impl) -> Option<Self> {
        if !imp.available() {
            return None;
        }
        match imp {
            #[cfg(target_arch = "x86_64")]
            Impl::Vaes | Impl::AesNi => Some(Aes128Ctr {
                inner: Inner::Hw(Hw {
                    keys: x86::RoundKeys::expand(key, imp == Impl::Vaes)?,
                    counter: u128::from_be_bytes(*iv),
                    rest: [0; BLOCK],
                    used: BLOCK,
                }),
            }),
            _ => Some(Self::soft(key, iv)),
        }
    }

    fn soft(key: &[u8; 16], iv: &[u8; 16]) -> Self {
        Aes128Ctr {
            inner: Inner::Soft(Box::new(ctr::Ctr128BE::new(key.into(), iv.into()))),
        }
    }

    /// Which implementation this cipher runs.
    pub fn implementation(&self) -> Impl {
        match &self.inner {
            #[cfg(target_arch = "x86_64")]
            Inner::Hw(h) if h.keys.vaes() => Impl::Vaes,
            #[cfg(target_arch = "x86_64")]
            Inner::Hw(_) => Impl::AesNi,
            Inner::Soft(_) => Impl::Soft,
        }
    }

    /// XOR the next `data.len()` bytes of keystream into `data`. The counter wraps modulo
    /// 2^128, as tor's does (a circuit never gets near it: 2^128 blocks).
    pub fn apply_keystream(&mut self, data: &mut [u8]) {
        match &mut self.inner {
            #[cfg(target_arch = "x86_64")]
            Inner::Hw(h) => h.apply(data),
            Inner::Soft(c) => c.apply_keystream(data),
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Hw {
    fn apply(&mut self, data: &mut [u8]) {
        // First what is left of the last block.
        let n = data.len().min(BLOCK - self.used);
        let (head, data) = data.split_at_mut(n);
        for (d, k) in head.iter_mut().zip(&self.rest[self.used..]) {
            *d ^= k;
        }
        self.used += n;
        if data.is_empty() {
            return;
        }
        let tail = self.keys.ctr(&mut self.counter, data, &mut self.rest);
        self.used = if tail == 0 { BLOCK } else { tail };
    }
}

impl Drop for Aes128Ctr {
    fn drop(&mut self) {
        // The soft variant's `aes` is built without its `zeroize` feature, as before this crate.
        #[cfg(target_arch = "x86_64")]
        if let Inner::Hw(h) = &mut self.inner {
            h.keys.zeroize();
            h.rest.zeroize();
            h.counter.zeroize();
        }
    }
}

impl std::fmt::Debug for Aes128Ctr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aes128Ctr({:?})", self.implementation())
    }
}

#[cfg(test)]
mod tests;
