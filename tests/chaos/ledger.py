"""Runs whose commands leave a trace, so a test can count how often each one really executed.

Each run has a named (kept) workspace of its own, and its command appends a line to ``$WORK_DIR/ledger`` there. The
workers of a test share one work root, so every attempt of a run, on whichever worker, appends to the same file: a
run that executed twice has two lines, whatever its record says. A *gated* command waits for a file ``go`` in its
workspace that the test writes when it wants the command to end, and prints what it holds.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.skills import create_default_skill_repository
from worker.contract import RunRequest

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
_skill = create_default_skill_repository(str(LIBRARY)).skill_ref("python-math")


def counted(tag: str, *, then: str = "") -> RunRequest:
    """A run in workspace ``tag`` printing ``tag`` and appending it to its ledger (then running ``then``)."""
    command = f"echo {tag} | tee -a $WORK_DIR/ledger{'; ' + then if then else ''}"
    return RunRequest(skill=_skill, command=command, workspace_id=tag, timeout=300)


def gated(tag: str, **fields) -> RunRequest:
    """A run in workspace ``tag`` that notes in its ledger that it began, waits for ``$WORK_DIR/go``, prints what
    that file holds (also into ``out/who.txt``) and notes that it ended."""
    command = ("echo began >> $WORK_DIR/ledger; while [ ! -e $WORK_DIR/go ]; do sleep 0.05; done; "
               "cat $WORK_DIR/go | tee $OUTPUT_DIR/who.txt; echo ended >> $WORK_DIR/ledger")
    return RunRequest(skill=_skill, command=command, workspace_id=tag, timeout=300, **fields)


def workspace(work_root: Path, tag: str) -> Path | None:
    """The folder of workspace ``tag`` its command runs in: the newest whose command began, else the newest. (A
    worker killed while it laid the workspace out leaves a folder the next attempt does not reuse.)"""
    found = sorted(work_root.glob(f"ws_{tag}_*"))
    began = [folder for folder in found if (folder / "work" / "ledger").exists()]
    return (began or found or [None])[-1]


def lines(work_root: Path, tag: str) -> list[str]:
    """The ledger lines of workspace ``tag`` under ``work_root``, from every folder it was laid out in (empty when
    the command never began)."""
    found = []
    for folder in sorted(work_root.glob(f"ws_{tag}_*")):
        try:
            found += (folder / "work" / "ledger").read_text().split()
        except FileNotFoundError:
            continue
    return found


def release(work_root: Path, tag: str, text: str) -> None:
    """Let a gated command of workspace ``tag`` under ``work_root`` end, printing ``text``."""
    go = workspace(work_root, tag) / "work" / "go"
    partial = go.with_name(".go")
    partial.write_text(text + "\n")
    partial.chmod(0o644)
    partial.rename(go)
