//! The driver's part of the memory cap and the DoS defences (the rules are the core's:
//! `node/oom.rs`, `node/dos.rs`): asking before an accepted connection's handshake, telling
//! the core each accepted channel's address and whether it is a known relay, and reporting
//! the bytes the driver holds for each channel.

use std::net::IpAddr;
use std::time::Instant;

use chive_cell::CELL_LEN;
use chive_core::ChannelId;
use chive_net::Accepting;
use tracing::{info, warn};

use super::tasks::start_link;
use super::Driver;

impl Driver {
    /// Every tick: once the bytes counted against `MaxMemInQueues` fell far below their peak
    /// or the OOM handler freed much (an OOM run, or the circuits of a closed attacking link
    /// freed), give the memory they
    /// held back to the OS (`crate::memtrim`: glibc keeps freed heap memory otherwise).
    pub(super) fn release_memory(&mut self, now: Instant) {
        if !crate::memtrim::can_release() {
            return;
        }
        let stats = self.core.stats();
        let (in_queues, oom_freed) = (stats.mem_in_queues, stats.oom_bytes_freed);
        let peak = self.mem_release.peak();
        if self
            .mem_release
            .due(in_queues, oom_freed, self.core.max_mem_in_queues(), now)
        {
            crate::memtrim::release();
            info!(
                peak_mib = peak.max(in_queues) >> 20,
                now_mib = in_queues >> 20,
                "queues fell below their peak: freed memory given back to the OS (malloc_trim)"
            );
        }
    }

    /// A connection was accepted (TCP only): ask the connection defence, then run the TLS and
    /// link handshakes in their own task (a slow peer blocks nobody). A refused connection is
    /// closed before any TLS work, as Tor's listener does.
    pub(super) fn accepted(&mut self, chan: ChannelId, accepting: Accepting, now: Instant) {
        let addr = accepting.peer_addr();
        if !self.is_known_relay(None, addr.ip()) && !self.core.allow_connection(addr.ip(), now) {
            info!(%addr, "DoS: connection refused (DoSConnection*)");
            return;
        }
        let limits = self.cfg.limits.clone();
        let liveness = self.cfg.liveness;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            match accepting.handshake().await {
                Ok(link) => start_link(chan, link, false, limits, liveness, tx).await,
                Err(e) => warn!(peer = %addr, error = %e, "incoming link failed"),
            }
        });
    }

    /// Whether a peer is a relay of the latest consensus: its proven identity is listed, or
    /// (Tor's rule, `nodelist_probably_contains_address`) its address is a listed relay's. An
    /// identity alone is no proof: anyone can make one.
    fn is_known_relay(&self, identity: Option<chive_crypto::IdentityKey>, ip: IpAddr) -> bool {
        identity.is_some_and(|id| self.relay_addrs.contains_key(&id))
            || self.relay_addrs.values().any(|a| a.ip() == ip)
    }

    /// Tell the core where an accepted channel comes from (right after `channel_opened`).
    pub(super) fn tell_addr(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get(&chan) else {
            return;
        };
        let Some(ip) = io.addr else {
            return;
        };
        let known = self.is_known_relay(io.peer, ip);
        // ChannelFairness: only an identity the consensus lists makes a relay channel (the
        // address rule would count every client on a relay's address, loopback included).
        let listed = io.peer.is_some_and(|id| self.relay_addrs.contains_key(&id));
        self.core.set_channel_client(chan, !listed);
        self.core.set_channel_addr(chan, ip, known, now);
    }

    /// A new consensus: accepted channels from relays it lists stop counting as clients (a
    /// relay may connect before our consensus lists it).
    pub(super) fn recheck_known_relays(&mut self, now: Instant) {
        let newly_known: Vec<ChannelId> = self
            .chans
            .iter()
            .filter(|(chan, io)| {
                io.addr.is_some_and(|ip| self.is_known_relay(io.peer, ip))
                    && self.core.channel_dos_tracked(**chan)
            })
            .map(|(chan, _)| *chan)
            .collect();
        for chan in newly_known {
            self.core.set_channel_known_relay(chan, now);
        }
        // ChannelFairness: an accepted channel whose identity a consensus now lists is a
        // relay's (one that connected before our consensus listed it).
        let listed: Vec<ChannelId> = self
            .chans
            .iter()
            .filter(|(_, io)| {
                io.addr.is_some() && io.peer.is_some_and(|id| self.relay_addrs.contains_key(&id))
            })
            .map(|(chan, _)| *chan)
            .collect();
        for chan in listed {
            self.core.set_channel_client(chan, false);
        }
    }

    /// Tell the core how many bytes the driver holds for `chan` and since when (counted
    /// against `MaxMemInQueues`): the batches handed to its writers and not yet written (at
    /// most `OutbufCells`) and the buffer room of the cells held back to reorder a split
    /// channel (its capacity: it may have grown for a burst). What the kernel
    /// still holds unsent is not counted: `LinkUnsentLimit` bounds it (64 KiB by default), and
    /// reading it (SIOCOUTQ) would need an ioctl this crate's `forbid(unsafe_code)` rules out.
    pub(super) fn report_buffered(&mut self, chan: ChannelId, now: Instant) {
        let Some(io) = self.chans.get_mut(&chan) else {
            return;
        };
        let held = io.split.held();
        io.held_cells = held;
        if held == 0 {
            io.held_since = None;
        } else if io.held_since.is_none() {
            io.held_since = Some(now);
        }
        let conns = std::iter::once(&io.primary).chain(io.secondary.as_ref());
        let mut cells = 0;
        let mut oldest = io.held_since;
        for c in conns {
            cells += c.batches.iter().map(|(_, n)| n).sum::<usize>();
            if let Some(&(t, _)) = c.batches.front() {
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        // The reorder buffer counts for its room (capacity), not only the cells held. A drained
        // one keeps at most a small buffer (the rest is freed), not counted: it would make an
        // idle channel look like one holding old data.
        let room = if held > 0 { io.split.held_bytes() } else { 0 };
        let bytes = cells * CELL_LEN + room;
        if bytes != io.reported {
            io.reported = bytes;
            self.core.channel_buffered(chan, bytes, oldest, now);
        }
    }
}
