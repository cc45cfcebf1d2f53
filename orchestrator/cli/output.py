"""Output helpers of the command line: readable tables, sizes, JSON, and text from runs made safe for terminals."""

from __future__ import annotations

import json
import re
import shutil
import sys
from typing import TextIO

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LEFT_RAW_BY_JSON = re.compile("[\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """C0 and C1 control characters but newline and tab shown as ``\\x1b``: ANSI and OSC sequences a run printed
    cannot drive the operator's terminal (rewrite lines, set titles or clipboards, hide text)."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def write(stream: TextIO, text: str) -> None:
    """Write text that came from a run or a library: escaped on a terminal, unchanged into a pipe or a file."""
    stream.write(escape_controls(text) if stream.isatty() else text)


def json_text(text: str) -> str:
    """JSON made safe to print: ``json`` escapes C0 controls itself, but leaves DEL and C1 raw without
    ``ensure_ascii``; they are written as ``\\u009b`` escapes, which keeps the JSON valid and equal."""
    return _LEFT_RAW_BY_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; the last column is cut to the terminal width."""
    width = shutil.get_terminal_size((120, 24)).columns
    cols = len(headers)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(cols)]
    fixed = sum(widths[:-1]) + 2 * (cols - 1)
    widths[-1] = max(min(widths[-1], width - fixed), 10)

    def fmt(row: list[str]) -> str:
        cells = [str(c) for c in row]
        last = cells[-1] if len(cells[-1]) <= widths[-1] else cells[-1][: widths[-1] - 1] + "…"
        return "  ".join([c.ljust(w) for c, w in zip(cells[:-1], widths)] + [last]).rstrip()

    return "\n".join([fmt(headers), *(fmt(r) for r in rows)])


def size(n: int) -> str:
    """A byte count for people: 23 B, 1.1 KiB, 4.0 MiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_json(data: object) -> None:
    """``data`` as JSON: indented for a terminal, else on one line (written by the C encoder, several times faster
    for a long listing)."""
    indent = 2 if sys.stdout.isatty() else None
    print(json_text(json.dumps(data, indent=indent, ensure_ascii=False)))
