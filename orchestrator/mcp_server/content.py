"""Skill tool answers as MCP tool results.

A tool's answer (the dict a model would read) becomes one text block of JSON and the same dict as
``structuredContent``; an answer with ``error`` is an error result (``isError``) whose text is the message.
``skill_run``'s output files become content of their kind after that summary: text files as text blocks (``_meta``
names the file), images as image content, other binaries as embedded resources with their MIME type. A run that
timed out is an error result that still carries its partial output.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from mcp import types

FILE_META_KEY = "skillrun/file"


def call_result(tool_name: str, answer: dict[str, Any]) -> types.CallToolResult:
    if "error" in answer:
        text = answer["error"] if len(answer) == 1 else _json(answer)
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(text))], isError=True)
    if tool_name == "skill_run":
        return _run_result(answer)
    return types.CallToolResult(content=[types.TextContent(type="text", text=_json(answer))], structuredContent=answer)


def _run_result(answer: dict[str, Any]) -> types.CallToolResult:
    files = answer.get("output_files") or []
    summary = {**answer, "output_files": [{k: f[k] for k in ("name", "mime_type", "size", "truncated")} for f in files]}
    blocks: list[types.ContentBlock] = [types.TextContent(type="text", text=_json(summary))]
    blocks.extend(block for block in map(_file_block, files) if block is not None)
    return types.CallToolResult(content=blocks, structuredContent=summary, isError=bool(answer.get("timed_out")))


def _file_block(output: dict[str, Any]) -> types.ContentBlock | None:
    """One output file as content; ``None`` when its content was not returned (``omit_inline_content``, or a file
    past the inline caps)."""
    name, mime, content, encoding = output["name"], output["mime_type"], output.get("content", ""), output.get("encoding")
    meta = {FILE_META_KEY: {"name": name, "size": output["size"], "truncated": output.get("truncated", False)}}
    if encoding == "none" or (not content and output["size"]):
        return None
    if encoding == "base64":
        if mime.startswith("image/"):
            return types.ImageContent(type="image", data=content, mimeType=mime, _meta=meta)
        return types.EmbeddedResource(type="resource", _meta=meta, resource=types.BlobResourceContents(
            uri=file_uri(name), mimeType=mime, blob=content))
    return types.TextContent(type="text", text=content, _meta=meta)


def file_uri(name: str) -> str:
    """The URI an output file is named by in results: ``skillrun://workspace/<path in the workspace>``."""
    return "skillrun://workspace/" + quote(name)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
