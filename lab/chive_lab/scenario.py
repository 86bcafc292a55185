"""Experiment scenarios: TOML files validated into frozen dataclasses.

A scenario says what network to start, which clients (``chive perf``
processes) load it, how long to measure, how often to repeat, and which
*variants* (config overrides) to compare. ``docs/lab.md`` documents every key;
this module is the reference. Every problem is a :class:`LabError` that names
the offending key (``clients[1].size: must be a positive integer``).

Design choices:

* Unknown keys are errors (a typo must not silently fall back to a default).
  Relay config keys (``[network.relay]`` and variant keys) are passed through
  unchecked apart from their syntax: the relay itself rejects keys it does not
  know, and the runner shows its message.
* ``[quick]`` is a partial scenario deep-merged over the file before
  validation (tables merge, everything else replaces), so it can shorten any
  key and is validated exactly like the rest.
* Variants are the explicit ``[[variant]]`` list followed by the cartesian
  product of the ``[variants]`` matrix. Labels name the values (see
  :func:`variant_label`).
* ``kind`` selects the experiment kind (:data:`chive_lab.kinds.KINDS`); the
  keys that are not common to every kind are the kind's own (its ``Options``,
  e.g. the overlay kind's ``[network]`` and ``[[clients]]``), and a kind with
  ``VariantOptions`` validates each variant's keys itself.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .config import MANAGED_CLIENT_KEYS, MANAGED_RELAY_KEYS, check_key
from .errors import LabError
from .files import read_capped
from .network import MAX_RELAYS, MIN_RELAYS

__all__ = [
    "ClientSpec",
    "NetworkConfig",
    "PaperValue",
    "Scenario",
    "ThinkTime",
    "Variant",
    "display_label",
    "impl_of",
    "load_scenario",
    "parse_scenario",
    "variant_label",
]

# Scenario files are small; a bound keeps a wrong path (a log file) from being slurped.
MAX_SCENARIO_BYTES = 1 << 20
# Bounds that keep one machine sane and catch unit mistakes (ms for s).
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_REPETITIONS = 1000
MAX_VARIANTS = 200
MAX_CLIENT_PROCESSES = 200
MAX_TRANSFER_BYTES = 1 << 40
MAX_PARALLEL = 64

# Short names used in variant labels ("H=10" rather than "CircuitPriorityHalflife=10").
LABEL_ABBREVIATIONS: dict[str, str] = {
    "CircuitPriorityHalflife": "H",
    "params.CircuitPriorityHalflifeMsec": "Hms",
    "params.circwindow": "circwindow",
    "impl": "impl",
}

IMPLS = ("chive", "tor", "both")
THINK_DISTS = ("exp", "fixed")
METHODS = ("get", "post")
# Paper-number metrics the report knows how to compute on our side (see report.ours_metric).
PAPER_MEASURES = ("ttfb", "ttlb", "ttfb_req", "ttlb_req")
PAPER_STATS = ("p10", "p25", "p50", "p75", "p90", "mean", "sd")
PAPER_OTHER_METRICS = ("goodput_bps", "aggregate_goodput_bps", "errors", "ks_statistic", "ks_pvalue")


@dataclass(frozen=True)
class ThinkTime:
    """Pause between a transfer's end and the next start, drawn per transfer."""

    dist: str
    """``exp`` (exponential) or ``fixed``."""
    mean: float
    """Mean pause in seconds."""


@dataclass(frozen=True)
class ClientSpec:
    """One class of clients: ``count`` identical ``chive perf`` processes."""

    cls: str
    """Class name (``web``, ``bulk``…): the key under which results are reported."""
    count: int = 1
    size: int = 0
    """Bytes per transfer (downloaded with GET, uploaded with POST)."""
    method: str = "get"
    continuous: bool = False
    """Back-to-back transfers (bulk); excludes pause/interval/think."""
    pause: float | None = None
    """Seconds between a transfer's end and the next start (paper 000's 20 s breaks)."""
    interval: float | None = None
    """Seconds between consecutive starts."""
    think: ThinkTime | None = None
    isolate: bool = False
    """Fresh circuit per transfer (a fresh SOCKS username)."""
    parallel: int = 1
    """Transfer loops per process."""
    start_delay: float = 0.0
    timeout: float | None = None
    """Seconds one transfer may take before perf records it as timed out."""
    verify: bool = False
    """Check every body against the /bytes pattern (costs CPU)."""


@dataclass(frozen=True)
class NetworkConfig:
    """The network every repetition starts (before the variant's overrides)."""

    relays: int = 4
    bandwidth_rate: int | None = None
    """Relay token buckets, bytes/s; None = unlimited."""
    bandwidth_burst: int | None = None
    """BandwidthBurst if different from the rate."""
    relay: Mapping[str, Any] = field(default_factory=dict)
    """Config keys added to every relay."""
    client: Mapping[str, Any] = field(default_factory=dict)
    """Config keys added to the chive client (``EntryNodes``, ``MiddleNodes`` …)."""
    params: Mapping[str, int] = field(default_factory=dict)
    """Consensus parameters of the authority."""
    consensus_interval: int = 2
    log_level: str = "info"
    timeout: float = 90.0
    """Seconds ``up`` may take."""


@dataclass(frozen=True)
class Variant:
    """One configuration to measure."""

    label: str
    relay: Mapping[str, Any] = field(default_factory=dict)
    """Relay config overrides (on top of ``[network.relay]``)."""
    params: Mapping[str, int] = field(default_factory=dict)
    """Consensus parameter overrides."""
    impl: str | None = None
    """Implementation override (``chive``/``tor``); None = the scenario's."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """The variant's keys as written (``Scheduler``, ``params.circwindow``…), for tables and plots."""
    options: Any = None
    """What the kind's ``VariantOptions`` made of the keys (kinds whose variants are not relay overrides)."""


@dataclass(frozen=True)
class PaperValue:
    """A number from the paper, shown beside ours in the report."""

    metric: str
    """``ttlb_p50``, ``ttlb_mean``, ``ttlb_p50_change_pct``, ``ks_statistic``… (docs/lab.md)."""
    variant: str | None = None
    cls: str | None = None
    value: float | None = None
    low: float | None = None
    high: float | None = None
    """A range when the paper only gives one (e.g. read off a figure)."""
    baseline: str | None = None
    """For ``*_change_pct``: the variant compared against (default: the first)."""
    note: str = ""


@dataclass(frozen=True)
class Scenario:
    """A validated scenario."""

    name: str
    description: str = ""
    reproduces: str = ""
    kind: str = "overlay"
    seed: int = 1
    repetitions: int = 1
    duration: float = 60.0
    """Seconds of measurement (after the warm-up)."""
    warmup: float = 0.0
    """Seconds at the start whose transfers are discarded."""
    drain: float = 0.0
    """Seconds after the end during which clients finish running transfers (no new ones)."""
    backend: str = "loopback"
    impl: str = "chive"
    network: NetworkConfig = field(default_factory=NetworkConfig)
    clients: tuple[ClientSpec, ...] = ()
    variants: tuple[Variant, ...] = ()
    paper: tuple[PaperValue, ...] = ()
    options: Any = None
    """What the kind's ``parse_options`` returned for its own keys."""
    quick: bool = False
    """Whether ``[quick]`` was applied."""
    source: Mapping[str, Any] = field(default_factory=dict)
    """The raw TOML document (before ``[quick]``), kept for the manifest."""

    @property
    def classes(self) -> list[str]:
        """Client class names in scenario order."""
        return [c.cls for c in self.clients]

    def variant(self, label: str) -> Variant:
        """The variant called ``label``; LabError if there is none."""
        for v in self.variants:
            if v.label == label:
                return v
        raise LabError(f"no variant {label!r} (have: {', '.join(v.label for v in self.variants)})")


# ---------------------------------------------------------------------------
# Small typed readers. Each takes the key path for messages.


def _err(path: str, msg: str) -> LabError:
    return LabError(f"{path}: {msg}")


def _table(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _err(path, f"must be a table, got {type(value).__name__}")
    return value


def _str(value: Any, path: str, *, choices: tuple[str, ...] | None = None, max_len: int = 4096) -> str:
    if not isinstance(value, str):
        raise _err(path, f"must be a string, got {value!r}")
    if len(value) > max_len:
        raise _err(path, f"too long ({len(value)} > {max_len} characters)")
    if choices is not None and value not in choices:
        raise _err(path, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _int(value: Any, path: str, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _err(path, f"must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise _err(path, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise _err(path, f"must be <= {hi}, got {value}")
    return value


def _float(value: Any, path: str, *, lo: float = 0.0, hi: float = MAX_DURATION_S, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(path, f"must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < lo or value > hi or (positive and value <= 0):
        bound = "> 0" if positive else f">= {lo}"
        raise _err(path, f"must be {bound} and <= {hi}, got {value}")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _err(path, f"must be true or false, got {value!r}")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise _err(path, f"must be a finite number, got {value!r}")
    return float(value)


def _check_keys(table: Mapping[str, Any], allowed: set[str] | frozenset[str], path: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        where = f"{path}." if path else ""
        raise LabError(
            f"unknown key {where}{unknown[0]} (allowed here: {', '.join(sorted(allowed))})"
        )


def _config_value(value: Any, path: str) -> Any:
    """A value that can go into a node's TOML config (scalars and lists of them)."""
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _err(path, f"must be finite, got {value}")
        return value
    if isinstance(value, list):
        return [_config_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise _err(path, f"{type(value).__name__} values cannot go into a relay config")


def _settable_key(key: str, path: str, managed: frozenset[str] = MANAGED_RELAY_KEYS) -> str:
    """``key`` if it is a config key the user may set (not one of the lab's ``managed`` keys)."""
    try:
        check_key(key)
    except LabError as e:
        raise _err(path, str(e)) from e
    if key in managed:
        raise _err(path, f"{key} is managed by the lab and cannot be set")
    return key


def _params(table: Any, path: str) -> dict[str, int]:
    out = {}
    for key, value in _table(table, path).items():
        _settable_key(key, f"{path}.{key}")
        out[key] = _int(value, f"{path}.{key}")
    return out


# ---------------------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: tables merge recursively, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def variant_label(values: Mapping[str, Any]) -> str:
    """The label of a variant from its keys and values.

    One key: a string value names itself (``rr``), anything else is
    ``ABBR=value`` (``H=10``, ``OutbufCells=32``). Several keys:
    ``ABBR=value`` joined by commas (``Scheduler=ewma,H=3``). No keys: ``base``.
    """
    if not values:
        return "base"
    if len(values) == 1:
        ((key, value),) = values.items()
        if isinstance(value, str):
            return value
        return f"{LABEL_ABBREVIATIONS.get(key, key)}={_format_value(value)}"
    return ",".join(f"{LABEL_ABBREVIATIONS.get(k, k)}={_format_value(v)}" for k, v in values.items())


def _make_variant(values: Mapping[str, Any], path: str, label: str | None = None, kind: Any = None) -> Variant:
    if kind is not None and kind.VariantOptions is not None:
        label = label if label is not None else variant_label(values)
        parsed = kind.parse_variant(label, values, path)
        return Variant(label=label, impl=None, values=dict(values), options=parsed)
    relay: dict[str, Any] = {}
    params: dict[str, int] = {}
    impl = None
    for key, value in values.items():
        kpath = f"{path}.{key}"
        if key == "impl":
            impl = _str(value, kpath, choices=("chive", "tor"))
        elif key.startswith("params."):
            name = _settable_key(key[len("params."):], kpath)
            params[name] = _int(value, kpath)
        else:
            relay[_settable_key(key, kpath)] = _config_value(value, kpath)
    return Variant(
        label=label if label is not None else variant_label(values),
        relay=relay,
        params=params,
        impl=impl,
        values=dict(values),
    )


def _parse_variants(doc: Mapping[str, Any], impl: str, kind: Any = None) -> tuple[Variant, ...]:
    out: list[Variant] = []
    explicit = doc.get("variant", [])
    if not isinstance(explicit, list):
        raise _err("variant", "must be an array of tables ([[variant]])")
    for i, item in enumerate(explicit):
        path = f"variant[{i}]"
        table = dict(_table(item, path))
        label = table.pop("label", None)
        if label is not None:
            label = _str(label, f"{path}.label", max_len=100)
        out.append(_make_variant(table, path, label, kind))

    matrix = _table(doc.get("variants", {}), "variants")
    keys = list(matrix)
    lists = []
    for key in keys:
        values = matrix[key]
        if not isinstance(values, list) or not values:
            raise _err(f"variants.{key}", "must be a non-empty array of values")
        lists.append(values)
    if impl == "both" and "impl" not in matrix and not any(v.impl for v in out):
        # `impl = "both"`: every variant runs on chive and on tor (issue 5).
        keys = ["impl", *keys]
        lists = [["chive", "tor"], *lists]
    if keys:
        for combo in itertools.product(*lists):
            out.append(_make_variant(dict(zip(keys, combo)), "variants", None, kind))
    if not out:
        out.append(Variant(label="base"))
    if len(out) > MAX_VARIANTS:
        raise _err("variants", f"{len(out)} variants, more than {MAX_VARIANTS}")
    seen: set[str] = set()
    for v in out:
        if not v.label or "/" in v.label or v.label in (".", "..") or len(v.label) > 100:
            raise _err("variant", f"bad variant label {v.label!r} (it names a directory)")
        if v.label in seen:
            raise _err("variant", f"two variants are labelled {v.label!r}")
        seen.add(v.label)
    return tuple(out)


def _parse_think(value: Any, path: str) -> ThinkTime:
    table = _table(value, path)
    _check_keys(table, {"dist", "mean"}, path)
    if "mean" not in table:
        raise _err(path, "needs mean (seconds)")
    return ThinkTime(
        dist=_str(table.get("dist", "exp"), f"{path}.dist", choices=THINK_DISTS),
        mean=_float(table["mean"], f"{path}.mean", positive=True),
    )


_CLIENT_KEYS = {
    "class", "count", "size", "method", "continuous", "pause", "interval", "think", "isolate",
    "parallel", "start_delay", "timeout", "verify",
}


def parse_clients(items: Any) -> tuple[ClientSpec, ...]:
    """The ``[[clients]]`` array (at least one table, distinct classes, bounded processes)."""
    if not isinstance(items, list) or not items:
        raise _err("clients", "needs at least one [[clients]] table")
    clients = tuple(_parse_client(item, f"clients[{i}]") for i, item in enumerate(items))
    names = [c.cls for c in clients]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _err("clients", f"class {dup[0]!r} appears twice (give each [[clients]] its own class)")
    total = sum(c.count for c in clients)
    if total > MAX_CLIENT_PROCESSES:
        raise _err("clients", f"{total} perf processes, more than {MAX_CLIENT_PROCESSES}")
    return clients


def _parse_client(item: Any, path: str) -> ClientSpec:
    table = _table(item, path)
    _check_keys(table, _CLIENT_KEYS, path)
    if "class" not in table:
        raise _err(path, "needs class (a name such as \"web\" or \"bulk\")")
    cls = _str(table["class"], f"{path}.class", max_len=40)
    if not cls or not all(ch.isalnum() or ch in "-_" for ch in cls):
        raise _err(f"{path}.class", f"use letters, digits, '-' or '_'; got {cls!r}")
    if "size" not in table:
        raise _err(path, "needs size (bytes per transfer)")
    timing = [k for k in ("pause", "interval", "think") if k in table]
    continuous = _bool(table.get("continuous", False), f"{path}.continuous")
    if len(timing) > 1:
        raise _err(path, f"set at most one of pause, interval, think (got {', '.join(timing)})")
    if continuous and timing:
        raise _err(path, f"continuous = true excludes {timing[0]}")
    if not continuous and not timing:
        raise _err(path, "say how transfers follow each other: continuous = true, pause, interval or think")
    return ClientSpec(
        cls=cls,
        count=_int(table.get("count", 1), f"{path}.count", lo=1, hi=MAX_CLIENT_PROCESSES),
        size=_int(table["size"], f"{path}.size", lo=1, hi=MAX_TRANSFER_BYTES),
        method=_str(table.get("method", "get"), f"{path}.method", choices=METHODS),
        continuous=continuous,
        pause=_float(table["pause"], f"{path}.pause") if "pause" in table else None,
        interval=_float(table["interval"], f"{path}.interval") if "interval" in table else None,
        think=_parse_think(table["think"], f"{path}.think") if "think" in table else None,
        isolate=_bool(table.get("isolate", False), f"{path}.isolate"),
        parallel=_int(table.get("parallel", 1), f"{path}.parallel", lo=1, hi=MAX_PARALLEL),
        start_delay=_float(table.get("start_delay", 0.0), f"{path}.start_delay"),
        timeout=_float(table["timeout"], f"{path}.timeout", positive=True) if "timeout" in table else None,
        verify=_bool(table.get("verify", False), f"{path}.verify"),
    )


_NETWORK_KEYS = {
    "relays", "bandwidth_rate", "bandwidth_burst", "relay", "client", "params",
    "consensus_interval", "log_level", "timeout",
}


def parse_network(value: Any) -> NetworkConfig:
    """The ``[network]`` table."""
    table = _table(value, "network")
    _check_keys(table, _NETWORK_KEYS, "network")
    relay = {
        _settable_key(k, f"network.relay.{k}"): _config_value(v, f"network.relay.{k}")
        for k, v in _table(table.get("relay", {}), "network.relay").items()
    }
    client = {
        _settable_key(k, f"network.client.{k}", MANAGED_CLIENT_KEYS): _config_value(v, f"network.client.{k}")
        for k, v in _table(table.get("client", {}), "network.client").items()
    }
    rate = table.get("bandwidth_rate")
    burst = table.get("bandwidth_burst")
    return NetworkConfig(
        relays=_int(table.get("relays", 4), "network.relays", lo=MIN_RELAYS, hi=MAX_RELAYS),
        bandwidth_rate=None if rate is None else _int(rate, "network.bandwidth_rate", lo=0),
        bandwidth_burst=None if burst is None else _int(burst, "network.bandwidth_burst", lo=0),
        relay=relay,
        client=client,
        params=_params(table.get("params", {}), "network.params"),
        consensus_interval=_int(table.get("consensus_interval", 2), "network.consensus_interval", lo=1, hi=3600),
        log_level=_str(table.get("log_level", "info"), "network.log_level", max_len=200),
        timeout=_float(table.get("timeout", 90.0), "network.timeout", positive=True),
    )


def _opt_number(table: Mapping[str, Any], key: str, path: str) -> float | None:
    return None if key not in table else _number(table[key], f"{path}.{key}")


def _parse_paper(value: Any) -> tuple[PaperValue, ...]:
    if not isinstance(value, list):
        raise _err("paper", "must be an array of tables ([[paper]])")
    out = []
    for i, item in enumerate(value):
        path = f"paper[{i}]"
        table = _table(item, path)
        _check_keys(table, {"metric", "variant", "class", "value", "low", "high", "baseline", "note"}, path)
        if "metric" not in table:
            raise _err(path, "needs metric (e.g. \"ttlb_p50\")")
        metric = _str(table["metric"], f"{path}.metric", max_len=100)
        if not _known_metric(metric):
            raise _err(f"{path}.metric", f"unknown metric {metric!r} (see docs/lab.md, 'Paper numbers')")
        pv = PaperValue(
            metric=metric,
            variant=None if "variant" not in table else _str(table["variant"], f"{path}.variant", max_len=100),
            cls=None if "class" not in table else _str(table["class"], f"{path}.class", max_len=40),
            value=_opt_number(table, "value", path),
            low=_opt_number(table, "low", path),
            high=_opt_number(table, "high", path),
            baseline=None if "baseline" not in table else _str(table["baseline"], f"{path}.baseline", max_len=100),
            note=_str(table.get("note", ""), f"{path}.note"),
        )
        if pv.value is None and (pv.low is None or pv.high is None):
            raise _err(path, "needs value, or low and high")
        out.append(pv)
    return tuple(out)


def _known_metric(metric: str) -> bool:
    base = metric.removesuffix("_change_pct")
    if base in PAPER_OTHER_METRICS:
        return True
    measure, _, stat = base.rpartition("_")
    return measure in PAPER_MEASURES and stat in PAPER_STATS


_COMMON_KEYS = {
    "name", "description", "reproduces", "kind", "seed", "repetitions", "duration", "warmup", "drain",
    "backend", "impl", "variants", "variant", "quick", "paper",
}


def parse_scenario(doc: Mapping[str, Any], *, quick: bool = False, impl: str | None = None) -> Scenario:
    """Validate a parsed TOML document; with ``quick``, apply ``[quick]`` first.
    ``impl`` (``chive-lab run --impl``) replaces the file's ``impl`` before the
    variants are derived, so ``both`` adds the impl dimension as if written."""
    from .kinds import get_kind  # the kinds import this module

    source = dict(doc)
    raw = dict(doc)
    if quick and "quick" in raw:
        raw = deep_merge({k: v for k, v in raw.items() if k != "quick"}, _table(raw["quick"], "quick"))
    elif "quick" in raw:
        _table(raw["quick"], "quick")
    raw.pop("quick", None)
    if impl is not None:
        raw["impl"] = _str(impl, "--impl", choices=IMPLS)

    kind = get_kind(_str(raw.get("kind", "overlay"), "kind", max_len=60))
    options = kind.parse_options({k: v for k, v in raw.items() if k not in _COMMON_KEYS})

    if "name" not in raw:
        raise LabError("name: missing (a short identifier such as \"paper000-ewma-web-vs-bulk\")")
    name = _str(raw["name"], "name", max_len=100)
    if not name or "/" in name:
        raise _err("name", f"bad name {name!r}")
    impl = _str(raw.get("impl", "chive"), "impl", choices=IMPLS)
    duration = _float(raw.get("duration", 60.0), "duration", positive=True)
    # A kind that runs a network with clients keeps them in its options (``network``, ``clients``).
    network = getattr(options, "network", None)
    clients = getattr(options, "clients", None)

    return Scenario(
        name=name,
        description=_str(raw.get("description", ""), "description"),
        reproduces=_str(raw.get("reproduces", ""), "reproduces"),
        kind=kind.name or _str(raw.get("kind", "overlay"), "kind"),
        seed=_int(raw.get("seed", 1), "seed", lo=0, hi=2**32 - 1),
        repetitions=_int(raw.get("repetitions", 1), "repetitions", lo=1, hi=MAX_REPETITIONS),
        duration=duration,
        warmup=_float(raw.get("warmup", 0.0), "warmup"),
        drain=_float(raw.get("drain", 0.0), "drain"),
        backend=_str(raw.get("backend", "loopback"), "backend", max_len=60),
        impl=impl,
        network=network if isinstance(network, NetworkConfig) else NetworkConfig(),
        clients=tuple(clients) if isinstance(clients, tuple) else (),
        variants=_parse_variants(raw, impl, kind),
        paper=_parse_paper(raw.get("paper", [])),
        options=options,
        quick=quick,
        source=source,
    )


def load_scenario(path: Path | str, *, quick: bool = False, impl: str | None = None) -> Scenario:
    """Read and validate a scenario file. Errors name the file and the key."""
    path = Path(path)
    data = read_capped(path, MAX_SCENARIO_BYTES, "scenario")
    if data is None:
        raise LabError(f"cannot read scenario {path}: no such file")
    return scenario_from_bytes(data, str(path), quick=quick, impl=impl)


def scenario_from_bytes(data: bytes, origin: str, *, quick: bool = False, impl: str | None = None) -> Scenario:
    """A scenario file's bytes, decoded and validated as ``load_scenario`` does; errors start
    with ``origin`` (the file's path). The fuzz target ``chive_lab.fuzzing`` calls this."""
    if len(data) > MAX_SCENARIO_BYTES:
        raise LabError(f"scenario {origin}: larger than {MAX_SCENARIO_BYTES} bytes")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise LabError(f"{origin}: not valid TOML: {e}") from e
    try:
        return parse_scenario(doc, quick=quick, impl=impl)
    except LabError as e:
        raise LabError(f"{origin}: {e}") from e


def impl_of(scenario: Scenario, variant: Variant) -> str:
    """The implementation a variant runs on (its own ``impl`` or the scenario's)."""
    return variant.impl or scenario.impl


def display_label(variant: Variant) -> str:
    """A short name for tables comparing implementations: ``chive/ewma``,
    ``tor/ewma`` (``impl/rest``), or the label when the variant sets no impl.
    The variant's label itself (directory and summary key) is unchanged."""
    if variant.impl is None:
        return variant.label
    rest = {k: v for k, v in variant.values.items() if k != "impl"}
    if not rest:
        return variant.impl
    return f"{variant.impl}/{variant_label(rest)}"


def select_variants(scenario: Scenario, labels: list[str]) -> Scenario:
    """The scenario restricted to ``labels`` (in scenario order); LabError for an unknown one."""
    for label in labels:
        scenario.variant(label)
    keep = tuple(v for v in scenario.variants if v.label in set(labels))
    return _replace(scenario, variants=keep)


def with_repetitions(scenario: Scenario, repetitions: int) -> Scenario:
    """The scenario with another repetition count."""
    return _replace(scenario, repetitions=_int(repetitions, "--repetitions", lo=1, hi=MAX_REPETITIONS))


def _replace(scenario: Scenario, **changes: Any) -> Scenario:
    import dataclasses

    return dataclasses.replace(scenario, **changes)
