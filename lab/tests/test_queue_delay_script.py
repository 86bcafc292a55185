"""lab/scripts/queue_delay_by_class.py on synthetic relay metrics with known answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "queue_delay_by_class.py"
spec = importlib.util.spec_from_file_location("queue_delay_by_class", SCRIPT)
qd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qd)


def _metrics(cells):
    lines = [json.dumps({"type": "circ", "circ": 1, "cells_sent": 10_000}),
             json.dumps({"type": "circ", "circ": 2, "cells_sent": 900}),
             "not json"]
    for circ, q, d, w in cells:
        lines.append(json.dumps({"type": "cell", "chan": 1, "circ": circ, "queued": q, "dequeued": d,
                                 "written": w}))
    return lines


def test_bulk_and_light_circuits_are_told_apart(tmp_path, capsys):
    # circuit 1 (bulk) waits 0.5 s in its queue, circuit 2 (light) 0.01 s; both 0.002 s in the buffer
    cells = [(1, t, t + 0.5, t + 0.502) for t in range(10)] + [(2, t, t + 0.01, t + 0.012) for t in range(5)]
    by = qd.classify(_metrics(cells), 0.3)
    assert len(by["bulk"]["queue"]) == 10 and len(by["light"]["queue"]) == 5
    n, p50, p90 = qd.summarize(by["bulk"]["queue"])
    assert n == 10 and p50 == pytest.approx(500.0) and p90 == pytest.approx(500.0)
    assert qd.summarize(by["light"]["outbuf"])[1] == pytest.approx(2.0)
    # A share above circuit 2's volume (900/10000) puts it in the bulk class too.
    assert "light" not in qd.classify(_metrics(cells), 0.05)
    run = tmp_path / "rep"
    (run / "net" / "relay1").mkdir(parents=True)
    (run / "net" / "relay1" / "metrics.jsonl").write_text("\n".join(_metrics(cells)))
    assert qd.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "relay1: light: n=5 queue p50/p90 10.0/10.0 ms" in out and "bulk: n=10" in out
    with pytest.raises(SystemExit):
        qd.main([str(tmp_path / "missing")])
