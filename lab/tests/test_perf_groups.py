"""lab/scripts/perf_groups.py on a synthetic `perf script` output with known groups."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "perf_groups.py"
spec = importlib.util.spec_from_file_location("perf_groups", SCRIPT)
pg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pg)

PERF_SCRIPT = """\
tokio-rt-worker 100     300
\tffffffff81 finish_task_switch.isra.0 ([kernel.kallsyms])
\tffffffff82 __x64_sys_futex ([kernel.kallsyms])
\t108f36 syscall (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t6863c1 parking_lot::condvar::Condvar::wait_until_internal (/x/chive)

tokio-rt-worker 100     100
\t1234 __memcpy_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t2345 alloc::vec::Vec<T>::extend_from_slice (inlined)
\t2345 chive_core::node::queue::CellQueue::push (/x/chive)
\t3456 tokio::runtime::task::harness::Harness<T,S>::poll (/x/chive)

tokio-rt-worker 101     100
\t1 ring_core_0_17_14__aes_gcm_dec_update_vaes_avx2 (/x/chive)
\t2 rustls::conn::ConnectionCommon<T>::process_new_packets (/x/chive)

tokio-rt-worker 101     200
\t1 core::sync::atomic::atomic_or (inlined)
\t1 tokio::sync::task::atomic_waker::AtomicWaker::wake (/x/chive)

tokio-rt-worker 101     200
\t1 core::intrinsics::likely (inlined)
\t2 <chive_core::sched::ewma::Ewma as chive_core::sched::CircuitScheduler>::cell_sent (/x/chive)
\t3 tokio::runtime::task::harness::Harness<T,S>::poll (/x/chive)

tokio-rt-worker 101     100
\tffffffff81 finish_task_switch.isra.0 ([kernel.kallsyms])
\tffffffff81 irqentry_exit_to_user_mode ([kernel.kallsyms])
"""


def test_groups_by_leaf_and_syscall(tmp_path, capsys):
    samples = list(pg.parse_perf_script(PERF_SCRIPT.splitlines(True)))
    assert [p for p, _f in samples] == [300, 100, 100, 200, 200, 100]
    total, groups, _leaves, folded, copiers = pg.summarize(samples)
    assert total == 1000
    assert groups["kernel: futex (thread park/wake)"] == 300
    assert groups["copies (memmove, kernel copy to/from sockets)"] == 100
    assert groups["crypto"] == 100
    # An inlined atomic is charged to tokio's waker, an inlined hint to chive's EWMA.
    assert groups["tokio runtime (task hops, wakers, channels, park)"] == 200
    assert groups["chive per-cell bookkeeping (core, cell, node, net)"] == 200
    assert groups["kernel: interrupts, scheduler (no system call)"] == 100
    assert copiers == {"chive_core::node::queue::CellQueue::push": 100}
    # Kernel frames carry flamegraph.pl's `_[k]` mark.
    assert folded["parking_lot::condvar::Condvar::wait_until_internal;syscall;__x64_sys_futex_[k];"
                  "finish_task_switch.isra.0_[k]"] == 300
    src = tmp_path / "perf.txt"
    src.write_text(PERF_SCRIPT)
    out = tmp_path / "folded"
    svg = tmp_path / "flame.svg"
    assert pg.main([str(src), "--markdown", "--folded", str(out), "--svg", str(svg)]) == 0
    assert "__x64_sys_futex_[k] (300 perf periods, 30.00 %)" in svg.read_text()
    text = capsys.readouterr().out
    assert "| kernel: futex (thread park/wake) | 30.0 |" in text
    assert len(out.read_text().splitlines()) == 6
    assert pg.main([str(tmp_path / "folded"), "--top", "3"]) == 1  # not perf output: no samples


def test_empty_input(tmp_path):
    p = tmp_path / "empty"
    p.write_text("")
    assert pg.main([str(p)]) == 1
    with pytest.raises(SystemExit):
        pg.main(["--top", "x"])
