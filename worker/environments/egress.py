"""A build's only way out: an allow-list HTTP proxy the worker serves on the loopback of the build's sandbox.

A build step runs untrusted code (a source distribution's build backend), so it runs with the isolation of a run
except that it may reach the package index: the index, nothing else (not the worker's Redis, not the other hosts of
the private network, not cloud metadata). Its sandbox has a network namespace of its own with nothing but loopback
(``SandboxSpec.served``): no route, no DNS, and no capability to change that. Before the sandbox runs
(``SandboxStart.release``, through ``served_by``) the worker places a listening socket on ``127.0.0.1:3128`` there
(``worker.environments.namespace_listener``) and serves it from its own network (``EgressProxy``); ``HTTPS_PROXY``
and its kin in the step's environment point uv at it. (The Docker runtime's build containers reach it through a
unix socket instead: ``worker.runtimes.container_builds``.)

What passes: ``CONNECT host:port`` (a tunnel; TLS stays end to end, uv checks the index's certificate with its own
CA bundle) and plain-HTTP ``GET``/``HEAD`` requests with an absolute URI (an ``http://`` index), when ``host:port``
is on the allow-list (``AllowList``): the index's host and port (PyPI's two hosts by default) and the operator's
``SKILLRUN_ENV_ALLOWED_HOSTS`` (both in ``worker.environments.egress_policy``). The proxy resolves the name itself, once per step, and connects to an address it
got: for the index's hosts whatever the worker's resolver says (the operator chose the index, and the network's
DNS may well lead it to a private mirror or an intercepting gateway), for the other hosts public addresses only
(``worker.addresses``), so such a name that resolves to a private address, now or on a second lookup (DNS
rebinding), gets nowhere. Anything else is answered with an error status and the reason.

Bounds: ``MAX_CONNECTIONS`` served at once per step (more wait in the listen queue), a request head within
``HEAD_SECONDS`` and ``READ_BYTES``, a connection idle both ways for ``IDLE_SECONDS`` ended, ``READ_BYTES`` buffered
each way (a side that does not read holds the other back). ``close`` ends the listener and every connection when
the step ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

from worker.addresses import public_addresses, resolve
from worker.environments.egress_policy import Address, AllowList, Refused, Request, split_authority
from worker.environments.namespace_listener import listen_inside
from worker.errors import SandboxError, SkillRootError

logger = logging.getLogger(__name__)

PROXY_PORT = 3128
"""Where the proxy listens in a build's namespace (outside the ephemeral range: nothing of the build's is there)."""
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
MAX_CONNECTIONS = 64
"""Connections one step's proxy serves at once (uv opens up to 50 downloads at a time)."""
BACKLOG = 64
READ_BYTES = 64 * 1024
HEAD_SECONDS = 10.0
CONNECT_SECONDS = 15.0
IDLE_SECONDS = 120.0
CLOSE_SECONDS = 5.0

Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter


def proxy_environment() -> dict[str, str]:
    """What a step's environment gets for uv (and the build backends it runs) to go through the proxy."""
    return {"HTTPS_PROXY": PROXY_URL, "HTTP_PROXY": PROXY_URL, "ALL_PROXY": PROXY_URL}


class EgressProxy:
    """One build step's proxy (see the module's description), from its first listener to ``close``."""

    def __init__(self, allowed: AllowList, *, max_connections: int = MAX_CONNECTIONS,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.allowed = allowed
        self.idle_seconds = idle_seconds
        self._slots = asyncio.Semaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._addresses: dict[Address, list[str]] = {}

    async def serve_sandbox(self, uid: int, pid: int, namespace: int) -> None:
        """Listen in the network namespace ``namespace`` of the sandbox whose init is ``pid`` (its user ``uid``) and
        serve it (a ``NetworkServer`` of ``worker.sandbox``, with ``uid`` bound)."""
        try:
            listener = await asyncio.to_thread(listen_inside, pid, uid, namespace, PROXY_PORT, BACKLOG)
        except ProcessLookupError:
            raise
        except OSError as exc:
            raise SandboxError(
                f"the build's way to the package index could not be set up in its sandbox ({exc.strerror or exc}): "
                "the worker must run as root with CAP_SYS_ADMIN (in a container: --cap-add SYS_ADMIN)"
            ) from exc
        self.serve(listener)

    def serve(self, listener: socket.socket) -> None:
        """Serve connections to ``listener`` (a listening socket, now the proxy's) until ``close``."""
        listener.setblocking(False)
        self._listeners.append(listener)
        self._start(self._accept(listener))

    async def close(self) -> None:
        """End every connection and close the listeners; nothing of the proxy is left running."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a build's egress proxy failed", exc_info=task.exception())

    async def _accept(self, listener: socket.socket) -> None:
        """Accept one connection per free slot: past ``MAX_CONNECTIONS`` the rest wait in the listen queue."""
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                connection, _ = await loop.sock_accept(listener)
            except BaseException:
                self._slots.release()
                raise
            self._start(self._connection(connection))

    async def _connection(self, connection: socket.socket) -> None:
        try:
            if connection.family != socket.AF_UNIX:  # asyncio sets it only on sockets made with IPPROTO_TCP
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader, writer = await asyncio.open_connection(sock=connection, limit=READ_BYTES)
        except BaseException:
            connection.close()
            self._slots.release()
            raise
        try:
            await self._answer(reader, writer)
        except Refused as refused:
            logger.info("a build's request was refused: %s", refused)
            writer.write(refused.response(self.allowed))
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.drain(), HEAD_SECONDS)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the build hung up, sent too much, or stalled: nothing to answer
        finally:
            await _end(writer)
            self._slots.release()

    async def _answer(self, reader: Reader, writer: Writer) -> None:
        request = Request.parse(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS))
        if request.method == "CONNECT":
            try:
                destination = split_authority(request.target, None)
            except ValueError as exc:
                raise Refused(400, "Bad Request", str(exc)) from None
            upstream = await self._open(destination)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _Relay(self.idle_seconds).run((reader, writer), upstream, _copy)
            return
        destination = request.destination()
        upstream = await self._open(destination)

        async def requests(client: Reader, origin: Writer, relay: _Relay) -> None:
            """The client's requests, each head checked (the same destination) and rewritten for the origin."""
            current = request
            while True:
                origin.write(current.forwarded())
                await origin.drain()
                try:
                    head = await client.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    origin.write_eof()
                    return
                relay.moved()
                current = Request.parse(head)
                if current.destination() != destination:
                    return  # another host on a kept-alive connection: the client opens a new one

        await _Relay(self.idle_seconds).run((reader, writer), upstream, requests)

    async def _open(self, destination: Address) -> tuple[Reader, Writer]:
        """A connection to ``destination`` if it is allowed, at an address the proxy resolved and vetted."""
        host, port = destination
        if destination not in self.allowed.hosts:
            raise Refused(403, "Forbidden", f"{host}:{port} is not on the allow-list")
        addresses = self._addresses.get(destination)
        if addresses is None:
            vetting = resolve if destination in self.allowed.index else public_addresses
            try:
                addresses = await asyncio.to_thread(vetting, host, port)
            except SkillRootError as exc:
                raise Refused(403, "Forbidden", str(exc)) from None
            except (OSError, UnicodeError) as exc:
                raise Refused(502, "Bad Gateway", f"cannot resolve {host}: {exc}") from None
            self._addresses[destination] = addresses
        failure: BaseException | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port, limit=READ_BYTES),
                                              CONNECT_SECONDS)
            except (OSError, TimeoutError) as exc:
                failure = exc
        raise Refused(502, "Bad Gateway", f"cannot connect to {host}:{port}: {failure or 'no address'}")


Pump = Callable[[Reader, Writer, "_Relay"], Awaitable[None]]


class _Relay:
    """Two connections relayed both ways until both directions end, either fails, or neither moves for ``idle``
    seconds; then both are closed."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self._loop = asyncio.get_running_loop()
        self._moved = self._loop.time()

    def moved(self) -> None:
        self._moved = self._loop.time()

    async def run(self, client: tuple[Reader, Writer], upstream: tuple[Reader, Writer], upward: Pump) -> None:
        """Relay ``client`` to ``upstream`` through ``upward`` and back as it comes."""
        pumps = {asyncio.ensure_future(upward(client[0], upstream[1], self)),
                 asyncio.ensure_future(_copy(upstream[0], client[1], self))}
        try:
            while pumps:
                done, pumps = await asyncio.wait(pumps, timeout=self._moved + self.idle - self._loop.time(),
                                                 return_when=asyncio.FIRST_COMPLETED)
                if [task for task in done if task.exception() is not None]:  # each one's looked at: none is logged
                    return
                if not done and self._loop.time() - self._moved >= self.idle:
                    return
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await _end(upstream[1])


async def _copy(reader: Reader, writer: Writer, relay: _Relay) -> None:
    """Bytes from ``reader`` to ``writer`` as they come (at most ``READ_BYTES`` held), then the end of them."""
    while data := await reader.read(READ_BYTES):
        relay.moved()
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def _end(writer: Writer) -> None:
    """Close a connection: what was written goes out if it can within ``CLOSE_SECONDS`` (not at all when the proxy
    is being closed), then the socket is gone."""
    if asyncio.current_task().cancelling():
        writer.transport.abort()
    else:
        writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_SECONDS)
    except Exception:  # noqa: BLE001 - however the connection ended, it is closed below
        pass
    finally:
        writer.transport.abort()


__all__ = ["BACKLOG", "MAX_CONNECTIONS", "PROXY_PORT", "EgressProxy", "proxy_environment"]
