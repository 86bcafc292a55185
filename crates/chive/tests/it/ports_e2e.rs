//! Where the e2e harness's ports come from (`PortsFile`): every node is given port 0, binds it
//! and writes the addresses it got. The harness used to probe a free port, release it and hand
//! the number to the node, and a parallel test's node (or any outgoing connection) could take
//! it in between ("MetricsPort …: Address already in use"). Here the port such a probe would
//! have returned is held by the test: a node told to use it fails at once, naming the option,
//! and leaves no ports file behind; a node given port 0 gets another port and says which.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// A relay config whose authority never answers (the relay binds before it asks), with
/// `MetricsPort = metrics`.
fn relay_config(dir: &std::path::Path, name: &str, metrics: &str) -> std::path::PathBuf {
    let auth_cfg = dir.join("auth.toml");
    std::fs::write(
        &auth_cfg,
        format!(
            "Nickname = \"auth\"\nDataDirectory = \"{}\"\nDirPort = \"{ANY_PORT}\"\n",
            dir.join("auth").display()
        ),
    )
    .unwrap();
    let authority_id = print_identity(&auth_cfg);
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "Nickname = \"{name}\"\nDataDirectory = \"{}\"\nORPort = \"{ANY_PORT}\"\n\
             Authority = \"127.0.0.1:9\"\nAuthorityIdentity = \"{authority_id}\"\n\
             MetricsPort = \"{metrics}\"\nPortsFile = \"{}\"\n",
            dir.join(name).display(),
            ports_path(dir, name).display(),
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn a_port_held_by_someone_else_fails_the_node_and_port_0_does_not() {
    let _turn = shared_turn();
    let dir = std::env::temp_dir().join(format!("chive-e2e-ports-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // What `free_port()` did, except that this time someone keeps the port.
    let held = TcpListener::bind(ANY_PORT).unwrap();
    let taken = held.local_addr().unwrap();

    // Told to use the taken port: the relay exits with the option named, and writes no
    // ports file (a reader waiting for it sees the exit, never a half-started node).
    let cfg = relay_config(&dir, "taken", &taken.to_string());
    let out = Command::new(BIN)
        .args(["relay", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started on a port in use: {err}");
    assert!(
        err.contains("MetricsPort") && err.contains(&taken.to_string()),
        "the error should name MetricsPort and the address: {err}"
    );
    assert!(!ports_path(&dir, "taken").exists());

    // Given port 0 for both listeners: the kernel's ports, reported in the file, listening.
    let cfg = relay_config(&dir, "free", ANY_PORT);
    let mut child = spawn(&dir, "free", &["relay", "--config", cfg.to_str().unwrap()]);
    let t0 = Instant::now();
    let ports = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_ports(&dir, "free", &mut child)
    }));
    let alive = child.try_wait().unwrap().is_none();
    let connect = |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_secs(5)).is_ok();
    let result = ports.map(|p| {
        let (or, metrics) = (p["ORPort"], p["MetricsPort"]);
        (or, metrics, connect(&or), connect(&metrics), p.len())
    });
    let _ = child.kill();
    let _ = child.wait();
    let (or, metrics, or_ok, metrics_ok, n) = result.expect("no ports file");
    assert!(alive, "the relay exited: {}", dir.display());
    assert_eq!(n, 2, "ORPort and MetricsPort only");
    for a in [or, metrics] {
        assert!(a.ip().is_loopback() && a.port() != 0 && a != taken, "{a}");
    }
    assert_ne!(or, metrics);
    assert!(or_ok && metrics_ok, "{or} {or_ok}, {metrics} {metrics_ok}");
    eprintln!("ports file after {:?}: {or} {metrics}", t0.elapsed());
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}
