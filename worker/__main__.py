"""``python -m worker``: a worker (the image's command), as ``skillrun worker`` starts one."""

import sys

from pydantic import ValidationError

from worker.cli import build_parser, error_lines
from worker.jobs.consumer import serve_worker
from worker.errors import WorkerError

USAGE_ERROR = 2


def main() -> int:
    try:
        return serve_worker(build_parser().parse_args())
    except ValidationError as exc:  # a setting out of its bounds (SKILLRUN_<FIELD>): one line each
        for line in error_lines(exc, "settings"):
            print(f"worker: error: {line}", file=sys.stderr)
        return USAGE_ERROR
    except WorkerError as exc:
        print(f"worker: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


sys.exit(main())
