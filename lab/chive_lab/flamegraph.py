"""Flame graphs as SVG from folded stacks, without external tools.

Folded stacks are the format of `stackcollapse-perf.pl`, inferno and `lab/scripts/perf_groups.py
--folded`: one line per distinct stack, frames root first separated by `;`, then a space and the
sample weight. Kernel frames carry the `_[k]` suffix (the convention flamegraph.pl and inferno
colour by). `render_svg` lays them out the usual way: the root at the bottom, each frame as wide
as its share of the samples, children of a frame side by side in name order (so equal stacks merge
whatever order the samples came in), frames narrower than `min_fraction` of the whole left out
with everything above them (their samples still count in their parents' widths). Each frame's
tooltip gives its samples and share. The colours say what a frame is (kernel, crypto, chive,
tokio, TLS, the rest), not how hot it is.
"""

from __future__ import annotations

import colorsys
import re
from dataclasses import dataclass, field
from typing import Iterable
from xml.sax.saxutils import escape

KERNEL_SUFFIX = "_[k]"

# (what, regex on the frame's name, hue range): the first match decides.
PALETTE = [
    ("kernel", re.compile(re.escape(KERNEL_SUFFIX) + "$"), (20, 40)),
    ("crypto", re.compile(r"aes|gcm|ghash|sha1|Sha1|ctr::|cipher::|ring_core|polyval", re.I), (95, 130)),
    ("chive", re.compile(r"chive"), (200, 225)),
    ("tokio", re.compile(r"^<?(tokio|mio)"), (265, 290)),
    ("tls", re.compile(r"rustls|\bring::"), (170, 185)),
]
OTHER_HUES = (45, 60)


@dataclass
class Frame:
    """One node of the merged call tree: `value` counts the samples in it and above it."""

    name: str
    value: int = 0
    children: dict[str, "Frame"] = field(default_factory=dict)


def parse_folded(lines: Iterable[str]) -> dict[str, int]:
    """Stack → weight from folded lines; repeated stacks add up. Raises ValueError naming the
    line for one without a numeric weight."""
    out: dict[str, int] = {}
    for i, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not stack or not count.isdigit():
            raise ValueError(f"line {i}: not a folded stack (\"frames;... COUNT\"): {line[:80]!r}")
        out[stack] = out.get(stack, 0) + int(count)
    return out


def build_tree(folded: dict[str, int]) -> Frame:
    root = Frame("all")
    for stack, n in folded.items():
        if n <= 0:
            continue
        root.value += n
        node = root
        for name in stack.split(";"):
            node = node.children.setdefault(name, Frame(name))
            node.value += n
    return root


def kind_of(name: str) -> str:
    for kind, rx, _hues in PALETTE:
        if rx.search(name):
            return kind
    return "other"


def colour_of(name: str) -> str:
    """A fill colour: the hue range says what the frame is, a hash of its name picks within it
    (the same function gets the same colour in every graph)."""
    hues = OTHER_HUES
    for _kind, rx, h in PALETTE:
        if rx.search(name):
            hues = h
            break
    digest = sum((i + 1) * ord(c) for i, c in enumerate(name[:64]))
    hue = hues[0] + digest % (hues[1] - hues[0] + 1)
    light = 55 + (digest // 7) % 15
    # As #rrggbb: every SVG renderer reads it (not all read hsl()).
    r, g, b = colorsys.hls_to_rgb(hue / 360, light / 100, 0.7)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _label(name: str, width_px: float, char_px: float) -> str:
    fits = int((width_px - 4) / char_px)
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[: fits - 2] + ".."


def render_svg(folded: dict[str, int], title: str, *, unit: str = "samples", width: int = 1200,
               frame_height: int = 16, min_fraction: float = 0.001, font_px: float = 11.0) -> str:
    """The flame graph of `folded` as an SVG document (a string); `unit` names what the weights
    count (perf's sample periods are ns of CPU for its cpu-clock event)."""
    root = build_tree(folded)
    if root.value == 0:
        raise ValueError("no samples to draw")
    pad, top = 10, 40
    plot_w = width - 2 * pad
    char_px = font_px * 0.6
    rects: list[tuple[int, float, float, Frame]] = []  # depth, x, width, frame
    max_depth = 0

    def place(node: Frame, depth: int, x: float) -> None:
        nonlocal max_depth
        w = plot_w * node.value / root.value
        rects.append((depth, x, w, node))
        max_depth = max(max_depth, depth)
        cx = x
        for name in sorted(node.children):
            child = node.children[name]
            if child.value / root.value >= min_fraction:
                place(child, depth + 1, cx)
            cx += plot_w * child.value / root.value

    place(root, 0, pad)
    height = top + (max_depth + 1) * frame_height + 2 * pad
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="{font_px:g}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fdfdf6"/>',
        f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="{font_px + 4:g}">'
        f"{escape(title)}</text>",
        f'<text x="{pad}" y="34" fill="#555">{root.value} {escape(unit)}; frames under '
        f"{100 * min_fraction:g} % left out; hover for a frame's share. Orange kernel, green "
        "crypto, blue chive, purple tokio, teal TLS, yellow the rest</text>",
    ]
    for depth, x, w, node in rects:
        y = height - pad - (depth + 1) * frame_height
        share = 100 * node.value / root.value
        tip = escape(f"{node.name} ({node.value} {unit}, {share:.2f} %)")
        fill = "#e0e0d8" if node is root else colour_of(node.name)
        out.append(f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{max(w - 0.5, 0.1):.2f}" '
                   f'height="{frame_height - 1}" fill="{fill}" rx="1"/>')
        label = _label(node.name, w, char_px)
        if label:
            out.append(f'<text x="{x + 2:.2f}" y="{y + frame_height - 4}">{escape(label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
