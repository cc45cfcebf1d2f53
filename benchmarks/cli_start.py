"""How long the command line takes to start and to list a large library, as a user runs it (a new process each).

Printed, median milliseconds of ``--runs`` runs each, with the bare interpreter (``python -c pass``) as the
baseline and each figure's ratio to it:

* ``skillrun --help``
* ``skillrun skills list --json`` on a 2,000-skill library (``tests/synthetic_skills``): the first listing (every
  ``SKILL.md`` parsed, no summaries kept yet: each of its runs starts from an empty data folder), a later one (the
  summaries kept between runs), one with ``--search``

Bytecode is cached in a scratch folder, as for an installed package, even where the environment turns it off:
otherwise every process compiles the whole package and that is all one measures.

Usage: .venv/bin/python benchmarks/cli_start.py [--runs N] [--skills N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.figures import markdown_table, publish  # noqa: E402
from tests.synthetic_skills import write_library  # noqa: E402


def run_ms(args: list[str], env: dict[str, str], fresh_data: bool = False) -> float:
    if fresh_data:
        shutil.rmtree(env["SKILLRUN_DATA_DIR"], ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True, cwd=REPO)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    parser.add_argument("--skills", type=int, default=2000, help="library size (default 2000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "library"
        root.mkdir()
        write_library(root, args.skills)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(SKILLRUN_DATA_DIR=os.path.join(tmp, "data"), PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
        listing = ["-m", "orchestrator.cli", "skills", "list", "--json", "--skills-root", str(root)]
        commands = {
            "python -c pass": (["-c", "pass"], False),
            "skillrun --help": (["-m", "orchestrator.cli", "--help"], False),
            f"skills list, {args.skills:,} skills, first": (listing, True),
            f"skills list, {args.skills:,} skills, later": (listing, False),
            "skills list --search": ([*listing, "--search", "balance our invoices"], False),
        }
        for command, _ in commands.values():  # compiles the bytecode once, keeps the summaries for "later"
            run_ms(command, env)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved: a noisy spell slows them alike
            for name, (command, fresh) in commands.items():
                samples[name].append(run_ms(command, env, fresh))
                if fresh:
                    run_ms(command, env)  # the summaries back for the commands after it
    base = statistics.median(samples["python -c pass"])
    print(f"{'command':<36} {'median ms':>10} {'vs python':>10}")
    rows = []
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:<36} {median:>10.0f} {median / base:>9.1f}x")
        rows.append([name, f"{median:.0f}", f"{median / base:.1f}x"])
    publish("cli_start", "The command line's start",
            f"Medians of {args.runs} runs of each command, a new process each; the baseline is `python -c pass`.\n\n"
            + markdown_table(["command", "median ms", "vs python -c pass"], rows))


if __name__ == "__main__":
    main()
