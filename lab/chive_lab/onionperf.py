"""Export a run's transfers as OnionPerf analysis JSON, so OnionPerf's and Tor
Metrics' tooling (``onionperf visualize``, metrics-lib's OnionPerf parser) read
chive's results.

One document per run (``OUT/onionperf.analysis.json``)::

    {"type": "onionperf", "version": "4.0",
     "data": {<source>: {"measurement_ip": "unknown",
                         "tgen": {"streams": {<stream id>: <stream>}},
                         "tor": {"circuits": {}, "streams": {}}}}}

One *source* per variant (OnionPerf's source is a measuring host; here each
variant is its own configuration; a kind may group otherwise, see
:meth:`chive_lab.kinds.ExperimentKind.onionperf_runs`: ``paper004-window`` has one
source per series, an exit setting), named by the label reduced to
``[A-Za-z0-9-]`` as OnionPerf's schema requires. Each transfer of ``chive perf``
(every repetition, every client, warm-up included) is one tgen *stream* with
OnionPerf's fields:

* ``stream_info``, ``transport_info``, ``byte_info``, ``time_info``: strings, as
  OnionPerf writes them (it parses them from tgen's log); ``time_info`` holds
  microseconds since the transfer's start, ``-1`` where chive does not measure
  the step (the SOCKS sub-steps before the reply, the checksum, the send side);
* ``elapsed_seconds.payload_bytes_recv`` (perf's partials: 10 KiB ... 5 MiB) and
  ``elapsed_seconds.payload_progress_recv`` (deciles ``"0.0"`` ... ``"1.0"``: the
  first sample at or past each decile, from perf's progress records and
  partials, so at their resolution; ``"0.0"`` is the first byte, ``"1.0"`` the
  last), present only for successful streams, as in OnionPerf;
* ``is_complete``, ``is_error``, ``is_success``, ``unix_ts_start``, ``unix_ts_end``.

Mapping of chive perf's timestamps (all UNIX seconds) to tgen's steps:
``start`` is tgen's socket creation (OnionPerf's ``unix_ts_start``);
``socket_connected`` -> ``usecs-to-socket-connect``; ``socks_connected`` (SOCKS
reply received) -> ``usecs-to-proxy-response``; ``request_sent`` ->
``usecs-to-command``; ``first_byte`` / ``last_byte`` ->
``usecs-to-first-byte-recv`` / ``usecs-to-last-byte-recv``. Tor Metrics'
time to first / last byte is ``usecs-to-*-byte-recv / 1e6``, which is exactly
chive's ``ttfb`` / ``ttlb`` (to the microsecond).

An extra ``chive`` object per stream (class, variant, repetition, client, whether
the transfer started in the measurement window) lets a reader select what
``summary.json`` summarises; OnionPerf's readers ignore unknown keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import analysis as an

__all__ = ["DOCUMENT_VERSION", "document", "export_dir", "stream_entry"]

DOCUMENT_VERSION = "4.0"
DEFAULT_NAME = "onionperf.analysis.json"
DECILES = tuple(f"{d / 10:.1f}" for d in range(11))
# OnionPerf writes ports into transport_info; chive perf does not record them.
UNKNOWN_ENDPOINT = "NULL:0.0.0.0:0"


def _usecs(t: float | None, start: float) -> str:
    """Microseconds from ``start`` to ``t`` as OnionPerf's string, ``-1`` when unknown."""
    if t is None or t < start:
        return "-1"
    return str(round((t - start) * 1_000_000))


def source_name(label: str) -> str:
    """A variant label as an OnionPerf source name (``^[A-Za-z0-9-]+$``)."""
    name = re.sub(r"[^A-Za-z0-9-]+", "-", label).strip("-")
    return name or "chive"


def _error_code(t: an.Transfer) -> str:
    if t.ok:
        return "NONE"
    if t.error is None:
        # No error text but not ok: an HTTP status outside 2xx, or no last byte.
        return "STATUS" if t.status is not None else "READ"
    err = t.error.lower()
    if "socks" in err or "proxy" in err:
        return "PROXY"
    if t.censored:
        return "TIMEOUT"
    return "READ"


def _progress_deciles(t: an.Transfer, samples: Sequence[an.ProgressSample]) -> dict[str, float]:
    """Elapsed seconds to each decile of the expected size, at the resolution of the samples."""
    size = t.expected_bytes or t.bytes
    if not size or t.first_byte is None or t.last_byte is None:
        return {}
    points = [(s.t, s.bytes) for s in samples]
    points += [(when, int(k)) for k, when in t.partials.items() if when is not None and k.isdigit()]
    points.append((t.last_byte, t.bytes))
    points.sort()
    out = {"0.0": t.first_byte - t.start}
    for key in DECILES[1:]:
        need = float(key) * size
        when = next((tm for tm, b in points if b >= need), None)
        if when is not None:
            out[key] = max(when, t.first_byte) - t.start
    out["1.0"] = t.last_byte - t.start
    return out


def stream_entry(t: an.Transfer, samples: Sequence[an.ProgressSample], *, variant: str, rep: int,
                 stream_id: str, in_window: bool) -> dict[str, Any]:
    """One transfer as an OnionPerf tgen stream (see the module docs for the mapping)."""
    size = t.expected_bytes if t.expected_bytes is not None else t.bytes
    error = _error_code(t)
    ends = [x for x in (t.last_byte, t.first_byte, t.request_sent, t.socks_connected, t.socket_connected)
            if x is not None]
    end = max(ends) if ends else t.start
    progress = 100.0 * t.bytes / size if size else (100.0 if t.ok else 0.0)
    entry: dict[str, Any] = {
        "stream_id": stream_id,
        "stream_info": {
            "id": stream_id,
            "name": t.client or "chive-perf",
            "peername": "chive-lab-server",
            "vertexid": t.cls,
            "sendsize": "0",
            "recvsize": str(size),
            "sendstate": "SEND_SUCCESS" if t.request_sent is not None else "SEND_COMMAND",
            "recvstate": "RECV_SUCCESS" if t.ok else "RECV_ERROR",
            "error": error,
        },
        "transport_info": {
            "fd": "-1",
            "local": UNKNOWN_ENDPOINT,
            "proxy": UNKNOWN_ENDPOINT,
            "remote": UNKNOWN_ENDPOINT,
            "state": "SUCCESS" if t.socks_connected is not None else "ERROR",
            "error": "NONE" if t.socks_connected is not None else error,
        },
        "byte_info": {
            "total-bytes-recv": str(t.bytes),
            "total-bytes-send": "0",
            "payload-bytes-recv": str(t.bytes),
            "payload-bytes-send": "0",
            "payload-progress-recv": f"{progress:.2f}%",
            "payload-progress-send": "100.00%",
        },
        "time_info": {
            "created-ts": "-1",
            "usecs-to-socket-create": "0",
            "usecs-to-socket-connect": _usecs(t.socket_connected, t.start),
            "usecs-to-proxy-init": "-1",
            "usecs-to-proxy-choice": "-1",
            "usecs-to-proxy-request": "-1",
            "usecs-to-proxy-response": _usecs(t.socks_connected, t.start),
            "usecs-to-command": _usecs(t.request_sent, t.start),
            "usecs-to-response": "-1",
            "usecs-to-first-byte-recv": _usecs(t.first_byte, t.start),
            "usecs-to-last-byte-recv": _usecs(t.last_byte, t.start),
            "usecs-to-checksum-recv": "-1",
            "usecs-to-first-byte-send": "-1",
            "usecs-to-last-byte-send": "-1",
            "usecs-to-checksum-send": "-1",
            "now-ts": "-1",
        },
        "is_complete": True,
        "is_error": not t.ok,
        "is_success": t.ok,
        "unix_ts_start": t.start,
        "unix_ts_end": end,
        "chive": {"class": t.cls, "variant": variant, "rep": rep, "client": t.client,
                  "loop": t.loop, "seq": t.seq, "in_window": in_window, "http_status": t.status,
                  "error": t.error},
    }
    if t.ok:
        entry["elapsed_seconds"] = {
            "payload_bytes_recv": {k: when - t.start for k, when in sorted(t.partials.items(),
                                                                           key=lambda kv: int(kv[0]))
                                   if when is not None and k.isdigit()},
            "payload_progress_recv": _progress_deciles(t, samples),
        }
    return entry


def document(runs_by_variant: Mapping[str, Sequence[an.RunData]]) -> dict[str, Any]:
    """The OnionPerf analysis document for loaded runs (pure)."""
    data: dict[str, Any] = {}
    for variant, runs in runs_by_variant.items():
        name = source_name(variant)
        base, i = name, 2
        while name in data:  # two labels that reduce to one name stay apart
            name, i = f"{base}-{i}", i + 1
        streams: dict[str, Any] = {}
        for run in runs:
            lo, hi = run.window
            by_transfer: dict[tuple[str, int, int | None], list[an.ProgressSample]] = {}
            for p in run.progress:
                by_transfer.setdefault((p.client, p.loop, p.transfer), []).append(p)
            for n, t in enumerate(run.transfers):
                seq = t.seq if t.seq is not None else n
                sid = f"{seq}:{t.loop}:{t.client or 'perf'}:rep{run.rep}"
                samples = by_transfer.get((t.client, t.loop, t.seq), []) if t.seq is not None else []
                streams[sid] = stream_entry(t, samples, variant=variant, rep=run.rep, stream_id=sid,
                                            in_window=lo <= t.start <= hi)
        data[name] = {"measurement_ip": "unknown", "tgen": {"streams": streams},
                      "tor": {"circuits": {}, "streams": {}}}
    return {"type": "onionperf", "version": DOCUMENT_VERSION, "data": data}


def export_dir(out: Path, dest: Path | None = None) -> Path:
    """``chive-lab export --onionperf OUT``: read OUT's runs (as ``chive-lab analyze``
    does) and write the document to ``dest`` (default ``OUT/onionperf.analysis.json``)."""
    from .kinds import get_kind
    from .manifest import scenario_of

    out = Path(out)
    scenario = scenario_of(out)
    runs = get_kind(scenario.kind).onionperf_runs(out, scenario)
    if runs is None:
        labels = [v.label for v in scenario.variants]
        runs = {label: [an.load_run(path, label, rep, scenario.warmup, scenario.duration) for rep, path in reps]
                for label, reps in an.discover_runs(out, labels).items()}
    doc = document(runs)
    dest = Path(dest) if dest is not None else out / DEFAULT_NAME
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(dest)
    return dest
