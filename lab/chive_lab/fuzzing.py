"""The fuzz target for the lab's scenario files (issue 18: every decoder of bytes read from disk).

``check_scenario_input(data)`` is what the coverage-guided fuzzer (``lab/scripts/fuzz_scenarios.py``,
atheris) and the replay test (``lab/tests/test_fuzzing.py``) call. The first byte picks the mode:

- bit 0 clear, **raw**: the rest is a scenario file, decoded and validated as ``chive-lab run``
  reads one (``scenario.scenario_from_bytes``).
- bit 0 set, **edit**: the rest drives edits of one of the repository's scenario files, already
  parsed (TOML is CPython's ``tomllib``; what is under test is the lab's validation of what the
  document holds): a value replaced by one of another type or an extreme one, a key deleted, a key
  known from another scenario added, a subtree copied from another scenario; then
  ``parse_scenario``. Random bytes seldom make TOML that names the lab's keys, so this mode is
  what reaches the kinds' option checks.

Bits 1-2 pick ``--impl`` (none, chive, tor, both), bit 3 ``--quick``.

The property: the outcome is a :class:`Scenario` or a :class:`LabError` (a message the user can act
on). Any other exception (``KeyError``, ``TypeError``, an overflow, a recursion) is a bug, and so is
a scenario that breaks the runner's assumptions: variant labels unique and each selectable, the
repetition count settable, and the same document validated twice giving the same scenario.
"""

from __future__ import annotations

import copy
import datetime
import importlib
import math
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from .errors import LabError
from .kinds import KINDS
from .scenario import IMPLS, Scenario, parse_scenario, scenario_from_bytes, select_variants, with_repetitions

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
"""The repository's scenario files: the edit mode's starting documents and the raw mode's seeds."""

MAX_EDITS = 4
_IMPL_CHOICES: tuple[str | None, ...] = (None, *IMPLS)


def preload_kinds() -> None:
    """Import every experiment kind's module now (the fuzzer instruments what is imported inside
    its ``instrument_imports`` block; the kinds are otherwise imported on first use)."""
    for target in KINDS.values():
        if isinstance(target, str):
            importlib.import_module(target.partition(":")[0])


@cache
def seed_documents() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file name, parsed document) of every scenario file in the repository, in name order."""
    docs = []
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        docs.append((path.name, tomllib.loads(path.read_text())))
    return tuple(docs)


@cache
def _vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every key and every string value that occurs in the seed documents."""
    keys: set[str] = set()
    strings: set[str] = {"", "x" * 5000, "a/b", "\x00", "-1", "nan", "1e999"}
    for _, doc in seed_documents():
        for container, key in _places(doc):
            if isinstance(key, str):
                keys.add(key)
            value = container[key]
            if isinstance(value, str):
                strings.add(value)
    return tuple(sorted(keys)), tuple(sorted(strings))


class _Choices:
    """The fuzzer's bytes read as a sequence of choices; zeros once they run out."""

    def __init__(self, data: bytes):
        self._data = data
        self._pos = 0

    def byte(self) -> int:
        if self._pos >= len(self._data):
            return 0
        self._pos += 1
        return self._data[self._pos - 1]

    def below(self, n: int) -> int:
        """A choice in ``range(n)`` (n > 0), from one byte or two for larger n."""
        if n <= 256:
            return self.byte() % n
        return (self.byte() << 8 | self.byte()) % n

    def signed(self) -> int:
        """A 64-bit signed integer."""
        raw = int.from_bytes(bytes(self.byte() for _ in range(8)), "little")
        return raw - (1 << 64) if raw >= 1 << 63 else raw


_SPECIAL_INTS = (0, 1, -1, 2, 3, 64, 1000, 10**6, 2**31, 2**32, 2**63 - 1, -(2**63), 10**30)
_SPECIAL_FLOATS = (0.0, -0.0, 0.5, -1.5, 1e-9, 1e9, 1e308, math.inf, -math.inf, math.nan)
_DATES = (datetime.date(2026, 1, 1), datetime.time(12, 0), datetime.datetime(1970, 1, 1))


def _value(c: _Choices, depth: int = 0) -> Any:
    """A TOML value of the fuzzer's choosing: any type tomllib can return."""
    keys, strings = _vocabulary()
    kind = c.below(10 if depth < 2 else 6)
    if kind == 0:
        return c.signed()
    if kind == 1:
        return _SPECIAL_INTS[c.below(len(_SPECIAL_INTS))]
    if kind == 2:
        return _SPECIAL_FLOATS[c.below(len(_SPECIAL_FLOATS))]
    if kind == 3:
        return bool(c.byte() & 1)
    if kind == 4:
        return strings[c.below(len(strings))]
    if kind == 5:
        return _DATES[c.below(len(_DATES))]
    if kind == 6:
        return [_value(c, depth + 1) for _ in range(c.below(4))]
    if kind == 7:
        return {keys[c.below(len(keys))]: _value(c, depth + 1) for _ in range(c.below(4))}
    if kind == 8:
        return [{keys[c.below(len(keys))]: _value(c, depth + 1)}]
    return keys[c.below(len(keys))]


def _places(node: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key or index) of every value below ``node``, depth first."""
    if isinstance(node, dict):
        for key in list(node):
            yield node, key
            yield from _places(node[key])
    elif isinstance(node, list):
        for i in range(len(node)):
            yield node, i
            yield from _places(node[i])


def _containers(node: Any) -> list[Any]:
    """``node`` and every table and array below it."""
    found = [node]
    for container, key in _places(node):
        if isinstance(container[key], (dict, list)):
            found.append(container[key])
    return found


def _edit(doc: dict[str, Any], c: _Choices) -> None:
    """One edit of ``doc`` in place, chosen by the fuzzer."""
    keys, _ = _vocabulary()
    places = list(_places(doc))
    op = c.below(5)
    if op == 0 and places:  # replace a value
        container, key = places[c.below(len(places))]
        container[key] = _value(c)
    elif op == 1 and places:  # delete a key or an element
        container, key = places[c.below(len(places))]
        del container[key]
    elif op == 2:  # add a key known from some scenario to a table
        tables = [t for t in _containers(doc) if isinstance(t, dict)]
        table = tables[c.below(len(tables))]
        table[keys[c.below(len(keys))]] = _value(c)
    elif op == 3:  # copy a subtree of another scenario to the same key here
        _, other = seed_documents()[c.below(len(seed_documents()))]
        donor_places = list(_places(other))
        if donor_places:
            container, key = donor_places[c.below(len(donor_places))]
            if isinstance(key, str):
                tables = [t for t in _containers(doc) if isinstance(t, dict)]
                tables[c.below(len(tables))][key] = copy.deepcopy(container[key])
    elif op == 4 and places:  # repeat an array's element
        arrays = [t for t in _containers(doc) if isinstance(t, list) and t]
        if arrays:
            array = arrays[c.below(len(arrays))]
            array.append(copy.deepcopy(array[c.below(len(array))]))


def edited_document(data: bytes) -> dict[str, Any] | None:
    """The edit mode's document for the bytes after the mode byte (None if there are no seeds)."""
    seeds = seed_documents()
    if not seeds:
        return None
    c = _Choices(data)
    doc = copy.deepcopy(seeds[c.below(len(seeds))][1])
    for _ in range(1 + c.below(MAX_EDITS)):
        _edit(doc, c)
    return doc


def _check_scenario(scenario: Scenario, again: Scenario) -> None:
    labels = [v.label for v in scenario.variants]
    assert labels, "a valid scenario without variants"
    assert len(set(labels)) == len(labels), f"variant labels not unique: {labels}"
    for label in labels:
        assert [v.label for v in select_variants(scenario, [label]).variants] == [label]
    assert with_repetitions(scenario, 1).repetitions == 1
    assert repr(again) == repr(scenario), "the same document validated twice differs"


def check_scenario_input(data: bytes) -> Scenario | None:
    """Run one fuzz input (module docstring); return the scenario if it validated. An
    ``AssertionError`` or any exception but ``LabError`` is a finding."""
    if not data:
        return None
    mode, rest = data[0], data[1:]
    impl = _IMPL_CHOICES[(mode >> 1) & 3]
    quick = bool(mode & 8)
    try:
        if mode & 1 == 0:
            scenario = scenario_from_bytes(rest, "fuzz.toml", quick=quick, impl=impl)
            again = scenario_from_bytes(rest, "fuzz.toml", quick=quick, impl=impl)
        else:
            doc = edited_document(rest)
            if doc is None:
                return None
            scenario = parse_scenario(copy.deepcopy(doc), quick=quick, impl=impl)
            again = parse_scenario(doc, quick=quick, impl=impl)
    except LabError:
        return None
    _check_scenario(scenario, again)
    return scenario


def seed_inputs() -> list[tuple[str, bytes]]:
    """(name, input) seeds for the fuzzer: every scenario file in raw mode, plain and quick, and
    one edit-mode input per file (its index, then no edit past the first)."""
    seeds = []
    for i, (name, _) in enumerate(seed_documents()):
        raw = (SCENARIO_DIR / name).read_bytes()
        seeds.append((f"raw-{name}", b"\x00" + raw))
        seeds.append((f"raw-quick-{name}", b"\x08" + raw))
        seeds.append((f"edit-{name}", bytes([1, i, 0, 0, 0, 0])))
    return seeds
