"""Where a chive first fetch's set-up goes: the onion client's log lines ``onion descriptor
fetched ... took_ms=N`` (one per descriptor fetch) and ``rendezvous joined ... took_ms=N
rend_built_ms=... rend_ready_ms=... intro_built_ms=... introduced_ms=... acked_ms=...`` (one
per joined connection; ``-1`` = the step did not happen; binaries before the step fields have
only ``took_ms``; since predicted circuits, also ``rend_predicted=`` / ``intro_predicted=``
true or false: the circuit was a predicted one extended to the point), from each repetition's ``net/onion/chive.log``, counted from the
measurement window's start (``t0 + warmup_s``). The joined steps are measured from the start
of the attempt that joined (its circuits launched); the SOCKS set-up is the descriptor fetch
(if not cached) + the join + BEGIN/CONNECTED on the joined circuit.

The service's side, from ``net/service/chive.log`` (binaries since e8de5af): ``RENDEZVOUS1
sent ... took_ms=N`` is the time from its INTRODUCE2 to RENDEZVOUS1 going out, i.e. its circuit
to the rendezvous point (``service_rend_ms``), and ``INTRODUCE2 accepted ... predicted=`` says
whether that circuit was a predicted one (``service_predicted``). Every join is a first fetch
(later fetches reuse the joined circuit), so these are the first fetches' too."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator

from ... import stats

#: Steps of a join, in protocol order, as the log names them (``took_ms`` is the join).
JOIN_STEPS = ("rend_built_ms", "rend_ready_ms", "intro_built_ms", "introduced_ms", "acked_ms", "took_ms")
#: What each step means, for the table.
STEP_NAMES = {
    "desc_ms": "descriptor fetch",
    "rend_built_ms": "rendezvous circuit built",
    "rend_ready_ms": "RENDEZVOUS_ESTABLISHED",
    "intro_built_ms": "introduction circuit built",
    "introduced_ms": "INTRODUCE1 sent",
    "acked_ms": "INTRODUCE_ACK",
    "took_ms": "RENDEZVOUS2: joined",
    "service_rend_ms": "service: INTRODUCE2 to RENDEZVOUS1 sent (its own time)",
}
#: Whether the rendezvous / introduction circuit was a predicted one (the table shows the share).
PREDICTED = {"rend_predicted": "rendezvous circuit predicted (share)",
             "intro_predicted": "introduction circuit predicted (share)",
             "service_predicted": "service's circuit to the point predicted (share)"}
_FIELD = re.compile(r"(\w+_ms)=(-?\d+)")
_FLAG = re.compile(r"(\w+_predicted)=(true|false)")


def _unix(line: str) -> float | None:
    head = line.split(" ", 1)[0]
    try:
        return datetime.fromisoformat(head.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _events(lines: Iterable[str], since: float, first: str, second: str) -> Iterator[tuple[bool, str]]:
    """``(True, line)`` for each line with ``first``, ``(False, line)`` for each with ``second``
    (and not ``first``), logged at or after UNIX time ``since``."""
    for line in lines:
        is_first = first in line
        if not is_first and second not in line:
            continue
        t = _unix(line)
        if t is not None and t >= since:
            yield is_first, line


def parse_log(lines: Iterable[str], since: float) -> dict[str, list[float]]:
    """Milliseconds per step (``desc_ms`` and :data:`JOIN_STEPS`) of the events logged at or
    after UNIX time ``since``; steps logged as -1 are left out."""
    out: dict[str, list[float]] = {k: [] for k in ("desc_ms", *JOIN_STEPS, *PREDICTED)}
    for fetched, line in _events(lines, since, "onion descriptor fetched", "rendezvous joined"):
        fields = {k: float(v) for k, v in _FIELD.findall(line)}
        if fetched:
            if "took_ms" in fields:
                out["desc_ms"].append(fields["took_ms"])
            continue
        for k in JOIN_STEPS:
            if fields.get(k, -1.0) >= 0:
                out[k].append(fields[k])
        for k, v in _FLAG.findall(line):
            if k in PREDICTED:
                out[k].append(1.0 if v == "true" else 0.0)
    return out


def parse_service_log(lines: Iterable[str], since: float) -> dict[str, list[float]]:
    """The service's steps logged at or after UNIX time ``since``: ``service_rend_ms`` per
    RENDEZVOUS1 sent and ``service_predicted`` (1/0) per INTRODUCE2 accepted."""
    out: dict[str, list[float]] = {"service_rend_ms": [], "service_predicted": []}
    for sent, line in _events(lines, since, "RENDEZVOUS1 sent", "INTRODUCE2 accepted"):
        if sent:
            m = re.search(r"\btook_ms=(\d+)", line)
            if m:
                out["service_rend_ms"].append(float(m.group(1)))
        else:
            m = re.search(r"\bpredicted=(true|false)", line)
            if m:
                out["service_predicted"].append(1.0 if m.group(1) == "true" else 0.0)
    return out


def rep_phases(rep_dir: Path) -> dict[str, list[float]] | None:
    """The steps of one repetition directory (None without its run.json or the onion log;
    the service's steps only if its log is there)."""
    run, log = rep_dir / "run.json", rep_dir / "net" / "onion" / "chive.log"
    if not run.is_file() or not log.is_file():
        return None
    info = json.loads(run.read_text())
    since = float(info["t0"]) + float(info.get("warmup_s", 0.0))
    with open(log, errors="replace") as fh:
        out = parse_log(fh, since)
    svc = rep_dir / "net" / "service" / "chive.log"
    if svc.is_file():
        with open(svc, errors="replace") as fh:
            out.update(parse_service_log(fh, since))
    return out


def variant_phases(rep_dirs: Iterable[Path]) -> dict[str, Any]:
    """Per step, pooled over repetitions: n, p50 and mean in ms."""
    pooled: dict[str, list[float]] = {}
    for d in rep_dirs:
        got = rep_phases(d)
        for k, v in (got or {}).items():
            pooled.setdefault(k, []).extend(v)
    out: dict[str, Any] = {}
    for k, v in pooled.items():
        s = stats.summarize(v)
        out[k] = {"n": len(v), "p50": s.get("p50"), "mean": s.get("mean")}
    return out


def table_lines(phases: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: one row per step, one column per chive variant (median ms, n)."""
    labels = [label for label, p in phases.items() if p]
    if not labels:
        return []
    lines = ["| step (ms from the attempt's start; descriptor fetch: its own time) | "
             + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for k, name in STEP_NAMES.items():
        cells = []
        for label in labels:
            e = phases[label].get(k)
            cells.append("" if not e or e["p50"] is None else f"{e['p50']:.0f} (n={e['n']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for k, name in PREDICTED.items():
        cells = []
        for label in labels:
            e = phases[label].get(k)
            cells.append("" if not e or e["mean"] is None else f"{e['mean']:.0%} (n={e['n']})")
        if any(cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
