"""An MCP tool's result (``CallToolResult``) as the tool result a model reads.

* text blocks are joined into ``result`` (or ``error`` when the server flagged the result with ``isError``: an
  error result for the model, not an exception of the agent);
* ``structuredContent`` is given as ``structured_content`` (and as ``result`` when there is no text);
* every block is also listed under ``content`` when the result holds more than text: images and audio with their
  MIME type and size (a chat model's tool message carries text only, so their bytes are not inlined), embedded
  resources with their URI and MIME type (their text inlined up to ``TEXT_CAP`` characters, binaries by size),
  resource links with their URI.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from mcp import types

TEXT_CAP = 100_000
"""Characters of text a result gives the model; beyond it the text is cut and ``truncated`` says so."""


def tool_result(result: types.CallToolResult) -> dict[str, Any]:
    texts: list[str] = []
    blocks: list[dict[str, Any]] = []
    only_text = True
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
            blocks.append({"type": "text", "text": block.text})
            continue
        only_text = False
        blocks.append(_describe(block))
    text = "\n".join(texts)
    answer: dict[str, Any] = {}
    if len(text) > TEXT_CAP:
        text, answer["truncated"] = text[:TEXT_CAP], True
    if result.isError:
        answer["error"] = text or "the MCP tool reported an error without a message"
    elif text:
        answer["result"] = text
    if result.structuredContent is not None:
        answer["structured_content"] = result.structuredContent
        if not result.isError:
            answer.setdefault("result", result.structuredContent)
    if not only_text:
        answer["content"] = blocks
    if not answer:
        answer["result"] = ""
    return answer


def _describe(block: Any) -> dict[str, Any]:
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        return {"type": kind, "mime_type": block.mimeType, "size_bytes": _decoded_size(block.data)}
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        entry: dict[str, Any] = {"type": "resource", "uri": str(resource.uri), "mime_type": resource.mimeType}
        if isinstance(resource, types.TextResourceContents):
            entry["text"] = resource.text[:TEXT_CAP]
            if len(resource.text) > TEXT_CAP:
                entry["truncated"] = True
        else:
            entry["size_bytes"] = _decoded_size(resource.blob)
        return entry
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name, "mime_type": block.mimeType,
                "description": block.description}
    return {"type": getattr(block, "type", type(block).__name__)}


def _decoded_size(data: str) -> int | None:
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None
