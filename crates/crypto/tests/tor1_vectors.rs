//! `tor1` relay crypto against C tor's own output.
//!
//! The vectors (tests/data/tor1_outbound_cells.txt) are cells that C tor's relay crypto
//! produced for a three-hop circuit whose hops were keyed with the three 72-byte key strings of
//! tor's `test_relaycrypt.c`; Arti's tor-proto checks its implementation against the same
//! data. The plaintext cells come from a SHAKE-256 stream seeded with a fixed sentence, so they
//! can be regenerated here: cell `n` is a RELAY_DATA cell (command 2, stream 1, length 498)
//! whose 498 data bytes are the stream's next 498 bytes, originated by the client for the third
//! hop. Matching byte for byte checks the key split (Df | Db | Kf | Kb), AES-128-CTR with a zero
//! IV across cells, the running SHA-1 digest seeded with Df, and the layer order.

use chive_crypto::ntor::KeyMaterial;
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
use sha3::digest::{ExtendableOutput, Update, XofReader};

const PAYLOAD_LEN: usize = 509;

/// The key material of the three hops, as tor's test sets them up (72 bytes each).
const HOP_KEYS: [&[u8; 72]; 3] = [
    b"    'My public key is in this signed x509 object', said Tom assertively.",
    b"'Let's chart the pedal phlanges in the tomb', said Tom cryptographically",
    b"     'Segmentation fault bugs don't _just happen_', said Tom seethingly.",
];

/// Seed of the SHAKE-256 stream that fills the cells' data.
const XOF_SEED: &[u8] = b"'You mean to tell me that there's a version of Sha-3 with no limit on the output length?', said Tom shakily.";

/// Cells checked by the vectors.
const CELLS: usize = 51;

fn vectors() -> Vec<(usize, Vec<u8>)> {
    include_str!("data/tor1_outbound_cells.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (n, hex) = l.split_once(' ').expect("line is '<n> <hex>'");
            let bytes = hex::decode(hex.trim()).expect("hex payload");
            assert_eq!(
                bytes.len(),
                PAYLOAD_LEN,
                "vector for cell {n} has the wrong length"
            );
            (n.parse().expect("cell number"), bytes)
        })
        .collect()
}

fn key_material(i: usize) -> KeyMaterial {
    KeyMaterial::from_tor1_keys(HOP_KEYS[i])
}

/// The plaintext relay cells the vectors were made from, in order.
fn plaintext_cells() -> Vec<[u8; PAYLOAD_LEN]> {
    let mut xof = sha3::Shake256::default();
    xof.update(XOF_SEED);
    let mut stream = xof.finalize_xof();
    (0..CELLS)
        .map(|_| {
            let mut body = [0u8; PAYLOAD_LEN];
            body[0] = 2; // RELAY_DATA
            body[4] = 1; // stream id 1 (bytes 3..5)
            body[9..11].copy_from_slice(&498u16.to_be_bytes()); // length
            stream.read(&mut body[11..]);
            body
        })
        .collect()
}

#[test]
fn client_encryption_matches_c_tor() {
    let vectors = vectors();
    assert_eq!(vectors.len(), 8, "every published vector is checked");
    let mut circuit = ClientCircuitCrypto::new();
    for i in 0..3 {
        circuit.push_hop(ClientHopCrypto::new(&key_material(i)));
    }
    let mut checked = 0;
    for (n, mut cell) in plaintext_cells().into_iter().enumerate() {
        circuit
            .encrypt_to(2, &mut cell)
            .expect("the circuit has three hops");
        if let Some((_, expected)) = vectors.iter().find(|(v, _)| *v == n) {
            assert_eq!(
                hex::encode(cell),
                hex::encode(expected),
                "cell {n} differs from C tor's"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, vectors.len());
}

#[test]
fn relays_peel_c_tor_cells_and_only_the_exit_recognizes_them() {
    let vectors = vectors();
    let plain = plaintext_cells();
    let mut relays: Vec<RelayHopCrypto> = (0..3)
        .map(|i| RelayHopCrypto::new(&key_material(i)))
        .collect();
    // The relays' keystreams and digests run across all cells, so every cell is fed in order;
    // the cells that have no vector are re-made with our own client, which the test above
    // shows to agree with C tor on the ones that do.
    let mut client = ClientCircuitCrypto::new();
    for i in 0..3 {
        client.push_hop(ClientHopCrypto::new(&key_material(i)));
    }
    for (n, original) in plain.iter().enumerate() {
        let mut ours = *original;
        client.encrypt_to(2, &mut ours).expect("three hops");
        let mut cell: [u8; PAYLOAD_LEN] = match vectors.iter().find(|(v, _)| *v == n) {
            Some((_, tor)) => tor.as_slice().try_into().expect("509 bytes"),
            None => ours,
        };
        assert!(
            !relays[0].decrypt_forward(&mut cell),
            "guard recognized cell {n}"
        );
        assert!(
            !relays[1].decrypt_forward(&mut cell),
            "middle recognized cell {n}"
        );
        assert!(
            relays[2].decrypt_forward(&mut cell),
            "exit did not recognize cell {n}"
        );
        // What the exit reads is the plaintext with the digest field the client wrote.
        assert_eq!(cell[..5], original[..5]);
        assert_eq!(cell[9..], original[9..]);
    }
}
