//! Relay cells that end at this node as the circuit's origin (a client's downloads), taken a
//! run at a time: the channel and the circuit are looked up once per run of one circuit's
//! RELAY cells, the stream once per run of one stream's DATA cells, and each cell costs its
//! copy out of the read buffer, its onion layers, its header and its counters.
//!
//! Cell by cell ([`Core::handle_cell_wire`] → `on_relay` → `relay_in` →
//! `origin_cell_for_us` → `edge_data`) each DATA cell looked its channel up four times, its
//! circuit five times and its stream once (std's SipHash: stream ids are a peer's choice at
//! an exit). The run does what that path does for each cell, in the same order: the plain
//! case (DATA from the last hop for an open stream, no SENDME due, no XOFF) is done in place;
//! any other cell ends the run after it, and the per-cell path's functions handle it from its
//! decrypted payload, so what a cell may change for the next one (a circuit closed, a SENDME
//! queued, a stream closed) is in place before the next cell is looked at.

use std::time::Instant;

use chive_cell::{
    parse_relay, wire_circ_id, Cell, CellCommand, RelayCommand, Sendme, CELL_LEN, PAYLOAD_LEN,
    RELAY_HEADER_LEN,
};
use chive_crypto::relay::ClientCircuitCrypto;

use crate::ChannelId;

use super::circuit::Role;
use super::stream::{push_stream_write, Delivery};
use super::Core;

/// How an origin run ended (after its last cell, which the loop did not finish). The cell's
/// decrypted payload is the run's buffer.
enum End {
    /// Every cell was a plain DATA cell, done in place.
    Done,
    /// No hop recognized the last cell: the circuit closes, as on the per-cell path.
    Unrecognized,
    /// The last cell is not plain DATA (from `hop`, with that hop's running digest): the
    /// per-cell path's dispatch takes it from here.
    Other(usize, [u8; 20]),
    /// The last cell was DATA that made a circuit SENDME (this digest) due: the SENDME goes
    /// before its bytes are delivered, as `edge_data_window` then `edge_data_stream` do.
    Sendme([u8; 20]),
    /// The last cell was DATA whose delivery is not a plain write (an XOFF to send or a
    /// stream to close).
    Deliver(Delivery),
}

/// What a cell of the run is, its onion layers removed into the run's buffer.
enum Step {
    /// DATA from the last hop for stream `sid`: `len` bytes, with the exit's running digest.
    Data {
        sid: u16,
        len: usize,
        digest: [u8; 20],
    },
    /// Anything else: the run ends after it.
    End(End),
}

/// Remove `wire`'s onion layers into `buf` and say what the cell is (the plain case of
/// `relay_in` and `origin_cell_for_us`: DATA from the exit; a malformed cell is "other", and
/// their dispatch closes the circuit for it).
fn step(
    crypto: &mut ClientCircuitCrypto,
    last_hop: usize,
    wire: &[u8; PAYLOAD_LEN],
    buf: &mut [u8; PAYLOAD_LEN],
) -> Step {
    *buf = *wire;
    let Some((hop, digest)) = crypto.decrypt_from_any(buf) else {
        return Step::End(End::Unrecognized);
    };
    match parse_relay(buf) {
        Ok(msg) if msg.command == RelayCommand::DATA && hop == last_hop => Step::Data {
            sid: msg.stream_id,
            len: msg.data.len(),
            digest,
        },
        _ => Step::End(End::Other(hop, digest)),
    }
}

impl Core {
    /// Whole cells the relay run did not take (`cells`), in order: a run of relay cells that
    /// end here as origin by [`Core::origin_run`], any other cell by [`Core::handle_cell_wire`].
    pub(super) fn origin_runs_or_each(
        &mut self,
        chan: ChannelId,
        cells: &[u8],
        scratch: &mut Cell,
        now: Instant,
    ) {
        let mut rest = cells;
        while let Some((wire, tail)) = rest.split_first_chunk::<CELL_LEN>() {
            let taken = self.origin_run(chan, rest, now);
            if taken > 0 {
                rest = rest.get(taken * CELL_LEN..).unwrap_or_default();
            } else {
                self.handle_cell_wire(chan, wire, scratch, now);
                rest = tail;
            }
        }
    }

    /// Take the run at the start of `cells` (whole 514-byte cells with one circuit id and
    /// command RELAY) if its circuit has this node as origin; returns how many cells it took
    /// (0: none, they take the per-cell path). Cells taken had the per-cell path's effects.
    pub(super) fn origin_run(&mut self, chan: ChannelId, cells: &[u8], now: Instant) -> usize {
        let Some((first, _)) = cells.split_first_chunk::<CELL_LEN>() else {
            return 0;
        };
        // RELAY_EARLY toward the client closes the circuit (`relay_in`): left to that path.
        if first[4] != CellCommand::RELAY.0 || !self.sw.ends.is_empty() {
            return 0;
        }
        let Some(key) = self.lookup(chan, wire_circ_id(first)) else {
            return 0;
        };
        if !self.circuits.get(&key).is_some_and(|c| c.is_origin()) {
            return 0;
        }
        // A linked set's leg delivers to its home's streams: left to the per-cell path. (The
        // set does not change during the run: only path commands change it, and they end it.)
        if self.path_home_of(key).is_some_and(|h| h != key) {
            return 0;
        }
        // `hold_upstream` (client_hold.rs) never holds an origin circuit's cells: it holds
        // only cells from a client toward the exit, which an origin never receives.
        let Some(circ) = self.circuits.get_mut(&key) else {
            return 0;
        };
        let Role::Origin { crypto, edge, .. } = &mut circ.role else {
            return 0;
        };
        let last_hop = crypto.len().saturating_sub(1);
        self.stats.origin_runs += 1;
        let run = cells
            .chunks_exact(CELL_LEN)
            .take_while(|c| c[..5] == first[..5])
            .count();
        let mut wires = cells
            .chunks_exact(CELL_LEN)
            .take(run)
            .filter_map(|c| <&[u8; PAYLOAD_LEN]>::try_from(c.get(5..)?).ok());
        let mut taken = 0;
        let mut buf = [0u8; PAYLOAD_LEN];
        // Each cell taken is counted as `handle_cell_mut` and `relay_in` count it (an
        // origin's cells come toward it: direction index 1), then stepped.
        let mut next = |buf: &mut [u8; PAYLOAD_LEN], taken: &mut usize| {
            let wire = wires.next()?;
            *taken += 1;
            self.stats.cells_received += 1;
            circ.sw.recv[1] += 1;
            Some(step(crypto, last_hop, wire, buf))
        };
        let mut cell = next(&mut buf, &mut taken);
        // A segment per stream: its stream looked up once, for its first cell; the borrow
        // ends with the segment (a cell of another stream starts the next one).
        let end = 'run: loop {
            let (sid, mut len, mut digest) = match cell {
                None => break End::Done,
                Some(Step::End(end)) => break end,
                Some(Step::Data { sid, len, digest }) => (sid, len, digest),
            };
            let mut stream = edge.streams.get_mut(&sid);
            loop {
                if let Some(d) = edge.window.on_data_received(digest) {
                    break 'run End::Sendme(d);
                }
                match Delivery::of(stream.as_deref_mut(), now) {
                    Delivery::Write {
                        handle,
                        xoff: false,
                    } => {
                        let data = buf.get(RELAY_HEADER_LEN..RELAY_HEADER_LEN + len);
                        let more = run - taken;
                        push_stream_write(&mut self.events, handle, data.unwrap_or_default(), more);
                    }
                    Delivery::Crossed => {}
                    other => break 'run End::Deliver(other),
                }
                cell = next(&mut buf, &mut taken);
                match cell {
                    Some(Step::Data {
                        sid: id,
                        len: l,
                        digest: d,
                    }) if id == sid => (len, digest) = (l, d),
                    _ => continue 'run,
                }
            }
        };
        match end {
            End::Done => {}
            End::Unrecognized => self.kill(key, "unrecognized relay cell at the client", now),
            End::Other(hop, digest) => self.origin_cell_for_us(key, hop, &buf, digest, now),
            End::Sendme(d) => {
                let body = Sendme { digest: Some(d) }.encode();
                self.send_edge(key, RelayCommand::SENDME, 0, &body, now);
                if let Ok(msg) = parse_relay(&buf) {
                    self.edge_data_stream(key, msg.stream_id, msg.data, now);
                }
            }
            End::Deliver(delivery) => {
                if let Ok(msg) = parse_relay(&buf) {
                    self.deliver(key, msg.stream_id, msg.data, delivery, now);
                }
            }
        }
        taken
    }
}
