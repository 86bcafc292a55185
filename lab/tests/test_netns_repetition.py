"""The lifecycle every netns overlay kind's repetition shares (netns_overlay.netns_repetition
and NetnsKind), on fakes: no namespaces, no processes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from chive_lab.errors import LabError, RunFailed
from chive_lab.experiments import netns_overlay as no
from chive_lab.options import option


class FakeTestbed:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def up(self) -> None:
        self.log.append("up")

    def down(self) -> None:
        self.log.append("down")


class FakeOverlay:
    """Stands for chive's Overlay and (subclassed) TorOverlay: records what the lifecycle does."""

    def __init__(self, tb, dir, *, binary=None, log="info", progress=None):  # noqa: A002
        self.tb, self.dir, self.binary, self.log_level = tb, Path(dir), binary, log
        tb.log.append(f"overlay {type(self).__name__} {self.dir.name} {log}")

    def stop(self) -> dict:
        self.tb.log.append("stop")
        return {}


class FakeTorOverlay(FakeOverlay):
    tools = SimpleNamespace(version="0.4.9.99")

    def evidence(self) -> dict:
        self.tb.log.append("evidence")
        return {"circuits": {"clientA": []}}


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.setattr(no.netns, "Overlay", FakeOverlay)
    monkeypatch.setattr(no, "TorOverlay", FakeTorOverlay)


def test_chive_repetition_stops_the_overlay_then_the_testbed(tmp_path, fakes):
    log: list[str] = []
    out = tmp_path / "runs" / "v" / "1"  # created by the lifecycle
    with no.netns_repetition(out, FakeTestbed(log), "chive", chive_bin=Path("/bin/true"),
                             log_level="debug") as run:
        assert not run.tor and isinstance(run.ov, FakeOverlay)
        run.write_run({"t0": 1.5, "hosts": ("A", "B")})
        log.append("traffic")
    assert log == ["up", "overlay FakeOverlay net debug", "traffic", "stop", "down"]
    assert json.loads((out / "run.json").read_text()) == {"t0": 1.5, "hosts": ["A", "B"]}
    assert not (out / "tor.json").exists()


def test_tor_repetition_records_version_and_evidence_before_stopping(tmp_path, fakes):
    log: list[str] = []
    with no.netns_repetition(tmp_path, FakeTestbed(log), "tor") as run:
        assert run.tor
        info = {"t0": 2.0}
        run.write_run(info)
    assert info["tor_version"] == "0.4.9.99"  # the caller's dict too (kinds return it)
    assert json.loads((tmp_path / "run.json").read_text())["tor_version"] == "0.4.9.99"
    assert json.loads((tmp_path / "tor.json").read_text()) == {"circuits": {"clientA": []}}
    assert log[-3:] == ["evidence", "stop", "down"]


@pytest.mark.parametrize("error", [LabError("boom"), RunFailed("service silent"), KeyboardInterrupt()])
def test_a_failing_body_takes_the_testbed_down_without_stopping_in_order(tmp_path, fakes, error):
    log: list[str] = []
    with pytest.raises(type(error)):
        with no.netns_repetition(tmp_path, FakeTestbed(log), "tor"):
            raise error
    # tb.down() stops every process of the testbed; tor's evidence is not asked of a failed run.
    assert log == ["up", "overlay FakeTorOverlay net info", "down"]
    assert not (tmp_path / "tor.json").exists()


def test_an_overlay_that_cannot_be_made_still_takes_the_testbed_down(tmp_path, monkeypatch):
    class NoTor(FakeTorOverlay):
        def __init__(self, *a, **kw):
            raise LabError("tor is not installed")

    monkeypatch.setattr(no, "TorOverlay", NoTor)
    log: list[str] = []
    with pytest.raises(LabError, match="not installed"):
        with no.netns_repetition(tmp_path, FakeTestbed(log), "tor"):
            pytest.fail("the body must not run")
    assert log == ["up", "down"]


@dataclass(frozen=True)
class Opts:
    seconds: int = option(5, lo=1, hi=60)


class Kind(no.NetnsKind):
    name = "fake-netns"
    Options = Opts

    def __init__(self) -> None:
        self.calls: list = []

    def doing(self, scenario, p):
        return f"{p.seconds} s of nothing"

    def repetition(self, ctx, p, run_dir):
        self.calls.append((p, run_dir))


def test_netns_kind_runs_the_repetition_with_the_scenario_options(tmp_path, monkeypatch):
    monkeypatch.setattr(no.bulk.netns, "available", lambda: None)
    status: list[str] = []
    kind = Kind()
    ctx = SimpleNamespace(scenario=SimpleNamespace(options=Opts(seconds=7)), variant=SimpleNamespace(label="v"),
                          run_dir=str(tmp_path), status=status.append)
    kind.run_repetition(ctx)
    assert kind.calls == [(Opts(seconds=7), tmp_path)] and status == ["v: 7 s of nothing"]
    # A result analysed without its scenario's options gets the defaults.
    assert kind.options_of(SimpleNamespace(options=None)) == Opts()


def test_netns_kind_refuses_without_the_netns_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(no.bulk.netns, "available", lambda: "not root")
    kind = Kind()
    ctx = SimpleNamespace(scenario=SimpleNamespace(options=Opts()), variant=SimpleNamespace(label="v"),
                          run_dir=str(tmp_path), status=lambda _m: None)
    with pytest.raises(LabError, match="fake-netns needs the netns backend: not root"):
        kind.run_repetition(ctx)
    assert kind.calls == []
