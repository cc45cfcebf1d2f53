"""MIME type detection: libmagic through ``python-magic`` when it loads, file extensions otherwise."""

from __future__ import annotations

import mimetypes

try:
    import magic as _magic

    _DETECTOR = _magic.Magic(mime=True)
except (ImportError, OSError):  # python-magic missing, or libmagic1 not installed
    _DETECTOR = None

TEXT_TYPES = {
    "application/json",
    "application/xml",
    "application/javascript",
    "application/x-sh",
    "application/x-shellscript",
    "application/x-yaml",
    "application/yaml",
    "application/toml",
    "application/sql",
    "image/svg+xml",
}
GENERIC_TYPES = {"application/octet-stream", "text/plain", "inode/x-empty", "application/x-empty"}


def libmagic_available() -> bool:
    return _DETECTOR is not None


def detect_mime(name: str, head: bytes) -> str:
    """The MIME type of a file called ``name`` whose first bytes are ``head``.

    libmagic decides from the content; where it only finds a generic type (plain text, empty, octet-stream)
    a more specific type from the extension wins (``.csv`` → ``text/csv``, ``.json`` → ``application/json``).
    """
    by_name, _ = mimetypes.guess_type(name, strict=False)
    if _DETECTOR is not None and head:
        try:
            found = _DETECTOR.from_buffer(head)
        except Exception:  # libmagic can fail on odd input; the extension still tells something
            found = None
        if found and (found not in GENERIC_TYPES or not by_name):
            return "text/plain" if found in {"inode/x-empty", "application/x-empty"} else found
    if by_name:
        return by_name
    if not head:
        return "text/plain"
    return "text/plain" if _looks_like_text(head) else "application/octet-stream"


def is_text(mime_type: str, head: bytes) -> bool:
    """Whether content of this type is returned inline as text."""
    if mime_type.startswith("text/") or mime_type in TEXT_TYPES or mime_type.endswith(("+json", "+xml")):
        return True
    return mime_type == "application/octet-stream" and _looks_like_text(head)


def _looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the end of the sample is still text.
        return exc.start >= len(head) - 3
    return True
