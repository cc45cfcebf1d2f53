"""Egress allow-lists and secret redaction: what each costs, against a baseline measured in the same run.

* host https        ``--requests`` HTTPS requests (each a new connection: TCP, TLS handshake, GET, answer) from a
                    python process on the host straight to a local HTTPS server: the baseline.
* run https (local) the same requests from a local run (root: its own sandbox, network namespace and proxy)
                    through the worker's egress proxy (``CONNECT`` tunnels), timed inside the run.
* run https (docker) the same from a Docker run, through the relay and the proxy's unix socket (``--docker``).
* no redaction      turning a 10 MiB stdout (``--megabytes``) into the result's text (decoding it), as every run does.
* redaction         the same plus taking a team's secrets (``--secrets`` values, none present) out of it
                    (``worker.secrets.Redactor``): what a run with team secrets pays for its stdout.

Each series is measured ``--runs`` times; the rows give median and p95 in ms and the ratio of the medians to the
baseline (host https for the requests; no redaction for redaction). The server's name is pinned to 127.0.0.1
(``SKILLRUN_EGRESS_PINNED_HOSTS``); nothing leaves the machine. The request series need root (the local runtime's
sandbox).

Usage: sudo .venv/bin/python benchmarks/egress.py [--runs N] [--requests N] [--megabytes N] [--docker]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.server
import json
import os
import secrets
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from benchmarks.figures import Recording, preformatted, publish, scratch_dir, summary_ms  # noqa: E402
from worker.config import get_worker_settings  # noqa: E402
from worker.contract import RunRequest, RuntimeName, SkillRef  # noqa: E402
from worker.roots.folders import remove_tree  # noqa: E402
from worker.secrets import Redactor  # noqa: E402

HOST = "api.egress-bench.net"
CLIENT = r'''
import json, os, socket, ssl, sys, time
host, port, count, ca = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
context = ssl.create_default_context(cafile=ca)
proxy = os.environ.get("HTTPS_PROXY")
times = []
for _ in range(count + 1):
    started = time.perf_counter()
    if proxy:
        proxy_host, proxy_port = proxy.rsplit("/", 1)[-1].split(":")
        raw = socket.create_connection((proxy_host, int(proxy_port)), timeout=10)
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += raw.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
    else:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with context.wrap_socket(raw, server_hostname=host) as tls:
        tls.sendall(f"GET /ping HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    assert answer.endswith(b"pong"), answer
    times.append(time.perf_counter() - started)
print(json.dumps(times[1:]))
'''
"""Times ``count`` HTTPS GETs to ``host:port`` (after one not counted), each on a new connection: through the
proxy ``HTTPS_PROXY`` names when there is one, else straight to 127.0.0.1 with ``host`` as the TLS name."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"pong")

    def log_message(self, *args: object) -> None:
        pass


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``HOST`` and its key, written to ``folder`` (readable by sandbox users)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.chmod(0o644)
    return cert_path, key_path


def https_server(cert: Path, key: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def host_requests(skill: Path, port: int, count: int, ca: Path) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = subprocess.run([sys.executable, "-I", str(skill / "client.py"), HOST, str(port), str(count), str(ca)],
                          capture_output=True, text=True, env=env, check=True, timeout=300)
    return json.loads(done.stdout)


async def run_requests(runtime, skill: Path, port: int, count: int, ca: Path, runtime_name: RuntimeName,
                       workspace: str) -> list[float]:
    request = RunRequest(skill=SkillRef(name="bench", root=str(skill.parent), path="bench"), runtime=runtime_name,
                         command=f"python3 -I client.py {HOST} {port} {count} {ca.name}", egress=[f"{HOST}:{port}"],
                         workspace_id=workspace, timeout=300)
    result = await runtime.run(request)
    if result.exit_code != 0 or result.egress_refused:
        raise SystemExit(f"the run failed ({result.exit_code}): {result.stderr[-2000:]} {result.egress_refusals}")
    return json.loads(result.stdout)


def row(name: str, samples: list[float], baseline: float | None) -> str:
    median, p95 = summary_ms(samples)
    ratio = f"{median / baseline:9.2f}x" if baseline else f"{1:9.2f}x"
    return f"{name:<20}  {median:9.3f}  {p95:9.3f}  {ratio}"


def redaction_series(megabytes: int, count: int, runs: int) -> tuple[list[float], list[float]]:
    line = b"the quick brown fox jumps over the lazy dog, 0123456789 ABCDEF ghp_notasecret\n"
    stdout = (line * (megabytes * 1024 * 1024 // len(line) + 1))[: megabytes * 1024 * 1024]
    redactor = Redactor({f"SECRET_{i}": secrets.token_urlsafe(24) for i in range(count)})
    bare, redacted = [], []
    for _ in range(runs):
        started = time.perf_counter()
        text = stdout.decode("utf-8", "replace")
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        text = redactor.text(stdout.decode("utf-8", "replace"))
        redacted.append(time.perf_counter() - started)
    assert len(text) == len(stdout)
    return bare, redacted


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--requests", type=int, default=20, help="requests per run (each a new connection)")
    parser.add_argument("--megabytes", type=int, default=10)
    parser.add_argument("--secrets", type=int, default=3, help="secret values the redactor looks for")
    parser.add_argument("--docker", action="store_true", help="also measure a Docker run (needs an engine)")
    args = parser.parse_args()

    printed = Recording()
    print(f"{'series':<20}  {'p50 ms':>9}  {'p95 ms':>9}  {'ratio':>10}")
    if os.geteuid() == 0:
        await request_series(args)
    else:
        print("(requests from runs need root: the local runtime's sandbox; run with sudo)")
    bare, redacted = redaction_series(args.megabytes, args.secrets, args.runs)
    print(row("no redaction", bare, None))
    print(row("redaction", redacted, summary_ms(bare)[0]))
    publish("egress", "Egress and redaction",
            f"{args.runs} runs of each series, {args.requests} HTTPS requests a run (each a new connection), a "
            f"{args.megabytes} MiB stdout redacted of {args.secrets} secrets (none present). Ratios: against host https "
            "for the requests, against no redaction for redaction.\n\n" + preformatted(printed.text()))


async def request_series(args: argparse.Namespace) -> None:
    from worker.runtimes.local.runtime import LocalWorkspaceRuntime

    scratch = scratch_dir("skillrun-bench-egress-")
    os.environ["SKILLRUN_EGRESS_PINNED_HOSTS"] = f"{HOST}=127.0.0.1"
    get_worker_settings.cache_clear()
    skill = scratch / "library" / "bench"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: bench\ndescription: Times HTTPS requests.\n---\nx\n")
    (skill / "client.py").write_text(CLIENT)
    cert, key = certificate(skill)  # in the skill's folder: what a run is shown of the host
    for path in [scratch / "library", skill, *skill.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    server, port = https_server(cert, key)
    runtimes = [("run https (local)", RuntimeName.LOCAL, LocalWorkspaceRuntime(scratch / "work"))]
    engine = None
    if args.docker:
        from tests.services import docker_engine_for
        from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime

        engine = docker_engine_for(str(Path(__file__).resolve().parent.parent))  # the running one, or one started
        runtimes.append(("run https (docker)", RuntimeName.DOCKER,
                         ContainerWorkspaceRuntime(scratch / "docker", client=engine.client)))
    try:
        host: list[float] = []
        series: dict[str, list[float]] = {name: [] for name, _, _ in runtimes}
        for index in range(args.runs):  # interleaved, so drift on a shared machine touches every series alike
            host += host_requests(skill, port, args.requests, cert)
            for name, runtime_name, runtime in runtimes:
                series[name] += await run_requests(runtime, skill, port, args.requests, cert, runtime_name,
                                                   f"bench-{runtime_name.value}")
        baseline = summary_ms(host)[0]
        print(row("host https", host, None))
        for name, samples in series.items():
            print(row(name, samples, baseline))
    finally:
        for _, _, runtime in runtimes:
            await runtime.close()
        if engine is not None:
            engine.stop()  # only an engine it started
        server.shutdown()
        server.server_close()
        remove_tree(scratch)


if __name__ == "__main__":
    asyncio.run(main())
