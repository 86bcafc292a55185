//! Relayed cells from their wire bytes (`Core::handle_cell_wire`, what the node's driver calls):
//! a relay passing a cell on copies it once, from the read buffer into its slot in the circuit
//! queue it leaves by, and applies its onion layer there. Checked here: such cells arrive as
//! sent in both directions, interleaved with cells taken by value (one crypto state for both
//! paths, one queue order), the in-place count is exactly the cells passed on, and a cell
//! recognized at the relay takes its slot back instead of being passed on.

use crate::common::{self, Path};

use chive_cell::{Cell, CellCommand, RelayCommand};
use chive_core::{CoreConfig, Event};

/// What X's exit writes to its stream's socket, in order, and how many DATA cells it came in.
fn written_at_x(p: &mut Path) -> (Vec<u8>, u32) {
    let mut out = Vec::new();
    let mut cells = 0;
    while let Some(e) = p.x.core.poll_event() {
        if let Event::StreamWrite { data, cells: n, .. } = e {
            out.extend_from_slice(&data);
            cells += n;
        }
    }
    (out, cells)
}

#[test]
fn cells_passed_on_in_place_arrive_as_sent_both_ways() {
    let mut p = Path::new(CoreConfig::default());
    let (mut circ, stream) = p.circuit_with_stream();
    let before = p.r.core.stats().cells_in_place;

    // Forward: client -> R (by value and by wire bytes, interleaved) -> X.
    let bodies: Vec<Vec<u8>> = (0..24u8).map(|i| vec![i; 50 + usize::from(i)]).collect();
    for (i, body) in bodies.iter().enumerate() {
        if i % 2 == 0 {
            p.send_wire(&mut circ, 1, RelayCommand::DATA, 1, body);
        } else {
            p.send(&mut circ, 1, RelayCommand::DATA, 1, body, false);
        }
    }
    assert_eq!(p.r_to_x(), bodies.len());
    assert_eq!(
        written_at_x(&mut p),
        (bodies.concat(), 24),
        "X reads the bodies in order"
    );
    let forward = p.r.core.stats().cells_in_place - before;
    assert_eq!(
        forward, 12,
        "the cells handed over as wire bytes are passed on in place"
    );

    // Backward: X -> R (wire bytes: `carry`) -> client.
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let now = p.now;
    p.x.core.stream_data(stream, &data, now);
    let cells = p.x_to_r();
    assert!(cells >= 10, "X packaged {cells} cells");
    let msgs = p.read(&mut circ);
    let got: Vec<u8> = msgs
        .iter()
        .filter(|m| m.cmd == RelayCommand::DATA)
        .flat_map(|m| m.data.iter().copied())
        .collect();
    assert_eq!(got, data, "the client reads X's bytes in order");
    let backward = p.r.core.stats().cells_in_place - before - forward;
    assert_eq!(
        backward as usize, cells,
        "every backward cell passed on in place"
    );
}

#[test]
fn a_cell_recognized_at_the_relay_takes_its_slot_back() {
    let mut p = Path::new(CoreConfig::default());
    let (mut circ, _) = p.circuit_with_stream();
    let before = p.r.core.stats();
    // Addressed to R (hop 0): recognized there, not passed on to X.
    p.send_wire(&mut circ, 0, RelayCommand::DROP, 0, b"for R");
    let after = p.r.core.stats();
    assert_eq!(after.cells_received, before.cells_received + 1);
    assert_eq!(after.cells_in_place, before.cells_in_place);
    assert_eq!(after.queued_cells, 0, "nothing queued toward X");
    assert_eq!(
        after.queue_buffer_cells, before.queue_buffer_cells,
        "the slot's buffer is given back"
    );
    assert_eq!(p.r_to_x(), 0);
    // The circuit still works after it: the next cell for X arrives.
    p.send_wire(&mut circ, 1, RelayCommand::DATA, 1, b"after");
    assert_eq!(p.r_to_x(), 1);
    assert_eq!(written_at_x(&mut p), (b"after".to_vec(), 1));
}

#[test]
fn cells_for_unknown_circuits_take_the_decoded_path() {
    let mut p = Path::new(CoreConfig::default());
    let (circ, _) = p.circuit_with_stream();
    let before = p.r.core.stats();
    // An unknown circuit id: dropped, as by `handle_cell`.
    let cell = Cell::new(circ.id ^ 0x1234, CellCommand::RELAY, b"lost").unwrap();
    let mut scratch = common::blank_cell();
    let now = p.now;
    p.r.core
        .handle_cell_wire(common::R_CLIENT, &common::wire_of(&cell), &mut scratch, now);
    assert_eq!(p.r_to_x(), 0);
    let after = p.r.core.stats();
    assert_eq!(after.cells_in_place, before.cells_in_place);
    assert_eq!(after.cells_received, before.cells_received + 1);
}

#[test]
fn a_run_of_one_streams_data_cells_is_one_write_of_at_most_the_bound() {
    use chive_core::STREAM_WRITE_MAX_CELLS;
    let mut p = Path::new(CoreConfig::default());
    let (mut circ, _stream) = p.circuit_with_stream();
    let n = STREAM_WRITE_MAX_CELLS as usize + 2;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 100]).collect();
    for body in &bodies {
        p.send_wire(&mut circ, 1, RelayCommand::DATA, 1, body);
    }
    assert_eq!(p.r_to_x(), n);
    let mut writes = Vec::new();
    while let Some(e) = p.x.core.poll_event() {
        if let Event::StreamWrite { data, cells, .. } = e {
            writes.push((data, cells));
        }
    }
    let counts: Vec<u32> = writes.iter().map(|w| w.1).collect();
    assert_eq!(
        counts,
        vec![STREAM_WRITE_MAX_CELLS, 2],
        "one write per run, cut at the bound"
    );
    let bytes: Vec<u8> = writes.into_iter().flat_map(|w| w.0).collect();
    assert_eq!(bytes, bodies.concat(), "in order, nothing lost");

    // Once the driver has taken the events, the next cell starts a write of its own.
    p.send_wire(&mut circ, 1, RelayCommand::DATA, 1, b"next");
    assert_eq!(p.r_to_x(), 1);
    assert_eq!(written_at_x(&mut p), (b"next".to_vec(), 1));
}
