//! Looking inside a running core: counters ([`CoreStats`]), per-cell timing samples
//! ([`CellSample`]), per-circuit figures ([`CircuitStat`]) and the operator's debug dump.

use std::time::Instant;

use chive_cell::CircId;

use crate::{ChannelId, CircKey};

use super::circuit::{queue_id, Role, Side};
#[cfg(doc)]
use super::config::CoreConfig;
use super::Core;

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Circuits currently known.
    pub circuits: usize,
    /// Streams currently open at this node's edges.
    pub streams: usize,
    /// Cells waiting in all circuit queues.
    pub queued_cells: usize,
    /// Cells the circuit queues' buffers have room for (their allocated capacity, at least
    /// `queued_cells`): what `MaxMemInQueues` counts for them.
    pub queue_buffer_cells: usize,
    /// Cells handed to the driver for sending since start.
    pub cells_transmitted: u64,
    /// Cells received since start.
    pub cells_received: u64,
    /// Of those, relay cells passed on from their wire bytes ([`crate::Core::handle_cell_wire`]):
    /// copied straight into their circuit queue's slot, their onion layer applied there.
    pub cells_in_place: u64,
    /// DATA cells an exit built in their circuit queue's slot (body copied once from the
    /// stream's bytes, digest and onion layer applied there), not through a relay message.
    pub data_cells_in_place: u64,
    /// Runs of one circuit's relayed cells passed on together ([`crate::Core::handle_cells_wire`]):
    /// the channel and the circuit are looked up once per run, not per cell.
    pub relay_runs: u64,
    /// Runs of one circuit's relay cells taken together at their origin (a client's
    /// downloads, `origin_run.rs`): the channel and circuit looked up once per run.
    pub origin_runs: u64,
    /// Circuits closed for a protocol violation or resource limit (OOM kills included).
    pub circuits_killed: u64,
    /// Bytes counted against `MaxMemInQueues` now: queued cells and driver-reported buffers.
    pub mem_in_queues: usize,
    /// Circuits the OOM handler killed (directly, or with a channel it closed).
    pub oom_circuits_killed: u64,
    /// Channels the OOM handler closed because their buffered data was the oldest.
    pub oom_channels_closed: u64,
    /// Bytes the OOM handler freed, counted as for `mem_in_queues`.
    pub oom_bytes_freed: u64,
    /// XOFFs this node's edges sent (their application read too slowly; XON/XOFF streams).
    pub stream_xoff_sent: u64,
    /// XONs this node's edges sent (the buffer drained after an XOFF).
    pub stream_xon_sent: u64,
}

/// Samples waiting for the driver beyond this are dropped (bounded memory).
pub(super) const MAX_PENDING_SAMPLES: usize = 10_000;

/// Timing of one sampled cell, from entering its circuit queue to leaving it
/// for the channel's output. The driver adds the time it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellSample {
    /// The channel it left on.
    pub chan: ChannelId,
    /// Its circuit.
    pub circ: CircKey,
    /// When it entered the circuit queue.
    pub queued: Instant,
    /// When the scheduler moved it to the channel's output.
    pub dequeued: Instant,
    /// Its index in the `out` vector of the `poll_transmit` call that moved it.
    pub batch_index: usize,
}

/// Per-circuit figures for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitStat {
    /// The circuit.
    pub circ: CircKey,
    /// Cells it handed to its channels so far.
    pub cells_sent: u64,
    /// Cells waiting in its queues (both directions).
    pub queued: usize,
    /// The scheduler's priority value for its busiest queue, if the policy has one (EWMA count).
    pub priority: Option<f64>,
    /// At an edge (exit or client): the congestion window and the cells in flight under it.
    pub window: Option<(u32, u32)>,
    /// At an edge whose congestion control measures round trips (Vegas): the smallest seen.
    pub min_rtt: Option<std::time::Duration>,
    /// At an edge whose congestion control measures round trips: the smoothed round trip.
    pub smoothed_rtt: Option<std::time::Duration>,
    /// At an edge: whether its congestion control is in slow start.
    pub slow_start: Option<bool>,
}

impl Core {
    /// Next per-cell timing sample (see [`CoreConfig::cell_sample_every`]).
    pub fn poll_cell_sample(&mut self) -> Option<CellSample> {
        self.cell_samples.pop_front()
    }

    /// Per-circuit figures for metrics. `priority` is the largest EWMA count of
    /// the circuit's queues (None under a policy without counts).
    pub fn circuit_stats(&self, now: Instant) -> Vec<CircuitStat> {
        let mut v: Vec<CircuitStat> = self
            .circuits
            .iter()
            .map(|(k, c)| {
                let priority = [(Side::Prev, c.prev), (Side::Next, c.next)]
                    .into_iter()
                    .filter_map(|(side, end)| {
                        let (chan, _) = end?;
                        self.channels
                            .get(&chan)?
                            .sched
                            .ewma_count(queue_id(*k, side), now)
                    })
                    .reduce(f64::max);
                CircuitStat {
                    circ: *k,
                    cells_sent: c.cells_sent,
                    queued: c.q_prev.len() + c.q_next.len(),
                    priority,
                    window: c.edge().map(|e| (e.window.cwnd(), e.window.inflight())),
                    min_rtt: c.edge().and_then(|e| e.window.policy().min_rtt()),
                    smoothed_rtt: c.edge().and_then(|e| e.window.policy().smoothed_rtt()),
                    slow_start: c.edge().map(|e| e.window.policy().in_slow_start()),
                }
            })
            .collect();
        v.sort_by_key(|c| c.circ);
        v
    }

    /// A human-readable snapshot of every channel and circuit (queues, windows,
    /// streams), for operators debugging a stall (the relay logs it on SIGUSR1).
    pub fn debug_dump(&self, now: Instant) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mut chans: Vec<_> = self.channels.iter().collect();
        chans.sort_by_key(|(c, _)| **c);
        for (id, ch) in chans {
            let _ =
                writeln!(
                out,
                "channel {} peer={} initiator={} circuits={} active_queues={} urgent={} policy={}",
                id.0,
                ch.peer.map(|p| p.to_hex()[..16].to_string()).unwrap_or_else(|| "client".into()),
                ch.initiator,
                ch.circ_ids.len(),
                ch.sched.active_len(),
                ch.urgent.len(),
                ch.sched.name()
            );
        }
        let mut circs: Vec<_> = self.circuits.iter().collect();
        circs.sort_by_key(|(k, _)| **k);
        for (key, c) in circs {
            let kind = match &c.role {
                Role::Relay {
                    extending,
                    pending_extend,
                    ..
                } => {
                    format!(
                        "relay extending={extending} pending_extend={}",
                        pending_extend.is_some()
                    )
                }
                Role::Origin {
                    built,
                    crypto,
                    path,
                    ..
                } => {
                    format!("origin built={built} hops={}/{}", crypto.len(), path.len())
                }
            };
            let prio = |side: Side, end: Option<(ChannelId, CircId)>| {
                end.and_then(|(chan, _)| {
                    self.channels
                        .get(&chan)?
                        .sched
                        .ewma_count(queue_id(*key, side), now)
                })
            };
            let _ = writeln!(
                out,
                "circuit {} {kind} prev={:?} next={:?} q_prev={} q_next={} sent={} ewma_prev={:?} ewma_next={:?}",
                key.0,
                c.prev.map(|(ch, id)| (ch.0, id)),
                c.next.map(|(ch, id)| (ch.0, id)),
                c.q_prev.len(),
                c.q_next.len(),
                c.cells_sent,
                prio(Side::Prev, c.prev),
                prio(Side::Next, c.next),
            );
            let edge = match &c.role {
                Role::Relay { edge, .. } => edge.as_ref(),
                Role::Origin { edge, .. } => Some(edge),
            };
            if let Some(edge) = edge {
                let _ = writeln!(
                    out,
                    "  edge package_window={} cwnd={} inflight={} slow_start={}",
                    edge.window.package_window(),
                    edge.window.cwnd(),
                    edge.window.inflight(),
                    edge.window.policy().in_slow_start()
                );
                for (sid, st) in &edge.streams {
                    let _ = writeln!(
                        out,
                        "  stream {sid} handle={} state={:?} pending={} credit={} eof={} flow={:?}",
                        st.handle.0,
                        st.state,
                        st.pending.len(),
                        st.credit,
                        st.local_eof,
                        st.flow
                    );
                }
            }
        }
        out
    }
}
