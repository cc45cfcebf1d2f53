"""Egress: a sandbox's only way out, an allow-list HTTP proxy the worker serves (``proxy``), what it allows and
reads (``policy``), a tunnel's TLS ClientHello and its server name (``tls``), a run's allow-list entries
(``entries``), and how a sandbox reaches it: a listener on its loopback (``listener``, the local runtime), or a unix
socket and a relay (``relay``, the Docker runtime)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {  # a run's allow-list entries need not load the proxy
    "worker.egress.entries": ["Entry", "effective", "parse_entries", "parse_entry"],
    "worker.egress.policy": ["MALFORMED", "AllowList", "Refused", "Request", "Target", "TunnelRefused", "run_allow_list"],
    "worker.egress.proxy": ["EgressProxy", "Refusals", "proxy_environment"],
})

if TYPE_CHECKING:
    from worker.egress.entries import Entry, effective, parse_entries, parse_entry
    from worker.egress.policy import MALFORMED, AllowList, Refused, Request, Target, TunnelRefused, run_allow_list
    from worker.egress.proxy import EgressProxy, Refusals, proxy_environment
