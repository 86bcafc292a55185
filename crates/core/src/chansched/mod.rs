//! Channel schedulers: which channel moves cells to its connection's writer next, how many, and
//! in which class. C tor's `scheduler_t` (KIST) beside the `circuitmux_policy_t` that
//! [`crate::sched::CircuitScheduler`] models: the circuit scheduler picks a circuit *within* a
//! channel, the channel scheduler picks *among* channels.
//!
//! Cells go to a connection's writer only while it has room (at most `OutbufCells` unwritten),
//! so that the circuit scheduler decides as late as possible. [`SendPath`] owns that output
//! accounting — per connection the cells in flight (handed to the writer, not yet written), the
//! unpaid ones among them (waiting for write-bucket tokens), the batches with their sampled cells,
//! per channel which connection it writes on and whether it is blocked — and asks a
//! [`ChannelScheduler`] policy what to send. The IO driver only moves what it is told: it takes
//! [`Transmit`]s from [`SendPath::poll_transmit`] ("channel C: these cells, class K, on
//! connection X"), hands them to the writer and reports back [`SendPath::paid`] and
//! [`SendPath::written`]. Time is always passed in.
//!
//! Hooks, in the order [`SendPath`] calls them:
//! - [`ChannelScheduler::schedule`] (mandatory): a channel may have cells to send: the core
//!   listed it ready, a batch on its connection was written (room appeared), or the connection
//!   it writes on changed. Send now ([`SendCtx::transmit_up_to`]) or remember it.
//! - [`ChannelScheduler::budget_freed`] (optional, default no-op): a batch was paid for (its
//!   write-bucket tokens taken); a policy whose budget counts unpaid cells may send more.
//! - [`ChannelScheduler::settle`] (optional, default no-op): the end of a driver wake-up; room
//!   may have appeared without a report (a connection went away with cells unpaid).
//! - [`ChannelScheduler::forget`] (optional, default no-op): the channel is gone; drop it.
//! - [`ChannelScheduler::waiting`] (optional, default empty): channels held back for lack of
//!   room, oldest first (handed to a new policy on a switch, and shown in state dumps).
//!
//! Policies, chosen by [`ChannelSchedulerKind`]:
//! - [`Direct`]: no shared write rate; every ready channel sends at once, up to `OutbufCells` in
//!   flight on its connection.
//! - [`SharedRate`] (`CrossChannelPriority` under a `BandwidthRate`): all connections share one
//!   bound of `OutbufCells` unpaid cells, and room goes to the waiting channel whose next circuit
//!   is most deserving ([`crate::Core::channel_priority`]), half a buffer at a time, equals in
//!   turn; with a `QuietReserve`, quiet circuits' cells go first as quiet batches outside that
//!   bound (their own bound is twice it).

mod direct;
#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod framing_tests;
pub mod latency;
#[cfg(test)]
mod latency_tests;
mod output;
mod shared;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

pub use direct::Direct;
pub use output::{SendCtx, SendStats, Transmit, WireFraming};
pub use shared::SharedRate;

use crate::{CellSample, ChannelId, Core};
use latency::ReactionLatency;
use output::OutputAccounts;

/// `OutbufMaxMsec` when unset: the output bound may grow to 200 ms of the write rate when the
/// driver reacts late (docs/scheduling.md, "Late wake-ups").
pub const DEFAULT_OUTBUF_MAX: Duration = Duration::from_millis(200);

/// A connection, named by an id from the driver's channel-id allocator. A channel's first
/// connection has the channel's own id; a split-direction channel may have a second one.
pub type ConnId = ChannelId;

/// How a batch of cells may draw on the write bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BatchClass {
    /// Not classified (no shared write rate): the reserve does not apply.
    Unranked,
    /// Bulk under a shared write rate: leaves the reserve alone.
    Bulk,
    /// Cells of circuits whose EWMA count is below `below`: may spend the reserve, and so may
    /// every batch queued before it on the same connection (it cannot leave before them).
    Quiet {
        /// The count (cells) below which a circuit is quiet.
        below: f64,
    },
}

impl BatchClass {
    /// Whether a batch of this class may spend the write bucket's reserve while `quiet_queued`
    /// quiet batches wait unpaid on its connection (itself included, if quiet). Quiet and
    /// unranked batches may. A bulk batch is *promoted* while a quiet batch waits behind it:
    /// the quiet one cannot leave before it, so it would otherwise wait for tokens above the
    /// reserve after all. The writer re-asks at every re-check, so promotion applies to a batch
    /// already waiting.
    pub fn may_spend_reserve(self, quiet_queued: usize) -> bool {
        !matches!(self, BatchClass::Bulk) || quiet_queued > 0
    }
}

/// Which channel scheduler a node uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ChannelSchedulerKind {
    /// [`Direct`]: each channel bounded on its own connection.
    #[default]
    Direct,
    /// [`SharedRate`]: one bound over all connections, most deserving channel first.
    SharedRate,
}

impl ChannelSchedulerKind {
    /// The policy for a node: [`ChannelSchedulerKind::SharedRate`] when `cross_channel`
    /// (`CrossChannelPriority`) is on and the writers share a finite write rate
    /// (`write_rate` bytes/s, 0 = unlimited), else [`ChannelSchedulerKind::Direct`].
    pub fn for_rate(cross_channel: bool, write_rate: u64) -> Self {
        if cross_channel && write_rate > 0 {
            ChannelSchedulerKind::SharedRate
        } else {
            ChannelSchedulerKind::Direct
        }
    }

    /// A fresh policy of this kind.
    pub fn build(self) -> Box<dyn ChannelScheduler> {
        match self {
            ChannelSchedulerKind::Direct => Box::new(Direct),
            ChannelSchedulerKind::SharedRate => Box::new(SharedRate::default()),
        }
    }
}

/// Output settings. The driver derives them from its configuration and the write bucket, and
/// sets them again when either changes ([`SendPath::set_config`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SendConfig {
    /// `OutbufCells`: cells in flight allowed per connection ([`Direct`]), or unpaid over all
    /// connections ([`SharedRate`]). Under a write rate the bound in force is this plus the
    /// rate's worth of the measured reaction latency, up to `outbuf_max` ([`latency`]).
    pub outbuf_cells: usize,
    /// The write bucket's rate in bytes/s (0 = unlimited): what the bound's stretch is
    /// measured in.
    pub write_rate: u64,
    /// `OutbufMaxMsec`: the most the bound may grow to, as time at `write_rate`; zero keeps it
    /// at `outbuf_cells`.
    pub outbuf_max: Duration,
    /// Writers pay write-bucket tokens per batch and report it ([`SendPath::paid`]); only then
    /// are unpaid cells counted.
    pub paced: bool,
    /// The channel scheduler.
    pub kind: ChannelSchedulerKind,
    /// The write bucket's reserve in bytes (`QuietReserve`, as capped by the bucket; 0 = none).
    pub quiet_reserve: u64,
    /// `ChannelFairness`: [`SharedRate`] ranks *client* channels by the decayed count of cells
    /// each sent in all (this half-life, seconds), not by its best circuit's EWMA, so that a
    /// client cannot win a larger share by spreading bulk over many circuits; relay channels
    /// keep the best circuit's count. `None` = off.
    pub channel_fair_halflife: Option<f64>,
}

impl Default for SendConfig {
    fn default() -> Self {
        SendConfig {
            outbuf_cells: 32,
            write_rate: 0,
            outbuf_max: DEFAULT_OUTBUF_MAX,
            paced: false,
            kind: ChannelSchedulerKind::Direct,
            quiet_reserve: 0,
            channel_fair_halflife: None,
        }
    }
}

/// What a channel scheduler needs from the core: its cells and how deserving they are.
/// [`Core`] implements it; tests use a fake.
pub trait CellSource {
    /// Whether `chan` has cells waiting ([`Core::has_pending`]).
    fn has_pending(&self, chan: ChannelId) -> bool;
    /// How deserving `chan`'s next cell is, lower first ([`Core::channel_priority`]).
    fn channel_priority(&self, chan: ChannelId, now: Instant) -> Option<f64>;
    /// Whether the circuit scheduler ranks circuits (EWMA), so that "quiet" means something.
    fn ranks_circuits(&self) -> bool;
    /// Whether `chan` is a client's channel (`ChannelFairness` ranks only those by their own
    /// count, [`Core::channel_is_client`]). Default: no channel is.
    fn is_client_channel(&self, _chan: ChannelId) -> bool {
        false
    }
    /// Append the wire bytes of up to `max` of `chan`'s cells to `out`, 514 per cell
    /// ([`Core::poll_transmit_wire`]); how many cells.
    fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> usize;
    /// A sampled cell from the last transmits ([`Core::poll_cell_sample`]).
    fn poll_cell_sample(&mut self) -> Option<CellSample>;
}

impl CellSource for Core {
    fn has_pending(&self, chan: ChannelId) -> bool {
        Core::has_pending(self, chan)
    }

    fn channel_priority(&self, chan: ChannelId, now: Instant) -> Option<f64> {
        Core::channel_priority(self, chan, now)
    }

    fn ranks_circuits(&self) -> bool {
        self.scheduler().ranks_circuits()
    }

    fn is_client_channel(&self, chan: ChannelId) -> bool {
        Core::channel_is_client(self, chan)
    }

    fn poll_transmit(
        &mut self,
        chan: ChannelId,
        max: usize,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> usize {
        Core::poll_transmit_wire(self, chan, max, now, out)
    }

    fn poll_cell_sample(&mut self) -> Option<CellSample> {
        Core::poll_cell_sample(self)
    }
}

/// A channel scheduling policy. See the module docs for the hook contract.
pub trait ChannelScheduler: Send {
    /// Mandatory. `chan` may have cells to send (possibly spurious: check
    /// [`SendCtx::has_pending`]). Send with [`SendCtx::transmit_up_to`] or keep it waiting.
    fn schedule(&mut self, chan: ChannelId, ctx: &mut SendCtx<'_>);

    /// Optional (default no-op). A batch was paid for: unpaid cells went down.
    fn budget_freed(&mut self, _ctx: &mut SendCtx<'_>) {}

    /// Optional (default no-op). End of a driver wake-up: room may have appeared without a
    /// report (a connection went away), so waiting channels should be reconsidered.
    fn settle(&mut self, _ctx: &mut SendCtx<'_>) {}

    /// Optional (default no-op). `chan` is closed; drop it from any waiting list.
    fn forget(&mut self, _chan: ChannelId) {}

    /// Optional (default empty). Channels waiting for output room, oldest first.
    fn waiting(&self) -> Vec<ChannelId> {
        Vec::new()
    }

    /// Short policy name for logs (`"direct"`, `"shared-rate"`).
    fn name(&self) -> &'static str;
}

/// The send path of a node: output accounting plus the channel scheduler. See the module docs.
pub struct SendPath {
    cfg: SendConfig,
    policy: Box<dyn ChannelScheduler>,
    accounts: OutputAccounts,
    /// How late the driver reacts to its paced writers ([`SendPath::paid_report`]).
    latency: ReactionLatency,
    /// Channels with room freed during the current driver wake-up, scheduled at its end
    /// ([`SendPath::written_in_turn`]).
    room_freed: Vec<ChannelId>,
}

impl SendPath {
    /// A send path with no channels.
    pub fn new(cfg: SendConfig) -> Self {
        SendPath {
            policy: cfg.kind.build(),
            cfg,
            accounts: OutputAccounts::default(),
            latency: ReactionLatency::default(),
            room_freed: Vec::new(),
        }
    }

    /// The output bound in force: `OutbufCells`, plus under a write rate the rate's worth of
    /// the measured reaction latency (mean + 2 deviations), at most `OutbufMaxMsec` of the rate.
    pub fn outbuf(&self) -> usize {
        if !self.cfg.paced {
            return self.cfg.outbuf_cells;
        }
        latency::stretched_bound(
            self.cfg.outbuf_cells,
            self.cfg.write_rate,
            self.latency.high(),
            self.cfg.outbuf_max,
        )
    }

    /// The reaction latency measured so far.
    pub fn reaction_latency(&self) -> ReactionLatency {
        self.latency
    }

    /// Run `hook` on the policy with a context for `now`.
    fn call(
        &mut self,
        src: &mut dyn CellSource,
        now: Instant,
        hook: impl FnOnce(&mut dyn ChannelScheduler, &mut SendCtx<'_>),
    ) {
        let outbuf = self.outbuf();
        let mut ctx = SendCtx::new(&self.cfg, outbuf, &mut self.accounts, src, now);
        hook(self.policy.as_mut(), &mut ctx);
    }

    /// The settings in force.
    pub fn config(&self) -> &SendConfig {
        &self.cfg
    }

    /// The policy in force.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// New settings. On a change of policy the channels the old one held back are scheduled
    /// with the new one, so that none is left waiting for room nobody will give it.
    pub fn set_config(&mut self, cfg: SendConfig, src: &mut dyn CellSource, now: Instant) {
        let switch = cfg.kind != self.cfg.kind;
        self.cfg = cfg;
        if switch {
            let held = self.policy.waiting();
            self.policy = self.cfg.kind.build();
            for chan in held {
                self.channel_ready(chan, src, now);
            }
        }
    }

    /// Leave `framing`'s room around the cells of every later batch (`None`: cells back to
    /// back, the default), so that the writers' record layer can seal them in place.
    pub fn set_framing(&mut self, framing: Option<WireFraming>) {
        self.accounts.framing = framing;
    }

    /// A channel came up on connection `chan` (its first connection has its id).
    pub fn add_channel(&mut self, chan: ChannelId) {
        self.accounts.add_channel(chan);
    }

    /// Forget a channel and its connections (it closed, or its link became another channel's
    /// second connection). Reports for its connections are ignored from now on.
    pub fn remove_channel(&mut self, chan: ChannelId) {
        self.accounts.remove_channel(chan);
        self.policy.forget(chan);
        self.room_freed.retain(|c| *c != chan);
    }

    /// `chan` writes on the new connection `conn` from now on (split-direction: our second
    /// connection is up). Cells already in flight on its first connection stay counted there.
    pub fn attach_conn(&mut self, chan: ChannelId, conn: ConnId) {
        self.accounts.attach_conn(chan, conn);
    }

    /// Forget connection `conn` (a second connection closed or failed): its cells in flight no
    /// longer count, and its channel writes on its first connection again.
    pub fn detach_conn(&mut self, conn: ConnId) {
        self.accounts.detach_conn(conn);
    }

    /// The channel `conn` belongs to, if it is a connection we write on.
    pub fn channel_of(&self, conn: ConnId) -> Option<ChannelId> {
        self.accounts.channel_of(conn)
    }

    /// `chan` may have cells to send (the core's [`Core::poll_ready_channel`], or the connection
    /// it writes on changed).
    pub fn channel_ready(&mut self, chan: ChannelId, src: &mut dyn CellSource, now: Instant) {
        self.call(src, now, |p, ctx| p.schedule(chan, ctx));
    }

    /// `conn`'s writer took the write-bucket tokens for a batch of `cells` cells, reported at
    /// once (no latency measured: [`SendPath::paid_report`] is the driver's call).
    pub fn paid(&mut self, conn: ConnId, cells: usize, src: &mut dyn CellSource, now: Instant) {
        if !self.accounts.paid(conn, cells) {
            return;
        }
        self.call(src, now, |p, ctx| p.budget_freed(ctx));
    }

    /// [`SendPath::paid`] with the batch's reaction latency, as the driver measured it: how
    /// long the writer took to wake for the batch (zero if it was already waiting when the
    /// writer asked for the next) plus the paid report's own delay (from the writer's taking
    /// the tokens to this call). It is the time a writer that has just paid may go without new
    /// work, which the unpaid cells must cover ([`latency`]).
    pub fn paid_report(
        &mut self,
        conn: ConnId,
        cells: usize,
        reaction: Duration,
        src: &mut dyn CellSource,
        now: Instant,
    ) {
        if self.accounts.channel_of(conn).is_some() {
            self.latency.sample(reaction);
        }
        self.paid(conn, cells, src, now);
    }

    /// `conn`'s writer wrote its oldest batch, of `cells` cells: room for its channel. Returns
    /// the batch's sampled cells (for write-time instrumentation), if `conn` is known.
    pub fn written(
        &mut self,
        conn: ConnId,
        cells: usize,
        src: &mut dyn CellSource,
        now: Instant,
    ) -> Option<Vec<CellSample>> {
        let (chan, samples) = self.accounts.written(conn, cells)?;
        self.channel_ready(chan, src, now);
        Some(samples)
    }

    /// [`SendPath::written`] in the middle of a driver wake-up: the room counts at once, but
    /// the channel is scheduled only when the driver calls [`SendPath::schedule_room_freed`],
    /// once the wake-up's inputs and the events they made are handled: together with every
    /// cell they queued. Scheduled at once, it would send what the inputs handled so far
    /// queued (on a client, the SENDMEs of part of a read) as a batch of its own and the rest
    /// as another: two writes where one does, for no gain in time, since the writers run only
    /// after the wake-up anyway.
    pub fn written_in_turn(&mut self, conn: ConnId, cells: usize) -> Option<Vec<CellSample>> {
        let (chan, samples) = self.accounts.written(conn, cells)?;
        // Few channels are written per wake-up: a scan is cheaper than a set.
        if !self.room_freed.contains(&chan) {
            self.room_freed.push(chan);
        }
        Some(samples)
    }

    /// Schedule the channels [`SendPath::written_in_turn`] freed room for since the last call;
    /// whether there were any (their transmits may have made more work for the driver).
    pub fn schedule_room_freed(&mut self, src: &mut dyn CellSource, now: Instant) -> bool {
        if self.room_freed.is_empty() {
            return false;
        }
        for chan in std::mem::take(&mut self.room_freed) {
            self.channel_ready(chan, src, now);
        }
        true
    }

    /// End of a driver wake-up (see [`ChannelScheduler::settle`]).
    pub fn settle(&mut self, src: &mut dyn CellSource, now: Instant) {
        self.call(src, now, |p, ctx| p.settle(ctx));
    }

    /// The next batch for a writer, in the order decided.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.accounts.transmits.pop_front()
    }

    /// Counters since start.
    pub fn stats(&self) -> SendStats {
        self.accounts.stats
    }

    /// Cells handed to `chan`'s writers and not yet written (all its connections).
    pub fn in_flight(&self, chan: ChannelId) -> usize {
        self.accounts.chan_total(chan, |c| c.in_flight)
    }

    /// Of those, cells not yet paid for.
    pub fn unpaid(&self, chan: ChannelId) -> usize {
        self.accounts.chan_total(chan, |c| c.unpaid)
    }

    /// Whether `chan` is in a blocked episode (its connection full while cells wait).
    pub fn blocked(&self, chan: ChannelId) -> bool {
        self.accounts.blocked(chan)
    }

    /// Channels waiting for output room, oldest first.
    pub fn waiting(&self) -> Vec<ChannelId> {
        self.policy.waiting()
    }
}
