//! Seed inputs for every target, built with the crates' own encoders (so they stay valid when a
//! format changes: regenerate with `cargo run --release -p chive-fuzz-targets --bin gen-seeds`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use chive_cell::{
    relay_payload, Authenticate, Begin, Bind, Cell, CellCommand, CircExt, Connected, Create2,
    Created2, Destroy, DestroyReason, End, EndReason, Extend2, Extended2, Handoff, LegProbe,
    LinkFeatures, LinkSpec, RelayCommand, Resolve, Resolved, ResolvedAnswer, Sendme, VarCell,
    Versions,
};
use chive_client::socks::{SocksCommand, SocksRequest, SocksVersion, TargetAddr};
use chive_crypto::IdentityKeypair;
use chive_dir::{Consensus, ConsensusRelay, ExitPolicy, NetParams, RelayDescriptor, RelayFlags};

use crate::dir::{authority, relay_key, NOW};
use crate::handshake::peer_cells;
use crate::more_seeds;
use crate::relay::KINDS;

/// One seed: (target name, file name, bytes).
pub type Seed = (&'static str, String, Vec<u8>);

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    out.extend(named("cell", cells()));
    out.extend(named("relay_msg", relay_msgs()));
    out.extend(named("link_handshake", handshakes()));
    out.extend(named("socks", socks()));
    out.extend(named("consensus", consensus()));
    out.extend(named("descriptor", descriptor()));
    out.extend(named("exit_policy", exit_policies()));
    out.extend(named("onion_msg", more_seeds::onion_msgs()));
    out.extend(named("onion_descriptor", more_seeds::onion_descriptors()));
    out.extend(named("split_handoff", more_seeds::split_handoffs()));
    out.extend(named("http_server", more_seeds::http_requests()));
    out.extend(named("http_response", more_seeds::http_responses()));
    out.extend(named("config", more_seeds::configs()));
    out.extend(named("ntor", crate::ntor::seeds()));
    out.extend(named("tls_records", crate::records::seeds()));
    out.extend(named("record_handover", crate::handover::seeds()));
    out.extend(named("relay_core", crate::relay_core::seeds()));
    out.extend(named("client_core", crate::client_core::seeds()));
    out
}

fn named(target: &'static str, seeds: Vec<(String, Vec<u8>)>) -> Vec<Seed> {
    seeds.into_iter().map(|(n, b)| (target, n, b)).collect()
}

fn cells() -> Vec<(String, Vec<u8>)> {
    let fixed = Cell::from_payload(
        7,
        CellCommand::RELAY,
        relay_payload(RelayCommand::DATA, 1, b"hello").expect("fits"),
    );
    let var = VarCell {
        circ_id: 0,
        command: CellCommand::VERSIONS,
        payload: Versions { versions: vec![1] }.encode(),
    };
    let mut one_fixed = Vec::new();
    fixed.encode_into(&mut one_fixed);
    let mut one_var = Vec::new();
    var.encode_into(&mut one_var).expect("encodes");
    let mut stream = one_var.clone();
    let destroy = Cell::new(
        7,
        CellCommand::DESTROY,
        &Destroy {
            reason: DestroyReason::FINISHED,
        }
        .encode(),
    )
    .expect("fits");
    stream.extend_from_slice(&one_fixed);
    destroy.encode_into(&mut stream);
    stream.extend_from_slice(&one_var[..3]); // a partial cell at the end
    vec![
        ("fixed_relay".into(), one_fixed),
        ("var_versions".into(), one_var),
        ("stream".into(), stream),
    ]
}

fn kind(name: &str) -> u8 {
    let k = KINDS.iter().position(|k| *k == name).expect("known kind");
    u8::try_from(k).expect("few kinds")
}

fn relay_msgs() -> Vec<(String, Vec<u8>)> {
    let create2 = Create2 {
        handshake_type: 2,
        handshake: vec![0xab; 84],
    };
    let extend2 = Extend2 {
        link_specifiers: vec![
            LinkSpec::Ipv4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9001)),
            LinkSpec::Ipv6(std::net::SocketAddrV6::new(Ipv6Addr::LOCALHOST, 9001, 0, 0)),
            LinkSpec::LegacyId([0x11; 20]),
            LinkSpec::Ed25519Id([0x22; 32]),
            LinkSpec::Unrecognized {
                ty: 9,
                data: vec![1, 2, 3],
            },
        ],
        create2: create2.clone(),
    };
    let begin = Begin {
        host: "example.com".into(),
        port: 443,
        flags: 0,
    };
    let begin6 = Begin {
        host: "::1".into(),
        port: 80,
        flags: 1,
    };
    let probe = LegProbe {
        id: 0x0102_0304_0506_0708,
    };
    let bodies: Vec<(&str, &str, Vec<u8>)> = vec![
        ("create2", "ntor", create2.encode().expect("encodes")),
        (
            "created2",
            "ntor",
            Created2 {
                handshake: vec![0xcd; 64],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "extended2",
            "ntor",
            Extended2 {
                handshake: vec![0xcd; 64],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "destroy",
            "finished",
            Destroy {
                reason: DestroyReason::FINISHED,
            }
            .encode(),
        ),
        ("extend2", "all_specs", extend2.encode().expect("encodes")),
        (
            "ntor3_extensions",
            "cc_request_and_unknown",
            CircExt::encode_list(&[
                CircExt::CcRequest,
                CircExt::Unknown {
                    ext_type: 9,
                    body: vec![1, 2],
                },
            ])
            .expect("encodes"),
        ),
        (
            "ntor3_extensions",
            "cc_response",
            CircExt::encode_list(&[CircExt::CcResponse { sendme_inc: 100 }]).expect("encodes"),
        ),
        ("begin", "host", begin.encode().expect("encodes")),
        ("begin", "ipv6_flags", begin6.encode().expect("encodes")),
        (
            "connected",
            "ipv4",
            Connected {
                addr: Some(Ipv4Addr::new(93, 184, 216, 34).into()),
                ttl: 300,
            }
            .encode(),
        ),
        (
            "connected",
            "ipv6",
            Connected {
                addr: Some(Ipv6Addr::LOCALHOST.into()),
                ttl: 60,
            }
            .encode(),
        ),
        (
            "end",
            "done",
            End {
                reason: EndReason::DONE,
            }
            .encode(),
        ),
        (
            "sendme",
            "v1",
            Sendme {
                digest: Some([0x33; 20]),
            }
            .encode(),
        ),
        (
            "resolve",
            "host",
            Resolve {
                host: "example.com".into(),
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "resolved",
            "answers",
            Resolved {
                answers: vec![
                    ResolvedAnswer::Ip(Ipv4Addr::new(10, 0, 0, 1).into(), 60),
                    ResolvedAnswer::Ip(Ipv6Addr::LOCALHOST.into(), 60),
                    ResolvedAnswer::Hostname("example.com".into(), 60),
                    ResolvedAnswer::TransientError(0),
                    ResolvedAnswer::NontransientError(0),
                ],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "versions",
            "v1_v2",
            Versions {
                versions: vec![1, 2],
            }
            .encode(),
        ),
        (
            "link_features",
            "split",
            LinkFeatures { features: 1 }.encode(),
        ),
        (
            "bind",
            "token",
            Bind {
                token: [0x44; 32],
                seq: Some(3),
            }
            .encode(),
        ),
        (
            "handoff",
            "recovery",
            Handoff {
                seq: 3,
                cells: 1000,
                flags: Handoff::RECOVERY,
            }
            .encode(),
        ),
        (
            "authenticate",
            "sig",
            Authenticate {
                identity: [0x55; 32],
                signature: [0x66; 64],
            }
            .encode(),
        ),
        ("leg_probe", "id", probe.encode()),
    ];
    let mut out: Vec<(String, Vec<u8>)> = bodies
        .into_iter()
        .map(|(k, name, body)| {
            let mut b = vec![kind(k)];
            b.extend_from_slice(&body);
            (format!("{k}_{name}"), b)
        })
        .collect();
    // Whole relay payloads as a relay decrypts them (kind 0).
    let payloads = [
        (
            "begin",
            relay_payload(RelayCommand::BEGIN, 1, &begin.encode().expect("encodes")),
        ),
        (
            "extend2",
            relay_payload(
                RelayCommand::EXTEND2,
                0,
                &extend2.encode().expect("encodes"),
            ),
        ),
        (
            "data",
            relay_payload(RelayCommand::DATA, 1, b"GET / HTTP/1.0\r\n\r\n"),
        ),
        (
            "leg_probe",
            relay_payload(RelayCommand::LEG_PROBE, 0, &probe.encode()),
        ),
    ];
    for (name, p) in payloads {
        let p = p.expect("fits");
        // Trailing zero padding is what the mutator would otherwise have to rediscover; keep
        // the seeds short by cutting it (the target pads again).
        let used = p.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let mut b = vec![kind("relay_payload")];
        b.extend_from_slice(&p[..used]);
        out.push((format!("relay_payload_{name}"), b));
    }
    out
}

fn handshakes() -> Vec<(String, Vec<u8>)> {
    // Mode byte: bit 0 we respond, bit 1 expect the peer's identity, bits 2-3 read size.
    let seed = |mode: u8, cells: Vec<u8>| {
        let mut b = vec![mode];
        b.extend_from_slice(&cells);
        b
    };
    vec![
        (
            "initiator_expecting_relay".into(),
            seed(0b0010, peer_cells(false, true)),
        ),
        (
            "initiator_any_relay_bytewise".into(),
            seed(0b0000, peer_cells(false, true)),
        ),
        (
            "responder_anonymous_client".into(),
            seed(0b1101, peer_cells(true, false)),
        ),
        (
            "responder_relay_peer".into(),
            seed(0b1011, peer_cells(true, true)),
        ),
    ]
}

fn socks() -> Vec<(String, Vec<u8>)> {
    let req = |version, command, target, auth| SocksRequest {
        version,
        command,
        target,
        auth,
    };
    let v4 = SocketAddr::from((Ipv4Addr::new(93, 184, 216, 34), 80));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 443));
    let domain = || TargetAddr::Domain("example.com".into(), 443);
    let creds = Some((b"user".to_vec(), b"pass".to_vec()));
    let reqs = vec![
        (
            "v4_connect",
            req(
                SocksVersion::V4,
                SocksCommand::Connect,
                TargetAddr::Ip(v4),
                None,
            ),
        ),
        (
            "v4a_userid",
            req(
                SocksVersion::V4,
                SocksCommand::Connect,
                domain(),
                Some((b"iso".to_vec(), vec![])),
            ),
        ),
        (
            "v4a_resolve",
            req(SocksVersion::V4, SocksCommand::Resolve, domain(), None),
        ),
        (
            "v5_ipv4",
            req(
                SocksVersion::V5,
                SocksCommand::Connect,
                TargetAddr::Ip(v4),
                None,
            ),
        ),
        (
            "v5_ipv6",
            req(
                SocksVersion::V5,
                SocksCommand::Connect,
                TargetAddr::Ip(v6),
                None,
            ),
        ),
        (
            "v5_domain_userpass",
            req(SocksVersion::V5, SocksCommand::Connect, domain(), creds),
        ),
        (
            "v5_resolve",
            req(SocksVersion::V5, SocksCommand::Resolve, domain(), None),
        ),
    ];
    reqs.into_iter()
        .map(|(n, r)| (n.to_string(), crate::socks::client_bytes(&r)))
        .collect()
}

/// The signed part of a signed document (its text without the signature line and the newline
/// before it): what a mode-1 input carries.
pub(crate) fn signed_part(doc: &str) -> String {
    let without_sig = doc.trim_end_matches('\n');
    let cut = without_sig.rfind('\n').expect("signature line");
    without_sig[..cut].to_owned()
}

fn with_mode(mode: u8, text: &str) -> Vec<u8> {
    let mut b = vec![mode];
    b.extend_from_slice(text.as_bytes());
    b
}

fn sample_relay(seed: u8, nickname: &str, exit: bool) -> (IdentityKeypair, ConsensusRelay) {
    let key = IdentityKeypair::from_secret_bytes(&[seed; 32]);
    let policy = if exit {
        "accept *:80, accept *:443"
    } else {
        "reject *:*"
    };
    let relay = ConsensusRelay {
        nickname: nickname.into(),
        identity: key.public(),
        ntor_key: [seed ^ 0xff; 32],
        address: SocketAddr::from((Ipv4Addr::new(127, 0, 0, seed), 9000 + u16::from(seed))),
        bandwidth: 1_000_000 * u64::from(seed),
        flags: RelayFlags::from_names(&["Fast", "Running", "Valid"]),
        exit_policy: ExitPolicy::parse(&[policy], false).expect("valid policy"),
        features: 1,
    };
    (key, relay)
}

fn consensus() -> Vec<(String, Vec<u8>)> {
    let mut params = NetParams::new();
    params.set("circwindow", 1000).expect("known parameter");
    let mut relays = vec![
        sample_relay(10, "guard1", false).1,
        sample_relay(11, "exit1", true).1,
    ];
    relays.sort_by_key(|r| *r.identity.as_bytes());
    let c = Consensus {
        valid_after: NOW - 600,
        fresh_until: NOW + 1800,
        valid_until: NOW + 3600,
        params,
        relays,
    };
    let doc = c.sign(authority());
    vec![
        ("signed_two_relays".into(), with_mode(1, &signed_part(&doc))),
        ("raw_two_relays".into(), with_mode(0, &doc)),
    ]
}

fn descriptor() -> Vec<(String, Vec<u8>)> {
    let doc = descriptor_document();
    vec![
        ("signed_exit".into(), with_mode(1, &signed_part(&doc))),
        ("raw_exit".into(), with_mode(0, &doc)),
    ]
}

/// A relay descriptor signed by the seeds' relay key (also posted to the authority in the
/// `http_server` seeds).
pub(crate) fn descriptor_document() -> String {
    let (_, relay) = sample_relay(12, "exit2", true);
    let d = RelayDescriptor {
        nickname: relay.nickname,
        identity: relay_key().public(),
        ntor_key: relay.ntor_key,
        address: SocketAddr::from((Ipv6Addr::LOCALHOST, 9012)),
        bandwidth: relay.bandwidth,
        exit_policy: relay.exit_policy,
        features: 1,
        published: NOW,
        uptime: 86_400,
        version: "chive 0.1.0".into(),
    };
    d.sign(relay_key())
}

fn exit_policies() -> Vec<(String, Vec<u8>)> {
    vec![
        ("web_only".into(), with_mode(0, "accept *:80,accept *:443,reject *:*")),
        (
            "mixed_private".into(),
            with_mode(
                1,
                "accept 10.0.0.0/255.0.0.0:1-1024\nreject6 [::1]/128:*\naccept private:443, accept6 *:22\nreject *4:*\naccept 192.0.2.7",
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    //! The seeds must be inputs the parsers accept, or the fuzzers start from nothing.

    use super::*;
    use crate::io::{block_on, FuzzStream};

    fn seeds_of(target: &str) -> Vec<Vec<u8>> {
        all()
            .into_iter()
            .filter(|(t, _, _)| *t == target)
            .map(|(_, _, b)| b)
            .collect()
    }

    #[test]
    fn handshake_seeds_complete() {
        for s in seeds_of("link_handshake") {
            let (mode, peer) = s.split_first().expect("mode byte");
            let responder = mode & 1 != 0;
            let expected = (mode & 2 != 0).then(crate::handshake::peer_identity);
            let mut io = FuzzStream::new(peer, 7);
            let cfg = crate::handshake::config(responder);
            let fut = chive_net::fuzzing::handshake(
                &mut io,
                responder,
                cfg,
                &crate::handshake::EXPORTER,
                expected,
            );
            block_on(fut).expect("seed handshake completes");
        }
    }

    #[test]
    fn socks_seeds_parse() {
        for s in seeds_of("socks") {
            let mut io = FuzzStream::new(&s, usize::MAX);
            block_on(chive_client::socks::accept_socks(&mut io)).expect("seed request parses");
            assert_eq!(io.unread(), 0);
        }
    }

    #[test]
    fn document_seeds_verify() {
        for s in seeds_of("consensus") {
            let doc = if s[0] == 1 {
                crate::dir::sign_document(std::str::from_utf8(&s[1..]).unwrap(), authority())
            } else {
                String::from_utf8(s[1..].to_vec()).unwrap()
            };
            Consensus::verify(&doc, &authority().public(), NOW).expect("seed consensus verifies");
        }
        for s in seeds_of("descriptor") {
            let doc = if s[0] == 1 {
                crate::dir::sign_document(std::str::from_utf8(&s[1..]).unwrap(), relay_key())
            } else {
                String::from_utf8(s[1..].to_vec()).unwrap()
            };
            RelayDescriptor::verify(&doc).expect("seed descriptor verifies");
        }
        for s in seeds_of("exit_policy") {
            let text = std::str::from_utf8(&s[1..]).unwrap();
            let lines: Vec<&str> = text.split('\n').collect();
            ExitPolicy::parse(&lines, s[0] & 1 == 1).expect("seed policy parses");
        }
    }
}
