"""A scripted OpenAI-compatible chat-completions server for tests.

It listens on loopback, answers ``POST /v1/chat/completions`` from a script (streaming as server-sent events when
the request asks for ``stream``, else one JSON completion) and records every request body, so a test can assert
what the model was sent. A script item is a dict:

* ``text``: the answer text (streamed in a few pieces)
* ``reasoning``: reasoning text, sent as ``reasoning_content`` deltas
* ``tool_calls``: ``[{"name", "arguments": dict or raw str, "id"?}]``; streamed arguments come in ``chunk``-sized pieces
* ``status``: answer with this HTTP error status instead (``headers``: with these headers)
* ``usage``: ``{"prompt_tokens", "completion_tokens"}``

or a callable taking the request body and returning such a dict. ``timings`` holds, per request, when it arrived
and when its reply was sent (``time.perf_counter``), so a benchmark can tell the model's time from the agent's.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Script = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class ScriptedModelServer:
    def __init__(self, chunk: int = 7) -> None:
        self.requests: list[dict[str, Any]] = []
        self.timings: list[tuple[float, float]] = []
        self.script: deque[Script] = deque()
        self.chunk = chunk
        self._ids = itertools.count(1)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each small write after the first waits for the client's delayed ACK

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                arrived = time.perf_counter()
                self._answer()
                server.timings.append((arrived, time.perf_counter()))

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                server.requests.append(body)
                item = server.script.popleft() if server.script else {"status": 500, "text": "script exhausted"}
                reply = item(body) if callable(item) else item
                if "status" in reply:
                    self._json(reply["status"], {"error": {"message": reply.get("text", "scripted failure"), "type": "server_error"}},
                               reply.get("headers", {}))
                elif body.get("stream"):
                    self._stream(body, reply)
                else:
                    self._json(200, server.completion(body, reply))

            def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any], reply: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in server.chunks(body, reply):
                    self._send(f"data: {json.dumps(chunk)}\n\n")
                self._send("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _send(self, text: str) -> None:
                data = text.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def add(self, *items: Script) -> "ScriptedModelServer":
        self.script.extend(items)
        return self

    def start(self) -> "ScriptedModelServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- what the server sends -------------------------------------------------------------------------------

    def _calls(self, reply: dict[str, Any]) -> list[dict[str, str]]:
        calls = []
        for call in reply.get("tool_calls", []):
            args = call.get("arguments", {})
            calls.append({
                "id": call.get("id") or f"call_{next(self._ids)}",
                "name": call["name"],
                "arguments": args if isinstance(args, str) else json.dumps(args),
            })
        return calls

    def _usage(self, reply: dict[str, Any]) -> dict[str, int]:
        usage = reply.get("usage", {"prompt_tokens": 11, "completion_tokens": 7})
        return {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}

    def completion(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        calls = self._calls(reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("text")}
        if reply.get("reasoning"):
            message["reasoning_content"] = reply["reasoning"]
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
            ]
        return {
            "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": self._usage(reply),
        }

    def chunks(self, body: dict[str, Any], reply: dict[str, Any]) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": body.get("model", ""),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        out = [chunk({"role": "assistant", "content": ""})]
        for piece in _pieces(reply.get("reasoning", ""), 5):
            out.append(chunk({"reasoning_content": piece}))
        for piece in _pieces(reply.get("text") or "", 4):
            out.append(chunk({"content": piece}))
        calls = self._calls(reply)
        for index, call in enumerate(calls):
            out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                               "function": {"name": call["name"], "arguments": ""}}]}))
            for piece in _pieces(call["arguments"], self.chunk):
                out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        out.append(chunk({}, "tool_calls" if calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
                        "model": body.get("model", ""), "choices": [], "usage": self._usage(reply)})
        return out


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] if text else []
