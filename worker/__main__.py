import sys

from worker.cli import build_parser
from worker.consumer import serve_worker

sys.exit(serve_worker(build_parser().parse_args()))
