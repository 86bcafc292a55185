//! `MaxMemInQueues` and the out-of-memory handler, as in C tor (`cell_queues_check_size` in
//! relay.c, `circuits_handle_oom` in circuitlist.c).
//!
//! What counts: the room every circuit queue's buffer has (its allocated capacity, at
//! [`CELL_MEM_COST`] bytes per cell: a `VecDeque` that grew to 4096 cells during a burst holds
//! that much memory until it is released, however few cells are left in it) plus the bytes the
//! driver reports it holds for each channel ([`Core::channel_buffered`]: output buffers,
//! split-direction hold-back buffers). When the total reaches
//! [`CoreConfig::max_mem_in_queues`], the handler first gives back the buffer room no cell
//! uses (empty queues' buffers, buffers more than twice their queue's length: this kills
//! nothing), then, if that was not enough, frees memory until the total is at most
//! [`OOM_RETAIN_PERCENT`] % of the limit, taking victims in the order of their oldest queued
//! byte: the circuit whose oldest queued cell is oldest dies first (DESTROY with RESOURCELIMIT
//! on both sides), and a channel whose reported buffer is older than the next circuit is
//! closed (as Tor closes edge and directory connections with old buffers; closing frees the
//! buffer and kills the channel's circuits). Old data is the mark of a reader that stopped
//! reading (the sniper attack, Jansen et al. 2014): honest circuits drain, so their oldest
//! cell is young.
//!
//! The exit's out-of-order buffers of linked sets (path switching) count too, at
//! [`CELL_MEM_COST`] per buffered cell, and a set whose oldest buffered cell is the oldest data
//! is a victim like a circuit: all its legs die (RESOURCELIMIT). Tor counts its conflux
//! out-of-order queues in the same total (`conflux_get_total_bytes_allocation`) but its
//! `conflux_handle_oom` frees nothing itself and leaves it to the circuit pass.
//!
//! Where this differs from Tor: a circuit with nothing queued is never a victim (killing it
//! frees nothing the core counts), and the handler does not count stream buffers, which are
//! bounded by the stream windows and read credit instead.

use std::cmp::Reverse;
use std::time::Instant;

use chive_cell::DestroyReason;
use tracing::{debug, warn};

use crate::{ChannelId, CircKey};

#[cfg(doc)]
use super::config::CoreConfig;
use super::event::Event;
use super::queue::CELL_MEM_COST;
use super::Core;

/// After an OOM, memory is freed until at most this percentage of `MaxMemInQueues` is in use
/// (Tor's `FRACTION_OF_DATA_TO_RETAIN_ON_OOM`, 0.90), so the handler does not run again at the
/// next cell.
pub const OOM_RETAIN_PERCENT: usize = 90;

/// The smallest `MaxMemInQueues` a relay's config may set (Tor refuses less: 256 MB). The core
/// itself accepts any value, so tests can use small limits.
pub const MIN_MAX_MEM_IN_QUEUES: u64 = 256 << 20;

/// The default `MaxMemInQueues` of a [`CoreConfig`]: 256 MiB, Tor's floor. Chive's lab runs many
/// relays on one machine (24 GiB for the whole lab), where Tor's automatic rule (below) would
/// give every relay three quarters of the machine and so protect none of them. 256 MiB is still
/// about 500 000 queued cells, 500 full circuit windows: far beyond honest traffic through one
/// relay in the lab.
pub const DEFAULT_MAX_MEM_IN_QUEUES: usize = 256 << 20;

/// Tor's `MaxMemInQueues 0` (auto) for a machine with `total_ram` bytes: 3/4 of the RAM below
/// 8 GiB, 2/5 from 8 GiB (room for a second relay), capped to 256 MiB..=8 GiB (config.c,
/// `compute_real_max_mem_in_queues`). `None` (RAM unknown) gives Tor's 64-bit guess, 8 GiB.
/// Sans-IO: the driver reads the RAM size and passes it in.
pub fn max_mem_in_queues_auto(total_ram: Option<u64>) -> u64 {
    const GIB: u64 = 1 << 30;
    let Some(ram) = total_ram else {
        return 8 * GIB;
    };
    let avail = if ram >= 8 * GIB {
        ram / 5 * 2
    } else {
        ram / 4 * 3
    };
    avail.clamp(MIN_MAX_MEM_IN_QUEUES, 8 * GIB)
}

/// What the OOM handler may free.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Victim {
    Channel(ChannelId),
    Circuit(CircKey),
    /// A linked set's out-of-order buffer at the exit (by set id).
    LinkedSet(u64),
}

/// [`Core::mem_in_queues`] from its parts: the queues' buffer cells, the exit's buffered
/// linked-set cells, driver-held bytes and held client cells' bytes. A run of relayed cells
/// (`relay_run.rs`) re-checks the limit with only the first part changing.
pub(super) fn mem_total(
    queue_buffer_cells: usize,
    exit_buffered: usize,
    driver_bytes: usize,
    held: usize,
) -> usize {
    queue_buffer_cells
        .saturating_add(exit_buffered)
        .saturating_mul(CELL_MEM_COST)
        .saturating_add(driver_bytes)
        .saturating_add(held)
}

impl Core {
    /// Bytes counted against `MaxMemInQueues` now: the circuit queues' buffers (their
    /// capacity, not only the cells in them), the exit's out-of-order buffers of linked sets,
    /// and driver-held buffers.
    pub(super) fn mem_in_queues(&self) -> usize {
        mem_total(
            self.stats.queue_buffer_cells,
            self.path_exit_buffered(),
            self.driver_bytes,
            self.held_mem(),
        )
    }

    /// The driver holds `bytes` for `chan` outside the core (its output buffer, cells held back
    /// to reorder a split-direction channel, ...), the oldest of them since `oldest` (`None`:
    /// `now`). Each report replaces the channel's previous one; report 0 when the buffers are
    /// empty. The bytes count against `MaxMemInQueues` until the channel closes, and may make
    /// the OOM handler close the channel if they are the oldest data queued.
    pub fn channel_buffered(
        &mut self,
        chan: ChannelId,
        bytes: usize,
        oldest: Option<Instant>,
        now: Instant,
    ) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        self.driver_bytes = self.driver_bytes - ch.buffered + bytes;
        ch.buffered = bytes;
        ch.buffered_since = (bytes > 0).then(|| oldest.unwrap_or(now));
        self.check_mem_in_queues(now);
    }

    /// A new `MaxMemInQueues` (SIGHUP). A lower limit applies at once: the handler runs now
    /// if the queues already hold that much.
    pub fn set_max_mem_in_queues(&mut self, bytes: usize, now: Instant) {
        self.cfg.max_mem_in_queues = bytes;
        self.check_mem_in_queues(now);
    }

    /// The `MaxMemInQueues` in force, in bytes.
    pub fn max_mem_in_queues(&self) -> usize {
        self.cfg.max_mem_in_queues
    }

    /// Run the OOM handler if the limit is reached (Tor: `alloc >= MaxMemInQueues`).
    pub(super) fn check_mem_in_queues(&mut self, now: Instant) {
        if self.mem_in_queues() >= self.cfg.max_mem_in_queues {
            self.handle_oom(now);
        }
    }

    /// Free memory, oldest queued data first, until at most [`OOM_RETAIN_PERCENT`] % of the
    /// limit is in use.
    fn handle_oom(&mut self, now: Instant) {
        let before = self.mem_in_queues();
        let target = self.cfg.max_mem_in_queues / 100 * OOM_RETAIN_PERCENT
            + self.cfg.max_mem_in_queues % 100 * OOM_RETAIN_PERCENT / 100;
        if before <= target {
            return;
        }
        // Room no cell uses first: freeing it costs no circuit.
        let compacted = self.compact_queues();
        // Sorting every circuit is O(n log n), as in Tor: this runs rarely, and each run frees
        // at least a tenth of the limit.
        let mut victims: Vec<(Instant, bool, Reverse<usize>, Victim)> = self
            .circuits
            .iter()
            .filter_map(|(&key, c)| {
                let held = self.held_oldest(key);
                let oldest = [c.q_prev.oldest(), c.q_next.oldest(), held.map(|h| h.0)]
                    .into_iter()
                    .flatten()
                    .min()?;
                let bytes = (c.q_prev.capacity() + c.q_next.capacity()) * CELL_MEM_COST
                    + held.map_or(0, |h| h.1);
                Some((oldest, true, Reverse(bytes), Victim::Circuit(key)))
            })
            .chain(self.channels.iter().filter_map(|(&chan, ch)| {
                let since = ch.buffered_since?;
                Some((since, false, Reverse(ch.buffered), Victim::Channel(chan)))
            }))
            .chain(
                self.path_exit_oom_candidates()
                    .into_iter()
                    .map(|(id, oldest, cells)| {
                        let bytes = cells * CELL_MEM_COST;
                        (oldest, true, Reverse(bytes), Victim::LinkedSet(id))
                    }),
            )
            .collect();
        // Oldest first; on equal age channels first (Tor frees connections with old buffers
        // before the circuit), then the one that frees more, then by id for determinism.
        victims.sort_unstable();
        let circuits_before = self.circuits.len();
        let mut closed_channels = 0u64;
        for (_, _, _, victim) in victims {
            if before.saturating_sub(self.mem_in_queues()) >= before - target {
                break;
            }
            match victim {
                Victim::Circuit(key) => self.kill_with(
                    key,
                    DestroyReason::RESOURCELIMIT,
                    "out of memory (MaxMemInQueues): its oldest queued cell was the oldest",
                    now,
                ),
                Victim::LinkedSet(id) => self.path_exit_oom_kill(id, now),
                Victim::Channel(chan) => {
                    if !self.channels.contains_key(&chan) {
                        continue;
                    }
                    closed_channels += 1;
                    let reason = "out of memory (MaxMemInQueues): its buffered data was the oldest";
                    self.channel_closed(chan, now);
                    self.events.push_back(Event::CloseChannel {
                        chan,
                        reason: reason.to_string(),
                    });
                }
            }
        }
        let after = self.mem_in_queues().min(before);
        let killed = (circuits_before - self.circuits.len()) as u64;
        if killed == 0 && closed_channels == 0 {
            // Compacting was enough: nothing was killed, nothing to warn about.
            self.stats.oom_bytes_freed += (before - after) as u64;
            debug!(
                in_use = before,
                limit = self.cfg.max_mem_in_queues,
                freed = compacted,
                "MaxMemInQueues reached: gave back unused queue buffer room, killed nothing"
            );
            return;
        }
        self.stats.oom_circuits_killed += killed;
        self.stats.oom_channels_closed += closed_channels;
        self.stats.oom_bytes_freed += (before - after) as u64;
        warn!(
            in_use = before,
            limit = self.cfg.max_mem_in_queues,
            freed = before - after,
            compacted,
            circuits_killed = killed,
            channels_closed = closed_channels,
            circuits_left = self.circuits.len(),
            "out of memory for queues (MaxMemInQueues): killed the circuits with the oldest queued data"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tor's automatic rule: 3/4 of the RAM below 8 GiB, 2/5 from 8 GiB, within 256 MiB..=8 GiB.
    #[test]
    fn automatic_limit_follows_tors_rule() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        assert_eq!(max_mem_in_queues_auto(None), 8 * GIB);
        assert_eq!(max_mem_in_queues_auto(Some(GIB)), 768 * MIB);
        assert_eq!(max_mem_in_queues_auto(Some(256 * MIB)), 256 * MIB, "floor");
        assert_eq!(max_mem_in_queues_auto(Some(4 * GIB)), 3 * GIB);
        assert_eq!(max_mem_in_queues_auto(Some(16 * GIB)), 16 * GIB / 5 * 2);
        assert_eq!(max_mem_in_queues_auto(Some(64 * GIB)), 8 * GIB, "cap");
    }
}
