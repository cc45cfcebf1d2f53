"""Start a server on a free loopback port, check its pages, write a JSON report, stop the server."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

WAIT_SECONDS = 20.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def check(port: int, path: str, expected: str) -> dict:
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status, body = response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        status, body = error.code, ""
    except OSError as error:
        return {"path": path, "expected": expected, "passed": False, "error": str(error)}
    if expected.isdigit() and len(expected) == 3:
        passed = status == int(expected)
    else:
        passed = status == 200 and expected in body
    return {"path": path, "expected": expected, "status": status, "passed": passed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", required=True, help="the command that serves; {port} is the port chosen")
    parser.add_argument("--check", action="append", default=[], metavar="PATH=EXPECTED")
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    checks = []
    for item in args.check:
        path, sep, expected = item.partition("=")
        if not sep or not path.startswith("/") or not expected:
            parser.error(f"--check {item!r}: write PATH=EXPECTED, PATH starting with /")
        checks.append((path, expected))
    if not checks:
        parser.error("give at least one --check")
    port = free_port()
    log_path = args.report + ".server.log"
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(log_path, "wb") as log:
        server = subprocess.Popen(shlex.split(args.server.replace("{port}", str(port))), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not answers(port):
            if server.poll() is not None or time.monotonic() > deadline:
                with open(log_path, encoding="utf-8", errors="replace") as log:
                    report = {"port": port, "passed": False, "server_output": log.read()[-4000:]}
                with open(args.report, "w") as out:
                    json.dump(report, out, indent=2)
                print(f"the server did not answer on port {port}; its output is in {args.report}", file=sys.stderr)
                return 3
            time.sleep(0.05)
        results = [check(port, path, expected) for path, expected in checks]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
        os.unlink(log_path)
    passed = all(result["passed"] for result in results)
    with open(args.report, "w") as out:
        json.dump({"port": port, "passed": passed, "checks": results}, out, indent=2)
    for result in results:
        print(f"{'ok  ' if result['passed'] else 'FAIL'} {result['path']} (expected {result['expected']!r})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
