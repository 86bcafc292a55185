"""chive_lab.flamegraph: folded stacks in, an SVG flame graph out, checked on stacks with known
shares."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from chive_lab import flamegraph as fg

NS = "{http://www.w3.org/2000/svg}"


def test_parse_folded_adds_repeated_stacks_and_names_a_bad_line():
    folded = fg.parse_folded(["a;b 3\n", "a;c 1\n", "\n", "a;b 2\n"])
    assert folded == {"a;b": 5, "a;c": 1}
    with pytest.raises(ValueError, match="line 2"):
        fg.parse_folded(["a;b 3", "a;b three"])
    with pytest.raises(ValueError, match="line 1"):
        fg.parse_folded(["12"])


def test_tree_counts_each_frame_with_everything_above_it():
    root = fg.build_tree({"main;run;work": 6, "main;run": 2, "main;idle": 2, "other": 0})
    assert root.value == 10
    main = root.children["main"]
    assert main.value == 10
    assert main.children["run"].value == 8
    assert main.children["run"].children["work"].value == 6
    assert "other" not in root.children  # no samples, nothing to draw


def _frames(svg: str) -> dict[str, tuple[float, float, float]]:
    """Frame name → (x, y, width) from the tooltips of a rendered graph."""
    out = {}
    for g in ET.fromstring(svg).iter(f"{NS}g"):
        title = g.find(f"{NS}title").text
        rect = g.find(f"{NS}rect")
        name = re.sub(r" \(\d+ samples, [0-9.]+ %\)$", "", title)
        out[name] = (float(rect.get("x")), float(rect.get("y")), float(rect.get("width")))
    return out


def test_widths_are_shares_and_children_stand_on_their_parent():
    folded = {"main;<chive_core::Node as Poll>::poll;aes_ctr": 60, "main;epoll_wait_[k]": 39,
              "main;tiny": 1}
    svg = fg.render_svg(folded, "a & b", width=1020, min_fraction=0.02)
    frames = _frames(svg)  # parses: the generic's angle brackets and the & are escaped
    plot = 1020 - 2 * 10
    assert frames["all"][2] == pytest.approx(plot - 0.5)
    assert frames["<chive_core::Node as Poll>::poll"][2] == pytest.approx(0.6 * plot - 0.5)
    assert frames["epoll_wait_[k]"][2] == pytest.approx(0.39 * plot - 0.5)
    # 1 % is under min_fraction: left out, but its sample still counts in main's width.
    assert "tiny" not in frames
    assert frames["main"][2] == pytest.approx(plot - 0.5)
    # The root at the bottom, each child one row up, children in name order from the left.
    assert frames["main"][1] < frames["all"][1]
    assert frames["aes_ctr"][1] < frames["<chive_core::Node as Poll>::poll"][1]
    assert frames["<chive_core::Node as Poll>::poll"][0] < frames["epoll_wait_[k]"][0]
    assert "a &amp; b" in svg


def test_colours_say_what_a_frame_is():
    assert fg.kind_of("finish_task_switch_[k]") == "kernel"
    assert fg.kind_of("chive_aes_ctr::vaes::apply") == "crypto"
    assert fg.kind_of("chive_core::node::Node::relay_in") == "chive"
    assert fg.kind_of("tokio::runtime::park") == "tokio"
    assert fg.kind_of("__libc_recv") == "other"
    assert fg.colour_of("x") == fg.colour_of("x")


def test_nothing_to_draw_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        fg.render_svg({}, "empty")
