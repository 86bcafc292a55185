//! Per-circuit congestion-control agreement (proposal 324 "Negotiation", carried by ntor v3,
//! proposal 332): both ends of a circuit use the policy the client asked for in CREATE2 and
//! the last hop answered in CREATED2, never two separately read consensuses.
//!
//! - Client: the last hop of every origin circuit is handshaken with ntor v3; it carries
//!   `CC_REQUEST` when this node's policy is Vegas (its consensus says `cc_alg=2`). The
//!   circuit's window (and so its streams' flow: XON/XOFF or stream SENDMEs) is Vegas only if
//!   the answer carries `CC_RESPONSE`, else the fixed window. An answer that was not asked for,
//!   with a `SENDME_INC` other than chive's 100, or malformed closes that circuit with a logged
//!   protocol error. Earlier hops keep ntor v1 (they carry no streams).
//! - Relay: a `CC_REQUEST` is accepted with this relay's own Vegas parameters when its
//!   consensus says `cc_alg=2`, and with the default parameters while it has no consensus yet
//!   (as tor's exits answer from their own parameters); it is declined (no `CC_RESPONSE`) once
//!   its consensus says `cc_alg=0`. The answer is recorded on the circuit and builds the exit's
//!   window at its first stream. ntor v1 circuits (no request possible) are fixed-window.

use chive_cell::{CircExt, Create2};
use chive_crypto::ntor::{self, KeyMaterial, NtorClientState, NTOR_HTYPE};
use chive_crypto::ntor_v3::{self, NtorV3ClientState, CIRCUIT_VERIFICATION, NTOR_V3_HTYPE};

use crate::cc::{CcKind, VegasParams};
use crate::flow::{CircuitWindow, CIRCUIT_SENDME_INCREMENT};
use crate::CircKey;

use super::config::HopSpec;
use super::Core;

/// A client's pending handshake with one hop.
pub(super) enum HopHandshake {
    /// ntor v1 (hops before the last).
    V1(NtorClientState),
    /// ntor v3 at the last hop; `asked`: the Vegas parameters this client asked to use.
    V3 {
        state: NtorV3ClientState,
        asked: Option<VegasParams>,
    },
}

/// Congestion-control agreement counters (`Core::cc_agreement_stats`), per role. Relay: the
/// ntor v3 CREATE2s that asked (`CC_REQUEST`); client: the last hops it asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CcAgreementStats {
    /// Relay: a request answered with `CC_RESPONSE` (the circuit uses congestion control).
    pub relay_agreed: u64,
    /// Relay: a request answered without `CC_RESPONSE` (this relay's consensus says
    /// `cc_alg=0`): the circuit keeps the fixed window.
    pub relay_declined: u64,
    /// Relay: a CREATE2 refused for a malformed extension list (DESTROY with PROTOCOL).
    pub relay_refused: u64,
    /// Client: the last hop answered our request with `CC_RESPONSE`.
    pub client_agreed: u64,
    /// Client: the last hop answered our request without `CC_RESPONSE` (fixed window).
    pub client_declined: u64,
    /// Client: a CREATED2 refused as hostile (agreeing to what was not asked, another
    /// `SENDME_INC`, a malformed list): the circuit was closed with a protocol error.
    pub client_refused: u64,
}

impl HopHandshake {
    /// Whether this handshake asked for congestion control (ntor v3 with `CC_REQUEST`).
    pub(super) fn asked_for_cc(&self) -> bool {
        matches!(self, HopHandshake::V3 { asked: Some(_), .. })
    }

    /// Whether this is the last hop's handshake (ntor v3).
    pub(super) fn is_v3(&self) -> bool {
        matches!(self, HopHandshake::V3 { .. })
    }
}

/// What a relay does for one CREATE2.
pub(super) struct Answered {
    pub(super) reply: Vec<u8>,
    pub(super) km: KeyMaterial,
    /// Whether the circuit agreed on congestion control.
    pub(super) vegas: bool,
}

impl Core {
    /// Client: the handshake for `hop` (`last`: the circuit's last hop, which gets ntor v3).
    pub(super) fn hop_handshake(&mut self, hop: &HopSpec, last: bool) -> (HopHandshake, Create2) {
        if !last {
            let (state, onionskin) =
                ntor::client_create(&mut self.rng, &hop.identity.ntor_id(), &hop.ntor_key);
            let create = Create2 {
                handshake_type: NTOR_HTYPE,
                handshake: onionskin.to_vec(),
            };
            return (HopHandshake::V1(state), create);
        }
        let asked = match self.cfg.congestion_control {
            CcKind::Vegas(p) => Some(p),
            CcKind::Fixed => None,
        };
        let exts: &[CircExt] = if asked.is_some() {
            &[CircExt::CcRequest]
        } else {
            &[]
        };
        // One known extension of no body: always encodable.
        let msg = CircExt::encode_list(exts).unwrap_or_else(|_| vec![0]);
        let (state, handshake) = ntor_v3::client_create(
            &mut self.rng,
            hop.identity.as_bytes(),
            &hop.ntor_key,
            &msg,
            CIRCUIT_VERIFICATION,
        );
        let create = Create2 {
            handshake_type: NTOR_V3_HTYPE,
            handshake,
        };
        (HopHandshake::V3 { state, asked }, create)
    }

    /// Client: check a hop's reply. Returns the key material and, for the last hop, the
    /// circuit's agreed policy; `Err` is the protocol error to close the circuit with.
    pub(super) fn hop_finish(
        hs: HopHandshake,
        reply: &[u8],
    ) -> Result<(KeyMaterial, Option<CcKind>), String> {
        let (state, asked) = match hs {
            HopHandshake::V1(state) => {
                return ntor::client_finish(state, reply)
                    .map(|km| (km, None))
                    .map_err(|e| format!("ntor handshake failed: {e}"))
            }
            HopHandshake::V3 { state, asked } => (state, asked),
        };
        let (msg, km) = ntor_v3::client_finish(state, reply)
            .map_err(|e| format!("ntor v3 handshake failed: {e}"))?;
        let exts = CircExt::decode_list(&msg)
            .map_err(|e| format!("protocol error: malformed CREATED2 extensions: {e}"))?;
        let mut cc = CcKind::Fixed;
        for ext in exts {
            if let CircExt::CcResponse { sendme_inc } = ext {
                let Some(p) = asked else {
                    return Err("protocol error: CREATED2 agrees to congestion control \
                                the client did not ask for"
                        .into());
                };
                if u32::from(sendme_inc) != CIRCUIT_SENDME_INCREMENT {
                    return Err(format!(
                        "protocol error: CREATED2 asks for SENDME_INC {sendme_inc}, \
                         chive acknowledges every {CIRCUIT_SENDME_INCREMENT} cells"
                    ));
                }
                cc = CcKind::Vegas(p);
            }
        }
        Ok((km, Some(cc)))
    }

    /// Relay: what this relay answers a congestion-control request with (see the module docs).
    fn cc_offer(&self) -> Option<VegasParams> {
        match self.cfg.congestion_control {
            CcKind::Vegas(p) => Some(p),
            CcKind::Fixed if !self.cc_from_consensus => Some(VegasParams::default()),
            CcKind::Fixed => None,
        }
    }

    /// Relay: answer a CREATE2 of either ntor version; `Err` is why it is refused.
    pub(super) fn answer_create2(&mut self, create: &Create2) -> Result<Answered, String> {
        let Some(keys) = self.cfg.relay.as_ref() else {
            return Err("not a relay".into());
        };
        match create.handshake_type {
            NTOR_HTYPE => {
                let id20 = keys.identity.ntor_id();
                let (reply, km) =
                    ntor::server_handshake(&mut self.rng, &id20, &keys.ntor, &create.handshake)
                        .map_err(|e| format!("ntor handshake failed: {e}"))?;
                Ok(Answered {
                    reply: reply.to_vec(),
                    km,
                    vegas: false,
                })
            }
            NTOR_V3_HTYPE => {
                let id = *keys.identity.as_bytes();
                let opened = ntor_v3::server_open(
                    &mut self.rng,
                    &id,
                    &keys.ntor,
                    &create.handshake,
                    CIRCUIT_VERIFICATION,
                )
                .map_err(|e| format!("ntor v3 handshake failed: {e}"))?;
                let exts = match CircExt::decode_list(&opened.message) {
                    Ok(exts) => exts,
                    Err(e) => {
                        self.cc_agreement.relay_refused += 1;
                        return Err(format!("malformed CREATE2 extensions: {e}"));
                    }
                };
                let asked = exts.iter().any(|e| matches!(e, CircExt::CcRequest));
                let offer = self.cc_offer();
                if asked && offer.is_some() {
                    self.cc_agreement.relay_agreed += 1;
                } else if asked {
                    self.cc_agreement.relay_declined += 1;
                }
                let (vegas, answer) = match offer {
                    Some(_) if asked => (
                        true,
                        vec![CircExt::CcResponse {
                            // 100 fits a byte.
                            sendme_inc: CIRCUIT_SENDME_INCREMENT as u8,
                        }],
                    ),
                    _ => (false, vec![]),
                };
                let msg = CircExt::encode_list(&answer).map_err(|e| e.to_string())?;
                let (reply, km) = opened
                    .finish(&msg)
                    .map_err(|e| format!("ntor v3 handshake failed: {e}"))?;
                Ok(Answered { reply, km, vegas })
            }
            other => Err(format!("unsupported handshake type {other}")),
        }
    }

    /// The congestion-control agreement counters (relay and client side).
    pub fn cc_agreement_stats(&self) -> CcAgreementStats {
        self.cc_agreement
    }

    /// Client: count the outcome of the last hop's answer to a handshake that `asked` for
    /// congestion control (`Ok(vegas)`: it agreed or declined; `Err`: the reply was refused,
    /// counted only when it was a protocol error in the extensions, not a failed handshake).
    pub(super) fn count_cc_answer(&mut self, asked: bool, outcome: Result<bool, &str>) {
        let c = &mut self.cc_agreement;
        match outcome {
            Ok(true) => c.client_agreed += 1,
            Ok(false) if asked => c.client_declined += 1,
            Ok(false) => {}
            Err(e) if e.starts_with("protocol error") => c.client_refused += 1,
            Err(_) => {}
        }
    }

    /// Whether circuit `key` agreed on congestion control (`None`: no such circuit).
    pub fn circuit_uses_congestion_control(&self, key: CircKey) -> Option<bool> {
        self.circuits.get(&key).map(|c| c.vegas)
    }

    /// A window for a relay's edge of circuit `key`, by what the circuit agreed on: Vegas with
    /// this relay's parameters (the defaults if it has none now), or the fixed window.
    pub(super) fn agreed_window(&self, key: CircKey) -> CircuitWindow {
        let kind = match self.circuits.get(&key) {
            Some(c) if c.vegas => CcKind::Vegas(self.cc_offer().unwrap_or_default()),
            _ => CcKind::Fixed,
        };
        CircuitWindow::with_policy(kind.build(self.effective_circwindow()))
    }
}
