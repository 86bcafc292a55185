//! Target `tls_records`: the own TLS record layer's reader (`LinkRecordLayer = own`) on the
//! bytes a peer sends after the handshake, through `chive_net::fuzzing::open_records`.
//!
//! First byte, bit 0: 1 = the rest is a *change* to a genuine stream of records (three
//! application-data records and a close_notify, sealed under the same fixed keys): XORed in byte
//! by byte and, past its end, appended; bit 7 cuts the stream to the input's length. 0 = the rest
//! is the stream itself. Properties: no panic; what is delivered is always a prefix of the
//! genuine plaintext (a record that was changed is refused, never opened to other bytes); the
//! unchanged stream (with anything after it) delivers all of it and the close_notify; a
//! close_notify is only ever opened after everything. The same holds for a stream of the fuzzer's
//! own bytes: it cannot forge an AES-GCM tag, so all it can open are genuine records it copied
//! (libFuzzer learns them from the comparisons below: its first run found exactly that).

use chive_net::fuzzing::{open_records, seal_records};

use crate::changed;

const PLAINTEXTS: [&[u8]; 3] = [b"first record: a VERSIONS cell", &[0x42; 600], b""];

/// The fuzz target.
pub fn tls_records(data: &[u8]) {
    let Some((&select, input)) = data.split_first() else {
        return;
    };
    let genuine = seal_records(&PLAINTEXTS);
    let whole: Vec<u8> = PLAINTEXTS.concat();
    let stream = if select & 1 == 0 {
        input.to_vec()
    } else {
        changed(&genuine, input, select & 0x80 != 0)
    };
    let (delivered, closed) = open_records(&stream);
    assert!(
        whole.starts_with(&delivered),
        "delivered bytes that were not sealed"
    );
    if stream.starts_with(&genuine) {
        assert_eq!(delivered, whole, "the genuine stream delivers everything");
        assert!(closed, "the genuine stream ends with close_notify");
    } else if closed {
        assert_eq!(delivered, whole, "closed before everything was delivered");
    }
}

/// Seeds: the genuine stream, a flipped byte in each record, a cut stream, raw junk.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let len = seal_records(&PLAINTEXTS).len();
    let mut out = vec![
        ("genuine".to_string(), vec![1]),
        ("genuine-then-junk".to_string(), {
            let mut v = vec![1];
            v.extend(std::iter::repeat_n(0, len));
            v.extend_from_slice(&[23, 3, 3, 0, 40]);
            v
        }),
        ("cut-mid-record".to_string(), {
            let mut v = vec![0x81];
            v.extend(std::iter::repeat_n(0, 70));
            v
        }),
        ("raw-header".to_string(), vec![0, 23, 3, 3, 0, 17, 1, 2, 3]),
        ("raw-bad-type".to_string(), vec![0, 22, 3, 3, 0, 20]),
    ];
    for at in [3usize, 10, 60, 700] {
        let mut v = vec![1];
        v.extend(std::iter::repeat_n(0, at));
        v.push(0x10);
        out.push((format!("flip-at-{at}"), v));
    }
    out
}
