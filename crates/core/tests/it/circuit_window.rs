//! The circuit window an exit packages with: the consensus `circwindow`, unless the relay
//! sets its own (`CircuitWindow`, `CoreConfig::circwindow_override`), as paper 004 changed
//! one exit's window and not the network's. And `cc_alg=2` (Vegas) opens the window
//! beyond the fixed one when the path allows.

use crate::common;

use chive_cell::RelayCommand;
use chive_core::cc::{CcKind, VegasParams};
use chive_core::{Core, CoreConfig, Event};
use common::{Circ, Path};

/// A one-hop circuit to R (an exit configured with `cfg`) with one open stream, R holding
/// far more data for it than any window allows. Returns how many DATA cells R sends before
/// it needs a SENDME.
fn cells_before_first_sendme(cfg: CoreConfig, consensus_window: Option<u32>) -> usize {
    cells_before_first_sendme_with(cfg, |core| {
        if let Some(w) = consensus_window {
            core.set_circwindow(w);
        }
    })
}

/// As above, with `setup` applied to R's core before the circuit is created.
fn cells_before_first_sendme_with(cfg: CoreConfig, setup: impl FnOnce(&mut Core)) -> usize {
    let mut p = Path::new(CoreConfig { exit: true, ..cfg });
    setup(&mut p.r.core);
    let mut circ = p.create();
    cells_sent_until_the_window_stops(&mut p, &mut circ)
}

/// Open a stream on `circ` (one hop, R the exit) and feed R's stream until only its circuit
/// window stops it; returns the DATA cells sent.
fn cells_sent_until_the_window_stops(p: &mut Path, circ: &mut Circ) -> usize {
    open_stream(p, circ);
    let data = vec![7u8; 1200 * 498];
    let mut sent = 0;
    let mut cells = 0;
    // Feed what R grants and drain what it sends until it stops: only a window stops it.
    for _ in 0..1000 {
        let before = sent;
        while let Some(ev) = p.r.core.poll_event() {
            if let Event::StreamReadCredit { stream, bytes } = ev {
                let end = (sent + bytes).min(data.len());
                p.r.core.stream_data(stream, &data[sent..end], p.now);
                sent = end;
            }
        }
        let msgs = p.read(circ);
        assert!(msgs.iter().all(|m| m.cmd == RelayCommand::DATA));
        cells += msgs.len();
        if msgs.is_empty() && sent == before {
            break;
        }
    }
    // The metrics see the same window: every cell sent is in flight, none acknowledged.
    let stats = p.r.core.circuit_stats(p.now);
    assert_eq!(
        stats[0].window.map(|(_, inflight)| inflight),
        Some(cells as u32)
    );
    cells
}

fn open_stream(p: &mut Path, circ: &mut Circ) {
    p.send(circ, 0, RelayCommand::BEGIN, 1, b"127.0.0.1:80\0", false);
    let Some(Event::ExitConnect { stream, .. }) = p.r.core.poll_event() else {
        panic!("no ExitConnect");
    };
    p.r.core
        .exit_connected(stream, ([127, 0, 0, 1], 80).into(), p.now);
    assert_eq!(p.read(circ)[0].cmd, RelayCommand::CONNECTED);
}

#[test]
fn exit_packages_with_the_consensus_window() {
    let cfg = CoreConfig {
        circwindow: 101,
        ..CoreConfig::default()
    };
    assert_eq!(cells_before_first_sendme(cfg, None), 101);
    assert_eq!(
        cells_before_first_sendme(CoreConfig::default(), Some(200)),
        200
    );
}

/// The relay's own window wins over the consensus in both directions, and survives a new
/// consensus (`set_circwindow`).
#[test]
fn relay_window_overrides_the_consensus() {
    let small = CoreConfig {
        circwindow: 1000,
        circwindow_override: Some(101),
        ..CoreConfig::default()
    };
    assert_eq!(cells_before_first_sendme(small, Some(400)), 101);
    let large = CoreConfig {
        circwindow: 100,
        circwindow_override: Some(300),
        ..CoreConfig::default()
    };
    assert_eq!(cells_before_first_sendme(large, Some(100)), 300);
    // Out-of-range values are clamped like the consensus's.
    let tiny = CoreConfig {
        circwindow_override: Some(5),
        ..CoreConfig::default()
    };
    assert_eq!(cells_before_first_sendme(tiny, None), 100);
}

/// The override can be set and cleared at runtime, for circuits created afterwards.
#[test]
fn relay_window_set_at_runtime() {
    let set = cells_before_first_sendme_with(CoreConfig::default(), |core| {
        core.set_circwindow(200);
        core.set_circwindow_override(Some(150));
    });
    assert_eq!(set, 150);
    let cleared = cells_before_first_sendme_with(CoreConfig::default(), |core| {
        core.set_circwindow_override(Some(150));
        core.set_circwindow(200);
        core.set_circwindow_override(None);
        assert_eq!(core.effective_circwindow(), 200);
    });
    assert_eq!(cleared, 200);
}

/// Vegas starts at `cc_cwnd_init`, whatever the fixed window says.
#[test]
fn vegas_starts_at_its_initial_window() {
    let params = VegasParams {
        cwnd_init: 300,
        ..VegasParams::default()
    };
    let cfg = CoreConfig {
        circwindow: 101,
        congestion_control: CcKind::Vegas(params),
        ..CoreConfig::default()
    };
    let mut p = Path::new(CoreConfig { exit: true, ..cfg });
    let (mut circ, agreed) = p.create_v3(true);
    assert!(agreed, "the exit agrees to the client's request");
    assert_eq!(cells_sent_until_the_window_stops(&mut p, &mut circ), 300);
}

/// A Vegas exit asked for nothing (ntor v3 without the request, or ntor v1) keeps the fixed
/// window: both ends use what the circuit agreed on, not the exit's own policy.
#[test]
fn a_vegas_exit_not_asked_for_congestion_control_keeps_the_fixed_window() {
    let cfg = || CoreConfig {
        circwindow: 101,
        congestion_control: CcKind::Vegas(VegasParams::default()),
        exit: true,
        ..CoreConfig::default()
    };
    let mut p = Path::new(cfg());
    let (mut circ, agreed) = p.create_v3(false);
    assert!(!agreed);
    assert_eq!(cells_sent_until_the_window_stops(&mut p, &mut circ), 101);
    assert_eq!(cells_before_first_sendme(cfg(), None), 101);
}
