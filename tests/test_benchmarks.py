"""The cheap benchmarks still run and print their ratios (a few runs each; the figures themselves are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT
from tests.integration.conftest import docker_engine  # noqa: F401 - the engine the Docker benchmark needs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("script", "ratio_rows", "extra"), [
    ("local_run.py", ["bare", "ready bash", "warm", "warm/ready", "cold",
                      *(["unboxed", "cold-unbox"] if IS_ROOT else [])], []),  # runs without the sandbox: root's
    pytest.param("docker_run.py", ["local (warm)", "bare docker exec/runc", "warm run/runc", "docker run/runc",
                                   "first run/runc", "first run, pool/runc"], ["--cold-runs", "2", "--no-gvisor"],
                 marks=pytest.mark.docker),
    ("cube_run.py", ["local run", "bare sandbox command", "cube run", "cube run + outputs"], []),
    ("skill_envs.py", ["without", "imports", "warm", "by hand", "build", "again", "node warm", "node build"],
     ["--builds", "1"]),
    ("blob_store.py", ["filesystem 1MiB", "s3 1MiB"], ["--sizes", "1"]),
    ("mcp_roundtrip.py", ["direct", "mcp stdio", "mcp http"], []),
    ("file_tools.py", ["Read host", "Read workspace (local)", "Write host", "Write workspace (local)", "Bash host",
                       "Bash workspace (local)"], []),
    ("fairness.py", ["B alone", "B, A floods"], ["--flood", "10"]),
    pytest.param("system_roots.py", ["by hand", "build", "again", "host warm", "root warm"], [],
                 marks=pytest.mark.root),
    pytest.param("egress.py", ["host https", "run https (local)", "no redaction", "redaction"],
                 ["--requests", "5", "--megabytes", "1"], marks=pytest.mark.root),
])
def test_a_benchmark_prints_a_ratio_for_each_series(script, ratio_rows, extra, request):
    if script == "docker_run.py":
        request.getfixturevalue("docker_engine")  # a running engine and the sandbox image
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--runs", "5", *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0].strip(): line for line in done.stdout.splitlines()}
    for name in ratio_rows:
        assert name in rows, done.stdout
        numbers = [float(x.rstrip("x")) for x in rows[name][len(name):].split()]
        # median, p95 and the ratio are positive; a difference printed after them ("added ms") may not be
        assert len(numbers) >= 3 and all(n > 0 for n in numbers[:3]), rows[name]


@pytest.mark.parametrize(("script", "args", "rows"), [
    ("agent_loop.py", ["--rounds", "3", "--repeats", "1", "--sizes", "1,30"],
     ["1 default", "1 cached", "30 default", "30 cached"]),
    ("cli_start.py", ["--runs", "1", "--skills", "30"],
     ["python -c pass", "skillrun --help", "skills list, 30 skills, first", "skills list, 30 skills, later"]),
])
def test_the_start_and_scale_benchmarks_print_a_ratio_for_each_row(script, args, rows):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = {" ".join(line.split()[:-2] if script == "cli_start.py" else line.split()[:2]): line.split()
               for line in done.stdout.splitlines()}
    for row in rows:
        assert row in printed, done.stdout
        numbers = [float(x.rstrip("x")) for x in printed[row][-2 if script == "cli_start.py" else 2:]]
        assert numbers and all(n > 0 for n in numbers), printed[row]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_soak_prints_its_rows_growth_and_targets():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--runs", "200", "--every", "50",
                           "--result-ttl", "2", "--settle", "0"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:5] == ["runs", "runs/s", "p50", "ms", "p95"], done.stdout
    assert [line.split()[0] for line in lines[2:6]] == ["50", "100", "150", "200"], done.stdout
    growth = {line.split()[0] + (" " + line.split()[1] if line.split()[0] in ("redis", "user", "rss") else "")
              for line in lines if line.endswith(("PASS", "FAIL")) and not line.startswith(("PASS", "FAIL"))}
    assert {"redis memory", "redis keys", "folders", "user ids", "rss api", "rss worker1"} <= growth, done.stdout
    verdicts = [line.split("  ")[1] for line in lines if line.startswith(("PASS  ", "FAIL  "))]
    assert [v.split()[0] for v in verdicts] == ["failed", "lost", "doubled", "p99", "all"], done.stdout


@pytest.mark.timeout(300)
def test_the_throughput_benchmark_prints_both_series_and_where_a_runs_cpu_goes():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "api_throughput.py"), "--runs", "40",
                           "--baseline-runs", "5", "--repeats", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {cells[0]: cells[1:] for line in done.stdout.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    for series in ("runtime alone", "through the API"):
        assert series in rows and all(float(n.rstrip("x")) > 0 for n in rows[series]), done.stdout
    for part in ("the API", "the workers (own)", "their sandboxes (children)", "Redis", "the client (this process)"):
        assert part in rows and float(rows[part][0]) > 0, done.stdout
    assert "target: 150 runs/s" in done.stdout
