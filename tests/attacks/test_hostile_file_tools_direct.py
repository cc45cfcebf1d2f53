"""Attacks on the file tools' fast path (``Read`` and ``Write`` served by the dispatcher with no run,
``worker.runtimes.host_files``), as a hostile skill and a hostile model would make them, for real: the embedded
default (an ``InlineDispatcher`` over the local runtime, as root when the suite is: per-workspace users, bubblewrap)
with the team's secrets set up, the commands of the workspace run through ``skill_run`` and the tools' arguments
chosen by the attacker. Each test names what it defends: nothing outside the workspace read or written (links,
races, odd paths), nothing the workspace's user could not do itself done for it as root (root's files, reserved
blocks, folders it does not own), no hang (FIFOs, huge and growing files), the secrets taken out as a run's output
has them, other teams' and removed workspaces out of reach, and the same files seen by a container's next run.

"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import stat
import subprocess
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
from tests.conftest import IS_ROOT
from tests.services import unavailable
from worker.contract import RunRequest, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.secrets.store import FileSecretStore, SecretBox

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = "python-math"
SECRET = "tok-" + "s3cr3t" * 4
WIDE_SECRET = "密钥-" + "Zq7vX9wK" * 3
"""A secret that is not ASCII (a team may set one): its GB18030 bytes are not its UTF-8 bytes."""
CANARY = "canary: the host's own file\n"
HANG_GUARD = 120.0
"""Seconds a call may take before the test says it hung (a guard against hangs, not a measure)."""
RACE_CALLS = 3000
"""Fast-path calls made while a command of the workspace swaps a folder for a link under them."""


async def read_bytes(files, path: str, limit: int) -> bytes | None:
    """What the fast path reads of ``path``, byte for byte (decoded as Latin-1, which every byte string is)."""
    text = await files.read_text(path, limit, lambda data: data.decode("latin-1"))
    return None if text is None else text.encode("latin-1")


@pytest.fixture
def outside(shared_dir: Path) -> Path:
    """A folder of the host outside the work root, root's, with a canary file: nothing here may change."""
    folder = shared_dir / "outside"
    folder.mkdir(mode=0o755)
    (folder / "canary.txt").write_text(CANARY)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``folder``: its bytes, owner and mode (links as their target)."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        body = os.readlink(path).encode() if path.is_symlink() else path.read_bytes() if path.is_file() else b""
        seen[str(path.relative_to(folder))] = (body, info.st_uid, info.st_mode)
    return seen


def make_stack(work_root: Path, secrets_dir: Path, runtime=None, runtime_name: str = "local"):
    runtime = runtime or LocalWorkspaceRuntime(work_root)
    secrets = FileSecretStore(secrets_dir, SecretBox(Fernet.generate_key().decode()))
    secrets.set("alice", "API_TOKEN", SECRET)
    secrets.set("alice", "WIDE_TOKEN", WIDE_SECRET)
    dispatcher = InlineDispatcher({runtime_name: runtime}, secrets=secrets)
    kwargs = {} if runtime_name == "local" else {"run_tool_kwargs": {"runtime": runtime_name}}
    skill_tools = SkillToolSet(create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime),
                               dispatcher=dispatcher, **kwargs)
    return skill_tools, dispatcher, runtime


@pytest.fixture
async def stack(work_root):
    built = make_stack(work_root / "direct", work_root.parent / "direct-secrets")
    yield built
    await built[0].close()
    await built[1].close()


class Caller:
    """One session's file tools and skill runs, and the runs its dispatcher has made."""

    def __init__(self, stack, user_id: str = "alice", session_id: str | None = None) -> None:
        self.skill_tools, self.dispatcher, self.runtime = stack
        self.user_id = user_id
        self.ctx = InvocationContext(session=Session(app_name="app", user_id=user_id,
                                                     id=session_id or uuid.uuid4().hex[:12]), agent=None)
        self.workspace_id = workspace_id_for(user_id, self.ctx.session.id)

    async def __call__(self, name: str, **args) -> dict:
        tools = {t.name: t for t in await WorkspaceFileToolSet(self.skill_tools).get_tools()}
        return await asyncio.wait_for(tools[name].run_async(tool_context=self.ctx, args=args), HANG_GUARD)

    async def run(self, command: str, timeout: float = 60) -> dict:
        return await self.skill_tools.skill_run(skill=SKILL, command=command, timeout=timeout, tool_context=self.ctx)

    async def runs(self) -> int:
        return len(await self.dispatcher.list(limit=100_000))

    @property
    def workspace(self):
        return self.runtime.workspaces.find_known(self.workspace_id)

    def request(self) -> RunRequest:
        return RunRequest(skill=SkillRef(name="file-tools", root=str(LIBRARY / SKILL)), command=":",
                          workspace_id=self.workspace_id, runtime=self.dispatcher_runtime)

    @property
    def dispatcher_runtime(self) -> str:
        return self.skill_tools.run_tool_kwargs.get("runtime", "local")

    @contextlib.asynccontextmanager
    async def files(self):
        """The fast path's files, as the tools get them (``None``: declined)."""
        async with self.dispatcher.workspace_files(self.request(), owner=self.user_id) as files:
            yield files


async def started(stack, **kwargs) -> Caller:
    call = Caller(stack, **kwargs)
    assert (await call("Write", path="work/data.txt", content="one\n"))["success"]
    return call


@contextlib.contextmanager
def run_path_only(dispatcher):
    """The dispatcher as it was before the fast path: every Read and Write a run (to compare with)."""

    @contextlib.asynccontextmanager
    async def none(request, owner=None):
        yield None

    dispatcher.workspace_files = none
    try:
        yield
    finally:
        del dispatcher.workspace_files


def needs_isolated_users(call: Caller) -> None:
    if call.workspace.uid is None:
        unavailable("needs root: the fast path acts as root only where workspaces have users of their own")


# --- Paths: nothing outside the workspace, whatever the path's shape -------------------------------------------------

ODD_PATHS = [
    "../outside/canary.txt", "work/../../outside/canary.txt", "work/" + "../" * 40 + "etc/hostname",
    "{outside}/canary.txt", "//{outside}/canary.txt", "./../outside/canary.txt", "..", ".", "", "/",
    "work/\udcff\udcfe", "work/\u2025/canary.txt",
    "work/\uff0e\uff0e/\uff0e\uff0e/outside/canary.txt", "work/\u202e", "work/data.txt/", "work//data.txt",
    "work/./data.txt", "work/" + "a" * 300, "work/" + "d/" * 2000 + "deep.txt", "work/" + "x" * 5000,
    "out/" + "../" * 2 + "outside/canary.txt", "work/..\\..\\outside\\canary.txt", "work/%2e%2e/%2e%2e/outside",
]


async def test_odd_paths_neither_read_nor_write_outside_the_workspace(stack, outside):
    call = await started(stack)
    before = snapshot(outside.parent / "outside")
    around = sorted(p.name for p in outside.parent.iterdir())
    for shape in ODD_PATHS:
        path = shape.format(outside=outside.parent / "outside") if "{outside}" in shape else shape
        read = await call("Read", path=path)
        assert isinstance(read, dict) and "canary" not in str(read.get("content", "")), (path, read)
        written = await call("Write", path=path, content="PWNED\n")
        assert isinstance(written, dict), (path, written)
        if written.get("success"):  # only ever inside the workspace
            assert (call.workspace.path / written["path"]).resolve().is_relative_to(call.workspace.path), written
    assert snapshot(outside) == before
    assert sorted(p.name for p in outside.parent.iterdir()) == around
    assert Path("/etc/hostname").read_text() != "PWNED\n"


@pytest.mark.parametrize(("tool", "path"), [
    ("Read", "work/a\0b"), ("Write", "work/a\0b"), ("Read", "work/\ud800x"), ("Write", "work/\ud800x"),
])
async def test_a_nul_or_unencodable_path_is_a_failure_not_an_exception(stack, outside, tool, path):
    """A NUL or a lone surrogate in the model's path: the tool answers a failure (nothing raised, nothing touched)."""
    call = await started(stack)
    before = snapshot(outside)
    answer = await call(tool, path=path, **({"content": "PWNED\n"} if tool == "Write" else {}))
    assert answer["success"] is False, answer
    assert snapshot(outside) == before


async def test_planted_links_are_never_followed_out(stack, outside):
    call = await started(stack)
    target = outside / "canary.txt"
    done = await call.run(
        f"cd $WORK_DIR && ln -s {outside} dirlink && ln -s {target} filelink && ln -s / rootlink && "
        f"mkdir sub && ln -s ../../.. sub/up && ln -s {outside} $OUTPUT_DIR/o; "
        f"ln -s {outside} $WORKSPACE_DIR/planted 2>/dev/null; ln -s {outside} $WORKSPACE_DIR/work/inputs/in; true")
    assert done["exit_code"] == 0, done
    assert not os.path.lexists(call.workspace.path / "planted") or call.workspace.uid is None
    before = snapshot(outside)
    for path in ("work/dirlink/canary.txt", "work/filelink", "work/rootlink" + str(target),
                 "work/sub/up/outside/canary.txt",
                 "out/o/canary.txt", "planted/canary.txt", "work/inputs/in/canary.txt", "work/dirlink/new.txt"):
        read = await call("Read", path=path)
        assert "canary" not in str(read.get("content", "")), (path, read)
        written = await call("Write", path=path, content="PWNED\n")
        assert written["success"] is False, (path, written)
    assert snapshot(outside) == before


# --- Races: a command of the workspace swapping what the fast path walks ----------------------------------------------

SWAPPER = """cd $WORK_DIR && mkdir -p real && printf 'mine\\n' > real/canary.txt && printf 'mine\\n' > leaf
: > started
n=0
while [ ! -e stop ]; do
  mv real aside && ln -s {outside} real && rm real && mv aside real
  mv real aside && ln -s ../../skills real && rm real && mv aside real
  mv leaf leaf.aside && ln -s {outside}/canary.txt leaf && rm leaf && mv leaf.aside leaf
  n=$((n+1))
done
echo "swaps=$n"
"""


async def test_a_folder_swapped_for_a_link_in_a_tight_loop_never_lets_a_call_out(stack, outside):
    """A background command renames a folder of the path aside and puts a link (out of the workspace, or to root's
    ``skills``) in its place, over and over, while the fast path reads and writes through it thousands of times."""
    call = await started(stack)
    swapper = asyncio.create_task(call.run(SWAPPER.format(outside=outside), timeout=300))
    work = call.workspace.path / "work"
    for _ in range(int(HANG_GUARD * 20)):
        if (work / "started").exists() or swapper.done():
            break
        await asyncio.sleep(0.05)
    assert (work / "started").exists(), await swapper
    before, skills = snapshot(outside), snapshot(call.workspace.path / "skills")
    served = declined = 0
    try:
        for i in range(RACE_CALLS):
            async with call.files() as files:
                assert files is not None
                for path in ("work/real/canary.txt", "work/leaf"):
                    data = await read_bytes(files, path, 1 << 20)
                    assert data in (None, b"mine\n"), (i, path, data)
                    wrote = await files.write(path, b"mine\n")
                    served += wrote
                    declined += not wrote
                assert not await files.write("work/real/python-math/SKILL.md", b"PWNED\n")
            if i % 300 == 0:  # the tools themselves too (a declined call is a run, which answers as it always has)
                read = await call("Read", path="work/real/canary.txt")
                assert "canary" not in str(read.get("content", "")), read
                await call("Write", path="work/leaf", content="mine\n")
    finally:
        (work / "stop").touch()
        result = await asyncio.wait_for(swapper, HANG_GUARD)
    assert result["exit_code"] == 0 and "swaps=" in result["stdout"], result
    assert int(result["stdout"].split("swaps=")[1]) > 0
    assert served > 0 and served + declined == 2 * RACE_CALLS
    assert snapshot(outside) == before
    assert snapshot(call.workspace.path / "skills") == skills


# --- Privilege: nothing the workspace's user could not do, done as root ----------------------------------------------

async def test_roots_files_and_folders_in_the_workspace_are_not_written(stack):
    call = await started(stack)
    needs_isolated_users(call)
    root = call.workspace.path
    (root / "work" / "rootdir").mkdir()
    (root / "work" / "rootfile").write_text("root's\n")
    done = await call.run("cd $WORK_DIR && ln -s ../metadata.json meta && ln -s ../skills sk && ln -s ../runs rn && "
                          "mv rootfile moved && ln moved hard 2>/dev/null; chmod 0 rootdir 2>/dev/null; true")
    assert done["exit_code"] == 0, done
    skills = snapshot(root / "skills")
    metadata = (root / "metadata.json").read_bytes()
    top = sorted(p.name for p in root.iterdir())
    for path in ("metadata.json", "skills/python-math/SKILL.md", "runs/new.txt", "new-at-the-root.txt", "work",
                 "work/meta", "work/sk/python-math/SKILL.md", "work/rn/x", "work/moved", "work/rootdir/x",
                 "work/inputs", ".skillrun", ".next/x"):
        for append in (False, True):
            answer = await call("Write", path=path, content="PWNED\n", append=append)
            assert answer["success"] is False, (path, answer)
    assert (root / "metadata.json").read_bytes() == metadata
    assert snapshot(root / "skills") == skills
    assert not [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and b"PWNED" in p.read_bytes()]
    assert sorted(p.name for p in root.iterdir()) == top
    assert (root / "work" / "moved").read_text() == "root's\n"
    assert list((root / "work" / "rootdir").iterdir()) == []


async def test_what_the_fast_path_makes_is_the_workspace_users_and_no_more(stack):
    call = await started(stack)
    needs_isolated_users(call)
    ws = call.workspace
    before = await call.runs()
    assert (await call("Write", path="out/new.txt", content="n\n"))["success"]
    assert await call.runs() == before
    made = (ws.path / "out" / "new.txt").stat()
    assert (made.st_uid, made.st_gid) == (ws.uid, ws.gid)
    assert stat.S_IMODE(made.st_mode) & 0o7000 == 0
    # and the user may remove it, so it is truly theirs
    done = await call.run("rm $OUTPUT_DIR/new.txt && echo gone")
    assert done["stdout"].strip() == "gone", done


async def test_a_setuid_file_written_keeps_no_bit_a_write_of_its_user_would_clear(stack):
    """A write by the workspace's user clears a file's set-user-id and set-group-id bits (the kernel does, for a
    writer without CAP_FSETID); a write as root keeps them. What the tool writes must end as a run's write would."""
    call = await started(stack)
    needs_isolated_users(call)
    done = await call.run("cd $WORK_DIR && printf '#!/bin/sh\\n' > suid && chmod 6755 suid && printf x > viarun && "
                          "chmod 6755 viarun && printf y >> viarun && stat -c %a suid viarun")
    assert done["stdout"].split() == ["6755", "755"], done  # the user's own write cleared them
    assert (await call("Write", path="work/suid", content="#!/bin/sh\nid\n"))["success"]
    info = (call.workspace.path / "work" / "suid").stat()
    assert info.st_uid == call.workspace.uid
    assert stat.S_IMODE(info.st_mode) == 0o755, oct(info.st_mode)


@pytest.fixture
def small_disk(shared_dir: Path) -> Path:
    """A 48 MB ext4 file system with a quarter of its blocks reserved for root (as a host's disk has 5%), mounted
    under the shared folder (its fixture unmounts it)."""
    if not IS_ROOT:
        unavailable("needs root to mount a file system")
    image, mount = shared_dir / "disk.img", shared_dir / "disk"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(48 * 1024 * 1024)
    for argv in (["mkfs.ext4", "-q", "-F", "-m", "25", "-O", "^has_journal", str(image)],
                 ["mount", "-o", "loop", str(image), str(mount)]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            unavailable(f"cannot make a small disk: {argv[0]} said {done.stderr.strip()}")
    mount.chmod(0o755)
    return mount


async def test_a_full_disk_is_full_for_the_fast_path_too(small_disk, work_root):
    skill_tools, dispatcher, runtime = built = make_stack(small_disk / "work", work_root.parent / "disk-secrets")
    try:
        call = await started(built)
        needs_isolated_users(call)
        done = await call.run("dd if=/dev/zero of=$WORK_DIR/fill bs=64k 2>&1; dd if=/dev/zero of=$WORK_DIR/fill2 "
                              "bs=4k 2>&1; dd if=/dev/zero of=$WORK_DIR/fill3 bs=1k 2>&1; sync; df -k $WORK_DIR")
        assert "No space left" in done["stdout"], done  # the user's share is full (root's reserve is not)
        chunk = "z" * (1024 * 1024)
        with run_path_only(dispatcher):
            assert (await call("Write", path="work/by-run.txt", content=chunk))["success"] is False
        answer = await call("Write", path="work/by-fast-path.txt", content=chunk)
        written = call.workspace.path / "work" / "by-fast-path.txt"
        assert answer["success"] is False and (not written.exists() or written.stat().st_size < len(chunk)), answer
    finally:
        await skill_tools.close()
        await dispatcher.close()


async def test_a_workspace_disk_bounds_repeated_large_writes(work_root):
    """10 MB Writes, appended again and again, stop at the workspace's own disk: nothing of the host's fills."""
    if not IS_ROOT:
        unavailable("needs root for workspace disks")
    runtime = LocalWorkspaceRuntime(work_root / "disked", disk_bytes=16 * 1024 * 1024)
    skill_tools, dispatcher, _ = built = make_stack(work_root / "disked", work_root.parent / "d-secrets", runtime)
    try:
        call = await started(built)
        big = "b" * (10 * 1024 * 1024)
        answers = [await call("Write", path="work/big.txt", content=big, append=True) for _ in range(4)]
        assert answers[0]["success"] and not all(a["success"] for a in answers), answers
        assert (call.workspace.path / "work" / "big.txt").stat().st_size <= 16 * 1024 * 1024
        over = await call("Write", path="work/over.txt", content=big + "b")
        assert over["success"] is False and "10485760" in over["error"], over
        assert (await call("Write", path="work/big.txt", content="small\n"))["success"]  # still usable
        assert (await call("Read", path="work/big.txt"))["content"] == "small\n"
    finally:
        await skill_tools.close()
        await dispatcher.close()


async def test_a_write_is_held_to_the_runs_file_size_limit(work_root):
    skill_tools, dispatcher, runtime = built = make_stack(work_root / "fsize", work_root.parent / "f-secrets")
    skill_tools.run_tool_kwargs["limits"] = {"file_size_bytes": 1024 * 1024}
    try:
        call = await started(built)
        two = "f" * (2 * 1024 * 1024)
        with run_path_only(dispatcher):
            by_run = await call("Write", path="work/by-run.txt", content=two)
        assert by_run["success"] is False and "File size limit" in by_run["error"], by_run
        assert (call.workspace.path / "work" / "by-run.txt").stat().st_size <= 1024 * 1024
        answers = [await call("Write", path="work/by-fast-path.txt", content=two[:600_000], append=True)
                   for _ in range(3)]
        size = (call.workspace.path / "work" / "by-fast-path.txt").stat().st_size
        assert size <= 1024 * 1024 and not all(a["success"] for a in answers), (size, answers)
    finally:
        await skill_tools.close()
        await dispatcher.close()


# --- Hangs: FIFOs, huge and growing files -------------------------------------------------------------------------

async def test_fifos_with_and_without_a_peer_never_hang_a_call(stack):
    call = await started(stack)
    done = await call.run("cd $WORK_DIR && mkfifo lonely peered swapped && printf x > regular")
    assert done["exit_code"] == 0, done
    # a command holds the other ends open, so the fast path's non-blocking open of "peered" succeeds
    peer = asyncio.create_task(call.run(
        "cd $WORK_DIR && (cat peered > /dev/null &) ; (sleep 30 > peered &); : > ready; "
        "while [ ! -e stop ]; do mv swapped s.aside; mv regular swapped; mv swapped regular; mv s.aside swapped; "
        "done", timeout=120))
    work = call.workspace.path / "work"
    for _ in range(int(HANG_GUARD * 20)):
        if (work / "ready").exists() or peer.done():
            break
        await asyncio.sleep(0.05)
    try:
        async with call.files() as files:
            for path in ("work/lonely", "work/peered"):
                assert await asyncio.wait_for(read_bytes(files, path, 1024), HANG_GUARD) is None
                assert await asyncio.wait_for(files.write(path, b"x"), HANG_GUARD) is False
            for _ in range(500):
                data = await asyncio.wait_for(read_bytes(files, "work/swapped", 1024), HANG_GUARD)
                assert data in (None, b"x")
                await asyncio.wait_for(files.write("work/swapped", b"x"), HANG_GUARD)
        for path in ("work/peered", "work/lonely"):
            assert (await call("Read", path=path))["success"] is False
    finally:
        (work / "stop").touch()
        await asyncio.wait_for(peer, HANG_GUARD)
    assert stat.S_ISFIFO((work / "lonely").lstat().st_mode) and stat.S_ISFIFO((work / "peered").lstat().st_mode)


async def test_huge_sparse_and_growing_files_are_read_within_the_cap(stack):
    call = await started(stack)
    done = await call.run("cd $WORK_DIR && truncate -s 900M sparse && truncate -s 10485761 justover && "
                          "head -c 10485760 /dev/zero | tr '\\0' a > atcap")
    assert done["exit_code"] == 0, done
    for path in ("work/sparse", "work/justover"):
        answer = await call("Read", path=path)
        assert answer["success"] is False and "10" in answer["error"], answer
    async with call.files() as files:
        assert await read_bytes(files, "work/sparse", 10 * 1024 * 1024) is None
        assert len(await read_bytes(files, "work/atcap", 10 * 1024 * 1024)) == 10 * 1024 * 1024
        assert await read_bytes(files, "work/atcap", 10 * 1024 * 1024 - 1) is None
    grower = asyncio.create_task(call.run(
        "cd $WORK_DIR && : > grow && : > ready; while [ ! -e stop ]; do printf 0123456789 >> grow; "
        "[ $(stat -c %s grow) -gt 100000 ] && : > grow; done", timeout=120))
    work = call.workspace.path / "work"
    for _ in range(int(HANG_GUARD * 20)):
        if (work / "ready").exists() or grower.done():
            break
        await asyncio.sleep(0.05)
    try:
        async with call.files() as files:
            for _ in range(2000):
                data = await read_bytes(files, "work/grow", 4096)
                assert data is None or len(data) <= 4096
    finally:
        (work / "stop").touch()
        await asyncio.wait_for(grower, HANG_GUARD)


# --- Redaction: what is read has the team's secrets out, as a run's output has ---------------------------------------

LEAKS = {
    "plain.txt": f"token={SECRET}\n".encode(),
    "bom.txt": b"\xef\xbb\xbf" + f"{SECRET}\n".encode(),
    "crlf-b64.txt": base64.encodebytes(f"x{SECRET}y".encode()).replace(b"\n", b"\r\n"),
    "hex.txt": SECRET.encode().hex().encode() + b"\n",
    "wide-utf8.txt": f"wide={WIDE_SECRET}\n".encode(),
    "wide-json.txt": (json.dumps({"token": WIDE_SECRET}) + "\n").encode(),
    "wide-gb18030.txt": f"wide={WIDE_SECRET}\n".encode("gb18030"),
}


async def test_a_secret_in_a_file_is_taken_out_whatever_its_encoding(stack):
    call = await started(stack)
    ws = call.workspace
    for name, body in LEAKS.items():
        (ws.path / "work" / name).write_bytes(body)
        if ws.uid is not None:
            os.chown(ws.path / "work" / name, ws.uid, ws.gid)
    fast, run = {}, {}
    before = await call.runs()
    for name in LEAKS:
        fast[name] = await call("Read", path=f"work/{name}")
    assert await call.runs() == before  # every one of them served without a run
    with run_path_only(call.dispatcher):
        for name in LEAKS:
            run[name] = await call("Read", path=f"work/{name}")
    for name in LEAKS:
        for answers in (run, fast):
            content = answers[name].get("content", "")
            assert SECRET not in content and WIDE_SECRET not in content, (name, answers is fast, answers[name])
    assert all(fast[name] == run[name] for name in LEAKS), {n: (fast[n], run[n]) for n in LEAKS if fast[n] != run[n]}


async def test_a_secret_split_across_files_or_lines_is_no_worse_than_a_run(stack):
    """Half a secret in each of two files, or its halves on two lines a range cuts apart: the fast path answers what
    a run answers (redaction cannot join what the model joins; it must not show more than a run would)."""
    call = await started(stack)
    half = len(SECRET) // 2
    await call.run(f"cd $WORK_DIR && printf '%s' {SECRET[:half]} > a && printf '%s\\n' {SECRET[half:]} > b && "
                   f"printf '%s\\n%s\\n' {SECRET} {SECRET[:half]} > lines")
    fast = [await call("Read", path=p, **r) for p, r in (("work/a", {}), ("work/b", {}),
                                                         ("work/lines", {"start_line": 1, "end_line": 1}))]
    with run_path_only(call.dispatcher):
        run = [await call("Read", path=p, **r) for p, r in (("work/a", {}), ("work/b", {}),
                                                            ("work/lines", {"start_line": 1, "end_line": 1}))]
    assert fast == run
    assert SECRET not in fast[2]["content"]


# --- Other workspaces, removal ---------------------------------------------------------------------------------------

async def test_another_team_or_session_never_reaches_the_workspace(stack):
    alice = await started(stack)
    assert (await alice("Write", path="work/private.txt", content="alice's\n"))["success"]
    mallory = Caller(stack, user_id="mallory", session_id=alice.ctx.session.id)
    other = Caller(stack)  # alice's other session
    for intruder in (mallory, other):
        assert (await intruder("Read", path="work/private.txt"))["success"] is False
        assert (await intruder("Write", path="work/private.txt", content="PWNED\n"))["success"]  # its own workspace
        async with intruder.dispatcher.workspace_files(alice.request(), owner=intruder.user_id) as files:
            assert files is None or intruder.user_id == "alice"
    assert (alice.workspace.path / "work" / "private.txt").read_text() == "alice's\n"
    forged = alice.request().model_copy(update={"runtime": "docker"})
    async with alice.dispatcher.workspace_files(forged, owner="alice") as files:
        assert files is None


async def test_removing_the_workspace_under_a_storm_of_calls_leaves_nothing_behind(stack):
    call = await started(stack)
    skill_tools, dispatcher, runtime = stack
    path = call.workspace.path
    stop = asyncio.Event()
    answers: list[dict] = []

    async def storm():
        i = 0
        while not stop.is_set():
            answers.append(await call("Write", path=f"work/f{i % 7}.txt", content="x" * 1000))
            answers.append(await call("Read", path=f"work/f{i % 7}.txt"))
            i += 1

    tasks = [asyncio.create_task(storm()) for _ in range(4)]
    removed = None
    give_up = asyncio.get_running_loop().time() + HANG_GUARD  # the storm's runs come and go: removal waits for a gap
    try:
        while removed != "removed" and asyncio.get_running_loop().time() < give_up:
            with contextlib.suppress(WorkspaceConflictError):  # a run of the storm is in it
                removed = await dispatcher.remove_workspace(call.workspace_id)
            await asyncio.sleep(0)
        assert removed == "removed"
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD)
    finally:
        stop.set()
    assert all(isinstance(a, dict) for a in answers)
    assert not path.exists()  # nothing the storm wrote kept the removed folder (or made it again)
    if call.workspace is not None:  # a Write after the removal made a new workspace, by a run
        assert call.workspace.path != path


async def test_an_idle_workspace_expires_only_when_no_call_is_in_it(stack):
    call = await started(stack)
    dispatcher = call.dispatcher
    dispatcher.workspace_idle_seconds = 0.0
    async with call.files() as files:
        assert files is not None
        assert await dispatcher.expire_idle_workspaces() == 0  # a call is in it
        assert call.workspace.path.exists()
        assert await files.write("work/during.txt", b"d\n")
    assert (call.workspace.path / "work" / "during.txt").read_text() == "d\n"
    path = call.workspace.path
    assert await dispatcher.expire_idle_workspaces() == 1
    assert not path.exists()
    async with call.files() as files:
        assert files is None


# --- Docker: a file written by the fast path is the next run's, and the other way round -----------------------------

@pytest.fixture(params=["runc", "runsc"])
async def docker_stack(request, docker_engine, docker_runtime_factory, work_root):
    if request.param == "runsc":
        docker_engine.require_runtime("runsc")
        path = docker_engine.client.info()["Runtimes"]["runsc"].get("path", "runsc")
        if not (os.access(path, os.X_OK) or shutil.which(path)):
            unavailable(f"the Docker engine's runsc runtime is {path}, which is not there: bash .ci/setup --test "
                        "fetches gVisor's runsc into .venv/bin")
        runtime = docker_runtime_factory(oci_runtime="runsc")
    else:
        runtime = docker_runtime_factory()
    built = make_stack(work_root, work_root.parent / f"{request.param}-secrets", runtime, "docker")
    yield built
    await built[0].close()
    await built[1].close()
    await runtime.close()


@pytest.mark.docker
async def test_in_docker_the_fast_path_and_the_runs_see_the_same_files(docker_stack, outside):
    call = Caller(docker_stack)
    first = await call("Write", path="work/data.txt", content="one\n")
    assert first["success"], first  # a run: it made the workspace
    before = await call.runs()
    for i in range(5):
        assert (await call("Write", path="work/data.txt", content=f"fast {i}\n"))["success"]
        seen = await call.run(f"cat $WORK_DIR/data.txt && printf 'run {i}\\n' > $WORK_DIR/back.txt")
        assert seen["stdout"] == f"fast {i}\n", seen
        assert (await call("Read", path="work/back.txt"))["content"] == f"run {i}\n"
    assert await call.runs() == before + 5  # the five runs alone
    done = await call.run(f"ln -s {outside} $WORK_DIR/o; ln -s / $WORK_DIR/r; true")
    assert done["exit_code"] == 0
    snap = snapshot(outside)
    for path in ("work/o/canary.txt", "work/r" + str(outside / "canary.txt")):
        assert "canary" not in str((await call("Read", path=path)).get("content", ""))
        assert (await call("Write", path=path, content="PWNED\n"))["success"] is False
    assert snapshot(outside) == snap
