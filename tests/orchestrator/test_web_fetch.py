"""WebFetchTool against real HTTP servers on loopback, through real httpx.

The tool refuses loopback by design, so tests that need a fetchable page name the test server in ``private_hosts``
(and, for names the system cannot resolve, give a ``resolver``); every default-refusal test uses neither.
"""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import ssl
import threading
import time

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.context import InvocationContext
from orchestrator.tools import FetchResult, WebFetchTool
from orchestrator.tools.web.cache import TTLCache
from tests.web_server import ConnectProxy, WebServer

PAGE = b"""<html><head><title>Example Domain</title><style>body{color:red}</style>
<script>document.write('tracking')</script></head><body><h1>Example Domain</h1>
<p>This domain is for use in <a href="https://iana.org/">examples</a>.</p><svg><text>logo</text></svg></body></html>"""
HTML = {"Content-Type": "text/html; charset=utf-8"}
RESULT_KEYS = {"url", "status_code", "status_text", "content_type", "content", "bytes", "duration_ms", "cached", "error"}


@pytest.fixture
def web():
    server = WebServer().start()
    server.routes["/page"] = (200, HTML, PAGE)
    yield server
    server.stop()


def local(**options) -> WebFetchTool:
    """A tool that may reach the loopback test server (named 127.0.0.1)."""
    return WebFetchTool(private_hosts=["127.0.0.1"], **options)


async def fetch(tool: WebFetchTool, **args) -> dict:
    return await tool.run_async(tool_context=InvocationContext.__new__(InvocationContext), args=args)


async def test_html_page_becomes_markdown_in_the_guides_result_shape(web):
    result = await fetch(local(), url=web.url("/page"))
    assert set(result) == RESULT_KEYS
    assert result["error"] == "" and result["status_code"] == 200 and result["status_text"] == "OK"
    assert result["content_type"] == "text/html" and result["url"] == web.url("/page")
    assert "# Example Domain" in result["content"] and "[examples](https://iana.org/)" in result["content"]
    assert "tracking" not in result["content"] and "color:red" not in result["content"] and "logo" not in result["content"]
    assert result["bytes"] == len(result["content"].encode()) and result["cached"] is False
    assert web.requests[0].headers["User-Agent"] == "trpc-agent-python-webfetch/1.0"


async def test_text_types_are_returned_as_they_are_and_binary_ones_refused(web):
    web.routes["/data.json"] = (200, {"Content-Type": "application/json"}, b'{"a": [1, 2]}')
    web.routes["/a.pdf"] = (200, {"Content-Type": "application/pdf"}, b"%PDF-1.7 ...")
    web.routes["/blob"] = (200, {}, b"\x00\x01\x02binary")
    tool = local()
    assert (await fetch(tool, url=web.url("/data.json")))["content"] == '{"a": [1, 2]}'
    pdf = await fetch(tool, url=web.url("/a.pdf"))
    assert pdf["error"] == "UNSUPPORTED_CONTENT_TYPE: application/pdf" and pdf["content"] == ""
    untyped = await fetch(tool, url=web.url("/blob"))
    assert untyped["error"].startswith("UNSUPPORTED_CONTENT_TYPE:") and untyped["content"] == ""


async def test_an_error_status_is_http_status(web):
    result = await fetch(local(), url=web.url("/missing"))
    assert result["error"] == "HTTP_STATUS: 404 Not Found" and result["status_code"] == 404


@pytest.mark.parametrize("host", [
    "127.0.0.1", "localhost", "2130706433", "0x7f.1", "127.1", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]",
    "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "169.254.169.254", "10.0.0.1", "192.168.1.1", "100.64.0.1",
])
async def test_private_and_loopback_addresses_are_refused_by_default(web, host):
    result = await fetch(WebFetchTool(), url=f"http://{host}:{web.port}/page")
    assert set(result) == RESULT_KEYS
    assert result["error"].startswith("SSRF_BLOCKED_URL: ") and "resolves to private/reserved address" in result["error"]
    assert result["status_code"] == 0 and result["content"] == ""
    assert web.requests == []


async def test_localhost_error_reads_as_the_guide_shows(web):
    result = await fetch(WebFetchTool(), url=f"http://localhost:{web.port}")
    assert result["url"] == f"http://localhost:{web.port}"
    assert result["error"] == "SSRF_BLOCKED_URL: localhost resolves to private/reserved address 127.0.0.1"


async def test_octal_spelling_of_loopback_is_refused(web):
    result = await fetch(WebFetchTool(), url=f"http://0177.0.0.1:{web.port}/page")
    assert result["error"].split(":")[0] in ("SSRF_BLOCKED_URL", "INVALID_URL")
    assert web.requests == []


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "gopher://example.com/", "example.com",
                                 "/etc/passwd", "http://", "javascript:alert(1)"])
async def test_other_schemes_and_relative_urls_are_invalid(url):
    result = await fetch(WebFetchTool(), url=url)
    assert result["error"].startswith("INVALID_URL: ") and result["status_code"] == 0


@pytest.mark.parametrize("args, message", [
    ({}, "INVALID_ARGS: `url` must be a non-empty string"),
    ({"url": "  "}, "INVALID_ARGS: `url` must be a non-empty string"),
    ({"url": 5}, "INVALID_ARGS: `url` must be a non-empty string"),
    ({"url": "https://example.com", "max_length": -1}, "INVALID_ARGS: `max_length` must be a non-negative integer"),
    ({"url": "https://example.com", "allowed_domains": ["example.com"]}, "INVALID_ARGS: unexpected argument(s): allowed_domains"),
])
async def test_bad_arguments_are_invalid_args(args, message):
    result = await fetch(WebFetchTool(allowed_domains=["python.org"]), **args)
    assert result["error"] == message


async def test_a_redirect_to_a_private_address_is_refused_and_not_followed(web):
    web.routes["/start"] = (302, {"Location": web.url("/secret")}, b"")
    web.routes["/named"] = (302, {"Location": web.url("/secret", host="localhost")}, b"")
    web.routes["/secret"] = (200, {"Content-Type": "text/plain"}, b"metadata credentials")
    tool = WebFetchTool(private_hosts=["public.test"], resolver=lambda host, port: ["127.0.0.1"] if host == "public.test" else [])
    for start in ("/start", "/named"):
        result = await fetch(tool, url=web.url(start, host="public.test"))
        assert result["error"].startswith("SSRF_BLOCKED_URL: "), result
        assert "credentials" not in result["content"]
    assert [r.path for r in web.requests] == ["/start", "/named"]


async def test_redirects_are_followed_and_each_hop_passes_the_domain_policy(web):
    web.routes["/a"] = (301, {"Location": "/b"}, b"")
    web.routes["/b"] = (302, {"Location": web.url("/page", host="evil.test")}, b"")
    web.routes["/c"] = (302, {"Location": "file:///etc/passwd"}, b"")
    resolver = {"docs.test": ["127.0.0.1"], "evil.test": ["127.0.0.1"]}
    tool = WebFetchTool(private_hosts=["docs.test", "evil.test"], resolver=lambda h, p: resolver[h], blocked_domains=["evil.test"])
    result = await fetch(tool, url=web.url("/a", host="docs.test"))
    assert result["error"] == "BLOCKED_URL: 'evil.test' is not permitted by the tool's domain policy"
    assert [r.path for r in web.requests] == ["/a", "/b"]
    to_file = await fetch(tool, url=web.url("/c", host="docs.test"))
    assert to_file["error"].startswith("INVALID_URL: redirect to 'file:///etc/passwd'")
    web.routes["/b"] = (302, {"Location": "/page"}, b"")
    followed = await fetch(tool, url=web.url("/a", host="docs.test"))
    assert followed["error"] == "" and followed["url"] == web.url("/page", host="docs.test")


async def test_redirect_limits(web):
    web.routes["/loop"] = (302, {"Location": "/loop"}, b"")
    result = await fetch(local(max_redirects=3), url=web.url("/loop"))
    assert result["error"] == "HTTP_ERROR: more than 3 redirects" and len(web.requests) == 4
    unfollowed = await fetch(local(follow_redirects=False), url=web.url("/loop"))
    assert unfollowed["error"] == "HTTP_STATUS: 302 Found" and unfollowed["status_code"] == 302


async def test_the_connection_goes_to_the_checked_address_without_a_second_lookup(web):
    """DNS rebinding: the name is looked up once per hop, and the request goes to that answer."""
    lookups = []

    def resolver(host, port):
        lookups.append(host)
        return ["127.0.0.1"] if len(lookups) == 1 else ["10.1.2.3"]

    tool = WebFetchTool(private_hosts=["pinned.invalid"], resolver=resolver)
    result = await fetch(tool, url=web.url("/page", host="pinned.invalid"))  # .invalid never resolves otherwise
    assert result["error"] == "" and "# Example Domain" in result["content"]
    assert lookups == ["pinned.invalid"]
    assert web.requests[0].headers["Host"] == f"pinned.invalid:{web.port}"


async def test_a_name_that_resolves_to_public_then_private_reaches_neither_private_nor_the_server(web):
    lookups = []

    def rebinding(host, port):
        lookups.append(host)
        return ["192.0.2.1"] if len(lookups) == 1 else ["127.0.0.1"]  # TEST-NET-1 is not public either

    result = await fetch(WebFetchTool(resolver=rebinding), url=web.url("/page", host="rebind.test"))
    assert result["error"] == "SSRF_BLOCKED_URL: rebind.test resolves to private/reserved address 192.0.2.1"
    assert lookups == ["rebind.test"] and web.requests == []


async def test_domain_lists_are_subdomain_aware_and_the_block_list_wins():
    tool = WebFetchTool(allowed_domains=["python.org"], blocked_domains=["www.bad.python.org"])
    blocked = await fetch(tool, url="https://bad.python.org/x")
    assert blocked["error"] == "BLOCKED_URL: 'bad.python.org' is not permitted by the tool's domain policy"
    outside = await fetch(tool, url="https://www.example.com")
    assert outside["error"] == "BLOCKED_URL: 'example.com' is not permitted by the tool's domain policy"
    lookalike = await fetch(tool, url="https://notpython.org/")
    assert lookalike["error"].startswith("BLOCKED_URL: ")


async def test_a_huge_response_is_cut_at_the_byte_cap_and_not_read_further(web):
    sent, done = [0], threading.Event()

    def endless(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(5 * 1024**3))
        handler.end_headers()
        chunk = b"a" * 65536
        try:
            while sent[0] < 5 * 1024**3:
                handler.wfile.write(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass
        finally:
            done.set()

    web.routes["/huge"] = endless
    result = await fetch(local(max_response_bytes=256 * 1024, max_content_length=0), url=web.url("/huge"))
    assert result["error"] == "" and len(result["content"]) == 256 * 1024
    assert done.wait(10), "the server kept writing: the client did not stop reading"
    assert sent[0] < 64 * 1024**2


async def test_a_compressed_body_is_capped_after_decompression(web):
    web.routes["/bomb"] = (200, {"Content-Type": "text/plain", "Content-Encoding": "gzip"}, gzip.compress(b"b" * 20_000_000, compresslevel=1))
    result = await fetch(local(max_response_bytes=100_000, max_content_length=0), url=web.url("/bomb"))
    assert len(result["content"]) == 100_000


async def test_content_caps_and_the_calls_max_length(web):
    web.routes["/long"] = (200, {"Content-Type": "text/plain"}, b"x" * 5000)
    tool = local(max_content_length=1000)
    assert len((await fetch(tool, url=web.url("/long")))["content"]) == 1000
    short = await fetch(tool, url=web.url("/long"), max_length=10)
    assert short["content"] == "x" * 10 and short["bytes"] == 10
    assert len((await fetch(tool, url=web.url("/long"), max_length=0))["content"]) == 5000
    assert len((await fetch(tool, url=web.url("/long"), max_length=None))["content"]) == 1000


async def test_the_cache_serves_equivalent_urls_until_the_ttl(web):
    tool = local(enable_cache=True, cache_ttl_seconds=0.3)
    first = await fetch(tool, url=web.url("/page"))
    second = await fetch(tool, url=web.url("/page/"))
    assert first["cached"] is False and second["cached"] is True and second["content"] == first["content"]
    assert len(web.requests) == 1
    time.sleep(0.35)
    assert (await fetch(tool, url=web.url("/page")))["cached"] is False and len(web.requests) == 2


async def test_the_cache_keeps_to_its_byte_budget_and_skips_errors(web):
    tool = local(enable_cache=True, cache_max_bytes=10)
    await fetch(tool, url=web.url("/page"))
    assert (await fetch(tool, url=web.url("/page")))["cached"] is False
    errors = local(enable_cache=True)
    await fetch(errors, url=web.url("/missing"))
    assert (await fetch(errors, url=web.url("/missing")))["cached"] is False


def test_ttl_cache_evicts_least_recently_used_first():
    now = [0.0]
    cache: TTLCache[str] = TTLCache(ttl_seconds=10, max_bytes=10, clock=lambda: now[0])
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"
    cache.put("c", "C", 4)  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("a") == "A" and cache.size_bytes == 8
    assert cache.put("big", "X", 11) is False
    now[0] = 11
    assert cache.get("a") is None and len(cache) == 1


async def test_a_shared_client_is_used_with_the_tools_user_agent_and_left_open(web):
    async with httpx.AsyncClient(headers={"User-Agent": "shared"}) as client:
        tool = local(http_client=client, user_agent="mine/1.0")
        result = await fetch(tool, url=web.url("/page"))
        assert result["error"] == "" and not client.is_closed
    assert web.requests[0].headers["User-Agent"] == "mine/1.0"


async def test_a_timeout_is_http_error(web):
    web.routes["/slow"] = lambda handler: time.sleep(1.5)
    result = await fetch(local(timeout=0.3), url=web.url("/slow"))
    assert result["error"].startswith(("HTTP_ERROR: ReadTimeout", "HTTP_ERROR: the fetch took longer than 0.3 s"))


async def test_a_body_dripping_slowly_is_cut_off_at_the_timeout(web):
    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        try:
            for _ in range(1000):
                handler.wfile.write(b"x")
                handler.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass

    web.routes["/drip"] = drip
    started = time.monotonic()
    result = await fetch(local(timeout=0.5), url=web.url("/drip"))
    assert result["error"] == "HTTP_ERROR: the fetch took longer than 0.5 s"
    assert time.monotonic() - started < 2


def _certificate(name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def _serve_tls(web: WebServer, folder, name: str) -> None:
    """Make ``web`` answer HTTPS with a self-signed certificate for ``name`` (``folder/cert.pem``)."""
    cert, key = _certificate(name)
    (folder / "cert.pem").write_bytes(cert)
    (folder / "key.pem").write_bytes(key)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    web._server.socket = server_context.wrap_socket(web._server.socket, server_side=True)


async def test_https_to_the_checked_address_verifies_the_certificate_against_the_name(web, tmp_path):
    _serve_tls(web, tmp_path, "secure.test")
    client_context = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    resolver = {"secure.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}
    async with httpx.AsyncClient(verify=client_context) as client:
        tool = WebFetchTool(http_client=client, private_hosts=["secure.test", "other.test"], resolver=lambda h, p: resolver[h])
        good = await fetch(tool, url=f"https://secure.test:{web.port}/page")
        assert good["error"] == "" and "# Example Domain" in good["content"]
        wrong_name = await fetch(tool, url=f"https://other.test:{web.port}/page")
        assert wrong_name["error"].startswith("HTTP_ERROR: ConnectError") and "certificate" in wrong_name["error"].lower()
    assert web.requests[0].headers["Host"] == f"secure.test:{web.port}"
    assert ipaddress.ip_address("127.0.0.1")  # the server only ever listened on loopback


async def test_https_through_a_connect_proxy_vets_the_name_and_tunnels_to_it(web, tmp_path, monkeypatch):
    _serve_tls(web, tmp_path, "secure.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))
    proxy = ConnectProxy({"secure.test": "127.0.0.1"}).start()
    try:
        tool = WebFetchTool(proxy=proxy.url, private_hosts=["secure.test"], resolver=lambda h, p: ["127.0.0.1"])
        result = await fetch(tool, url=f"https://secure.test:{web.port}/page")
        assert result["error"] == "" and "# Example Domain" in result["content"]
        assert proxy.tunnels == [f"secure.test:{web.port}"]
        refused = await fetch(WebFetchTool(proxy=proxy.url), url=f"https://localhost:{web.port}/page")
        assert refused["error"].startswith("SSRF_BLOCKED_URL: localhost resolves to private/reserved address")
        assert proxy.tunnels == [f"secure.test:{web.port}"]
    finally:
        proxy.stop()


async def test_proxy_variables_in_the_environment_are_not_used(web, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    assert (await fetch(local(), url=web.url("/page")))["error"] == ""


def test_fetch_result_defaults_match_the_guide():
    assert set(FetchResult().__dict__) == RESULT_KEYS
