//! chive-net: the tokio + rustls driver pieces of chive.
//!
//! - [`LinkListener`] / [`connect`]: TLS 1.3 links with chive's link handshake (version and
//!   feature negotiation, Ed25519 identity proof bound to the TLS session). See README.md for
//!   the wire protocol.
//! - [`Link`] → ([`LinkReader`], [`LinkWriter`]): cell framing over a link, in big chunks.
//! - [`TokenBucket`]: Tor's BandwidthRate / BandwidthBurst, shared by all links of a relay.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::sync::Arc;

use chive_cell::CellError;
use chive_crypto::{IdentityKey, IdentityKeypair};

mod bucket;
mod framing;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handshake;
mod link;
mod record;
mod record_stream;
mod tls;

pub use bucket::TokenBucket;
pub use framing::{BatchPool, CellBatch};
pub use link::{
    check_congestion_control, connect, connect_from, rtt_scaled_unsent, Accepting, DirectWriter,
    FramedProgress, Link, LinkLimits, LinkListener, LinkReader, LinkWriter,
};

/// A framed batch ([`LinkWriter::write_framed`]) leaves this many bytes of room before each
/// record's cells: the TLS record header the writer fills in.
pub const RECORD_HEAD: usize = record::HEADER_LEN;
/// ... and this many after them: the record's inner content type and its AEAD tag (16 bytes in
/// all three TLS 1.3 suites chive offers).
pub const RECORD_TAIL: usize = 1 + record::TAG_LEN;
/// Whole cells per record of a framed batch: as many as fit in a record's 2^14 bytes.
pub const CELLS_PER_RECORD: usize = record::MAX_PLAINTEXT / chive_cell::CELL_LEN;

/// Bytes of a framed batch of `cells` cells: the cells plus the room around each record's.
pub const fn framed_len(cells: usize) -> usize {
    cells * chive_cell::CELL_LEN + cells.div_ceil(CELLS_PER_RECORD) * (RECORD_HEAD + RECORD_TAIL)
}

/// Link protocol versions this implementation speaks, in increasing order.
pub const LINK_VERSIONS: &[u16] = &[1];

/// Maximum number of versions a peer may list in its VERSIONS cell.
pub const MAX_PEER_VERSIONS: usize = 16;

/// Time allowed for TCP connect (initiator), TLS handshake and link handshake together.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Feature bit: split-direction connections. On a link where both ends set it, the link's
/// responder may open a second connection back to the initiator, bind it to the same channel
/// with a BIND cell carrying [`Link::bind_token`], and write all its cells there (HANDOFF cells
/// mark each switch). Protocol: docs/protocol.md, "Split-direction connections".
pub const SPLIT_DIRECTION: u64 = 1 << 0;

/// A bitmap of optional link features (split-direction, switching, ...).
///
/// Each side announces the bits it supports; the link uses the intersection, so a node that does
/// not know a feature simply never sets its bit and still interoperates. Bit assignments belong to
/// the users of the feature (documented in docs/protocol.md), not to this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct FeatureSet(pub u64);

impl FeatureSet {
    /// No features.
    pub const EMPTY: Self = FeatureSet(0);

    /// Features both sets have (bitwise AND).
    pub fn intersect(self, other: Self) -> Self {
        FeatureSet(self.0 & other.0)
    }

    /// Features either set has (bitwise OR).
    pub fn union(self, other: Self) -> Self {
        FeatureSet(self.0 | other.0)
    }

    /// Whether every bit set in the mask `bit` is set here (`contains(0)` is true).
    pub fn contains(self, bit: u64) -> bool {
        self.0 & bit == bit
    }
}

/// Reads a TCP socket's smoothed round trip (`None`: unknown), see
/// [`LinkConfig::unsent_rtt_rate`].
pub type RttProbe = fn(std::os::fd::RawFd) -> Option<std::time::Duration>;

/// How a link's unsent limit grows with its round trip under a rate
/// ([`LinkConfig::unsent_rtt_rate`], [`rtt_scaled_unsent`]).
#[derive(Clone, Copy)]
pub struct UnsentPerRtt {
    /// The `BandwidthRate`, bytes/s.
    pub rate: u64,
    /// The most the limit may grow to (a relay passes its no-rate default, 64 KiB: a rate
    /// never gets more unsent bytes than no rate, however long the round trip).
    pub max: u32,
    /// Reads the socket's round trip.
    pub probe: RttProbe,
}

/// How this node presents itself on links.
pub struct LinkConfig {
    /// The relay identity proven in the link handshake. Required to accept links (a responder
    /// always authenticates); on outgoing links, `None` keeps the initiator anonymous (clients).
    pub identity: Option<Arc<IdentityKeypair>>,
    /// Features this node supports.
    pub features: FeatureSet,
    /// SO_SNDBUF and SO_RCVBUF for link sockets (Tor's ConstrainedSockSize), in bytes; `None`
    /// leaves the kernel's autotuning. Small buffers keep queued cells in user space, where the
    /// circuit scheduler can still reorder them, instead of in the kernel where it cannot.
    pub socket_buffer: Option<u32>,
    /// TCP_NOTSENT_LOWAT for link sockets, in bytes; `None` leaves the kernel's default (no
    /// limit). Unlike a small SO_SNDBUF it does not cap the congestion window: the socket
    /// may keep a full window in flight, but stops accepting writes once this much is
    /// written and not yet sent, so the backlog stays in the relay's circuit queues. There a
    /// SENDME or a quiet circuit's cell can go ahead of bulk; in the kernel it would wait
    /// behind up to megabytes of autotuned send buffer (docs/scheduling.md).
    pub unsent_limit: Option<u32>,
    /// A `BandwidthRate` the unsent limit grows with, up to a maximum, and how to read a
    /// socket's round trip (TCP_INFO; this crate forbids `unsafe`, so the caller passes the
    /// reader, `chive_tools::sockq::tcp_rtt`): if set, each link's TCP_NOTSENT_LOWAT is
    /// `unsent_limit` plus the rate times twice the round trip when the link is set up, at
    /// most `max` ([`rtt_scaled_unsent`]). A fixed small limit caps a link at about limit /
    /// RTT on a delayed path (onion testbed: 5000 bytes at 60 ms gave ~100 kB/s of a
    /// 500 kB/s rate; docs/scheduling.md, "Socket buffers under a rate").
    pub unsent_rtt_rate: Option<UnsentPerRtt>,
    /// TCP congestion control for link sockets (`TCP_CONGESTION`, e.g. `"bbr"`); `None` keeps
    /// the system default. A relay's links are its bulk flows: an algorithm that keeps queues
    /// short (BBR) avoids the standing queues that delay everyone's ACKs and SENDMEs
    /// (docs/netns.md, session 6), without changing the host's default for other programs.
    pub congestion_control: Option<String>,
    /// Who seals and opens this node's TLS records once the handshake is done
    /// (`LinkRecordLayer`): this crate's own record layer (the default), or rustls.
    pub record_layer: RecordLayer,
}

/// Who seals and opens a link's TLS records after the handshake (`LinkRecordLayer`). The wire
/// is TLS 1.3 either way, so the two interoperate: each end chooses for itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RecordLayer {
    /// rustls does everything (tokio-rustls over a buffered socket reader).
    Rustls,
    /// rustls's unbuffered API does the handshake; its traffic secrets are extracted and the
    /// records are sealed and opened in place by this crate (`record.rs`), with two copies of
    /// each received byte fewer (docs/performance.md). The default since session 17: the
    /// same wire, 23% fewer instructions per relayed byte at a guard or middle.
    #[default]
    Own,
}

impl std::str::FromStr for RecordLayer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rustls" => Ok(RecordLayer::Rustls),
            "own" => Ok(RecordLayer::Own),
            other => Err(format!("{other:?}: expected \"rustls\" or \"own\"")),
        }
    }
}

impl std::fmt::Debug for LinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkConfig")
            .field("identity", &self.identity.as_ref().map(|k| k.public()))
            .field("features", &self.features)
            .field("record_layer", &self.record_layer)
            .finish()
    }
}

/// Why a link could not be set up or failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Socket error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// TLS setup or handshake failed.
    #[error("TLS error: {0}")]
    Tls(String),
    /// The handshake did not finish within [`HANDSHAKE_TIMEOUT`].
    #[error("link handshake timed out")]
    Timeout,
    /// The peer violated the link protocol.
    #[error("link protocol violation: {0}")]
    Protocol(String),
    /// The peer is not the relay we wanted to reach (or did not authenticate at all).
    #[error("peer identity mismatch: expected {expected}, got {got:?}")]
    IdentityMismatch {
        /// The identity we asked for.
        expected: IdentityKey,
        /// What the peer proved (None: it did not authenticate).
        got: Option<IdentityKey>,
    },
    /// The peer supports none of our link versions.
    #[error("no common link protocol version")]
    NoCommonVersion,
    /// The peer's AUTHENTICATE cell was malformed, had an invalid key, or did not verify.
    #[error("bad link authentication")]
    BadAuthentication,
    /// A malformed cell.
    #[error("bad cell: {0}")]
    Cell(#[from] CellError),
    /// This node's configuration cannot do what was asked (e.g. listening without an identity).
    #[error("link configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod test_proxy;
#[cfg(test)]
mod tests;
