//! Split-direction connection assignment: per channel, when to open a second connection,
//! binding, merging, retrying, and which connection the channel writes on. Sans-IO: the driver
//! owns the sockets, reports what happened with `now`, and carries out the returned markers.

use std::time::{Duration, Instant};

use chive_cell::{AnyCell, CellCommand, Handoff, CELL_LEN, VAR_CELL_HEADER_LEN};

use super::{BulkDetector, Conn, Decision, Item, Reorder, Sender, SplitConfig, SplitMode};
use super::{Violation, HOLD_CELLS};

/// How long an accepted link that negotiated split-direction may stay silent before it counts
/// as a channel of its own (its first cell may be a BIND making it another channel's second
/// connection; an honest peer sends that, or its first CREATE2, at once).
pub const BIND_WAIT: Duration = Duration::from_secs(2);
/// After a second connection failed or could not be opened, wait this long before another.
pub const SPLIT_RETRY: Duration = Duration::from_secs(10);

/// A channel's split-direction role.
#[derive(Debug)]
enum Side {
    /// One bidirectional connection (feature not negotiated, or a client link).
    None,
    /// We opened the first connection: the peer may bind a connection it writes on.
    Reader { token: [u8; 32], reorder: Reorder },
    /// We accepted the first connection: we may open our own and write there.
    Writer {
        token: [u8; 32],
        sender: Sender,
        /// A connect task for the second connection is running.
        opening: bool,
        /// No new second connection before this.
        retry_at: Option<Instant>,
        detector: BulkDetector,
    },
}

/// Why a cell that arrived was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The peer broke the hand-off rules: close the channel.
    Violation(Violation),
    /// The peer wrote on our write-only second connection: close that connection.
    OneWay,
}

/// What [`SplitChannel::secondary_down`] asks of the driver.
#[derive(Debug, PartialEq, Eq)]
pub enum SecondaryDown {
    /// Nothing (the channel is not split-capable).
    Nothing,
    /// We are the writer: write `recover` (if we were writing on the lost connection) first on
    /// the first connection, and send on that from now on.
    Resume {
        /// The recovery marker, telling the peer how many cells to expect from the lost one.
        recover: Option<Handoff>,
    },
    /// The peer's second connection: deliver `out`'s cells (the reorder released them), then
    /// close the channel if the result is a violation.
    Released(Result<Option<Conn>, Violation>),
}

/// One channel's split-direction state. The channel's first connection is
/// [`Conn::Primary`]; a second one, the peer's (we read it) or ours (we write it), is
/// [`Conn::Secondary`].
#[derive(Debug)]
pub struct SplitChannel {
    side: Side,
    /// A second connection is attached.
    secondary: bool,
    /// The core knows the channel (false while an accepted link may still send a BIND).
    opened: bool,
    up_since: Instant,
    /// Bytes read and written on the channel (all connections), for "dynamic".
    bytes_in: u64,
    bytes_out: u64,
}

impl SplitChannel {
    /// A channel whose first connection came up at `now`. `split_ok`: both ends negotiated the
    /// feature and the peer is a relay; `initiator`: we opened the connection; `token`: its
    /// bind token.
    pub fn new(
        split_ok: bool,
        initiator: bool,
        token: [u8; 32],
        cfg: &SplitConfig,
        now: Instant,
    ) -> Self {
        let side = match (split_ok, initiator) {
            (false, _) => Side::None,
            (true, true) => Side::Reader {
                token,
                reorder: Reorder::default(),
            },
            (true, false) => Side::Writer {
                token,
                sender: Sender::default(),
                opening: false,
                retry_at: None,
                detector: BulkDetector::new(cfg.threshold, cfg.idle),
            },
        };
        SplitChannel {
            side,
            secondary: false,
            opened: false,
            up_since: now,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    /// Whether the first cell decides what the link is: an accepted link with the feature may
    /// be another channel's second connection (its first cell a BIND), so the core is told
    /// about it only when that cell is not a BIND, or after [`BIND_WAIT`].
    pub fn may_be_bound(&self) -> bool {
        !self.opened && matches!(self.side, Side::Writer { .. })
    }

    /// Mark the channel known to the core; false if it already was.
    pub fn open(&mut self) -> bool {
        !std::mem::replace(&mut self.opened, true)
    }

    /// Whether the core knows the channel.
    pub fn is_open(&self) -> bool {
        self.opened
    }

    /// Whether an unopened link has been silent for [`BIND_WAIT`] and is a channel of its own.
    pub fn bind_wait_over(&self, now: Instant) -> bool {
        !self.opened && now.saturating_duration_since(self.up_since) >= BIND_WAIT
    }

    /// Whether a second connection is attached.
    pub fn has_secondary(&self) -> bool {
        self.secondary
    }

    /// The connection our cells go on: the second one only while we write there.
    pub fn writes_on(&self) -> Conn {
        match &self.side {
            Side::Writer { sender, .. } if self.secondary => sender.current(),
            _ => Conn::Primary,
        }
    }

    /// `n` cells were handed to the writer of [`Self::writes_on`].
    pub fn sent(&mut self, n: usize) {
        self.bytes_out += (n * CELL_LEN) as u64;
        if let Side::Writer { sender, .. } = &mut self.side {
            sender.sent(n);
        }
    }

    /// Bytes read and written so far (all connections).
    pub fn bytes(&self) -> (u64, u64) {
        (self.bytes_in, self.bytes_out)
    }

    // ----- our second connection (we accepted the first) -----

    /// The bind token for a second connection of ours, if one should be opened now: we are the
    /// writer, the channel is open, none is open or opening, and no retry delay is running.
    /// Call [`Self::opening`] once the connect is under way.
    pub fn wants_second(&self, now: Instant) -> Option<[u8; 32]> {
        let Side::Writer {
            token,
            sender,
            opening,
            retry_at,
            ..
        } = &self.side
        else {
            return None;
        };
        let eligible = self.opened
            && !*opening
            && !self.secondary
            && sender.current() == Conn::Primary
            && !retry_at.is_some_and(|t| now < t);
        eligible.then_some(*token)
    }

    /// What the BIND of our next second connection carries besides the token: the sequence
    /// number of the marker that will switch our writing onto it (`None` unless we write).
    pub fn bind_seq(&self) -> Option<u32> {
        match &self.side {
            Side::Writer { sender, .. } => Some(sender.next_seq()),
            _ => None,
        }
    }

    /// A connect for our second connection started.
    pub fn opening(&mut self) {
        if let Side::Writer { opening, .. } = &mut self.side {
            *opening = true;
        }
    }

    /// Opening our second connection failed: retry after [`SPLIT_RETRY`].
    pub fn open_failed(&mut self, now: Instant) {
        if let Side::Writer {
            opening, retry_at, ..
        } = &mut self.side
        {
            *opening = false;
            *retry_at = Some(now + SPLIT_RETRY);
        }
    }

    /// Our second connection is up (its BIND sent). `Some(marker)`: accepted; write the marker
    /// on the first connection, behind every cell already handed to it, and write on the second
    /// from now on. `None`: not wanted any more; close it.
    pub fn second_up(&mut self) -> Option<Handoff> {
        let Side::Writer {
            sender, opening, ..
        } = &mut self.side
        else {
            return None;
        };
        if !*opening || self.secondary || sender.current() != Conn::Primary {
            return None;
        }
        *opening = false;
        self.secondary = true;
        Some(sender.switch())
    }

    /// "dynamic": go back to one connection. `Some(marker)`: write it on the second connection,
    /// then close that; we write on the first from now on.
    pub fn merge(&mut self) -> Option<Handoff> {
        let Side::Writer { sender, .. } = &mut self.side else {
            return None;
        };
        if !self.secondary || sender.current() != Conn::Secondary {
            return None;
        }
        self.secondary = false;
        Some(sender.switch())
    }

    /// Periodic advice: split (open a second connection, if [`Self::wants_second`] agrees), merge,
    /// or stay. "always" always splits; "dynamic" asks the bulk detector.
    pub fn tick(&mut self, mode: SplitMode, now: Instant) -> Decision {
        let writing_secondary = self.writes_on() == Conn::Secondary;
        let (bytes_in, bytes_out) = (self.bytes_in, self.bytes_out);
        let Side::Writer { detector, .. } = &mut self.side else {
            return Decision::Stay;
        };
        match mode {
            SplitMode::Off => Decision::Stay,
            SplitMode::Always => Decision::Split,
            SplitMode::Dynamic => detector.observe(now, bytes_in, bytes_out, writing_secondary),
        }
    }

    // ----- the peer's second connection (we opened the first) -----

    /// Whether a BIND with `token` names this channel and a second connection may be attached
    /// (the caller checks the peer's identity). Constant-time in the token.
    pub fn bind_matches(&self, token: &[u8; 32]) -> bool {
        matches!(&self.side, Side::Reader { token: ours, .. } if token_eq(ours, token))
            && self.opened
            && !self.secondary
    }

    /// Attach the peer's second connection, whose BIND carried `seq` (the peer's marker that
    /// will switch onto it; `None` from an earlier version). False if it cannot be taken (see
    /// [`Reorder::attach_secondary`]): close it.
    pub fn attach_peer_second(&mut self, seq: Option<u32>) -> bool {
        let Side::Reader { reorder, .. } = &mut self.side else {
            return false;
        };
        if !reorder.attach_secondary(seq) {
            return false;
        }
        self.secondary = true;
        true
    }

    // ----- both -----

    /// The fast path of [`SplitChannel::receive`], for the common case: `cell`, read on
    /// `which`, is delivered as it is, alone, with nothing held back or switched. Returns true
    /// (and counts the cell) if so: the caller delivers it, exactly as if `receive` had
    /// returned `Ok(None)` with `cell` as the only released cell. Returns false, changing
    /// nothing, whenever `receive` might do anything else (markers, held cells, refusals).
    pub fn receive_direct(&mut self, which: Conn, cell: &AnyCell) -> bool {
        let handoff = matches!(cell, AnyCell::Var(v) if v.command == CellCommand::HANDOFF);
        let marker = handoff || matches!(cell, AnyCell::Var(v) if v.command == CellCommand::BIND);
        self.direct(which, handoff, marker, cell_len(cell))
    }

    /// [`SplitChannel::receive_direct`] for a fixed cell (never a marker), which the caller
    /// then hands to the core by reference (`Core::handle_cell_mut`).
    pub fn receive_direct_fixed(&mut self, which: Conn) -> bool {
        self.direct(which, false, false, CELL_LEN as u64)
    }

    fn direct(&mut self, which: Conn, handoff: bool, marker: bool, len: u64) -> bool {
        let direct = match &mut self.side {
            Side::None => true,
            Side::Reader { reorder, .. } => !handoff && reorder.pass(which),
            Side::Writer { .. } => which == Conn::Primary && !marker,
        };
        if direct {
            self.bytes_in += len;
        }
        direct
    }

    /// A cell arrived on connection `which`. Cells for the core are appended to `out`, in the
    /// peer's order (also when an error is returned: deliver them first). `Ok(Some(conn))`: the
    /// peer now writes on `conn`.
    pub fn receive(
        &mut self,
        which: Conn,
        cell: AnyCell,
        out: &mut Vec<AnyCell>,
    ) -> Result<Option<Conn>, Refusal> {
        self.bytes_in += cell_len(&cell);
        match &mut self.side {
            Side::None => {
                out.push(cell);
                Ok(None)
            }
            Side::Reader { reorder, .. } => {
                let item = match cell {
                    AnyCell::Var(v) if v.command == CellCommand::HANDOFF => {
                        match Handoff::decode(&v.payload) {
                            Ok(h) => Item::Handoff(h),
                            Err(_) => {
                                return Err(Refusal::Violation(Violation::Protocol(
                                    "malformed HANDOFF",
                                )))
                            }
                        }
                    }
                    other => Item::Cell(other),
                };
                let before = reorder.current();
                let result = reorder.push(which, item, out);
                let after = reorder.current();
                result.map_err(Refusal::Violation)?;
                Ok((before != after).then_some(after))
            }
            Side::Writer { .. } => {
                if which == Conn::Secondary {
                    // The peer must never write on our write-only connection.
                    return Err(Refusal::OneWay);
                }
                if let AnyCell::Var(v) = &cell {
                    if v.command == CellCommand::HANDOFF || v.command == CellCommand::BIND {
                        return Err(Refusal::Violation(Violation::Protocol(
                            "HANDOFF or BIND from the channel's initiator",
                        )));
                    }
                }
                out.push(cell);
                Ok(None)
            }
        }
    }

    /// The second connection closed or failed at `now`.
    pub fn secondary_down(&mut self, now: Instant, out: &mut Vec<AnyCell>) -> SecondaryDown {
        self.secondary = false;
        match &mut self.side {
            Side::None => SecondaryDown::Nothing,
            Side::Reader { reorder, .. } => {
                let before = reorder.current();
                let result = reorder.closed(Conn::Secondary, out);
                let after = reorder.current();
                SecondaryDown::Released(result.map(|()| (before != after).then_some(after)))
            }
            Side::Writer {
                sender, retry_at, ..
            } => {
                *retry_at = Some(now + SPLIT_RETRY);
                let recover = (sender.current() == Conn::Secondary).then(|| sender.recover());
                SecondaryDown::Resume { recover }
            }
        }
    }

    /// The peer's bound second connections still waiting for earlier markers on the first
    /// (see [`Reorder`]); 0 unless we read a split channel.
    pub fn pending_binds(&self) -> usize {
        match &self.side {
            Side::Reader { reorder, .. } => reorder.pending_binds(),
            _ => 0,
        }
    }

    /// Bytes the reorder buffer's room takes (its capacity; 0 unless we read a split
    /// channel): what the driver reports against `MaxMemInQueues` for it.
    pub fn held_bytes(&self) -> usize {
        match &self.side {
            Side::Reader { reorder, .. } => reorder.held_bytes(),
            _ => 0,
        }
    }

    /// Cells held back to restore the peer's order (a reading channel's reorder buffer; 0
    /// otherwise).
    pub fn held(&self) -> usize {
        match &self.side {
            Side::Reader { reorder, .. } => {
                reorder.queued(Conn::Primary) + reorder.queued(Conn::Secondary)
            }
            _ => 0,
        }
    }

    /// Which of our connections' readers should be paused (`true`) or running: a connection
    /// whose cells pile up waiting for a HANDOFF on the other is paused until they can flow.
    /// `None` if the channel never holds cells back (we are not the reader of a split channel).
    pub fn holds(&self) -> Option<[(Conn, bool); 2]> {
        let Side::Reader { reorder, .. } = &self.side else {
            return None;
        };
        Some([Conn::Primary, Conn::Secondary].map(|c| (c, reorder.held_back(c) >= HOLD_CELLS)))
    }
}

/// Wire size of a cell, for the byte counters.
fn cell_len(cell: &AnyCell) -> u64 {
    match cell {
        AnyCell::Fixed(_) => CELL_LEN as u64,
        AnyCell::Var(v) => (VAR_CELL_HEADER_LEN + v.payload.len()) as u64,
    }
}

/// Constant-time equality for bind tokens.
fn token_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use chive_cell::{Cell, VarCell, PAYLOAD_LEN};

    const TOKEN: [u8; 32] = [7; 32];

    fn cfg(threshold: u64, idle_secs: u64) -> SplitConfig {
        SplitConfig {
            mode: SplitMode::Dynamic,
            threshold,
            idle: Duration::from_secs(idle_secs),
        }
    }

    /// An open channel we accepted (we may write on a second connection of ours).
    fn writer(now: Instant) -> SplitChannel {
        let mut ch = SplitChannel::new(true, false, TOKEN, &cfg(10_000, 5), now);
        assert!(ch.may_be_bound());
        assert!(ch.open());
        assert!(!ch.may_be_bound());
        ch
    }

    fn data() -> AnyCell {
        AnyCell::Fixed(Cell {
            circ_id: 5,
            command: CellCommand::RELAY,
            payload: [0; PAYLOAD_LEN],
        })
    }

    fn var(command: CellCommand, payload: Vec<u8>) -> AnyCell {
        AnyCell::Var(VarCell {
            circ_id: 0,
            command,
            payload,
        })
    }

    #[test]
    fn roles_follow_feature_and_direction() {
        let now = Instant::now();
        let plain = SplitChannel::new(false, false, TOKEN, &SplitConfig::default(), now);
        assert!(!plain.may_be_bound());
        assert_eq!(plain.wants_second(now), None);
        assert_eq!(plain.holds(), None);
        let mut reader = SplitChannel::new(true, true, TOKEN, &SplitConfig::default(), now);
        assert!(!reader.may_be_bound());
        assert_eq!(reader.wants_second(now), None);
        assert_eq!(reader.tick(SplitMode::Always, now), Decision::Stay);
        // A reader's channel is bound only once open, with the right token.
        assert!(!reader.bind_matches(&TOKEN));
        reader.open();
        assert!(!reader.bind_matches(&[8; 32]));
        assert!(reader.bind_matches(&TOKEN));
        assert!(reader.attach_peer_second(Some(0)));
        assert!(
            !reader.bind_matches(&TOKEN),
            "one second connection at a time"
        );
        assert_eq!(
            reader.writes_on(),
            Conn::Primary,
            "the reader never writes on it"
        );
    }

    #[test]
    fn an_accepted_link_waits_for_a_bind_then_counts_as_a_channel() {
        let t0 = Instant::now();
        let mut ch = SplitChannel::new(true, false, TOKEN, &SplitConfig::default(), t0);
        assert!(ch.may_be_bound());
        assert!(!ch.bind_wait_over(t0 + BIND_WAIT - Duration::from_millis(1)));
        assert!(ch.bind_wait_over(t0 + BIND_WAIT));
        assert!(ch.open());
        assert!(!ch.open(), "opened once");
        assert!(!ch.bind_wait_over(t0 + BIND_WAIT));
    }

    #[test]
    fn always_opens_once_switches_with_a_marker_and_merges_back() {
        let t0 = Instant::now();
        let mut ch = writer(t0);
        assert_eq!(ch.tick(SplitMode::Always, t0), Decision::Split);
        ch.sent(3);
        assert_eq!(ch.wants_second(t0), Some(TOKEN));
        ch.opening();
        assert_eq!(ch.wants_second(t0), None, "already opening");
        let marker = ch.second_up().expect("accepted");
        assert_eq!((marker.seq, marker.cells, marker.flags), (0, 3, 0));
        assert_eq!(ch.writes_on(), Conn::Secondary);
        assert_eq!(ch.wants_second(t0), None, "already split");
        assert_eq!(ch.second_up(), None, "a second one is closed");
        ch.sent(5);
        let back = ch.merge().expect("split");
        assert_eq!((back.seq, back.cells), (1, 5));
        assert_eq!(ch.writes_on(), Conn::Primary);
        assert_eq!(ch.merge(), None);
        // Merging is no failure: a new second connection may open at once.
        assert_eq!(ch.wants_second(t0), Some(TOKEN));
    }

    #[test]
    fn failures_wait_for_the_retry_delay() {
        let t0 = Instant::now();
        let mut ch = writer(t0);
        ch.opening();
        ch.open_failed(t0);
        assert_eq!(
            ch.wants_second(t0 + SPLIT_RETRY - Duration::from_millis(1)),
            None
        );
        assert_eq!(ch.wants_second(t0 + SPLIT_RETRY), Some(TOKEN));
        // A second connection that fails while we write on it: recover on the first, with the
        // count of cells written on the failed one, then wait before another.
        let t1 = t0 + SPLIT_RETRY;
        ch.opening();
        ch.second_up().expect("accepted");
        ch.sent(9);
        let mut out = Vec::new();
        let SecondaryDown::Resume { recover: Some(h) } = ch.secondary_down(t1, &mut out) else {
            panic!("expected a recovery marker");
        };
        assert!(h.is_recovery());
        assert_eq!((h.seq, h.cells), (1, 9));
        assert_eq!(ch.writes_on(), Conn::Primary);
        assert_eq!(ch.wants_second(t1 + Duration::from_secs(9)), None);
        assert_eq!(ch.wants_second(t1 + SPLIT_RETRY), Some(TOKEN));
        // A connection that comes up after we gave up on it is refused.
        assert_eq!(ch.second_up(), None);
    }

    #[test]
    fn dynamic_splits_after_sustained_bulk_both_ways_and_merges_when_idle() {
        let t0 = Instant::now();
        let mut ch = writer(t0);
        let mut out = Vec::new();
        let half = Duration::from_millis(500);
        let mut now = t0;
        let mut decisions = Vec::new();
        // 40 cells each way per half second: ~41 kB/s, over the 10 kB/s threshold.
        for _ in 0..10 {
            for _ in 0..40 {
                ch.receive(Conn::Primary, data(), &mut out).unwrap();
            }
            ch.sent(40);
            decisions.push(ch.tick(SplitMode::Dynamic, now));
            now += half;
        }
        let first = decisions.iter().position(|d| *d == Decision::Split);
        // The detector needs SPLIT_SUSTAIN (3 s) of bulk windows.
        assert_eq!(first, Some(6), "{decisions:?}");
        ch.opening();
        ch.second_up().unwrap();
        // Bulk one way only is not bulk: after `idle` (5 s) the channel merges.
        let mut merged_after = None;
        for i in 0..20 {
            ch.sent(40);
            if ch.tick(SplitMode::Dynamic, now) == Decision::Merge {
                merged_after = Some(i);
                break;
            }
            now += half;
        }
        assert!(matches!(merged_after, Some(10..=12)), "{merged_after:?}");
        assert_eq!(out.len(), 400);
    }

    #[test]
    fn the_writer_refuses_cells_on_its_one_way_connection_and_markers() {
        let now = Instant::now();
        let mut ch = writer(now);
        let mut out = Vec::new();
        assert_eq!(ch.receive(Conn::Primary, data(), &mut out), Ok(None));
        assert_eq!(
            ch.receive(Conn::Secondary, data(), &mut out),
            Err(Refusal::OneWay)
        );
        let h = Handoff {
            seq: 0,
            cells: 0,
            flags: 0,
        };
        assert!(matches!(
            ch.receive(
                Conn::Primary,
                var(CellCommand::HANDOFF, h.encode()),
                &mut out
            ),
            Err(Refusal::Violation(_))
        ));
        assert!(matches!(
            ch.receive(Conn::Primary, var(CellCommand::BIND, vec![0; 32]), &mut out),
            Err(Refusal::Violation(_))
        ));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn the_reader_reorders_holds_and_reports_switches() {
        let now = Instant::now();
        let mut ch = SplitChannel::new(true, true, TOKEN, &SplitConfig::default(), now);
        ch.open();
        assert!(ch.attach_peer_second(Some(0)));
        let mut out = Vec::new();
        // The peer switched: its cells on the second connection wait for the marker.
        for _ in 0..HOLD_CELLS {
            assert_eq!(ch.receive(Conn::Secondary, data(), &mut out), Ok(None));
        }
        assert!(out.is_empty());
        assert_eq!(
            ch.holds(),
            Some([(Conn::Primary, false), (Conn::Secondary, true)])
        );
        ch.receive(Conn::Primary, data(), &mut out).unwrap();
        let h = Handoff {
            seq: 0,
            cells: 1,
            flags: 0,
        };
        let switched = ch.receive(
            Conn::Primary,
            var(CellCommand::HANDOFF, h.encode()),
            &mut out,
        );
        assert_eq!(switched, Ok(Some(Conn::Secondary)));
        assert_eq!(out.len(), 1 + HOLD_CELLS);
        assert_eq!(
            ch.holds(),
            Some([(Conn::Primary, false), (Conn::Secondary, false)])
        );
        // A malformed marker is a violation.
        assert!(matches!(
            ch.receive(Conn::Primary, var(CellCommand::HANDOFF, vec![1]), &mut out),
            Err(Refusal::Violation(Violation::Protocol("malformed HANDOFF")))
        ));
        // The peer gives its second connection up: nothing is lost yet (a recovery marker on
        // the first will say how many cells it wrote there).
        let mut out = Vec::new();
        let down = ch.secondary_down(now, &mut out);
        assert_eq!(down, SecondaryDown::Released(Ok(None)));
        assert!(!ch.has_secondary());
    }

    /// `receive_direct`, falling back to `receive`, gives the same cells, results, counts and
    /// holds as `receive` alone, for every side and through switches, hold-backs and refusals.
    #[test]
    fn the_fast_path_agrees_with_receive() {
        let now = Instant::now();
        let marker = |seq, cells| {
            var(
                CellCommand::HANDOFF,
                Handoff {
                    seq,
                    cells,
                    flags: 0,
                }
                .encode(),
            )
        };
        let p = Conn::Primary;
        let s = Conn::Secondary;
        // The reader's script: cells, a switch to the second connection with cells held back,
        // a switch back, a malformed marker.
        let mut reader_script = vec![(p, data()), (p, data())];
        reader_script.extend((0..5).map(|_| (s, data())));
        reader_script.extend([(p, data()), (p, marker(0, 3)), (s, data())]);
        reader_script.extend([(s, marker(1, 6)), (p, data()), (s, data())]);
        reader_script.push((p, var(CellCommand::VPADDING, vec![1; 9])));
        reader_script.push((p, var(CellCommand::HANDOFF, vec![1])));
        let writer_script = vec![
            (p, data()),
            (p, var(CellCommand::VPADDING, vec![1; 9])),
            (s, data()),
            (p, marker(0, 0)),
            (p, var(CellCommand::BIND, vec![0; 32])),
            (p, data()),
        ];
        let reader = || {
            let mut ch = SplitChannel::new(true, true, TOKEN, &SplitConfig::default(), now);
            ch.open();
            assert!(ch.attach_peer_second(Some(0)));
            ch
        };
        let plain = || {
            let mut ch = SplitChannel::new(false, true, TOKEN, &SplitConfig::default(), now);
            ch.open();
            ch
        };
        type Case<'a> = (SplitChannel, SplitChannel, &'a [(Conn, AnyCell)]);
        let cases: [Case; 3] = [
            (reader(), reader(), &reader_script),
            (writer(now), writer(now), &writer_script),
            (plain(), plain(), &writer_script[..3]),
        ];
        let mut direct_taken = 0;
        for (mut slow, mut fast, script) in cases {
            for (i, (which, cell)) in script.iter().enumerate() {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let ra = slow.receive(*which, cell.clone(), &mut a);
                // Fixed cells take the by-reference entry, as the driver's `on_fixed_cell`.
                let direct = match cell {
                    AnyCell::Fixed(_) => fast.receive_direct_fixed(*which),
                    AnyCell::Var(_) => fast.receive_direct(*which, cell),
                };
                let rb = if direct {
                    direct_taken += 1;
                    b.push(cell.clone());
                    Ok(None)
                } else {
                    fast.receive(*which, cell.clone(), &mut b)
                };
                assert_eq!(ra, rb, "step {i}");
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "step {i}");
                assert_eq!(slow.bytes(), fast.bytes(), "step {i}");
                assert_eq!(slow.held(), fast.held(), "step {i}");
                assert_eq!(slow.holds(), fast.holds(), "step {i}");
            }
        }
        assert!(
            direct_taken >= 8,
            "the fast path was taken {direct_taken} times"
        );
    }
}
