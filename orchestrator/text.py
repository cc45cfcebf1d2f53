"""Text every store can keep: ``check_text`` finds a lone surrogate in a string at any depth of mappings (their keys
too), lists and pydantic models, and names where it is (``UnencodableTextError``).

A Python string may hold a code point U+D800-U+DFFF alone — JSON's ``"\\ud800"`` escape decodes to one, and so do
bytes that are not UTF-8 read with ``surrogateescape`` — but UTF-8 cannot encode it, so Redis, a JSON file or an
answer's body fails on it later: a 500, or a record nobody can read. What a request brings is checked where it
arrives, before anything is stored or run: the API's request bodies (``orchestrator.schemas.RequestModel``), the
console's forms (``orchestrator.console.auth.checked``) and the MCP endpoint's messages (``orchestrator.api.mcp``).
The stores check again, as a second line: sessions (``orchestrator.sessions.session``), the control plane's
documents (``orchestrator.documents``) and every run submitted to a dispatcher (``orchestrator.dispatch.base``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel

from orchestrator.errors import UnencodableTextError

_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_KEY_CHARS_SHOWN = 40
"""A key is named by at most this many of its characters."""
MAX_STEPS_SHOWN = 16
"""A path deeper than this is named by its first and last steps."""

_Path = tuple["_Path | None", object] | None
"""Where a value is: the path to its parent and its own key or index (built only when a problem is named)."""


def check_text(value: object, where: str = "") -> None:
    """Raise ``UnencodableTextError`` naming the first string found in ``value`` (a string, or mappings, lists,
    tuples and pydantic models of them, at any depth) that holds a lone surrogate; ``where`` names ``value``.
    Linear in the text; an ASCII string costs nothing (Python knows it is ASCII)."""
    pending: list[tuple[object, _Path]] = [(value, (None, where) if where else None)]
    while pending:  # a list, not recursion: a body nested as deep as its parser allows is walked too
        item, path = pending.pop()
        if isinstance(item, str):
            _check_string(item, path)
        elif isinstance(item, Mapping):
            for key, inner in item.items():
                if isinstance(key, str):
                    _check_string(key, (path, key), "the name of ")
                pending.append((inner, (path, key)))
        elif isinstance(item, (list, tuple)):
            pending.extend((inner, (path, index)) for index, inner in enumerate(item))
        elif isinstance(item, BaseModel):
            pending.extend((getattr(item, name), (path, name)) for name in type(item).model_fields)
            if item.__pydantic_extra__:
                pending.append((item.__pydantic_extra__, path))


def _check_string(text: str, path: _Path, what: str = "") -> None:
    if text.isascii():
        return
    found = _SURROGATE.search(text)
    if found is not None:
        where = _named(path)
        code_point = f"U+{ord(found.group()):04X} at character {found.start()}"
        raise UnencodableTextError(where, f"{what}{where or 'the text'} holds a lone surrogate ({code_point}), which "
                                          "is not Unicode text and cannot be stored; send whole characters (UTF-8, or "
                                          "an escaped surrogate pair)")


def _named(path: _Path) -> str:
    """``path`` as the API names fields (``state.notes.0``); a key that is not plain text is shown escaped
    (``state.'\\udc00k'``), never as it is."""
    steps: list[str] = []
    while path is not None:
        path, part = path
        step = str(part)
        steps.append(step if isinstance(part, int) or _plain(step) else ascii(step[:MAX_KEY_CHARS_SHOWN]))
    steps.reverse()
    if len(steps) > MAX_STEPS_SHOWN:
        half = MAX_STEPS_SHOWN // 2
        steps = [*steps[:half], f"...({len(steps) - 2 * half} more)...", *steps[-half:]]
    return ".".join(steps)


def _plain(key: str) -> bool:
    return 0 < len(key) <= MAX_KEY_CHARS_SHOWN and key.isascii() and key.isprintable() and "." not in key


__all__ = ["MAX_KEY_CHARS_SHOWN", "MAX_STEPS_SHOWN", "check_text"]
