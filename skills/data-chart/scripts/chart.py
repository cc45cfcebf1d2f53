#!/usr/bin/env python3
"""Draw a PNG bar chart and a summary CSV from a label,value CSV (standard library only)."""
import csv
import math
import os
import struct
import sys
import zlib

USAGE = "usage: chart.py [INPUT_CSV]   (CSV with header columns label,value)"
SAMPLE = [("Mon", 12.0), ("Tue", 19.0), ("Wed", 7.0), ("Thu", 15.0), ("Fri", 23.0), ("Sat", 9.0)]
WIDTH, HEIGHT, MARGIN = 320, 200, 20
COLORS = [(66, 133, 244), (219, 68, 55), (244, 180, 0), (15, 157, 88), (171, 71, 188), (0, 172, 193)]


class BadInput(Exception):
    pass


def read_rows(path):
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            fields = [f.strip().lower() for f in (reader.fieldnames or [])]
            missing = [c for c in ("label", "value") if c not in fields]
            if missing:
                raise BadInput(f"{path}: missing column(s): {', '.join(missing)} (header must have label,value)")
            reader.fieldnames = fields
            rows = []
            for line, rec in enumerate(reader, 2):
                label, text = (rec.get("label") or "").strip(), (rec.get("value") or "").strip()
                if not label and not text:
                    continue  # blank line
                if not text:
                    raise BadInput(f"{path}:{line}: missing value for label {label!r}")
                try:
                    value = float(text)
                except ValueError:
                    raise BadInput(f"{path}:{line}: value is not a number: {text!r}") from None
                if not math.isfinite(value) or value < 0:
                    raise BadInput(f"{path}:{line}: value must be a finite number >= 0: {text!r}")
                rows.append((label, value))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    if not rows:
        raise BadInput(f"{path}: no data rows")
    return rows


def png_chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def draw_png(rows, path):
    pixels = [bytearray(b"\xff" * (WIDTH * 3)) for _ in range(HEIGHT)]

    def fill(x0, y0, x1, y1, rgb):
        for y in range(max(0, y0), min(HEIGHT, y1)):
            row = pixels[y]
            for x in range(max(0, x0), min(WIDTH, x1)):
                row[3 * x : 3 * x + 3] = bytes(rgb)

    top, base = MARGIN, HEIGHT - MARGIN
    peak = max(v for _, v in rows) or 1.0
    slot = (WIDTH - 2 * MARGIN) / len(rows)
    gap = max(1, int(slot * 0.2))
    for i, (_, value) in enumerate(rows):
        x0 = MARGIN + int(i * slot) + gap // 2
        x1 = max(x0 + 1, MARGIN + int((i + 1) * slot) - gap // 2)
        h = round((base - top) * (value / peak))
        fill(x0, base - h, x1, base, COLORS[i % len(COLORS)])
    fill(MARGIN - 5, base, WIDTH - MARGIN + 5, base + 2, (40, 40, 40))  # baseline

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)  # filter type 0 per scanline
    png = (b"\x89PNG\r\n\x1a\n"
           + png_chunk(b"IHDR", struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0))
           + png_chunk(b"IDAT", zlib.compress(raw, 9))
           + png_chunk(b"IEND", b""))
    with open(path, "wb") as fh:
        fh.write(png)


def write_summary(rows, path):
    peak = max(v for _, v in rows) or 1.0
    total = sum(v / peak for _, v in rows)  # scaled by the peak so huge values cannot overflow
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(["label", "value", "share"])
        for label, value in rows:
            share = 100.0 * (value / peak) / total if total else 0.0
            shown = str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
            out.writerow([label, shown, f"{share:.1f}"])


def main(argv):
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        rows = read_rows(argv[0]) if argv else SAMPLE
    except BadInput as exc:
        print(f"chart.py: error: {exc}", file=sys.stderr)
        return 2
    out_dir = os.environ.get("OUTPUT_DIR") or "out"
    try:
        os.makedirs(out_dir, exist_ok=True)
        chart, summary = os.path.join(out_dir, "chart.png"), os.path.join(out_dir, "summary.csv")
        draw_png(rows, chart)
        print(f"wrote {chart}")
        write_summary(rows, summary)
        print(f"wrote {summary}")
    except OSError as exc:
        print(f"chart.py: error: cannot write output: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
