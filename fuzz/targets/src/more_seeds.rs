//! Seeds of the onion, split hand-off, HTTP and config targets (the others are in `seeds.rs`),
//! built with the crates' own encoders where there is one.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use chive_cell::{
    ConfluxLink, ConfluxSwitch, Congested, CongestionReason, EstablishIntro, EstablishRendezvous,
    Extension, IntroEstablished, Introduce, IntroduceAck, IntroduceAckStatus, IntroducePlaintext,
    LinkSpec, Rendezvous1, Rendezvous2, SwitchAck, SwitchConfirm, SwitchConn, SwitchMarker,
    SwitchStatus,
};
use chive_crypto::{IdentityKeypair, NtorPublicKey};
use chive_dir::{IntroPoint, OnionDescriptor};

use crate::dir::NOW;
use crate::onion::{service_address, service_key, ONION_KINDS};

type Seeds = Vec<(String, Vec<u8>)>;

fn with_kind(kinds: &[&str], name: &str, body: Vec<u8>) -> Vec<u8> {
    let k = kinds.iter().position(|k| *k == name).expect("known kind");
    let mut out = vec![u8::try_from(k).expect("few kinds")];
    out.extend(body);
    out
}

pub(crate) fn onion_msgs() -> Seeds {
    let ext = vec![Extension {
        ty: 9,
        data: vec![1, 2, 3],
    }];
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        (
            "establish_intro",
            EstablishIntro {
                auth_key: [0x11; 32],
                extensions: ext.clone(),
                handshake_auth: [0x22; 32],
                sig: [0x33; 64],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "intro_established",
            IntroEstablished { extensions: vec![] }
                .encode()
                .expect("encodes"),
        ),
        (
            "introduce",
            Introduce {
                auth_key: [0x11; 32],
                extensions: vec![],
                encrypted: vec![0x44; 120],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "introduce_ack",
            IntroduceAck {
                status: IntroduceAckStatus::UnknownService,
                extensions: ext.clone(),
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "establish_rendezvous",
            EstablishRendezvous { cookie: [0x55; 20] }.encode(),
        ),
        (
            "rendezvous1",
            Rendezvous1 {
                cookie: [0x55; 20],
                handshake_info: vec![0x66; 64],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "rendezvous2",
            Rendezvous2 {
                handshake_info: vec![0x66; 64],
            }
            .encode()
            .expect("encodes"),
        ),
        (
            "introduce_plaintext",
            IntroducePlaintext {
                cookie: [0x55; 20],
                extensions: vec![],
                onion_key: [0x77; 32],
                link_specifiers: vec![
                    LinkSpec::Ipv4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9001)),
                    LinkSpec::Ed25519Id([0x22; 32]),
                ],
            }
            .encode(246)
            .expect("encodes"),
        ),
        (
            "switch_conn",
            SwitchConn {
                seq: 3,
                old_circ_id: 0x8000_0001,
            }
            .encode(),
        ),
        (
            "switch_ack",
            SwitchAck {
                seq: 3,
                status: SwitchStatus(0),
            }
            .encode(),
        ),
        ("switch_marker", SwitchMarker { seq: 3, cells: 77 }.encode()),
        (
            "conflux_link",
            ConfluxLink {
                nonce: [0x88; 32],
                last_seqno_sent: 10,
                last_seqno_recv: 9,
                desired_ux: 1,
            }
            .encode(),
        ),
        (
            "conflux_switch",
            ConfluxSwitch { relative_seq: 12 }.encode(),
        ),
        ("switch_confirm", SwitchConfirm { seq: 4 }.encode()),
        (
            "congested",
            Congested {
                reason: CongestionReason(1),
            }
            .encode(),
        ),
    ];
    bodies
        .into_iter()
        .map(|(kind, body)| (kind.to_string(), with_kind(ONION_KINDS, kind, body)))
        .collect()
}

/// A descriptor of the seeds' service with two intro points, valid around [`NOW`].
pub(crate) fn sample_onion_descriptor() -> OnionDescriptor {
    let point = |n: u8| IntroPoint {
        relay: IdentityKeypair::from_secret_bytes(&[n; 32]).public(),
        onion_key: NtorPublicKey([n ^ 0x5a; 32]),
        addresses: vec![SocketAddr::from((Ipv4Addr::new(127, 0, 0, n), 9000))],
        auth_key: IdentityKeypair::from_secret_bytes(&[n ^ 0x80; 32]).public(),
        enc_key: NtorPublicKey([n ^ 0xa5; 32]),
    };
    OnionDescriptor {
        address: service_address(),
        revision: 7,
        valid_after: NOW - 600,
        valid_until: NOW + 3 * 3600,
        intro_points: vec![point(21), point(22)],
    }
}

pub(crate) fn onion_descriptors() -> Seeds {
    let doc = sample_onion_descriptor()
        .sign(service_key())
        .expect("the service signs its descriptor");
    let signed = crate::seeds::signed_part(&doc);
    vec![
        ("signed_two_points".into(), with_mode(1, &signed)),
        ("raw_two_points".into(), with_mode(0, &doc)),
    ]
}

fn with_mode(mode: u8, text: &str) -> Vec<u8> {
    let mut b = vec![mode];
    b.extend_from_slice(text.as_bytes());
    b
}

/// Op bytes of the honest mode (see `split::honest`): 0 write, 1 switch, 2/3 deliver from the
/// primary / secondary, 4 close the second connection cleanly (or re-attach), 5 fail it.
pub(crate) fn split_handoffs() -> Seeds {
    let honest_switching = [1, 0, 0, 0, 1, 0, 0, 3, 2, 2, 2, 3, 3, 1, 0, 2, 3, 2, 3];
    let honest_recovery = [1, 0, 0, 0, 4, 0, 0, 4, 1, 0, 0, 5, 0, 2, 2, 2, 2];
    let mut hostile = vec![0u8];
    // Cells on both connections, then a HANDOFF on the primary naming one cell.
    hostile.extend([0, 4, 4, 0, 1]);
    hostile.extend(
        chive_cell::Handoff {
            seq: 0,
            cells: 2,
            flags: 0,
        }
        .encode(),
    );
    hostile.extend([4, 2, 3, 4]);
    let mut h = vec![1u8];
    h.extend(honest_switching);
    let mut r = vec![1u8];
    r.extend(honest_recovery);
    vec![
        ("honest_switching".into(), h),
        ("honest_recovery".into(), r),
        ("hostile_reader".into(), hostile),
        ("hostile_writer".into(), vec![2, 0, 0, 1, 2, 0]),
    ]
}

pub(crate) fn http_requests() -> Seeds {
    let desc = crate::seeds::descriptor_document();
    let onion = sample_onion_descriptor()
        .sign(service_key())
        .expect("signs");
    let label = service_address().label();
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    vec![
        (
            "authority_gets".into(),
            with_mode(
                0,
                &format!(
                    "GET /consensus HTTP/1.1\r\nHost: a\r\n\r\nGET /identity HTTP/1.1\r\n\r\n\
                     GET /onion/{label} HTTP/1.1\r\n\r\nDELETE /consensus HTTP/1.1\r\n\r\n"
                ),
            ),
        ),
        (
            "authority_descriptor".into(),
            with_mode(2, &post("/descriptor", &desc)),
        ),
        (
            "authority_onion".into(),
            with_mode(0, &post(&format!("/onion/{label}"), &onion)),
        ),
        (
            "httpd_bytes".into(),
            with_mode(
                1,
                "GET /bytes/300 HTTP/1.1\r\nHost: h\r\n\r\nHEAD /bytes/5 HTTP/1.1\r\n\r\n\
                 GET /bytes/x HTTP/1.1\r\n\r\nGET / HTTP/1.0\r\n\r\n",
            ),
        ),
        (
            "httpd_upload_chunked".into(),
            with_mode(
                3,
                "POST /upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            ),
        ),
    ]
}

pub(crate) fn http_responses() -> Seeds {
    vec![
        (
            "length".into(),
            with_mode(
                0,
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: y\r\n\r\nhello",
            ),
        ),
        (
            "chunked_trailer".into(),
            with_mode(
                1,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3;x=1\r\nabc\r\n\
                 10\r\n0123456789abcdef\r\n0\r\nT: v\r\n\r\n",
            ),
        ),
        (
            "interim_then_eof".into(),
            with_mode(
                2,
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 Not Found\r\n\r\nuntil the end",
            ),
        ),
        (
            "no_body_small_limits".into(),
            with_mode(7, "HTTP/1.1 204 No Content\r\nA: b\r\n\r\n"),
        ),
    ]
}

/// Config files the roles accept (checked by a unit test).
pub(crate) fn configs() -> Seeds {
    let id = crate::dir::authority().public().to_hex();
    let relay = format!(
        "Nickname = \"fuzz1\"\nDataDirectory = \"/tmp/chive-fuzz\"\nORPort = \"127.0.0.1:9001\"\n\
         Authority = \"127.0.0.1:8000\"\nAuthorityIdentity = \"{id}\"\nBandwidthRate = 1000000\n\
         BandwidthBurst = 2000000\nExitPolicy = [\"accept *:80\", \"reject *:*\"]\n\
         Scheduler = \"ewma\"\nCircuitPriorityHalflife = 30.0\nSplitDirection = \"dynamic\"\n\
         MaxMemInQueues = \"16 MB\"\nDoSCircuitCreationEnabled = 1\nDoSCircuitCreationRate = 3\n\
         CircuitSwitching = \"connection\"\nSwitchAlpha = 0.05\nSwitchBeta = 0.1\n\
         ChannelFairness = true\nQuietReserve = 65536\n"
    );
    let client = format!(
        "DataDirectory = \"/tmp/chive-fuzz-c\"\nSocksPort = \"127.0.0.1:9050\"\n\
         Authority = \"127.0.0.1:8000\"\nAuthorityIdentity = \"{id}\"\nCircuitBuildTimeout = 10\n\
         EntryNodes = [\"fuzz1\", \"{id}\"]\nLinkUnsentLimit = 65536\n"
    );
    let authority = "Nickname = \"auth\"\nDataDirectory = \"/tmp/chive-fuzz-a\"\n\
                     DirPort = \"127.0.0.1:8000\"\nConsensusInterval = 30\n\
                     [NetworkParameters]\ncircwindow = 500\ncc_alg = 2\n"
        .to_string();
    vec![
        ("relay".into(), with_mode(0, &relay)),
        ("client".into(), with_mode(1, &client)),
        ("authority".into(), with_mode(2, &authority)),
        (
            "authority_then_relay".into(),
            with_mode(3, &format!("{authority}\0{relay}")),
        ),
    ]
}

#[cfg(test)]
mod tests {
    //! The seeds must be inputs the code under test accepts, or the fuzzers start from nothing.

    use super::*;

    #[test]
    fn config_seeds_are_accepted() {
        for (name, s) in configs() {
            let text = std::str::from_utf8(&s[1..]).unwrap();
            let r = match s[0] {
                0 => chive_node::fuzzing::relay_config(text),
                1 => chive_node::fuzzing::client_config(text),
                2 => chive_node::fuzzing::authority_config(text).map(drop),
                _ => {
                    let (a, r) = text.split_once('\0').unwrap();
                    let p = chive_node::fuzzing::authority_config(a).unwrap();
                    chive_node::fuzzing::relay_config_with_params(r, &p)
                }
            };
            r.unwrap_or_else(|e| panic!("config seed {name}: {e:#}"));
        }
    }

    #[test]
    fn onion_descriptor_seed_verifies() {
        let doc = sample_onion_descriptor().sign(service_key()).unwrap();
        let d = OnionDescriptor::verify(&doc, &service_address(), NOW).unwrap();
        assert_eq!(d, sample_onion_descriptor());
    }

    #[test]
    fn onion_msg_seeds_decode() {
        // Every kind has a seed, and every seed decodes (the round trip then runs).
        let seeds = onion_msgs();
        assert_eq!(seeds.len(), ONION_KINDS.len());
        for (name, s) in seeds {
            let body = &s[1..];
            let ok = match name.as_str() {
                "establish_intro" => EstablishIntro::decode(body).is_ok(),
                "intro_established" => IntroEstablished::decode(body).is_ok(),
                "introduce" => Introduce::decode(body).is_ok(),
                "introduce_ack" => IntroduceAck::decode(body).is_ok(),
                "establish_rendezvous" => EstablishRendezvous::decode(body).is_ok(),
                "rendezvous1" => Rendezvous1::decode(body).is_ok(),
                "rendezvous2" => Rendezvous2::decode(body).is_ok(),
                "introduce_plaintext" => IntroducePlaintext::decode(body).is_ok(),
                "switch_conn" => SwitchConn::decode(body).is_ok(),
                "switch_ack" => SwitchAck::decode(body).is_ok(),
                "switch_marker" => SwitchMarker::decode(body).is_ok(),
                "conflux_link" => ConfluxLink::decode(body).is_ok(),
                "conflux_switch" => ConfluxSwitch::decode(body).is_ok(),
                "switch_confirm" => SwitchConfirm::decode(body).is_ok(),
                "congested" => Congested::decode(body).is_ok(),
                other => panic!("no decoder named for seed {other}"),
            };
            assert!(ok, "onion_msg seed {name} does not decode");
        }
    }
}
