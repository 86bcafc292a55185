"""The netns backend: namespaces, shaping, the delay line, `chive shape`, clean-up.

Root-only tests skip with the reason when not root or `ip netns` is missing;
tests needing the chive binary (`delayline`, `shape`) skip when the built
binary lacks those subcommands.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chive_lab import netns
from chive_lab.errors import LabError
from chive_lab.network import default_binary

NOT_AVAILABLE = netns.available()
needs_root = pytest.mark.skipif(NOT_AVAILABLE is not None, reason=f"netns: {NOT_AVAILABLE}")
LAB = Path(__file__).resolve().parents[1]


def _chive_with(*subcommands: str) -> Path | None:
    b = default_binary()
    if not b.is_file():
        return None
    try:
        out = subprocess.run([str(b), "--help"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return None
    return b if all(re.search(rf"^\s+{s}\b", out, re.M) for s in subcommands) else None


CHIVE = _chive_with("shape", "delayline")
needs_chive = pytest.mark.skipif(CHIVE is None, reason="target/release/chive (or $CHIVE_BIN) with "
                                 "`shape` and `delayline` is not built")


def _ours(tb: netns.Testbed) -> list[str]:
    return [n for n in netns.list_namespaces() if n.startswith(tb.run_id + "-")]


# ------------------------------------------------------------ no root needed
def test_parse_rate():
    assert netns.parse_rate("10mbit") == 10_000_000
    assert netns.parse_rate("10M") == 10_000_000
    assert netns.parse_rate("500kbit") == 500_000
    assert netns.parse_rate(2e6) == 2_000_000
    for bad in ("10mbps", "fast", "1bit", "10 MB"):
        with pytest.raises(LabError):
            netns.parse_rate(bad)


def test_specs_are_validated():
    with pytest.raises(LabError):
        netns.HostSpec("sw")
    with pytest.raises(LabError):
        netns.HostSpec("A;rm")
    with pytest.raises(LabError):
        netns.HostSpec("A", cc="cu bic")
    with pytest.raises(LabError):
        netns.LinkSpec("10mbit", loss=1.5)
    with pytest.raises(LabError):
        netns.LinkSpec("10mbit", queue_at="nic")
    assert netns.LinkSpec(delay_ms=1).needs_delay_line
    assert not netns.LinkSpec("10mbit").needs_delay_line
    with pytest.raises(LabError):
        netns.Testbed([netns.HostSpec("A"), netns.HostSpec("A")])
    with pytest.raises(LabError):
        netns.Testbed([netns.HostSpec("A")], subnet="8.8.8.0/24")  # only private ranges


def test_run_ids_are_unique_and_prefixed():
    a = netns.Testbed([netns.HostSpec("A")])
    b = netns.Testbed([netns.HostSpec("A")])
    assert a.run_id != b.run_id
    assert a.ns("A").startswith(netns.PREFIX) and a.ns("sw").endswith("-sw")


# ------------------------------------------------------------------- root
@needs_root
def test_create_and_clean_up_leaves_nothing(tmp_path):
    tb = netns.Testbed([netns.HostSpec("A", netns.LinkSpec("10mbit")),
                        netns.HostSpec("B", netns.LinkSpec("10mbit", queue_at="switch"))],
                       record_dir=tmp_path)
    with tb:
        assert sorted(_ours(tb)) == sorted([tb.ns("A"), tb.ns("B"), tb.ns("sw")])
        assert tb.record_path.is_file()
        r = tb.sh("A", ["ip", "-o", "addr", "show", "dev", "eth0"])
        assert tb.addr("A") in r.stdout
        assert "htb" in tb.qdisc_stats("A")  # host-side queue
        assert "htb" not in tb.qdisc_stats("B")  # switch-side queue: nothing on B's eth0
        assert "htb" in tb.qdisc_stats("sw", "vBd")
        sleeper = tb.popen("B", ["sleep", "300"])
    assert _ours(tb) == []
    assert not tb.record_path.exists()
    assert sleeper.poll() is not None  # processes inside were stopped


@needs_root
def test_clean_leftovers_removes_crashed_runs_only(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    name = f"{netns.PREFIX}{dead.pid}-1-X"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        (tmp_path / f"{netns.PREFIX}{dead.pid}-1.json").write_text(
            json.dumps({"owner_pid": dead.pid, "namespaces": [name]}))
        live = netns.Testbed([netns.HostSpec("A")], record_dir=tmp_path)
        with live:
            rep = netns.clean_leftovers(record_dir=tmp_path)
            assert name in rep.removed
            assert live.ns("A") in rep.kept_live and live.ns("A") in netns.list_namespaces()
        assert name not in netns.list_namespaces()
        assert list(tmp_path.glob("*.json")) == []
    finally:
        if name in netns.list_namespaces():
            subprocess.run(["ip", "netns", "delete", name])


def _bulk(tb: netns.Testbed, src: str, dst: str, seconds: float, tmp: Path) -> dict:
    t0 = time.time() + 0.5
    py = sys.executable
    lf, cf = tmp / "l.json", tmp / "c.json"
    lp = tb.popen(dst, [py, "-m", "chive_lab.tcpbulk", "listen", "--bind", f"{tb.addr(dst)}:5001",
                        "--t0", str(t0), "--stop-at", str(t0 + seconds), "--cc", "cubic", "--out", str(lf)],
                  stdout=subprocess.PIPE, text=True, cwd=LAB)
    assert lp.stdout.readline().strip() == "ready"
    cp = tb.popen(src, [py, "-m", "chive_lab.tcpbulk", "connect", "--to", f"{tb.addr(dst)}:5001",
                        "--t0", str(t0), "--start-at", str(t0), "--stop-at", str(t0 + seconds),
                        "--send", "--cc", "cubic", "--out", str(cf)], cwd=LAB)
    assert cp.wait(timeout=seconds + 30) == 0
    assert lp.wait(timeout=30) == 0
    return json.loads(lf.read_text())


@needs_root
def test_link_shaped_to_10mbit(tmp_path):
    hosts = [netns.HostSpec(n, netns.LinkSpec("10mbit")) for n in ("A", "B")]
    with netns.Testbed(hosts, record_dir=tmp_path) as tb:
        rec = _bulk(tb, "A", "B", 4.0, tmp_path)
    assert rec["cc"] == "cubic"
    full = [rec["rx"][str(s)] * 8 / 1e6 for s in (1, 2, 3)]  # whole seconds after slow start
    # Never above the shaper's rate in any second; near it in the median second. A second may
    # fall short when the machine is loaded (8.8 Mbit/s in one second at load 12, the sender
    # descheduled): the shaper's bound is what is tested, not the sender's scheduling.
    assert all(x <= 10.5 for x in full), full
    assert 9.0 <= sorted(full)[1] and min(full) >= 8.0, full


@needs_root
@needs_chive
def test_delay_line_adds_the_configured_delay(tmp_path):
    py = sys.executable

    def rtt(delay: float) -> float:
        hosts = [netns.HostSpec("A", netns.LinkSpec("100mbit", delay_ms=delay)),
                 netns.HostSpec("B", netns.LinkSpec("100mbit"))]
        with netns.Testbed(hosts, chive_bin=CHIVE, record_dir=tmp_path) as tb:
            echo = tb.popen("B", [py, "-m", "chive_lab.tcpbulk", "udpecho", "--bind", f"{tb.addr('B')}:7"],
                            stdout=subprocess.PIPE, text=True, cwd=LAB)
            assert echo.stdout.readline().strip() == "ready"
            out = tb.sh("A", [py, "-m", "chive_lab.tcpbulk", "udpping", "--to", f"{tb.addr('B')}:7",
                              "--count", "60"]).stdout
            rtts = json.loads(out)[10:]  # the first probes include ARP
            assert len(rtts) >= 45
            return sorted(rtts)[len(rtts) // 2]

    base, delayed = rtt(0), rtt(5.0)
    # 5 ms one way on A's link: +10 ms RTT (a probe crosses it twice), ±1 ms.
    assert abs((delayed - base) - 10.0) < 1.0, (base, delayed)


@needs_chive
def test_chive_shape_dry_run():
    out = subprocess.run([str(CHIVE), "shape", "--dev", "eth0", "--rate", "10mbit", "--dry-run"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "tc qdisc del dev eth0 root"
    assert "tc qdisc add dev eth0 root handle 1: htb default 20" in lines
    assert any("classid 1:1 htb rate 9500000bit ceil 9500000bit" in x for x in lines)
    assert any("classid 1:10 " in x and "prio 0" in x for x in lines)
    assert any("classid 1:20 htb rate 9000000bit ceil 9000000bit" in x for x in lines)
    assert any("u32 match ip protocol 6 0xff" in x and "0xffc0 at 2" in x and "flowid 1:10" in x
               for x in lines)
    bad = subprocess.run([str(CHIVE), "shape", "--dev", "eth0", "--rate", "10MBps", "--dry-run"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode != 0


@needs_root
@needs_chive
def test_ack_priority_classifies_pure_acks(tmp_path):
    hosts = [netns.HostSpec(n, netns.LinkSpec("10mbit")) for n in ("A", "B")]
    with netns.Testbed(hosts, chive_bin=CHIVE, record_dir=tmp_path) as tb:
        cmds = tb.set_ack_priority("B")
        assert any("flowid 1:10" in c for c in cmds)
        _bulk(tb, "A", "B", 2.0, tmp_path)  # B only sends pure ACKs
        stats = tb.sh("B", ["tc", "-s", "class", "show", "dev", "eth0"]).stdout
        sent = {m.group(1): int(m.group(2)) for m in
                re.finditer(r"class htb (1:\d+) .*?\n\s*Sent \d+ bytes (\d+) pkt", stats, re.S)}
        assert sent.get("1:10", 0) > 500, stats  # the ACKs went to the priority class
        assert sent.get("1:20", 0) < sent["1:10"] / 10, stats
        tb.set_ack_priority("B", on=False)
        assert "1:10" not in tb.sh("B", ["tc", "class", "show", "dev", "eth0"]).stdout


@needs_root
@needs_chive
def test_ack_priority_data_class_borrows_only_with_bulk_ceil(tmp_path):
    """`chive shape` caps what B sends at 90% of the link (the paper's setting); with
    ``bulk_ceil`` 0.95 the data class borrows the idle ACK-class rate up to the 95% root."""
    hosts = [netns.HostSpec(n, netns.LinkSpec("10mbit")) for n in ("A", "B")]
    with netns.Testbed(hosts, chive_bin=CHIVE, record_dir=tmp_path) as tb:
        tb.set_ack_priority("B")
        capped = _bulk(tb, "B", "A", 4.0, tmp_path)
        cmds = tb.set_ack_priority("B", bulk_ceil=0.95)
        assert any("classid 1:20 htb rate 9000000bit ceil 9500000bit" in c for c in cmds), cmds
        borrowing = _bulk(tb, "B", "A", 4.0, tmp_path)
    goodput = (1448 / 1514) * 10  # Mbit/s of payload per 10 Mbit/s on the wire
    cap = [capped["rx"][str(s)] * 8 / 1e6 for s in (1, 2, 3)]
    more = [borrowing["rx"][str(s)] * 8 / 1e6 for s in (1, 2, 3)]
    # 0.9 x 9.56 = 8.61 Mbit/s of payload at most; 0.95 x 9.56 = 9.08 with borrowing. The cap is
    # judged on the three seconds together: a receiver descheduled at a second's end reads the
    # backlog in the next one (8.77 in one second, 8.60 in the next, at load 10), which moves
    # bytes between seconds but not past the shaper.
    assert sum(cap) / len(cap) <= 0.915 * goodput, cap
    assert sorted(more)[1] >= 0.935 * goodput, (cap, more)
