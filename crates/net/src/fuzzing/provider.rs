//! The `record_handover` target's rustls CryptoProvider: chive's link provider
//! (`tls::provider()`: ring, the link suites) except for two things a fuzzer need not pay for,
//! after BoringSSL's and OpenSSL's fuzzer mode (`FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION`):
//!
//! - the X25519 group is replaced by [`FakeX25519`], whose "public key" is 32 bytes of the
//!   stream below and whose shared secret is the XOR of both public values: still a different
//!   secret per handshake and one both ends agree on, so a changed key share still breaks the
//!   handshake and every record still authenticates, but no scalar multiplication (about two
//!   thirds of an execution went into ring's X25519 and P-256, session 20);
//! - randomness (the hellos' randoms, the key shares) comes from a deterministic stream that
//!   [`reseed`] restarts for each input, so a replayed input gets the same hellos and shares.
//!
//! Everything else is real: the cipher suites and record protection, the P-256 certificate and
//! its CertificateVerify signature and check (chive's link config, `tls.rs`), the key schedule.
//! ring draws the certificate's key (once per process) and the ECDSA nonce itself, so those
//! bytes, and the signature's DER length, still differ between runs.
//!
//! UNSAFE FOR PRODUCTION, and unreachable there: this module exists only with the `fuzzing`
//! feature, which only `chive-fuzz-targets` enables (never the chive binary), and only
//! `fuzzing::handover` uses it.

use std::cell::Cell;
use std::sync::Arc;

use rustls::crypto::{ActiveKeyExchange, CryptoProvider, SecureRandom, SharedSecret};
use rustls::crypto::{GetRandomFailed, SupportedKxGroup};
use rustls::{NamedGroup, PeerMisbehaved};

use crate::tls;

thread_local! {
    /// The deterministic stream's state (SplitMix64); per thread, as libFuzzer runs one input
    /// at a time on one thread.
    static STATE: Cell<u64> = const { Cell::new(0) };
}

/// Restart the deterministic stream at `seed` (once per input).
pub(crate) fn reseed(seed: u64) {
    STATE.with(|s| s.set(seed));
}

/// Fill `buf` from the stream (SplitMix64: cheap, and plenty for bytes nobody relies on).
fn fill(buf: &mut [u8]) {
    STATE.with(|s| {
        for chunk in buf.chunks_mut(8) {
            let mut z = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(z);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    });
}

/// The link provider with [`FakeX25519`] in X25519's place and [`StreamRandom`].
pub(crate) fn provider() -> Arc<CryptoProvider> {
    let real = tls::provider();
    let kx_groups = real
        .kx_groups
        .iter()
        .map(|g| -> &'static dyn SupportedKxGroup {
            if g.name() == NamedGroup::X25519 {
                &FakeX25519
            } else {
                *g
            }
        })
        .collect();
    Arc::new(CryptoProvider {
        kx_groups,
        secure_random: &StreamRandom,
        ..(*real).clone()
    })
}

/// rustls's randomness from the deterministic stream.
#[derive(Debug)]
struct StreamRandom;

impl SecureRandom for StreamRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        fill(buf);
        Ok(())
    }
}

/// Named X25519 on the wire (same group id, 32-byte shares); see the module docs.
#[derive(Debug)]
struct FakeX25519;

struct FakeShare([u8; 32]);

impl SupportedKxGroup for FakeX25519 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let mut public = [0u8; 32];
        fill(&mut public);
        Ok(Box::new(FakeShare(public)))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

impl ActiveKeyExchange for FakeShare {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, rustls::Error> {
        // The real group refuses a share of another length the same way.
        let peer: &[u8; 32] = peer
            .try_into()
            .map_err(|_| rustls::Error::from(PeerMisbehaved::InvalidKeyShare))?;
        let secret: Vec<u8> = self.0.iter().zip(peer).map(|(a, b)| a ^ b).collect();
        Ok(SharedSecret::from(secret))
    }

    fn pub_key(&self) -> &[u8] {
        &self.0
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_agree_and_the_secret_depends_on_both_shares() {
        reseed(7);
        let a = FakeX25519.start().unwrap();
        let b = FakeX25519.start().unwrap();
        let c = FakeX25519.start().unwrap();
        let (pa, pb, pc) = (
            a.pub_key().to_vec(),
            b.pub_key().to_vec(),
            c.pub_key().to_vec(),
        );
        assert!(pa != pb && pb != pc && pa != pc, "fresh shares");
        let ab = a.complete(&pb).unwrap();
        let ba = b.complete(&pa).unwrap();
        assert_eq!(ab.secret_bytes(), ba.secret_bytes());
        let ca = c.complete(&pa).unwrap();
        assert_ne!(ab.secret_bytes(), ca.secret_bytes());
        let short = FakeX25519.start().unwrap();
        assert!(short.complete(&pa[..31]).is_err());
    }

    #[test]
    fn the_stream_restarts_at_its_seed() {
        let (mut x, mut y) = ([0u8; 13], [0u8; 13]);
        reseed(1);
        fill(&mut x);
        reseed(1);
        fill(&mut y);
        assert_eq!(x, y);
        reseed(2);
        fill(&mut y);
        assert_ne!(x, y);
    }

    #[test]
    fn only_x25519_and_the_randomness_differ_from_the_link_provider() {
        let (real, fake) = (tls::provider(), provider());
        let names = |p: &CryptoProvider| p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>();
        assert_eq!(names(&real), names(&fake));
        assert_eq!(real.cipher_suites, fake.cipher_suites);
        assert_eq!(
            format!("{:?}", fake.kx_groups[0]),
            "FakeX25519",
            "X25519 replaced"
        );
        assert_eq!(
            format!("{:?}", fake.kx_groups[1]),
            "secp256r1",
            "the others real"
        );
    }
}
