"""Reading the small files the lab parses (scenarios, ``state.json``, PortsFiles) with a
size bound, so a wrong path or a runaway file is a :class:`LabError`, not a memory spike."""

from __future__ import annotations

from pathlib import Path

from .errors import LabError


def read_capped(path: Path, limit: int, what: str) -> bytes | None:
    """The bytes of file ``path``, or None if it does not exist; LabError naming ``what`` (e.g.
    ``"scenario"``) and the path if it cannot be read or holds more than ``limit`` bytes."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LabError(f"cannot read {what} {path}: {e.strerror or e}") from e
    if len(data) > limit:
        raise LabError(f"{what} {path}: larger than {limit} bytes")
    return data
