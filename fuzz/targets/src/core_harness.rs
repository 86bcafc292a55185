//! What the two core targets (`relay_core`, `client_core`) share: the reader of the fuzzer's
//! op script, the relays' keys and the driver's view of a core's output.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Instant;

use chive_cell::{Cell, CellCommand, CELL_LEN};
use chive_core::{ChannelId, Core, HopSpec};
use chive_crypto::ntor::NtorSecretKey;
use chive_crypto::IdentityKeypair;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The fuzzer's bytes, read front to back; missing bytes read as 0.
pub(crate) struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next `n` bytes, fewer at the end of the input.
    pub(crate) fn bytes(&mut self, n: usize) -> &[u8] {
        let start = self.pos.min(self.data.len());
        let end = (self.pos + n).min(self.data.len());
        self.pos += n;
        &self.data[start..end]
    }
}

/// The relays the targets use, by role: their identities and onion keys are made once (key
/// generation is curve25519 work, which would otherwise dominate a run).
#[derive(Clone, Copy)]
pub(crate) enum Played {
    /// `relay_core`'s R.
    Relay = 0,
    /// `relay_core`'s exit X.
    Exit = 1,
    /// `client_core`'s honest relay H.
    Honest = 2,
    /// `client_core`'s relay E, the fuzzer's.
    Hostile = 3,
}

/// A relay's reachable description and its onion key.
pub(crate) fn keys(who: Played) -> (HopSpec, NtorSecretKey) {
    static KEYS: OnceLock<Vec<(HopSpec, NtorSecretKey)>> = OnceLock::new();
    let all = KEYS.get_or_init(|| {
        (0..4u16)
            .map(|i| {
                let mut rng = StdRng::seed_from_u64(u64::from(i) + 1);
                let identity = IdentityKeypair::generate(&mut rng).public();
                let ntor = NtorSecretKey::generate(&mut rng);
                let hop = HopSpec {
                    identity,
                    ntor_key: ntor.public(),
                    addr: SocketAddr::from(([127, 0, 0, 1], 9001 + i)),
                };
                (hop, ntor)
            })
            .collect()
    });
    all[who as usize].clone()
}

/// Every cell `core` has for `chan`, as its wire bytes, as a driver with unlimited room takes
/// them.
pub(crate) fn drain_wire(core: &mut Core, chan: ChannelId, now: Instant) -> Vec<u8> {
    let mut wire = Vec::new();
    while core.poll_transmit_wire(chan, 1024, now, &mut wire) > 0 {}
    wire
}

/// The cells in `wire` (whole fixed cells, as `poll_transmit_wire` writes them).
pub(crate) fn cells(wire: &[u8]) -> impl Iterator<Item = Cell> + '_ {
    wire.chunks(CELL_LEN)
        .map(|c| Cell::decode(c).expect("poll_transmit_wire writes whole fixed cells"))
}

/// Every cell `core` has for `chan`, decoded.
pub(crate) fn drain_cells(core: &mut Core, chan: ChannelId, now: Instant) -> Vec<Cell> {
    cells(&drain_wire(core, chan, now)).collect()
}

/// A cell to decode into (`handle_cells_wire`'s scratch).
pub(crate) fn blank_cell() -> Cell {
    Cell::new(0, CellCommand::PADDING, &[]).expect("an empty PADDING cell")
}

/// A raw cell from the fuzzer (op 0 of `relay_core`, 1 of `client_core`): a byte whose bit 7
/// writes `ids[byte % len]` into it, a length byte, then twice that many bytes of the 514-byte
/// cell from its start (the rest zero).
pub(crate) fn raw_cell(input: &mut Input, ids: &[u32]) -> [u8; CELL_LEN] {
    let target = input.u8();
    let len = usize::from(input.u8()) * 2;
    let mut wire = [0u8; CELL_LEN];
    let bytes = input.bytes(len.min(CELL_LEN));
    wire[..bytes.len()].copy_from_slice(bytes);
    if target & 0x80 != 0 && !ids.is_empty() {
        let id = ids[usize::from(target) % ids.len()];
        wire[..4].copy_from_slice(&id.to_be_bytes());
    }
    wire
}
