#!/usr/bin/env python3
"""Print the first N Fibonacci numbers, one per line."""
import sys

USAGE = "usage: fib.py N   (N: integer >= 0)"

if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)  # allow printing/parsing very large integers


def main(argv):
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        n = int(argv[0])
    except ValueError:
        n = -1
    if n < 0:
        print(USAGE, file=sys.stderr)
        return 2
    a, b = 0, 1
    try:
        for _ in range(n):
            sys.stdout.write(f"{a}\n")
            a, b = b, a + b
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
