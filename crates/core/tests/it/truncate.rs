//! TRUNCATE at a relay: the circuit's next hop is torn down (DESTROY, cells queued for it
//! dropped), the client gets TRUNCATED, and the circuit stays usable up to this relay.

use crate::common;

use chive_cell::{DestroyReason, RelayCommand};
use chive_core::CoreConfig;
use common::{destroys, drain, Msg, Path, R_TO_X};

#[test]
fn truncate_destroys_the_next_hop_and_answers_truncated() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    // Cells for X wait in R's queue (the channel to X does not drain).
    for _ in 0..5 {
        p.send(&mut circ, 1, RelayCommand::DROP, 0, &[], false);
    }
    assert_eq!(p.r.core.stats().queued_cells, 5);

    p.send(&mut circ, 0, RelayCommand::TRUNCATE, 0, &[], false);
    // Only the TRUNCATED toward the client is queued now; the five cells for X are gone.
    assert_eq!(p.r.core.stats().queued_cells, 1);
    let to_x = drain(&mut p.r.core, R_TO_X, p.now);
    assert_eq!(to_x.len(), 1, "only a DESTROY goes to X: {to_x:?}");
    let [(_, reason)] = destroys(&to_x)[..] else {
        panic!("expected one DESTROY: {to_x:?}");
    };
    assert_eq!(reason, DestroyReason::REQUESTED);
    for cell in to_x {
        p.x.core.handle_cell(common::X_FROM_R, cell, p.now);
    }
    assert_eq!(p.x.core.stats().circuits, 0, "X forgot the circuit");

    assert_eq!(
        p.read(&mut circ),
        [Msg {
            hop: 0,
            cmd: RelayCommand::TRUNCATED,
            sid: 0,
            data: vec![DestroyReason::REQUESTED.0],
        }]
    );
    // R keeps the circuit, and it extends again.
    assert_eq!(p.r.core.stats().circuits, 1);
    assert_eq!(p.r.core.stats().circuits_killed, 0);
    circ.crypto.truncate(1);
    let state = p.send_extend2(&mut circ, true);
    p.finish_extend(&mut circ, state);
    p.send_begin_to_x(&mut circ, 1, false);
    assert!(matches!(
        p.x.core.poll_event(),
        Some(chive_core::Event::ExitConnect { port: 80, .. })
    ));
    assert_eq!(p.x.core.stats().circuits, 1);
}

#[test]
fn truncate_without_a_next_hop_only_answers() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create();
    p.send(&mut circ, 0, RelayCommand::TRUNCATE, 0, &[], false);
    assert_eq!(p.r_to_x(), 0);
    let msgs = p.read(&mut circ);
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].cmd, RelayCommand::TRUNCATED);
    assert_eq!(p.r.core.stats().circuits, 1);
}

#[test]
fn cells_from_the_old_next_hop_are_not_passed_back() {
    let mut p = Path::new(CoreConfig::default());
    let mut circ = p.create2();
    // X answers a BEGIN, but R truncates before the answer arrives.
    p.send_begin_to_x(&mut circ, 1, false);
    p.connect_at_x();
    p.send(&mut circ, 0, RelayCommand::TRUNCATE, 0, &[], false);
    assert_eq!(p.x_to_r(), 1, "X's CONNECTED is in flight");
    let msgs = p.read(&mut circ);
    let cmds: Vec<RelayCommand> = msgs.iter().map(|m| m.cmd).collect();
    assert_eq!(cmds, [RelayCommand::TRUNCATED]);
    assert_eq!(p.r.core.stats().circuits, 1);
}
