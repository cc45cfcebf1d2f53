"""Downloads of URL roots and archives: streamed within ``FetchLimits``, each hop sent only to vetted addresses.

Kept apart from ``worker.roots.sources`` so that resolving a local folder (every command of the CLI) does not import
httpx.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from worker.egress.addresses import public_addresses
from worker.roots.archives import FetchLimits
from worker.errors import SkillRootError, UnsafeArchiveError


def download(
    url: str, target: Path, limits: FetchLimits, headers: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """Stream ``url`` into ``target`` within the limits; return (sha256, content type). ``headers`` (a credential)
    go only to ``url``'s own origin: a redirect elsewhere does not get them."""
    digest = hashlib.sha256()
    deadline = time.monotonic() + limits.download_seconds
    timeout = httpx.Timeout(limits.download_seconds, connect=limits.connect_seconds)
    try:
        with httpx.Client(timeout=timeout) as client, contextlib.closing(_get(client, url, limits, headers or {})) as response:
            if response.status_code != 200:
                raise SkillRootError(f"{url}: the server answered HTTP {response.status_code}")
            declared = response.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limits.max_download_bytes:
                raise UnsafeArchiveError(f"{url}: {declared} bytes is more than the {limits.max_download_bytes}-byte download limit")
            size = 0
            with open(target, "wb") as out:
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > limits.max_download_bytes:
                        raise UnsafeArchiveError(f"{url}: the download exceeds the {limits.max_download_bytes}-byte limit")
                    if time.monotonic() > deadline:
                        raise SkillRootError(f"{url}: the download took longer than {limits.download_seconds:g} s")
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest(), response.headers.get("content-type", "")
    except httpx.TimeoutException as exc:
        raise SkillRootError(f"{url}: timed out ({type(exc).__name__})") from exc
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode
        raise SkillRootError(f"{url}: {type(exc).__name__}: {_without(str(exc), headers)}") from None


def _without(message: str, headers: Mapping[str, str] | None) -> str:
    """``message`` with the values of ``headers`` (a credential) taken out: an error may quote a header it refused."""
    for value in (headers or {}).values():
        for secret in {value, *value.split()}:
            if len(secret) >= 8:
                message = message.replace(secret, "[redacted]")
    return message


def _get(client: httpx.Client, url: str, limits: FetchLimits, headers: Mapping[str, str]) -> httpx.Response:
    """``GET url`` as a stream, following redirects here rather than in httpx, so each hop goes through ``_send``."""
    target = origin = httpx.URL(url)
    for _ in range(limits.max_redirects + 1):
        same_origin = (target.scheme, target.host, target.port) == (origin.scheme, origin.host, origin.port)
        response = _send(client, target, limits, headers if same_origin else {})
        if not response.is_redirect:
            return response
        response.close()
        target = target.join(response.headers["location"])
    raise SkillRootError(f"{url}: more than {limits.max_redirects} redirects")


def _send(client: httpx.Client, url: httpx.URL, limits: FetchLimits, headers: Mapping[str, str]) -> httpx.Response:
    """Send one hop. Without ``allow_private_addresses`` the host is resolved once, every address it has is vetted
    (``worker.egress.addresses``), and the request is sent to a vetted address itself: the IP goes in the request URL,
    the name in the ``Host`` header and as the TLS server name (so certificates are still checked against the name).
    No second lookup happens, so the connection cannot go anywhere the check did not see (DNS rebinding)."""
    if url.scheme not in ("http", "https"):
        raise SkillRootError(f"{url}: only http and https URLs can be fetched")
    if limits.allow_private_addresses:
        return client.send(client.build_request("GET", url, headers=headers), stream=True)
    host = url.raw_host.decode("ascii")
    try:
        addresses = public_addresses(host, url.port or (443 if url.scheme == "https" else 80))
    except SkillRootError as exc:
        raise SkillRootError(f"{url}: {exc}") from None
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    failure: httpx.ConnectError | None = None
    for address in addresses:  # in the resolver's order, as a connection to the name would try them
        request = client.build_request("GET", url.copy_with(host=address), headers={**headers, "Host": url.netloc.decode("ascii")},
                                       extensions=extensions)
        try:
            return client.send(request, stream=True)
        except httpx.ConnectError as exc:
            failure = exc
    raise failure or SkillRootError(f"{url}: {host!r} has no address")


__all__ = ["download"]
