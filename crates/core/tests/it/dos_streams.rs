//! The exit's stream-creation defence (`DoSStreamCreation*`, Tor 0.4.9) through a real exit
//! core: a circuit opening streams faster than its bucket allows gets END (MISC) for the extra
//! BEGIN cells and a RESOLVED transient error for the extra RESOLVE cells, or loses the circuit
//! (defence type 3), while an honest circuit through the same relays keeps opening its
//! streams; tokens come back at the rate; refusals are counted (type 1's too, as Tor). A
//! malformed BEGIN takes no token (Tor parses first). Virtual clock: the flood is as fast as
//! the test can send.

use crate::common;

use std::time::Duration;

use chive_cell::{DestroyReason, End, EndReason, RelayCommand, Resolved, ResolvedAnswer};
use chive_core::dos::{DosConfig, StreamCreationConfig, StreamDefense};
use chive_core::{CoreConfig, Event};
use common::{destroys, Circ, Path};

/// A path whose exit X runs the stream defence with `burst` tokens, `rate` per second.
fn path(burst: u32, rate: u32, defense: StreamDefense) -> Path {
    let mut p = Path::new(CoreConfig::default());
    p.x.core.set_dos_config(DosConfig {
        stream_creation: StreamCreationConfig {
            enabled: true,
            rate,
            burst,
            defense,
        },
        ..DosConfig::default()
    });
    p
}

/// Streams X opened since the last call (its `ExitConnect` events).
fn opened(p: &mut Path) -> usize {
    let mut n = 0;
    while let Some(ev) = p.x.core.poll_event() {
        if matches!(ev, Event::ExitConnect { .. }) {
            n += 1;
        }
    }
    n
}

/// Send `n` BEGINs on `circ` with stream ids from `first`; returns the streams X opened.
fn begins(p: &mut Path, circ: &mut Circ, first: u16, n: u16) -> usize {
    for sid in first..first + n {
        p.send(circ, 1, RelayCommand::BEGIN, sid, b"127.0.0.1:80\0", false);
    }
    p.r_to_x();
    opened(p)
}

/// The ENDs X sent back on `circ`, as (stream id, reason).
fn ends(p: &mut Path, circ: &mut Circ) -> Vec<(u16, EndReason)> {
    p.x_to_r();
    p.read(circ)
        .into_iter()
        .filter(|m| m.cmd == RelayCommand::END)
        .map(|m| (m.sid, End::decode(&m.data).unwrap().reason))
        .collect()
}

/// A flooding circuit gets its burst, then END (MISC) for every further BEGIN, a RESOLVED
/// transient error for a RESOLVE, and one token per second after that; an honest circuit
/// through the same exit opens every stream meanwhile; the refusals are counted.
#[test]
fn a_stream_flood_is_refused_per_circuit_and_an_honest_circuit_keeps_its_streams() {
    let mut p = path(10, 2, StreamDefense::RefuseStream);
    let mut flood = p.create2();
    let mut honest = p.create2();

    assert_eq!(begins(&mut p, &mut flood, 1, 200), 10, "the burst");
    let refused = ends(&mut p, &mut flood);
    assert_eq!(refused.len(), 190);
    assert!(refused.iter().all(|&(_, r)| r == EndReason::MISC));
    assert_eq!(refused[0].0, 11, "the 11th BEGIN is the first refused");
    // RESOLVE takes from the same bucket; refused, it gets RESOLVED with a transient error
    // (Tor's `dns_send_resolved_error_cell`), not END.
    p.send(
        &mut flood,
        1,
        RelayCommand::RESOLVE,
        300,
        b"example.com\0",
        false,
    );
    p.r_to_x();
    p.x_to_r();
    let back = p.read(&mut flood);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!((back[0].cmd, back[0].sid), (RelayCommand::RESOLVED, 300));
    assert_eq!(
        Resolved::decode(&back[0].data).unwrap().answers,
        [ResolvedAnswer::TransientError(0)]
    );

    // The honest circuit is not touched by the flood: all of its streams open.
    assert_eq!(begins(&mut p, &mut honest, 1, 10), 10);
    assert!(ends(&mut p, &mut honest).is_empty());
    assert_eq!(p.x.core.dos_stats().streams_refused, 191);

    // Two seconds later the flooder has 4 tokens again, not more.
    p.now += Duration::from_secs(2);
    assert_eq!(begins(&mut p, &mut flood, 400, 10), 4);
    assert_eq!(ends(&mut p, &mut flood).len(), 6);
    assert_eq!(p.x.core.dos_stats().streams_refused, 197);
    assert_eq!(p.x.core.stats().circuits, 2, "both circuits still up");
}

/// Defence type 3 closes the flooding circuit (DESTROY, RESOURCELIMIT); the honest one stays.
#[test]
fn defense_type_three_closes_the_flooding_circuit() {
    let mut p = path(5, 1, StreamDefense::CloseCircuit);
    let mut flood = p.create2();
    let mut honest = p.create2();
    assert_eq!(begins(&mut p, &mut flood, 1, 6), 5);
    p.x_to_r();
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(flood.id, DestroyReason::RESOURCELIMIT)]
    );
    assert_eq!(p.x.core.dos_stats().streams_refused, 1);
    assert_eq!(p.x.core.stats().circuits, 1);
    assert!(p.x_answers(&mut honest, 1));
}

/// Off (the default): every BEGIN opens a stream, nothing is counted. Defence type 1: every
/// BEGIN opens a stream, and those past the bucket are counted (detection only, as Tor).
#[test]
fn off_or_type_one_lets_every_stream_through() {
    let mut p = Path::new(CoreConfig::default());
    let mut c = p.create2();
    assert_eq!(begins(&mut p, &mut c, 1, 400), 400);
    assert_eq!(p.x.core.dos_stats().streams_refused, 0);
    let mut p = path(5, 1, StreamDefense::None);
    let mut c = p.create2();
    assert_eq!(begins(&mut p, &mut c, 1, 20), 20);
    assert!(ends(&mut p, &mut c).is_empty());
    assert_eq!(p.x.core.dos_stats().streams_refused, 15);
}

/// A malformed BEGIN is answered END (TORPROTOCOL) and takes no token, as in Tor, where
/// `connection_exit_begin_conn` parses the cell before it asks the DoS subsystem.
#[test]
fn a_malformed_begin_takes_no_token() {
    let mut p = path(3, 1, StreamDefense::RefuseStream);
    let mut c = p.create2();
    for sid in 1..=10 {
        p.send(
            &mut c,
            1,
            RelayCommand::BEGIN,
            sid,
            b"no port here\0",
            false,
        );
    }
    p.r_to_x();
    assert_eq!(opened(&mut p), 0);
    let back = ends(&mut p, &mut c);
    assert_eq!(back.len(), 10);
    assert!(
        back.iter().all(|&(_, r)| r == EndReason::TORPROTOCOL),
        "{back:?}"
    );
    assert_eq!(p.x.core.dos_stats().streams_refused, 0);
    // The whole burst is still there.
    assert_eq!(begins(&mut p, &mut c, 20, 5), 3);
    assert_eq!(
        ends(&mut p, &mut c),
        [(23, EndReason::MISC), (24, EndReason::MISC)]
    );
}
