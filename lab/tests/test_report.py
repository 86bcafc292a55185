"""Report pieces: figure CSVs hold exactly the plotted data, paper metrics, compare."""

from __future__ import annotations

import csv
import json

import pytest

from chive_lab.analysis import Figure, Series
from chive_lab.errors import LabError
from chive_lab.report import compare, format_compare, ours_metric, write_figure

SUMMARY = {
    "schema": 1,
    "variants_order": ["rr", "ewma"],
    "variants": {
        "rr": {"web": {"ttlb": {"p50": 2.0, "p75": 4.0, "mean": 3.0}, "ttfb": {"p50": 1.0, "p75": 1.5},
                       "goodput_bps": 100.0, "errors": 0, "ks_vs_first": {"statistic": 0.0, "pvalue": 1.0}}},
        "ewma": {"web": {"ttlb": {"p50": 1.5, "p75": 3.0, "mean": 2.0}, "ttfb": {"p50": 0.5, "p75": 1.0},
                         "goodput_bps": 150.0, "errors": 1, "ks_vs_first": {"statistic": 0.4, "pvalue": 0.01}}},
    },
}


@pytest.mark.real_figures
def test_figure_csv_is_the_plotted_data(tmp_path):
    fig = Figure(name="f", title="t", xlabel="x", ylabel="y", series=[
        Series(label="a", x=[1.0, 2.0], y=[0.5, 1.0], lo=[0.4, 0.9], hi=[0.6, 1.0], style="step"),
        Series(label="b", x=[0.0, 3.0], y=[2.0, 2.0], style="hline"),
    ])
    png, path = write_figure(fig, tmp_path)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with open(path) as f:
        rows = list(csv.reader(f))
    # floats at 6 significant digits (figures.csv_cell): 1.0 is written "1"
    assert rows == [["series", "x", "y", "lo", "hi"], ["a", "1", "0.5", "0.4", "0.6"],
                    ["a", "2", "1", "0.9", "1"], ["b", "0", "2", "", ""], ["b", "3", "2", "", ""]]


def test_ours_metric():
    assert ours_metric(SUMMARY, "ttlb_p50", "ewma", "web") == 1.5
    assert ours_metric(SUMMARY, "ttlb_p50_change_pct", "ewma", "web") == pytest.approx(-25.0)
    assert ours_metric(SUMMARY, "ttlb_mean_change_pct", "rr", "web", baseline="ewma") == pytest.approx(50.0)
    assert ours_metric(SUMMARY, "ks_statistic", "ewma", "web") == 0.4
    assert ours_metric(SUMMARY, "goodput_bps", "ewma", "web") == 150.0
    assert ours_metric(SUMMARY, "ttlb_p50", "nope", "web") is None
    assert ours_metric(SUMMARY, "ttlb_p50", "ewma", None) == 1.5  # first class


def test_compare(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "summary.json").write_text(json.dumps(SUMMARY))
    other = json.loads(json.dumps(SUMMARY))
    other["variants"]["ewma"]["web"]["ttlb"]["p50"] = 3.0
    (b / "summary.json").write_text(json.dumps(other))
    rows = compare(a, b)
    row = next(r for r in rows if r[1] == "ewma" and r[2] == "ttlb" and r[3] == "p50")
    assert row[4:] == [1.5, 3.0, 100.0]
    text = format_compare(rows, "a", "b")
    assert "+100.0%" in text and "ttlb p75" in text
    (b / "summary.json").write_text("{}")
    with pytest.raises(LabError, match="schema-1"):
        compare(a, b)


def test_paper_rows_flag_ranges():
    from chive_lab.report import paper_rows
    from chive_lab.scenario import parse_scenario

    scen = parse_scenario({
        "name": "p", "clients": [{"class": "web", "size": 1, "pause": 1.0}],
        "variants": {"Scheduler": ["rr", "ewma"]},
        "paper": [{"variant": "ewma", "class": "web", "metric": "ttlb_p50_change_pct", "low": -30, "high": -20},
                  {"variant": "ewma", "class": "web", "metric": "ttlb_p50", "value": 9.04}],
    })
    rows = paper_rows(scen, SUMMARY)
    assert rows[0][3:6] == ["-30 .. -20", "-25", "yes"]
    assert rows[1][3:6] == ["9.04", "1.5", ""]
