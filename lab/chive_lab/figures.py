"""The one figure writer: every figure is saved as a PNG with exactly its
plotted data beside it as CSV (``<name>.png`` + ``<name>.csv``).

:func:`save_plot` is the primitive every kind uses: a drawing function for
matplotlib and the data rows for the CSV. :func:`write_figure` renders the
generic :class:`chive_lab.analysis.Figure` (series, bands, reference lines)
through it, with one CSV row per plotted point.

Floats are written with 6 significant digits (:func:`csv_cell`): more than a figure or
a reader of its CSV can use, and results/ is kept small (17-digit floats made CSVs
three times larger). PNGs are stored with a 256-colour palette (:func:`palette_png`): a
line plot loses nothing visible and its file is about a third of matplotlib's RGBA one.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

from .analysis import Figure  # noqa: E402

__all__ = ["CSV_DIGITS", "CSV_HEADER", "csv_cell", "palette_png", "save_plot", "write_csv",
           "write_figure"]

#: Columns of a generic figure's CSV: one row per plotted point.
CSV_HEADER = ("series", "x", "y", "lo", "hi")

#: Significant digits of a float in a figure's CSV.
CSV_DIGITS = 6


def csv_cell(value: Any) -> Any:
    """A CSV cell: floats (Python's and numpy's) with :data:`CSV_DIGITS` significant
    digits (``nan``/``inf`` as before), everything else as it is (ints and already
    formatted strings keep every digit)."""
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "f"):
        return f"{float(value):.{CSV_DIGITS}g}"
    return value


def palette_png(path: Path) -> None:
    """Re-encode the PNG at ``path`` with an adaptive 256-colour palette (optimised deflate).
    matplotlib writes 8-bit RGBA; plots use a handful of colours plus anti-aliasing shades, so
    the palette keeps them and the file shrinks about threefold (results/ has a size limit)."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def save_plot(directory: Path, name: str, header: Sequence[str], rows: Iterable[Sequence[Any]],
              draw: Callable[[Any], Any] | None, *, dpi: int = 100,
              lineterminator: str = "\n") -> tuple[Path, Path]:
    """Write ``directory/name.csv`` (``header`` then ``rows``, already formatted or
    plain values) and ``directory/name.png``: ``draw(plt)`` builds the figure with
    pyplot and returns it (None: no picture, CSV only). Returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    png, csv_path = directory / f"{name}.png", directory / f"{name}.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator=lineterminator)
        w.writerow(header)
        for row in rows:
            w.writerow([csv_cell(v) for v in row])
    if draw is not None:
        fig = draw(plt)
        try:
            fig.savefig(png, dpi=dpi)
        finally:
            plt.close(fig)
        palette_png(png)
    return png, csv_path


def _rows(fig: Figure) -> Iterable[list[Any]]:
    for s in fig.series:
        for i, (x, y) in enumerate(zip(s.x, s.y)):
            yield [s.label, x, y, "" if s.lo is None else s.lo[i], "" if s.hi is None else s.hi[i]]


def write_csv(fig: Figure, path: Path) -> None:
    """The figure's data: one row per plotted point (series, x, y, lo, hi)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_HEADER)
        for row in _rows(fig):
            w.writerow([csv_cell(v) for v in row])


def _draw(fig: Figure, plt: Any) -> Any:
    f, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    markers = "os^Dvx+*"
    for i, s in enumerate(fig.series):
        color = f"C{i % 10}"
        if s.style == "step":
            ax.step(s.x, s.y, where="post", label=s.label, color=color)
            if s.lo is not None and s.hi is not None:
                ax.fill_between(s.x, s.lo, s.hi, step="post", alpha=0.2, color=color)
        elif s.style == "hline":
            y = s.y[0] if s.y else math.nan
            ax.axhline(y, linestyle="--", linewidth=1, label=s.label, color=color)
        elif s.style == "points":
            ax.plot(s.x, s.y, marker=markers[i % len(markers)], label=s.label, color=color)
        else:
            ax.plot(s.x, s.y, label=s.label, color=color)
            if s.lo is not None and s.hi is not None:
                ax.fill_between(s.x, s.lo, s.hi, alpha=0.2, color=color)
    if fig.xscale == "log":
        ax.set_xscale("log")
    if fig.xticks:
        ax.set_xticks([t for t, _ in fig.xticks])
        ax.set_xticklabels([lbl for _, lbl in fig.xticks], rotation=30, ha="right")
    ax.set_title(fig.title)
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.grid(True, alpha=0.3)
    if fig.series:
        ax.legend(fontsize="small", loc="best")
    f.tight_layout()
    return f


def write_figure(fig: Figure, directory: Path) -> tuple[Path, Path]:
    """Render ``fig`` to <name>.png and its data to <name>.csv in ``directory``."""
    return save_plot(directory, fig.name, CSV_HEADER, _rows(fig), lambda plt: _draw(fig, plt),
                     lineterminator="\r\n")
