//! The introduction point: which circuit speaks for which intro auth key.
//!
//! A service's ESTABLISH_INTRO is accepted only if HANDSHAKE_AUTH is the SHA3 MAC of its
//! fields under the circuit's KH (so it was made for this circuit and cannot be replayed on
//! another) and SIG verifies under AUTH_KEY. A newer circuit for the same key replaces the
//! older one, which the caller closes (C tor does the same). INTRODUCE1 from a client is passed
//! on unchanged as INTRODUCE2; the client learns the outcome from INTRODUCE_ACK.
//! The table is bounded: past `max` circuits a new ESTABLISH_INTRO is refused.

use std::collections::HashMap;
use std::hash::Hash;

use chive_cell::{CellError, EstablishIntro, Introduce, IntroduceAckStatus};
use chive_crypto::hs_ntor::sha3_mac;
use chive_crypto::{IdentityKey, Signature};

/// Why an ESTABLISH_INTRO was refused (the caller closes the circuit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntroError {
    /// The body did not parse.
    #[error("malformed ESTABLISH_INTRO: {0}")]
    Malformed(#[from] CellError),
    /// HANDSHAKE_AUTH is not the MAC under this circuit's KH.
    #[error("ESTABLISH_INTRO handshake auth does not match the circuit")]
    BadHandshakeAuth,
    /// AUTH_KEY is not a valid key or SIG does not verify.
    #[error("ESTABLISH_INTRO signature does not verify")]
    BadSignature,
    /// The circuit is already an introduction circuit.
    #[error("circuit is already an introduction circuit")]
    AlreadyIntro,
    /// The table holds `max` circuits.
    #[error("too many introduction circuits")]
    Full,
}

/// One relay's introduction circuits. `K` is the core's circuit key.
#[derive(Debug)]
pub struct IntroPointTable<K> {
    by_auth: HashMap<[u8; 32], K>,
    by_circ: HashMap<K, [u8; 32]>,
    max: usize,
    /// INTRODUCE1 passed on.
    pub introduced: u64,
    /// INTRODUCE1 refused (unparsable or unknown auth key).
    pub refused: u64,
}

/// Default bound on introduction circuits per relay.
pub const DEFAULT_MAX_INTRO_CIRCUITS: usize = 4096;

impl<K: Copy + Eq + Hash> IntroPointTable<K> {
    /// An empty table holding at most `max` circuits.
    pub fn new(max: usize) -> Self {
        IntroPointTable {
            by_auth: HashMap::new(),
            by_circ: HashMap::new(),
            max,
            introduced: 0,
            refused: 0,
        }
    }

    /// ESTABLISH_INTRO on `circ`, whose handshake with this relay gave `kh`. On success returns
    /// the older circuit for the same key, if any (to close).
    pub fn establish(
        &mut self,
        circ: K,
        kh: &[u8; 20],
        body: &[u8],
    ) -> Result<Option<K>, IntroError> {
        let est = EstablishIntro::decode(body)?;
        if self.by_circ.contains_key(&circ) {
            return Err(IntroError::AlreadyIntro);
        }
        let mac = sha3_mac(kh, &est.mac_bytes()?);
        if !ct_eq(&mac, &est.handshake_auth) {
            return Err(IntroError::BadHandshakeAuth);
        }
        let key = IdentityKey::from_bytes(&est.auth_key).map_err(|_| IntroError::BadSignature)?;
        key.verify(&est.signed_bytes()?, &Signature(est.sig))
            .map_err(|_| IntroError::BadSignature)?;
        let old = self.by_auth.get(&est.auth_key).copied();
        if old.is_none() && self.by_circ.len() >= self.max {
            return Err(IntroError::Full);
        }
        if let Some(old) = old {
            self.by_circ.remove(&old);
        }
        self.by_auth.insert(est.auth_key, circ);
        self.by_circ.insert(circ, est.auth_key);
        Ok(old)
    }

    /// INTRODUCE1 from a client: `Ok((service circuit, INTRODUCE2 body))`, or the status to
    /// answer with. The body is passed on byte for byte (its MAC covers the header).
    pub fn introduce1(&mut self, body: &[u8]) -> Result<(K, Vec<u8>), IntroduceAckStatus> {
        let Ok(intro) = Introduce::decode(body) else {
            self.refused += 1;
            return Err(IntroduceAckStatus::BadFormat);
        };
        match self.by_auth.get(&intro.auth_key) {
            Some(&svc) => {
                self.introduced += 1;
                Ok((svc, body.to_vec()))
            }
            None => {
                self.refused += 1;
                Err(IntroduceAckStatus::UnknownService)
            }
        }
    }

    /// Is `circ` a service's introduction circuit here?
    pub fn is_intro_circuit(&self, circ: K) -> bool {
        self.by_circ.contains_key(&circ)
    }

    /// Number of introduction circuits.
    pub fn len(&self) -> usize {
        self.by_circ.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.by_circ.is_empty()
    }

    /// A circuit closed: forget it.
    pub fn circuit_closed(&mut self, circ: K) {
        if let Some(auth) = self.by_circ.remove(&circ) {
            if self.by_auth.get(&auth) == Some(&circ) {
                self.by_auth.remove(&auth);
            }
        }
    }
}

/// MAC comparison without an early exit (timing must not tell how many bytes matched).
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_crypto::IdentityKeypair;
    use rand::SeedableRng;

    fn est(auth: &IdentityKeypair, kh: &[u8; 20]) -> EstablishIntro {
        let mut e = EstablishIntro {
            auth_key: *auth.public().as_bytes(),
            extensions: vec![],
            handshake_auth: [0; 32],
            sig: [0; 64],
        };
        e.handshake_auth = sha3_mac(kh, &e.mac_bytes().unwrap());
        e.sig = auth.sign(&e.signed_bytes().unwrap()).0;
        e
    }

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(3)
    }

    #[test]
    fn establish_then_introduce() {
        let auth = IdentityKeypair::generate(&mut rng());
        let mut t = IntroPointTable::new(4);
        let body = est(&auth, &[1; 20]).encode().unwrap();
        assert_eq!(t.establish(7u32, &[1; 20], &body), Ok(None));
        assert!(t.is_intro_circuit(7));
        let intro1 = Introduce {
            auth_key: *auth.public().as_bytes(),
            extensions: vec![],
            encrypted: vec![5; 100],
        }
        .encode()
        .unwrap();
        assert_eq!(t.introduce1(&intro1), Ok((7, intro1.clone())));
        assert_eq!(t.introduced, 1);
        t.circuit_closed(7);
        assert_eq!(
            t.introduce1(&intro1),
            Err(IntroduceAckStatus::UnknownService)
        );
        assert_eq!(t.introduce1(&[1, 2, 3]), Err(IntroduceAckStatus::BadFormat));
        assert_eq!(t.refused, 2);
    }

    #[test]
    fn kh_of_another_circuit_is_refused() {
        let auth = IdentityKeypair::generate(&mut rng());
        let mut t = IntroPointTable::new(4);
        let body = est(&auth, &[1; 20]).encode().unwrap();
        assert_eq!(
            t.establish(7u32, &[2; 20], &body),
            Err(IntroError::BadHandshakeAuth)
        );
        assert!(t.is_empty());
    }

    #[test]
    fn bad_signature_is_refused() {
        let mut r = rng();
        let auth = IdentityKeypair::generate(&mut r);
        let other = IdentityKeypair::generate(&mut r);
        let mut e = est(&auth, &[1; 20]);
        e.sig = other.sign(&e.signed_bytes().unwrap()).0;
        let mut t = IntroPointTable::new(4);
        assert_eq!(
            t.establish(7u32, &[1; 20], &e.encode().unwrap()),
            Err(IntroError::BadSignature)
        );
    }

    #[test]
    fn newer_circuit_replaces_older_and_table_is_bounded() {
        let mut r = rng();
        let auth = IdentityKeypair::generate(&mut r);
        let mut t = IntroPointTable::new(1);
        t.establish(1u32, &[1; 20], &est(&auth, &[1; 20]).encode().unwrap())
            .unwrap();
        assert_eq!(
            t.establish(2u32, &[2; 20], &est(&auth, &[2; 20]).encode().unwrap()),
            Ok(Some(1))
        );
        assert!(!t.is_intro_circuit(1));
        let other = IdentityKeypair::generate(&mut r);
        assert_eq!(
            t.establish(3u32, &[3; 20], &est(&other, &[3; 20]).encode().unwrap()),
            Err(IntroError::Full)
        );
        // The old circuit closing later does not unregister the new one.
        t.circuit_closed(1);
        assert!(t.is_intro_circuit(2));
    }
}
