"""Print a CSV as a Markdown table (see SKILL.md)."""

import csv
import sys

import tabulate

tabulate.WIDE_CHARS_MODE = True  # needs wcwidth, which the library's manifest adds


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: table.py INPUT_CSV")
    with open(sys.argv[1], newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        sys.exit(f"{sys.argv[1]}: empty")
    print(tabulate.tabulate(rows[1:], headers=rows[0], tablefmt="github"))


if __name__ == "__main__":
    main()
