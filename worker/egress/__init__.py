"""Egress: a sandbox's only way out, an allow-list HTTP proxy the worker serves (``proxy``), what it allows and
reads (``policy``; a run's entries are names of the run contract, ``worker.names``), a tunnel's TLS ClientHello
and its server name (``tls``), which addresses a remote caller may reach (``addresses``) and one HTTP hop sent only to
such an address (``pinned``), and how a sandbox reaches
it: a listener on its loopback (``listener``, the local runtime), or a unix socket and a relay (``relay``, the
Docker runtime)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {  # the policy need not load the proxy
    "worker.egress.policy": ["MALFORMED", "AllowList", "EgressRefusedError", "Request", "Target", "TunnelRefusedError", "effective",
                             "run_allow_list"],
    "worker.egress.proxy": ["EgressProxy", "Refusals", "proxy_environment"],
    "worker.egress.pinned": ["AddressPolicy", "Resolver", "pinned_requests", "send", "send_async"],
})

if TYPE_CHECKING:
    from worker.egress.policy import (MALFORMED, AllowList, EgressRefusedError, Request, Target, TunnelRefusedError, effective,
                                      run_allow_list)
    from worker.egress.pinned import AddressPolicy, Resolver, pinned_requests, send, send_async
    from worker.egress.proxy import EgressProxy, Refusals, proxy_environment
