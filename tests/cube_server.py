"""A local stand-in for an E2B-compatible sandbox service (Cube), for tests and benchmarks.

It speaks what the ``e2b`` SDK speaks, on one loopback port:

* the control API (``X-API-KEY``): ``POST /v2/sandboxes``, ``POST /v2/sandboxes/{id}/connect``,
  ``GET /v2/sandboxes`` (filtered by ``metadata``), ``GET /sandboxes/{id}``, ``DELETE /sandboxes/{id}``;
* the in-sandbox daemon (envd), chosen by the ``E2b-Sandbox-Id`` header and guarded by ``X-Access-Token``:
  ``GET /health``, ``GET``/``POST /files`` (octet-stream, gzip and multipart uploads), and the Connect-RPC
  ``process.Process`` service (``Start`` as a server stream, ``List``, ``SendSignal``), served by the SDK's own
  generated ASGI application.

The SDK reaches it with ``api_url`` and ``sandbox_url`` set to ``url``. A "sandbox" here is not isolated: its
commands run on this machine in whatever directory the caller names (tests point the Cube runtime's remote root
at a temporary directory). As root, the ``user`` user runs commands as uid/gid ``user_uid``, as a real sandbox's
unprivileged user would; ``root`` runs them as root. A command's environment is the sandbox's own (never this
process's), as on a remote machine.

Faults a test can ask for: ``fail_api(status)`` answers the next control-API call with that status,
``drop_next_stream()`` cuts the connection of the next command stream after its first event, and
``forget(sandbox_id)`` makes a sandbox vanish as an expired one does.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import os
import secrets
import signal
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ENVD_VERSION = "0.6.4"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DRAIN_SECONDS = 0.2
"""How long output is still read after a command's process exited (a background child may hold its pipes)."""


@dataclass
class StandInSandbox:
    sandbox_id: str
    template_id: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    timeout: int
    access_token: str = field(default_factory=lambda: secrets.token_hex(16))
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    processes: dict[int, asyncio.SubprocessTransport] = field(default_factory=dict)

    def describe(self, listed: bool = False) -> dict[str, Any]:
        info: dict[str, Any] = {
            "templateID": self.template_id,
            "sandboxID": self.sandbox_id,
            "clientID": "standin",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.access_token,
            "domain": None,
        }
        if listed:
            info.update(
                {
                    "startedAt": self.started_at.isoformat(),
                    "endAt": (self.started_at + timedelta(seconds=self.timeout)).isoformat(),
                    "cpuCount": 2,
                    "memoryMB": 512,
                    "diskSizeMB": 1024,
                    "state": "running",
                    "metadata": self.metadata,
                }
            )
        return info


class CubeStandIn:
    """The stand-in service; ``start()`` serves it on a free loopback port, ``stop()`` ends it and its commands."""

    def __init__(
        self, api_key: str = "standin-key", templates: tuple[str, ...] = ("base", "skillrun-cube"), user_uid: int = 1000
    ) -> None:
        self.api_key = api_key
        self.templates = set(templates)
        self.user_uid = user_uid
        self.sandboxes: dict[str, StandInSandbox] = {}
        self.api_calls: list[str] = []
        self.commands: list[str] = []
        self.downloaded_bytes = 0
        self._api_failures: list[int] = []
        self._drop_streams = 0
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.url = ""

    # ---- faults -------------------------------------------------------------------------------------------
    def fail_api(self, status: int, times: int = 1) -> None:
        self._api_failures.extend([status] * times)

    def drop_next_stream(self) -> None:
        self._drop_streams += 1

    def forget(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            _kill_all(sandbox)

    # ---- serving ------------------------------------------------------------------------------------------
    def start(self) -> "CubeStandIn":
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY on accept
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        # asyncio's own loop: its sandboxes are processes started as another user, which uvloop's subprocesses cannot
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1,
                                loop="asyncio")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the Cube stand-in did not start")
            threading.Event().wait(0.01)
        return self

    def stop(self) -> None:
        for sandbox in list(self.sandboxes.values()):
            _kill_all(sandbox)
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> "CubeStandIn":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self):  # noqa: ANN202 - an ASGI callable
        api = Starlette(
            routes=[
                Route("/v2/sandboxes", self._create, methods=["POST"]),
                Route("/v2/sandboxes", self._list, methods=["GET"]),
                Route("/v2/sandboxes/{sandbox_id}/connect", self._connect, methods=["POST"]),
                Route("/sandboxes/{sandbox_id}", self._info, methods=["GET"]),
                Route("/sandboxes/{sandbox_id}", self._kill, methods=["DELETE"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/files", self._read_file, methods=["GET"]),
                Route("/files", self._write_file, methods=["POST"]),
            ]
        )
        rpc = process_connect.ProcessASGIApplication(_ProcessService(self))
        stand_in = self

        async def app(scope, receive, send):  # noqa: ANN001 - ASGI
            if scope["type"] != "http":
                return await api(scope, receive, send)
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if "e2b-sandbox-id" in headers:
                denied = stand_in._guard_envd(headers)
                if denied is not None:
                    return await denied(scope, receive, send)
                if scope["path"].startswith(rpc.path + "/"):
                    if scope["path"].endswith("/Start") and stand_in._drop_streams:
                        stand_in._drop_streams -= 1
                        return await rpc(scope, receive, _dropping_after_first_event(send))
                    return await rpc(scope, receive, send)
            elif scope["path"] not in ("/health", "/files"):
                stand_in.api_calls.append(f"{scope['method']} {scope['path']}")
                if headers.get("x-api-key") != stand_in.api_key:
                    return await _error(401, "Invalid API key")(scope, receive, send)
                if stand_in._api_failures:
                    status = stand_in._api_failures.pop(0)
                    return await _error(status, f"the stand-in was told to fail with {status}")(scope, receive, send)
            return await api(scope, receive, send)

        return app

    def _guard_envd(self, headers: dict[str, str]) -> Response | None:
        sandbox = self.sandboxes.get(headers["e2b-sandbox-id"])
        if sandbox is None:
            return _error(502, f"The sandbox {headers['e2b-sandbox-id']} was not found")
        if headers.get("x-access-token") != sandbox.access_token:
            return _error(401, "invalid access token")
        return None

    def sandbox_of(self, request_headers: Any) -> StandInSandbox:
        sandbox = self.sandboxes.get(request_headers.get("e2b-sandbox-id", ""))
        if sandbox is None:
            raise ConnectError(Code.UNAVAILABLE, "The sandbox was not found")
        return sandbox

    def credentials(self, authorization: str | None) -> tuple[str, int | None]:
        """The user named by envd's ``Basic user:`` header, and the uid its commands run as (None: this process's)."""
        name = "user"
        if authorization and authorization.startswith("Basic "):
            name = base64.b64decode(authorization[6:]).decode().split(":", 1)[0] or "user"
        if os.geteuid() != 0:
            return name, None
        return name, 0 if name == "root" else self.user_uid

    # ---- control API --------------------------------------------------------------------------------------
    async def _create(self, request: Request) -> Response:
        body = await request.json()
        template = body.get("templateID", "base")
        if template not in self.templates:
            return _error(404, f"template '{template}' not found")
        sandbox_id = f"sbx{next(self._ids):04d}{secrets.token_hex(4)}"
        sandbox = StandInSandbox(
            sandbox_id,
            template,
            dict(body.get("metadata") or {}),
            dict(body.get("envVars") or {}),
            int(body.get("timeout") or 300),
        )
        self.sandboxes[sandbox_id] = sandbox
        return JSONResponse(sandbox.describe(), status_code=201)

    async def _connect(self, request: Request) -> Response:
        sandbox = self.sandboxes.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return _error(
                404, f"sandbox \"{request.path_params['sandbox_id']}\" doesn't exist or you don't have access to it"
            )
        return JSONResponse(sandbox.describe(), status_code=200)

    async def _info(self, request: Request) -> Response:
        sandbox = self.sandboxes.get(request.path_params["sandbox_id"])
        if sandbox is None:
            return _error(404, f'sandbox "{request.path_params["sandbox_id"]}" doesn\'t exist')
        return JSONResponse(sandbox.describe(listed=True))

    async def _list(self, request: Request) -> Response:
        wanted = {k: v[0] for k, v in parse_qs(request.query_params.get("metadata", "")).items()}
        found = [
            s.describe(listed=True)
            for s in self.sandboxes.values()
            if all(s.metadata.get(k) == v for k, v in wanted.items())
        ]
        return JSONResponse(found)

    async def _kill(self, request: Request) -> Response:
        sandbox = self.sandboxes.pop(request.path_params["sandbox_id"], None)
        if sandbox is None:
            return _error(404, f'sandbox "{request.path_params["sandbox_id"]}" doesn\'t exist')
        _kill_all(sandbox)
        return Response(status_code=204)

    # ---- envd over HTTP -----------------------------------------------------------------------------------
    async def _health(self, request: Request) -> Response:
        return Response(status_code=204)

    async def _read_file(self, request: Request) -> Response:
        path = request.query_params.get("path", "")
        if not os.path.isfile(path):
            return _error(404, f"path '{path}' does not exist")
        size = os.path.getsize(path)
        self.downloaded_bytes += size

        def chunks():
            with open(path, "rb") as f:
                while chunk := f.read(256 * 1024):
                    yield chunk

        return StreamingResponse(chunks(), media_type="application/octet-stream", headers={"Content-Length": str(size)})

    async def _write_file(self, request: Request) -> Response:
        _, uid = self.credentials(request.headers.get("authorization"))
        username = request.query_params.get("username")
        if username is not None:
            _, uid = self.credentials("Basic " + base64.b64encode(f"{username}:".encode()).decode())
        written = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            for _, upload in form.multi_items():
                target = request.query_params.get("path") or upload.filename
                written.append(_write(target, await upload.read(), uid))
        else:
            data = await request.body()
            if request.headers.get("content-encoding") == "gzip":
                data = gzip.decompress(data)
            written.append(_write(request.query_params["path"], data, uid))
        return JSONResponse([{"name": os.path.basename(p), "type": "file", "path": p} for p in written])


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Knows when the process exits, as envd does, even while a background child still holds its pipes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class _ProcessService:
    """envd's process service: commands run through ``bash``, their output streamed as events."""

    def __init__(self, stand_in: CubeStandIn) -> None:
        self.stand_in = stand_in

    async def start(self, request: process_pb.StartRequest, ctx) -> Any:  # noqa: ANN001
        sandbox = self.stand_in.sandbox_of(ctx.request_headers)
        user, uid = self.stand_in.credentials(ctx.request_headers.get("authorization"))
        config = request.process
        home = "/root" if user == "root" else f"/home/{user}"
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": home,
            "USER": user,
            "LANG": "C.UTF-8",
            **sandbox.env_vars,
            **dict(config.envs),
        }
        self.stand_in.commands.append(config.args[-1] if config.args else config.cmd)
        usable = os.path.isdir(home) and os.access(home, os.X_OK)  # not another account's home (a normal account's tests)
        cwd = config.cwd or (home if usable else "/")
        ids = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitAwareProtocol(limit=2**16, loop=loop),
                config.cmd,
                *config.args,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                **ids,
            )
            proc = asyncio.subprocess.Process(transport, protocol, loop)
        except OSError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot start {config.cmd}: {exc.strerror}") from exc
        sandbox.processes[proc.pid] = transport
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader, name: str) -> None:
            while chunk := await stream.read(65536):
                await queue.put(Oneof(name, chunk))

        readers = [asyncio.create_task(pump(proc.stdout, "stdout")), asyncio.create_task(pump(proc.stderr, "stderr"))]

        async def finish() -> None:
            await protocol.exited.wait()  # not proc.wait(): that also waits for every holder of the pipes
            done, pending = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
            for task in pending:
                task.cancel()
            await queue.put(None)

        finisher = asyncio.create_task(finish())
        try:
            yield _event("start", process_pb.ProcessEvent.StartEvent(pid=proc.pid))
            while (item := await queue.get()) is not None:
                yield _event("data", process_pb.ProcessEvent.DataEvent(output=item))
            code = transport.get_returncode()
            status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
            yield _event(
                "end",
                process_pb.ProcessEvent.EndEvent(exit_code=code if code >= 0 else -1, exited=code >= 0, status=status),
            )
        finally:
            sandbox.processes.pop(proc.pid, None)
            if not finisher.done():
                finisher.cancel()
            if transport.get_returncode() is not None:
                transport.close()

    async def list(self, request: process_pb.ListRequest, ctx) -> process_pb.ListResponse:  # noqa: ANN001
        sandbox = self.stand_in.sandbox_of(ctx.request_headers)
        return process_pb.ListResponse(processes=[process_pb.ProcessInfo(pid=pid) for pid in sandbox.processes])

    async def send_signal(self, request: process_pb.SendSignalRequest, ctx) -> process_pb.SendSignalResponse:  # noqa: ANN001
        sandbox = self.stand_in.sandbox_of(ctx.request_headers)
        pid = request.process.selector.value
        transport = sandbox.processes.get(pid)
        if transport is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        # The proto's SIGNAL_SIGKILL is 9, as in POSIX (the SDK's enum member is named SIGKILL or SIGNAL_SIGKILL
        # depending on its version).
        sig = signal.SIGKILL if getattr(request.signal, "value", request.signal) == signal.SIGKILL.value else signal.SIGTERM
        transport.send_signal(sig)
        return process_pb.SendSignalResponse()

    def __getattr__(self, name: str) -> Any:
        async def unimplemented(*args: Any) -> Any:
            raise ConnectError(Code.UNIMPLEMENTED, f"the stand-in does not implement process.{name}")

        return unimplemented


def _event(kind: str, payload: Any) -> process_pb.StartResponse:
    return process_pb.StartResponse(event=process_pb.ProcessEvent(event=Oneof(kind, payload)))


def _dropping_after_first_event(send):  # noqa: ANN001, ANN202 - ASGI send
    """An ASGI ``send`` that passes the response head and one body chunk, then breaks the connection."""
    bodies = 0

    async def dropping(message: dict) -> None:
        nonlocal bodies
        if message["type"] == "http.response.body":
            bodies += 1
            if bodies > 1:
                raise ConnectionResetError("the stand-in dropped the connection on purpose")
        await send(message)

    return dropping


def _write(path: str, data: bytes, uid: int | None) -> str:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    if uid is not None:
        os.chown(target, uid, uid)
    return str(target)


def _kill_all(sandbox: StandInSandbox) -> None:
    """Kill a sandbox's commands and release their pipes, on the server's loop (callable from any thread)."""
    for transport in list(sandbox.processes.values()):
        transport._loop.call_soon_threadsafe(transport.close)  # close() kills a process that still runs
    sandbox.processes.clear()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


__all__ = ["CubeStandIn", "StandInSandbox"]
