//! What the core hands back: [`Event`]s the driver must act on, and [`CoreError`] for requests
//! it refuses.

use std::net::{IpAddr, SocketAddr};

use chive_cell::{DestroyReason, EndReason, RelayCommand, ResolvedAnswer};
use chive_crypto::IdentityKey;

use crate::{ChannelId, CircKey, StreamHandle};

// Only the docs name the methods that answer an event.
#[cfg(doc)]
use super::Core;

/// The most DATA cells one [`Event::StreamWrite`] gathers (~62 KiB): bounds the buffer a
/// stream's run of cells builds before the driver takes it.
pub const STREAM_WRITE_MAX_CELLS: u32 = 128;

/// Errors returned to the driver for requests it made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// The circuit does not exist (any more).
    #[error("no such circuit")]
    NoSuchCircuit,
    /// The circuit is not built yet, or is not an origin circuit.
    #[error("circuit is not open")]
    CircuitNotOpen,
    /// Stream ids on this circuit are exhausted.
    #[error("too many streams on circuit")]
    TooManyStreams,
    /// The target could not be encoded (e.g. a host name too long).
    #[error("bad target: {0}")]
    BadTarget(String),
    /// `send_onion_message` with a command that is not an onion request.
    #[error("not an onion-service request")]
    NotOnionMessage,
}

/// Output for the driver, in the order it must be acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Open a link to this relay (an extend, or a client circuit's first hop). Answer
    /// with [`Core::channel_opened`] or [`Core::connect_failed`].
    Connect {
        /// ORPort address.
        addr: SocketAddr,
        /// The identity the peer must prove.
        identity: IdentityKey,
    },
    /// Open a second link to this relay for circuit switching (docs/protocol.md, "Circuit
    /// switching"); the ORPort is the consensus's. Answer with [`Core::switch_channel_opened`]
    /// (not `channel_opened`: new circuits must not use it) or
    /// [`Core::switch_connect_failed`].
    ConnectSwitch {
        /// The identity the peer must prove.
        identity: IdentityKey,
    },
    /// Close this channel (its circuits are already gone from the core).
    CloseChannel {
        /// The channel.
        chan: ChannelId,
        /// Why, for the log.
        reason: String,
    },
    /// Exit: open a TCP connection for a new stream; answer with
    /// [`Core::exit_connected`] or [`Core::exit_failed`].
    ExitConnect {
        /// The new stream.
        stream: StreamHandle,
        /// Host name or address literal, as the client sent it.
        host: String,
        /// Port.
        port: u16,
    },
    /// Exit: resolve a name; answer with [`Core::exit_resolved`].
    ExitResolve {
        /// The request.
        stream: StreamHandle,
        /// Host name.
        host: String,
    },
    /// Client: a stream's BEGIN was answered with CONNECTED.
    StreamConnected {
        /// The stream.
        stream: StreamHandle,
        /// Address the exit connected to, if it said.
        addr: Option<IpAddr>,
    },
    /// Client: answers to a RESOLVE.
    Resolved {
        /// The request.
        stream: StreamHandle,
        /// The answers.
        answers: Vec<ResolvedAnswer>,
    },
    /// Write these bytes to the stream's socket, then report `cells` with
    /// [`Core::stream_flushed`]. The DATA cells a stream receives while this event is the
    /// newest one are appended to it (at most [`STREAM_WRITE_MAX_CELLS`] cells), so a read
    /// batch of one stream's cells costs one buffer and one event, not one per cell.
    StreamWrite {
        /// The stream.
        stream: StreamHandle,
        /// The payloads of `cells` DATA cells, in order.
        data: Vec<u8>,
        /// How many DATA cells `data` holds (the count [`Core::stream_flushed`] takes back).
        cells: u32,
    },
    /// The stream may read this many more bytes from its socket and pass them to
    /// [`Core::stream_data`].
    StreamReadCredit {
        /// The stream.
        stream: StreamHandle,
        /// Bytes.
        bytes: usize,
    },
    /// The stream is finished: flush what was written, then close the socket.
    /// The core has forgotten the handle.
    StreamClosed {
        /// The stream.
        stream: StreamHandle,
        /// The END reason (DONE for a normal close).
        reason: EndReason,
    },
    /// Client: a circuit finished building.
    CircuitBuilt {
        /// The circuit.
        circ: CircKey,
    },
    /// Client: a circuit failed or was closed; its streams were closed too.
    CircuitClosed {
        /// The circuit.
        circ: CircKey,
        /// Why.
        reason: String,
        /// Who ended it, for the client's relay-failure policy.
        cause: CloseCause,
        /// Hops whose handshake had completed (the path's length once built).
        hops: usize,
    },
    /// Onion client or service: the last hop of an origin circuit answered with an onion
    /// message (INTRO_ESTABLISHED, INTRODUCE2, INTRODUCE_ACK, RENDEZVOUS_ESTABLISHED,
    /// RENDEZVOUS2); the driver's service or client state machine (`crate::onion`) handles it.
    OnionMessage {
        /// The circuit.
        circ: CircKey,
        /// Which message.
        command: RelayCommand,
        /// Its body.
        body: Vec<u8>,
    },
    /// Onion service: a client opened a stream to `port` through the virtual hop of `circ`.
    /// Connect to the local target for that port (HiddenServicePort) and answer with
    /// [`Core::exit_connected`] or [`Core::exit_failed`].
    OnionStreamRequest {
        /// The rendezvous circuit.
        circ: CircKey,
        /// The new stream.
        stream: StreamHandle,
        /// The virtual port the client asked for.
        port: u16,
    },
}

/// Who ended an origin circuit. A client blames relays from this: a lost link to the
/// first hop names the guard; a DESTROY does not say which later hop failed (Tor stopped
/// sending TRUNCATED for that reason), only that the circuit's far side went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseCause {
    /// This node closed it: a client's close, a build timeout, a protocol violation, a limit.
    Local,
    /// The link to the first hop failed: it could not be opened, or it closed (EOF, error).
    LinkLost,
    /// The first hop sent DESTROY with this reason (its own, or passed on from further along).
    Destroyed(DestroyReason),
}
