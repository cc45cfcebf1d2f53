"""Whether this host has a skill's Debian packages: the local runtime runs commands on the host's own system.

Asked of ``dpkg-query`` and kept until dpkg's database changes (its status file's stamp), so a skill's page or a
prepare costs one ``stat`` once known. A host without dpkg cannot be asked (``None``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections import OrderedDict

from worker.environments.images import ImageStatus

DPKG_STATUS = "/var/lib/dpkg/status"
HOST_TAG = "host"
"""The ``ImageStatus.tag`` of the local runtime's part: the host itself."""
MAX_KNOWN_SETS = 1024
"""Package sets whose answer is kept (the least recently asked goes first: libraries can declare any number)."""


class HostPackages:
    """The Debian packages installed on this host, as dpkg says."""

    def __init__(self, status_file: str = DPKG_STATUS) -> None:
        self.status_file = status_file
        self._known: OrderedDict[tuple[str, ...], tuple[tuple[int, int], list[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def missing(self, packages: tuple[str, ...]) -> list[str] | None:
        """Those of ``packages`` not installed here (blocks: runs dpkg-query once per set and database); ``None``
        where the host has no dpkg."""
        try:
            info = os.stat(self.status_file)
        except OSError:
            return None
        stamp = (info.st_mtime_ns, info.st_size)
        with self._lock:
            known = self._known.get(packages)
            if known is not None and known[0] == stamp:
                self._known.move_to_end(packages)
                return list(known[1])
        query = shutil.which("dpkg-query")
        if query is None:
            return None
        names = [package.split(":", 1)[0] for package in packages]
        answer = subprocess.run([query, "-W", "-f", "${Package}\\t${db:Status-Status}\\n", "--", *names],
                                capture_output=True, text=True, timeout=60)
        installed = {line.split("\t")[0] for line in answer.stdout.splitlines() if line.endswith("\tinstalled")}
        missing = [package for package, name in zip(packages, names) if name not in installed]
        with self._lock:
            self._known[packages] = (stamp, missing)
            self._known.move_to_end(packages)
            while len(self._known) > MAX_KNOWN_SETS:
                self._known.popitem(last=False)
        return missing

    def status(self, packages: tuple[str, ...]) -> ImageStatus:
        """The local runtime's part of a skill's state: ready when the host has every package."""
        missing = self.missing(packages)
        if missing is None:
            return ImageStatus(HOST_TAG, "ready", packages, "not checked: this host has no dpkg", on_host=True)
        if not missing:
            return ImageStatus(HOST_TAG, "ready", packages, on_host=True)
        listed = " ".join(missing)
        message = (f"not installed on this host: {', '.join(missing)}. The local runtime runs commands on the host's "
                   f"own system: install them (apt-get install {listed}) or run the skill on the Docker runtime, "
                   "which builds an image with them")
        return ImageStatus(HOST_TAG, "failed", packages, message, summary=message, on_host=True)
