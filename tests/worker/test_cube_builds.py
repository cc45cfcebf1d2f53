"""uv's steps translated for a Cube sandbox's interpreter, which is not on the worker."""

from __future__ import annotations

import pytest

from worker.environments import Target
from worker.errors import DependencyError
from worker.runtimes.cube.builds import for_target, uv_platform

SANDBOX = Target("cube", "/usr/local/bin/python3", "3.12.4", "x86_64", "glibc-2.36")


@pytest.mark.parametrize(("machine", "libc", "platform"), [
    ("x86_64", "glibc-2.36", "x86_64-manylinux_2_36"),
    ("aarch64", "glibc-2.41", "aarch64-manylinux_2_40"),  # newer than uv names: the newest it does
    ("x86_64", "glibc-2.30", "x86_64-manylinux_2_28"),
    ("arm64", "glibc-2.17", "aarch64-manylinux_2_17"),
    ("x86_64", "-", "x86_64-unknown-linux-musl"),  # no glibc reported
])
def test_the_sandboxs_platform_as_uv_names_it(machine: str, libc: str, platform: str):
    assert uv_platform(Target("cube", "/usr/bin/python3", "3.11.2", machine, libc)) == platform


@pytest.mark.parametrize(("machine", "libc", "message"), [
    ("riscv64", "glibc-2.36", "x86_64 and aarch64"),
    ("x86_64", "glibc-2.12", "older than any manylinux"),
])
def test_a_platform_uv_cannot_resolve_for_is_refused_saying_why(machine: str, libc: str, message: str):
    with pytest.raises(DependencyError, match=message):
        uv_platform(Target("cube", "/usr/bin/python3", "3.11.2", machine, libc))


def test_steps_name_the_workers_python_and_resolve_and_install_for_the_sandboxs():
    compile_step = ["pip", "compile", "requirements.in", "--python", SANDBOX.python, "--generate-hashes", "--quiet"]
    assert for_target(compile_step, SANDBOX, "/usr/bin/python3") == [
        "pip", "compile", "requirements.in", "--python", "/usr/bin/python3", "--generate-hashes", "--quiet",
        "--python-version", "3.12.4", "--python-platform", "x86_64-manylinux_2_36",
    ]
    venv_step = ["venv", "--relocatable", "--python", SANDBOX.python, "env"]
    assert for_target(venv_step, SANDBOX, "/usr/bin/python3") == [
        "venv", "--relocatable", "--python", "/usr/bin/python3", "env",
    ]
    sync_step = ["pip", "sync", "--python", "env/bin/python", "--require-hashes", "--compile-bytecode", "lock.txt"]
    assert for_target(sync_step, SANDBOX, "/usr/bin/python3") == [
        "pip", "sync", "--python", "env/bin/python", "--require-hashes", "lock.txt",
        "--python-version", "3.12.4", "--python-platform", "x86_64-manylinux_2_36",
    ]
