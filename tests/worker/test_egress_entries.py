"""A run's egress allow-list on its own (``worker.egress``): entries and what they cover, the intersection a run
gets, what the proxy's list allows, and the operator's pinned hosts."""

from __future__ import annotations

import pytest

from worker.egress import effective, run_allow_list
from worker.names import Entry, parse_entry
from worker.egress.proxy import pinned_hosts
from worker.errors import EgressError


def test_a_wildcard_covers_the_names_under_its_domain_on_its_port_only():
    wildcard = parse_entry("*.example.com")
    assert wildcard == Entry("example.com", 443, wildcard=True) and str(wildcard) == "*.example.com:443"
    assert wildcard.covers(parse_entry("api.example.com")) and wildcard.covers(parse_entry("*.eu.example.com"))
    assert not wildcard.covers(parse_entry("example.com"))
    assert not wildcard.covers(parse_entry("api.example.com:8443"))
    assert not wildcard.covers(parse_entry("evilexample.com"))
    assert not parse_entry("api.example.com").covers(wildcard)


def test_the_proxy_allows_exactly_the_listed_names_and_those_under_a_wildcard():
    allowed = run_allow_list(["api.github.com", "*.example.com:8443"])
    assert allowed.allows(("api.github.com", 443))
    assert allowed.allows(("a.b.example.com", 8443))
    for destination in [("api.github.com", 80), ("github.com", 443), ("example.com", 8443),
                        ("evilexample.com", 8443), ("a.example.com", 443), ("api.github.com.evil.org", 443)]:
        assert not allowed.allows(destination), destination
    assert "skillrun egress set" in allowed.refusal_hint() and "*.example.com:8443" in allowed.refusal_hint()


def test_a_run_gets_the_narrower_entry_of_each_pair():
    assert effective(["*.github.com", "api.example.com:8443"], ["api.github.com", "*.example.com:8443"]) == [
        "api.example.com:8443", "api.github.com:443"]
    assert effective(["*.a.example.com"], ["*.example.com"]) == ["*.a.example.com:443"]
    assert effective(["api.github.com"], ["api.github.com:8443"]) == []  # another port is another destination


def test_pinned_hosts_are_names_and_addresses_or_a_clear_error():
    assert pinned_hosts("API.internal.example.=10.0.0.5, b.example=::1") == {
        "api.internal.example": "10.0.0.5", "b.example": "::1"}
    assert pinned_hosts("") == {}
    for bad in ("api.example.com", "api.example.com=", "api.example.com=not-an-address", "=10.0.0.5"):
        with pytest.raises(EgressError, match="SKILLRUN_EGRESS_PINNED_HOSTS: .* is not name=address"):
            pinned_hosts(bad)
