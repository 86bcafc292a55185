//! Onion-service descriptors at the authority (issue 19): `POST /onion/<address>` stores a
//! signed descriptor, `GET /onion/<address>` returns it. Chive has no HSDir ring: the
//! authority is the one directory (docs/protocol.md, "Onion services").
//!
//! Verified on upload (size ≤ 16 KiB, signed by the address's key, body names that address,
//! validity window of at most 12 h and current) and again on fetch (an expired descriptor is
//! dropped, not served); the client verifies once more. The store is bounded
//! ([`MAX_ONION_DESCRIPTORS`]); a lower revision than the one held is refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chive_crypto::OnionAddress;
use chive_dir::{OnionDescriptor, MAX_ONION_DESCRIPTOR_LEN};

use crate::dirclient::{quote, request};
use anyhow::{anyhow, bail, Context};
use std::net::SocketAddr;

/// Most services the authority keeps descriptors for.
pub const MAX_ONION_DESCRIPTORS: usize = 4096;

/// The URL prefix of onion descriptors.
pub const ONION_PATH: &str = "/onion/";

struct Held {
    doc: Arc<str>,
    revision: u64,
}

/// The authority's descriptors, by address.
#[derive(Default)]
pub struct OnionStore {
    held: Mutex<HashMap<OnionAddress, Held>>,
}

/// Why an upload or fetch failed, with the HTTP status to answer.
#[derive(Debug, PartialEq, Eq)]
pub struct StoreError {
    /// HTTP status.
    pub status: u16,
    /// Reason, for the body and the log.
    pub reason: String,
}

fn err(status: u16, reason: impl Into<String>) -> StoreError {
    StoreError {
        status,
        reason: reason.into(),
    }
}

/// The address in a `/onion/<address>` path (with or without `.onion`).
pub fn parse_path(path: &str) -> Result<OnionAddress, StoreError> {
    let label = path.strip_prefix(ONION_PATH).unwrap_or(path);
    label
        .parse::<OnionAddress>()
        .map_err(|e| err(400, format!("bad onion address: {e}")))
}

impl OnionStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<OnionAddress, Held>> {
        // Each update is one insert or remove: a panic elsewhere cannot leave it half done.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Verify and store `doc` for `addr` at time `now`. Returns the revision stored.
    pub fn accept(&self, addr: &OnionAddress, doc: &str, now: u64) -> Result<u64, StoreError> {
        let desc = OnionDescriptor::verify(doc, addr, now)
            .map_err(|e| err(400, format!("descriptor refused: {e}")))?;
        let mut held = self.lock();
        match held.get(addr) {
            Some(h) if h.revision > desc.revision => {
                return Err(err(
                    409,
                    format!(
                        "revision {} is older than the one held ({})",
                        desc.revision, h.revision
                    ),
                ))
            }
            Some(_) => {}
            None if held.len() >= MAX_ONION_DESCRIPTORS => {
                // Make room from expired ones first; refuse if none.
                held.retain(|a, h| OnionDescriptor::verify(&h.doc, a, now).is_ok());
                if held.len() >= MAX_ONION_DESCRIPTORS {
                    return Err(err(
                        503,
                        format!("descriptor store full ({MAX_ONION_DESCRIPTORS})"),
                    ));
                }
            }
            None => {}
        }
        held.insert(
            *addr,
            Held {
                doc: Arc::from(doc),
                revision: desc.revision,
            },
        );
        Ok(desc.revision)
    }

    /// The descriptor for `addr`, if one is held and still valid at `now` (checked again:
    /// an expired one is dropped).
    pub fn get(&self, addr: &OnionAddress, now: u64) -> Option<Arc<str>> {
        let mut held = self.lock();
        let doc = held.get(addr)?.doc.clone();
        if OnionDescriptor::verify(&doc, addr, now).is_err() {
            held.remove(addr);
            return None;
        }
        Some(doc)
    }

    /// Number of services held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Upload a service's descriptor to the authority (`POST /onion/<address>`).
pub async fn publish_onion_descriptor(
    authority: SocketAddr,
    addr: &OnionAddress,
    doc: &str,
) -> anyhow::Result<()> {
    let path = format!("{ONION_PATH}{}", addr.label());
    let (status, body) = request(authority, "POST", &path, Some(doc.as_bytes()))
        .await
        .with_context(|| format!("cannot upload the onion descriptor to {authority}"))?;
    if status != 200 {
        bail!(
            "authority {authority} refused the onion descriptor (HTTP {status}): {}",
            quote(&body)
        );
    }
    Ok(())
}

/// What fetching a descriptor can end in (the SOCKS layer maps these to proposal 304 codes).
#[derive(Debug)]
pub enum FetchError {
    /// The authority holds none for this address (SOCKS 0xF0).
    NotFound,
    /// One came back but does not verify (SOCKS 0xF1).
    Invalid(chive_dir::DirError),
    /// The authority could not be asked (SOCKS general failure).
    Unreachable(anyhow::Error),
}

/// Fetch and verify the descriptor of `addr` at time `now`.
pub async fn fetch_onion_descriptor(
    authority: SocketAddr,
    addr: &OnionAddress,
    now: u64,
) -> Result<OnionDescriptor, FetchError> {
    let path = format!("{ONION_PATH}{}", addr.label());
    let (status, body) = request(authority, "GET", &path, None)
        .await
        .map_err(FetchError::Unreachable)?;
    match status {
        200 => {}
        404 => return Err(FetchError::NotFound),
        s => {
            return Err(FetchError::Unreachable(anyhow!(
                "authority answered HTTP {s}: {}",
                quote(&body)
            )))
        }
    }
    if body.len() > MAX_ONION_DESCRIPTOR_LEN {
        return Err(FetchError::Invalid(chive_dir::DirError::TooLarge {
            what: "onion descriptor",
            size: body.len(),
            max: MAX_ONION_DESCRIPTOR_LEN,
        }));
    }
    let doc = String::from_utf8(body).map_err(|_| {
        FetchError::Invalid(chive_dir::DirError::Malformed(
            "onion descriptor is not UTF-8".into(),
        ))
    })?;
    OnionDescriptor::verify(&doc, addr, now).map_err(FetchError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_crypto::ntor::NtorSecretKey;
    use chive_crypto::IdentityKeypair;
    use chive_dir::IntroPoint;
    use rand::SeedableRng;

    const NOW: u64 = 1_700_000_000;

    fn signed(
        id: &IdentityKeypair,
        revision: u64,
        valid_after: u64,
        rng: &mut rand::rngs::StdRng,
    ) -> String {
        let k = IdentityKeypair::generate(rng).public();
        OnionDescriptor {
            address: OnionAddress::from_key(id.public()),
            revision,
            valid_after,
            valid_until: valid_after + 3600,
            intro_points: vec![IntroPoint {
                relay: k,
                onion_key: NtorSecretKey::generate(rng).public(),
                addresses: vec!["127.0.0.1:9001".parse().unwrap()],
                auth_key: k,
                enc_key: NtorSecretKey::generate(rng).public(),
            }],
        }
        .sign(id)
        .unwrap()
    }

    #[test]
    fn store_verifies_on_upload_and_on_fetch() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let id = IdentityKeypair::generate(&mut rng);
        let other = IdentityKeypair::generate(&mut rng);
        let addr = OnionAddress::from_key(id.public());
        let store = OnionStore::default();

        // For another address: refused.
        let theirs = signed(&other, 1, NOW, &mut rng);
        assert_eq!(store.accept(&addr, &theirs, NOW).unwrap_err().status, 400);
        // Tampered: refused.
        let doc = signed(&id, 5, NOW, &mut rng);
        let bad = doc.replace("\"revision\":5", "\"revision\":6");
        assert_ne!(bad, doc);
        assert_eq!(store.accept(&addr, &bad, NOW).unwrap_err().status, 400);
        // Good: stored and served.
        assert_eq!(store.accept(&addr, &doc, NOW), Ok(5));
        assert_eq!(store.get(&addr, NOW + 10).as_deref(), Some(doc.as_str()));
        // An older revision is refused; the held one stays.
        let old = signed(&id, 4, NOW, &mut rng);
        assert_eq!(store.accept(&addr, &old, NOW).unwrap_err().status, 409);
        // Expired by fetch time: dropped, not served.
        assert_eq!(store.get(&addr, NOW + 4 * 3600), None);
        assert!(store.is_empty());
        // Expired on upload: refused.
        assert_eq!(
            store
                .accept(&addr, &signed(&id, 7, NOW - 5 * 3600, &mut rng), NOW)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn paths() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let addr = OnionAddress::from_key(IdentityKeypair::generate(&mut rng).public());
        assert_eq!(parse_path(&format!("/onion/{addr}")), Ok(addr));
        assert_eq!(parse_path(&format!("/onion/{}", addr.label())), Ok(addr));
        assert_eq!(parse_path("/onion/nope").unwrap_err().status, 400);
    }

    /// Over real HTTP: upload, fetch verified, unknown address 404, bad upload refused.
    #[tokio::test]
    async fn post_and_get_over_http() {
        use crate::authority::tests::settings;
        use crate::authority::{serve, Authority};
        use std::sync::Arc;
        let dir = std::env::temp_dir().join(format!("chive-onion-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let auth = Arc::new(Authority::new(
            IdentityKeypair::from_secret_bytes(&[9; 32]),
            settings(&dir, "ConsensusInterval = 3600"),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(serve(auth, listener));

        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let id = IdentityKeypair::generate(&mut rng);
        let addr = OnionAddress::from_key(id.public());
        let now = crate::common::unix_now();
        assert!(matches!(
            fetch_onion_descriptor(at, &addr, now).await,
            Err(FetchError::NotFound)
        ));
        let doc = signed(&id, 1, now, &mut rng);
        publish_onion_descriptor(at, &addr, &doc).await.unwrap();
        let got = fetch_onion_descriptor(at, &addr, now).await.unwrap();
        assert_eq!(got.address, addr);
        assert_eq!(got.revision, 1);
        // Someone else's descriptor under this address: refused with the reason.
        let other = IdentityKeypair::generate(&mut rng);
        let e = publish_onion_descriptor(at, &addr, &signed(&other, 2, now, &mut rng))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("HTTP 400"), "{e}");
        // Too large: refused before parsing.
        let big = "x".repeat(MAX_ONION_DESCRIPTOR_LEN + 1);
        let e = publish_onion_descriptor(at, &addr, &big).await.unwrap_err();
        assert!(e.to_string().contains("HTTP 413"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
