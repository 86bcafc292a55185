//! A relay's own `CircuitWindow` end to end: exits packaging with 101 cells (paper 004's
//! window) instead of the consensus's 1000 still deliver a multi-window download byte-exact.

use crate::common;
use common::*;

#[test]
fn relays_with_their_own_circuit_window_deliver_byte_exact() {
    let net = Network::start("circwindow", ["CircuitWindow = 101"; 3]);
    // 1 MB is about 2000 cells: twenty windows of 101, each waiting for a SENDME.
    let body = fetch(net.socks, net.http, 1_000_000, None).unwrap();
    assert!(body == pattern(1_000_000), "1 MB download differs");
}
