"""The watch's overhead figure (benchmarks/watch.py, figure 6 of benchmarks/run.py) runs at a reduced size,
so it cannot rot: both users train with and without the watch, the same losses either way."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import watch as bench  # noqa: E402


def test_the_overhead_figure_runs(tmp_path):
    figures = bench.measure(steps=10, repeats=1, every=5, workdir=tmp_path)
    assert set(figures) == {"trainer", "loop"}
    for f in figures.values():
        assert f["same_losses"] and f["steps"] == 10 and f["every"] == 5
        assert f["plain_step_ms"] > 0 and 0 < f["share"] < 1 and f["ratio"] > 0
