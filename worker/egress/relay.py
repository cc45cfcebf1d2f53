"""How a container with no network reaches the worker's egress proxy: a unix socket the worker listens on in a
folder the container mounts (``listen_in_folder``), and in the container a relay (``RELAY``, run by the image's
``python3``) that listens on the loopback port ``HTTPS_PROXY`` names, starts the command and carries each
connection to that socket. The relay is no guard (it runs as the sandbox's user, which may kill or bypass it and
reach the socket itself): the proxy is. Used by the Docker runtime's build steps
(``worker.runtimes.docker.builds``) and its runs with an egress allow-list (``worker.runtimes.docker.runtime``).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from worker.egress.proxy import BACKLOG

RELAY = r"""
import os, socket, subprocess, sys, threading
path, port, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
here = os.getcwd()
folder, path = os.path.split(path)
if folder:
    os.chdir(folder)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # an earlier run's connections may be in TIME_WAIT
listener.bind(("127.0.0.1", port))
listener.listen(64)

def pipe(source, sink):
    try:
        data = source.recv(65536)
        while data:
            sink.sendall(data)
            data = source.recv(65536)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def serve(client):
    with client, socket.socket(socket.AF_UNIX) as proxy:
        try:
            proxy.connect(path)
        except OSError:
            return
        back = threading.Thread(target=pipe, args=(proxy, client), daemon=True)
        back.start()
        pipe(client, proxy)
        back.join()

def accept():
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(client,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
code = subprocess.call(command, cwd=here)
sys.exit(128 - code if code < 0 else code)
"""
"""Run in the container as ``python3 -I -c RELAY <socket> <port> <command...>``: listens on the loopback port,
runs the command (in the folder the relay started in), relays each connection to the proxy's unix socket, and exits
as the command did. The socket is named relative to that folder, or by a path whose folder the relay moves into
(a socket's path may not be longer than 107 bytes). Its connections
are TCP_NODELAY, as the proxy's are: a small reply held back for the client's delayed ACK costs a build ~80 ms."""


def listen_in_folder(folder: Path, name: str, uid: int | None) -> socket.socket:
    """A unix socket listening at ``folder/name``, which the sandbox's user ``uid`` may connect to. Bound through
    the folder's descriptor (the folder's own path may be longer than a socket's may be); the chown does not follow
    links, and a name the sandbox made first (a file, a link) fails the bind instead of being replaced."""
    directory = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(f"/proc/self/fd/{directory}/{name}")
        if uid is not None:
            os.chown(name, uid, uid, dir_fd=directory, follow_symlinks=False)
        listener.listen(BACKLOG)
    except BaseException:
        listener.close()
        raise
    finally:
        os.close(directory)
    return listener


__all__ = ["RELAY", "listen_in_folder"]
