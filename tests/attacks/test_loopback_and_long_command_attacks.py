"""Attacks on the sandbox's own network namespace (bwrap's ``--unshare-net``) and on long commands given to bash in
parts (``worker.sandbox.process.shell_argv``).

A run without network must have its loopback and nothing else: not the host's loopback services, addresses or
abstract unix sockets, not the internet, not another workspace's run (in a sandbox of its own or in its held
sandbox), and no power over its network namespace. A command up to ``MAX_COMMAND_CHARS`` runs whole and exactly,
whatever its text at a part's boundary, with no positional parameters. Every assertion is of the safe behaviour;
where it could be arranged a control shows the same probe succeeds where nothing stops it (the host itself, an
unshared namespace of root's, ``bash -c`` given the script whole).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.host_network import host_address
from tests.services import ensure_installed
from worker.errors import InvalidRunRequestError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.sandbox.process import MAX_ARG_BYTES, _PART_CHARS, find_bash, shell_argv
from worker.validation import MAX_COMMAND_CHARS

pytestmark = pytest.mark.root

SESSION = uuid.uuid4().hex[:8]


def ws(name: str) -> str:
    return f"lbl-{name}-{SESSION}"


def _py(code: str) -> str:
    return f"python3 -c {shlex.quote(textwrap.dedent(code))}"


def _listener(address: str, family: int = socket.AF_INET) -> socket.socket:
    server = socket.socket(family)
    server.bind((address, 0))
    server.listen()
    return server


def _reachable_from_host(server: socket.socket) -> None:
    """The listener answers a connection from the host itself (so a refusal in a run means something)."""
    with socket.create_connection(server.getsockname()[:2], timeout=5):
        pass
    server.settimeout(5)
    peer, _ = server.accept()
    peer.close()


def _nothing_came(server: socket.socket) -> bool:
    server.settimeout(0.5)
    try:
        peer, _ = server.accept()
    except TimeoutError:
        return True
    peer.close()
    return False


PROBE = """
import json, socket, sys
targets = json.loads(sys.argv[1])
out = {}
for name, (family, host, port) in targets.items():
    s = socket.socket(getattr(socket, family))
    s.settimeout(5)
    try:
        s.connect((host, port))
        out[name] = "connected"
    except OSError as exc:
        out[name] = f"refused {exc.errno}"
    finally:
        s.close()
for name in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\\0" + name)
        out["abstract:" + name] = "connected"
    except OSError as exc:
        out["abstract:" + name] = f"refused {exc.errno}"
    finally:
        s.close()
print(json.dumps(out))
"""


def _probe(targets: dict[str, tuple[str, str, int]], abstract: tuple[str, ...] = ()) -> str:
    return (f"python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(targets))} "
            + " ".join(shlex.quote(a) for a in abstract))


# --- A run without network: its loopback and nothing else -------------------------------------------------------


async def test_a_run_without_network_reaches_no_host_listener_nor_abstract_socket(runtime, make_request):
    v4 = _listener("127.0.0.1")
    other = _listener("127.0.0.2")
    outside = _listener(host_address())
    listeners = [v4, other, outside]
    try:
        v6 = _listener("::1", socket.AF_INET6)
        listeners.append(v6)
    except OSError:
        v6 = None
    name = f"skillrun-lbl-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + name)
    abstract.listen()
    try:
        for server in listeners:
            _reachable_from_host(server)
        with socket.socket(socket.AF_UNIX) as c:
            c.connect("\0" + name)  # the host's abstract socket answers the host
        targets = {
            "loopback": ("AF_INET", "127.0.0.1", v4.getsockname()[1]),
            "loopback2": ("AF_INET", "127.0.0.2", other.getsockname()[1]),
            "host": ("AF_INET", outside.getsockname()[0], outside.getsockname()[1]),
            "any": ("AF_INET", "0.0.0.0", v4.getsockname()[1]),
        }
        if v6 is not None:
            targets["loopback6"] = ("AF_INET6", "::1", v6.getsockname()[1])
        for _ in range(2):  # a sandbox of its own; through a spawner, then the held sandbox
            result = await runtime.run(make_request(
                _probe(targets, (name,)) + f"; grep -c {name} /proc/net/unix", workspace_id=ws("hostlisten")))
            assert result.exit_code == 0 or result.stdout, result.stderr
            first, count = result.stdout.splitlines()
            seen = json.loads(first)
            assert all(v.startswith("refused") for v in seen.values()), seen
            assert seen["loopback"] == "refused 111" and seen[f"abstract:{name}"] == "refused 111", seen
            assert count == "0", "the host's abstract socket is listed in the run's /proc/net/unix"
            await runtime.idle()
        for server in listeners:
            assert _nothing_came(server), f"a connection reached {server.getsockname()}"
    finally:
        for server in listeners:
            server.close()
        abstract.close()


INTERNET = """
import socket, json
out = {}
for name, family, kind, address in [("tcp", socket.AF_INET, socket.SOCK_STREAM, ("1.1.1.1", 53)),
                                    ("udp", socket.AF_INET, socket.SOCK_DGRAM, ("1.1.1.1", 53)),
                                    ("tcp6", socket.AF_INET6, socket.SOCK_STREAM, ("2606:4700:4700::1111", 53))]:
    s = socket.socket(family, kind)
    s.settimeout(5)
    try:
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"x", address)
            s.recv(10)
        else:
            s.connect(address)
        out[name] = "reached"
    except OSError as exc:
        out[name] = f"failed {exc.errno}"
try:
    out["dns"] = socket.getaddrinfo("example.com", 80)[0][4][0]
except OSError as exc:
    out["dns"] = f"failed {exc.errno}"
print(json.dumps(out))
"""


async def test_a_run_without_network_has_no_route_to_the_internet_nor_dns(runtime, make_request):
    for _ in range(2):
        result = await runtime.run(make_request(_py(INTERNET), workspace_id=ws("internet")))
        seen = json.loads(result.stdout)
        # ENETUNREACH (101) at once: there is no route at all, not merely a filtered one
        assert seen["tcp"] == "failed 101" and seen["udp"] == "failed 101", seen
        assert seen["tcp6"].startswith("failed"), seen
        assert seen["dns"].startswith("failed"), seen
        await runtime.idle()


NET_POWER = r"""
import ctypes, fcntl, os, socket, struct, subprocess, json
def run(*argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return "ok" if r.returncode == 0 else f"denied {r.returncode}"
    except OSError as exc:
        return f"denied {exc.errno}"
out = {}
out["link_add"] = run("ip", "link", "add", "skr0", "type", "dummy")
out["veth_add"] = run("ip", "link", "add", "skv0", "type", "veth", "peer", "name", "skv1")
out["addr_add"] = run("ip", "addr", "add", "10.77.0.1/24", "dev", "lo")
out["lo_down"] = run("ip", "link", "set", "lo", "down")
out["lo_up"] = run("ip", "link", "set", "lo", "up")
out["route_add"] = run("ip", "route", "add", "10.88.0.0/16", "dev", "lo")
for name, args in [("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("raw6", (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)),
                   ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0x0300))]:
    try:
        socket.socket(*args).close()
        out[name] = "ok"
    except OSError as exc:
        out[name] = f"denied {exc.errno}"
try:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, 0x400454ca, struct.pack("16sH", b"sktun0", 0x0002 | 0x1000))  # TUNSETIFF, IFF_TAP|NO_PI
        out["tun"] = "ok"
    finally:
        os.close(fd)
except OSError as exc:
    out["tun"] = f"denied {exc.errno}"
try:
    os.mknod("/tmp/tun", 0o20666, os.makedev(10, 200))
    out["mknod_tun"] = "ok"
except OSError as exc:
    out["mknod_tun"] = f"denied {exc.errno}"
out["unshare_n"] = run("unshare", "-n", "true")
libc = ctypes.CDLL(None, use_errno=True)
try:
    out["setns_host"] = "ok" if libc.setns(os.open("/proc/1/ns/net", os.O_RDONLY), 0x40000000) == 0 else \
        f"denied {ctypes.get_errno()}"
except OSError as exc:
    out["setns_host"] = f"denied {exc.errno}"
links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
out["links"] = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
out["lo_addr"] = "127.0.0.1" in open("/proc/net/fib_trie").read()
print(json.dumps(out))
"""

POWERS = ("veth_add", "addr_add", "route_add", "lo_down", "lo_up", "raw", "raw6", "packet", "tun",
          "unshare_n")


async def test_a_run_without_network_has_no_power_over_its_network_namespace(runtime, make_request):
    # Control: root in a network namespace of its own (what a run had before, made by root) may do all of it.
    control = subprocess.run(["unshare", "--net", sys.executable, "-c", NET_POWER], capture_output=True, text=True,
                             timeout=60)
    powers = json.loads(control.stdout)
    assert all(powers[p] == "ok" for p in POWERS), powers
    for _ in range(2):
        result = await runtime.run(make_request(_py(NET_POWER), workspace_id=ws("power")))
        seen = json.loads(result.stdout)
        granted = [p for p in (*POWERS, "link_add", "mknod_tun", "setns_host") if seen[p] == "ok"]
        assert granted == [], seen
        assert seen["links"] == ["lo"] and seen["lo_addr"], seen
        await runtime.idle()


SURVEY = """
import json
print(json.dumps({
    "dev": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
    "fib": open("/proc/net/fib_trie").read().count(ADDRESS),
    "tcp": open("/proc/net/tcp").read().upper().count(PORT),
    "route": len(open("/proc/net/route").readlines()) - 1,
    "arp": len(open("/proc/net/arp").readlines()) - 1,
}))
"""


async def test_a_run_without_network_sees_none_of_the_hosts_interfaces_in_proc_net(runtime, make_request):
    address = host_address()
    listener = _listener(address)
    port = f":{listener.getsockname()[1]:04X} "
    survey = SURVEY.replace("ADDRESS", repr(address)).replace("PORT", repr(port))
    try:
        # Control: the same survey on the host sees its address and listening socket.
        host = json.loads(subprocess.run([sys.executable, "-c", textwrap.dedent(survey)], capture_output=True,
                                         text=True, timeout=30).stdout)
        assert host["fib"] > 0 and host["tcp"] > 0 and len(host["dev"]) > 1, host
        for _ in range(2):
            result = await runtime.run(make_request(_py(survey), workspace_id=ws("procnet")))
            seen = json.loads(result.stdout)
            assert seen == {"dev": ["lo"], "fib": 0, "tcp": 0, "route": 0, "arp": 0}, seen
            await runtime.idle()
    finally:
        listener.close()


SERVE = """
import os, socket, sys, time, json
port, name, flag, done = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
server = socket.create_server(("127.0.0.1", port))
unix = socket.socket(socket.AF_UNIX)
unix.bind("\\0" + name)
unix.listen()
with socket.create_connection(("127.0.0.1", port)):  # its own loopback answers it
    pass
own, _ = server.accept()
own.close()
open(flag, "w").close()
server.settimeout(0.05)
unix.settimeout(0.05)
came = []
end = time.monotonic() + 30  # a hang guard only
while not os.path.exists(done) and time.monotonic() < end:
    for s in (server, unix):
        try:
            peer, _ = s.accept()
            came.append(s.family.name)
            peer.close()
        except TimeoutError:
            pass
print(json.dumps({"self": "connected", "came": came}))
"""


@pytest.mark.parametrize("held", [False, True], ids=["own-sandbox", "held-sandbox"])
async def test_a_run_reaches_nothing_of_another_workspaces_concurrent_run(work_root, make_request, held):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    name = f"skillrun-lbl-peer-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    async with LocalWorkspaceRuntime(work_root, spawners="eager" if held else "off") as runtime:
        if held:  # the serving workspace's next run goes into its held sandbox
            await runtime.run(make_request("true", workspace_id=ws("serve-h")))
            await runtime.idle()
        serving = asyncio.create_task(runtime.run(make_request(
            f"python3 -c {shlex.quote(SERVE)} {port} {name} $WORK_DIR/up-{token} $WORK_DIR/done-{token}",
            workspace_id=ws("serve-h" if held else "serve"), timeout=60)))
        flag = None
        end = time.monotonic() + 30
        while flag is None and time.monotonic() < end and not serving.done():
            flag = next(iter(work_root.glob(f"*/work/up-{token}")), None) or next(
                iter(work_root.glob(f"**/up-{token}")), None)
            await asyncio.sleep(0.05)
        assert flag is not None, (await serving).stderr if serving.done() else "the server did not start"
        if held:
            assert runtime._spawners[ws("serve-h")].sandbox is not None and runtime._spawners[ws("serve-h")].occupied
        try:
            attack = await runtime.run(make_request(
                _probe({"peer": ("AF_INET", "127.0.0.1", port)}, (name,)), workspace_id=ws("attacker")))
        finally:
            (flag.parent / f"done-{token}").touch()
        served = await serving
    seen = json.loads(attack.stdout)
    assert seen == {"peer": "refused 111", f"abstract:{name}": "refused 111"}, seen
    assert json.loads(served.stdout) == {"self": "connected", "came": []}, served.stdout + served.stderr


@pytest.fixture
async def network_runtime(work_root):
    ensure_installed("slirp4netns", "slirp4netns")
    async with LocalWorkspaceRuntime(work_root, allow_network=True) as runtime:
        yield runtime


async def test_a_network_run_still_cannot_reach_the_hosts_loopback(network_runtime, make_request):
    v4 = _listener("127.0.0.1")
    outside = _listener(host_address())
    name = f"skillrun-lbl-net-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + name)
    abstract.listen()
    try:
        _reachable_from_host(v4)
        _reachable_from_host(outside)
        port = v4.getsockname()[1]
        result = await network_runtime.run(make_request(_probe({
            "loopback": ("AF_INET", "127.0.0.1", port),
            "gateway": ("AF_INET", "10.0.2.2", port),
            "dns_host": ("AF_INET", "10.0.2.3", port),
            "outside": ("AF_INET", outside.getsockname()[0], outside.getsockname()[1]),
        }, (name,)), network=True))
        seen = json.loads(result.stdout)
        assert seen["outside"] == "connected", seen  # it has a network: the probe works
        assert seen["loopback"] == "refused 111" and seen[f"abstract:{name}"] == "refused 111", seen
        assert seen["gateway"].startswith("refused") and seen["dns_host"].startswith("refused"), seen
        assert _nothing_came(v4)
    finally:
        v4.close()
        outside.close()
        abstract.close()


# --- Long commands: run whole and exactly -----------------------------------------------------------------------

TRICKY = "'\"$1$@$#${0}${BASH_ARGV}`\\;) EOF\n🙂é中\t"
"""Text at a part's boundary: quotes, positional parameters, a would-be delimiter, 2-, 3- and 4-byte characters."""


def _fill(chars: int) -> str:
    return (TRICKY * (chars // len(TRICKY) + 1))[:chars]


def _heredoc_command(total: int) -> tuple[str, bytes]:
    """A command of ``total`` characters that prints the sha256 of a quoted heredoc's body, and that body's bytes."""
    head, tail = "sha256sum <<'SKILLRUN_END'\n", "\nSKILLRUN_END\necho \"n=$# at=[$*] one=[${1-unset}]\""
    body = _fill(total - len(head) - len(tail)).replace("SKILLRUN_END", "SKILLRUN_ENX")
    return head + body + tail, (body + "\n").encode()


@pytest.mark.parametrize("chars", [MAX_COMMAND_CHARS, MAX_COMMAND_CHARS - 1, 3 * _PART_CHARS + 1, 40_000])
async def test_a_long_command_runs_whole_and_exactly_with_no_positional_parameters(work_root, make_request, chars):
    command, body = _heredoc_command(chars)
    assert len(command) == chars
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(make_request(command))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{hashlib.sha256(body).hexdigest()}  -\nn=0 at=[] one=[unset]\n", result.stdout


async def test_a_command_longer_than_the_limit_is_refused(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        with pytest.raises(InvalidRunRequestError, match="command"):
            await runtime.run(make_request("#" * (MAX_COMMAND_CHARS + 1)))
        with pytest.raises(InvalidRunRequestError, match="command"):
            await runtime.run(make_request("echo a\0; echo b"))


def _boundary_scripts() -> list[tuple[str, str]]:
    """Scripts whose part boundaries fall inside each kind of construct, each with what ``bash -c`` prints for it."""
    scripts = []
    for shift in range(-3, 4):
        for kind in ("single", "double", "heredoc", "comment", "subst", "multibyte"):
            pad = ": " + "p" * (4 * _PART_CHARS - 3 + shift - 30) + "\n"
            if kind == "single":
                body = "printf %s '" + "a$1'\"'\"'b" * 20 + "$@$#' | sha256sum"
            elif kind == "double":
                body = 'printf %s "' + "x${1-u}$#[$*]\\$\\\"" * 20 + '" | sha256sum'
            elif kind == "heredoc":
                body = "cat <<E\n" + "$# ${1-u} $0 E \n" * 10 + "E\necho after"
            elif kind == "comment":
                body = "# a comment running over; echo INJECTED $1\n" * 4 + "echo end"
            elif kind == "subst":
                body = "echo $(echo " + "$#" * 30 + ") `echo ${1-u}` $((1+" + "1+" * 20 + "1))"
            else:
                body = "printf %s '" + "🙂中é" * 20 + "' | sha256sum"
            scripts.append((pad + body, body))
    return scripts


def test_no_part_boundary_changes_what_bash_runs():
    # Against bash -c given the script whole (a short one: the body alone, with no padding). The padded script is
    # split by shell_argv at boundaries that move through the body.
    bash = find_bash()
    for script, body in _boundary_scripts():
        argv = shell_argv(bash, script)
        assert len(argv) > 3, "the script was not split"
        assert all(len(a.encode()) < MAX_ARG_BYTES for a in argv)
        whole = subprocess.run([bash, "-c", body], capture_output=True, text=True, timeout=30)
        split = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert (split.returncode, split.stdout, split.stderr) == (whole.returncode, whole.stdout, whole.stderr), \
            script[-200:]


@pytest.mark.parametrize("extra", range(-2, 3))
def test_scripts_at_the_one_argument_threshold_run_exactly(extra):
    bash = find_bash()
    for char in ("a", "é", "中", "🙂"):
        size = len(char.encode())
        head, tail = "cat <<'E'\n", "\nE\n"
        count = (MAX_ARG_BYTES - len(head) - len(tail)) // size + extra
        body = char * count
        script = head + body + tail
        split = subprocess.run(shell_argv(bash, script), capture_output=True, timeout=30)
        assert split.returncode == 0, split.stderr[-300:]
        assert split.stdout == (body + "\n").encode()


async def test_env_values_and_cwd_cannot_inject_into_the_eval_of_a_long_command(work_root, make_request):
    env = {
        "IFS": "s", "POSIXLY_CORRECT": "1", "BASH_COMPAT": "31", "BASH_XTRACEFD": "1", "PS1": "$(echo INJECTED)",
        "X": '${1}$(echo INJECTED)`echo INJECTED`"; echo INJECTED; "', "set": "echo INJECTED", "eval": "INJECTED",
    }
    command, body = _heredoc_command(MAX_COMMAND_CHARS - 200)
    command += '; printf "%s|%s\\n" "$X" "${PWD##*/}"'
    async with LocalWorkspaceRuntime(work_root) as runtime:
        made = await runtime.run(make_request("mkdir -p \"$WORK_DIR/\\$(echo INJECTED)\"", workspace_id=ws("inj")))
        assert made.exit_code == 0, made.stderr
        result = await runtime.run(make_request(command, env=env, cwd="$WORK_DIR/$(echo INJECTED)",
                                                workspace_id=ws("inj")))
    lines = result.stdout.splitlines()
    assert lines[0] == f"{hashlib.sha256(body).hexdigest()}  -", result.stdout[:500] + result.stderr[:500]
    assert lines[1] == "n=0 at=[] one=[unset]"
    assert lines[2] == f"{env['X']}|$(echo INJECTED)"
    assert "INJECTED\n" not in result.stdout and len(lines) == 3, result.stdout


async def test_a_long_command_through_a_warm_workspace_runs_whole(work_root, make_request):
    # A warm workspace has a spawner and a ready shell; its script is too long for the ready shell, which is
    # given up: the command still runs whole, in a sandbox of its own.
    command, body = _heredoc_command(MAX_COMMAND_CHARS)
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        for _ in range(2):
            await runtime.run(make_request("true", workspace_id=ws("warm-long")))
            await runtime.idle()
        result = await runtime.run(make_request(command, workspace_id=ws("warm-long")))
        after = await runtime.run(make_request(_probe({"x": ("AF_INET", "1.1.1.1", 53)}), workspace_id=ws("warm-long")))
    assert result.stdout == f"{hashlib.sha256(body).hexdigest()}  -\nn=0 at=[] one=[unset]\n", result.stderr
    assert json.loads(after.stdout) == {"x": "refused 101"}, after.stdout + after.stderr


# --- Launchers and the unsandboxed runtime -------------------------------------------------------------------------


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


async def test_a_launcher_that_died_while_waiting_is_discarded_and_the_run_still_has_no_network(work_root,
                                                                                                make_request):
    # The launcher is killed after it was taken (its exit not yet reaped: ``take`` saw it alive): launching it
    # meets a broken pipe, and the run is started without it, in a sandbox of its own with nothing but loopback.
    outside = _listener(host_address())
    loopback = _listener("127.0.0.1")
    killed = []
    async with LocalWorkspaceRuntime(work_root) as runtime:
        await runtime.run(make_request("true"))
        await runtime.idle()
        take = runtime.groups.take_launcher

        def take_and_kill(limits):  # noqa: ANN001, ANN202 - the runtime's own signature
            launcher = take(limits)
            if launcher is not None and not killed:
                os.killpg(launcher.proc.pid, 9)
                end = time.monotonic() + 10  # a hang guard
                while not _zombie(launcher.proc.pid) and time.monotonic() < end:
                    time.sleep(0.01)
                killed.append(launcher)
            return launcher

        runtime.groups.take_launcher = take_and_kill
        try:
            _reachable_from_host(outside)
            _reachable_from_host(loopback)
            result = await runtime.run(make_request(_probe({
                "loopback": ("AF_INET", "127.0.0.1", loopback.getsockname()[1]),
                "host": ("AF_INET", outside.getsockname()[0], outside.getsockname()[1]),
            }) + "; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"))
            assert killed, "no launcher was taken: the attack did not happen"
            assert killed[0].proc.poll() is not None
            lines = result.stdout.splitlines()
            assert json.loads(lines[0]) == {"loopback": "refused 111", "host": "refused 101"}, result.stdout
            assert lines[1:] == ["lo"], result.stdout
            assert _nothing_came(outside) and _nothing_came(loopback)
        finally:
            outside.close()
            loopback.close()


async def test_without_the_sandbox_a_run_without_network_still_reaches_nothing_of_the_host(work_root, make_request):
    outside = _listener(host_address())
    loopback = _listener("127.0.0.1")
    try:
        _reachable_from_host(outside)
        _reachable_from_host(loopback)
        async with LocalWorkspaceRuntime(work_root, sandbox=False) as runtime:
            for _ in range(2):
                result = await runtime.run(make_request(_probe({
                    "loopback": ("AF_INET", "127.0.0.1", loopback.getsockname()[1]),
                    "host": ("AF_INET", outside.getsockname()[0], outside.getsockname()[1]),
                }), workspace_id=ws("nosandbox")))
                seen = json.loads(result.stdout)
                assert seen["loopback"].startswith("refused") and seen["host"].startswith("refused"), seen
                await runtime.idle()
        assert _nothing_came(outside) and _nothing_came(loopback)
    finally:
        outside.close()
        loopback.close()
