"""Screenshot a web page in headless Chromium with Playwright (see SKILL.md)."""

import argparse
import os
import struct
import sys
from pathlib import Path

from playwright.sync_api import Error, sync_playwright

TIMEOUT_MS = 30_000


def page_url(target: str) -> str:
    if "://" in target:
        return target
    path = Path(target)
    if not path.is_file():
        sys.exit(f"no file at {target} (give a URL or a path to an HTML file)")
    return path.resolve().as_uri()


def png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def main() -> None:
    parser = argparse.ArgumentParser(description="Screenshot a web page in headless Chromium.")
    parser.add_argument("target")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUTPUT_DIR", "out")) / "page.png")
    parser.add_argument("--width", type=int, default=800)
    parser.add_argument("--height", type=int, default=600)
    parser.add_argument("--full-page", action="store_true")
    args = parser.parse_args()
    url = page_url(args.target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch()
        try:
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            try:
                page.goto(url, wait_until="load", timeout=TIMEOUT_MS)
            except Error as exc:
                print(f"could not load {url}: {exc.message}", file=sys.stderr)
                sys.exit(3)
            page.screenshot(path=str(args.out), full_page=args.full_page)
            title = page.title()
        finally:
            browser.close()
    width, height = png_size(args.out)
    print(f"title: {title}")
    print(f"{args.out}: {width}x{height} pixels")


if __name__ == "__main__":
    main()
