//! A circuit with both ends on one channel: client → R → X → R, X extending back to the relay
//! it came from (tor-spec does not forbid it; Tor's client never builds it, a client of its own
//! may). X must tell the directions apart by circuit id, not by channel alone.

use crate::common;

use chive_cell::{CellCommand, DestroyReason, RelayCommand};
use chive_core::CoreConfig;
use common::{destroys, Circ, Path};

/// client → R → X → R, built.
fn loop_path(p: &mut Path) -> Circ {
    let mut circ = p.create2();
    let r = p.r.hop.clone();
    let state = p.send_extend2_to(&mut circ, 1, &r, true);
    assert_eq!(p.r_to_x(), 1, "R passes the EXTEND2 to X");
    assert_eq!(p.x_to_r(), 1, "X sends CREATE2 back to R");
    assert_eq!(p.r_to_x(), 1, "R answers CREATED2");
    assert_eq!(p.x_to_r(), 1, "X sends EXTENDED2 toward the client");
    let msgs = p.read(&mut circ);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0].hop, 1);
    Path::add_hop(&mut circ, state, &msgs[0]);
    circ
}

#[test]
fn cells_from_the_third_hop_reach_the_client() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = loop_path(&mut p);
    assert_eq!(p.x.core.stats().circuits, 1);
    assert_eq!(p.r.core.stats().circuits, 2);
    // R is no exit: as the third hop it refuses a BEGIN with END, which travels back through X.
    p.send(
        &mut circ,
        2,
        RelayCommand::BEGIN,
        1,
        b"127.0.0.1:80\0",
        false,
    );
    for _ in 0..3 {
        p.r_to_x();
        p.x_to_r();
    }
    let msgs = p.read(&mut circ);
    let got: Vec<(usize, RelayCommand)> = msgs.iter().map(|m| (m.hop, m.cmd)).collect();
    assert_eq!(got, [(2, RelayCommand::END)]);
    let killed: u64 = [&p.r, &p.x]
        .iter()
        .map(|n| n.core.stats().circuits_killed)
        .sum();
    assert_eq!(killed, 0);
}

/// R, as the third hop, kills its circuit; X gets the DESTROY on the channel that also holds the
/// circuit's other end, and passes it on there toward the client.
#[test]
fn destroy_from_the_next_hop_goes_on_to_the_previous_one() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = loop_path(&mut p);
    // A protocol violation at the third hop: EXTEND2 not in RELAY_EARLY.
    let x = p.x.hop.clone();
    p.send_extend2_to(&mut circ, 2, &x, false);
    for _ in 0..3 {
        p.r_to_x();
        p.x_to_r();
    }
    assert_eq!(p.x.core.stats().circuits, 0);
    assert_eq!(
        p.r.core.stats().circuits,
        0,
        "both of R's circuits are gone"
    );
    let to_client = p.cells_for_client();
    assert_eq!(
        destroys(&to_client),
        [(circ.id, DestroyReason::PROTOCOL)],
        "{to_client:?}"
    );
    assert!(to_client.iter().all(|c| c.command == CellCommand::DESTROY));
}
