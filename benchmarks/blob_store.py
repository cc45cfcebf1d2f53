"""Output collection into each artifact store: the filesystem store against the S3 store on a local S3 server.

Each run saves one file from an open descriptor, as output collection does (``store.save_fd``: read once from its
start, hashed, capped, written as the next version), interleaved, each store going first in turn; every version is
pruned again after its run. Then one more save of the largest file into S3, under tracemalloc, shows how much memory
a save holds at once (bounded by the upload's parts in memory, not by the file's size).

The S3 server is moto's (``python -m moto.server``, in a process of its own on loopback): an emulator, a Python web
server keeping objects in memory and temporary files, not S3. The ratio shows what the S3 protocol (four requests a
save) and boto3's managed transfer (multipart past 8 MiB) cost over a local folder, not what a network or S3 itself
would add. The baseline is the filesystem store, measured in the same run.

Usage: .venv/bin/python benchmarks/blob_store.py [--runs N] [--sizes MiB,MiB]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import Recording, preformatted, publish, summary_ms  # noqa: E402
from worker.artifacts import BaseArtifactStore, FileArtifactStore, S3ArtifactStore  # noqa: E402

MIB = 1024 * 1024
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="saves of each size into each store")
    parser.add_argument("--sizes", default="1,100", help="file sizes, MiB, comma-separated")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]

    os.environ.update(CREDENTIALS)
    scratch = Path(tempfile.mkdtemp(prefix="skillrun-bench-blobs-"))
    server = None
    try:
        server, endpoint = start_moto(scratch)
        s3 = S3ArtifactStore("bench", "artifacts", endpoint_url=endpoint)
        s3.client.create_bucket(Bucket="bench")
        stores: dict[str, BaseArtifactStore] = {"filesystem": FileArtifactStore(scratch / "artifacts"), "s3": s3}
        printed = Recording()
        print(f"{'series':<18}{'median ms':>12}{'p95 ms':>10}{'MiB/s':>9}{'vs filesystem':>15}")
        for size in sizes:
            source = scratch / f"out-{size}.bin"
            with source.open("wb") as f:
                for _ in range(size):
                    f.write(os.urandom(MIB))
            samples = measure(stores, source, args.runs)
            base = summary_ms(samples["filesystem"])[0]
            for name, series in samples.items():
                median, p95 = summary_ms(series)
                print(f"{f'{name} {size}MiB':<18}{median:>12.1f}{p95:>10.1f}{size * 1000 / median:>9.0f}"
                      f"{median / base:>14.2f}x")
            if size == max(sizes):
                print(f"{size} MiB into S3 held at most {held_mib(s3, source):.0f} MiB of Python memory at once "
                      "(tracemalloc's peak over one save, not timed)")
            source.unlink()
        publish("blob_store", "Blob store",
                f"{args.runs} saves of each size into each store, interleaved; the S3 store on moto's server on "
                "loopback against the filesystem store.\n\n" + preformatted(printed.text()))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)


def measure(stores: dict[str, BaseArtifactStore], source: Path, runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in stores}
    order = list(stores)
    with source.open("rb") as f:
        for i in range(runs):
            for name in order[i % len(order):] + order[:i % len(order)]:
                start = time.perf_counter()
                stores[name].save_fd("bench", "out/file.bin", f.fileno(), "application/octet-stream")
                samples[name].append(time.perf_counter() - start)
                stores[name].prune(time.time() + 1)  # nothing piles up from run to run
    return samples


def start_moto(scratch: Path) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in a process of its own on a free loopback port; its endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = scratch / "moto.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, cwd=scratch)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.05)
    server.kill()
    server.wait()
    sys.exit(f"moto's S3 server did not start (is moto[server] installed? bash .ci/setup --test):\n{log.read_text()}")


def held_mib(store: BaseArtifactStore, source: Path) -> float:
    """The most Python memory one save of ``source`` into ``store`` holds at once, MiB."""
    tracemalloc.start()
    try:
        with source.open("rb") as f:
            store.save_fd("bench", "out/file.bin", f.fileno(), "application/octet-stream")
        return tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()
        store.prune(time.time() + 1)


if __name__ == "__main__":
    main()
