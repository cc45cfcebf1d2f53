"""The root local runtime's escapes (``tests/attacks/test_local_escapes.py``), tried again by a normal account's runs.

Those attacks drive a runtime in the test process, as root; here the same payloads run as the account
(``tests.normal_user``), through the local runtime the guide builds (``resolve_runtime("local")``), whose sandbox is
made in unprivileged user namespaces (the account's own uid inside, no control groups). What holds for root holds
here, or the difference is asserted as what the account's sandbox gives (``docs/security/local.md``, "Without
root"). Each payload's own description, and how it was seen to fail against an undefended target, is where it is
defined.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.attacks.test_local_escapes import (
    I386_UNSHARE,
    INJECT_INTO_INIT,
    PIPES_SURVEY,
    REFUSED_CALLS,
    _abstract_connect,
    _py,
)
from tests.conftest import write_skill
from tests.normal_user import Account, local_runs

CAPABILITIES = "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status"
NO_CAPABILITIES = {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16,
                   "CapAmb": "0" * 16, "NoNewPrivs": "1"}


def run(account: Account, skill_root: Path, cache: Path, *runs: dict, options: dict | None = None) -> list[dict]:
    """``runs`` on one local runtime as the account (its default work root under ``cache``)."""
    return local_runs(account, skill_root, list(runs), options=options, env={"XDG_CACHE_HOME": str(cache)})


def one(account: Account, skill_root: Path, cache: Path, command: str, **fields) -> dict:
    [result] = run(account, skill_root, cache, {"command": command, **fields})
    assert "error" not in result, result
    return result


def test_a_32_bit_system_call_cannot_make_a_user_namespace(account, skill_root, cache):
    result = one(account, skill_root, cache, _py(I386_UNSHARE) + "; echo status=$?")
    assert "new-userns True" not in result["stdout"]
    assert "status=159" in result["stdout"], result  # killed by SIGSYS: a foreign architecture


def test_tracing_the_sandbox_init_does_not_get_past_the_seccomp_filter(account, skill_root, cache):
    # The account's run shares its uid with its sandbox's init: if that init could be traced and were not under
    # the filter, code injected into it would make user namespaces.
    result = one(account, skill_root, cache, _py(INJECT_INTO_INIT))
    assert result["stdout"] in ("init-unshare -1 new-userns False\n", "init-untraceable\n"), result


def test_kernel_interfaces_an_unprivileged_user_may_use_are_refused_in_a_run(account, skill_root, cache):
    result = one(account, skill_root, cache, _py(REFUSED_CALLS))
    refused = ("add_key", "perf_event_open", "io_uring_setup", "userfaultfd", "name_to_handle_at")
    assert result["stdout"].splitlines() == [f"{name} Operation not permitted" for name in refused], result


def test_a_run_cannot_reach_an_abstract_unix_socket_of_the_accounts_own(account, skill_root, cache):
    # A socket the account's other programs listen on (a desktop session's, an agent's) is the account's own: only
    # the run's network namespace keeps it out.
    name = f"skillrun-account-{uuid.uuid4().hex}"
    serve = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind('\\0' + sys.argv[1]); s.listen(); "
             "print('up', flush=True); time.sleep(60)")
    as_account = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups"] \
        if os.geteuid() == 0 else []
    listener = subprocess.Popen([*as_account, "/usr/bin/python3", "-c", serve, name], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline() == "up\n"
        probe = socket.socket(socket.AF_UNIX)
        probe.connect("\0" + name)  # it is there for the account's processes outside
        probe.close()
        result = one(account, skill_root, cache, f"grep -c {name} /proc/net/unix; " + _abstract_connect(name, "connected"))
    finally:
        listener.kill()
        listener.wait()
    assert result["stdout"].splitlines() == ["0", "refused 111"], result


def test_a_run_holds_no_capability_and_a_setuid_root_program_gives_it_none(account, shared, cache):
    folder = write_skill(shared / "suid-library", "suid")
    if os.geteuid() == 0:
        subprocess.run(["install", "-o", "0", "-g", "0", "-m", "4755", "/usr/bin/id", str(folder / "id")], check=True)
        assert os.stat(folder / "id").st_mode & 0o4000
    else:
        subprocess.run(["install", "-m", "0755", "/usr/bin/id", str(folder / "id")], check=True)
    os.chmod(shared / "suid-library", 0o755)
    result = one(account, folder.parent, cache,
                 f"./id; {CAPABILITIES}; unshare --mount --fork true && echo mount-namespace-made; "
                 "mount -t tmpfs none $RUN_DIR && echo mounted", skill="suid")
    first = result["stdout"].splitlines()[0]
    assert first.startswith(f"uid={account.uid}(") and "euid=0" not in first, first
    status = dict(line.split(":\t") for line in result["stdout"].splitlines()[1:] if ":\t" in line)
    assert status == NO_CAPABILITIES, result
    assert "mount-namespace-made" not in result["stdout"] and "mounted" not in result["stdout"]


def test_the_sandbox_init_holds_no_capability_either(account, skill_root, cache):
    # The init of the account's sandbox is in the same user namespace as the run: capabilities there would be
    # the run's to use by tracing it.
    result = one(account, skill_root, cache, "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/1/status")
    status = dict(line.split(":\t") for line in result["stdout"].splitlines() if ":\t" in line)
    assert {key: status.get(key) for key in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == {
        key: "0" * 16 for key in ("CapInh", "CapPrm", "CapEff", "CapAmb")}, result


def test_a_run_cannot_store_more_than_the_tmpfs_cap_in_the_sandbox_root_or_dev(account, skill_root, cache):
    [result] = run(account, skill_root, cache, {"command": (
        "head -c 8M /dev/zero > /tmp/big; echo tmp=$?; "
        "head -c 8M /dev/zero > /stash && echo root-written $(stat -c %s /stash); "
        "head -c 8M /dev/zero > /dev/stash && echo dev-written $(stat -c %s /dev/stash)")},
        options={"tmpfs_bytes": 4 * 1024 * 1024})
    assert "tmp=1" in result["stdout"], result
    assert "root-written" not in result["stdout"] and "dev-written" not in result["stdout"], result


def test_a_run_cannot_raise_its_limits_or_see_the_hosts_control_groups(account, skill_root, cache):
    result = one(account, skill_root, cache,
                 "ulimit -n 100000 2>/dev/null && echo raised-files; ulimit -u 100000 2>/dev/null && echo raised-procs; "
                 "ls /sys/fs/cgroup 2>/dev/null | head -1 | grep -q . && echo cgroups-visible; "
                 "mount -t cgroup -o pids none $RUN_DIR 2>/dev/null && echo cgroup-mounted; echo end",
                 limits={"open_files": 256, "processes": 64})
    assert result["stdout"].splitlines() == ["end"], result


def test_no_descriptor_of_the_host_is_open_in_any_process_of_a_run(account, skill_root, cache):
    # bwrap's report, block and seccomp pipes stay out of the run: of every process in the sandbox (its init
    # included) the only pipes open are the run's own stdout and stderr, on a first run and on a reused workspace.
    survey = _py(PIPES_SURVEY)
    results = run(account, skill_root, cache, {"command": survey}, {"command": "true", "workspace_id": "fd-warm"},
                  {"command": survey, "workspace_id": "fd-warm"})
    for result in (results[0], results[2]):
        own, found = result["stdout"].splitlines()
        assert len(own.split()) == 2 and found.split() == own.split(), result


def test_a_planted_link_or_fifo_cannot_become_a_runs_folder(account, skill_root, cache):
    results = run(account, skill_root, cache,
                  {"command": "ln -s /etc $WORK_DIR/etc; ln -s /tmp $WORK_DIR/tmp; mkfifo $WORK_DIR/fifo",
                   "workspace_id": "cwd"},
                  *({"command": "pwd; ls", "workspace_id": "cwd", "cwd": cwd}
                    for cwd in ("$WORK_DIR/etc", "$WORK_DIR/tmp", "$WORK_DIR/fifo")))
    for result in results[1:]:
        assert result.get("error", "").startswith("InvalidRunRequestError") and "cwd" in result["error"], result


def test_a_run_cannot_hard_link_files_it_does_not_own_or_the_workers_into_its_outputs(account, skill_root, cache):
    result = one(account, skill_root, cache,
                 "ln /etc/passwd $OUTPUT_DIR/passwd && echo linked-etc; "
                 f"ln {skill_root}/probe/SKILL.md $OUTPUT_DIR/skill && echo linked-library; "
                 "ln $WORKSPACE_DIR/metadata.json $OUTPUT_DIR/meta && echo linked-metadata; echo end",
                 output_files=["out/*"])
    assert result["stdout"] == "end\n", result
    assert result["files"] == {}, result


@pytest.mark.parametrize("number", range(3))
def test_runs_of_one_workspace_leave_the_next_no_process_file_in_tmp_or_ipc_object(account, skill_root, cache,
                                                                                   number):
    # What the root held sandbox empties between runs (``worker.sandbox.held``), a normal account's sandbox of
    # its own per run never keeps.
    plant = ("(setsid sleep 300 &); touch /tmp/planted /dev/shm/planted; "
             + _py("import ctypes; ctypes.CDLL(None).shmget(0x5e11 + %d, 4096, 0o1666)" % number) + "; echo planted")
    look = "ps -e -o comm= | grep -c sleep; ls /tmp /dev/shm | grep -c planted; tail -n +2 /proc/sysvipc/shm | wc -l"
    first, second = run(account, skill_root, cache, {"command": plant, "workspace_id": f"kept-{number}"},
                        {"command": look, "workspace_id": f"kept-{number}"})
    assert first["stdout"] == "planted\n", first
    assert second["stdout"].split() == ["0", "0", "0"], second
