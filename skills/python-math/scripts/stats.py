#!/usr/bin/env python3
"""Print count/sum/mean/min/max of the numbers (one per line) in FILE."""
import math
import sys
from decimal import Decimal

USAGE = "usage: stats.py FILE   (FILE: one number per line)"


def fmt(x):
    """Show whole numbers without a trailing '.0'."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x) if isinstance(x, float) else str(x)


def parse(token):
    try:
        return int(token)
    except ValueError:
        value = float(token)
        if not math.isfinite(value):
            raise ValueError(token)
        return value


if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)  # allow printing/parsing very large integers


def main(argv):
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    path = argv[0]
    numbers = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                token = line.strip()
                if not token:
                    continue
                try:
                    numbers.append(parse(token))
                except ValueError:
                    print(f"stats.py: {path}:{lineno}: not a number: {token!r}", file=sys.stderr)
                    return 2
    except (OSError, UnicodeDecodeError) as exc:
        print(f"stats.py: cannot read {path}: {exc}", file=sys.stderr)
        print(USAGE, file=sys.stderr)
        return 2
    if not numbers:
        print(f"stats.py: {path}: no numbers found", file=sys.stderr)
        return 2
    total = sum(numbers)
    try:
        mean = total / len(numbers)
    except OverflowError:  # huge integers: fall back to Decimal
        mean = Decimal(total) / len(numbers)
    print(f"count: {len(numbers)}")
    print(f"sum: {fmt(total)}")
    print(f"mean: {fmt(mean)}")
    print(f"min: {fmt(min(numbers))}")
    print(f"max: {fmt(max(numbers))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
