"""The deterministic content ``chive httpd`` serves at ``/bytes/<N>``: byte i
is ``i % 251``. 251 is prime, so the pattern does not line up with cell (498),
record or buffer sizes and a lost, duplicated or reordered block shows.

:func:`main` checks a downloaded file from a shell (exit 0 if it is
byte-exact, 1 otherwise, with the first difference on stderr)::

    python -c 'import sys; from chive_lab.content import main; sys.exit(main())' FILE SIZE
"""

from __future__ import annotations

import sys
from pathlib import Path

PERIOD = 251
_ONE_PERIOD = bytes(range(PERIOD))
_CHUNK = PERIOD * 4096  # about 1 MiB, a multiple of the period


def expected_bytes(n: int) -> bytes:
    """The first ``n`` bytes of the pattern."""
    if n < 0:
        raise ValueError("size must be >= 0")
    reps = n // PERIOD + 1
    return (_ONE_PERIOD * reps)[:n]


def first_mismatch(data: bytes, offset: int = 0) -> int | None:
    """Index (within ``data``) of the first byte that differs from the pattern
    at absolute position ``offset``, or None if all match."""
    start = offset % PERIOD
    want = (_ONE_PERIOD * ((len(data) + start) // PERIOD + 1))[start : start + len(data)]
    if data == want:
        return None
    for i, (a, b) in enumerate(zip(data, want)):
        if a != b:
            return i
    return None


def check_body(data: bytes, size: int) -> str | None:
    """None if ``data`` is exactly the ``size``-byte pattern, else what is wrong."""
    if len(data) != size:
        return f"got {len(data)} bytes, expected {size}"
    bad = first_mismatch(data)
    if bad is not None:
        return f"byte {bad} is {data[bad]}, expected {bad % PERIOD}"
    return None


def check_file(path: Path, size: int) -> str | None:
    """Like :func:`check_body` for a file, read in chunks (files may be large)."""
    pos = 0
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(_CHUNK)
                if not block:
                    break
                if pos + len(block) > size:
                    return f"file is longer than {size} bytes"
                bad = first_mismatch(block, pos)
                if bad is not None:
                    at = pos + bad
                    return f"byte {at} is {block[bad]}, expected {at % PERIOD}"
                pos += len(block)
    except OSError as e:
        return f"cannot read {path}: {e}"
    if pos != size:
        return f"got {pos} bytes, expected {size}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: arguments FILE SIZE (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: check FILE SIZE", file=sys.stderr)
        return 2
    problem = check_file(Path(args[0]), int(args[1]))
    if problem is not None:
        print(f"{args[0]}: NOT byte-exact: {problem}", file=sys.stderr)
        return 1
    return 0
