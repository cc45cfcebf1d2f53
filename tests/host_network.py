"""The host's own network, as tests of network runs need it: an address of the host that is not loopback.

There is no guarantee of internet access where the tests run, so "the outside" a network run must reach is a
server the test starts on such an address; the host's loopback is what a run must not reach.
"""

from __future__ import annotations

import socket

from tests.services import unavailable


def host_address() -> str:
    """An IPv4 address of this host other than loopback: the one its default route leaves from, or else the first
    one ``getaddrinfo`` knows for the host's name. Fails under CI, and skips elsewhere, where there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: only picks a route, sends nothing
            return probe.getsockname()[0]
        except OSError:
            pass
    try:
        known = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        known = []
    for *_, (address, _port) in known:
        if not address.startswith("127."):
            return address
    unavailable("this host has no IPv4 address but loopback: give it one (a network run's test needs a server "
                "outside the run that is not on the host's loopback)")
    raise AssertionError("unreachable")
