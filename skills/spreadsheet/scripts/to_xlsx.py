# /// script
# requires-python = ">=3.9"
# dependencies = [
#   "openpyxl>=3.1",
# ]
# ///
"""Write an .xlsx workbook of a CSV of labelled numbers (see SKILL.md)."""

import csv
import os
import sys

from openpyxl import Workbook
from openpyxl.chart import BarChart, Reference
from openpyxl.styles import Font

SAMPLE = [("Mon", 12.0), ("Tue", 19.0), ("Wed", 7.0), ("Thu", 15.0), ("Fri", 22.0)]


def read_rows(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"label", "value"} <= set(reader.fieldnames):
            sys.exit(f"{path}: the header must have the columns label and value")
        return [(row["label"], float(row["value"])) for row in reader]


def main():
    rows = read_rows(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE
    book = Workbook()
    sheet = book.active
    sheet.title = "data"
    sheet.append(["label", "value"])
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    for row in rows:
        sheet.append(list(row))
    last = len(rows) + 1
    sheet.append(["Total", f"=SUM(B2:B{last})"])
    sheet[f"A{last + 1}"].font = Font(bold=True)
    chart = BarChart()
    chart.title = "value by label"
    chart.add_data(Reference(sheet, min_col=2, min_row=1, max_row=last), titles_from_data=True)
    chart.set_categories(Reference(sheet, min_col=1, min_row=2, max_row=last))
    sheet.add_chart(chart, "D2")
    out_dir = os.environ.get("OUTPUT_DIR", "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "summary.xlsx")
    book.save(path)
    print(f"{path} {len(rows)} rows")


if __name__ == "__main__":
    main()
