"""Write a one-page PDF report of a CSV of labelled numbers (see SKILL.md)."""

import argparse
import csv
import os
import sys

from fpdf import FPDF

SAMPLE = [("Mon", 12.0), ("Tue", 19.0), ("Wed", 7.0), ("Thu", 15.0), ("Fri", 22.0)]


def read_rows(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"label", "value"} <= set(reader.fieldnames):
            sys.exit(f"{path}: the header must have the columns label and value")
        try:
            return [(row["label"], float(row["value"])) for row in reader]
        except ValueError as exc:
            sys.exit(f"{path}: {exc}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("input", nargs="?")
    parser.add_argument("--title", default="Report")
    args = parser.parse_args()
    rows = read_rows(args.input) if args.input else SAMPLE
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 20)
    pdf.cell(0, 12, args.title, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=12)
    total = sum(value for _, value in rows)
    pdf.multi_cell(0, 8, f"{len(rows)} rows, {total:g} in total.", new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)
    with pdf.table(col_widths=(60, 40)) as table:
        table.row(["label", "value"])
        for label, value in rows:
            table.row([label, f"{value:g}"])
    out_dir = os.environ.get("OUTPUT_DIR", "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "report.pdf")
    pdf.output(path)
    print(f"{path} {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
