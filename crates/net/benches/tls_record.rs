//! The TLS part of a relay's crypto floor: rustls 1.3 record protection of 16 KiB records, on an
//! in-memory client/server pair (no sockets, so only rustls's own work is timed).
//!
//! A relay decrypts every byte it receives from one link and encrypts it again for the next, so
//! `seal_open` (client seals a record, server opens it and copies the plaintext out) is the TLS
//! cost per relayed byte; `seal` alone is the sending half. All run for the suite chive's links
//! negotiate (TLS13_AES_128_GCM_SHA256, `chive_net`'s `LINK_SUITES`) and for AES-256-GCM (what
//! they negotiated before session 14, the ring provider's first choice).
//!
//! Run with `cargo bench -p chive-benches --bench tls_record`; `lab/scripts/relay_cpu.py` reads
//! criterion's `target/criterion/tls_record/*/new/estimates.json`.

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, Iv, OutboundChunks, OutboundPlainMessage,
};
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, ConnectionTrafficSecrets, RootCertStore, ServerConfig,
    ServerConnection,
};

// The same CPU-time measurement as chive-crypto's benches, so both halves of the floor compare.
#[path = "../../crypto/benches/support/cpu_time.rs"]
mod cpu_time;
use cpu_time::ThreadCpuTime;
use rustls::{ContentType, ProtocolVersion};

/// Plaintext per record: the TLS maximum, which is what a busy link's records carry.
const RECORD: usize = 16 * 1024;

/// A connected client/server pair restricted to `suite`, handshake done.
fn pair(suite: rustls::SupportedCipherSuite) -> (ClientConnection, ServerConnection) {
    pair_with(suite, false)
}

/// [`pair`], optionally with secret extraction enabled (for [`record_keys`]).
fn pair_with(
    suite: rustls::SupportedCipherSuite,
    extract: bool,
) -> (ClientConnection, ServerConnection) {
    let provider = Arc::new(CryptoProvider {
        cipher_suites: vec![suite],
        ..ring::default_provider()
    });
    let certified = rcgen::generate_simple_self_signed(vec!["bench.invalid".to_string()])
        .expect("rcgen certificate");
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .expect("server config");
    let mut roots = RootCertStore::empty();
    roots.add(cert).expect("root");
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    server.enable_secret_extraction = extract;
    client.enable_secret_extraction = extract;
    let name = ServerName::try_from("bench.invalid").expect("name");
    let mut c = ClientConnection::new(Arc::new(client), name).expect("client");
    let mut s = ServerConnection::new(Arc::new(server)).expect("server");
    let mut buf = Vec::new();
    while c.is_handshaking() || s.is_handshaking() {
        buf.clear();
        c.write_tls(&mut buf).expect("client write_tls");
        transfer_into_server(&buf, &mut s);
        buf.clear();
        s.write_tls(&mut buf).expect("server write_tls");
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).expect("client read_tls");
            c.process_new_packets().expect("client process");
        }
    }
    assert_eq!(c.negotiated_cipher_suite(), Some(suite));
    (c, s)
}

/// Feeds `wire` to the server and processes it (read_tls takes a bounded amount per call).
fn transfer_into_server(wire: &[u8], s: &mut ServerConnection) {
    let mut rd = wire;
    while !rd.is_empty() {
        s.read_tls(&mut rd).expect("server read_tls");
        s.process_new_packets().expect("server process");
    }
}

/// The record keys of one direction of a real session of `suite` (so the key has the suite's
/// length): the sender's and the receiver's copy, each as (key, iv).
fn record_keys(suite: rustls::SupportedCipherSuite) -> ((AeadKey, Iv), (AeadKey, Iv)) {
    let (client, server) = pair_with(suite, true);
    let sent = client
        .dangerous_extract_secrets()
        .expect("client secrets")
        .tx
        .1;
    let received = server
        .dangerous_extract_secrets()
        .expect("server secrets")
        .rx
        .1;
    let parts = |secrets| match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
        _ => unreachable!("a suite this bench does not use"),
    };
    (parts(sent), parts(received))
}

fn records(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("tls_record");
    g.throughput(Throughput::Bytes(RECORD as u64));
    let plain = vec![0xA5u8; RECORD];
    let suites = [
        ("aes256gcm", ring::cipher_suite::TLS13_AES_256_GCM_SHA384),
        ("aes128gcm", ring::cipher_suite::TLS13_AES_128_GCM_SHA256),
    ];
    for (label, suite) in suites {
        let (mut client, _server) = pair(suite);
        let mut wire = Vec::with_capacity(2 * RECORD);
        g.bench_function(BenchmarkId::new("seal_16k", label), |b| {
            b.iter(|| {
                client.writer().write_all(black_box(&plain)).expect("write");
                wire.clear();
                client.write_tls(&mut wire).expect("write_tls");
                black_box(wire.len())
            })
        });

        let (mut client, mut server) = pair(suite);
        let mut out = vec![0u8; RECORD];
        g.bench_function(BenchmarkId::new("seal_open_16k", label), |b| {
            b.iter(|| {
                client.writer().write_all(black_box(&plain)).expect("write");
                wire.clear();
                client.write_tls(&mut wire).expect("write_tls");
                transfer_into_server(&wire, &mut server);
                server.reader().read_exact(&mut out).expect("read");
                black_box(out[RECORD - 1])
            })
        });
    }

    // The cipher alone, without rustls's buffering: ring's AES-GCM through rustls's record layer
    // (MessageEncrypter / MessageDecrypter), one 16 KiB record per iteration. The gap to
    // `seal_16k` / `seal_open_16k` is rustls copying plaintext in and out of its buffers.
    for (label, supported) in suites {
        let rustls::SupportedCipherSuite::Tls13(suite) = supported else {
            unreachable!("a TLS 1.3 suite")
        };
        let ((key, iv), _) = record_keys(supported);
        let mut enc = suite.aead_alg.encrypter(key, iv);
        let mut seq = 0u64;
        g.bench_function(BenchmarkId::new("aead_seal_16k", label), |b| {
            b.iter(|| {
                let msg = OutboundPlainMessage {
                    typ: ContentType::ApplicationData,
                    version: ProtocolVersion::TLSv1_2,
                    payload: OutboundChunks::Single(black_box(&plain)),
                };
                seq += 1;
                // The sealed record stays in rustls's buffer (no `encode`): only the copy in
                // that the record API itself makes is counted.
                black_box(enc.encrypt(msg, seq).expect("seal"))
            })
        });
        let ((key, iv), (key_rx, iv_rx)) = record_keys(supported);
        let mut enc = suite.aead_alg.encrypter(key, iv);
        let mut dec = suite.aead_alg.decrypter(key_rx, iv_rx);
        let (mut seq_seal, mut seq_open) = (0u64, 0u64);
        g.bench_function(BenchmarkId::new("aead_open_16k", label), |b| {
            // Records are sealed in the (untimed) setup, in order, so sequence numbers match.
            b.iter_batched(
                || {
                    let msg = OutboundPlainMessage {
                        typ: ContentType::ApplicationData,
                        version: ProtocolVersion::TLSv1_2,
                        payload: OutboundChunks::Single(&plain),
                    };
                    seq_seal += 1;
                    enc.encrypt(msg, seq_seal).expect("seal").encode()
                },
                |mut wire| {
                    seq_open += 1;
                    let msg = InboundOpaqueMessage::new(
                        ContentType::ApplicationData,
                        ProtocolVersion::TLSv1_2,
                        &mut wire[5..],
                    );
                    let plain = dec.decrypt(msg, seq_open).expect("open");
                    black_box(plain.payload.len())
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = records
}
criterion_main!(benches);
