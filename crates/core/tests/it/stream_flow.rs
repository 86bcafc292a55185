//! Stream flow control between a real client core and a real exit core on a simulated link
//! (a fixed number of cells per millisecond each way, a one-way delay, a virtual clock): with
//! fixed windows (`cc_alg=0`) one stream keeps Tor's 500-cell stream window; with congestion
//! control (`cc_alg=2`) XON/XOFF replaces it, so one download can use the whole congestion
//! window, and a slow reader at the client still stops the exit packaging, within a bounded
//! buffer.

use crate::common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chive_cell::Cell;
use chive_core::cc::{CcKind, VegasParams};
use chive_core::streamflow::XOFF_CELLS;
use chive_core::{ChannelId, CircKey, Core, CoreConfig, Event, StreamHandle, STREAM_BUFFER_TARGET};

const CHAN: ChannelId = ChannelId(1);
/// Cells each direction of the link carries per millisecond (~5 MB/s).
const CELLS_PER_MS: usize = 10;
/// One-way delay: the path's bandwidth-delay product is 2 x 50 x 10 = 1000 cells.
const DELAY: Duration = Duration::from_millis(50);

struct Pair {
    client: Core,
    exit: Core,
    now: Instant,
    /// Cells on the wire: (arrival, toward the exit?, cell).
    wire: VecDeque<(Instant, bool, Cell)>,
    circ: CircKey,
    stream: StreamHandle,
    exit_stream: Option<StreamHandle>,
    /// Bytes the exit's "server" has to send, and has handed over.
    total: usize,
    fed: usize,
    /// DATA cells the client handed to its application and the application has not read.
    unread: u32,
    received: usize,
    max_unread: u32,
    max_inflight: u32,
    /// The exit's server hands over its bytes in pieces of at most this many.
    piece: usize,
    /// Make the exit package through the general path (no DATA cells built in place).
    copy_path: bool,
    /// Read credit the exit granted and the server has not used, and its largest value.
    credit: usize,
    max_credit: usize,
    /// Every cell the exit sent, in order, and its circuit window after each step.
    exit_sent: Vec<Cell>,
    exit_windows: Vec<Option<(u32, u32)>>,
}

/// The `i`th byte of the exit's server's stream: not constant, so that bytes out of order
/// show.
fn server_byte(i: usize) -> u8 {
    (i.wrapping_mul(31) % 251) as u8
}

impl Pair {
    fn new(cc: CcKind, total: usize) -> Pair {
        Pair::with(cc, total, usize::MAX, false)
    }

    fn with(cc: CcKind, total: usize, piece: usize, copy_path: bool) -> Pair {
        let cfg = || CoreConfig {
            congestion_control: cc,
            ..CoreConfig::default()
        };
        let exit = common::relay(
            3,
            CoreConfig {
                exit: true,
                ..cfg()
            },
        );
        let mut p = Pair {
            client: Core::new(cfg(), [1; 32]),
            exit: exit.core,
            now: Instant::now(),
            wire: VecDeque::new(),
            circ: CircKey(0),
            stream: StreamHandle(0),
            exit_stream: None,
            total,
            fed: 0,
            unread: 0,
            received: 0,
            max_unread: 0,
            max_inflight: 0,
            piece,
            copy_path,
            credit: 0,
            max_credit: 0,
            exit_sent: Vec::new(),
            exit_windows: Vec::new(),
        };
        let identity = exit.hop.identity;
        p.circ = p.client.launch_circuit(vec![exit.hop], p.now);
        let Some(Event::Connect { .. }) = p.client.poll_event() else {
            panic!("client did not ask for a channel");
        };
        p.client.channel_opened(CHAN, Some(identity), true, p.now);
        p.exit.channel_opened(CHAN, None, false, p.now);
        p.run_until(|p| p.client.circuit_is_open(p.circ), 0);
        p.stream = p
            .client
            .open_stream(p.circ, "127.0.0.1", 80, p.now)
            .unwrap();
        p
    }

    /// One millisecond: events (the exit's server feeds what credit allows; the client's
    /// application reads `read` cells), then each direction's cells onto the wire, then what
    /// arrives.
    fn step(&mut self, read: u32) {
        while let Some(ev) = self.exit.poll_event() {
            match ev {
                Event::ExitConnect { stream, .. } => {
                    self.exit_stream = Some(stream);
                    if self.copy_path {
                        self.exit.stream_package_by_copy(stream);
                    }
                    self.exit
                        .exit_connected(stream, ([127, 0, 0, 1], 80).into(), self.now);
                }
                Event::StreamReadCredit { stream, bytes } => {
                    self.credit += bytes;
                    self.max_credit = self.max_credit.max(self.credit);
                    let mut n = self.credit.min(self.total - self.fed);
                    while n > 0 {
                        let k = n.min(self.piece);
                        let data: Vec<u8> = (self.fed..self.fed + k).map(server_byte).collect();
                        self.exit.stream_data_owned(stream, data, self.now);
                        self.fed += k;
                        self.credit -= k;
                        n -= k;
                    }
                }
                _ => {}
            }
        }
        while let Some(ev) = self.client.poll_event() {
            if let Event::StreamWrite {
                stream,
                data,
                cells,
            } = ev
            {
                assert_eq!(stream, self.stream);
                let want: Vec<u8> = (self.received..self.received + data.len())
                    .map(server_byte)
                    .collect();
                assert!(data == want, "bytes in order at {}", self.received);
                self.unread += cells;
                self.received += data.len();
            }
        }
        self.max_unread = self.max_unread.max(self.unread);
        let n = read.min(self.unread);
        if n > 0 {
            self.unread -= n;
            self.client.stream_flushed(self.stream, n, self.now);
        }
        for (toward_exit, core) in [(true, &mut self.client), (false, &mut self.exit)] {
            while core.poll_ready_channel().is_some() {}
            let mut out = Vec::new();
            core.poll_transmit(CHAN, CELLS_PER_MS, self.now, &mut out);
            if !toward_exit {
                self.exit_sent.extend(out.iter().cloned());
            }
            for cell in out {
                self.wire.push_back((self.now + DELAY, toward_exit, cell));
            }
        }
        while self.wire.front().is_some_and(|(t, _, _)| *t <= self.now) {
            let (_, toward_exit, cell) = self.wire.pop_front().unwrap();
            let to = if toward_exit {
                &mut self.exit
            } else {
                &mut self.client
            };
            to.handle_cell(CHAN, cell, self.now);
        }
        let st = self.exit.circuit_stats(self.now);
        self.exit_windows.push(st.first().and_then(|s| s.window));
        if let Some(st) = st.first() {
            if let Some((_, inflight)) = st.window {
                self.max_inflight = self.max_inflight.max(inflight);
            }
        }
        self.now += Duration::from_millis(1);
    }

    fn run_until(&mut self, done: impl Fn(&Pair) -> bool, read: u32) -> Duration {
        let start = self.now;
        for _ in 0..200_000 {
            if done(self) {
                return self.now - start;
            }
            self.step(read);
        }
        panic!(
            "did not finish: received {} of {}",
            self.received, self.total
        );
    }

    fn download(&mut self, read: u32) -> Duration {
        self.run_until(|p| p.received >= p.total, read)
    }
}

fn vegas() -> CcKind {
    CcKind::Vegas(VegasParams::default())
}

/// Fixed windows: one stream never has more than 500 cells in flight, and no XON/XOFF.
#[test]
fn fixed_window_keeps_the_500_cell_stream_window() {
    let mut p = Pair::new(CcKind::Fixed, 4 << 20);
    p.download(u32::MAX);
    // Circuit SENDMEs acknowledge every 100 cells, stream SENDMEs every 50 written: the
    // circuit's count runs up to 50 cells ahead of the stream's 500.
    assert!(
        (500..=550).contains(&p.max_inflight),
        "the stream window caps the download ({})",
        p.max_inflight
    );
    assert_eq!(p.client.stats().stream_xoff_sent, 0);
    assert_eq!(
        p.exit.stats().circuits_killed + p.client.stats().circuits_killed,
        0
    );
}

/// Vegas with a reader that keeps up: no XOFF ever, the single stream goes past 500 cells in
/// flight toward the path's bandwidth-delay product (1000 cells), and it finishes faster than
/// under the fixed 500-cell stream window.
#[test]
fn fast_reader_never_sees_xoff_and_one_stream_uses_the_congestion_window() {
    let mut fixed = Pair::new(CcKind::Fixed, 8 << 20);
    let t_fixed = fixed.download(u32::MAX);
    let mut p = Pair::new(vegas(), 8 << 20);
    let t_vegas = p.download(u32::MAX);
    assert_eq!(
        p.client.stats().stream_xoff_sent,
        0,
        "no XOFF for a fast reader"
    );
    assert!(
        p.max_inflight > 800,
        "one stream got {} cells in flight",
        p.max_inflight
    );
    assert!(
        t_vegas.as_secs_f64() < 0.8 * t_fixed.as_secs_f64(),
        "vegas {t_vegas:?} vs fixed {t_fixed:?}"
    );
    // The metrics see the path: the exit's smallest round trip is the link's 100 ms (plus
    // at most a few ms of serialisation).
    let st = p.exit.circuit_stats(p.now);
    let rtt = st[0].min_rtt.expect("vegas keeps a min RTT");
    assert!(
        rtt >= 2 * DELAY && rtt < 2 * DELAY + Duration::from_millis(20),
        "{rtt:?}"
    );
    assert!(st[0].slow_start.is_some());
    assert!(
        p.max_unread <= CELLS_PER_MS as u32,
        "the reader kept up ({})",
        p.max_unread
    );
    eprintln!(
        "8 MiB: fixed {t_fixed:?}, vegas {t_vegas:?}, max in flight {}",
        p.max_inflight
    );
    assert_eq!(
        p.exit.stats().circuits_killed + p.client.stats().circuits_killed,
        0
    );
}

/// Vegas with an application that stops reading: the client sends one XOFF once 500 cells
/// wait, the exit stops packaging (the buffer stops growing, bounded by the XOFF limit plus
/// what was in flight), and when the application reads again an XON resumes the download to
/// the last byte.
#[test]
fn slow_reader_makes_the_exit_stop_packaging() {
    let mut p = Pair::new(vegas(), 8 << 20);
    for _ in 0..2000 {
        p.step(0);
    }
    let held = p.unread;
    assert_eq!(p.client.stats().stream_xoff_sent, 1);
    assert!(held > XOFF_CELLS, "XOFF only past the limit ({held})");
    let fed = p.fed;
    for _ in 0..2000 {
        p.step(0);
    }
    assert_eq!(p.unread, held, "the exit stopped: nothing more arrived");
    assert!(
        p.fed <= fed + STREAM_BUFFER_TARGET,
        "the exit stopped reading its server too"
    );
    assert!(
        held < XOFF_CELLS + 2000,
        "buffer bounded by the limit plus a window ({held})"
    );
    // A reader at 1 cell/ms (~500 kB/s): XON once half drained, with that rate.
    for _ in 0..1000 {
        p.step(1);
    }
    assert_eq!(p.client.stats().stream_xon_sent, 1);
    p.download(u32::MAX);
    assert_eq!(p.received, p.total);
    assert_eq!(
        p.exit.stats().circuits_killed + p.client.stats().circuits_killed,
        0
    );
}

/// The exit builds each DATA cell in its queue slot (body copied from the stream's bytes,
/// digest and onion layer applied there). Every cell it sends is byte for byte the cell the
/// general path builds (a relay message, then a cell, then a copy into the queue): same
/// bodies in the same order, same running digest (in the encrypted bytes), same circuit
/// window after every step (which also takes the digest of every 100th cell, checked by the
/// client's SENDMEs). The server's pieces (1000 bytes) do not line up with cells, so cells
/// take their bytes across pieces and across the wrap of the stream's buffer.
#[test]
fn data_cells_built_in_place_equal_the_general_path() {
    for cc in [CcKind::Fixed, vegas()] {
        let run = |copy_path| {
            let mut p = Pair::with(cc, 600_000, 1000, copy_path);
            p.download(u32::MAX);
            assert_eq!(p.received, p.total);
            assert_eq!(
                p.exit.stats().circuits_killed + p.client.stats().circuits_killed,
                0
            );
            p
        };
        let general = run(true);
        let in_place = run(false);
        assert_eq!(general.exit.stats().data_cells_in_place, 0);
        let data_cells = in_place.exit.stats().data_cells_in_place;
        assert!(
            data_cells >= (600_000 / 498) as u64,
            "DATA cells built in place: {data_cells}"
        );
        assert_eq!(in_place.exit_sent.len(), general.exit_sent.len());
        for (i, (a, b)) in in_place
            .exit_sent
            .iter()
            .zip(&general.exit_sent)
            .enumerate()
        {
            let wire = |c: &Cell| {
                let mut w = Vec::new();
                c.encode_into(&mut w);
                w
            };
            assert!(wire(a) == wire(b), "cell {i} differs ({cc:?})");
        }
        assert_eq!(in_place.exit_windows, general.exit_windows);
    }
}

/// The exit never grants a stream more read credit than [`STREAM_BUFFER_TARGET`] (what the
/// node reads at most, in one read), and grants all of it to a stream that starts.
#[test]
fn exit_read_credit_is_at_most_the_buffer_target() {
    for cc in [CcKind::Fixed, vegas()] {
        let mut p = Pair::new(cc, 2 << 20);
        p.download(u32::MAX);
        assert_eq!(p.max_credit, STREAM_BUFFER_TARGET, "{cc:?}");
    }
}
