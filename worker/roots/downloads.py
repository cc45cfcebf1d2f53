"""Downloads of URL roots and archives: streamed within ``FetchLimits``, each hop sent only to vetted addresses
(``worker.egress.pinned``).

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

from worker.egress import pinned
from worker.errors import AddressRefusedError, SkillRootError, UnsafeArchiveError
from worker.roots.archives import FetchLimits


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
    """Send one hop; without ``allow_private_addresses`` only to an address of the host that was vetted."""
    if url.scheme not in ("http", "https"):
        raise SkillRootError(f"{url}: only http and https URLs can be fetched")
    try:
        return pinned.send(client, url, headers, pinned.AddressPolicy(not limits.allow_private_addresses))
    except AddressRefusedError as exc:
        if exc.address is not None:
            raise SkillRootError(f"{url}: refused, {exc.host!r} is a private or local address ({exc.address})") from None
        raise SkillRootError(f"{url}: cannot resolve {exc.host!r}") from None


__all__ = ["download"]
