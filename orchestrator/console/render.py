"""How console pages are made: Jinja templates (HTML-escaped by default), Markdown rendered and sanitised, untrusted
text shown with its control characters escaped, and the headers every console answer carries.

Skill bodies, docs, file names and run output come from untrusted skills. Markdown is rendered by markdown-it with raw
HTML turned off (a ``<script>`` in a body stays text), then cleaned by nh3 (the ammonia sanitiser) to a list of
passive tags and attributes, with links only to ``http``, ``https`` and ``mailto`` and relative ones; and the page's
Content-Security-Policy allows no inline script, style or event handler, so a gap in either still runs nothing.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import nh3
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markdown_it import MarkdownIt
from markupsafe import Markup

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {  # on every answer under /ui (``orchestrator.console.mount.ConsoleHeaders``)
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # with no-referrer, a browser's form posts say Origin: null
    "Cache-Control": "no-store",
}

_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "s", "span", "strong", "sub", "summary", "sup",
    "table", "tbody", "td", "th", "thead", "tr", "ul",
}
_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "code": {"class"}, "th": {"align"},
               "td": {"align"}, "ol": {"start"}}
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table").enable("strikethrough")

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
"""C0 and C1 controls but newline and tab, zero-width and bidi controls (every Bidi_Control: ALM, LRM, RLM, the
embeddings, overrides and isolates), line and paragraph separators, and the byte-order mark."""


def markdown(text: str) -> Markup:
    """Markdown as sanitised HTML, safe to put in a page."""
    html = _markdown.render(text)
    cleaned = nh3.clean(html, tags=_TAGS, attributes=_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
                        link_rel="noopener noreferrer nofollow", strip_comments=True)
    return Markup(cleaned)


def visible(text: str | None) -> str:
    """Untrusted text with its control characters (ANSI and OSC escapes, bidi overrides) shown as ``\\xNN`` /
    ``\\uNNNN``; newlines and tabs are kept. Jinja escapes the HTML."""
    if not text:
        return ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                        text.replace("\r\n", "\n"))


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


templates = Jinja2Templates(env=Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                                            autoescape=True))
templates.env.filters.update(markdown=markdown, visible=visible, size=size, when=when, seconds=seconds)


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A console page; ``context`` fills the template (the signed-in session, if any, is ``request.state``'s)."""
    context.setdefault("session", getattr(request.state, "console", None))
    context.setdefault("team", getattr(request.state, "console_team", None))
    return templates.TemplateResponse(request, template, context, status_code=status_code)
