"""A listening socket of the worker's, placed on the loopback of a sandbox's network namespace.

A build step's sandbox has a network namespace of its own with nothing but loopback (no route out); its way to the
package index is a socket the worker listens on inside it and serves from its own network
(``worker.egress.proxy``). A socket belongs to the namespace it was made in, wherever it is used from, so
making it takes a thread of the worker in that namespace for a moment. That thread is one of its own, which ends
after: nothing else of the worker ever runs in a sandbox's namespace, even should leaving it fail.

The namespace is opened as the sandbox's user (``worker.sandbox.user_network.open_network_namespace``: a worker in a
container may not open it as root) and joined as root (``setns`` needs CAP_SYS_ADMIN, which the worker has for
bubblewrap anyway, over the namespace: root has it over the sandbox's user namespaces, made by a user of its own).
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import threading

from worker.sandbox.user_network import open_network_namespace

CLONE_NEWNET = 0x40000000


def listen_inside(pid: int, uid: int, namespace: int, port: int, backlog: int) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1:port`` (its loopback is up) in the network namespace ``namespace`` (its
    inode) of process ``pid`` of the sandbox user ``uid``. ``ProcessLookupError`` if that process is gone, or no
    longer in that namespace."""
    made: list[socket.socket | BaseException] = []
    thread = threading.Thread(target=_place, args=(pid, uid, namespace, port, backlog, made),
                              name="skillrun-namespace-listener")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _place(pid: int, uid: int, namespace: int, port: int, backlog: int,
           made: list[socket.socket | BaseException]) -> None:
    """``listen_inside``'s thread: join the namespace, make the socket there, hand it (or what failed) over."""
    try:
        netns = open_network_namespace(pid, uid, namespace)
        try:
            if _libc().setns(netns, CLONE_NEWNET) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"cannot join the sandbox's network namespace: {os.strerror(error)}")
        finally:
            os.close(netns)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen(backlog)
        except BaseException:
            listener.close()
            raise
        made.append(listener)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
        made.append(exc)


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, for ``setns`` (``os.setns`` is Python 3.12's)."""
    return ctypes.CDLL(None, use_errno=True)


__all__ = ["listen_inside"]
