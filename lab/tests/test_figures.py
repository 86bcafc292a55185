"""The figure writer's CSVs: floats at 6 significant digits, other cells untouched."""

import csv
import math

import numpy as np
import pytest

from chive_lab.analysis import Figure, Series
from chive_lab.figures import CSV_DIGITS, csv_cell, save_plot, write_csv, write_figure


def test_csv_cell_rounds_floats_only():
    assert CSV_DIGITS == 6
    assert csv_cell(0.1 + 0.2) == "0.3"
    assert csv_cell(1 / 3) == "0.333333"
    assert csv_cell(123456789.0) == "1.23457e+08"
    assert csv_cell(np.float64(2 / 3)) == "0.666667"
    assert csv_cell(np.float32(0.25)) == "0.25"
    assert csv_cell(math.nan) == "nan" and csv_cell(math.inf) == "inf"
    # ints (also numpy's), bools, strings and empty cells keep every character
    assert csv_cell(123456789) == 123456789
    assert csv_cell(np.int64(123456789)) == np.int64(123456789)
    assert csv_cell(True) is True
    assert csv_cell("1.23456789") == "1.23456789"
    assert csv_cell("") == ""


@pytest.mark.real_figures
def test_figure_csvs_are_rounded(tmp_path):
    fig = Figure(name="f", title="t", xlabel="x", ylabel="y",
                 series=[Series(label="a", x=[1 / 3, 2.0], y=[math.pi, 1e-7 / 3],
                                lo=[0.1 + 0.2, 1.0], hi=[2 / 3, 7.0])])
    png, path = write_figure(fig, tmp_path)
    assert png.is_file()
    write_csv(fig, tmp_path / "g.csv")
    for p in (path, tmp_path / "g.csv"):
        rows = list(csv.DictReader(open(p, newline="")))
        assert [r["x"] for r in rows] == ["0.333333", "2"]
        assert [r["y"] for r in rows] == ["3.14159", "3.33333e-08"]
        assert rows[0]["lo"] == "0.3" and rows[0]["hi"] == "0.666667"
        # every value read back is within the rounding of the original
        assert float(rows[0]["y"]) == pytest.approx(math.pi, rel=10 ** -(CSV_DIGITS - 1))


def test_save_plot_rounds_rows_without_a_picture(tmp_path):
    _png, path = save_plot(tmp_path, "t", ["k", "v", "n"], [["a", 2 / 3, 7], ["b", "1.234567891", 8]], None)
    assert path.read_text().splitlines() == ["k,v,n", "a,0.666667,7", "b,1.234567891,8"]


@pytest.mark.real_figures
def test_pngs_are_stored_with_a_palette_and_keep_their_colours(tmp_path):
    from PIL import Image

    fig = Figure(name="p", title="t", xlabel="x", ylabel="y",
                 series=[Series(label=f"s{i}", x=[0, 1, 2], y=[i, i + 1, i * 2]) for i in range(4)])
    png, _ = write_figure(fig, tmp_path)
    with Image.open(png) as im:
        assert im.mode == "P" and im.size == (700, 420)
        colours = {c for _, c in im.convert("RGB").getcolors(256 * 256)}
    # matplotlib's first series colours (C0..C3) survive the palette exactly
    for hex_colour in ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"):
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, hex_colour
