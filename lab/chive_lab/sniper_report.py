"""The outputs of sniper-attack runs (:mod:`chive_lab.sniper`): per run the RSS-over-time CSV and
figure, one figure with every run, ``summary.json``, the table (text and markdown) and the
manifest. Pure functions of the results, apart from writing the files."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .figures import save_plot
from .manifest import cmd_output, git_state

__all__ = ["markdown_table", "run_manifest", "text_table", "write_comparison", "write_run"]

#: Phase marks drawn on the figures, and how they are labelled.
MARK_LABELS = {"opened": "streams open", "stop": "SIGSTOP", "honest_end": "honest done", "release": "attacker killed"}


def _draw_marks(ax: Any, marks: dict[str, float]) -> None:
    for key, label in MARK_LABELS.items():
        if key in marks:
            ax.axvline(marks[key], color="0.6", lw=0.8, ls=":")
            ax.annotate(label, (marks[key], 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=7, color="0.4")


def write_run(result: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``rss-<label>.csv`` (t_s, rss_mib, phase) and ``rss-<label>.png`` for one run (an
    :meth:`AttackResult.to_json` dict)."""
    s = result["summary"]
    label = s["label"]
    marks = result["marks"]
    order = sorted(marks.items(), key=lambda kv: kv[1])

    def phase(t: float) -> str:
        current = "baseline"
        for key, at in order:
            if t >= at:
                current = key
        return current

    rows = [(t, r / 1024, phase(t)) for t, r in result["samples"]]
    limit = s["before_mib"] + s["max_mem_mib"]

    def draw(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot([r[0] for r in rows], [r[1] for r in rows], lw=1.2, label=f"{label} relay1 VmRSS")
        ax.axhline(limit, color="tab:red", ls="--", lw=0.8, label=f"before + MaxMemInQueues ({s['max_mem']})")
        _draw_marks(ax, marks)
        times = s.get("oom", {}).get("times_s") or []
        if times:
            top = max(limit, max(r[1] for r in rows)) * 1.03
            ax.plot(times, [top] * len(times), "v", color="tab:red", ms=4, ls="none",
                    label=f"OOM handler ran ({len(times)}x)")
        ax.set_xlabel("seconds since the attack began")
        ax.set_ylabel("RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"sniper attack, {s['circuits']} circuits x {result['config']['streams']} streams: {label}")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        return fig

    return save_plot(out, f"rss-{label}", ("t_s", "rss_mib", "phase"), rows, draw)


def write_comparison(results: Sequence[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """``rss-all.csv`` (label, t_s, rss_mib) and ``rss-all.png``: every run on one axis."""
    rows = [(r["summary"]["label"], t, rss / 1024) for r in results for t, rss in r["samples"]]

    def draw(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in results:
            s = r["summary"]
            ax.plot([t for t, _ in r["samples"]], [x / 1024 for _, x in r["samples"]], lw=1.2,
                    label=f"{s['label']} (peak {s['peak_mib']:.0f} MiB)")
        caps = {r["summary"]["max_mem"] for r in results}
        ax.set_xlabel("seconds since the attack began")
        ax.set_ylabel("entry relay RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"sniper attack on the entry, MaxMemInQueues {', '.join(sorted(caps))}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    return save_plot(out, "rss-all", ("label", "t_s", "rss_mib"), rows, draw)


COLUMNS = (
    ("label", "run", "s"), ("max_mem", "MaxMemInQueues", "s"), ("streams_opened", "streams", "d"),
    ("before_mib", "RSS before", ".0f"), ("peak_mib", "peak", ".0f"), ("peak_over_before_mib", "peak - before", ".0f"),
    ("end_of_attack_mib", "end of attack", ".0f"), ("after_mib", "after kill", ".0f"),
)


def _oom_text(s: dict[str, Any]) -> str:
    o = s["oom"]
    return f"{o['circuits_killed']} circuits, {o['bytes_freed'] / (1 << 20):.0f} MiB ({o['runs']} runs)"


def _honest_text(s: dict[str, Any]) -> str:
    h = s["honest"]
    mb = h["bytes"] / 1e6
    ok = "byte-exact" if h["byte_exact"] else f"FAILED: {h['error']}"
    idle = s.get("honest_idle")
    base = f" (without attack {idle['seconds']:.2f} s)" if idle and idle.get("byte_exact") else ""
    return f"{mb:.0f} MB in {h['seconds']:.2f} s{base}, {ok}"


def _row(s: dict[str, Any]) -> list[str]:
    cells = [format(s[k], f) if s.get(k) is not None else "-" for k, _h, f in COLUMNS]
    return cells + [_oom_text(s), _honest_text(s)]


HEAD = [h for _k, h, _f in COLUMNS] + ["OOM kills (freed)", "honest download"]


def text_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The runs as a plain-text table (RSS in MiB)."""
    body = [_row(s) for s in summaries]
    widths = [max(len(x) for x in col) for col in zip(HEAD, *body)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [HEAD, *body])


def markdown_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The runs as a markdown table (RSS in MiB), as docs/security.md shows it."""
    out = ["| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
    out += ["| " + " | ".join(_row(s)) + " |" for s in summaries]
    return "\n".join(out)


def run_manifest(argv: Sequence[str], binary: Path, configs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What ran, from which revision, with which binaries; ``end``/``status`` filled in later."""
    git = git_state()
    tor = cmd_output(["tor", "--version"])
    return {
        "script": "lab/scripts/sniper_rss.py", "command": list(argv),
        "git": git, "binary": str(binary), "chive_version": cmd_output([str(binary), "--version"]),
        "tor_version": tor.splitlines()[0] if tor else None,
        "configs": list(configs),
        "host": {"hostname": socket.gethostname(), "kernel": platform.release(), "cores": os.cpu_count(),
                 "load_at_start": os.getloadavg(), "python": sys.version.split()[0]},
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "end": None, "status": "running",
    }


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
