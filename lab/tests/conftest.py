"""Shared fixtures: a fake chive binary, process clean-up, figures without pixels."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # so tests can import fake_chive


@pytest.fixture(scope="session", autouse=True)
def _tor_keys_kept_for_the_session(tmp_path_factory):
    """Every tor network of this pytest process reuses its nodes' identities (by node name)
    after the first network made them (``chive_lab.tor.keys``): three 3072-bit authority
    keys are 20-30 s of each network's start on a loaded machine (docs/testing.md). The
    ``chive-lab`` commands the tests start inherit it. A cache given from outside is kept."""
    from chive_lab.tor import KEY_CACHE_ENV

    if os.environ.get(KEY_CACHE_ENV):
        yield
        return
    os.environ[KEY_CACHE_ENV] = str(tmp_path_factory.mktemp("tor-keys"))
    yield
    os.environ.pop(KEY_CACHE_ENV, None)


@pytest.fixture
def fake_chive(tmp_path: Path) -> Path:
    """An executable `chive` stand-in (see fake_chive.py).

    The shebang names this interpreter directly, so the process's command line
    is final as soon as it starts (no shim re-exec that the lab could observe
    half way).
    """
    path = tmp_path / "bin" / "chive"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\n" + (HERE / "fake_chive.py").read_text())
    path.chmod(0o755)
    return path


@pytest.fixture
def reaper():
    """Collects ProcessRecords of processes a test started; at the end, kills
    any that are still the same process, so a failing test leaves nothing
    behind (and never signals a reused pid)."""
    from chive_lab.process import is_same_process

    recs: list = []
    yield recs
    for rec in recs:
        if is_same_process(rec):
            try:
                os.kill(rec.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.waitpid(rec.pid, 0)
        except ChildProcessError:
            pass


def _savefig_without_pixels(fig, fname, *args, **kwargs) -> None:
    """Stands in for ``Figure.savefig``: the file exists (empty), nothing is rasterised."""
    Path(fname).write_bytes(b"")


@pytest.fixture(autouse=True)
def _figures_without_pixels(request, monkeypatch):
    """Every figure is still built (each kind's drawing function runs: axes, lines, labels),
    but ``savefig`` writes an empty file instead of rasterising and encoding a PNG (a third of
    the analysis tests' CPU time, issue 15), and ``tight_layout`` does nothing: it measures
    every text with a renderer, and was 63 % of what was left (cProfile of
    ``test_pool_analyses_several_results_as_one_batch``: 22 of 35 s; docs/testing.md).
    Tests marked ``real_figures`` lay out and render real PNGs (the figure writer's own tests
    and the end-to-end runs that check the report's pictures)."""
    if request.node.get_closest_marker("real_figures") is not None:
        return
    from matplotlib.figure import Figure

    from chive_lab import figures

    monkeypatch.setattr(Figure, "savefig", _savefig_without_pixels)
    monkeypatch.setattr(figures, "palette_png", lambda path: None)
    monkeypatch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)


# Tests that start processes, open ports, create network namespaces or measure time: `make
# test` runs them one after another, alone (`pytest -m serial`), after the rest ran on two
# workers (`pytest -n 2 -m "not serial"`, pytest-xdist). Whole modules here; single tests in
# mixed modules carry `@pytest.mark.serial` (or `e2e`, which implies it).
SERIAL_MODULES = {
    "test_e2e", "test_onion_up", "test_tor_e2e",  # the real binary / the real tor
    "test_netns", "test_paper002",  # network namespaces
    "test_network", "test_process", "test_socks_content",  # processes, ports, timing
}
# Fixtures that start processes.
SERIAL_FIXTURES = {"fake_chive", "reaper"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if (module in SERIAL_MODULES or item.get_closest_marker("e2e") is not None
                or SERIAL_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.serial)
