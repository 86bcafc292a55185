//! The rendezvous point: cookies of waiting client circuits, matched by a service's
//! RENDEZVOUS1. On a match the two circuits are to be joined: cells arriving unrecognized on
//! one are passed, re-encrypted, down the other (the caller's job), and the point only ever
//! sees the end-to-end ciphertext. Bounded: past `max` waiting cookies a new one is refused.

use std::collections::HashMap;
use std::hash::Hash;

use chive_cell::{CellError, EstablishRendezvous, Rendezvous1, Rendezvous2, REND_COOKIE_LEN};

/// Default bound on waiting rendezvous circuits per relay.
pub const DEFAULT_MAX_REND_CIRCUITS: usize = 4096;

/// Why a rendezvous message was refused (the caller closes the circuit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendError {
    /// The body did not parse.
    #[error("malformed rendezvous message: {0}")]
    Malformed(#[from] CellError),
    /// ESTABLISH_RENDEZVOUS with a cookie already waiting, or twice on one circuit.
    #[error("rendezvous cookie already in use")]
    CookieInUse,
    /// RENDEZVOUS1 with a cookie nobody waits with.
    #[error("no rendezvous circuit waits with this cookie")]
    UnknownCookie,
    /// The table holds `max` cookies.
    #[error("too many rendezvous circuits")]
    Full,
}

/// One relay's waiting rendezvous circuits. `K` is the core's circuit key.
#[derive(Debug)]
pub struct RendezvousTable<K> {
    by_cookie: HashMap<[u8; REND_COOKIE_LEN], K>,
    by_circ: HashMap<K, [u8; REND_COOKIE_LEN]>,
    max: usize,
    /// Circuit pairs joined.
    pub joined: u64,
}

impl<K: Copy + Eq + Hash> RendezvousTable<K> {
    /// An empty table holding at most `max` cookies.
    pub fn new(max: usize) -> Self {
        RendezvousTable {
            by_cookie: HashMap::new(),
            by_circ: HashMap::new(),
            max,
            joined: 0,
        }
    }

    /// ESTABLISH_RENDEZVOUS on client circuit `circ`.
    pub fn establish(&mut self, circ: K, body: &[u8]) -> Result<(), RendError> {
        let est = EstablishRendezvous::decode(body)?;
        if self.by_cookie.contains_key(&est.cookie) || self.by_circ.contains_key(&circ) {
            return Err(RendError::CookieInUse);
        }
        if self.by_circ.len() >= self.max {
            return Err(RendError::Full);
        }
        self.by_cookie.insert(est.cookie, circ);
        self.by_circ.insert(circ, est.cookie);
        Ok(())
    }

    /// RENDEZVOUS1 on service circuit `svc`: the waiting client circuit and the RENDEZVOUS2
    /// body to send it. The cookie is used up.
    pub fn rendezvous1(&mut self, svc: K, body: &[u8]) -> Result<(K, Vec<u8>), RendError> {
        let r1 = Rendezvous1::decode(body)?;
        let client = self
            .by_cookie
            .get(&r1.cookie)
            .copied()
            .ok_or(RendError::UnknownCookie)?;
        if client == svc {
            return Err(RendError::UnknownCookie);
        }
        let r2 = Rendezvous2 {
            handshake_info: r1.handshake_info,
        }
        .encode()?;
        self.by_cookie.remove(&r1.cookie);
        self.by_circ.remove(&client);
        self.joined += 1;
        Ok((client, r2))
    }

    /// Number of waiting cookies.
    pub fn len(&self) -> usize {
        self.by_circ.len()
    }

    /// True if none wait.
    pub fn is_empty(&self) -> bool {
        self.by_circ.is_empty()
    }

    /// A circuit closed: forget its cookie.
    pub fn circuit_closed(&mut self, circ: K) {
        if let Some(c) = self.by_circ.remove(&circ) {
            self.by_cookie.remove(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r1(cookie: u8) -> Vec<u8> {
        Rendezvous1 {
            cookie: [cookie; 20],
            handshake_info: vec![9; 64],
        }
        .encode()
        .unwrap()
    }

    #[test]
    fn cookie_matches_once() {
        let mut t = RendezvousTable::new(8);
        t.establish(1u32, &[4; 20]).unwrap();
        let (client, r2) = t.rendezvous1(2, &r1(4)).unwrap();
        assert_eq!(client, 1);
        assert_eq!(
            Rendezvous2::decode(&r2).unwrap().handshake_info,
            vec![9; 64]
        );
        assert_eq!(t.rendezvous1(3, &r1(4)), Err(RendError::UnknownCookie));
        assert!(t.is_empty());
        assert_eq!(t.joined, 1);
    }

    #[test]
    fn refusals() {
        let mut t = RendezvousTable::new(1);
        assert!(matches!(
            t.establish(1u32, &[4; 3]),
            Err(RendError::Malformed(_))
        ));
        t.establish(1, &[4; 20]).unwrap();
        assert_eq!(t.establish(2, &[4; 20]), Err(RendError::CookieInUse));
        assert_eq!(t.establish(1, &[5; 20]), Err(RendError::CookieInUse));
        assert_eq!(t.establish(3, &[6; 20]), Err(RendError::Full));
        assert_eq!(t.rendezvous1(1, &r1(4)), Err(RendError::UnknownCookie));
        t.circuit_closed(1);
        assert_eq!(t.rendezvous1(2, &r1(4)), Err(RendError::UnknownCookie));
        t.establish(3, &[6; 20]).unwrap();
    }
}
