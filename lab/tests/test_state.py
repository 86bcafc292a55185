"""state.json: round trip and rejection of damaged files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chive_lab.errors import LabError
from chive_lab.process import ProcessRecord
from chive_lab.state import State, load_state, save_state, state_path


def _record(name: str, pid: int) -> ProcessRecord:
    return ProcessRecord(
        name=name,
        pid=pid,
        argv=["/bin/chive", name, "--config", f"/d/{name}/{name}.toml"],
        cmdline=["/bin/chive", name, "--config", f"/d/{name}/{name}.toml"],
        start_ticks=123456,
        started_at=1700000000.5,
        log=f"/d/{name}/chive.log",
        config=f"/d/{name}/{name}.toml",
    )


def test_round_trip(tmp_path: Path):
    state = State(
        dir=str(tmp_path),
        spec={"relays": 3, "relay_overrides": {"A": [1, "x"]}},
        endpoints={"socks": "127.0.0.1:1", "http": "http://127.0.0.1:2"},
        nodes=[_record("authority", 100), _record("relay1", 101), _record("client", 102)],
        status="ready",
    )
    save_state(tmp_path, state)
    loaded = load_state(tmp_path)
    assert loaded == state
    assert loaded.pids() == {"authority": 100, "relay1": 101, "client": 102}
    assert list(loaded.pids()) == ["authority", "relay1", "client"]  # start order kept
    assert not (tmp_path / "state.json.tmp").exists()


def test_start_ticks_may_be_unknown(tmp_path: Path):
    rec = _record("httpd", 200)
    rec.start_ticks = None
    save_state(tmp_path, State(dir=str(tmp_path), nodes=[rec]))
    assert load_state(tmp_path).nodes[0].start_ticks is None


def test_missing_state_is_an_error(tmp_path: Path):
    with pytest.raises(LabError, match="no network was started"):
        load_state(tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"schema": 99, "nodes": []}', "schema"),
        ('{"schema": 1}', "node list"),
        ('{"schema": 1, "nodes": [{"name": "x"}]}', "malformed process record"),
        ('{"schema": 1, "nodes": [{"name": "x", "pid": 1, "argv": [], "cmdline": [], '
         '"started_at": 0, "log": "l"}]}', "invalid pid"),
        ('{"schema": 1, "nodes": [{"name": "x", "pid": -5, "argv": [], "cmdline": [], '
         '"started_at": 0, "log": "l"}]}', "invalid pid"),
    ],
)
def test_damaged_state_is_rejected(tmp_path: Path, content, message):
    state_path(tmp_path).write_text(content)
    with pytest.raises(LabError, match=message):
        load_state(tmp_path)


def test_state_file_is_plain_json(tmp_path: Path):
    save_state(tmp_path, State(dir=str(tmp_path), nodes=[_record("relay1", 4242)]))
    obj = json.loads(state_path(tmp_path).read_text())
    assert obj["schema"] == 1
    assert obj["nodes"][0]["pid"] == 4242
    assert obj["nodes"][0]["cmdline"][1] == "relay1"
