"""The file tools' fast path on the embedded default: ``Read`` and ``Write`` of a plain path in a kept workspace of
this process are served without a run (counted in the dispatcher's records), as the workspace's user, with the
team's secrets taken out of what is read; everything else — a link, a file the user does not own, a FIFO, another
team's workspace, a workspace being removed — goes through a run, which answers as it always has."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from orchestrator.context import InvocationContext
from orchestrator.dispatch import InlineDispatcher, WorkspaceConflictError
from orchestrator.sessions import Session
from orchestrator.skills import SkillToolSet, create_default_skill_repository
from orchestrator.skills.tools.skill_toolset import workspace_id_for
from orchestrator.tools import WorkspaceFileToolSet
from worker.contract import RunRequest, SkillRef
from worker.runtimes.host_files import WorkspaceFiles
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.secrets.store import FileSecretStore, SecretBox

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = "python-math"
SECRET = "tok-" + "s3cr3t" * 4


async def read_bytes(files, path: str, limit: int) -> bytes | None:
    """What the fast path reads of ``path``, byte for byte (decoded as Latin-1, which every byte string is)."""
    text = await files.read_text(path, limit, lambda data: data.decode("latin-1"))
    return None if text is None else text.encode("latin-1")


@pytest.fixture
async def stack(work_root):
    runtime = LocalWorkspaceRuntime(work_root / "direct")
    secrets = FileSecretStore(work_root.parent / "direct-secrets", SecretBox(Fernet.generate_key().decode()))
    secrets.set("alice", "API_TOKEN", SECRET)
    dispatcher = InlineDispatcher({"local": runtime}, secrets=secrets)
    skill_tools = SkillToolSet(create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime),
                               dispatcher=dispatcher)
    yield skill_tools, dispatcher, runtime
    await skill_tools.close()
    await dispatcher.close()


class Session_:
    """One session's file tools, and the runs its dispatcher has made."""

    def __init__(self, skill_tools: SkillToolSet, dispatcher: InlineDispatcher, user_id: str = "alice") -> None:
        self.ctx = InvocationContext(session=Session(app_name="app", user_id=user_id, id=uuid.uuid4().hex[:12]),
                                     agent=None)
        self.skill_tools, self.dispatcher = skill_tools, dispatcher
        self.workspace_id = workspace_id_for(user_id, self.ctx.session.id)

    async def __call__(self, name: str, **args) -> dict:
        tools = {t.name: t for t in await WorkspaceFileToolSet(self.skill_tools).get_tools()}
        return await tools[name].run_async(tool_context=self.ctx, args=args)

    async def run(self, command: str) -> dict:
        return await self.skill_tools.skill_run(skill=SKILL, command=command, tool_context=self.ctx)

    async def runs(self) -> int:
        return len(await self.dispatcher.list(limit=10_000))


async def started(stack) -> tuple[Session_, LocalWorkspaceRuntime]:
    """A session whose workspace a first Write made (a run: it did not exist)."""
    skill_tools, dispatcher, runtime = stack
    call = Session_(skill_tools, dispatcher)
    assert (await call("Write", path="work/data.txt", content="one\n"))["success"]
    return call, runtime


async def test_read_and_write_of_a_plain_path_make_no_run(stack):
    call, runtime = await started(stack)
    before = await call.runs()
    assert (await call("Write", path="work/data.txt", content="alpha\n"))["path"] == "work/data.txt"
    assert (await call("Write", path="work/data.txt", content="beta\n", append=True))["success"]
    assert (await call("Write", path="out/report.md", content="# r\n"))["success"]
    assert await call("Read", path="work/data.txt", start_line=2) == {
        "success": True, "content": "beta\n", "total_lines": 2, "read_range": "2-2"}
    assert await call.runs() == before
    seen = await call.run("cat $WORK_DIR/data.txt $OUTPUT_DIR/report.md && echo more >> $OUTPUT_DIR/report.md")
    assert seen["stdout"] == "alpha\nbeta\n# r\n" and seen["exit_code"] == 0  # its command may change it too
    workspace = runtime.workspaces.find_known(call.workspace_id)
    made = workspace.path / "out" / "report.md"
    owner = (os.geteuid(), os.getegid()) if workspace.uid is None else (workspace.uid, workspace.gid)
    assert (made.stat().st_uid, made.stat().st_gid) == owner


async def test_what_is_read_has_the_teams_secrets_taken_out(stack):
    call, _ = await started(stack)
    await call.run(f"printf 'token=%s\\n' {SECRET} > $WORK_DIR/leak.txt")
    before = await call.runs()
    read = await call("Read", path="work/leak.txt")
    assert read["success"] and SECRET not in read["content"] and read["content"].startswith("token=")
    assert await call.runs() == before


async def test_a_path_the_fast_path_declines_is_answered_by_a_run(stack):
    call, runtime = await started(stack)
    await call.run("ln -s data.txt $WORK_DIR/alias; ln -s /etc/hostname $WORK_DIR/h; mkfifo $WORK_DIR/pipe; "
                   "ln $WORK_DIR/data.txt $WORK_DIR/twin")
    workspace = runtime.workspaces.find_known(call.workspace_id)
    (workspace.path / "work" / "roots.txt").write_text("root's\n")  # a file the workspace's user does not own
    cases = [
        (("Read", {"path": "work/alias"}), lambda a: a["content"] == "one\n"),  # a link inside: a run follows it
        (("Read", {"path": "work/h"}), lambda a: "outside the workspace" in a["error"]),
        (("Write", {"path": "work/h", "content": "x"}), lambda a: "outside the workspace" in a["error"]),
        (("Read", {"path": "work/pipe"}), lambda a: a["success"] is False),
        (("Write", {"path": "work/new/deep.txt", "content": "d"}), lambda a: a["success"]),  # a run makes folders
        (("Write", {"path": "work/twin", "content": "both\n"}), lambda a: a["success"]),
        (("Read", {"path": "work/missing.txt"}), lambda a: "not found" in a["error"]),
    ]
    if workspace.uid is not None:
        cases.append((("Write", {"path": "work/roots.txt", "content": "x"}), lambda a: a["success"] is False))
    for (tool, args), holds in cases:
        before = await call.runs()
        answer = await call(tool, **args)
        assert holds(answer), (tool, args, answer)
        assert await call.runs() == before + 1, (tool, args)
    assert (workspace.path / "work" / "data.txt").read_text() == "both\n"  # the twin is the same file
    assert (workspace.path / "work" / "roots.txt").read_text() == "root's\n"
    assert Path("/etc/hostname").read_text() != "x"


async def test_another_teams_workspace_and_one_being_removed_are_not_reached(stack):
    call, _ = await started(stack)
    skill_tools, dispatcher, _ = stack
    request = RunRequest(skill=SkillRef(name="file-tools", root=str(LIBRARY / SKILL)), command=":",
                         workspace_id=call.workspace_id)
    async with dispatcher.workspace_files(request, owner="mallory") as files:
        assert files is None
    async with dispatcher.workspace_files(request, owner="alice") as files:
        assert files is not None
        with pytest.raises(WorkspaceConflictError):  # held as a run holds it
            await dispatcher.remove_workspace(call.workspace_id)
        assert await read_bytes(files, "work/data.txt", 100) == b"one\n"
    assert (await dispatcher.get_workspace(call.workspace_id)).runs == []
    assert await dispatcher.remove_workspace(call.workspace_id) == "removed"
    async with dispatcher.workspace_files(request, owner="alice") as files:
        assert files is None


async def test_a_cancelled_call_holds_the_workspace_until_its_thread_has_ended(stack, monkeypatch):
    call, _ = await started(stack)
    skill_tools, dispatcher, _ = stack
    entered, release = threading.Event(), threading.Event()
    real_write = WorkspaceFiles.write

    def slow_write(self, *args, **kwargs):
        entered.set()
        release.wait(30)
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(WorkspaceFiles, "write", slow_write)
    writing = asyncio.create_task(call("Write", path="work/data.txt", content="late\n"))
    assert await asyncio.to_thread(entered.wait, 30)
    writing.cancel()
    for _ in range(5):  # the cancelled call is still in the workspace while its thread writes
        await asyncio.sleep(0)
    assert not writing.done()
    with pytest.raises(WorkspaceConflictError):
        await dispatcher.remove_workspace(call.workspace_id)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await writing
    assert (await dispatcher.get_workspace(call.workspace_id)).runs == []
