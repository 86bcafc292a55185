"""Reading a chive node's PortsFile (chive_lab/ports.py): the addresses the kernel gave the
listeners the lab configured with port 0."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chive_lab import config as cfg
from chive_lab.errors import LabError
from chive_lab.ports import PORTS_FILE, any_port, parse_ports, read_ports, wait_listening, wait_ports


def test_parse_ports_reads_every_option_v4_and_v6():
    text = '{"ORPort": "127.0.0.1:40123", "MetricsPort": "[::1]:9101"}\n'
    assert parse_ports(text) == {"ORPort": "127.0.0.1:40123", "MetricsPort": "[::1]:9101"}


@pytest.mark.parametrize("text, match", [
    ('{"ORPort": "127.0.0.1:40', "not JSON"),
    ('["127.0.0.1:1"]', "JSON object"),
    ("{}", "JSON object"),
    ('{"ORPort": 40123}', "not an \"IP:PORT\" string"),
    ('{"ORPort": "127.0.0.1"}', "not a bound"),
    ('{"ORPort": "127.0.0.1:0"}', "not a bound"),  # port 0 is what the node was told, not what it got
    ('{"ORPort": "127.0.0.1:70000"}', "not a bound"),
    ('{"ORPort": "relay1:9001"}', "not a bound"),
])
def test_malformed_ports_file_is_a_clear_error(tmp_path: Path, text, match):
    path = tmp_path / PORTS_FILE
    path.write_text(text)
    with pytest.raises(LabError, match=match) as exc:
        read_ports(path)
    assert str(path) in str(exc.value)


def test_read_ports_is_none_until_the_file_exists(tmp_path: Path):
    assert read_ports(tmp_path / PORTS_FILE) is None


def test_wait_ports_returns_once_a_late_file_appears(tmp_path: Path):
    path = tmp_path / "relay1" / PORTS_FILE
    path.parent.mkdir()
    checks = []

    def write_later():
        time.sleep(0.3)
        tmp = path.with_name(PORTS_FILE + ".tmp")
        tmp.write_text('{"ORPort": "127.0.0.1:40123"}\n')
        tmp.rename(path)

    t = threading.Thread(target=write_later)
    t.start()
    try:
        ports = wait_ports(path, want=["ORPort"], deadline=time.monotonic() + 60,
                           check=lambda: checks.append(1), node="relay1")
    finally:
        t.join()
    assert ports == {"ORPort": "127.0.0.1:40123"}
    assert checks, "the node's liveness was checked while waiting"


def test_wait_ports_names_the_node_on_timeout_missing_option_or_exit(tmp_path: Path):
    path = tmp_path / PORTS_FILE
    with pytest.raises(LabError, match="relay1 wrote no PortsFile") as exc:
        wait_ports(path, want=["ORPort"], deadline=time.monotonic() + 0.1, node="relay1")
    assert exc.value.node == "relay1"

    def exited():
        raise LabError("relay1 exited during start-up", node="relay1")

    with pytest.raises(LabError, match="exited during start-up"):
        wait_ports(path, want=["ORPort"], deadline=time.monotonic() + 60, check=exited, node="relay1")
    path.write_text('{"MetricsPort": "127.0.0.1:9101"}')
    with pytest.raises(LabError, match="lists no ORPort .*it has MetricsPort") as exc:
        wait_ports(path, want=["ORPort"], deadline=time.monotonic() + 60, node="relay1")
    assert exc.value.node == "relay1"
    path.write_text("not json")
    with pytest.raises(LabError, match="not JSON") as exc:
        wait_ports(path, want=["ORPort"], deadline=time.monotonic() + 60, node="relay1")
    assert exc.value.node == "relay1"


def test_every_chive_config_asks_for_port_0_and_a_ports_file(tmp_path: Path):
    auth = cfg.authority_config(data_dir=tmp_path, consensus_interval=2, params={}, log="info")
    relay = cfg.relay_config(nickname="relay1", data_dir=tmp_path, authority="127.0.0.1:1",
                             authority_identity="00" * 32, bandwidth_rate=None, overrides={}, log="info")
    client = cfg.client_config(data_dir=tmp_path, authority="127.0.0.1:1", authority_identity="00" * 32,
                               log="info")
    assert (auth["DirPort"], relay["ORPort"], client["SocksPort"]) == ("127.0.0.1:0",) * 3
    assert auth["PortsFile"] == relay["PortsFile"] == client["PortsFile"] == PORTS_FILE
    assert cfg.httpd_config() == {"Listen": "127.0.0.1:0"}
    with pytest.raises(LabError, match="managed"):
        cfg.client_config(data_dir=tmp_path, authority="a", authority_identity="b", log="info",
                          overrides={"PortsFile": "x.json"})
    assert any_port() == "127.0.0.1:0" and any_port("::1") == "[::1]:0"


def test_httpd_address_comes_from_its_first_stdout_line_in_its_log(tmp_path: Path):
    log = tmp_path / "chive.log"
    log.write_text("2026-11-26T18:00:00Z INFO chive_tools::httpd: listening on 127.0.0.1:43211\n")

    def append_later():
        time.sleep(0.3)
        with open(log, "a") as f:
            f.write('{"listening":"127.0.0.1:43211"}\n')

    t = threading.Thread(target=append_later)
    t.start()
    try:
        assert wait_listening(log, deadline=time.monotonic() + 60, node="httpd") == "127.0.0.1:43211"
    finally:
        t.join()
    log.write_text('{"listening": 43211}\n')
    with pytest.raises(LabError, match="not an \"IP:PORT\" string") as exc:
        wait_listening(log, deadline=time.monotonic() + 60, node="httpd")
    assert exc.value.node == "httpd"
    log.write_text('{"listening": "127.0.0.1:43\n')
    with pytest.raises(LabError, match="malformed address line"):
        wait_listening(log, deadline=time.monotonic() + 60, node="httpd")
    log.write_text("")
    with pytest.raises(LabError, match="httpd printed no listening address"):
        wait_listening(log, deadline=time.monotonic() + 0.1, node="httpd")
