"""The issue's targets for the ``paper002-overlay`` kind: how much of the link
each direction can have at most (:func:`ceiling_share`, from the shared
bottleneck, ``chive shape``'s classes and the cell and TCP/IP overhead), the
share it had on the wire (:func:`wire_shares`), and the scenario's
``[targets]`` checked against a summary (:func:`compute_targets`)."""

from __future__ import annotations

from typing import Mapping

from ...kinds import shipped_declarations
from ...options import parse_options
from .options import DIRECTIONS, KIND_NAME, Params, Targets, VariantOptions, directions
from .testbed import HOST_BY_ADDR

#: Goodput per byte on the wire: a full TCP segment carries 1448 payload bytes in 1514 (IPv4,
#: TCP with timestamps and the Ethernet header, which HTB counts), a cell 498 data bytes in 514
#: (TLS records add ~0.1%, left out).
WIRE_EFFICIENCY = (1448 / 1514) * (498 / 514)
#: `chive shape` defaults (what the lab installs): the root at 95% of the link rate, everything
#: but short ACKs in a class at 90% of it.
SHAPE_THROTTLE, SHAPE_DATA = 0.95, 0.9


def declared_variants() -> dict[str, VariantOptions]:
    """Every variant the shipped ``paper002-overlay`` scenarios declare."""
    return {label: parse_options(VariantOptions, raw, f"variant {label}")
            for label, raw in shipped_declarations(KIND_NAME).items()}


def declared_targets() -> Targets | None:
    """The ``[targets]`` of the shipped ``paper002-overlay`` scenarios (None if none has one)."""
    raw = shipped_declarations(KIND_NAME, "targets")
    return parse_options(Targets, raw, "targets") if raw else None


def wire_shares(queues: list[dict], rate_bps: float) -> dict[str, float]:
    """Share of the link each host-to-host direction used on the wire in a run, from its
    :func:`link_queues` rows: the bytes every relay socket of that direction sent (headers and
    retransmissions included) over the longest sampled span among them, per link rate. This
    is the "share of the link" of the issue's target. Goodput is ~0.9 of it: cells and TCP/IP
    headers (:data:`WIRE_EFFICIENCY`, 0.93) and the SENDMEs a direction carries for the other."""
    sent: dict[str, float] = {}
    span: dict[str, float] = {}
    for q in queues:
        if "wire_bytes" not in q or not q.get("wire_span_s"):
            continue
        dst = HOST_BY_ADDR.get(q["peer"].rsplit(":", 1)[0])
        if dst is None or dst == q["host"]:
            continue
        d = f"{q['host']}->{dst}"
        sent[d] = sent.get(d, 0.0) + float(q["wire_bytes"])
        span[d] = max(span.get(d, 0.0), float(q["wire_span_s"]))
    return {d: sent[d] * 8 / span[d] / rate_bps for d in sorted(sent) if span[d] > 0}


def data_ceiling(variant: str, variants: Mapping[str, VariantOptions] | None = None) -> float:
    """The fraction of the link `chive shape`'s data class may use in ``variant``: the
    paper's hard 90%, or the variant's ``shape.bulk_ceil`` (``variants``: the declarations,
    default the shipped scenarios')."""
    v = (variants if variants is not None else declared_variants()).get(variant)
    return v.shape.bulk_ceil if v is not None and v.shape.bulk_ceil is not None else SHAPE_DATA


def ceiling_share(p: "Params", direction: str, ackprio: bool, data: float = SHAPE_DATA) -> float:
    """The largest goodput share of the link that ``direction`` can have while both clients run,
    from the bottleneck it shares with one other flow: the switch port to B for what goes
    towards B in ``to-b``, B's uplink for what B sends (and, in ``through-b``, for everything).
    A host under `chive shape` sends data at most at ``SHAPE_DATA`` of the link, so with ACK
    priority on B the two flows B sends get 45% of the link each on the wire; times
    ``WIRE_EFFICIENCY`` that is ~0.417 of goodput, below the issue's 45% by construction.
    ``data``: the data class's ceiling (:func:`data_ceiling`; 0.95 lets B's flows reach 47.5%
    on the wire, less what B's ACKs take)."""
    def egress(host: str) -> float:
        return min(SHAPE_THROTTLE, data) if ackprio and host in p.ackprio_hosts else 1.0

    if p.topology == "to-b" and direction in ("A->B", "C->B"):
        wire = min(0.5, egress(direction[0]))
    else:
        wire = min(0.5, egress("B") / 2)
    return wire * WIRE_EFFICIENCY


def compute_targets(summary: dict, p: "Params", targets: Targets,
                    variants: Mapping[str, VariantOptions]) -> dict:
    """The scenario's ``[targets]`` against a summary (issue 6: ``targets.variant``, split +
    ACK prio, gives each direction >= ``share_min`` of the link, and variance <=
    ``variance_ratio_max`` of ``targets.baseline``, the unshaped single connection). Also each
    direction's ceiling (:func:`ceiling_share`) and its share relative to it, and the same
    targets for every ACK-priority variant (``by_variant``)."""
    share_min, ratio_max = targets.share_min, targets.variance_ratio_max
    ref, baseline = targets.variant, targets.baseline
    dirs = directions(p)
    v = summary["variants"]
    t: dict = {"share_min": share_min, "variance_ratio_max": ratio_max}
    if ref in v:
        shares = [v[ref][d]["share_of_link"] for d in dirs]
        t["split_ackprio_min_share"] = min(shares)
        t["ceiling_share"] = {d: ceiling_share(p, d, True) for d in dirs}
        t["split_ackprio_share_of_ceiling"] = {
            d: v[ref][d]["share_of_link"] / t["ceiling_share"][d] for d in dirs}
        t["split_ackprio_min_share_of_ceiling"] = min(t["split_ackprio_share_of_ceiling"].values())
        # The paper's Fig 8 measure alone (both flows towards B share B's downlink: <= 0.5 each,
        # ~0.463 after cell and TCP/IP overhead; what B sends is held to 90% by `chive shape`).
        t["split_ackprio_towards_b_min_share"] = min(v[ref][d]["share_of_link"]
                                                     for d in DIRECTIONS)
        t["share_met"] = min(shares) >= share_min
        base = summary["extra"].get(baseline, {}).get("towards_b_variance")
        mine = summary["extra"][ref]["towards_b_variance"]
        if base and base == base and mine == mine:
            t["variance_ratio_vs_one"] = mine / base
            t["variance_met"] = mine / base <= ratio_max
        base = summary["extra"].get(baseline, {}).get("towards_b_variance_slots")
        mine = summary["extra"][ref].get("towards_b_variance_slots")
        if base and base == base and mine is not None and mine == mine:
            t["variance_ratio_vs_one_slots"] = mine / base
    # Every variant's variance against `one` (the unshaped single connection) of the same batch,
    # at 1 s and over 10 s slots; then the targets for every ACK-priority variant (split or not,
    # CUBIC or BBR links, borrowing data class or not): goodput share, wire share (what the
    # issue's "of the link" can mean under `chive shape`), ceilings, and that variance ratio.
    one = summary["extra"].get(baseline, {})
    if one.get("towards_b_variance"):
        t["variance_ratio_vs_one_by_variant"] = {
            name: {"1s": e["towards_b_variance"] / one["towards_b_variance"],
                   "10s": (e["towards_b_variance_slots"] / one["towards_b_variance_slots"]
                           if one.get("towards_b_variance_slots") else None)}
            for name, e in summary["extra"].items() if e.get("towards_b_variance") == e.get("towards_b_variance")}
    ratios = t.get("variance_ratio_vs_one_by_variant", {})
    t["by_variant"] = {}
    for name, vs in v.items():
        if name not in variants or not variants[name].ackprio:
            continue
        ceil = {d: ceiling_share(p, d, True, data_ceiling(name, variants)) for d in dirs}
        row: dict = {"split": variants[name].split, "data_ceiling": data_ceiling(name, variants),
                     "min_share": min(vs[d]["share_of_link"] for d in dirs),
                     "ceiling_share": ceil,
                     "min_share_of_ceiling": min(vs[d]["share_of_link"] / ceil[d] for d in dirs)}
        row["share_met"] = row["min_share"] >= share_min
        if all("wire_share" in vs[d] for d in dirs):
            row["wire_share"] = {d: vs[d]["wire_share"] for d in dirs}
            row["min_wire_share"] = min(row["wire_share"].values())
            row["wire_share_met"] = row["min_wire_share"] >= share_min
        if name in ratios:
            row["variance_ratio_vs_one"] = ratios[name]["1s"]
            row["variance_met"] = row["variance_ratio_vs_one"] <= ratio_max
            if ratios[name]["10s"] is not None:
                row["variance_ratio_vs_one_slots"] = ratios[name]["10s"]
        t["by_variant"][name] = row
    return t


def target_lines(t: dict, dirs: list[str]) -> list[str]:
    """comparison.md table: the issue's targets for every ACK-priority variant."""
    rows = t.get("by_variant", {})
    if not rows:
        return []

    def f(x, fmt=".3f"):
        return "-" if x is None or x != x else format(x, fmt)

    lines = [f"Issue 6 targets by ACK-priority variant: each direction >= {t['share_min']:.0%} of the link "
             f"(goodput, and on the wire: bytes the relay sockets sent incl. headers and "
             f"retransmissions), towards-B variance <= {t['variance_ratio_max']} x one's:", "",
             "| variant | split | data class ceiling | min goodput share (of ceiling) | wire share "
             + " / ".join(dirs) + " | min wire share | variance vs one 1 s [10 s] |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        wire = " / ".join(f(r["wire_share"][d]) for d in dirs) if "wire_share" in r else "-"
        lines.append(f"| {name} | {r['split']} | {r['data_ceiling']:g} | {f(r['min_share'])} "
                     f"({f(r['min_share_of_ceiling'], '.2f')}) | {wire} | {f(r.get('min_wire_share'))} | "
                     f"{f(r.get('variance_ratio_vs_one'))} [{f(r.get('variance_ratio_vs_one_slots'))}] |")
    return lines + [""]
