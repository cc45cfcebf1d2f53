"""Convert a document to PDF with LibreOffice and read its text back (see SKILL.md)."""

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TIMEOUT = 120
PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def convert(source: Path, outdir: Path) -> Path:
    soffice = shutil.which("soffice")
    if soffice is None:
        sys.exit("soffice not found: declare the Debian package libreoffice-writer-nogui for this skill")
    outdir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [soffice, "--headless", "--norestore", "--nologo", "--convert-to", "pdf", "--outdir", str(outdir), str(source)],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    pdf = outdir / f"{source.stem}.pdf"
    if done.returncode != 0 or not pdf.is_file():
        print(done.stdout + done.stderr, file=sys.stderr)
        print(f"LibreOffice could not convert {source} (exit {done.returncode})", file=sys.stderr)
        sys.exit(3)
    return pdf


def first_lines(pdf: Path, count: int = 5) -> list[str]:
    if shutil.which("pdftotext") is None:
        return []
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    return [line.rstrip() for line in text.splitlines() if line.strip()][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description="Convert a document to PDF with LibreOffice.")
    parser.add_argument("input", type=Path)
    parser.add_argument("--outdir", type=Path, default=Path(os.environ.get("OUTPUT_DIR", "out")))
    args = parser.parse_args()
    if not args.input.is_file():
        parser.error(f"no file at {args.input}")
    pdf = convert(args.input, args.outdir)
    data = pdf.read_bytes()
    print(f"{pdf}: {len(data)} bytes, {len(PAGE.findall(data))} page(s)")
    for line in first_lines(pdf):
        print(f"  {line}")


if __name__ == "__main__":
    main()
