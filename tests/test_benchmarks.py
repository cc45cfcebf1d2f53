"""The cheap benchmarks still run and print their ratios (a few runs each; the figures themselves are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("script", "ratio_rows", "extra"), [
    ("local_run.py", ["bare", "warm", "cold", "unboxed", "cold-unbox"], []),
    ("cube_run.py", ["local run", "bare sandbox command", "cube run", "cube run + outputs"], []),
    ("skill_envs.py", ["without", "imports", "warm", "by hand", "build", "again"], ["--builds", "1"]),
])
def test_a_benchmark_prints_a_ratio_for_each_series(script, ratio_rows, extra):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--runs", "5", *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0].strip(): line for line in done.stdout.splitlines()}
    for name in ratio_rows:
        assert name in rows, done.stdout
        numbers = [float(x.rstrip("x")) for x in rows[name][len(name):].split()]
        assert len(numbers) >= 3 and all(n > 0 for n in numbers), rows[name]
