//! Target `cell`: cell framing as a link reader sees it ([`decode_cell`] over a byte stream,
//! [`Cell::decode`], [`chive_cell::VarCell`]).

use chive_cell::{decode_cell, AnyCell, Cell, CELL_LEN, VAR_CELL_HEADER_LEN};

/// Frame `data` into cells until it runs out. Properties: every decoded cell re-encodes to
/// exactly the bytes it was decoded from; "need more bytes" is only answered when the buffer
/// really holds less than one cell; [`Cell::decode`] accepts exactly 514-byte inputs with a
/// fixed-cell command and re-encodes them unchanged.
pub fn cell(data: &[u8]) {
    let mut rest = data;
    let mut out = Vec::new();
    loop {
        match decode_cell(rest) {
            Ok(Some((cell, used))) => {
                assert!(
                    used > 0 && used <= rest.len(),
                    "consumed {used} of {}",
                    rest.len()
                );
                out.clear();
                cell.encode_into(&mut out)
                    .expect("a decoded cell must encode");
                assert_eq!(
                    out,
                    &rest[..used],
                    "re-encoding differs from the wire bytes"
                );
                if let AnyCell::Fixed(c) = &cell {
                    let again = Cell::decode(&out).expect("fixed cell must decode again");
                    assert_eq!((again.circ_id, again.command), (c.circ_id, c.command));
                    assert_eq!(again.payload, c.payload);
                }
                rest = &rest[used..];
            }
            Ok(None) => {
                assert!(rest.len() < needed(rest), "None with a whole cell buffered");
                break;
            }
            Err(_) => break,
        }
    }

    match Cell::decode(data) {
        Ok(c) => {
            assert_eq!(data.len(), CELL_LEN);
            assert!(!c.command.is_variable());
            out.clear();
            c.encode_into(&mut out);
            assert_eq!(out, data);
        }
        Err(_) => {
            assert!(data.len() != CELL_LEN || data.get(4).is_some_and(|&b| b == 7 || b >= 128))
        }
    }
}

/// Bytes a cell starting at `buf` needs, from its header (or the header length if that is not
/// complete yet).
fn needed(buf: &[u8]) -> usize {
    match buf.get(4) {
        None => 5,
        Some(&cmd) if cmd == 7 || cmd >= 128 => match buf.get(5..7) {
            Some(l) => VAR_CELL_HEADER_LEN + usize::from(u16::from_be_bytes([l[0], l[1]])),
            None => VAR_CELL_HEADER_LEN,
        },
        Some(_) => CELL_LEN,
    }
}
