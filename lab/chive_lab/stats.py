"""Statistics used by every kind's analysis: percentiles, ECDFs with
confidence bands, K–S tests, kernel density estimates, binned throughput with
t-intervals, and the per-second throughput series of the netns kinds (window
means, sample variance, slot means, 90% intervals across runs).

Pure functions on plain sequences of floats; no file IO. Empty or too-small
inputs give ``None``, NaN (the series functions) or empty arrays rather than
exceptions, because a variant that produced no transfers must still get a
report.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy import stats as sps

__all__ = [
    "PERCENTILES",
    "Band",
    "binned_rate",
    "ci90_half",
    "dkw_epsilon",
    "ecdf",
    "ecdf_at",
    "ecdf_band",
    "kde",
    "ks_test",
    "mean",
    "mean_ci",
    "median_ci",
    "percentile",
    "quartiles",
    "representative",
    "sign_test",
    "slot_means",
    "slot_stats",
    "summarize",
    "t90",
    "variance",
    "window",
]

PERCENTILES = (10, 25, 50, 75, 90)


def _clean(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return arr[np.isfinite(arr)]


def summarize(values: Iterable[float]) -> dict[str, float | int | None]:
    """p10, p25, p50, p75, p90 (linear interpolation, numpy's default), mean,
    sample standard deviation (ddof=1) and n. All None (n=0) when empty."""
    arr = _clean(values)
    out: dict[str, float | int | None] = {f"p{p}": None for p in PERCENTILES}
    out.update(mean=None, sd=None, n=int(arr.size))
    if arr.size == 0:
        return out
    for p, q in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{p}"] = float(q)
    out["mean"] = float(arr.mean())
    out["sd"] = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return out


def ecdf(values: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF as step points: sorted values x and F(x) = i/n."""
    arr = np.sort(_clean(values))
    n = arr.size
    return arr, (np.arange(1, n + 1, dtype=float) / n if n else np.zeros(0))


def ecdf_at(values: Iterable[float], grid: Sequence[float]) -> np.ndarray:
    """F_n evaluated at each grid point (fraction of values <= x)."""
    arr = np.sort(_clean(values))
    g = np.asarray(grid, dtype=float)
    if arr.size == 0:
        return np.full(g.shape, np.nan)
    return np.searchsorted(arr, g, side="right") / arr.size


def dkw_epsilon(n: int, level: float = 0.95) -> float:
    """Half-width of the Dvoretzky–Kiefer–Wolfowitz band: sqrt(ln(2/alpha) / (2n))."""
    if n <= 0:
        return 1.0
    alpha = 1.0 - level
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


@dataclass(frozen=True)
class Band:
    """A CDF with a pointwise band on a grid."""

    x: np.ndarray
    center: np.ndarray
    """ECDF of all repetitions pooled."""
    lo: np.ndarray
    hi: np.ndarray
    method: str
    """``percentile`` (across repetitions) or ``dkw`` (one repetition)."""


def ecdf_band(per_rep: Sequence[Iterable[float]], level: float = 0.95, grid_points: int = 200) -> Band | None:
    """ECDF of the pooled samples with a confidence band.

    With two or more non-empty repetitions the band is, at each grid point,
    the ((1-level)/2, (1+level)/2) percentiles of the per-repetition ECDFs
    (with few repetitions that is close to their min..max envelope). With one,
    it is the DKW band ``F ± eps`` clipped to [0, 1]. None if no data.
    """
    reps = [_clean(r) for r in per_rep]
    reps = [r for r in reps if r.size]
    if not reps:
        return None
    pooled = np.concatenate(reps)
    grid = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, grid_points)))
    center = ecdf_at(pooled, grid)
    if len(reps) >= 2:
        curves = np.vstack([ecdf_at(r, grid) for r in reps])
        tail = (1.0 - level) / 2.0 * 100.0
        lo = np.percentile(curves, tail, axis=0)
        hi = np.percentile(curves, 100.0 - tail, axis=0)
        method = "percentile"
    else:
        eps = dkw_epsilon(pooled.size, level)
        lo = np.clip(center - eps, 0.0, 1.0)
        hi = np.clip(center + eps, 0.0, 1.0)
        method = "dkw"
    return Band(x=grid, center=center, lo=lo, hi=hi, method=method)


def ks_test(a: Iterable[float], b: Iterable[float]) -> dict[str, float | None]:
    """Two-sample Kolmogorov–Smirnov test (scipy.stats.ks_2samp, two-sided).
    statistic/pvalue are None when either sample is empty."""
    x, y = _clean(a), _clean(b)
    if x.size == 0 or y.size == 0:
        return {"statistic": None, "pvalue": None}
    res = sps.ks_2samp(x, y)
    return {"statistic": float(res.statistic), "pvalue": float(res.pvalue)}


def sign_test(differences: Iterable[float]) -> dict[str, float | int | None]:
    """Paired sign test: how many differences are below and above zero (ties dropped) and the
    two-sided binomial p-value that both directions are equally likely (None with no untied
    pair). For paired measurements whose spread is not normal, e.g. CPU figures of two binaries
    run in alternation on a shared host."""
    d = _clean(differences)
    lower, higher = int((d < 0).sum()), int((d > 0).sum())
    n = lower + higher
    p = float(sps.binomtest(lower, n, 0.5).pvalue) if n else None
    return {"lower": lower, "higher": higher, "ties": int(d.size) - n, "pvalue": p}


def kde(values: Iterable[float], grid: Sequence[float]) -> np.ndarray | None:
    """Gaussian kernel density (scipy.stats.gaussian_kde, Scott's bandwidth) on
    ``grid``; None with fewer than two distinct values (no bandwidth exists)."""
    arr = _clean(values)
    if arr.size < 2 or np.ptp(arr) == 0:
        return None
    try:
        return sps.gaussian_kde(arr)(np.asarray(grid, dtype=float))
    except (np.linalg.LinAlgError, ValueError):
        return None


def mean_ci(samples: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """Mean and Student-t confidence interval (lo, hi); with one sample the
    interval is the point itself. None when empty."""
    arr = _clean(samples)
    if arr.size == 0:
        return None
    m = float(arr.mean())
    if arr.size == 1:
        return m, m, m
    sem = float(arr.std(ddof=1)) / math.sqrt(arr.size)
    half = float(sps.t.ppf((1.0 + level) / 2.0, arr.size - 1)) * sem
    return m, m - half, m + half


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100, linear interpolation); None when empty."""
    arr = _clean(values)
    return float(np.percentile(arr, q)) if arr.size else None


def median_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median from order statistics (binomial,
    normal approximation; ``level`` 0.95 or 0.90). None with fewer than 3 values."""
    arr = np.sort(_clean(values))
    n = arr.size
    if n < 3:
        return None
    z = 1.959964 if level == 0.95 else 1.644854
    half = z * math.sqrt(n) / 2.0
    lo = max(0, int(math.floor(n / 2.0 - half)) - 1)
    hi = min(n - 1, int(math.ceil(n / 2.0 + half)) - 1)
    return float(arr[lo]), float(arr[hi])


def binned_rate(
    series: Iterable[Sequence[tuple[float, float]]],
    t0: float,
    t1: float,
    bin_s: float = 1.0,
) -> np.ndarray:
    """Bytes per second in bins [t0 + k*bin_s, t0 + (k+1)*bin_s) from cumulative
    byte counters.

    Each element of ``series`` is one transfer's (time, cumulative bytes)
    samples; the increase between consecutive samples is spread uniformly over
    the time between them (linear interpolation), so a sample interval that
    straddles a bin edge is split in proportion. Counters that go backwards
    are treated as a new transfer starting from zero.
    """
    nbins = max(0, int(math.ceil((t1 - t0) / bin_s - 1e-9)))
    out = np.zeros(nbins)
    if nbins == 0:
        return out
    for samples in series:
        pts = sorted((float(t), float(b)) for t, b in samples)
        for (ta, ba), (tb, bb) in zip(pts, pts[1:]):
            delta = bb - ba if bb >= ba else bb
            if delta <= 0:
                continue
            if tb <= ta:
                _add_point(out, t0, bin_s, tb, delta)
                continue
            rate = delta / (tb - ta)
            lo, hi = max(ta, t0), min(tb, t0 + nbins * bin_s)
            k = int((lo - t0) // bin_s) if lo < hi else nbins
            while lo < hi and k < nbins:
                edge = min(hi, t0 + (k + 1) * bin_s)
                out[k] += rate * (edge - lo)
                lo = edge
                k += 1
    return out / bin_s


def _add_point(out: np.ndarray, t0: float, bin_s: float, t: float, amount: float) -> None:
    k = int((t - t0) // bin_s)
    if 0 <= k < out.size:
        out[k] += amount


# ---------------------------------------------------------------------------
# Per-second throughput series (one value per second of a run, per flow)


def quartiles(xs: Sequence[float]) -> dict[str, float | int | None]:
    """p25, p50, p75 (inclusive method, as :func:`statistics.quantiles`) and n; with fewer than
    two values only the median (or nothing) is known."""
    if len(xs) < 2:
        return {"p25": None, "p50": xs[0] if xs else None, "p75": None, "n": len(xs)}
    q = statistics.quantiles(sorted(xs), n=4, method="inclusive")
    return {"p25": q[0], "p50": q[1], "p75": q[2], "n": len(xs)}


def t90(n: int) -> float:
    """Two-sided 90% Student t quantile for n samples (n-1 degrees of freedom)."""
    return float(sps.t.ppf(0.95, n - 1))


def window(series: Sequence[float], lo: float, hi: float) -> list[float]:
    """The samples of seconds [floor(lo), ceil(hi)) of a per-second series."""
    return list(series[int(math.floor(lo)):int(math.ceil(hi))])


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean; NaN when empty."""
    return sum(xs) / len(xs) if xs else float("nan")


def variance(xs: Sequence[float]) -> float:
    """Sample variance (n-1); NaN with fewer than two samples."""
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def slot_means(series: Sequence[float], lo: float, hi: float, slot: float) -> list[float]:
    """Means of the 1 s samples of ``series`` in [lo, hi) over consecutive ``slot``-second
    slots (paper 002's Fig 9 samples are 10 s slots); a partial last slot is left out."""
    n = max(1, int(round(slot)))
    xs = window(series, lo, hi)
    return [mean(xs[i:i + n]) for i in range(0, len(xs) - n + 1, n)]


def ci90_half(xs: Sequence[float]) -> float:
    """Half-width of the 90% Student t interval of the mean of ``xs`` (NaNs dropped);
    NaN with fewer than two values."""
    xs = [x for x in xs if x == x]
    if len(xs) < 2:
        return float("nan")
    return t90(len(xs)) * math.sqrt(variance(xs) / len(xs))


def slot_stats(runs: Sequence[dict[str, Sequence[float]]], flow: str, slot: float,
               end: int) -> list[tuple[float, float, float, float, int]]:
    """Per ``slot``-second slot of [0, end): (start, end, mean over runs of the runs'
    slot means of ``flow``, half-width of the 90% interval across runs, runs)."""
    rows = []
    n_slots = int(math.ceil(end / slot))
    for k in range(n_slots):
        lo, hi = k * slot, min((k + 1) * slot, end)
        vals = [mean(window(r[flow], lo, hi)) for r in runs]
        m = mean(vals)
        half = (t90(len(vals)) * math.sqrt(variance(vals) / len(vals))) if len(vals) > 1 else float("nan")
        rows.append((lo, hi, m, half, len(vals)))
    return rows


def representative(runs: Sequence[dict[str, Sequence[float]]], flow: str, lo: float, hi: float) -> int:
    """Index of the run whose mean of ``flow`` in [lo, hi) is closest to the median."""
    means = [mean(window(r[flow], lo, hi)) for r in runs]
    med = sorted(means)[len(means) // 2]
    return min(range(len(runs)), key=lambda i: abs(means[i] - med))
