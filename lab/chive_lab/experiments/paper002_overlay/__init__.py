"""Paper 002 (Marks, Tschorsch, Scheuermann), the overlay case, with chive relays.

Hosts A, B, C on 10 Mbit/s full-duplex links to one switch (netns backend),
relay ``relayA`` on A, ``relayB`` on B, ``relayC`` on C, the authority on an
unshaped host X. Every circuit is ``relayA, relayB, relayC`` (or reversed), so
the overlay links A–B and B–C carry bulk data in BOTH directions and B's access
link carries everything in both directions — the paper's bidirectional setting
(Sec. V, Figs 6-9) with overlay connections instead of plain TCP:

* client ``clientA`` on A downloads from ``httpdC`` on C through exit relayC
  (data C→B→A) and uploads to it (A→B→C), from 0 to 250 s;
* client ``clientC`` on C does the same towards ``httpdA`` through exit relayA,
  from 50 to 300 s (times × ``scale``; ``--quick`` uses 0.2).

Clients cannot choose their path: the authority gives Guard only to relayA and
relayC (relayB advertises a lower bandwidth and ``TestingAllGuards`` is off), so
a circuit pinned to exit relayC (``host.relayC.exit``) must be relayA, relayB,
relayC; the client logs are checked for it.

Directions (each is one direction of BOTH overlay links):

* ``A->B``: A→B→C, carried by clientA's upload and clientC's download;
* ``C->B``: C→B→A, carried by clientC's upload and clientA's download.

Variants are declared in the scenario (:class:`~.options.VariantOptions`: ``split`` — the
relays' ``SplitDirection`` off/always/dynamic —, ``ackprio`` — ``chive shape`` on every host —,
``relay`` options, ``shape.bulk_ceil``, ``host_cc``, ``impl = "tor"`` for Debian's tor in every
role, and the paper figure and text they are compared with); ``scenarios/paper002-overlay-*.toml``
list them with what each one tests. The issue's targets are the scenario's ``[targets]``.

Measurement: ``chive perf --progress 1 --verify`` per transfer loop (4 flows, `circuits` loops each);
bytes per second per loop (downloads counted at the receiving client, uploads
at the sending client, which the circuit window keeps within 1000 cells of
what the exit delivered), summed per direction. Same analysis and outputs as
:mod:`chive_lab.experiments.paper002`, in OUT/paper002_overlay: ``throughput_<variant>.png/.csv``,
``variance.png/.csv`` (1 s samples of the directions towards B, 100-250 s),
``summary.json`` (schema 1), ``comparison.md``; per run the perf records, relay logs,
``links.json`` (which TCP connection carried how many bytes, from ``ss``) and ``qdisc-*.txt``.

Topology ``to-b`` (scenario key ``topology``; the default above is ``through-b``): the
paper's own pattern, where the data towards B ENDS at B. A second relay ``relayB2`` and the
web servers run on B; clients pin their circuits with ``EntryNodes``/``MiddleNodes`` to
``relayA|relayC, relayB2, relayB`` (exit). clientA uploads to and downloads from ``httpdBA``
on B, clientC from ``httpdBC``: the overlay link A–B2 carries A→B and B→A, C–B2 carries C→B
and B→C, and B's access link is shared only by what B sends (as in the paper, Sec. V).
Directions: ``A->B``, ``C->B`` (towards B: the paper's Figs 6-9) and ``B->A``, ``B->C``.
Why a second topology: in ``through-b`` every byte crosses B's uplink, so each direction can
have at most half of it (minus 7.3% cell and TCP/IP overhead, and 10% more under `chive shape`,
whose data class gets 90% of the link): the issue's 45% is then out of reach by construction. In
``to-b`` the same holds for what B sends under `chive shape` (:func:`ceiling_share`: ~0.417);
only the directions towards B can reach 45% (ceiling ~0.463).

Run it with ``chive-lab run scenarios/paper002-overlay-to-b.toml --out DIR``; pool finished
results with ``chive-lab pool --out DIR SRC...``.

Modules: :mod:`.options` (scenario keys, variants, targets, flows), :mod:`.testbed` (hosts,
placement, one repetition, series), :mod:`.targets` (ceilings, wire shares, targets),
:mod:`.evidence` (what logs and sockets say about a run), :mod:`.analysis` (summary, figures,
comparison.md), :mod:`.pooling` (several results as one batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ... import analysis as an
from .. import bulk
from ...errors import LabError
from ...kinds import RepetitionContext
from .. import netns_overlay as no
from .analysis import PAPER_VARIANCE, analyze, analyze_raw, directions_of
from .evidence import (
    BUSY_CONNECTION_BYTES,
    DESIGNED_CONNECTIONS,
    busy_connections,
    extra_channel_lines,
    extra_channel_pairs,
    link_queue_lines,
    run_evidence,
)
from .options import (
    A_START,
    A_STOP,
    C_START,
    C_STOP,
    DIRECTIONS,
    DIRECTIONS_TO_B,
    EXIT_RELAYS,
    KIND_NAME,
    MAX_CIRCUITS,
    OVERLAP,
    SLOT,
    SOLO,
    TOPOLOGIES,
    VAR_WINDOW,
    Flow,
    Params,
    Targets,
    VariantOptions,
    directions,
    flows,
    loop_stems,
    params_dict,
)
from .pooling import pool, read_result, read_result_with_evidence
from .targets import (
    SHAPE_DATA,
    SHAPE_THROTTLE,
    WIRE_EFFICIENCY,
    ceiling_share,
    compute_targets,
    data_ceiling,
    declared_targets,
    declared_variants,
    wire_shares,
)
from .testbed import (
    B_BANDWIDTH,
    DIR_PORT,
    HOST_BY_ADDR,
    HTTP2_PORT,
    HTTP_PORT,
    RELAY2_PORT,
    RELAY_PORT,
    SHAPED_HOSTS,
    SOCKS_PORT,
    _place_nodes,
    collect_flows,
    link_bytes,
    run_repetition_raw,
)

__all__ = [
    "A_START", "A_STOP", "B_BANDWIDTH", "BUSY_CONNECTION_BYTES", "C_START", "C_STOP", "DESIGNED_CONNECTIONS",
    "DIRECTIONS", "DIRECTIONS_TO_B", "DIR_PORT", "EXIT_RELAYS", "HOST_BY_ADDR", "HTTP2_PORT", "HTTP_PORT", "KIND",
    "KIND_NAME", "MAX_CIRCUITS", "OVERLAP", "PAPER_VARIANCE", "RELAY2_PORT", "RELAY_PORT", "SHAPED_HOSTS",
    "SHAPE_DATA", "SHAPE_THROTTLE", "SLOT", "SOCKS_PORT", "SOLO", "TOPOLOGIES", "VAR_WINDOW", "WIRE_EFFICIENCY",
    "Flow", "Paper002Overlay", "Params", "Targets", "VariantOptions", "_place_nodes", "analyze", "analyze_raw",
    "busy_connections", "ceiling_share", "collect_flows", "compute_targets", "data_ceiling", "declared_targets",
    "declared_variants", "directions", "directions_of", "extra_channel_lines", "extra_channel_pairs",
    "flows", "link_bytes", "link_queue_lines", "loop_stems", "params_dict", "pool",
    "read_result", "read_result_with_evidence", "run_evidence", "run_repetition_raw", "wire_shares",
]


class Paper002Overlay(no.NetnsKind):
    """See the package documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def preflight(self, scenario: Any) -> None:
        """Refuse tor variants without tor or outside topology ``to-b``."""
        p = self.options_of(scenario)
        if p.topology != "to-b" and any(v.options.impl == "tor" for v in scenario.variants):
            raise LabError(f"{KIND_NAME}: tor variants need topology = \"to-b\" (through-b fixes paths with "
                           "chive's Guard flags)")
        super().preflight(scenario)

    def doing(self, scenario: Any, p: Params) -> str:
        return f"{p.t(C_STOP):g} s of bulk transfers through relays A, B, C"

    def repetition(self, ctx: RepetitionContext, p: Params, run_dir: Path) -> None:
        bulk.save_flows(run_dir, run_repetition_raw(ctx.variant.label, ctx.variant.options, ctx.rep, run_dir, p,
                                                    chive_bin=ctx.binary, progress=ctx.log))
        (run_dir / "evidence.json").write_text(json.dumps(run_evidence(run_dir), indent=1))

    def analyze(self, out_dir: Path, scenario: Any) -> an.Analysis:
        return analyze(out_dir, scenario)

    def pool(self, sources: list[Path], out: Path, **options: Any) -> dict[str, Any]:
        """``chive-lab pool``: ``exclude_extra_channels`` leaves out runs with a second channel."""
        unknown = set(options) - {"exclude_extra_channels"}
        if unknown:
            raise LabError(f"pool: kind {KIND_NAME!r} takes no option {sorted(unknown)[0]}")
        return pool(sources, out, exclude_extra_channels=bool(options.get("exclude_extra_channels")))


KIND = Paper002Overlay()
