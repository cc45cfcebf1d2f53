"""Egress: a sandbox's only way out, an allow-list HTTP proxy the worker serves (``proxy``), what it allows and
reads (``policy``), a tunnel's TLS ClientHello and its server name (``tls``), a run's allow-list entries
(``entries``), and how a sandbox reaches it: a listener on its loopback (``listener``, the local runtime), or a unix
socket and a relay (``relay``, the Docker runtime)."""

from worker.egress.entries import Entry, effective, parse_entries, parse_entry, run_allow_list
from worker.egress.policy import MALFORMED, AllowList, Refused, Request, Target, TunnelRefused
from worker.egress.proxy import EgressProxy, Refusals, proxy_environment

__all__ = ["MALFORMED", "AllowList", "EgressProxy", "Entry", "Refusals", "Refused", "Request", "Target",
           "TunnelRefused", "effective", "parse_entries", "parse_entry", "proxy_environment", "run_allow_list"]
