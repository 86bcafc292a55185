//! The DoS defences at the core's inputs: the driver tells a channel's address and asks before
//! accepting a connection; CREATE2 cells on client channels go through the circuit-creation
//! defence. The per-address state and the rules are [`crate::dos`].

use std::net::IpAddr;
use std::time::Instant;

use crate::dos::{DosConfig, DosStats};
use crate::ChannelId;

use super::Core;

impl Core {
    /// The address the peer of `chan` connects from. Call right after
    /// [`Core::channel_opened`] for a channel this node accepted. Unless `known_relay`, the
    /// channel is then counted for its address by the DoS defences until it closes. The driver
    /// decides what a known relay is (Tor: an address listed in the consensus; chive also
    /// accepts a proven identity listed there): a self-made relay identity must not exempt a
    /// client. A channel whose address is never told is not tracked. Calling again for the
    /// same channel changes nothing.
    pub fn set_channel_addr(
        &mut self,
        chan: ChannelId,
        addr: IpAddr,
        known_relay: bool,
        now: Instant,
    ) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        if ch.addr.is_some() {
            return;
        }
        ch.addr = Some(addr);
        if !known_relay && self.cfg.relay.is_some() {
            ch.dos_tracked = self.dos.client_connected(addr, now, &mut self.rng);
        }
    }

    /// `chan` turned out to come from a known relay (a newer consensus lists it): stop counting
    /// it for its address. Nothing happens to an untracked channel.
    pub fn set_channel_known_relay(&mut self, chan: ChannelId, now: Instant) {
        let Some(ch) = self.channels.get_mut(&chan) else {
            return;
        };
        if !std::mem::take(&mut ch.dos_tracked) {
            return;
        }
        if let Some(addr) = ch.addr {
            self.dos.client_disconnected(addr, now);
        }
    }

    /// Whether `chan` is counted by the DoS defences (an accepted client channel).
    pub fn channel_dos_tracked(&self, chan: ChannelId) -> bool {
        self.channels.get(&chan).is_some_and(|ch| ch.dos_tracked)
    }

    /// Whether a connection just accepted from `addr` may go on to its handshake (Tor's
    /// `DoSConnection*` defence, asked before TLS). `false`: close the socket now.
    pub fn allow_connection(&mut self, addr: IpAddr, now: Instant) -> bool {
        self.dos.allow_connection(addr, now)
    }

    /// New DoS settings (a new consensus or SIGHUP); addresses keep their state.
    pub fn set_dos_config(&mut self, cfg: DosConfig) {
        self.cfg.dos = cfg;
        self.dos.set_config(cfg);
    }

    /// The DoS settings in force.
    pub fn dos_config(&self) -> DosConfig {
        self.cfg.dos
    }

    /// DoS counters.
    pub fn dos_stats(&self) -> DosStats {
        self.dos.stats()
    }

    /// A CREATE2 arrived on `chan` (before any check of the cell: a malformed one costs a token
    /// too, as in Tor). Returns whether it must be refused with DESTROY (RESOURCELIMIT).
    pub(super) fn dos_create_refused(&mut self, chan: ChannelId, now: Instant) -> bool {
        let Some(addr) = self
            .channels
            .get(&chan)
            .filter(|ch| ch.dos_tracked)
            .and_then(|ch| ch.addr)
        else {
            return false;
        };
        self.dos.on_create(addr, now, &mut self.rng);
        self.dos.refuse_create(addr, now)
    }
}
