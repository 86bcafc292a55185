"""DIR/state.json: what a network directory holds and which processes run in it.

``up`` rewrites it after every process it starts (before waiting for
anything), so ``down`` can stop whatever was started even when ``up`` died
half way. The file is replaced atomically so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import LabError
from .files import read_capped
from .process import ProcessRecord

STATE_FILE = "state.json"
SCHEMA = 1
# A state file lists a few dozen processes; refuse anything absurdly large.
MAX_STATE_BYTES = 4 << 20


@dataclass
class State:
    """Contents of DIR/state.json."""

    dir: str
    created: float = field(default_factory=time.time)
    spec: dict[str, Any] = field(default_factory=dict)
    """The NetworkSpec the network was started with (for people and later tools)."""
    endpoints: dict[str, Any] = field(default_factory=dict)
    """Addresses: socks, http, authority, authority_identity (filled in as known)."""
    nodes: list[ProcessRecord] = field(default_factory=list)
    """Started processes, in start order."""
    status: str = "starting"
    """"starting", "ready" or "failed: <reason>"."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "schema": SCHEMA,
            "dir": self.dir,
            "created": self.created,
            "status": self.status,
            "spec": self.spec,
            "endpoints": self.endpoints,
            "nodes": [n.to_json() for n in self.nodes],
        }

    @classmethod
    def from_json(cls, obj: Any) -> "State":
        """Parse :meth:`to_json` output; raise LabError on anything unexpected."""
        if not isinstance(obj, dict):
            raise LabError("state file does not hold a JSON object")
        if obj.get("schema") != SCHEMA:
            raise LabError(f"state file schema {obj.get('schema')!r} is not {SCHEMA}")
        nodes = obj.get("nodes")
        if not isinstance(nodes, list):
            raise LabError("state file has no node list")
        spec = obj.get("spec", {})
        endpoints = obj.get("endpoints", {})
        if not isinstance(spec, dict) or not isinstance(endpoints, dict):
            raise LabError("state file: spec and endpoints must be objects")
        try:
            created = float(obj.get("created", 0.0))
        except (TypeError, ValueError) as e:
            raise LabError("state file: bad 'created' time") from e
        return cls(
            dir=str(obj.get("dir", "")),
            created=created,
            spec=spec,
            endpoints=endpoints,
            nodes=[ProcessRecord.from_json(n) for n in nodes],
            status=str(obj.get("status", "")),
        )

    def pids(self) -> dict[str, int]:
        """Node name -> pid, in start order."""
        return {n.name: n.pid for n in self.nodes}


def state_path(dir: Path) -> Path:
    """Where the state of the network in ``dir`` is kept."""
    return Path(dir) / STATE_FILE


def save_state(dir: Path, state: State) -> None:
    """Write the state atomically (temp file, fsync, rename)."""
    path = state_path(dir)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(state.to_json(), indent=2, sort_keys=False) + "\n"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(dir: Path) -> State:
    """Read DIR/state.json; raise LabError if it is missing or malformed."""
    path = state_path(dir)
    raw = read_capped(path, MAX_STATE_BYTES, "network state")
    if raw is None:
        raise LabError(f"{path} does not exist: no network was started in {dir}")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LabError(f"{path} is not valid JSON: {e}") from e
    try:
        return State.from_json(obj)
    except LabError as e:
        raise LabError(f"{path}: {e}") from e
