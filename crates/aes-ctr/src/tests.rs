//! Every implementation this CPU runs, against NIST's vector and against RustCrypto's `aes` +
//! `ctr` (the reference: what chive used before) on random keys, lengths and call splits.

use super::*;
use rand::{Rng, RngCore, SeedableRng};

/// The implementations this CPU can run (always at least `Soft`).
fn impls() -> Vec<Impl> {
    [Impl::Vaes, Impl::AesNi, Impl::Soft]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

fn reference(key: &[u8; 16], iv: &[u8; 16]) -> ctr::Ctr128BE<aes::Aes128> {
    ctr::Ctr128BE::new(key.into(), iv.into())
}

fn unhex<const N: usize>(s: &str) -> [u8; N] {
    hex::decode(s).unwrap().try_into().unwrap()
}

#[test]
fn runs_the_best_implementation() {
    let c = Aes128Ctr::new(&[0; 16], &[0; 16]);
    assert_eq!(c.implementation(), Impl::best());
    assert!(Impl::Soft.available());
    for imp in impls() {
        let c = Aes128Ctr::with_impl(&[0; 16], &[0; 16], imp).unwrap();
        assert_eq!(c.implementation(), imp);
    }
    // On x86-64 this says which of them the other tests cover here.
    eprintln!("implementations tested: {:?}", impls());
}

/// NIST SP 800-38A, F.5.1 CTR-AES128.Encrypt: whole, then in every split into two calls.
#[test]
fn nist_sp800_38a_f51() {
    let key: [u8; 16] = unhex("2b7e151628aed2a6abf7158809cf4f3c");
    let iv: [u8; 16] = unhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
    let plain: [u8; 64] = unhex(concat!(
        "6bc1bee22e409f96e93d7e117393172a",
        "ae2d8a571e03ac9c9eb76fac45af8e51",
        "30c81c46a35ce411e5fbc1191a0a52ef",
        "f69f2445df4f9b17ad2b417be66c3710"
    ));
    let cipher: [u8; 64] = unhex(concat!(
        "874d6191b620e3261bef6864990db6ce",
        "9806f66b7970fdff8617187bb9fffdff",
        "5ae4df3edbd5d35e5b4f09020db03eab",
        "1e031dda2fbe03d1792170a0f3009cee"
    ));
    for imp in impls() {
        for split in 0..=64 {
            let mut c = Aes128Ctr::with_impl(&key, &iv, imp).unwrap();
            let mut buf = plain;
            let (a, b) = buf.split_at_mut(split);
            c.apply_keystream(a);
            c.apply_keystream(b);
            assert_eq!(buf, cipher, "{imp:?}, split at {split}");
            // CTR is its own inverse.
            let mut c = Aes128Ctr::with_impl(&key, &iv, imp).unwrap();
            c.apply_keystream(&mut buf);
            assert_eq!(buf, plain, "{imp:?}");
        }
    }
}

/// Compare one implementation with the reference over a stream cut into `cuts` calls.
fn check_stream(imp: Impl, key: &[u8; 16], iv: &[u8; 16], data: &[u8], cuts: &[usize]) {
    let mut want = data.to_vec();
    reference(key, iv).apply_keystream(&mut want);
    let mut got = data.to_vec();
    let mut c = Aes128Ctr::with_impl(key, iv, imp).unwrap();
    let mut rest = &mut got[..];
    for &n in cuts {
        let (now, later) = rest.split_at_mut(n.min(rest.len()));
        c.apply_keystream(now);
        rest = later;
    }
    c.apply_keystream(rest);
    assert_eq!(
        got,
        want,
        "{imp:?} key {} iv {} len {} cuts {cuts:?}",
        hex::encode(key),
        hex::encode(iv),
        data.len()
    );
}

/// Random keys, lengths 0..2000 in one call and cut at random points (the stream continuing
/// across calls, as across cells).
#[test]
fn matches_aes_ctr_on_random_streams() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc41e);
    for imp in impls() {
        for len in 0..2000 {
            let key: [u8; 16] = rng.gen();
            let iv: [u8; 16] = if len % 2 == 0 { [0; 16] } else { rng.gen() };
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            check_stream(imp, &key, &iv, &data, &[]);
            let cuts: Vec<usize> = (0..rng.gen_range(1..6))
                .map(|_| rng.gen_range(0..=len.min(600)))
                .collect();
            check_stream(imp, &key, &iv, &data, &cuts);
        }
    }
}

/// Cells of tor1's 509 bytes, many in a row: every phase of the 16-byte block within a call.
#[test]
fn matches_aes_ctr_over_cells() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(509);
    for imp in impls() {
        let key: [u8; 16] = rng.gen();
        let mut data = vec![0u8; 509 * 40];
        rng.fill_bytes(&mut data);
        check_stream(imp, &key, &[0; 16], &data, &[509; 39]);
    }
}

/// Counters that carry out of the low 32 and 64 bits, and wrap at 2^128, inside a group of
/// blocks and inside the short last group, at every offset near the carry.
#[test]
fn counter_carries_and_wraps() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2128);
    let edges: [u128; 3] = [1 << 32, 1 << 64, 0];
    for imp in impls() {
        for edge in edges {
            for before in 0..40u128 {
                let iv = edge.wrapping_sub(before).to_be_bytes();
                let key: [u8; 16] = rng.gen();
                for len in [16, 100, 255, 256, 509, 700] {
                    let mut data = vec![0u8; len];
                    rng.fill_bytes(&mut data);
                    check_stream(imp, &key, &iv, &data, &[]);
                    check_stream(imp, &key, &iv, &data, &[rng.gen_range(0..len)]);
                }
            }
        }
    }
}

/// A clone continues the same stream independently.
#[test]
fn clone_continues_the_stream() {
    for imp in impls() {
        let mut a = Aes128Ctr::with_impl(&[7; 16], &[0; 16], imp).unwrap();
        a.apply_keystream(&mut [0u8; 13]);
        let mut b = a.clone();
        let (mut x, mut y) = ([0u8; 100], [0u8; 100]);
        a.apply_keystream(&mut x);
        b.apply_keystream(&mut y);
        assert_eq!(x, y, "{imp:?}");
        assert_ne!(x, [0u8; 100]);
    }
}
