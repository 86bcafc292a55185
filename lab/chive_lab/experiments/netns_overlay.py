"""Running an overlay of chive (or tor) nodes on the netns testbed and reading what
its transfer loops measured; shared by the netns overlay kinds (``client-uplink``,
``paper001-onion``, ``paper002-overlay``, ``paper003-switching``, ``paper004-window``):

* :class:`NetnsKind` — the kind side of one repetition (the netns check, the scenario's
  options, the progress line, tor variants refused up front without tor);
* :func:`netns_repetition` — the lifecycle of one repetition (testbed up, the variant's
  overlay, ``run.json``, ``tor.json``, everything stopped also on errors), so a kind
  supplies only its hosts, its placement and its traffic;
* verified ``chive perf`` loops, the ``ss`` samplers (:mod:`chive_lab.ss_sampler`) started
  inside the hosts, and the per-second series made from their records."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import netns
from ..errors import LabError
from ..kinds import ExperimentKind, RepetitionContext
from ..ss_sampler import WIRE_HEADER_BYTES
from ..tor_netns import TorOverlay, check_tor_variants
from . import bulk

__all__ = ["NetnsKind", "NetnsRun", "link_queues", "netns_repetition", "perf_series", "rx_series",
           "start_perf_loop", "start_sampler", "wait_for_loops"]


class NetnsKind(ExperimentKind):
    """An experiment kind whose repetitions run an overlay on the netns testbed, with
    ``VariantOptions.impl`` choosing chive or Debian's tor. A kind supplies
    :meth:`repetition` (typically a ``run_repetition_raw`` built on
    :func:`netns_repetition`) and :meth:`doing` (the progress line)."""

    #: Every node but tor's is the chive binary (relays, clients, web servers, perf loops).
    needs_chive_binary = True

    def preflight(self, scenario: Any) -> None:
        """Refuse the tor variants when tor is not installed."""
        check_tor_variants(self.name, [v.label for v in scenario.variants],
                           [v.label for v in scenario.variants if v.options.impl == "tor"])

    def run_repetition(self, ctx: RepetitionContext) -> None:
        """LabError without the netns backend; else the scenario's options (defaults if it has
        none), the progress line, and :meth:`repetition` into ``ctx.run_dir``."""
        p = bulk.repetition_options(ctx, self.name, self.Options)
        ctx.status(f"{ctx.variant.label}: {self.doing(ctx.scenario, p)}")
        self.repetition(ctx, p, Path(ctx.run_dir))

    def doing(self, scenario: Any, p: Any) -> str:
        """What one repetition does, for the progress line."""
        return "running"

    def repetition(self, ctx: RepetitionContext, p: Any, run_dir: Path) -> None:
        """One repetition of ``ctx.variant`` with the scenario's options ``p``."""
        raise NotImplementedError


class NetnsRun:
    """A repetition's testbed and overlay while they are up (see :func:`netns_repetition`)."""

    def __init__(self, tb: netns.Testbed, ov: netns.Overlay, out_dir: Path) -> None:
        self.tb = tb
        self.ov = ov
        self.out_dir = out_dir

    @property
    def tor(self) -> bool:
        """Whether the overlay is Debian's tor (every role but the web servers)."""
        return isinstance(self.ov, TorOverlay)

    def write_run(self, info: dict[str, Any]) -> None:
        """``run.json``: ``info``, with the tor version on a tor overlay (lists for tuples)."""
        if isinstance(self.ov, TorOverlay):
            info["tor_version"] = self.ov.tools.version
        (self.out_dir / "run.json").write_text(json.dumps(info, default=list))


@contextmanager
def netns_repetition(out_dir: Path, tb: netns.Testbed, impl: str, *, chive_bin: Path | None = None,
                     log_level: str = "info",
                     progress: Callable[[str], None] | None = None) -> Iterator[NetnsRun]:
    """One repetition's lifecycle, the same for every netns overlay kind: ``out_dir`` created,
    ``tb`` up, and an overlay of ``impl`` (chive's, or tor's in every role) on ``out_dir/net``
    handed to the body, which places the nodes, starts them, writes ``run.json``
    (:meth:`NetnsRun.write_run`) and runs its traffic. After a body that returned: ``tor.json``
    (what tor's control ports say about the circuits and relays) on a tor overlay, then every
    node stopped in order, so logs end cleanly. Always, also on errors and Ctrl-C: the testbed
    down, which stops every process started in it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        tb.up()
        cls = TorOverlay if impl == "tor" else netns.Overlay
        ov = cls(tb, out_dir / "net", binary=chive_bin, log=log_level, progress=progress)
        yield NetnsRun(tb, ov, out_dir)
        if isinstance(ov, TorOverlay):
            (out_dir / "tor.json").write_text(json.dumps(ov.evidence(), indent=1))
        ov.stop()
    finally:
        tb.down()

#: Upload connections receive at least this much; smaller ones are download requests.
_UPLOAD_MIN_RX = 4096


def start_sampler(tb: netns.Testbed, host: str, args: list[str], stop_at: float, out: Path):
    """Start :mod:`chive_lab.ss_sampler`'s ``ss-sample``/``link-sample`` (``args``) inside
    ``host`` until ``stop_at`` (UNIX s), writing ``out``."""
    return tb.popen(host, [sys.executable, "-m", "chive_lab.ss_sampler", *args,
                           "--stop-at", f"{stop_at:.3f}", "--out", str(out)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def start_perf_loop(tb: netns.Testbed, ov: "netns.Overlay", client: str, url: str,
                    window: tuple[float, float], end: float, user: str, label: str,
                    upload_bytes: int | None, stem: Path):
    """Start a verified ``chive perf`` loop through ``client`` on its host: transfers back to
    back from ``window[0]`` to ``window[1]`` (UNIX s; the last one cut there), progress every
    second, SOCKS user ``user`` (its own circuit), uploads of ``upload_bytes`` if given.
    Records go to ``stem``.jsonl / .err."""
    now = time.time()  # perf counts --duration from its own start, delay included
    argv = [str(ov.binary), "perf", "--socks", ov.addr(client), "--url", url,
            "--count", "0", "--duration", f"{max(1.0, window[1] - now):.3f}",
            "--cut-at-deadline", "--start-delay", f"{max(0.0, window[0] - now):.3f}",
            "--progress", "1", "--verify", "--timeout", f"{end + 60:.0f}",
            "--socks-user", user, "--label", label]
    if upload_bytes is not None:
        argv += ["--method", "post", "--upload-bytes", str(upload_bytes)]
    with open(f"{stem}.jsonl", "wb") as fh, open(f"{stem}.err", "wb") as fe:
        return tb.popen(ov.nodes[client].host, argv, stdout=fh, stderr=fe)


def wait_for_loops(perf: list, samplers: list, end_at: float, stop: threading.Event | None = None) -> None:
    """Wait for the perf loops (LabError if ``stop`` is set or they run 60 s past ``end_at``),
    then give the samplers until 10 s past ``end_at`` before stopping them."""
    deadline = end_at + 60
    for pr in perf:
        while pr.poll() is None:
            if (stop is not None and stop.is_set()) or time.time() > deadline:
                raise LabError("run interrupted or overran its deadline")
            time.sleep(0.2)
    for sp in samplers:
        try:
            sp.wait(timeout=max(1.0, end_at + 10 - time.time()))
        except subprocess.TimeoutExpired:
            sp.terminate()


def perf_series(path: Path, t0: float, seconds: int) -> tuple[list[float], dict]:
    """Bit/s per second since ``t0`` of one perf loop, from its progress and
    transfer records (cumulative bytes interpolated at whole seconds), and the
    transfer outcome counts."""
    samples: list[tuple[float, float]] = []
    done = 0.0
    counts = {"ok": 0, "cut": 0, "errors": 0, "bytes_ok": 0, "error_texts": []}
    for r in _records(path, "perf record"):
        if r.get("type") == "progress" and isinstance(r.get("t"), (int, float)):
            samples.append((float(r["t"]), done + float(r.get("bytes") or 0)))
        elif r.get("type") == "transfer":
            b = float(r.get("bytes") or 0)
            err = r.get("error")
            if err is None and r.get("status") is not None and 200 <= int(r["status"]) < 300:
                counts["ok"] += 1
                counts["bytes_ok"] += int(b)
            elif err in ("cut at deadline", "interrupted"):
                counts["cut"] += 1
            else:
                counts["errors"] += 1
                if len(counts["error_texts"]) < 5:
                    counts["error_texts"].append(str(err))
            done += b
            # A cut or failed transfer has no last_byte: its progress records already count.
            t = r.get("last_byte")
            if isinstance(t, (int, float)):
                samples.append((float(t), done))
    samples.sort()
    return per_second_bps(samples, t0, seconds), counts


def _records(path: Path, what: str) -> Iterator[dict]:
    """The JSON objects of a JSON-lines file (other lines skipped); LabError if it is missing."""
    try:
        text = path.read_text()
    except OSError as e:
        raise LabError(f"missing {what} {path}: {e}") from e
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            yield r


def per_second_bps(samples: list[tuple[float, float]], t0: float, seconds: int) -> list[float]:
    """Bit/s in each second k of [t0 + k, t0 + k + 1) from sorted (time, cumulative bytes)
    samples (:func:`_cum_at` between them)."""
    series = []
    prev = _cum_at(samples, t0)
    for k in range(seconds):
        cur = _cum_at(samples, t0 + k + 1)
        series.append(max(0.0, cur - prev) * 8.0)
        prev = cur
    return series


def _cum_at(samples: list[tuple[float, float]], t: float) -> float:
    """Cumulative bytes at time ``t`` (linear between samples, 0 before the first)."""
    if not samples or t <= samples[0][0]:
        # Before the first record the loop had 0 bytes at most a second earlier.
        if samples and t > samples[0][0] - 1.0:
            t_first, b_first = samples[0]
            return b_first * max(0.0, 1.0 - (t_first - t))
        return 0.0
    lo, hi = 0, len(samples) - 1
    if t >= samples[hi][0]:
        return samples[hi][1]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, ba), (tb_, bb) = samples[lo], samples[hi]
    return ba if tb_ <= ta else ba + (bb - ba) * (t - ta) / (tb_ - ta)


def link_queues(run_dir: Path, t0: float, window: tuple[float, float]) -> list[dict]:
    """Per relay-to-relay socket of a run (``links-<host>.jsonl``), over ``window`` seconds
    after ``t0``: mean and max unsent bytes, mean smoothed RTT, number of samples, and (when
    the samples have the counters) ``wire_bytes``: what the socket put on the link between its
    first and last sample in the window, data and headers (:data:`WIRE_HEADER_BYTES` per data
    segment, retransmissions included), over ``wire_span_s`` seconds."""
    rows = []
    for path in sorted(run_dir.glob("links-*.jsonl")):
        host = path.stem.split("-", 1)[1]
        acc: dict[str, list[tuple[float, dict]]] = {}
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                t, socks = float(r["t"]) - t0, r["socks"]
            except (ValueError, KeyError, TypeError):
                continue
            if window[0] <= t < window[1] and isinstance(socks, dict):
                for k, v in socks.items():
                    if isinstance(v, dict):
                        acc.setdefault(k, []).append((t, v))
        for k, tvs in sorted(acc.items()):
            local, peer = k.split(">")
            vs = [v for _t, v in tvs]
            ns = [float(v.get("notsent", 0)) for v in vs]
            rtt = [float(v["rtt_ms"]) for v in vs if "rtt_ms" in v]
            row = {"host": host, "local": local, "peer": peer, "samples": len(vs),
                   "notsent_mean": sum(ns) / len(ns), "notsent_max": max(ns),
                   "rtt_ms_mean": sum(rtt) / len(rtt) if rtt else None}
            counted = [(t, float(v["bytes_sent"]) + WIRE_HEADER_BYTES * float(v["data_segs_out"]))
                       for t, v in tvs if "bytes_sent" in v and "data_segs_out" in v]
            if len(counted) >= 2:
                row["wire_bytes"] = counted[-1][1] - counted[0][1]
                row["wire_span_s"] = counted[-1][0] - counted[0][0]
            rows.append(row)
    return rows


def rx_series(path: Path, t0: float, seconds: int) -> list[float]:
    """Bit/s per second since ``t0`` received by the httpd on upload connections,
    from :func:`ss_sample` records. A connection's bytes after its last sample
    (at most one sampling interval, 0.25 s) are not counted."""
    last: dict[str, int] = {}
    samples: list[tuple[float, float]] = []
    for r in _records(path, "receiver samples"):
        try:
            t, rx = float(r["t"]), r["rx"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(rx, dict):
            continue
        for k, v in rx.items():
            if isinstance(v, int) and v >= last.get(k, 0):
                last[k] = v
        samples.append((t, float(sum(v for v in last.values() if v >= _UPLOAD_MIN_RX))))
    return per_second_bps(samples, t0, seconds)
