use super::*;
use chive_crypto::IdentityKeypair;
use chive_dir::{ExitPolicy, NetParams};
use rand::rngs::StdRng;
use rand::SeedableRng;

const ALL: RelayFlags = RelayFlags::RUNNING;

fn relay(n: u8, bw: u64, flags: RelayFlags, policy: &[&str]) -> ConsensusRelay {
    ConsensusRelay {
        nickname: format!("r{n}"),
        identity: IdentityKeypair::from_secret_bytes(&[n; 32]).public(),
        ntor_key: [n; 32],
        address: format!("127.0.0.1:{}", 9000 + u16::from(n))
            .parse()
            .unwrap(),
        bandwidth: bw,
        flags: flags | RelayFlags::RUNNING | RelayFlags::VALID,
        exit_policy: ExitPolicy::parse(policy, false).unwrap(),
        features: 0,
    }
}

fn consensus(relays: Vec<ConsensusRelay>) -> Consensus {
    Consensus {
        valid_after: 0,
        fresh_until: 1,
        valid_until: 2,
        params: NetParams::new(),
        relays,
    }
}

fn req<'a>(target: PathTarget<'a>) -> PathRequest<'a> {
    PathRequest {
        target,
        exit_nickname: None,
        guard: None,
        hops: 3,
        entry_nodes: &[],
        middle_nodes: &[],
    }
}

const LOOPBACK: &[&str] = &["accept 127.0.0.0/8:*", "reject *:*"];
const EXIT_G: RelayFlags = RelayFlags::EXIT;

/// Five exits, five guards, some plain relays.
fn net() -> Consensus {
    let mut v = Vec::new();
    for n in 1..=5 {
        v.push(relay(n, 100 * u64::from(n), EXIT_G, LOOPBACK));
    }
    for n in 6..=10 {
        v.push(relay(n, 100, RelayFlags::GUARD | RelayFlags::FAST, &[]));
    }
    for n in 11..=14 {
        v.push(relay(n, 50, ALL, &[]));
    }
    consensus(v)
}

#[test]
fn distinct_relays_and_roles_over_many_draws() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(1);
    let target: SocketAddr = "127.0.0.1:80".parse().unwrap();
    for hops in 1..=5 {
        for _ in 0..500 {
            let p = select_path(
                &c,
                &PathRequest {
                    hops,
                    ..req(PathTarget::Ip(target))
                },
                &mut rng,
            )
            .unwrap();
            assert_eq!(p.len(), hops);
            for (i, a) in p.iter().enumerate() {
                for b in &p[i + 1..] {
                    assert_ne!(a.identity, b.identity, "repeated relay in {hops}-hop path");
                }
            }
            let exit = p[hops - 1];
            assert!(exit.flags.contains(RelayFlags::EXIT));
            assert!(exit.exit_policy.allows(target.ip(), target.port()));
            if hops > 1 {
                assert!(p[0].flags.contains(RelayFlags::GUARD), "guard has the flag");
            }
        }
    }
}

#[test]
fn exit_choice_is_bandwidth_weighted() {
    // Exits r1..r5 weigh 100..500 (total 1500).
    let c = net();
    let mut rng = StdRng::seed_from_u64(7);
    let draws = 30_000u32;
    let mut counts = [0u32; 5];
    for _ in 0..draws {
        let p = select_path(&c, &req(PathTarget::Any), &mut rng).unwrap();
        let n: usize = p[2].nickname[1..].parse().unwrap();
        counts[n - 1] += 1;
    }
    let mut chi2 = 0.0;
    for (i, &got) in counts.iter().enumerate() {
        let want = f64::from(draws) * (i as f64 + 1.0) / 15.0;
        chi2 += (f64::from(got) - want).powi(2) / want;
    }
    // 4 degrees of freedom: P(chi2 > 18.5) < 0.001. Uniform choice would give ~4000.
    assert!(chi2 < 18.5, "counts {counts:?} chi2 {chi2}");
}

#[test]
fn middles_are_bandwidth_weighted() {
    // One exit, one guard, middles weighing 1:3.
    let c = consensus(vec![
        relay(1, 10, EXIT_G, LOOPBACK),
        relay(2, 10, RelayFlags::GUARD, &[]),
        relay(3, 100, ALL, &[]),
        relay(4, 300, ALL, &[]),
    ]);
    let mut rng = StdRng::seed_from_u64(3);
    let mut heavy = 0u32;
    for _ in 0..4000 {
        let p = select_path(&c, &req(PathTarget::Any), &mut rng).unwrap();
        assert_eq!(p[0].nickname, "r2");
        assert_eq!(p[2].nickname, "r1");
        if p[1].nickname == "r4" {
            heavy += 1;
        }
    }
    // Expected 3000; sd ~27. Middles here can only be r3/r4 (guard and exit taken).
    assert!(
        (2850..3150).contains(&heavy),
        "heavy middle chosen {heavy} / 4000"
    );
}

#[test]
fn exit_policy_filters() {
    let c = consensus(vec![
        relay(1, 100, EXIT_G, &["accept 10.0.0.0/8:*", "reject *:*"]),
        relay(2, 100, EXIT_G, &["accept *:443", "reject *:*"]),
        relay(3, 100, EXIT_G, LOOPBACK),
        relay(4, 100, RelayFlags::GUARD, &[]),
        relay(5, 100, ALL, &[]),
    ]);
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..200 {
        let ten = select_path(
            &c,
            &req(PathTarget::Ip("10.1.1.1:22".parse().unwrap())),
            &mut rng,
        )
        .unwrap();
        assert_eq!(ten[2].nickname, "r1");
        let lo = select_path(
            &c,
            &req(PathTarget::Ip("127.0.0.1:8080".parse().unwrap())),
            &mut rng,
        )
        .unwrap();
        assert_eq!(lo[2].nickname, "r3");
        // A hostname on port 443: r1, r2 and r3 all might allow it.
        let h = select_path(&c, &req(PathTarget::Host("example.com", 443)), &mut rng).unwrap();
        assert!(["r1", "r2", "r3"].contains(&h[2].nickname.as_str()));
    }
    assert_eq!(
        select_path(
            &c,
            &req(PathTarget::Ip("8.8.8.8:80".parse().unwrap())),
            &mut rng
        ),
        Err(PathError::NoExit {
            target: "8.8.8.8:80".into()
        })
    );
    // An accepting policy without the Exit flag is not used as an exit.
    let no_flag = consensus(vec![
        relay(1, 100, ALL, LOOPBACK),
        relay(2, 100, ALL, &[]),
        relay(3, 100, ALL, &[]),
    ]);
    assert!(matches!(
        select_path(&no_flag, &req(PathTarget::Any), &mut rng),
        Err(PathError::NoExit { .. })
    ));
}

#[test]
fn exit_pinning() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(9);
    let target = PathTarget::Host("localhost", 80);
    for _ in 0..100 {
        let p = select_path(
            &c,
            &PathRequest {
                exit_nickname: Some("R2"),
                ..req(target)
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(p[2].nickname, "r2");
    }
    let hex = c.relays[3].identity.to_hex();
    let p = select_path(
        &c,
        &PathRequest {
            exit_nickname: Some(&hex),
            ..req(target)
        },
        &mut rng,
    )
    .unwrap();
    assert_eq!(p[2].nickname, "r4");
    assert_eq!(
        select_path(
            &c,
            &PathRequest {
                exit_nickname: Some("nobody"),
                ..req(target)
            },
            &mut rng
        ),
        Err(PathError::UnknownExit("nobody".into()))
    );
    // r6 is a guard with a reject-all policy: pinned, but it cannot exit.
    assert_eq!(
        select_path(
            &c,
            &PathRequest {
                exit_nickname: Some("r6"),
                ..req(target)
            },
            &mut rng
        ),
        Err(PathError::ExitPolicyRejects {
            exit: "r6".into(),
            target: "localhost:80".into()
        })
    );
    let ip = PathTarget::Ip("1.2.3.4:80".parse().unwrap());
    assert!(matches!(
        select_path(
            &c,
            &PathRequest {
                exit_nickname: Some("r1"),
                ..req(ip)
            },
            &mut rng
        ),
        Err(PathError::ExitPolicyRejects { .. })
    ));
}

#[test]
fn preferred_guard_and_fallbacks() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(11);
    // A preferred guard is used even without the Guard flag when it is usable.
    let g = c.relays[11].identity; // r12, plain relay
    for _ in 0..50 {
        let p = select_path(
            &c,
            &PathRequest {
                guard: Some(&g),
                ..req(PathTarget::Any)
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(p[0].identity, g);
    }
    // Preferred guard equal to the pinned exit: another guard is chosen.
    let r1 = c.relays[0].identity;
    let p = select_path(
        &c,
        &PathRequest {
            guard: Some(&r1),
            exit_nickname: Some("r1"),
            ..req(PathTarget::Any)
        },
        &mut rng,
    )
    .unwrap();
    assert_eq!(p[2].identity, r1);
    assert_ne!(p[0].identity, r1);
    // No Guard flags at all: any relay serves as guard.
    let flat = consensus(vec![
        relay(1, 10, EXIT_G, LOOPBACK),
        relay(2, 10, ALL, &[]),
        relay(3, 10, ALL, &[]),
    ]);
    let p = select_path(&flat, &req(PathTarget::Any), &mut rng).unwrap();
    assert_eq!(p.len(), 3);
    assert!(choose_guard(&flat, &[], &mut rng).is_some());
    // choose_guard prefers the flag.
    for _ in 0..50 {
        let g = choose_guard(&c, &[], &mut rng).unwrap();
        assert!(g.flags.contains(RelayFlags::GUARD));
    }
    assert!(choose_guard(&consensus(vec![]), &[], &mut rng).is_none());
}

#[test]
fn not_enough_relays_and_bad_hops() {
    let mut rng = StdRng::seed_from_u64(13);
    let two = consensus(vec![
        relay(1, 10, EXIT_G, LOOPBACK),
        relay(2, 10, RelayFlags::GUARD, &[]),
    ]);
    assert_eq!(
        select_path(&two, &req(PathTarget::Any), &mut rng),
        Err(PathError::NotEnoughRelays { need: 3, have: 2 })
    );
    // Relays not flagged Running do not count.
    let mut down = relay(3, 10, ALL, &[]);
    down.flags = RelayFlags::VALID;
    let mut v = two.relays.clone();
    v.push(down);
    assert_eq!(
        select_path(&consensus(v), &req(PathTarget::Any), &mut rng),
        Err(PathError::NotEnoughRelays { need: 3, have: 2 })
    );
    assert!(select_path(
        &two,
        &PathRequest {
            hops: 2,
            ..req(PathTarget::Any)
        },
        &mut rng
    )
    .is_ok());
    assert_eq!(
        select_path(
            &two,
            &PathRequest {
                hops: 0,
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::BadHopCount(0))
    );
}

#[test]
fn zero_bandwidth_relays_still_chosen_uniformly() {
    let c = consensus(vec![
        relay(1, 0, EXIT_G, LOOPBACK),
        relay(2, 0, RelayFlags::GUARD, &[]),
        relay(3, 0, ALL, &[]),
    ]);
    let mut rng = StdRng::seed_from_u64(17);
    let p = select_path(&c, &req(PathTarget::Any), &mut rng).unwrap();
    let names: Vec<&str> = p.iter().map(|r| r.nickname.as_str()).collect();
    assert_eq!(names, ["r2", "r3", "r1"]);
}

fn names<'c>(p: &[&'c ConsensusRelay]) -> Vec<&'c str> {
    p.iter().map(|r| r.nickname.as_str()).collect()
}

fn list(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn entry_and_middle_nodes_pin_guard_and_middle() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(21);
    // r12 has no Guard flag: EntryNodes does not require it. Nickname case is ignored.
    let entry = list(&["r12"]);
    let middle = list(&["R13"]);
    let r6 = c.relays[5].identity;
    let mut exits = std::collections::HashSet::new();
    for i in 0..1000 {
        let p = select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                middle_nodes: &middle,
                // A preferred guard outside EntryNodes is not used.
                guard: if i % 2 == 0 { Some(&r6) } else { None },
                ..req(PathTarget::Any)
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(names(&p)[..2], ["r12", "r13"]);
        assert!(p[2].flags.contains(RelayFlags::EXIT));
        exits.insert(p[2].nickname.clone());
    }
    // The exit stays a free, weighted choice.
    assert_eq!(exits.len(), 5, "exits used: {exits:?}");

    // Identities work too; several listed relays are all used; a preferred guard in
    // the list is kept.
    let entry = vec![c.relays[10].identity.to_hex(), "r12".to_string()];
    let middle = list(&["r13", "r14"]);
    let (mut seen_guard, mut seen_mid) = (Vec::new(), Vec::new());
    for _ in 0..400 {
        let p = select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                middle_nodes: &middle,
                hops: 4,
                ..req(PathTarget::Any)
            },
            &mut rng,
        )
        .unwrap();
        let n = names(&p);
        assert!(["r11", "r12"].contains(&n[0]), "guard {n:?}");
        let mut mids = [n[1], n[2]];
        mids.sort();
        assert_eq!(mids, ["r13", "r14"], "middles {n:?}");
        seen_guard.push(n[0].to_string());
        seen_mid.push(n[1].to_string());
    }
    for want in ["r11", "r12"] {
        assert!(seen_guard.iter().any(|g| g == want), "{want} never guard");
    }
    for want in ["r13", "r14"] {
        assert!(
            seen_mid.iter().any(|g| g == want),
            "{want} never first middle"
        );
    }
    let r11 = c.relays[10].identity;
    for _ in 0..50 {
        let p = select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                guard: Some(&r11),
                ..req(PathTarget::Any)
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(p[0].nickname, "r11");
    }
}

#[test]
fn unpinned_exit_avoids_the_only_listed_entry_and_middle() {
    // All of r1..r5 are exits; EntryNodes=[r2], MiddleNodes=[r3] must give
    // r2 -> r3 -> (an exit other than r2, r3) every time, never an error.
    let c = net();
    let mut rng = StdRng::seed_from_u64(23);
    let entry = list(&["r2"]);
    let middle = list(&["r3"]);
    for _ in 0..500 {
        let p = select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                middle_nodes: &middle,
                ..req(PathTarget::Host("localhost", 80))
            },
            &mut rng,
        )
        .unwrap();
        let n = names(&p);
        assert_eq!(n[..2], ["r2", "r3"]);
        assert!(["r1", "r4", "r5"].contains(&n[2]), "exit {n:?}");
    }
    // MiddleNodes only: the guard keeps away from the single listed middle (r6 is a
    // Guard-flagged relay), even when it is the preferred guard.
    let middle = list(&["r6"]);
    let r6 = c.relays[5].identity;
    for i in 0..300 {
        let p = select_path(
            &c,
            &PathRequest {
                middle_nodes: &middle,
                guard: if i % 2 == 0 { Some(&r6) } else { None },
                ..req(PathTarget::Any)
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(p[1].nickname, "r6");
        assert_ne!(p[0].nickname, "r6");
        assert!(p[0].flags.contains(RelayFlags::GUARD));
    }
}

#[test]
fn entry_and_middle_nodes_combine_with_exit_pinning() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(25);
    let entry = list(&["r12"]);
    // An exit-flagged relay may serve as a middle.
    let middle = list(&["r1"]);
    for _ in 0..200 {
        let p = select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                middle_nodes: &middle,
                exit_nickname: Some("r4"),
                ..req(PathTarget::Ip("127.0.0.1:80".parse().unwrap()))
            },
            &mut rng,
        )
        .unwrap();
        assert_eq!(names(&p), ["r12", "r1", "r4"]);
    }
    // The pinned exit's policy is still enforced.
    assert!(matches!(
        select_path(
            &c,
            &PathRequest {
                entry_nodes: &entry,
                exit_nickname: Some("r6"),
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::ExitPolicyRejects { .. })
    ));
}

#[test]
fn unmatched_entry_or_middle_nodes_are_an_error() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(27);
    let nobody = list(&["nobody"]);
    let err = select_path(
        &c,
        &PathRequest {
            entry_nodes: &nobody,
            ..req(PathTarget::Any)
        },
        &mut rng,
    )
    .unwrap_err();
    assert_eq!(
        err,
        PathError::NoMatchingRelay {
            option: "EntryNodes",
            nodes: nobody.clone()
        }
    );
    assert!(err.to_string().contains("EntryNodes [\"nobody\"]"), "{err}");
    assert_eq!(
        select_path(
            &c,
            &PathRequest {
                middle_nodes: &nobody,
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::NoMatchingRelay {
            option: "MiddleNodes",
            nodes: nobody.clone()
        })
    );
    // A malformed entry restricts to nothing rather than lifting the restriction.
    let junk = list(&["bad name!"]);
    let bad_hex = list(&[&"g".repeat(64)]);
    for l in [&junk, &bad_hex] {
        assert!(matches!(
            select_path(
                &c,
                &PathRequest {
                    entry_nodes: l,
                    ..req(PathTarget::Any)
                },
                &mut rng
            ),
            Err(PathError::NoMatchingRelay { .. })
        ));
    }
    // The only listed entry is the pinned exit.
    let r2 = list(&["r2"]);
    assert_eq!(
        select_path(
            &c,
            &PathRequest {
                entry_nodes: &r2,
                exit_nickname: Some("r2"),
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::NoMatchingRelay {
            option: "EntryNodes",
            nodes: r2.clone()
        })
    );
    // Two middles wanted, one listed.
    let one = list(&["r13"]);
    assert!(matches!(
        select_path(
            &c,
            &PathRequest {
                middle_nodes: &one,
                hops: 4,
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::NoMatchingRelay {
            option: "MiddleNodes",
            ..
        })
    ));
    // Same relay as the only entry and the only middle.
    let r12 = list(&["r12"]);
    assert!(matches!(
        select_path(
            &c,
            &PathRequest {
                entry_nodes: &r12,
                middle_nodes: &r12,
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::NoMatchingRelay {
            option: "MiddleNodes",
            ..
        })
    ));
    // A relay not Running does not match.
    let mut v = c.relays.clone();
    v[11].flags = RelayFlags::VALID; // r12
    assert!(matches!(
        select_path(
            &consensus(v),
            &PathRequest {
                entry_nodes: &r12,
                ..req(PathTarget::Any)
            },
            &mut rng
        ),
        Err(PathError::NoMatchingRelay { .. })
    ));
    // One hop has no entry or middle: the lists do not apply.
    let p = select_path(
        &c,
        &PathRequest {
            entry_nodes: &nobody,
            middle_nodes: &nobody,
            hops: 1,
            ..req(PathTarget::Any)
        },
        &mut rng,
    )
    .unwrap();
    assert!(p[0].flags.contains(RelayFlags::EXIT));
}

#[test]
fn choose_guard_respects_entry_nodes() {
    let c = net();
    let mut rng = StdRng::seed_from_u64(29);
    let r12 = list(&["r12"]);
    for _ in 0..50 {
        assert_eq!(choose_guard(&c, &r12, &mut rng).unwrap().nickname, "r12");
    }
    let two = vec![c.relays[6].identity.to_hex(), "R11".to_string()];
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        seen.insert(choose_guard(&c, &two, &mut rng).unwrap().nickname.clone());
    }
    let mut seen: Vec<String> = seen.into_iter().collect();
    seen.sort();
    assert_eq!(seen, ["r11", "r7"]);
    assert!(choose_guard(&c, &list(&["nobody"]), &mut rng).is_none());
}

#[test]
fn node_spec_validation() {
    assert!(valid_node_spec("relayA"));
    assert!(valid_node_spec("r"));
    assert!(valid_node_spec(&"a".repeat(19)));
    assert!(valid_node_spec(&"aB09".repeat(16)));
    assert!(!valid_node_spec(""));
    assert!(!valid_node_spec(&"a".repeat(20)));
    assert!(!valid_node_spec("relay-A"));
    assert!(!valid_node_spec("relay A"));
    assert!(!valid_node_spec(&"g".repeat(64)));
    assert!(!valid_node_spec(&"a".repeat(63)));
    assert!(!valid_node_spec(&"a".repeat(65)));
    assert!(!valid_node_spec("é"));
}

#[test]
fn exit_notation() {
    assert_eq!(
        parse_exit_notation("example.com.relay1.exit"),
        Some(("example.com", "relay1"))
    );
    assert_eq!(
        parse_exit_notation("localhost.R2.EXIT"),
        Some(("localhost", "R2"))
    );
    assert_eq!(
        parse_exit_notation("127.0.0.1.relay3.exit"),
        Some(("127.0.0.1", "relay3"))
    );
    assert_eq!(parse_exit_notation("example.com"), None);
    assert_eq!(parse_exit_notation("relay1.exit"), None);
    assert_eq!(parse_exit_notation(".relay1.exit"), None);
    assert_eq!(parse_exit_notation("host..exit"), None);
    assert_eq!(parse_exit_notation("exit"), None);
    assert_eq!(parse_exit_notation("é.exit"), None);
    assert_eq!(parse_exit_notation("examplexexit"), None);
}

#[test]
fn path_to_a_fixed_last_hop() {
    let c = net();
    let last = c.relays[10].identity; // r11, a plain relay (not an exit)
    let mut rng = StdRng::seed_from_u64(8);
    for hops in [3, 4] {
        let r = PathRequest {
            hops,
            ..req(PathTarget::Any)
        };
        for _ in 0..50 {
            let p = select_path_to(&c, &r, &last, &mut rng).unwrap();
            assert_eq!(p.len(), hops - 1);
            let mut ids: Vec<_> = p.iter().map(|r| r.identity).collect();
            ids.push(last);
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), hops, "distinct, and not the last hop");
            assert!(p[0].flags.contains(RelayFlags::GUARD), "guard flagged");
        }
    }
    // EntryNodes pins the first hop.
    let entry = vec!["r12".to_string()];
    let r = PathRequest {
        entry_nodes: &entry,
        ..req(PathTarget::Any)
    };
    let p = select_path_to(&c, &r, &last, &mut rng).unwrap();
    assert_eq!(p[0].nickname, "r12");
    // A tiny consensus shortens the path instead of failing; none at all fails.
    let tiny = consensus(vec![
        relay(1, 1, ALL, &[]),
        relay(2, 1, ALL, &[]),
        relay(3, 1, ALL, &[]),
    ]);
    let four = PathRequest {
        hops: 4,
        ..req(PathTarget::Any)
    };
    let p = select_path_to(&tiny, &four, &tiny.relays[2].identity, &mut rng).unwrap();
    assert_eq!(p.len(), 2);
    let lonely = consensus(vec![relay(1, 1, ALL, &[])]);
    assert!(select_path_to(&lonely, &four, &lonely.relays[0].identity, &mut rng).is_err());
}
