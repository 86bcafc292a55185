"""Generic validation of a kind's scenario keys into a frozen dataclass.

An experiment kind declares its options as a frozen dataclass whose fields
say what each key takes (:func:`option` adds bounds and choices);
:func:`parse_options` checks a raw TOML table against it, field by field:
unknown keys, wrong types and out-of-range values are :class:`LabError`\\ s
that name the key (``load.samples: must be >= 1, got 0``), in
:mod:`chive_lab.scenario`'s style. Cross-field rules go in the dataclass's
``__post_init__`` (raise LabError there).

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``X | None``,
``tuple[str, ...]`` / ``tuple[int, ...]`` (TOML arrays), ``dict[str, Any]``
(a table kept as is), a nested options dataclass (a TOML table), or anything
with a ``parse`` function in the field's metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable, Mapping

from .errors import LabError

__all__ = ["option", "parse_options", "as_dict"]


def option(default: Any = dataclasses.MISSING, *, lo: float | None = None, hi: float | None = None,
           choices: tuple[Any, ...] | None = None, positive: bool = False,
           check: Callable[[Any, str], Any] | None = None,
           parse: Callable[[Any, str], Any] | None = None,
           default_factory: Callable[[], Any] | Any = dataclasses.MISSING, doc: str = "") -> Any:
    """A dataclass field with validation metadata.

    ``lo``/``hi``: inclusive bounds of a number (or of each element of a tuple);
    ``positive``: a number > 0; ``choices``: the allowed values; ``check(value,
    path)``: more checks on the typed value (raise LabError, return the value to
    keep); ``parse(raw, path)``: replaces the type-driven reading altogether."""
    meta = {"lo": lo, "hi": hi, "choices": choices, "positive": positive, "check": check, "parse": parse,
            "doc": doc}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _err(path: str, msg: str) -> LabError:
    return LabError(f"{path}: {msg}")


def _describe(value: Any) -> str:
    return repr(value)


def _number(value: Any, path: str, kind: type, meta: Mapping[str, Any]) -> Any:
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(path, f"must be an integer, got {_describe(value)}")
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise _err(path, f"must be a number, got {_describe(value)}")
        value = float(value)
    lo, hi = meta.get("lo"), meta.get("hi")
    if meta.get("positive") and value <= 0:
        raise _err(path, f"must be > 0, got {value}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None and hi is not None:
            raise _err(path, f"must be within {lo:g}..{hi:g}, got {value}")
        raise _err(path, f"must be >= {lo:g}, got {value}" if lo is not None else f"must be <= {hi:g}, got {value}")
    return value


def _read(value: Any, hint: Any, path: str, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None and len(inner) < len(args):
            return None
        if len(inner) == 1:
            return _read(value, inner[0], path, meta)
        raise _err(path, "unsupported option type")  # a declaration bug, not a user's
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _err(path, f"must be a table, got {_describe(value)}")
        return parse_options(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise _err(path, f"must be true or false, got {_describe(value)}")
        return value
    if hint in (int, float):
        return _number(value, path, hint, meta)
    if hint is str:
        if not isinstance(value, str):
            raise _err(path, f"must be a string, got {_describe(value)}")
        if len(value) > 4096:
            raise _err(path, f"too long ({len(value)} characters)")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise _err(path, f"must be an array, got {_describe(value)}")
        elem = args[0] if args else Any
        return tuple(_read(v, elem, f"{path}[{i}]", meta) for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, dict):
            raise _err(path, f"must be a table, got {_describe(value)}")
        return dict(value)
    if hint is Any:
        return value
    raise _err(path, f"unsupported option type {hint!r}")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` of an options class, evaluated once: it compiles every string
    annotation on each call, which was most of the time a scenario took to validate."""
    return typing.get_type_hints(cls)


def parse_options(cls: type, raw: Mapping[str, Any], path: str = "") -> Any:
    """``raw`` (a TOML table) validated into the frozen dataclass ``cls``.
    Missing keys take the field's default; a field without a default is required."""
    if not isinstance(raw, Mapping):
        raise _err(path or "options", f"must be a table, got {_describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise LabError(f"unknown key {where}{unknown[0]} (allowed here: {', '.join(sorted(fields))})")
    hints = _type_hints(cls)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        kpath = f"{path}.{name}" if path else name
        meta = f.metadata or {}
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _err(kpath, "missing (required)")
            continue
        value = raw[name]
        if meta.get("parse") is not None:
            value = meta["parse"](value, kpath)
        else:
            value = _read(value, hints[name], kpath, meta)
            choices = meta.get("choices")
            if choices is not None:
                bad = [v for v in (value if isinstance(value, tuple) else (value,)) if v not in choices]
                if bad:
                    raise _err(kpath, f"must be one of {', '.join(map(str, choices))}; got {bad[0]!r}")
        if meta.get("check") is not None:
            value = meta["check"](value, kpath)
        values[name] = value
    return cls(**values)


def as_dict(options: Any) -> dict[str, Any]:
    """A dataclass's fields as JSON-ready values (tuples become lists), shallow."""
    return {f.name: (list(v) if isinstance(v := getattr(options, f.name), tuple) else v)
            for f in dataclasses.fields(options)}
