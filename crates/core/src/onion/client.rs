//! The client's side of one onion-service connection, given one introduction point from a
//! verified descriptor: a fresh rendezvous cookie (ESTABLISH_RENDEZVOUS), INTRODUCE1 naming
//! the rendezvous point, INTRODUCE_ACK, and RENDEZVOUS2 → the end-to-end keys (the caller then
//! attaches the virtual hop with `service_side = false` and opens streams as on any circuit).

use chive_cell::{
    EstablishRendezvous, Introduce, IntroduceAck, IntroduceAckStatus, IntroducePlaintext,
    Rendezvous2, RELAY_DATA_LEN,
};
use chive_crypto::hs_ntor::{self, HsIntroPublic, HsKeyMaterial, HsNtorClientState};
use rand_core::{CryptoRng, RngCore};

use crate::HopSpec;

use super::service::link_specs;

/// Why a connection attempt failed; each maps to a proposal 304 SOCKS error in the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OnionClientError {
    /// The descriptor's keys are unusable (a degenerate `B`).
    #[error("invalid descriptor keys")]
    BadDescriptor,
    /// INTRODUCE_ACK said no, or did not parse.
    #[error("introduction failed: {0:?}")]
    IntroFailed(IntroduceAckStatus),
    /// RENDEZVOUS2 came without an INTRODUCE1 sent, did not parse or did not authenticate.
    #[error("rendezvous handshake failed")]
    RendezvousFailed,
}

/// One connection attempt.
pub struct ClientRendezvous {
    cookie: [u8; 20],
    intro: HsIntroPublic,
    state: Option<HsNtorClientState>,
}

impl ClientRendezvous {
    /// A new attempt through the intro point `intro` (from the descriptor), with a random cookie.
    pub fn new<R: RngCore + CryptoRng>(rng: &mut R, intro: HsIntroPublic) -> Self {
        let mut cookie = [0u8; 20];
        rng.fill_bytes(&mut cookie);
        ClientRendezvous {
            cookie,
            intro,
            state: None,
        }
    }

    /// ESTABLISH_RENDEZVOUS body, for the last hop of the rendezvous circuit.
    pub fn establish_rendezvous(&self) -> Vec<u8> {
        EstablishRendezvous {
            cookie: self.cookie,
        }
        .encode()
    }

    /// INTRODUCE1 body naming rendezvous point `rp`, for the last hop of the intro circuit.
    /// The plaintext is padded so that INTRODUCE1 fills its cell (its length says nothing).
    pub fn introduce1<R: RngCore + CryptoRng>(
        &mut self,
        rng: &mut R,
        rp: &HopSpec,
    ) -> Result<Vec<u8>, OnionClientError> {
        let mut intro1 = Introduce {
            auth_key: *self.intro.auth_key.as_bytes(),
            extensions: vec![],
            encrypted: vec![],
        };
        let header = intro1
            .header()
            .map_err(|_| OnionClientError::BadDescriptor)?;
        let pad_to = RELAY_DATA_LEN - header.len() - hs_ntor::HS_INTRO_OVERHEAD;
        let plain = IntroducePlaintext {
            cookie: self.cookie,
            extensions: vec![],
            onion_key: rp.ntor_key.0,
            link_specifiers: link_specs(rp),
        }
        .encode(pad_to)
        .map_err(|_| OnionClientError::BadDescriptor)?;
        let (state, enc) = hs_ntor::client_introduce(rng, &self.intro, &header, &plain)
            .map_err(|_| OnionClientError::BadDescriptor)?;
        intro1.encrypted = enc;
        self.state = Some(state);
        intro1.encode().map_err(|_| OnionClientError::BadDescriptor)
    }

    /// INTRODUCE_ACK from the intro point.
    pub fn on_introduce_ack(&self, body: &[u8]) -> Result<(), OnionClientError> {
        match IntroduceAck::decode(body) {
            Ok(IntroduceAck {
                status: IntroduceAckStatus::Success,
                ..
            }) => Ok(()),
            Ok(ack) => Err(OnionClientError::IntroFailed(ack.status)),
            Err(_) => Err(OnionClientError::IntroFailed(IntroduceAckStatus::BadFormat)),
        }
    }

    /// RENDEZVOUS2 on the rendezvous circuit: the end-to-end keys (AUTH checked).
    pub fn on_rendezvous2(&mut self, body: &[u8]) -> Result<HsKeyMaterial, OnionClientError> {
        let state = self
            .state
            .take()
            .ok_or(OnionClientError::RendezvousFailed)?;
        let r2 = Rendezvous2::decode(body).map_err(|_| OnionClientError::RendezvousFailed)?;
        hs_ntor::client_rendezvous(state, &r2.handshake_info)
            .map_err(|_| OnionClientError::RendezvousFailed)
    }
}
