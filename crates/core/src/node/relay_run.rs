//! Relayed cells a read batch holds back to back on one circuit, passed on as a run: the
//! channel, the circuit, its direction, the client-hold and memory checks are looked up once
//! per run, and each cell costs its copy into its queue slot, its onion layer and counters.
//!
//! A busy circuit's cells come in runs (a 64 KiB read of a bulk circuit is up to 127 of its
//! cells), and [`Core::relay_wire`] repeats per cell what only changes between runs: the
//! channel and circuit lookups, `hold_upstream`'s checks, the queue's memory check, the out
//! channel's lookup and its ready mark. The run does the same things in the same order as that
//! path would for each of its cells ([`Core::handle_cells_wire`]'s promise): anything a cell
//! may change for the next one (a cell recognized here, a queue over its limit, the memory
//! limit reached) ends the run after that cell, and its effects are applied as the per-cell
//! path applies them.

use std::time::Instant;

use chive_cell::{wire_circ_id, Cell, CellCommand, CELL_LEN, PAYLOAD_LEN};

use crate::ChannelId;

use super::circuit::{queue_id, Role, Side};
use super::oom::mem_total;
use super::queue::{next_sampled, QueueCell, WireCell};
use super::Core;

/// What [`Core::relay_run`] did with the cells at the start of a batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Run {
    /// Passed on (or handled, the last one, as [`Core::relay_wire`] would) this many cells.
    Fast(usize),
    /// The first `cells` cells (one circuit id and command) must take the per-cell path.
    /// `origin_may_take` is false when [`Core::origin_run`] would decline them (a command but
    /// RELAY, or a circuit found and not originated here: the exit's own cells), so they go
    /// straight to [`Core::handle_cell_wire`] without `origin_run` looking the circuit up again.
    Slow { cells: usize, origin_may_take: bool },
}

/// How a run ended early (after its last cell).
enum End {
    /// Every cell of the run was queued.
    Done,
    /// The last cell was recognized here: its payload and digest, not queued.
    ForUs(Box<([u8; PAYLOAD_LEN], [u8; 20])>),
    /// The last cell put its queue over `max_circuit_queue`.
    Kill,
    /// The last cell's queue growth reached `MaxMemInQueues`.
    Oom,
}

impl Core {
    /// Fixed cells that arrived on `chan` back to back (`cells`, whole 514-byte cells; a
    /// trailing partial cell is ignored), in order: the same as [`Core::handle_cell_wire`] for
    /// each, with the work a run of one circuit's relayed cells shares done once per run.
    pub fn handle_cells_wire(
        &mut self,
        chan: ChannelId,
        cells: &[u8],
        scratch: &mut Cell,
        now: Instant,
    ) {
        let mut rest = cells;
        while rest.len() >= CELL_LEN {
            let (taken, slow, origin_may_take) = match self.relay_run(chan, rest, now) {
                Run::Fast(n) => (n, 0, false),
                Run::Slow {
                    cells,
                    origin_may_take,
                } => (0, cells, origin_may_take),
            };
            rest = rest.get(taken * CELL_LEN..).unwrap_or_default();
            let slow = rest.get(..slow * CELL_LEN).unwrap_or(rest);
            if origin_may_take {
                self.origin_runs_or_each(chan, slow, scratch, now);
            } else {
                for wire in slow.chunks_exact(CELL_LEN) {
                    if let Ok(wire) = <&[u8; CELL_LEN]>::try_from(wire) {
                        self.handle_cell_wire(chan, wire, scratch, now);
                    }
                }
            }
            rest = rest.get(slow.len()..).unwrap_or_default();
        }
    }

    /// Pass on the run of relayed cells at the start of `cells` (same circuit id, command
    /// RELAY), or say how many cells must take the per-cell path: those of a circuit
    /// [`Core::relay_wire`] would not pass on from its wire bytes, or for which the client-hold
    /// or memory checks could act, or any command but RELAY (RELAY_EARLY is counted per cell
    /// and rare).
    pub(super) fn relay_run(&mut self, chan: ChannelId, cells: &[u8], now: Instant) -> Run {
        // Cells `origin_run` may take: a circuit originated here, or one not (yet) looked up.
        let ask_origin = |cells| Run::Slow {
            cells,
            origin_may_take: true,
        };
        // Cells `origin_run` would decline: not RELAY, or a circuit found and relayed here.
        let per_cell = |cells| Run::Slow {
            cells,
            origin_may_take: false,
        };
        let Some((first, _)) = cells.split_first_chunk::<CELL_LEN>() else {
            return ask_origin(0);
        };
        if first[4] != CellCommand::RELAY.0 {
            return per_cell(1);
        }
        // The run: the cells with the first one's circuit id and command (the first 5 bytes).
        let run = cells
            .chunks_exact(CELL_LEN)
            .take_while(|c| c[..5] == first[..5])
            .count();
        if !self.sw.ends.is_empty() || self.hold.has_channels() {
            return ask_origin(run);
        }
        let circ_id = wire_circ_id(first);
        let Some(ch) = self.channels.get(&chan) else {
            return ask_origin(run);
        };
        let client = ch.client;
        let Some(key) = ch.circ_ids.lookup(circ_id) else {
            return ask_origin(run);
        };
        let Some(circ) = self.circuits.get(&key) else {
            return ask_origin(run);
        };
        if circ.is_origin() {
            return ask_origin(run);
        }
        let from_prev = circ.prev == Some((chan, circ_id));
        let side = if from_prev { Side::Next } else { Side::Prev };
        let Some((out_chan, out_id)) = circ.endpoint(side) else {
            return per_cell(run);
        };
        if self.hold_may_take(key, client, from_prev) {
            return per_cell(run);
        }
        // The memory check, per cell on the per-cell path, can only act when a queue's
        // buffer grows: the other parts of the total do not change during the run.
        let (exit_buffered, driver_bytes, held) = (
            self.path_exit_buffered(),
            self.driver_bytes,
            self.held_mem(),
        );
        let max_mem = self.cfg.max_mem_in_queues;
        let over_mem =
            |cells: usize| mem_total(cells, exit_buffered, driver_bytes, held) >= max_mem;
        if over_mem(self.stats.queue_buffer_cells) {
            return per_cell(run);
        }
        let Some(circ) = self.circuits.get_mut(&key) else {
            return per_cell(run);
        };
        let (queue, Role::Relay { crypto, .. }) = (
            match side {
                Side::Prev => &mut circ.q_prev,
                Side::Next => &mut circ.q_next,
            },
            &mut circ.role,
        ) else {
            return per_cell(run);
        };
        self.stats.relay_runs += 1;
        let mut taken = 0;
        let mut queued = 0;
        let mut activate = false;
        let mut end = End::Done;
        for wire in cells.chunks_exact(CELL_LEN).take(run) {
            let Ok(wire) = <&[u8; CELL_LEN]>::try_from(wire) else {
                break;
            };
            taken += 1;
            // As `relay_wire` counts a cell it passes on.
            self.stats.cells_received += 1;
            circ.sw.recv[usize::from(!from_prev)] += 1;
            self.stats.cells_in_place += 1;
            // As `enqueue_with`, with `relay_wire`'s fill.
            let cap = queue.capacity();
            let slot = queue.push_slot(now);
            WireCell {
                wire,
                circ_id: out_id,
            }
            .write_to(slot);
            let Some((_, payload)) = slot.split_first_chunk_mut::<5>() else {
                break;
            };
            let Ok(payload) = <&mut [u8; PAYLOAD_LEN]>::try_from(payload) else {
                break;
            };
            if !from_prev {
                crypto.encrypt_backward(payload);
            } else if crypto.decrypt_forward(payload) {
                // Recognized here (this hop's own cell): not passed on.
                let mine = Box::new((*payload, crypto.last_forward_digest()));
                queue.unpush();
                self.stats.queue_buffer_cells += queue.capacity();
                self.stats.queue_buffer_cells -= cap;
                self.stats.cells_in_place -= 1;
                end = End::ForUs(mine);
                break;
            }
            // `push_slot` cleared the flag: only a sampled cell needs it set.
            if next_sampled(&mut self.sample_counter, self.cfg.cell_sample_every) {
                queue.set_last_sampled(true);
            }
            let len = queue.len();
            self.stats.queued_cells += 1;
            let grew = queue.capacity() - cap;
            self.stats.queue_buffer_cells += grew;
            if len > self.cfg.max_circuit_queue {
                end = End::Kill;
                break;
            }
            queued += 1;
            activate |= len == 1;
            if grew > 0 && over_mem(self.stats.queue_buffer_cells) {
                end = End::Oom;
                break;
            }
        }
        // What the per-cell path did for each queued cell toward the out channel: all at once,
        // before what ended the run (it came after them there too).
        if queued > 0 {
            if let Some(ch) = self.channels.get_mut(&out_chan) {
                ch.queued += queued;
                if activate {
                    ch.sched.activate(queue_id(key, side), now);
                }
            }
            self.mark_ready(out_chan);
        }
        match end {
            End::Done => {}
            End::ForUs(mine) => self.relay_cell_for_us(key, &mine.0, mine.1, false, now),
            End::Kill => self.kill(
                key,
                "circuit queue limit exceeded (peer ignores flow control)",
                now,
            ),
            End::Oom => self.check_mem_in_queues(now),
        }
        Run::Fast(taken)
    }
}
