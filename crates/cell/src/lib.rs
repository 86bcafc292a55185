//! chive-cell: chive's wire formats. No IO, no crypto.
//!
//! - Fixed-size cells ([`Cell`], 514 bytes) and variable-length cells ([`VarCell`]), with
//!   incremental framing from a byte buffer ([`decode_cell`]).
//! - The relay cell payload layout ([`relay_payload`], [`parse_relay`]).
//! - Message bodies carried in cells ([`msg`], re-exported here).
//!
//! Sizes and command numbers follow tor-spec so that costs compare one to one with Tor.
//! One difference: chive always uses 4-byte circuit ids, also in VERSIONS cells (Tor uses 2
//! bytes there for historical reasons); chive has no link protocol older than that.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
pub mod msg;
mod reader;

pub use error::CellError;
pub use msg::*;

/// Length of a fixed-size cell on the wire: circuit id (4) + command (1) + payload (509).
pub const CELL_LEN: usize = 514;
/// Length of a fixed-size cell's payload.
pub const PAYLOAD_LEN: usize = 509;
/// Length of the relay header inside a relay cell payload.
pub const RELAY_HEADER_LEN: usize = 11;
/// Maximum data bytes in one relay cell.
pub const RELAY_DATA_LEN: usize = PAYLOAD_LEN - RELAY_HEADER_LEN;
/// Header of a variable-length cell: circuit id (4) + command (1) + length (2).
pub const VAR_CELL_HEADER_LEN: usize = 7;
/// Maximum payload of a variable-length cell (its length field is 16 bits).
pub const MAX_VAR_PAYLOAD: usize = 65535;
/// Fixed cell header: circuit id (4) + command (1).
const FIXED_HEADER_LEN: usize = 5;

/// A circuit identifier, local to one channel.
pub type CircId = u32;

/// The command byte of a cell (fixed or variable).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CellCommand(pub u8);

impl CellCommand {
    /// Link padding; ignored by the receiver.
    pub const PADDING: Self = Self(0);
    /// TAP circuit creation (unused by chive; listed so the number is reserved).
    pub const CREATE: Self = Self(1);
    /// TAP circuit creation reply (unused).
    pub const CREATED: Self = Self(2);
    /// A relay cell: onion-encrypted, carries a relay message.
    pub const RELAY: Self = Self(3);
    /// Tear down a circuit.
    pub const DESTROY: Self = Self(4);
    /// CREATE_FAST (unused by chive).
    pub const CREATE_FAST: Self = Self(5);
    /// CREATED_FAST (unused by chive).
    pub const CREATED_FAST: Self = Self(6);
    /// Link protocol version negotiation (variable-length).
    pub const VERSIONS: Self = Self(7);
    /// Link NETINFO.
    pub const NETINFO: Self = Self(8);
    /// A relay cell that may carry EXTEND2 (limited number per circuit).
    pub const RELAY_EARLY: Self = Self(9);
    /// Create a circuit with a typed handshake (ntor).
    pub const CREATE2: Self = Self(10);
    /// Reply to CREATE2.
    pub const CREATED2: Self = Self(11);
    /// Padding negotiation.
    pub const PADDING_NEGOTIATE: Self = Self(12);
    /// chive's own: on a new connection, prepare to carry a circuit moved from the sender's
    /// other connection to the same relay (circuit switching; body [`SwitchConn`]). Fixed
    /// length, like the switch's other cells: they travel in the core's per-channel output
    /// with the circuit's cells, so a marker is ordered behind every cell handed before it.
    pub const SWITCH_CONN: Self = Self(32);
    /// chive's own: the answer to SWITCH_CONN (body [`SwitchAck`]).
    pub const SWITCH_ACK: Self = Self(33);
    /// chive's own: the sender's last cell for a circuit on the connection it leaves (body
    /// [`SwitchMarker`]).
    pub const SWITCH: Self = Self(34);
    /// Variable-length padding.
    pub const VPADDING: Self = Self(128);
    /// Link certificates.
    pub const CERTS: Self = Self(129);
    /// Link authentication challenge.
    pub const AUTH_CHALLENGE: Self = Self(130);
    /// Link authentication.
    pub const AUTHENTICATE: Self = Self(131);
    /// Link authorization (unused).
    pub const AUTHORIZE: Self = Self(132);
    /// chive's own: link feature negotiation (variable-length, body [`LinkFeatures`]).
    pub const LINK_FEATURES: Self = Self(133);
    /// chive's own: attach this connection to an existing channel as its peer's write-only
    /// connection (split-direction links; body [`Bind`]).
    pub const BIND: Self = Self(134);
    /// chive's own: the sender's last cell on one connection of a split channel before it
    /// continues on the other (body [`Handoff`]).
    pub const HANDOFF: Self = Self(135);

    /// True for commands carried in variable-length cells: VERSIONS and every command >= 128
    /// (tor-spec's rule, so the framing never depends on knowing the command).
    pub fn is_variable(self) -> bool {
        self.0 == 7 || self.0 >= 128
    }

    /// Human-readable name, or `None` for an unknown number.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "PADDING",
            1 => "CREATE",
            2 => "CREATED",
            3 => "RELAY",
            4 => "DESTROY",
            5 => "CREATE_FAST",
            6 => "CREATED_FAST",
            7 => "VERSIONS",
            8 => "NETINFO",
            9 => "RELAY_EARLY",
            10 => "CREATE2",
            11 => "CREATED2",
            12 => "PADDING_NEGOTIATE",
            32 => "SWITCH_CONN",
            33 => "SWITCH_ACK",
            34 => "SWITCH",
            128 => "VPADDING",
            129 => "CERTS",
            130 => "AUTH_CHALLENGE",
            131 => "AUTHENTICATE",
            132 => "AUTHORIZE",
            133 => "LINK_FEATURES",
            134 => "BIND",
            135 => "HANDOFF",
            _ => return None,
        })
    }
}

impl std::fmt::Display for CellCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CMD({})", self.0),
        }
    }
}

/// A fixed-size cell. The payload is inline so that a cell costs no allocation.
#[derive(Clone)]
pub struct Cell {
    /// Circuit id (0 for link-level cells).
    pub circ_id: CircId,
    /// Command byte; must not be a variable-length command.
    pub command: CellCommand,
    /// The 509-byte payload.
    pub payload: [u8; PAYLOAD_LEN],
}

impl Cell {
    /// Build a cell whose payload is `body` followed by zero padding.
    /// Fails if `body` is longer than 509 bytes or `command` is a variable-length command.
    pub fn new(circ_id: CircId, command: CellCommand, body: &[u8]) -> Result<Cell, CellError> {
        if command.is_variable() {
            return Err(CellError::VariableCommandInFixedCell(command.0));
        }
        if body.len() > PAYLOAD_LEN {
            return Err(CellError::TooLong {
                what: "fixed cell body",
                max: PAYLOAD_LEN,
                got: body.len(),
            });
        }
        let mut payload = [0u8; PAYLOAD_LEN];
        payload[..body.len()].copy_from_slice(body);
        Ok(Cell {
            circ_id,
            command,
            payload,
        })
    }

    /// Build a cell from a full payload (no copy of a body, no checks beyond the command).
    pub fn from_payload(circ_id: CircId, command: CellCommand, payload: [u8; PAYLOAD_LEN]) -> Cell {
        Cell {
            circ_id,
            command,
            payload,
        }
    }

    /// Append the 514-byte wire form (big-endian circuit id) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(CELL_LEN);
        out.extend_from_slice(&self.circ_id.to_be_bytes());
        out.push(self.command.0);
        out.extend_from_slice(&self.payload);
    }

    /// The cell whose 514-byte wire form is `wire`, its command byte kept as it is (the caller
    /// holds a fixed cell: [`Cell::decode`] is the checked parse of untrusted bytes).
    pub fn from_wire(wire: &[u8; CELL_LEN]) -> Cell {
        let (head, body) = wire.split_at(FIXED_HEADER_LEN);
        let mut payload = [0u8; PAYLOAD_LEN];
        payload.copy_from_slice(body);
        Cell {
            circ_id: wire_circ_id(wire),
            command: CellCommand(head[4]),
            payload,
        }
    }

    /// Write this cell's 514-byte wire form over `wire` (what [`Cell::encode_into`] appends).
    pub fn write_wire(&self, wire: &mut [u8; CELL_LEN]) {
        let (head, body) = wire.split_at_mut(FIXED_HEADER_LEN);
        head[..4].copy_from_slice(&self.circ_id.to_be_bytes());
        head[4] = self.command.0;
        body.copy_from_slice(&self.payload);
    }

    /// Parse a fixed cell from exactly 514 bytes.
    pub fn decode(buf: &[u8]) -> Result<Cell, CellError> {
        let (circ_id, command) = Self::decode_header(buf)?;
        let mut payload = [0u8; PAYLOAD_LEN];
        payload.copy_from_slice(&buf[FIXED_HEADER_LEN..]);
        Ok(Cell {
            circ_id,
            command,
            payload,
        })
    }

    /// [`Cell::decode`] into this cell, a reused buffer (no 514-byte value is returned and
    /// moved on). On error the cell is left unchanged.
    pub fn decode_from(&mut self, buf: &[u8]) -> Result<(), CellError> {
        (self.circ_id, self.command) = Self::decode_header(buf)?;
        self.payload.copy_from_slice(&buf[FIXED_HEADER_LEN..]);
        Ok(())
    }

    /// A fixed cell's circuit id and command, after checking its length and command.
    fn decode_header(buf: &[u8]) -> Result<(CircId, CellCommand), CellError> {
        if buf.len() != CELL_LEN {
            return Err(CellError::WrongLength {
                what: "fixed cell",
                expected: CELL_LEN,
                got: buf.len(),
            });
        }
        let command = CellCommand(buf[4]);
        if command.is_variable() {
            return Err(CellError::VariableCommandInFixedCell(command.0));
        }
        Ok((
            u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]),
            command,
        ))
    }
}

/// The circuit id of the fixed cell whose wire form is `wire`.
pub fn wire_circ_id(wire: &[u8; CELL_LEN]) -> CircId {
    CircId::from_be_bytes([wire[0], wire[1], wire[2], wire[3]])
}

/// Give the fixed cell whose wire form is `wire` the circuit id `id`.
pub fn set_wire_circ_id(wire: &mut [u8; CELL_LEN], id: CircId) {
    wire[..4].copy_from_slice(&id.to_be_bytes());
}

/// Write a fixed cell's header (circuit id, command) over the first bytes of `wire` and return
/// its payload bytes, to be written in place (a cell built in its queue slot).
pub fn write_fixed_header(
    wire: &mut [u8; CELL_LEN],
    circ_id: CircId,
    command: CellCommand,
) -> &mut [u8; PAYLOAD_LEN] {
    let (head, payload) = wire
        .split_first_chunk_mut::<FIXED_HEADER_LEN>()
        .expect("514 > 5");
    head[..4].copy_from_slice(&circ_id.to_be_bytes());
    head[4] = command.0;
    payload.try_into().expect("514 - 5 = 509")
}

impl std::fmt::Debug for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Cell {{ circ_id: {}, command: {}, payload: ",
            self.circ_id, self.command
        )?;
        for b in &self.payload[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("… }")
    }
}

/// A variable-length cell (VERSIONS, CERTS, AUTHENTICATE, LINK_FEATURES, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarCell {
    /// Circuit id (0 for link-level cells).
    pub circ_id: CircId,
    /// Command byte; must be a variable-length command.
    pub command: CellCommand,
    /// The payload, at most [`MAX_VAR_PAYLOAD`] bytes.
    pub payload: Vec<u8>,
}

impl VarCell {
    /// Append the wire form: circuit id (4), command (1), length (2), payload.
    /// Fails if the payload is too long or the command is not a variable-length command.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CellError> {
        if !self.command.is_variable() {
            return Err(CellError::FixedCommandInVarCell(self.command.0));
        }
        let len = u16::try_from(self.payload.len()).map_err(|_| CellError::TooLong {
            what: "variable cell payload",
            max: MAX_VAR_PAYLOAD,
            got: self.payload.len(),
        })?;
        out.reserve(VAR_CELL_HEADER_LEN + self.payload.len());
        out.extend_from_slice(&self.circ_id.to_be_bytes());
        out.push(self.command.0);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.payload);
        Ok(())
    }
}

/// Either kind of cell, as read from a link.
// Fixed cells are the common case and stay inline (no allocation per cell); the size
// difference to `Var` is deliberate.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AnyCell {
    /// A fixed-size cell.
    Fixed(Cell),
    /// A variable-length cell.
    Var(VarCell),
}

impl AnyCell {
    /// The cell's circuit id.
    pub fn circ_id(&self) -> CircId {
        match self {
            AnyCell::Fixed(c) => c.circ_id,
            AnyCell::Var(c) => c.circ_id,
        }
    }

    /// The cell's command.
    pub fn command(&self) -> CellCommand {
        match self {
            AnyCell::Fixed(c) => c.command,
            AnyCell::Var(c) => c.command,
        }
    }

    /// Append the wire form to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CellError> {
        match self {
            AnyCell::Fixed(c) => {
                c.encode_into(out);
                Ok(())
            }
            AnyCell::Var(c) => c.encode_into(out),
        }
    }
}

/// Incremental framing: the wire length of the whole cell at the start of `buf`, or `None` if
/// `buf` does not yet hold all of it. Reads only the header (command byte and, for a variable
/// cell, its length), so a reader can cut whole cells out of its buffer without decoding them;
/// [`decode_cell`] frames exactly the same way.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    let command = CellCommand(*buf.get(FIXED_HEADER_LEN - 1)?);
    let total = if command.is_variable() {
        let len = buf.get(FIXED_HEADER_LEN..VAR_CELL_HEADER_LEN)?;
        VAR_CELL_HEADER_LEN + usize::from(u16::from_be_bytes([len[0], len[1]]))
    } else {
        CELL_LEN
    };
    (buf.len() >= total).then_some(total)
}

/// Incremental framing: parse one cell from the start of `buf`.
///
/// Returns `Ok(None)` if `buf` does not yet hold a whole cell (read more bytes and call again),
/// `Ok(Some((cell, consumed)))` otherwise. The caller drops `consumed` bytes from its buffer.
/// Which kind of cell follows is decided by the command byte alone ([`CellCommand::is_variable`]),
/// so this never fails today; the `Result` leaves room for stricter checks.
pub fn decode_cell(buf: &[u8]) -> Result<Option<(AnyCell, usize)>, CellError> {
    let Some(total) = frame_len(buf) else {
        return Ok(None);
    };
    let (whole, head) = (&buf[..total], &buf[..FIXED_HEADER_LEN]);
    let circ_id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let command = CellCommand(head[4]);
    if command.is_variable() {
        let cell = VarCell {
            circ_id,
            command,
            payload: whole[VAR_CELL_HEADER_LEN..].to_vec(),
        };
        Ok(Some((AnyCell::Var(cell), total)))
    } else {
        Ok(Some((AnyCell::Fixed(Cell::decode(whole)?), CELL_LEN)))
    }
}

/// The command of a relay message (inside the encrypted relay payload).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RelayCommand(pub u8);

impl RelayCommand {
    /// Open a stream to host:port.
    pub const BEGIN: Self = Self(1);
    /// Stream data.
    pub const DATA: Self = Self(2);
    /// Close a stream.
    pub const END: Self = Self(3);
    /// A stream is open.
    pub const CONNECTED: Self = Self(4);
    /// Flow-control acknowledgement (circuit or stream level).
    pub const SENDME: Self = Self(5);
    /// TAP extend (unused).
    pub const EXTEND: Self = Self(6);
    /// TAP extended (unused).
    pub const EXTENDED: Self = Self(7);
    /// Ask a hop to drop the rest of the circuit.
    pub const TRUNCATE: Self = Self(8);
    /// The circuit was truncated at this hop.
    pub const TRUNCATED: Self = Self(9);
    /// Long-range padding; dropped by the recipient.
    pub const DROP: Self = Self(10);
    /// DNS resolve request.
    pub const RESOLVE: Self = Self(11);
    /// DNS resolve answer.
    pub const RESOLVED: Self = Self(12);
    /// Open a stream to the hop's directory service.
    pub const BEGIN_DIR: Self = Self(13);
    /// Extend the circuit by one hop.
    pub const EXTEND2: Self = Self(14);
    /// Reply to EXTEND2.
    pub const EXTENDED2: Self = Self(15);
    /// Link this circuit into a conflux set (prop 329's number and body, [`ConfluxLink`]).
    pub const CONFLUX_LINK: Self = Self(19);
    /// The exit's answer to CONFLUX_LINK (same body).
    pub const CONFLUX_LINKED: Self = Self(20);
    /// The client's acknowledgement of CONFLUX_LINKED (empty body; prop 329 measures RTT with
    /// it, chive accepts and ignores it).
    pub const CONFLUX_LINKED_ACK: Self = Self(21);
    /// The sender moved to this leg (prop 329's number and body, [`ConfluxSwitch`]).
    pub const CONFLUX_SWITCH: Self = Self(22);
    /// Onion service to intro point: become an introduction point (rend-spec v3).
    pub const ESTABLISH_INTRO: Self = Self(32);
    /// Client to rendezvous point: keep this circuit for a rendezvous cookie.
    pub const ESTABLISH_RENDEZVOUS: Self = Self(33);
    /// Client to intro point: an introduction for the service.
    pub const INTRODUCE1: Self = Self(34);
    /// Intro point to service: INTRODUCE1 passed on.
    pub const INTRODUCE2: Self = Self(35);
    /// Service to rendezvous point: join the client's circuit.
    pub const RENDEZVOUS1: Self = Self(36);
    /// Rendezvous point to client: the service joined.
    pub const RENDEZVOUS2: Self = Self(37);
    /// Intro point to service: ESTABLISH_INTRO accepted.
    pub const INTRO_ESTABLISHED: Self = Self(38);
    /// Rendezvous point to client: ESTABLISH_RENDEZVOUS accepted.
    pub const RENDEZVOUS_ESTABLISHED: Self = Self(39);
    /// Intro point to client: INTRODUCE1 passed on, or why not.
    pub const INTRODUCE_ACK: Self = Self(40);
    /// Stream flow control (proposal 324 section 4, tor-spec's number): resume sending on
    /// this stream, with the receiver's drain rate as an advisory ([`Xon`]).
    pub const XON: Self = Self(43);
    /// Stream flow control: stop sending on this stream until XON ([`Xoff`]).
    pub const XOFF: Self = Self(44);
    /// chive's own: the receiver saw the CONFLUX_SWITCH on this leg ([`SwitchConfirm`]).
    pub const SWITCH_CONFIRM: Self = Self(200);
    /// chive's own: the first hop reports its connection congested ([`Congested`]).
    pub const CONGESTED: Self = Self(201);
    /// chive's own: a round-trip probe on a linked leg, answered at once by the exit with the
    /// same body ([`LegProbe`]).
    pub const LEG_PROBE: Self = Self(202);

    /// Human-readable name, or `None` for an unknown number.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "BEGIN",
            2 => "DATA",
            3 => "END",
            4 => "CONNECTED",
            5 => "SENDME",
            6 => "EXTEND",
            7 => "EXTENDED",
            8 => "TRUNCATE",
            9 => "TRUNCATED",
            10 => "DROP",
            11 => "RESOLVE",
            12 => "RESOLVED",
            13 => "BEGIN_DIR",
            14 => "EXTEND2",
            15 => "EXTENDED2",
            19 => "CONFLUX_LINK",
            20 => "CONFLUX_LINKED",
            21 => "CONFLUX_LINKED_ACK",
            22 => "CONFLUX_SWITCH",
            32 => "ESTABLISH_INTRO",
            33 => "ESTABLISH_RENDEZVOUS",
            34 => "INTRODUCE1",
            35 => "INTRODUCE2",
            36 => "RENDEZVOUS1",
            37 => "RENDEZVOUS2",
            38 => "INTRO_ESTABLISHED",
            39 => "RENDEZVOUS_ESTABLISHED",
            40 => "INTRODUCE_ACK",
            43 => "XON",
            44 => "XOFF",
            200 => "SWITCH_CONFIRM",
            201 => "CONGESTED",
            202 => "LEG_PROBE",
            _ => return None,
        })
    }
}

impl std::fmt::Display for RelayCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "RELAY_CMD({})", self.0),
        }
    }
}

/// Offset of the relay command byte in a relay payload.
pub const RELAY_COMMAND_OFFSET: usize = 0;
/// Byte range of the `recognized` field in a relay payload.
pub const RELAY_RECOGNIZED_RANGE: std::ops::Range<usize> = 1..3;
/// Byte range of the stream id in a relay payload.
pub const RELAY_STREAM_ID_RANGE: std::ops::Range<usize> = 3..5;
/// Byte range of the 4-byte running digest in a relay payload.
pub const RELAY_DIGEST_RANGE: std::ops::Range<usize> = 5..9;
/// Byte range of the data length field in a relay payload.
pub const RELAY_LENGTH_RANGE: std::ops::Range<usize> = 9..11;

/// Build a relay payload: recognized = 0, digest = 0 (the crypto layer fills it in), `data`
/// copied, the rest zero. Fails if `data` is longer than 498 bytes.
pub fn relay_payload(
    cmd: RelayCommand,
    stream_id: u16,
    data: &[u8],
) -> Result<[u8; PAYLOAD_LEN], CellError> {
    if data.len() > RELAY_DATA_LEN {
        return Err(CellError::TooLong {
            what: "relay data",
            max: RELAY_DATA_LEN,
            got: data.len(),
        });
    }
    let mut p = [0u8; PAYLOAD_LEN];
    p[RELAY_HEADER_LEN..RELAY_HEADER_LEN + data.len()].copy_from_slice(data);
    write_relay_header(&mut p, cmd, stream_id, data.len())?;
    Ok(p)
}

/// Make `payload` a relay payload whose body, the `len` bytes at [`RELAY_HEADER_LEN`], is
/// already in place: the header written (recognized = 0, digest = 0) and the bytes after the
/// body zeroed, so the result equals [`relay_payload`] of that body whatever `payload` held
/// before. Fails, leaving `payload` unchanged, if `len` is over 498.
pub fn write_relay_header(
    payload: &mut [u8; PAYLOAD_LEN],
    cmd: RelayCommand,
    stream_id: u16,
    len: usize,
) -> Result<(), CellError> {
    if len > RELAY_DATA_LEN {
        return Err(CellError::TooLong {
            what: "relay data",
            max: RELAY_DATA_LEN,
            got: len,
        });
    }
    payload[RELAY_COMMAND_OFFSET] = cmd.0;
    payload[RELAY_RECOGNIZED_RANGE].fill(0);
    payload[RELAY_STREAM_ID_RANGE].copy_from_slice(&stream_id.to_be_bytes());
    payload[RELAY_DIGEST_RANGE].fill(0);
    // Fits in u16: checked against RELAY_DATA_LEN (498) above.
    payload[RELAY_LENGTH_RANGE].copy_from_slice(&(len as u16).to_be_bytes());
    payload[RELAY_HEADER_LEN + len..].fill(0);
    Ok(())
}

/// A parsed view of a decrypted relay payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayView<'a> {
    /// Relay command.
    pub command: RelayCommand,
    /// The `recognized` field (0 in a cell meant for this hop).
    pub recognized: u16,
    /// Stream id (0 for circuit-level messages).
    pub stream_id: u16,
    /// The 4-byte digest field.
    pub digest: [u8; 4],
    /// The message body: `length` bytes after the header.
    pub data: &'a [u8],
}

/// Parse a decrypted relay payload. Fails if the length field exceeds 498.
pub fn parse_relay(payload: &[u8; PAYLOAD_LEN]) -> Result<RelayView<'_>, CellError> {
    let be16 =
        |r: std::ops::Range<usize>| u16::from_be_bytes([payload[r.start], payload[r.start + 1]]);
    let len = usize::from(be16(RELAY_LENGTH_RANGE));
    if len > RELAY_DATA_LEN {
        return Err(CellError::BadRelayLength(len));
    }
    let d = &payload[RELAY_DIGEST_RANGE];
    Ok(RelayView {
        command: RelayCommand(payload[RELAY_COMMAND_OFFSET]),
        recognized: be16(RELAY_RECOGNIZED_RANGE),
        stream_id: be16(RELAY_STREAM_ID_RANGE),
        digest: [d[0], d[1], d[2], d[3]],
        data: &payload[RELAY_HEADER_LEN..RELAY_HEADER_LEN + len],
    })
}

#[cfg(test)]
mod tests;
