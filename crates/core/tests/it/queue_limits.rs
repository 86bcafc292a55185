//! Every queue in the core has a bound: one circuit's queue (`max_circuit_queue`), the
//! circuits on one channel (`max_circuits_per_channel`), and what an edge packages into its
//! circuit's queue (high-water 256, resume at low-water 64). All queues together are bounded by
//! `MaxMemInQueues`: `oom.rs`.

use crate::common;

use chive_cell::{Cell, CellCommand, Destroy, DestroyReason, RelayCommand};
use chive_core::{CoreConfig, Event, StreamHandle};
use common::{destroys, drain, open, Path, R_CLIENT, R_TO_X, X_FROM_R};

/// The edge's packaging high-water and low-water marks (`node/queue.rs`).
const HIGHWATER: usize = 256;
const LOWWATER: usize = 64;

/// A middle relay whose next channel does not drain: the client sends faster than it can go
/// on, as a client that ignores SENDMEs would (a middle sees no windows). The circuit is
/// destroyed on both sides once its queue passes the limit; another circuit is untouched.
#[test]
fn circuit_queue_limit_destroys_the_circuit_of_a_peer_ignoring_flow_control() {
    let limit = 50;
    let mut p = Path::new(CoreConfig {
        max_circuit_queue: limit,
        ..CoreConfig::default()
    });
    let mut bad = p.create2();
    let mut good = p.create2();
    p.flood_x(&mut bad, limit);
    assert_eq!(
        p.r.core.stats().circuits,
        2,
        "at the limit the circuit lives"
    );
    assert_eq!(p.r.core.stats().queued_cells, limit);

    p.flood_x(&mut bad, 1);
    let stats = p.r.core.stats();
    assert_eq!((stats.circuits, stats.circuits_killed), (1, 1));
    assert_eq!(
        stats.queued_cells, 0,
        "the dead circuit's cells are dropped"
    );
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(bad.id, DestroyReason::PROTOCOL)]
    );
    let to_x = drain(&mut p.r.core, R_TO_X, p.now);
    assert_eq!(to_x.len(), 1, "X gets the DESTROY and none of the cells");
    assert_eq!(destroys(&to_x)[0].1, DestroyReason::PROTOCOL);
    for cell in to_x {
        p.x.core.handle_cell(X_FROM_R, cell, p.now);
    }
    assert_eq!(p.x.core.stats().circuits, 1);

    // The other circuit may queue up to the limit too, and works.
    p.flood_x(&mut good, limit);
    assert_eq!(p.r.core.stats().circuits, 1);
    assert_eq!(p.r_to_x(), limit);
    assert!(p.x_answers(&mut good, 1));
    assert_eq!(p.x.core.stats().circuits_killed, 0);
}

#[test]
fn circuits_per_channel_limit_refuses_create2_with_resourcelimit() {
    let mut p = Path::new(CoreConfig {
        max_circuits_per_channel: 3,
        ..CoreConfig::default()
    });
    let first = p.create();
    p.create();
    p.create();
    let (refused, _) = p.send_create();
    assert_eq!(
        destroys(&p.cells_for_client()),
        [(refused, DestroyReason::RESOURCELIMIT)]
    );
    assert_eq!(p.r.core.stats().circuits, 3);
    assert_eq!(p.r.core.stats().circuits_killed, 0);

    // Closing one makes room for one.
    let body = Destroy {
        reason: DestroyReason::FINISHED,
    }
    .encode();
    let destroy = Cell::new(first.id, CellCommand::DESTROY, &body).unwrap();
    p.r.core.handle_cell(R_CLIENT, destroy, p.now);
    assert_eq!(p.r.core.stats().circuits, 2);
    p.create();
    assert_eq!(p.r.core.stats().circuits, 3);
}

/// Feed a stream's socket bytes the way a driver does: only as much as the core granted.
/// Returns how many bytes went in.
fn feed_granted(p: &mut Path, stream: StreamHandle, data: &[u8], sent: &mut usize) -> usize {
    let start = *sent;
    while let Some(ev) = p.r.core.poll_event() {
        let Event::StreamReadCredit { stream: s, bytes } = ev else {
            panic!("unexpected event {ev:?}");
        };
        assert_eq!(s, stream);
        let end = (*sent + bytes).min(data.len());
        p.r.core.stream_data(stream, &data[*sent..end], p.now);
        *sent = end;
    }
    *sent - start
}

/// An exit stream with more data than its circuit's channel takes: packaging stops once the
/// circuit queue holds 256 cells (then no more read credit is granted), stays stopped while the
/// queue drains down to 65, and resumes when it reaches 64. No byte is lost or reordered.
#[test]
fn packaging_stops_at_highwater_and_resumes_at_lowwater() {
    let mut p = Path::new(CoreConfig {
        exit: true,
        ..CoreConfig::default()
    });
    let mut circ = p.create();
    p.send(
        &mut circ,
        0,
        RelayCommand::BEGIN,
        1,
        b"127.0.0.1:80\0",
        false,
    );
    let Some(Event::ExitConnect { stream, .. }) = p.r.core.poll_event() else {
        panic!("no ExitConnect");
    };
    p.r.core
        .exit_connected(stream, ([127, 0, 0, 1], 80).into(), p.now);
    assert_eq!(p.read(&mut circ)[0].cmd, RelayCommand::CONNECTED);

    let data: Vec<u8> = (0..400 * 498).map(|i| (i % 251) as u8).collect();
    let mut sent = 0;
    assert!(feed_granted(&mut p, stream, &data, &mut sent) > HIGHWATER * 498);
    assert_eq!(p.r.core.stats().queued_cells, HIGHWATER);
    assert!(
        p.r.core.poll_event().is_none(),
        "no credit above high-water"
    );

    let mut out = Vec::new();
    p.r.core
        .poll_transmit(R_CLIENT, HIGHWATER - LOWWATER - 1, p.now, &mut out);
    assert_eq!(p.r.core.stats().queued_cells, LOWWATER + 1);
    assert!(
        p.r.core.poll_event().is_none(),
        "still stopped above low-water"
    );

    p.r.core.poll_transmit(R_CLIENT, 1, p.now, &mut out);
    let refilled = p.r.core.stats().queued_cells;
    assert!(
        refilled > LOWWATER,
        "packaging resumed at low-water: {refilled} queued"
    );
    // The pending bytes went into the queue, so the stream may read again.
    assert!(feed_granted(&mut p, stream, &data, &mut sent) > 0);

    // Everything the client receives is the stream's bytes, in order.
    out.extend(drain(&mut p.r.core, R_CLIENT, p.now));
    let mut got = Vec::new();
    for cell in &out {
        let msg = open(&mut circ, cell);
        assert_eq!((msg.cmd, msg.sid), (RelayCommand::DATA, 1));
        got.extend(msg.data);
    }
    assert!(got.len() > (HIGHWATER + LOWWATER) * 498);
    assert_eq!(got, data[..got.len()]);
}
