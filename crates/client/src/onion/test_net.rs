//! A small consensus for the onion policy tests (no network: the core's Connect events are
//! never answered).

use std::sync::Arc;

use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::IdentityKeypair;
use chive_dir::{Consensus, ConsensusRelay, ExitPolicy, NetParams, RelayFlags};

/// `n` running, valid guard relays r1..rn.
pub(crate) fn consensus(n: u8) -> Arc<Consensus> {
    consensus_of(n, RelayFlags::GUARD, &["reject *:*"])
}

/// `n` running, valid relays r1..rn (identity and ntor key from seed i, port 9000 + i) with
/// `flags` besides RUNNING and VALID and the exit policy `policy`.
pub(crate) fn consensus_of(n: u8, flags: RelayFlags, policy: &[&str]) -> Arc<Consensus> {
    let relays = (1..=n)
        .map(|i| ConsensusRelay {
            nickname: format!("r{i}"),
            identity: IdentityKeypair::from_secret_bytes(&[i; 32]).public(),
            ntor_key: NtorSecretKey::from_bytes([i; 32]).public().0,
            address: format!("127.0.0.1:{}", 9000 + u16::from(i))
                .parse()
                .unwrap(),
            bandwidth: 100,
            flags: RelayFlags::RUNNING | RelayFlags::VALID | flags,
            exit_policy: ExitPolicy::parse(policy, false).unwrap(),
            features: 0,
        })
        .collect();
    Arc::new(Consensus {
        valid_after: 0,
        fresh_until: 1,
        valid_until: 2,
        params: NetParams::new(),
        relays,
    })
}
