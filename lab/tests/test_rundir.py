"""rundir.run_status: the status a repetition's run.json records for each way its body ends;
rundir.backend_network: a backend network's lifecycle (on a fake backend)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chive_lab.errors import LabError
from chive_lab.rundir import backend_network, run_status


def test_ok_when_the_body_finishes():
    meta = {"status": "running"}
    with run_status(meta):
        pass
    assert meta["status"] == "ok"


def test_lab_error_is_recorded_with_its_log_tail_and_raised():
    meta = {"status": "running"}
    err = LabError("relay2 did not start", log_tail="last lines")
    with pytest.raises(LabError):
        with run_status(meta):
            raise err
    assert meta["status"] == "error: relay2 did not start"
    assert meta["error_log_tail"] == "last lines"


def test_other_errors_name_their_type_and_interrupts_are_not_errors():
    meta = {"status": "running"}
    with pytest.raises(ValueError):
        with run_status(meta):
            raise ValueError("bad number")
    assert meta["status"] == "error: ValueError: bad number" and "error_log_tail" not in meta
    with pytest.raises(KeyboardInterrupt):
        with run_status(meta):
            raise KeyboardInterrupt
    assert meta["status"] == "interrupted"


class FakeBackend:
    """Starts a "network" by writing one node log; records the order of events."""

    def __init__(self, log: list[str], fail_start: bool = False, fail_stop: bool = False) -> None:
        self.log, self.fail_start, self.fail_stop = log, fail_start, fail_stop

    def start(self, spec, net_dir, *, impl, progress):
        progress(f"starting {spec} as {impl}")
        (net_dir / "relay1").mkdir(parents=True)
        (net_dir / "relay1" / "chive.log").write_text("relay1 up\n")
        self.log.append("start")
        if self.fail_start:
            raise LabError("relay1 refused its config")
        return SimpleNamespace(socks="127.0.0.1:9050")

    def stop(self, net_dir):
        self.log.append("stop")
        if self.fail_stop:
            raise LabError("relay1 would not stop")
        return SimpleNamespace(ok=True, failed={})


def _network(tmp_path, backend, down, log):
    ctx = SimpleNamespace(backend=backend, run_dir=tmp_path)
    return backend_network(ctx, "spec", tmp_path / "net", "chive", phase="load", up_log=tmp_path / "up-load.log",
                           logs_dir=tmp_path / "logs-load", down=down, key="load",
                           before_stop=lambda: log.append("clients stopped"))


def test_backend_network_stops_the_clients_then_the_network_and_keeps_the_logs(tmp_path):
    log: list[str] = []
    down: dict = {}
    with _network(tmp_path, FakeBackend(log), down, log) as info:
        log.append(f"body {info.socks}")
    assert log == ["start", "body 127.0.0.1:9050", "clients stopped", "stop"]
    assert down == {"load": {"ok": True, "failed": {}}}
    assert (tmp_path / "up-load.log").read_text() == "starting spec as chive\n"
    assert (tmp_path / "logs-load" / "logs" / "relay1.log").read_text() == "relay1 up\n"


def test_backend_network_stops_after_a_failed_start_and_records_a_failed_stop(tmp_path):
    log: list[str] = []
    down: dict = {}
    with pytest.raises(LabError, match="refused"):
        with _network(tmp_path, FakeBackend(log, fail_start=True, fail_stop=True), down, log):
            pytest.fail("the body must not run")
    assert log == ["start", "clients stopped", "stop"]
    assert down == {"load": {"ok": False, "error": "relay1 would not stop"}}
    assert (tmp_path / "logs-load" / "logs" / "relay1.log").is_file()
