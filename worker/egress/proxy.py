"""A sandbox's only way out: an allow-list HTTP proxy the worker serves on the loopback of the sandbox.

Build steps use it to reach the package index (below), and runs whose request carries an egress allow-list
(``RunRequest.egress``, ``worker.names``) to reach those hosts: the same proxy, the same checks, the
run's allow-list instead of the index's; each refusal is counted and listed (``refusals``) in the run's result.

A build step runs untrusted code (a source distribution's build backend), so it runs with the isolation of a run
except that it may reach the package index: the index, nothing else (not the worker's Redis, not the other hosts of
the private network, not cloud metadata). Its sandbox has a network namespace of its own with nothing but loopback
(``SandboxSpec.served``): no route, no DNS, and no capability to change that. Before the sandbox runs
(``SandboxStart.release``, through ``served_by``) the worker places a listening socket on ``127.0.0.1:3128`` there
(``worker.egress.listener``) and serves it from its own network (``EgressProxy``); ``HTTPS_PROXY``
and its kin in the step's environment point uv at it. (The Docker runtime's build containers reach it through a
unix socket instead: ``worker.runtimes.docker.builds``.)

What passes: ``CONNECT host:port`` (a tunnel; TLS stays end to end, uv checks the index's certificate with its own
CA bundle) and plain-HTTP ``GET``/``HEAD`` requests with an absolute URI (an ``http://`` index), when ``host:port``
is on the allow-list (``AllowList``): the index's host and port (PyPI's two hosts by default) and the operator's
``SKILLRUN_ENV_ALLOWED_HOSTS`` (both in ``worker.egress.policy``). The proxy resolves the name itself, once per
step or run, and connects to an address it got: for the index's hosts whatever the worker's resolver says (the
operator chose the index, and the network's DNS may well lead it to a private mirror or an intercepting gateway),
for the other hosts public addresses only (``worker.egress.addresses``), so such a name that resolves to a private
address, now or on a second lookup (DNS rebinding), gets nowhere; a name the operator pinned
(``SKILLRUN_EGRESS_PINNED_HOSTS``, for tests and private deployments) goes to its pinned address without a lookup.
Anything else is answered with an error status and the reason, and counted and listed (``refusals``) with the
destination as the request named it and nothing else of the request (``worker.egress.policy``).

The host that is checked is the host that is served (no domain fronting): a plain request's ``Host`` header must
name its URI's host and port, on every request of a kept-alive connection (a later one the proxy refuses is
answered after the origin's last answer, and ends the connection; one to another host ends it unanswered, and the
client opens a new connection, checked anew); a request head holding a control character other than a tab (a bare
CR, say) is refused; and a tunnel must begin with a TLS ClientHello whose server name is its ``CONNECT`` host and
that hides no other (``worker.egress.tls``), or it is closed with nothing sent on. The start of the server's answer
is read as well: when it is a HelloRetryRequest, the client's second ClientHello is checked as the first before it is
sent on.

The worker's log says that a request was refused, with the refusal's status and ``EgressRefusedError.kind`` only: never its
destination or reason, which hold what the request named (a secret used as a host name, say) and are redacted only
in the run's result.

Bounds: ``MAX_CONNECTIONS`` served at once per step (more wait in the listen queue), a request head within
``HEAD_SECONDS`` and ``READ_BYTES``, a tunnel's ClientHello, the start of its server's answer, and the second
ClientHello after a HelloRetryRequest each within ``HELLO_SECONDS`` (or the idle bound, when that is shorter) and
``worker.egress.tls.HELLO_BYTES``, a connection idle both ways for ``IDLE_SECONDS`` ended,
``READ_BYTES`` buffered each way (a side that does not read holds the other back). ``close`` ends the listener and
every connection when the step ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from worker.egress.addresses import first_private, resolve
from worker.config import get_worker_settings
from worker.egress.listener import listen_inside
from worker.egress.policy import Address, AllowList, EgressRefusedError, Request, Target
from worker.egress.tls import read_client_hello, read_server_answer
from worker.errors import EgressError, SandboxError

logger = logging.getLogger(__name__)

PROXY_PORT = 3128
"""Where the proxy listens in a build's namespace (outside the ephemeral range: nothing of the build's is there)."""
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
MAX_CONNECTIONS = 64
"""Connections one step's proxy serves at once (uv opens up to 50 downloads at a time)."""
BACKLOG = 64
READ_BYTES = 64 * 1024
HEAD_SECONDS = 10.0
HELLO_SECONDS = 10.0
"""How long a tunnel's client has to send its TLS ClientHello once the tunnel is open (and its server to answer it,
and the client its second one after a HelloRetryRequest)."""
CONNECT_SECONDS = 15.0
IDLE_SECONDS = 120.0
CLOSE_SECONDS = 5.0
MAX_REFUSALS_LISTED = 50
"""Refusals listed in a run's result (all are counted)."""

Reader, Writer = asyncio.StreamReader, asyncio.StreamWriter


def proxy_environment(url: str = PROXY_URL) -> dict[str, str]:
    """What a sandbox's environment gets for its programs to go through the proxy (each name in both cases: curl
    reads only the lowercase ``http_proxy``, Python and uv either)."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    return {**{name: url for name in names}, **{name.lower(): url for name in names}}


def pinned_hosts(text: str | None = None) -> dict[str, str]:
    """The operator's ``SKILLRUN_EGRESS_PINNED_HOSTS`` (``name=address`` items) as a mapping; ``EgressError`` for a
    bad item."""
    text = get_worker_settings().egress_pinned_hosts if text is None else text
    pinned = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, address = (part.strip() for part in item.partition("="))
        try:
            if not name:
                raise ValueError(item)
            pinned[name.lower().rstrip(".")] = str(ipaddress.ip_address(address))
        except ValueError:
            raise EgressError(f"SKILLRUN_EGRESS_PINNED_HOSTS: {item!r} is not name=address (an IP address, such "
                              "as api.internal.example=10.0.0.5)") from None
    return pinned


class Refusals:
    """What a proxy refused: every refusal counted, the first ``MAX_REFUSALS_LISTED`` listed (destination, reason:
    a run's ``RunResult.egress_refusals``)."""

    def __init__(self) -> None:
        self.count = 0
        self.listed: list[tuple[str, str]] = []

    def add(self, refused: EgressRefusedError) -> None:
        self.count += 1
        if len(self.listed) < MAX_REFUSALS_LISTED:
            self.listed.append((refused.destination[:300], str(refused)[:500]))


class EgressProxy:
    """One build step's proxy (see the module's description), from its first listener to ``close``."""

    def __init__(self, allowed: AllowList, *, max_connections: int = MAX_CONNECTIONS,
                 idle_seconds: float = IDLE_SECONDS, pinned: dict[str, str] | None = None) -> None:
        self.allowed = allowed
        self.idle_seconds = idle_seconds
        self.pinned = pinned_hosts() if pinned is None else pinned
        self.refusals = Refusals()
        self._slots = asyncio.Semaphore(max_connections)
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._addresses: dict[Address, list[str]] = {}

    async def serve_sandbox(self, uid: int, pid: int, namespace: int) -> None:
        """Listen in the network namespace ``namespace`` of the sandbox whose init is ``pid`` (its user ``uid``) and
        serve it (a ``NetworkServer`` of ``worker.sandbox.bubblewrap``, with ``uid`` bound)."""
        try:
            listener = await asyncio.to_thread(listen_inside, pid, uid, namespace, PROXY_PORT, BACKLOG)
        except ProcessLookupError:
            raise
        except OSError as exc:
            raise SandboxError(
                f"the sandbox's egress proxy could not be set up in it ({exc.strerror or exc}): "
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
            logger.warning("a sandbox's egress proxy failed", exc_info=task.exception())

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
        except EgressRefusedError as refused:
            logger.info("a sandbox's request was refused (%d %s): %s", refused.status, refused.reason, refused.kind)
            self.refusals.add(refused)
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
        target = request.tunnel() if request.method == "CONNECT" else request.destination()
        upstream = await self._open(target)
        if request.method == "CONNECT":
            await self._tunnel((reader, writer), upstream, target)
        else:
            await self._forward((reader, writer), upstream, request, target)

    async def _tunnel(self, client: tuple[Reader, Writer], upstream: tuple[Reader, Writer], target: Target) -> None:
        """A tunnel to ``target``: its ClientHello checked (``worker.egress.tls``; nothing is sent on before), the
        server's answer read up to what tells a HelloRetryRequest, then relayed both ways; after a HelloRetryRequest
        the client's next ClientHello is checked as the first before anything more of the client's is sent on (the
        server's side relayed meanwhile)."""
        client[1].write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        seconds = min(HELLO_SECONDS, self.idle_seconds)
        try:
            upstream[1].write(await read_client_hello(client[0], target, seconds))
            answer, retry = await read_server_answer(upstream[0], target, seconds)
        except BaseException:
            await _end(upstream[1])
            raise
        client[1].write(answer)

        async def retried(reader: Reader, origin: Writer, relay: _Relay) -> None:
            origin.write(await read_client_hello(reader, target, seconds, retried=True))
            relay.moved()
            await _copy(reader, origin, relay)

        await _Relay(self.idle_seconds).run(client, upstream, retried if retry else _copy, tunnel=True)

    async def _forward(self, client: tuple[Reader, Writer], upstream: tuple[Reader, Writer], request: Request,
                       target: Target) -> None:
        """Plain-HTTP requests to ``target``, the first ``request`` and those the client sends after it on the same
        connection, each checked and rewritten for the origin; a later one the proxy refuses is raised once the
        origin's answers have all gone back."""
        later: list[EgressRefusedError] = []

        async def requests(reader: Reader, origin: Writer, relay: _Relay) -> None:
            current = request
            while True:
                origin.write(current.forwarded())
                await origin.drain()
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                relay.moved()
                try:
                    current = Request.parse(head)
                    if current.destination().address != target.address:
                        break  # another host on a kept-alive connection: the client opens a new one
                except EgressRefusedError as refused:
                    later.append(refused)
                    break
            origin.write_eof()

        await _Relay(self.idle_seconds).run(client, upstream, requests, tunnel=False)
        if later:
            raise later[0]

    async def _open(self, target: Target) -> tuple[Reader, Writer]:
        """A connection to ``target`` if it is allowed, at an address the proxy resolved and vetted."""
        (host, port), named = target.address, target.named
        if not self.allowed.allows(target.address):
            raise EgressRefusedError(403, "Forbidden", f"{named} is not on the allow-list", named, kind="not on the allow-list")
        addresses = self._addresses.get(target.address)
        if addresses is None and host in self.pinned:
            addresses = [self.pinned[host]]
        if addresses is None:
            index = target.address in self.allowed.index  # the operator's own: any address, its failures the gateway's
            try:
                addresses = await asyncio.to_thread(resolve, host, port)
            except (OSError, UnicodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a name that resolves"
                status = (502, "Bad Gateway") if index else (403, "Forbidden")
                raise EgressRefusedError(*status, f"cannot resolve {named}: {why}", named,
                              kind="name that does not resolve") from None
            private = None if index else first_private(addresses)
            if private is not None:
                raise EgressRefusedError(403, "Forbidden", f"{named} resolves to a private or local address ({private})", named,
                              kind="private address")
            self._addresses[target.address] = addresses
        failure: BaseException | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port, limit=READ_BYTES),
                                              CONNECT_SECONDS)
            except (OSError, TimeoutError) as exc:
                failure = exc
        raise EgressRefusedError(502, "Bad Gateway", f"cannot connect to {named}: {failure or 'no address'}", named,
                      kind="host that cannot be reached")


Pump = Callable[[Reader, Writer, "_Relay"], Awaitable[None]]


class _Relay:
    """Two connections relayed both ways until they are done (below), either fails (a pump's ``EgressRefusedError`` is raised
    for the caller to report), or neither moves for ``idle`` seconds; then the upstream one is closed (the client's
    is the caller's)."""

    def __init__(self, idle: float) -> None:
        self.idle = idle
        self._loop = asyncio.get_running_loop()
        self._moved = self._loop.time()

    def moved(self) -> None:
        self._moved = self._loop.time()

    async def run(self, client: tuple[Reader, Writer], upstream: tuple[Reader, Writer], upward: Pump, *,
                  tunnel: bool) -> None:
        """Relay ``client`` to ``upstream`` through ``upward`` and back as it comes: a tunnel until both directions
        end (each end passed on), plain HTTP until the origin's side ends (nothing more can be asked of it; the
        client's side is left open for the caller to answer a later request it refused, then close)."""
        back = asyncio.ensure_future(_copy(upstream[0], client[1], self, end=tunnel))
        pumps = {asyncio.ensure_future(upward(client[0], upstream[1], self)), back}
        try:
            while pumps:
                done, pumps = await asyncio.wait(pumps, timeout=self._moved + self.idle - self._loop.time(),
                                                 return_when=asyncio.FIRST_COMPLETED)
                # each one's looked at: none is logged
                failures = [exc for task in done if (exc := task.exception()) is not None]
                refusals = [failure for failure in failures if isinstance(failure, EgressRefusedError)]
                if refusals:
                    raise refusals[0]
                if failures:
                    return
                if (back in done and not tunnel) or (not done and self._loop.time() - self._moved >= self.idle):
                    return
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await _end(upstream[1])


async def _copy(reader: Reader, writer: Writer, relay: _Relay, end: bool = True) -> None:
    """Bytes from ``reader`` to ``writer`` as they come (at most ``READ_BYTES`` held), then, with ``end``, the end
    of them."""
    while data := await reader.read(READ_BYTES):
        relay.moved()
        writer.write(data)
        await writer.drain()
    if end and writer.can_write_eof():
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


__all__ = ["BACKLOG", "MAX_CONNECTIONS", "MAX_REFUSALS_LISTED", "PROXY_PORT", "EgressProxy", "Refusals",
           "pinned_hosts", "proxy_environment"]
