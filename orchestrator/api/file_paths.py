"""The URL parameter that names a run's file: ``/v1/runs/{run_id}/files/{name:file}``.

Starlette's ``path`` convertor matches ``.*``, which stops at a line break, so a file a run named with one was listed
in its result but answered 404. A run may name its files anything the file system allows; this convertor matches
every character (the name arrives percent-decoded, as with ``path``), and the route compares it with the result's
names as they are.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class FilePathConvertor(Convertor[str]):
    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("file", FilePathConvertor())

FILE_NAME = "{name:file}"
"""A route's last segment: the path of one of a run's files (``FileName`` checks its length)."""
