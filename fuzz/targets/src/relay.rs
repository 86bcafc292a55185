//! Target `relay_msg`: the relay cell payload ([`parse_relay`]) and every message body parser in
//! chive-cell's `msg` (relay, circuit and link messages), and the extension list ntor v3
//! carries in CREATE2/CREATED2 (`CircExt`), and chive's LEG_PROBE (`LegProbe`, session 20).

use chive_cell::{
    parse_relay, relay_payload, Authenticate, Begin, Bind, CircExt, Connected, Create2, Created2,
    Destroy, End, Extend2, Extended2, Handoff, LegProbe, LinkFeatures, RelayCommand, Resolve,
    Resolved, Sendme, Versions, PAYLOAD_LEN,
};

/// The message kinds, selected by the input's first byte (modulo their count); the rest of the
/// input is the body. Kind 0 is a whole decrypted relay payload, dispatched on its command as
/// a relay does.
pub const KINDS: &[&str] = &[
    "relay_payload",
    "create2",
    "created2",
    "extended2",
    "destroy",
    "extend2",
    "begin",
    "connected",
    "end",
    "sendme",
    "resolve",
    "resolved",
    "versions",
    "link_features",
    "bind",
    "handoff",
    "authenticate",
    "ntor3_extensions",
    "leg_probe",
];

/// See [`KINDS`]. Property: every successful decode round-trips through its encoder; a relay
/// payload's header fields and data survive [`relay_payload`].
pub fn relay_msg(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match usize::from(kind) % KINDS.len() {
        0 => relay(body),
        k => message(k, body),
    }
}

fn message(kind: usize, body: &[u8]) {
    match kind {
        1 => round_trip!(Create2, body, fallible),
        2 => round_trip!(Created2, body, fallible),
        3 => round_trip!(Extended2, body, fallible),
        4 => round_trip!(Destroy, body),
        5 => round_trip!(Extend2, body, fallible),
        6 => round_trip!(Begin, body, fallible),
        7 => round_trip!(Connected, body),
        8 => round_trip!(End, body),
        9 => round_trip!(Sendme, body),
        10 => round_trip!(Resolve, body, fallible),
        11 => round_trip!(Resolved, body, fallible),
        12 => round_trip!(Versions, body),
        13 => round_trip!(LinkFeatures, body),
        14 => round_trip!(Bind, body),
        15 => round_trip!(Handoff, body),
        16 => round_trip!(Authenticate, body),
        17 => {
            // Strict format (no trailing bytes, unknown fields kept): an exact round trip.
            if let Ok(exts) = CircExt::decode_list(body) {
                let again = CircExt::encode_list(&exts).expect("a decoded list encodes");
                assert_eq!(again, body, "ntor v3 extensions round-trip");
            }
        }
        18 => {
            // Exactly 8 bytes or an error: what decodes re-encodes to the same bytes.
            if let Ok(p) = LegProbe::decode(body) {
                assert_eq!(p.encode(), body, "LEG_PROBE round-trips exactly");
            }
        }
        _ => unreachable!("kind is taken modulo KINDS.len()"),
    }
}

fn relay(body: &[u8]) {
    let mut payload = [0u8; PAYLOAD_LEN];
    let n = body.len().min(PAYLOAD_LEN);
    payload[..n].copy_from_slice(&body[..n]);
    let Ok(view) = parse_relay(&payload) else {
        return;
    };
    let rebuilt = relay_payload(view.command, view.stream_id, view.data)
        .expect("parsed relay data must fit a relay payload");
    let again = parse_relay(&rebuilt).expect("rebuilt relay payload must parse");
    assert_eq!(
        (again.command, again.stream_id, again.data),
        (view.command, view.stream_id, view.data)
    );
    // What a relay would do with the message body next.
    let kind = match view.command {
        RelayCommand::BEGIN => 6,
        RelayCommand::END => 8,
        RelayCommand::CONNECTED => 7,
        RelayCommand::SENDME => 9,
        RelayCommand::RESOLVE => 10,
        RelayCommand::RESOLVED => 11,
        RelayCommand::EXTEND2 => 5,
        RelayCommand::EXTENDED2 => 3,
        RelayCommand::TRUNCATED => 4,
        RelayCommand::LEG_PROBE => 18,
        _ => return,
    };
    message(kind, view.data);
}
