"""The console's parts without a browser: in-process sign-ins (expiry, the per-team bound), the runs-per-minute
counts of the operator view, and what a run's page previews."""

from __future__ import annotations

import base64
import time

from orchestrator.console import MemoryConsoleSessions
from orchestrator.console.operator import per_minute
from orchestrator.console.runs import preview
from worker.contract import OutputFile, RunRequest, RunResult, SkillRef
from worker.run_store import RunRecord, RunStatus


async def test_in_process_sign_ins_expire_and_a_team_keeps_at_most_its_bound():
    sessions = MemoryConsoleSessions(ttl_seconds=600, per_team=2)
    a = [await sessions.open("team-a", "0123456789ab") for _ in range(3)]
    b, _ = await sessions.open("team-b", "ba9876543210")
    assert [await sessions.get(token) is not None for token, _ in a] == [False, True, True]
    assert (await sessions.get(b)).team_id == "team-b", "another team's sign-ins do not push this one out"
    await sessions.close(a[2][0])
    assert await sessions.get(a[2][0]) is None and await sessions.get(a[1][0]) is not None
    a[1][1].expires_at = time.time() - 1  # what the store holds
    assert await sessions.get(a[1][0]) is None, "an expired session opens nothing"
    assert await sessions.get("") is None and await sessions.get("x" * 10_000) is None


def _record(run_id: str, status: RunStatus, finished_at: float | None, exit_code: int = 0) -> RunRecord:
    request = RunRequest(skill=SkillRef(name="s", root="/tmp"), command="true")
    result = RunResult(exit_code=exit_code, run_id=run_id, workspace_id="w", runtime="local") if finished_at else None
    return RunRecord(id=run_id, request=request, status=status, finished_at=finished_at, result=result)


def test_runs_per_minute_count_ended_runs_failures_and_cancels_in_their_minute():
    now = 1_000_000_040.0  # 20 s into a minute
    records = [
        _record("a", RunStatus.FINISHED, now - 5), _record("b", RunStatus.FINISHED, now - 10, exit_code=3),
        _record("c", RunStatus.FAILED, now - 70), _record("d", RunStatus.CANCELLED, now - 75),
        _record("e", RunStatus.STARTED, None), _record("f", RunStatus.FINISHED, now - 3600),
    ]
    minutes = per_minute(records, now, minutes=2)
    assert [(m.ended, m.failed, m.cancelled) for m in minutes] == [(2, 1, 0), (2, 1, 1), (0, 0, 0)]
    assert minutes[0].start == now - 20 and minutes[1].start == now - 80


def test_only_passive_output_is_previewed():
    def file(name: str, mime: str, data: bytes, encoding: str = "utf-8") -> OutputFile:
        content = base64.b64encode(data).decode() if encoding == "base64" else data.decode()
        return OutputFile(name=name, content=content if encoding != "none" else "", mime_type=mime, size=len(data),
                          encoding=encoding)

    assert preview(file("out/a.txt", "text/plain", b"hello")) == ("text", "hello")
    assert preview(file("out/a.csv", "text/csv; charset=utf-8", b"a,b")) == ("text", "a,b")
    assert preview(file("out/a.png", "image/png", b"\x89PNG", "base64")) == ("image", "")
    for name, mime in [("out/a.html", "text/html"), ("out/a.svg", "image/svg+xml"), ("out/a.xml", "text/xml"),
                       ("out/a.xhtml", "application/xhtml+xml"), ("out/a.bin", "application/octet-stream")]:
        assert preview(file(name, mime, b"<script>alert(1)</script>")) == ("", ""), mime
    assert preview(file("out/big.txt", "text/plain", b"", "none")) == ("", "")
    assert len(preview(file("out/big.txt", "text/plain", b"x" * 200_000))[1]) == 64 * 1024
