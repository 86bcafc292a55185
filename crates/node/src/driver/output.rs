//! The driver's send side: a wake-up's flush, and the batches the send path decided, handed to
//! their connections' writers or written by the driver itself.
//!
//! A framed, unpaced batch on an own-records link whose writer holds nothing is sealed and
//! written within the wake-up that made it ([`super::ConnHandles::send_batch`]), as a stream's
//! data is (session 27): no hop to the writer's task, no `Input::Written` back through the
//! input queue. Its room counts at once and its channel sends again at the end of the flush,
//! with everything else the wake-up queued, as for a writer's `Written`. At most
//! [`DIRECT_WRITES_PER_TURN`] batches per wake-up are written so: the rest go to the writers,
//! so that one channel whose socket keeps taking batches cannot hold the driver away from its
//! input queue.

use std::time::Instant;

use chive_core::chansched::Transmit;
use chive_core::ChannelId;
use tracing::{debug, warn};

use super::tasks::BatchSent;
use super::Driver;

/// Batches the driver writes itself in one wake-up at most (each at most `OutbufCells` cells:
/// 4 MiB at the unlimited default of 128; a link socket takes far less before it is full,
/// `TCP_NOTSENT_LOWAT`).
pub(super) const DIRECT_WRITES_PER_TURN: usize = 64;

impl Driver {
    /// Act on everything the core produced, until it is quiet.
    pub(super) fn flush(&mut self, now: Instant) {
        self.direct_left = DIRECT_WRITES_PER_TURN;
        self.resume_reads(now);
        loop {
            loop {
                let mut progressed = false;
                while let Some(ev) = self.core.poll_event() {
                    progressed = true;
                    self.handle_event(ev, now);
                }
                if let Some(client) = self.client.as_mut() {
                    progressed |= client.poll(&mut self.core, &mut self.streams, now);
                }
                while let Some(chan) = self.core.poll_ready_channel() {
                    progressed = true;
                    self.transmit(chan, now);
                }
                // Channels whose writers reported batches written send again once everything
                // else is done: with all the cells this wake-up queued (a client's SENDMEs for
                // a whole read in one batch). Their transmits may make events (read credit).
                if !progressed && !self.send.schedule_room_freed(&mut self.core, now) {
                    break;
                }
            }
            // Room may have appeared without a Written for a waiting channel (a link went
            // down).
            self.send.settle(&mut self.core, now);
            self.drain_transmits(now);
            // Batches that drain wrote directly freed room: their channels send again in this
            // wake-up (bounded by `direct_left`), or nothing would wake them.
            if !self.send.schedule_room_freed(&mut self.core, now) {
                break;
            }
        }
    }

    /// `chan` may have cells to send: the channel scheduler decides what goes now.
    pub(super) fn transmit(&mut self, chan: ChannelId, now: Instant) {
        self.send.channel_ready(chan, &mut self.core, now);
        self.drain_transmits(now);
    }

    /// Hand the batches the send path decided to their connections' writers, in order, or
    /// write them here ([`super::ConnHandles::send_batch`]).
    pub(super) fn drain_transmits(&mut self, now: Instant) {
        while let Some(Transmit {
            chan,
            conn,
            bytes,
            cells,
            class,
            framing,
            paced,
        }) = self.send.poll_transmit()
        {
            let Some(io) = self.chans.get_mut(&chan) else {
                // The send path forgets a channel with the driver; never reached.
                warn!(?chan, cells, "batch for an unknown channel dropped");
                continue;
            };
            let n = cells;
            io.split.sent(n);
            let Some(c) = io.conn_by_id_mut(conn) else {
                warn!(
                    ?chan,
                    ?conn,
                    cells = n,
                    "batch for an unknown connection dropped"
                );
                continue;
            };
            // Only a paced writer measures its wake-up from `sent_at` (`Input::Paid`); an
            // unpaced one is handed the wake-up's time instead of a clock read per batch.
            let sent_at = if paced { Instant::now() } else { now };
            let may_direct = self.direct_left > 0;
            let framed = framing.is_some();
            match c
                .h
                .send_batch(bytes, cells, class, sent_at, framed, paced, may_direct)
            {
                BatchSent::Written => {
                    self.direct_left -= 1;
                    self.report_written(conn, n, now);
                }
                BatchSent::Queued => {
                    c.batches.push_back((now, n));
                    self.report_buffered(chan, now);
                }
                BatchSent::Gone => {
                    // The writer is gone; its LinkDown is on the way.
                    debug!(?chan, "writer gone");
                }
            }
        }
    }

    /// `conn`'s oldest batch is in the kernel (its writer's `Input::Written`, or the driver's
    /// own write): room for its channel, scheduled at the end of the flush.
    pub(super) fn report_written(&mut self, conn: ChannelId, cells: usize, now: Instant) {
        let samples = self.send.written_in_turn(conn, cells);
        if let (Some(samples), Some(m)) = (samples, self.metrics.as_mut()) {
            m.cells_written(samples, now);
        }
    }

    /// Connection `conn`'s writer wrote its oldest batch (writers write in order).
    pub(super) fn batch_written(&mut self, conn: ChannelId, now: Instant) {
        let Some((chan, _)) = self.locate(conn) else {
            return;
        };
        if let Some(c) = self
            .chans
            .get_mut(&chan)
            .and_then(|io| io.conn_by_id_mut(conn))
        {
            c.batches.pop_front();
        }
        self.report_buffered(chan, now);
    }
}
