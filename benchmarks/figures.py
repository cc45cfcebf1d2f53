"""What every benchmark here shares: a scratch folder other users can enter, and median / p95 in milliseconds."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path


def scratch_dir(prefix: str) -> Path:
    """A new folder under the system temp dir with mode 0755 (commands may run as other users)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def summary_ms(samples: list[float]) -> tuple[float, float]:
    """Median and 95th percentile of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.95) - 1] * 1000
