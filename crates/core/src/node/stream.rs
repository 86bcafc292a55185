//! Edge streams, at an exit or a client: the driver's stream input, DATA / END / SENDME
//! arriving, packaging bytes into DATA cells while the windows and the queue allow, and read
//! credit (how much the driver may read from the stream's socket).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use chive_cell::{
    write_fixed_header, write_relay_header, CellCommand, CircId, End, EndReason, RelayCommand,
    Sendme, Xoff, Xon, CELL_LEN, RELAY_DATA_LEN, RELAY_HEADER_LEN,
};
use tracing::warn;

use crate::flow::FlowError;
use crate::flow::{CircuitWindow, CIRCUIT_WINDOW_MAX, CIRCUIT_WINDOW_MIN};
use crate::streamflow::{LegWindows, StreamFlow, XOFF_CELLS};
use crate::{CircKey, StreamHandle};

use super::circuit::{Role, Side};
use super::event::Event;
use super::event::STREAM_WRITE_MAX_CELLS;
use super::queue::QUEUE_HIGHWATER;
use super::Core;

mod bytes;
use bytes::StreamBytes;

/// A new [`Event::StreamWrite`] starts with room for this many cells' payloads.
const STREAM_WRITE_FIRST_CELLS: usize = 8;

/// Bytes a stream may have read from its socket but not yet packaged, plus granted credit:
/// the most an edge holds for one stream (its `pending` buffer; not counted in
/// `MaxMemInQueues`, see `oom.rs`), and the largest read the driver makes from its socket.
/// 128 cells (63 744 bytes): an exit reads a download in ~64 KB pieces, so the syscalls and
/// wake-ups along the whole path are per 64 KB, not per 16 KB (32 cells, before session 26).
pub const STREAM_BUFFER_TARGET: usize = 128 * RELAY_DATA_LEN;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamState {
    /// Client: BEGIN sent. Exit: connecting.
    Connecting,
    Open,
    /// A RESOLVE request (no data flows).
    Resolving,
}

pub(super) struct Stream {
    pub(super) handle: StreamHandle,
    pub(super) state: StreamState,
    /// The stream window (fixed circuit windows) or XON/XOFF (congestion control).
    pub(super) flow: StreamFlow,
    /// A client's stream on a linked set's home under fixed windows: its sending window per
    /// leg, in place of `flow`'s (which still does the receiving side).
    pub(super) legs: Option<LegWindows>,
    /// Bytes read from the local socket, not yet packaged.
    pub(super) pending: StreamBytes,
    /// Read credit granted to the driver and not yet used.
    pub(super) credit: usize,
    /// Local side finished; send END once `pending` is empty.
    pub(super) local_eof: bool,
    /// Package through the general path (a message built, then copied into its cell) even
    /// where a relay builds DATA cells in their queue slots: set by tests that compare the two.
    copy_path: bool,
}

impl Stream {
    pub(super) fn new(handle: StreamHandle, state: StreamState, flow: StreamFlow) -> Self {
        Stream {
            handle,
            state,
            flow,
            legs: None,
            pending: StreamBytes::default(),
            credit: 0,
            local_eof: false,
            copy_path: false,
        }
    }

    /// May another DATA cell go on `leg` (the circuit it is sent on)?
    pub(super) fn can_package_on(&self, leg: CircKey) -> bool {
        match &self.legs {
            Some(l) => l.can_package(leg),
            None => self.flow.can_package(),
        }
    }

    /// A DATA cell went on `leg`.
    fn on_data_sent_on(&mut self, leg: CircKey) {
        match &mut self.legs {
            Some(l) => l.on_data_sent(leg),
            None => self.flow.on_data_sent(),
        }
    }

    /// A stream SENDME arrived (on any leg of a linked set).
    fn on_stream_sendme(&mut self) -> Result<(), FlowError> {
        match &mut self.legs {
            Some(l) => l.on_sendme(),
            None => self.flow.on_sendme(),
        }
    }
}

/// State of a circuit's end point (exit or client): windows and streams.
pub(super) struct Edge {
    pub(super) window: CircuitWindow,
    pub(super) streams: HashMap<u16, Stream>,
    pub(super) next_stream_id: u16,
    /// At an exit: the circuit's `DoSStreamCreation*` bucket (`crate::dos`), made at the
    /// first BEGIN or RESOLVE while the defence is on.
    pub(super) stream_bucket: Option<crate::dos::StreamBucket>,
}

impl Edge {
    pub(super) fn new(window: CircuitWindow) -> Self {
        Edge {
            window,
            streams: HashMap::new(),
            next_stream_id: 1,
            stream_bucket: None,
        }
    }

    /// Flow control for a new stream on this circuit: the stream window under a fixed
    /// circuit window, XON/XOFF under congestion control.
    pub(super) fn stream_flow(&self) -> StreamFlow {
        StreamFlow::new(!self.window.policy().keeps_stream_window(), XOFF_CELLS)
    }
}

impl Core {
    /// The fixed circuit window this node packages with: its own override if set, else the
    /// consensus `circwindow`.
    pub fn effective_circwindow(&self) -> u32 {
        self.cfg
            .circwindow_override
            .unwrap_or(self.cfg.circwindow)
            .clamp(CIRCUIT_WINDOW_MIN, CIRCUIT_WINDOW_MAX)
    }

    /// A circuit window for a new edge, sized by the configured congestion control.
    pub(super) fn new_circuit_window(&self) -> CircuitWindow {
        CircuitWindow::with_policy(
            self.cfg
                .congestion_control
                .build(self.effective_circwindow()),
        )
    }

    /// Number of streams open on a circuit.
    pub fn circuit_streams(&self, circ: CircKey) -> usize {
        match self.circuits.get(&circ).map(|c| &c.role) {
            Some(Role::Origin { edge, .. }) => edge.streams.len(),
            Some(Role::Relay {
                edge: Some(edge), ..
            }) => edge.streams.len(),
            _ => 0,
        }
    }

    /// DATA cells of `stream` charged to leg `leg` and not yet acknowledged: streams of a
    /// linked set's home under fixed windows (a window per leg); None for other streams.
    pub fn stream_leg_in_flight(&self, stream: StreamHandle, leg: CircKey) -> Option<u32> {
        let &(key, sid) = self.streams.get(&stream)?;
        let s = self.circuits.get(&key)?.edge()?.streams.get(&sid)?;
        s.legs.as_ref().map(|l| l.in_flight(leg))
    }

    /// Bytes read from a stream's local socket (at most the credit granted).
    pub fn stream_data(&mut self, stream: StreamHandle, data: &[u8], now: Instant) {
        self.stream_input(stream, data.len(), |p| p.extend_from_slice(data), now);
    }

    /// [`Core::stream_data`] with the buffer the bytes were read into: kept as it is
    /// (`StreamBytes::push`), so a bulk read is copied once, into its DATA cells.
    pub fn stream_data_owned(&mut self, stream: StreamHandle, data: Vec<u8>, now: Instant) {
        self.stream_input(stream, data.len(), |p| p.push(data), now);
    }

    fn stream_input(
        &mut self,
        stream: StreamHandle,
        len: usize,
        append: impl FnOnce(&mut StreamBytes),
        now: Instant,
    ) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.credit < len {
            warn!(
                ?stream,
                "stream data beyond granted credit; accepting (driver bug)"
            );
        }
        s.credit = s.credit.saturating_sub(len);
        append(&mut s.pending);
        self.package_stream(key, sid, now);
    }

    /// Package `stream` through the general path only (see `Stream::copy_path`): for tests
    /// that compare it with DATA cells built in place.
    #[doc(hidden)]
    pub fn stream_package_by_copy(&mut self, stream: StreamHandle) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        if let Some(s) = self.stream_mut(key, sid) {
            s.copy_path = true;
        }
    }

    /// The local socket of `stream` reached EOF: END it after its data.
    pub fn stream_eof(&mut self, stream: StreamHandle, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        s.local_eof = true;
        self.package_stream(key, sid, now);
    }

    /// The local socket of `stream` failed: END it at once, dropping unsent data.
    pub fn stream_error(&mut self, stream: StreamHandle, now: Instant) {
        self.stream_end(stream, EndReason::CONNRESET, now);
    }

    /// END `stream` at once with `reason`, dropping unsent data (a client giving up on a
    /// BEGIN that got no answer sends TIMEOUT, as Tor). No event follows; the handle is gone.
    pub fn stream_end(&mut self, stream: StreamHandle, reason: EndReason, now: Instant) {
        let Some((key, sid)) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) {
            edge.streams.remove(&sid);
        }
        self.send_end(key, sid, reason, now);
    }

    /// `cells` [`Event::StreamWrite`]s of `stream` have been written to its socket.
    pub fn stream_flushed(&mut self, stream: StreamHandle, cells: u32, now: Instant) {
        let Some(&(key, sid)) = self.streams.get(&stream) else {
            return;
        };
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        let flushed = s.flow.on_flushed(cells, now);
        for _ in 0..flushed.sendmes {
            self.send_edge(key, RelayCommand::SENDME, sid, &[], now);
        }
        if let Some(kbps_ewma) = flushed.xon {
            self.stats.stream_xon_sent += 1;
            let body = Xon { kbps_ewma }.encode();
            self.send_edge(key, RelayCommand::XON, sid, &body, now);
        }
    }

    pub(super) fn stream_mut(&mut self, key: CircKey, sid: u16) -> Option<&mut Stream> {
        self.circuits
            .get_mut(&key)?
            .edge_mut()?
            .streams
            .get_mut(&sid)
    }

    pub(super) fn remove_stream(&mut self, key: CircKey, sid: u16) -> Option<StreamHandle> {
        let s = self
            .circuits
            .get_mut(&key)?
            .edge_mut()?
            .streams
            .remove(&sid)?;
        self.streams.remove(&s.handle);
        Some(s.handle)
    }

    pub(super) fn edge_data(
        &mut self,
        key: CircKey,
        sid: u16,
        data: &[u8],
        digest: [u8; 20],
        now: Instant,
    ) {
        if self.edge_data_window(key, digest, now) {
            self.edge_data_stream(key, sid, data, now);
        }
    }

    /// The circuit-level part of a DATA cell: count it in `key`'s window (a linked set's
    /// legs each keep their own) and send a circuit SENDME when due. False if the circuit
    /// is gone or was closed for DATA without an edge.
    pub(super) fn edge_data_window(
        &mut self,
        key: CircKey,
        digest: [u8; 20],
        now: Instant,
    ) -> bool {
        match self.edge_data_count(key, digest, now) {
            None => false,
            Some(None) => true,
            Some(Some(d)) => {
                let body = Sendme { digest: Some(d) }.encode();
                self.send_edge(key, RelayCommand::SENDME, 0, &body, now);
                true
            }
        }
    }

    /// Count a DATA cell in `key`'s circuit window: the digest a circuit SENDME must carry
    /// now, if one is due (the caller sends it, or a linked set's exit withholds it). None if
    /// the circuit is gone or was closed for DATA without an edge.
    pub(super) fn edge_data_count(
        &mut self,
        key: CircKey,
        digest: [u8; 20],
        now: Instant,
    ) -> Option<Option<[u8; 20]>> {
        let circ = self.circuits.get_mut(&key)?;
        let Some(edge) = circ.edge_mut() else {
            self.kill(key, "DATA on a circuit without streams", now);
            return None;
        };
        Some(edge.window.on_data_received(digest))
    }

    /// The stream part of a DATA cell, on the circuit that holds the stream (a linked set's
    /// home).
    pub(super) fn edge_data_stream(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return;
        };
        let delivery = Delivery::of(edge.streams.get_mut(&sid), now);
        self.deliver(key, sid, data, delivery, now);
    }

    /// What [`Delivery::of`] decided for a DATA cell of stream `sid` on `key`, carried out:
    /// its bytes written out, an XOFF sent, or the stream closed.
    pub(super) fn deliver(
        &mut self,
        key: CircKey,
        sid: u16,
        data: &[u8],
        delivery: Delivery,
        now: Instant,
    ) {
        match delivery {
            Delivery::Write { handle, xoff } => {
                push_stream_write(&mut self.events, handle, data, 0);
                if xoff {
                    self.stats.stream_xoff_sent += 1;
                    self.send_edge(key, RelayCommand::XOFF, sid, &Xoff.encode(), now);
                }
            }
            Delivery::Crossed => {}
            Delivery::Error(e) => {
                warn!(?key, sid, error = %e, "closing stream");
                if let Some(handle) = self.remove_stream(key, sid) {
                    self.events.push_back(Event::StreamClosed {
                        stream: handle,
                        reason: EndReason::TORPROTOCOL,
                    });
                }
                self.send_end(key, sid, EndReason::TORPROTOCOL, now);
            }
        }
    }

    pub(super) fn edge_end(&mut self, key: CircKey, sid: u16, data: &[u8], _now: Instant) {
        let reason = End::decode(data)
            .map(|e| e.reason)
            .unwrap_or(EndReason::MISC);
        if let Some(handle) = self.remove_stream(key, sid) {
            self.events.push_back(Event::StreamClosed {
                stream: handle,
                reason,
            });
        }
    }

    pub(super) fn edge_sendme(&mut self, key: CircKey, sid: u16, data: &[u8], now: Instant) {
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return self.kill(key, "SENDME on a circuit without an edge", now);
        };
        if sid == 0 {
            let digest = match Sendme::decode(data) {
                Ok(s) => s.digest,
                Err(e) => return self.kill(key, &format!("malformed SENDME: {e}"), now),
            };
            let rtt = match edge.window.on_sendme(digest, now) {
                Ok(rtt) => rtt,
                Err(e) => return self.kill(key, &e.to_string(), now),
            };
            self.path_rtt_sample(key, rtt, true, now);
            self.path_probe_ahead(key, now);
            self.package_all(key, now);
            // A linked spare's window opened: its home's streams may go on it.
            if let Some(home) = self.path_home_of(key).filter(|h| *h != key) {
                self.package_all(home, now);
            }
        } else {
            let Some(s) = edge.streams.get_mut(&sid) else {
                return;
            };
            if let Err(e) = s.on_stream_sendme() {
                return self.kill(key, &e.to_string(), now);
            }
            self.package_stream(key, sid, now);
        }
    }

    /// XON or XOFF for stream `sid` (proposal 324 section 4): resume or stop packaging it.
    /// A malformed one, one on a windowed stream or an XOFF before the XOFF limit was sent
    /// closes the circuit, as a bad SENDME does.
    pub(super) fn edge_xon_xoff(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        data: &[u8],
        now: Instant,
    ) {
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return self.kill(key, &format!("{cmd} on a circuit without an edge"), now);
        };
        // For a stream that just ended it crosses our END: not an error.
        let Some(s) = edge.streams.get_mut(&sid) else {
            return;
        };
        let result = if cmd == RelayCommand::XOFF {
            Xoff::decode(data)
                .map_err(|e| e.to_string())
                .and_then(|_| s.flow.on_xoff().map_err(|e| e.to_string()))
        } else {
            Xon::decode(data)
                .map_err(|e| e.to_string())
                .and_then(|x| s.flow.on_xon(x.kbps_ewma).map_err(|e| e.to_string()))
        };
        if let Err(e) = result {
            return self.kill(key, &format!("bad {cmd}: {e}"), now);
        }
        if cmd == RelayCommand::XON {
            self.package_stream(key, sid, now);
        }
    }

    /// Package every stream of an edge circuit that has data waiting.
    pub(super) fn package_all(&mut self, key: CircKey, now: Instant) {
        // A spare leg holds no streams: room on it (its queue drained) is room for its home's.
        if self.path_is_spare(key) {
            if let Some(home) = self.path_home_of(key) {
                return self.package_all(home, now);
            }
        }
        let Some(edge) = self.circuits.get_mut(&key).and_then(|c| c.edge_mut()) else {
            return;
        };
        let mut sids: Vec<u16> = edge
            .streams
            .iter()
            .filter(|(_, s)| !s.pending.is_empty() || s.local_eof)
            .map(|(id, _)| *id)
            .collect();
        sids.sort_unstable();
        for sid in sids {
            self.package_stream(key, sid, now);
        }
    }

    /// Turn a stream's pending bytes into DATA cells while the windows and the
    /// circuit queue allow; then END it if the local side is done; then grant more credit.
    fn package_stream(&mut self, key: CircKey, sid: u16, now: Instant) {
        loop {
            // A linked set's home packages on the leg its sender uses now (None: blocked
            // until a switch is confirmed or falls back). Striping picks that leg per cell.
            let stripe_room = self.path_stripe_pick(key, sid, now);
            let leg = self.path_package_leg(key);
            let (circ_open, queued) = match leg {
                Some(leg) => self.circuits.get_mut(&leg).map_or((false, 0), |c| {
                    let queued = c.queue(c.edge_out_side()).len();
                    (c.edge().is_some_and(|e| e.window.can_package()), queued)
                }),
                None => (false, 0),
            };
            let leg = leg.unwrap_or(key);
            let Some(circ) = self.circuits.get_mut(&key) else {
                return;
            };
            // A relay (an exit) whose DATA goes back on this circuit builds each cell in its
            // queue slot. Only a client's linked set sends on another leg or through
            // `path_route` (`send_edge`), so at a relay `leg` is `key`. A circuit without a
            // previous hop takes the general path, which drops the cell as before (the queue
            // would not call the slot filler, and the bytes would never leave `pending`).
            let in_place = match (&circ.role, circ.prev) {
                (Role::Relay { .. }, Some((_, prev_id))) if leg == key => Some(prev_id),
                _ => None,
            };
            // The stream's own checks are made in the slot filler (one lookup of the stream
            // per cell: its id map hashes with SipHash); when it declines, the checks below
            // see why (END due, blocked, or a stream set to the general path).
            if let Some(prev_id) = in_place {
                if circ_open
                    && stripe_room
                    && queued < QUEUE_HIGHWATER
                    && self.send_data_in_place(key, prev_id, sid, now)
                {
                    continue;
                }
            }
            let Some(circ) = self.circuits.get_mut(&key) else {
                return;
            };
            let Some(edge) = circ.edge_mut() else { return };
            let Some(s) = edge.streams.get_mut(&sid) else {
                return;
            };
            if s.pending.is_empty() {
                if s.local_eof {
                    self.remove_stream(key, sid);
                    self.send_end(key, sid, EndReason::DONE, now);
                    return;
                }
                break;
            }
            if s.state != StreamState::Open
                || !circ_open
                || !stripe_room
                || !s.can_package_on(leg)
                || queued >= QUEUE_HIGHWATER
            {
                break;
            }
            if in_place.is_some() && !s.copy_path {
                // The slot filler declined a stream these checks pass (not expected).
                break;
            }
            // The general path: the body into a stack buffer, then a message built and copied
            // into its cell by `send_edge`.
            let n = s.pending.len().min(RELAY_DATA_LEN);
            let mut chunk = [0u8; RELAY_DATA_LEN];
            s.pending.take_into(&mut chunk[..n]);
            s.on_data_sent_on(leg);
            self.send_edge(key, RelayCommand::DATA, sid, &chunk[..n], now);
        }
        self.grant_credit(key, sid);
    }

    /// Send a DATA cell of the first (up to 498) bytes of stream `sid`'s `pending` back
    /// from relay circuit `key`, built in its slot of the circuit's queue: the header written,
    /// the body copied once from the stream's buffer, then the digest set and the onion layer
    /// applied there. The effects and their order are those of the general path
    /// (bytes taken, the stream's `on_data_sent_on`, `send_relay_backward`: digest, then the
    /// circuit window's `on_data_sent` with it, then the queue with its limit and memory
    /// checks). False, with nothing done, if the stream may not send now (gone, not open,
    /// nothing pending, its window closed, or set to the general path).
    fn send_data_in_place(
        &mut self,
        key: CircKey,
        prev_id: CircId,
        sid: u16,
        now: Instant,
    ) -> bool {
        let fill = |role: &mut Role, slot: &mut [u8; CELL_LEN]| {
            let Role::Relay {
                crypto,
                edge: Some(edge),
                ..
            } = role
            else {
                return Some(());
            };
            // `Some`: not queued (the slot is taken back), so nothing may be taken before.
            let s = match edge.streams.get_mut(&sid) {
                Some(s)
                    if !s.copy_path
                        && !s.pending.is_empty()
                        && s.state == StreamState::Open
                        && s.can_package_on(key) =>
                {
                    s
                }
                _ => return Some(()),
            };
            let n = s.pending.len().min(RELAY_DATA_LEN);
            let payload = write_fixed_header(slot, prev_id, CellCommand::RELAY);
            if write_relay_header(payload, RelayCommand::DATA, sid, n).is_err() {
                return Some(());
            }
            s.pending
                .take_into(&mut payload[RELAY_HEADER_LEN..RELAY_HEADER_LEN + n]);
            s.on_data_sent_on(key);
            let digest = crypto.originate_backward(payload);
            edge.window.on_data_sent(digest, now);
            None
        };
        let sent = self.enqueue_with(key, Side::Prev, now, fill).is_none();
        self.stats.data_cells_in_place += u64::from(sent);
        sent
    }

    /// Top up a stream's read credit so pending + credit stays near the target.
    pub(super) fn grant_credit(&mut self, key: CircKey, sid: u16) {
        let Some(s) = self.stream_mut(key, sid) else {
            return;
        };
        if s.state != StreamState::Open || s.local_eof {
            return;
        }
        let have = s.pending.len() + s.credit;
        if have * 2 <= STREAM_BUFFER_TARGET {
            let bytes = STREAM_BUFFER_TARGET - have;
            s.credit += bytes;
            let stream = s.handle;
            self.events
                .push_back(Event::StreamReadCredit { stream, bytes });
        }
    }

    /// Send a relay message from this circuit's edge toward its peer edge.
    pub(super) fn send_edge(
        &mut self,
        key: CircKey,
        cmd: RelayCommand,
        sid: u16,
        body: &[u8],
        now: Instant,
    ) {
        if super::path::multiplexed(cmd) && self.path_route(key, cmd, sid, body, now) {
            return;
        }
        // A linked set's stream-level flow control goes on the leg the data moved to.
        let key = if sid != 0
            && matches!(
                cmd,
                RelayCommand::SENDME | RelayCommand::XON | RelayCommand::XOFF
            ) {
            self.path_stream_control_leg(key)
        } else {
            key
        };
        let Some(circ) = self.circuits.get(&key) else {
            return;
        };
        match &circ.role {
            Role::Origin { crypto, .. } => {
                let last = crypto.len().saturating_sub(1);
                self.send_relay_forward(key, last, cmd, sid, body, false, now)
            }
            Role::Relay { .. } => self.send_relay_backward(key, cmd, sid, body, now),
        }
    }

    pub(super) fn send_end(&mut self, key: CircKey, sid: u16, reason: EndReason, now: Instant) {
        self.send_edge(key, RelayCommand::END, sid, &End { reason }.encode(), now);
    }
}

/// Queue `data` (one DATA cell's payload) for the stream's socket: appended to the newest
/// event when that is a write to the same stream with room, else a new event. Only the
/// newest event is extended, so the order of events (a write before a close, one stream's
/// bytes before another's) is the order the cells came in.
///
/// `more`: how many cells may follow this one in the same read (a hint, 0 if unknown). A
/// buffer that must grow grows at once for them (up to the event's cap) rather than
/// doubling a few times, each time copying what it holds; never by less than doubling.
pub(super) fn push_stream_write(
    events: &mut VecDeque<Event>,
    handle: StreamHandle,
    data: &[u8],
    more: usize,
) {
    if let Some(Event::StreamWrite {
        stream,
        data: buf,
        cells,
    }) = events.back_mut()
    {
        if *stream == handle && *cells < STREAM_WRITE_MAX_CELLS {
            if buf.capacity() - buf.len() < data.len() {
                let room = STREAM_WRITE_MAX_CELLS.saturating_sub(*cells) as usize;
                let want = more.saturating_add(1).min(room) * RELAY_DATA_LEN;
                buf.reserve_exact(want.max(buf.len()).max(data.len()));
            }
            buf.extend_from_slice(data);
            *cells += 1;
            return;
        }
    }
    // Room for a few cells up front: a run of DATA cells grows the buffer a few times at
    // most, and a lone cell holds this much only until the driver hands it on.
    let mut buf = Vec::with_capacity(STREAM_WRITE_FIRST_CELLS * RELAY_DATA_LEN);
    buf.extend_from_slice(data);
    events.push_back(Event::StreamWrite {
        stream: handle,
        data: buf,
        cells: 1,
    });
}

/// What a DATA cell does to its stream (the stream's receive-side flow counted), decided
/// where the stream is at hand and carried out by [`Core::deliver`].
pub(super) enum Delivery {
    /// Write the bytes out to `handle`; send an XOFF after them if `xoff`.
    Write { handle: StreamHandle, xoff: bool },
    /// No such stream (DATA that crossed our END): not an error, nothing to do.
    Crossed,
    /// The cell broke the stream's flow control: close the stream.
    Error(String),
}

impl Delivery {
    /// Count a DATA cell in `stream`'s receive-side flow control (None: no such stream).
    pub(super) fn of(stream: Option<&mut Stream>, now: Instant) -> Delivery {
        match stream {
            Some(s) if s.state != StreamState::Resolving => match s.flow.on_data_received(now) {
                Ok(xoff) => Delivery::Write {
                    handle: s.handle,
                    xoff,
                },
                Err(e) => Delivery::Error(e.to_string()),
            },
            // DATA for a stream that just ended crosses our END (or a resolve): ignored.
            _ => Delivery::Crossed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_must_grow_grows_once_for_the_cells_still_to_come() {
        let mut events = VecDeque::new();
        let h = StreamHandle(1);
        let cell = [7u8; RELAY_DATA_LEN];
        // 40 cells of one stream in one read: the first buffer holds 8, the 9th grows it
        // for the 32 left (one copy), not to 16, 32 and 64 cells (three).
        let mut grew = 0;
        let mut cap = 0;
        for i in 0..40 {
            push_stream_write(&mut events, h, &cell, 39 - i);
            let Some(Event::StreamWrite { data, .. }) = events.back() else {
                panic!("a write");
            };
            grew += usize::from(cap != 0 && data.capacity() != cap);
            cap = data.capacity();
        }
        assert_eq!(grew, 1);
        assert_eq!(cap, 40 * RELAY_DATA_LEN);
        // No hint (the per-cell path): doubling, as before.
        let mut events = VecDeque::new();
        for _ in 0..9 {
            push_stream_write(&mut events, h, &cell, 0);
        }
        let Some(Event::StreamWrite { data, cells, .. }) = events.back() else {
            panic!("a write");
        };
        assert_eq!((*cells, data.capacity()), (9, 16 * RELAY_DATA_LEN));
    }
}
