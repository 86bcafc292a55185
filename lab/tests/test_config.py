"""Config writing and --set / --param value typing."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from chive_lab import config as cfg
from chive_lab.cli import build_parser
from chive_lab.errors import LabError


@pytest.mark.parametrize(
    "text, expected",
    [
        ("12", 12),
        ("-3", -3),
        ("+7", 7),
        ("0", 0),
        ("1.5", 1.5),
        ("-0.25", -0.25),
        ("1e3", 1000.0),
        (".5", 0.5),
        ("true", True),
        ("false", False),
        ('["accept *:*", "reject *:*"]', ["accept *:*", "reject *:*"]),
        ("[1, 2.5, true]", [1, 2.5, True]),
        ("[]", []),
        ("rr", "rr"),
        ("ewma", "ewma"),
        ("1.2.3", "1.2.3"),
        ("True", "True"),  # only lower-case true/false are booleans, as in TOML
        ("127.0.0.1:9050", "127.0.0.1:9050"),
        ("", ""),
    ],
)
def test_parse_value_types(text, expected):
    value = cfg.parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["[not json", '[{"a": 1}]', "[null]"])
def test_parse_value_rejects_bad_lists(text):
    with pytest.raises(LabError):
        cfg.parse_value(text)


def test_parse_value_bounds_length():
    with pytest.raises(LabError, match="too long"):
        cfg.parse_value("x" * (cfg.MAX_VALUE_CHARS + 1))


def test_parse_assignment_splits_on_first_equals():
    assert cfg.parse_assignment("Foo=a=b") == ("Foo", "a=b")
    assert cfg.parse_assignment("CircuitPriorityHalflife=0") == ("CircuitPriorityHalflife", 0)
    assert cfg.parse_assignment("Scheduler=rr") == ("Scheduler", "rr")


@pytest.mark.parametrize("text", ["noequals", "bad key=1", "=1", "a.b=1"])
def test_parse_assignment_errors(text):
    with pytest.raises(LabError):
        cfg.parse_assignment(text)


def test_parse_param_requires_integer():
    assert cfg.parse_param("circwindow=101") == ("circwindow", 101)
    with pytest.raises(LabError, match="integer"):
        cfg.parse_param("circwindow=1.5")
    with pytest.raises(LabError):
        cfg.parse_param("circwindow")


@pytest.mark.parametrize(
    "value",
    [
        'quote " and backslash \\ here',
        "new\nline\ttab\rcr",
        "ctrl \x01 \x7f",
        "unicode é 中 😀",
        "",
    ],
)
def test_strings_round_trip(value):
    doc = {"Key": value, "List": [value, value]}
    assert tomllib.loads(cfg.toml_dumps(doc)) == doc


def test_scalars_and_tables_round_trip():
    doc = {
        "I": -5,
        "F": 0.1,
        "Big": 10**15,
        "B": True,
        "Nested": [[1, 2], ["a"]],
        "T": {"circwindow": 101, "x": "y"},
    }
    assert tomllib.loads(cfg.toml_dumps(doc)) == doc


def test_float_that_looks_integral_stays_float():
    parsed = tomllib.loads(cfg.toml_dumps({"H": 30.0}))
    assert parsed["H"] == 30.0 and isinstance(parsed["H"], float)


def test_authority_config_file(tmp_path: Path):
    path = tmp_path / "authority" / "authority.toml"
    cfg.write_toml(
        path,
        cfg.authority_config(
            data_dir=tmp_path / "authority",
            dir_port=7000,
            consensus_interval=2,
            params={"circwindow": 101},
            log="info",
        ),
    )
    assert tomllib.loads(path.read_text()) == {
        "Nickname": "auth",
        "DataDirectory": str(tmp_path / "authority"),
        "DirPort": "127.0.0.1:7000",
        "PortsFile": "ports.json",
        "ConsensusInterval": 2,
        "TestingAllGuards": True,
        "Log": "info",
        "NetworkParameters": {"circwindow": 101},
    }


def test_relay_config_defaults_and_overrides(tmp_path: Path):
    base = dict(
        nickname="relay1",
        data_dir=tmp_path / "relay1",
        or_port=5001,
        authority="127.0.0.1:7000",
        authority_identity="ab" * 32,
        log="info",
    )
    plain = tomllib.loads(cfg.toml_dumps(cfg.relay_config(bandwidth_rate=None, overrides={}, **base)))
    assert plain == {
        "Nickname": "relay1",
        "DataDirectory": str(tmp_path / "relay1"),
        "ORPort": "127.0.0.1:5001",
        "PortsFile": "ports.json",
        "Authority": "127.0.0.1:7000",
        "AuthorityIdentity": "ab" * 32,
        "BandwidthRate": 0,
        "BandwidthBurst": 0,
        "ExitPolicy": ["accept 127.0.0.0/8:*", "reject *:*"],
        "ExitPolicyRejectPrivate": False,
        "MetricsFile": "metrics.jsonl",
        "Log": "info",
    }
    rated = cfg.relay_config(
        bandwidth_rate=1_000_000,
        overrides={"CircuitPriorityHalflife": 0, "ExitPolicy": ["reject *:*"]},
        **base,
    )
    assert rated["BandwidthRate"] == rated["BandwidthBurst"] == 1_000_000
    assert rated["CircuitPriorityHalflife"] == 0
    assert rated["ExitPolicy"] == ["reject *:*"]


@pytest.mark.parametrize("key", sorted(cfg.MANAGED_RELAY_KEYS))
def test_relay_config_refuses_managed_keys(tmp_path: Path, key):
    with pytest.raises(LabError, match="managed by the lab"):
        cfg.relay_config(
            nickname="relay1",
            data_dir=tmp_path,
            or_port=1,
            authority="127.0.0.1:1",
            authority_identity="00" * 32,
            bandwidth_rate=None,
            overrides={key: "x"},
            log="info",
        )


def test_client_and_httpd_config():
    c = cfg.client_config(
        data_dir=Path("/d/client"), socks_port=9050, authority="127.0.0.1:7000",
        authority_identity="cd" * 32, log="debug",
    )
    assert tomllib.loads(cfg.toml_dumps(c)) == {
        "DataDirectory": "/d/client",
        "SocksPort": "127.0.0.1:9050",
        "PortsFile": "ports.json",
        "Authority": "127.0.0.1:7000",
        "AuthorityIdentity": "cd" * 32,
        "Log": "debug",
    }
    assert tomllib.loads(cfg.toml_dumps(cfg.httpd_config(port=8080))) == {"Listen": "127.0.0.1:8080"}


def test_cli_parses_set_param_and_rate():
    args = build_parser().parse_args(
        ["up", "--dir", "x", "--set", "A=1", "--set", "B=[\"a\"]", "--param", "circwindow=101",
         "--bandwidth-rate", "500000"]
    )
    assert dict(args.sets) == {"A": 1, "B": ["a"]}
    assert dict(args.params) == {"circwindow": 101}
    assert args.bandwidth_rate == 500000


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--dir", "x", "--set", "novalue"],
        ["up", "--dir", "x", "--param", "circwindow=abc"],
        ["up", "--dir", "x", "--bandwidth-rate", "-1"],
        ["up", "--dir", "x", "--timeout", "0"],
        ["up"],
        ["down"],
    ],
)
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
