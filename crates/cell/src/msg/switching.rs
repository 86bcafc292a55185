//! Circuit-switching messages (paper 003; docs/protocol.md, "Circuit switching").
//!
//! Connection variant, hop-by-hop cell commands between an entry and its next hop
//! (variable-length cells, chive's own numbers): [`SwitchConn`] (136), [`SwitchAck`] (137),
//! [`SwitchMarker`] (138, "SWITCH").
//!
//! Path variant, relay messages between a client and the exit: [`ConfluxLink`] (19 LINK and 20
//! LINKED, the layout of Tor's proposal 329 v1), [`ConfluxSwitch`] (22, as in prop 329),
//! RELAY 21 (LINKED_ACK, empty body), and chive's own [`SwitchConfirm`] (200) and, from the
//! entry to the client, [`Congested`] (201).
//!
//! All integers are big-endian. Decoders ignore trailing bytes (so later versions can append
//! fields) and never panic.

use crate::reader::Reader;
use crate::{CellError, CircId};

/// SWITCH_CONN body (cell command 32, sent on the *new* connection with the circuit's new id):
/// `seq` (4) `old_circ_id` (4). Asks the next hop to prepare to carry the circuit that has id
/// `old_circ_id` on the sender's other connection to it under this cell's circuit id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchConn {
    /// The circuit's switch number (from 0 per circuit, one more each switch).
    pub seq: u32,
    /// The circuit's id on the connection it leaves (never 0).
    pub old_circ_id: CircId,
}

impl SwitchConn {
    /// Encoded length.
    pub const LEN: usize = 8;

    /// Encode (8 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.old_circ_id.to_be_bytes());
        out
    }

    /// Decode; fewer than 8 bytes or circuit id 0 is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "SWITCH_CONN");
        let seq = r.u32()?;
        let old_circ_id = r.u32()?;
        if old_circ_id == 0 {
            return Err(CellError::Invalid {
                what: "SWITCH_CONN",
                why: "circuit id 0 names no circuit",
            });
        }
        Ok(SwitchConn { seq, old_circ_id })
    }
}

/// The answer in a [`SwitchAck`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwitchStatus(pub u8);

impl SwitchStatus {
    /// Prepared: the sender may cut over (send SWITCH on the old connection).
    pub const ACCEPTED: Self = Self(0);
    /// Not now (too many switches pending on this connection pair): the circuit stays.
    pub const BUSY: Self = Self(1);
    /// This relay does not accept switches (`CircuitSwitching` is not "connection").
    pub const DISABLED: Self = Self(2);

    /// Whether the switch may go ahead.
    pub fn is_accepted(self) -> bool {
        self == Self::ACCEPTED
    }
}

/// SWITCH_ACK body (cell command 33, on the new connection, same circuit id as the
/// SWITCH_CONN): `seq` (4) `status` (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchAck {
    /// The SWITCH_CONN's `seq`.
    pub seq: u32,
    /// Accepted or why not.
    pub status: SwitchStatus,
}

impl SwitchAck {
    /// Encoded length.
    pub const LEN: usize = 5;

    /// Encode (5 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(self.status.0);
        out
    }

    /// Decode; fewer than 5 bytes is an error. Unknown statuses decode (they mean "refused").
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "SWITCH_ACK");
        Ok(SwitchAck {
            seq: r.u32()?,
            status: SwitchStatus(r.u8()?),
        })
    }
}

/// SWITCH body (cell command 34, on the *old* connection with the old circuit id, in each
/// direction): `seq` (4) `cells` (8). The sender's last cell for the circuit on this
/// connection; `cells` counts the circuit's cells it sent on this connection before it, so the
/// receiver can check that none is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchMarker {
    /// The switch number, as in the SWITCH_CONN.
    pub seq: u32,
    /// Cells of this circuit sent on this connection before the marker.
    pub cells: u64,
}

impl SwitchMarker {
    /// Encoded length.
    pub const LEN: usize = 12;

    /// Encode (12 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.cells.to_be_bytes());
        out
    }

    /// Decode; fewer than 12 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "SWITCH");
        Ok(SwitchMarker {
            seq: r.u32()?,
            cells: r.u64()?,
        })
    }
}

/// CONFLUX_LINK / CONFLUX_LINKED body (relay 19 / 20), proposal 329's version 1:
/// `version` (1, = 1) `nonce` (32) `last_seqno_sent` (8) `last_seqno_recv` (8) `desired_ux` (1).
///
/// `Debug` does not print the nonce: it binds the legs of a set and must never be logged
/// (prop 329, 2.2).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConfluxLink {
    /// The set's secret, the same on every leg.
    pub nonce: [u8; 32],
    /// Highest sequence number the sender sent (0 on a first link).
    pub last_seqno_sent: u64,
    /// Highest sequence number the sender received (0 on a first link).
    pub last_seqno_recv: u64,
    /// Prop 329's UX wish (0 no opinion, 1 min latency, 2 low-mem latency, 3 high
    /// throughput, 4 low-mem throughput); chive records it and schedules by congestion.
    pub desired_ux: u8,
}

impl std::fmt::Debug for ConfluxLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfluxLink")
            .field("nonce", &"<secret>")
            .field("last_seqno_sent", &self.last_seqno_sent)
            .field("last_seqno_recv", &self.last_seqno_recv)
            .field("desired_ux", &self.desired_ux)
            .finish()
    }
}

impl ConfluxLink {
    /// The only version.
    pub const VERSION: u8 = 1;
    /// Encoded length.
    pub const LEN: usize = 50;

    /// Encode (50 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN);
        out.push(Self::VERSION);
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.last_seqno_sent.to_be_bytes());
        out.extend_from_slice(&self.last_seqno_recv.to_be_bytes());
        out.push(self.desired_ux);
        out
    }

    /// Decode; another version or fewer than 50 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        let mut r = Reader::new(body, "CONFLUX_LINK");
        if r.u8()? != Self::VERSION {
            return Err(CellError::Invalid {
                what: "CONFLUX_LINK",
                why: "unsupported version",
            });
        }
        Ok(ConfluxLink {
            nonce: r.array()?,
            last_seqno_sent: r.u64()?,
            last_seqno_recv: r.u64()?,
            desired_ux: r.u8()?,
        })
    }
}

/// CONFLUX_SWITCH body (relay 22, as in prop 329): `relative_seq` (4). Sent first on the leg a
/// sender moves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfluxSwitch {
    /// Highest number sent on any leg minus the last number sent on this leg.
    pub relative_seq: u32,
}

impl ConfluxSwitch {
    /// Encode (4 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.relative_seq.to_be_bytes().to_vec()
    }

    /// Decode; fewer than 4 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(ConfluxSwitch {
            relative_seq: Reader::new(body, "CONFLUX_SWITCH").u32()?,
        })
    }
}

/// SWITCH_CONFIRM body (relay 200, chive's own; receiver to sender on the leg switched to):
/// `seq` (8), the leg's counter after the CONFLUX_SWITCH. Lets the sender drop the cells it
/// kept for a fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchConfirm {
    /// The confirmed number.
    pub seq: u64,
}

impl SwitchConfirm {
    /// Encode (8 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.seq.to_be_bytes().to_vec()
    }

    /// Decode; fewer than 8 bytes is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(SwitchConfirm {
            seq: Reader::new(body, "SWITCH_CONFIRM").u64()?,
        })
    }
}

/// Why an entry reports congestion (in [`Congested`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CongestionReason(pub u8);

impl CongestionReason {
    /// The output buffer's smoothed occupancy rose above β.
    pub const OVERFULL: Self = Self(0);
    /// The socket refused a write.
    pub const WRITE_REFUSED: Self = Self(1);
}

/// CONGESTED body (relay 201, chive's own; from the first hop to the client, the entry's
/// signal for the path variant): `reason` (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Congested {
    /// Why.
    pub reason: CongestionReason,
}

impl Congested {
    /// Encode (1 byte).
    pub fn encode(&self) -> Vec<u8> {
        vec![self.reason.0]
    }

    /// Decode; an empty body is an error. Unknown reasons decode.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        Ok(Congested {
            reason: CongestionReason(Reader::new(body, "CONGESTED").u8()?),
        })
    }
}

/// LEG_PROBE body (relay 202, chive's own; client to exit on a leg of a linked set, and the
/// exit's answer back on the same leg with the same body): `id` (8). Exactly 8 bytes: anything
/// else is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegProbe {
    /// The client's number for this probe (its answer carries it back).
    pub id: u64,
}

impl LegProbe {
    /// Encode (8 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.id.to_be_bytes().to_vec()
    }

    /// Decode; a body of another length than 8 is an error.
    pub fn decode(body: &[u8]) -> Result<Self, CellError> {
        if body.len() != 8 {
            return Err(CellError::WrongLength {
                what: "LEG_PROBE",
                expected: 8,
                got: body.len(),
            });
        }
        Ok(LegProbe {
            id: Reader::new(body, "LEG_PROBE").u64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn leg_probe_is_exactly_eight_bytes() {
        let p = LegProbe {
            id: 0x0102_0304_0506_0708,
        };
        assert_eq!(p.encode(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(LegProbe::decode(&p.encode()).unwrap(), p);
        assert!(LegProbe::decode(&[1, 2, 3, 4, 5, 6, 7]).is_err());
        assert!(LegProbe::decode(&[0; 9]).is_err());
        assert!(LegProbe::decode(&[]).is_err());
    }

    #[test]
    fn connection_messages_roundtrip_and_layout() {
        let c = SwitchConn {
            seq: 7,
            old_circ_id: 0x8000_0001,
        };
        assert_eq!(c.encode(), [0, 0, 0, 7, 0x80, 0, 0, 1]);
        assert_eq!(SwitchConn::decode(&c.encode()).unwrap(), c);
        let a = SwitchAck {
            seq: 7,
            status: SwitchStatus::BUSY,
        };
        assert_eq!(a.encode(), [0, 0, 0, 7, 1]);
        assert_eq!(SwitchAck::decode(&a.encode()).unwrap(), a);
        assert!(!a.status.is_accepted() && SwitchStatus::ACCEPTED.is_accepted());
        assert!(!SwitchStatus(99).is_accepted(), "unknown means refused");
        let m = SwitchMarker {
            seq: 7,
            cells: 1 << 40,
        };
        assert_eq!(m.encode(), [0, 0, 0, 7, 0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(SwitchMarker::decode(&m.encode()).unwrap(), m);
        // Trailing bytes (cell padding, later fields) are ignored.
        let mut long = m.encode();
        long.extend_from_slice(&[0xff; 20]);
        assert_eq!(SwitchMarker::decode(&long).unwrap(), m);
    }

    #[test]
    fn path_messages_roundtrip_and_layout() {
        let l = ConfluxLink {
            nonce: [0xab; 32],
            last_seqno_sent: 5,
            last_seqno_recv: 6,
            desired_ux: 3,
        };
        let e = l.encode();
        assert_eq!(e.len(), ConfluxLink::LEN);
        assert_eq!(e[0], 1, "version 1, as prop 329");
        assert_eq!(&e[1..33], &[0xab; 32]);
        assert_eq!(&e[33..41], &5u64.to_be_bytes());
        assert_eq!(&e[41..49], &6u64.to_be_bytes());
        assert_eq!(e[49], 3);
        assert_eq!(ConfluxLink::decode(&e).unwrap(), l);
        assert!(!format!("{l:?}").contains("171"), "nonce not in Debug");
        let s = ConfluxSwitch { relative_seq: 21 };
        assert_eq!(s.encode(), [0, 0, 0, 21]);
        assert_eq!(ConfluxSwitch::decode(&s.encode()).unwrap(), s);
        let c = SwitchConfirm { seq: u64::MAX - 1 };
        assert_eq!(SwitchConfirm::decode(&c.encode()).unwrap(), c);
        let g = Congested {
            reason: CongestionReason::WRITE_REFUSED,
        };
        assert_eq!(g.encode(), [1]);
        assert_eq!(Congested::decode(&g.encode()).unwrap(), g);
    }

    #[test]
    fn hostile_bodies_are_refused() {
        assert!(SwitchConn::decode(&[0; 7]).is_err(), "truncated");
        assert!(matches!(
            SwitchConn::decode(&[0, 0, 0, 1, 0, 0, 0, 0]),
            Err(CellError::Invalid { .. })
        ));
        assert!(SwitchAck::decode(&[0; 4]).is_err());
        assert!(SwitchMarker::decode(&[0; 11]).is_err());
        let mut link = ConfluxLink {
            nonce: [1; 32],
            last_seqno_sent: 0,
            last_seqno_recv: 0,
            desired_ux: 0,
        }
        .encode();
        assert!(ConfluxLink::decode(&link[..49]).is_err(), "truncated");
        link[0] = 2;
        assert!(matches!(
            ConfluxLink::decode(&link),
            Err(CellError::Invalid {
                why: "unsupported version",
                ..
            })
        ));
        assert!(ConfluxLink::decode(&[]).is_err());
        assert!(ConfluxSwitch::decode(&[0; 3]).is_err());
        assert!(SwitchConfirm::decode(&[0; 7]).is_err());
        assert!(Congested::decode(&[]).is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = SwitchConn::decode(&bytes);
            let _ = SwitchAck::decode(&bytes);
            let _ = SwitchMarker::decode(&bytes);
            let _ = ConfluxLink::decode(&bytes);
            let _ = ConfluxSwitch::decode(&bytes);
            let _ = SwitchConfirm::decode(&bytes);
            let _ = Congested::decode(&bytes);
        }

        #[test]
        fn roundtrip_any_values(seq in any::<u32>(), id in 1u32.., cells in any::<u64>(),
                                status in any::<u8>(), nonce in any::<[u8; 32]>(),
                                sent in any::<u64>(), recv in any::<u64>(), ux in any::<u8>()) {
            let c = SwitchConn { seq, old_circ_id: id };
            prop_assert_eq!(SwitchConn::decode(&c.encode()).unwrap(), c);
            let a = SwitchAck { seq, status: SwitchStatus(status) };
            prop_assert_eq!(SwitchAck::decode(&a.encode()).unwrap(), a);
            let m = SwitchMarker { seq, cells };
            prop_assert_eq!(SwitchMarker::decode(&m.encode()).unwrap(), m);
            let l = ConfluxLink { nonce, last_seqno_sent: sent, last_seqno_recv: recv, desired_ux: ux };
            prop_assert_eq!(ConfluxLink::decode(&l.encode()).unwrap(), l);
            let s = ConfluxSwitch { relative_seq: seq };
            prop_assert_eq!(ConfluxSwitch::decode(&s.encode()).unwrap(), s);
            let f = SwitchConfirm { seq: cells };
            prop_assert_eq!(SwitchConfirm::decode(&f.encode()).unwrap(), f);
        }
    }
}
