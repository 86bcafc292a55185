//! Batches framed for the writer's record layer ([`SendPath::set_framing`]): the room around
//! each record's cells is where it should be, and the cells are those an unframed batch holds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::{Cell, CellCommand, CELL_LEN, PAYLOAD_LEN};

use super::*;

/// A core stand-in: one queue of numbered cells per channel.
#[derive(Default)]
struct Numbered {
    queues: std::collections::HashMap<ChannelId, VecDeque<u32>>,
}

impl CellSource for Numbered {
    fn has_pending(&self, chan: ChannelId) -> bool {
        self.queues.get(&chan).is_some_and(|q| !q.is_empty())
    }

    fn channel_priority(&self, _chan: ChannelId, _now: Instant) -> Option<f64> {
        None
    }

    fn ranks_circuits(&self) -> bool {
        false
    }

    fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        _now: Instant,
        out: &mut Vec<u8>,
    ) -> usize {
        let Some(q) = self.queues.get_mut(&chan) else {
            return 0;
        };
        let mut n = 0;
        while n < max {
            let Some(id) = q.pop_front() else { break };
            Cell {
                circ_id: id,
                command: CellCommand::RELAY,
                payload: [id as u8; PAYLOAD_LEN],
            }
            .encode_into(out);
            n += 1;
        }
        n
    }

    fn poll_cell_sample(&mut self) -> Option<CellSample> {
        None
    }
}

const CHAN: ChannelId = ChannelId(7);
const FRAMING: WireFraming = WireFraming {
    head: 5,
    tail: 17,
    cells_per_record: 31,
};

/// The batches a send path with `framing` hands over for `cells` queued cells.
fn batches(framing: Option<WireFraming>, cells: u32, outbuf: usize) -> Vec<Transmit> {
    let mut p = SendPath::new(SendConfig {
        outbuf_cells: outbuf,
        write_rate: 0,
        outbuf_max: Duration::ZERO,
        paced: false,
        kind: ChannelSchedulerKind::Direct,
        quiet_reserve: 0,
        channel_fair_halflife: None,
    });
    p.set_framing(framing);
    p.add_channel(CHAN);
    let mut src = Numbered::default();
    src.queues.insert(CHAN, (0..cells).collect());
    let now = Instant::now();
    let mut out = Vec::new();
    loop {
        p.channel_ready(CHAN, &mut src, now);
        let mut got = false;
        while let Some(t) = p.poll_transmit() {
            p.written(t.conn, t.cells, &mut src, now);
            out.push(t);
            got = true;
        }
        if !got {
            return out;
        }
    }
}

/// The cells of a framed batch, without the room; checks the room is zeros and where
/// `framing` puts it.
fn strip(bytes: &[u8], cells: usize, f: WireFraming) -> Vec<u8> {
    assert_eq!(bytes.len(), f.framed_len(cells));
    let mut plain = Vec::new();
    let mut rest = bytes;
    let mut left = cells;
    while left > 0 {
        let n = left.min(f.cells_per_record);
        let (record, tail) = rest.split_at(f.head + n * CELL_LEN + f.tail);
        assert!(record[..f.head].iter().all(|&b| b == 0));
        assert!(record[f.head + n * CELL_LEN..].iter().all(|&b| b == 0));
        plain.extend_from_slice(&record[f.head..f.head + n * CELL_LEN]);
        rest = tail;
        left -= n;
    }
    assert!(rest.is_empty());
    plain
}

#[test]
fn framed_batches_hold_the_same_cells_with_room_around_each_record() {
    for (cells, outbuf) in [
        (1, 128),
        (31, 128),
        (32, 128),
        (100, 128),
        (300, 64),
        (62, 31),
    ] {
        let plain = batches(None, cells, outbuf);
        let framed = batches(Some(FRAMING), cells, outbuf);
        assert_eq!(plain.len(), framed.len(), "{cells} cells, outbuf {outbuf}");
        for (p, f) in plain.iter().zip(&framed) {
            assert_eq!(p.framing, None);
            assert_eq!(f.framing, Some(FRAMING));
            assert_eq!(p.cells, f.cells);
            assert_eq!(p.bytes.len(), p.cells * CELL_LEN);
            assert_eq!(strip(&f.bytes, f.cells, FRAMING), p.bytes);
        }
        let total: usize = framed.iter().map(|t| t.cells).sum();
        assert_eq!(total, cells as usize);
    }
}
