"""A normal account for the tests that try Skillrun as a laptop user would: not root, no workspace users.

As root, the tests make one account (``NORMAL_USER``, with a home folder) and run Skillrun's own processes as it;
run as any other account, they run them as that account. ``run_as`` starts a command so; ``local_runs`` runs
commands on the local runtime so, through ``tests.rootless_driver``, and gives back their results; ``cli`` is the
``skillrun`` command for ``run_as``.

The checkout's ``.venv`` interpreter may be a link into a folder only root may enter (pyenv's under ``/root``):
then, as root, that interpreter's installation is shown read-only at a path every account may reach (``SHOWN``, a
bind mount for the session), and the account runs it there over the ``.venv``'s packages (``PACKAGES``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.services import unavailable

NORMAL_USER = "skillrun-tester"
REPO = Path(__file__).resolve().parents[1]
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
PACKAGES = f"{REPO}:{REPO / '.venv' / 'lib' / f'python{VERSION}' / 'site-packages'}"
"""What ``PYTHONPATH`` holds for the account's interpreter: the checkout, then the ``.venv``'s packages."""
SHOWN = Path(f"/tmp/skillrun-tests-python{VERSION}")


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: Path

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What a login of the account has, and nothing of the test process's (no SKILLRUN_* settings), but the
        checkout's packages (and the shown installation's libraries, where it has its own ``libpython``)."""
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8", "PYTHONPATH": PACKAGES, "LD_LIBRARY_PATH": str(SHOWN / "lib"), **(extra or {})}


def normal_account() -> Account:
    """The account: made (once) when the tests run as root, else the tests' own. The checkout must be readable by
    it (a clone under /tmp or /home is; one under a private folder is not)."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    try:
        entry = pwd.getpwnam(NORMAL_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", NORMAL_USER], capture_output=True,
                              text=True, timeout=60)
        if made.returncode != 0:
            unavailable(f"could not make the test account {NORMAL_USER}: {made.stderr.strip()}")
        entry = pwd.getpwnam(NORMAL_USER)
    account = Account(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    if python(account) is None:
        unavailable(f"the account {NORMAL_USER} can run no Python {VERSION} with this checkout's .venv packages: "
                    "clone the repository where other accounts may read it (under /tmp or /home)")
    return account


@functools.cache
def python(account: Account) -> str | None:
    """An interpreter the account can run with the checkout's packages: the ``.venv``'s own, or (as root) its
    installation shown at ``SHOWN``."""
    candidates = [str(REPO / ".venv" / "bin" / "python")]
    if os.geteuid() == 0 and _show_installation():
        candidates.append(str(SHOWN / "bin" / f"python{VERSION}"))
    for candidate in candidates:
        try:
            probe = run_as(account, [candidate, "-c", "import worker, pydantic_core, redis"], cwd=REPO)
        except OSError:  # in a folder the account may not enter
            continue
        if probe.returncode == 0:
            return candidate
    return None


def _show_installation() -> bool:
    """Bind this interpreter's installation (``sys.base_prefix``) read-only at ``SHOWN``, until the tests end."""
    if not (SHOWN / "bin").is_dir():
        SHOWN.mkdir(mode=0o755, exist_ok=True)
        for argv in (["mount", "--bind", sys.base_prefix, str(SHOWN)], ["mount", "-o", "remount,bind,ro", str(SHOWN)]):
            if subprocess.run(argv, capture_output=True, timeout=30).returncode != 0:
                return False
        atexit.register(subprocess.run, ["umount", "--lazy", str(SHOWN)], capture_output=True, timeout=30)
    return True


def cli(account: Account) -> list[str]:
    """The ``skillrun`` command, as the account runs it."""
    return [python(account), "-m", "orchestrator.cli"]


def run_as(account: Account, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
           input: str | None = None, timeout: float = 300, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``account``, with only the account's own environment and ``env``. With ``prefix`` (as root),
    that runs first, as root, and ends in ``setpriv`` switching to the account (a ``prefix`` such as ``unshare``
    makes what the account then runs in)."""
    switch: dict = {}
    if prefix:
        argv = [*prefix, "setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", *argv]
    elif os.geteuid() == 0:
        switch = {"user": account.uid, "group": account.gid, "extra_groups": []}
    return subprocess.run(argv, env=account.environment(env), cwd=cwd or account.home, input=input,
                          capture_output=True, text=True, timeout=timeout, **switch)


def driver(account: Account) -> list[str]:
    """The command that runs ``tests.rootless_driver`` as the account (from the checkout, with ``run_as``); its job
    is one line of JSON on stdin."""
    return [python(account), "-m", "tests.rootless_driver"]


def job_line(skill_root: Path, runs: list[dict], options: dict | None = None) -> str:
    """The driver's job: ``runs`` in the skills of ``skill_root``, on ``resolve_runtime("local", **options)``."""
    return json.dumps({"skill_root": str(skill_root), "runs": runs, "options": options or {}}) + "\n"


def results_of(stdout: str) -> list[dict]:
    """The driver's results, from its last line."""
    return json.loads(stdout.splitlines()[-1])["results"]


def local_runs(account: Account, skill_root: Path, runs: list[dict], *, options: dict | None = None,
               env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> list[dict]:
    """Run each of ``runs`` (see ``tests.rootless_driver``) in the skills of ``skill_root`` on one local runtime
    built as the account's ``resolve_runtime("local", **options)``, and give back their results."""
    done = run_as(account, driver(account), env=env, input=job_line(skill_root, runs, options), prefix=prefix,
                  cwd=REPO)
    if done.returncode != 0:
        raise AssertionError(f"the driver failed ({done.returncode}): {done.stderr[-3000:]}")
    return results_of(done.stdout)


__all__ = ["Account", "NORMAL_USER", "REPO", "cli", "driver", "job_line", "local_runs", "normal_account", "python",
           "results_of", "run_as"]
