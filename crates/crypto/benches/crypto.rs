//! Per-cell cost of tor1 relay crypto and the cost of one ntor handshake.
//!
//! Run with `cargo bench -p chive-benches --bench crypto`. Times are the bench thread's CPU time (cpu_time.rs).

use std::hint::black_box;

use chive_crypto::ntor::{
    client_create, client_finish, server_handshake, KeyMaterial, NtorSecretKey,
};
use chive_crypto::relay::{ClientCircuitCrypto, ClientHopCrypto, RelayHopCrypto};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sha1::{Digest, Sha1};

#[path = "support/cpu_time.rs"]
mod cpu_time;
use cpu_time::ThreadCpuTime;

/// Deterministic, distinct key material per hop (benchmarks need no real handshake).
fn km(seed: u8) -> KeyMaterial {
    let mut k = [0u8; 72];
    for (i, b) in k.iter_mut().enumerate() {
        *b = seed.wrapping_mul(37).wrapping_add(i as u8);
    }
    KeyMaterial::from_tor1_keys(&k)
}

fn relay_crypto(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("relay_cell");
    g.throughput(Throughput::Bytes(509));

    // A relay stripping its layer from a cell that is not for it (the common case in the
    // middle of a circuit): AES over 509 bytes plus the `recognized` check.
    let mut relay = RelayHopCrypto::new(&km(1));
    let mut cell = [0x5Au8; 509];
    g.bench_function("relay_decrypt_forward_passthrough", |b| {
        b.iter(|| black_box(relay.decrypt_forward(black_box(&mut cell))))
    });

    // A relay checking a cell that is for it: AES + SHA-1 over 509 bytes. The client side runs
    // in step so that every cell is recognized.
    let mut client = ClientHopCrypto::new(&km(2));
    let mut relay = RelayHopCrypto::new(&km(2));
    g.bench_function("relay_decrypt_forward_recognized", |b| {
        b.iter(|| {
            let mut p = [0u8; 509];
            client.originate_forward(&mut p);
            black_box(relay.decrypt_forward(&mut p))
        })
    });

    let mut relay = RelayHopCrypto::new(&km(3));
    g.bench_function("relay_originate_backward", |b| {
        b.iter(|| {
            let mut p = [0u8; 509];
            black_box(relay.originate_backward(&mut p))
        })
    });

    let mut relay = RelayHopCrypto::new(&km(4));
    let mut cell = [0x33u8; 509];
    g.bench_function("relay_encrypt_backward", |b| {
        b.iter(|| relay.encrypt_backward(black_box(&mut cell)))
    });

    let mut circ = ClientCircuitCrypto::new();
    for i in 0..3 {
        circ.push_hop(ClientHopCrypto::new(&km(10 + i)));
    }
    g.bench_function("client_3hop_encrypt_to_exit", |b| {
        b.iter(|| {
            let mut p = [0u8; 509];
            black_box(circ.encrypt_to(2, &mut p))
        })
    });

    // The client receiving a download: the exit originated each cell (AES + SHA-1) and the
    // middle and guard each added a layer; the client peels three layers and checks the digest.
    // The relays' side runs in the (untimed) setup, cell by cell in order so keystreams match.
    let mut exit = RelayHopCrypto::new(&km(22));
    let mut middle = RelayHopCrypto::new(&km(21));
    let mut guard = RelayHopCrypto::new(&km(20));
    let mut circ = ClientCircuitCrypto::new();
    for i in 0..3 {
        circ.push_hop(ClientHopCrypto::new(&km(20 + i)));
    }
    g.bench_function("client_3hop_decrypt_from_exit", |b| {
        b.iter_batched(
            || {
                let mut p = [0x11u8; 509];
                exit.originate_backward(&mut p);
                middle.encrypt_backward(&mut p);
                guard.encrypt_backward(&mut p);
                p
            },
            |mut p| {
                let hop = circ.decrypt_from_any(&mut p).map(|(hop, _)| hop);
                assert_eq!(hop, Some(2));
                hop
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The SHA-1 floor of an edge's running digest on this CPU (`sha1` crate, SHA-NI when the CPU
/// has it, as the relays run it). `block_64` and `blocks_8k` feed a hasher whole blocks (64 bytes
/// per call: one compression per call; 8 KiB per call: 128 compressions in one call, the
/// compression function's own speed), beside one cell's running digest as `relay.rs` computes
/// it (extend the hasher by the 509-byte payload, finalize a clone for the digest field). With a
/// 20-byte seed a cell costs 9.08 compressions on average (7.95 blocks of data, 1.125 of
/// padding: two padding blocks when 56..63 bytes are left over, 8 offsets of 64), so
/// `running_digest_cell` ÷ (`blocks_8k` ÷ 128) near 9 means the digest is compression-bound.
fn sha1_floor(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("sha1_floor");
    let block = [0x5Au8; 64];
    let mut hasher = Sha1::new();
    g.throughput(Throughput::Bytes(64));
    g.bench_function("block_64", |b| b.iter(|| hasher.update(black_box(&block))));
    let blocks = [0x5Au8; 8192];
    g.throughput(Throughput::Bytes(8192));
    g.bench_function("blocks_8k", |b| {
        b.iter(|| hasher.update(black_box(&blocks)))
    });
    black_box(hasher.finalize());

    g.throughput(Throughput::Bytes(509));
    let cell = [0x33u8; 509];
    let mut hasher = Sha1::new();
    hasher.update([7u8; 20]);
    g.bench_function("running_digest_cell", |b| {
        b.iter(|| {
            hasher.update(black_box(&cell));
            let d: [u8; 20] = hasher.clone().finalize().into();
            d
        })
    });
    g.finish();
}

/// The onion layer's cipher alone, one 509-byte cell per call (the stream continuing across
/// calls, as on a circuit): each chive-aes-ctr implementation this CPU runs, and RustCrypto's
/// `aes` + `ctr` that chive used before (`aes_ctr_crates`). `relay_cell/relay_encrypt_backward`
/// is the same work through `RelayHopCrypto`.
fn onion_cipher(c: &mut Criterion<ThreadCpuTime>) {
    use aes::cipher::{KeyIvInit, StreamCipher};
    use chive_aes_ctr::{Aes128Ctr, Impl};
    let mut g = c.benchmark_group("onion_cipher");
    g.throughput(Throughput::Bytes(509));
    let key = [0x42u8; 16];
    let mut cell = [0x33u8; 509];
    for imp in [Impl::Vaes, Impl::AesNi, Impl::Soft] {
        let Some(mut ctr) = Aes128Ctr::with_impl(&key, &[0; 16], imp) else {
            continue;
        };
        g.bench_function(format!("{imp:?}").to_lowercase(), |b| {
            b.iter(|| ctr.apply_keystream(black_box(&mut cell)))
        });
    }
    let mut ctr = ctr::Ctr128BE::<aes::Aes128>::new(&key.into(), &[0; 16].into());
    g.bench_function("aes_ctr_crates", |b| {
        b.iter(|| ctr.apply_keystream(black_box(&mut cell)))
    });
    g.finish();
}

/// What fusing a client's three onion layers into one pass over the cell could save (issue
/// 20): the three layers as the client removes them now (`three_passes`: three ciphers, each
/// over the 509-byte cell), the same AES blocks in one call (`one_call_1527`: one cipher over
/// three cells' bytes), and one pass of XOR over the cell with a keystream already made
/// (`xor_pass_509`: the load, XOR and store a fused pass would save twice). A fused pass still
/// makes three keystreams: it saves at most the calls' overhead (`three_passes` −
/// `one_call_1527`) and two `xor_pass_509`.
fn onion_layers(c: &mut Criterion<ThreadCpuTime>) {
    use chive_aes_ctr::Aes128Ctr;
    let mut g = c.benchmark_group("onion_layers");
    g.throughput(Throughput::Bytes(509));
    let mut layers = [1u8, 2, 3].map(|k| Aes128Ctr::new(&[k; 16], &[0; 16]));
    let mut cell = [0x33u8; 509];
    g.bench_function("three_passes", |b| {
        b.iter(|| {
            for l in &mut layers {
                l.apply_keystream(black_box(&mut cell));
            }
        })
    });
    let mut one = Aes128Ctr::new(&[1; 16], &[0; 16]);
    let mut three_cells = [0x33u8; 3 * 509];
    g.bench_function("one_call_1527", |b| {
        b.iter(|| one.apply_keystream(black_box(&mut three_cells)))
    });
    let keystream = [0x5au8; 509];
    g.bench_function("xor_pass_509", |b| {
        b.iter(|| {
            let ks = black_box(&keystream);
            for (d, k) in black_box(&mut cell).iter_mut().zip(ks) {
                *d ^= k;
            }
        })
    });
    g.finish();
}

fn ntor(c: &mut Criterion<ThreadCpuTime>) {
    let mut rng = rand::thread_rng();
    let sk = NtorSecretKey::generate(&mut rng);
    let pk = sk.public();
    let id = [9u8; 20];
    c.bench_function("ntor_full_handshake", |b| {
        b.iter(|| {
            let (state, skin) = client_create(&mut rng, &id, &pk);
            let (reply, _server_keys) = server_handshake(&mut rng, &id, &sk, &skin).ok()?;
            client_finish(state, &reply).ok()
        })
    });
}

criterion_group! {
    name = benches;
    // CPU time of the bench thread, not wall time: see cpu_time.rs.
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = relay_crypto, onion_cipher, onion_layers, sha1_floor, ntor
}
criterion_main!(benches);
