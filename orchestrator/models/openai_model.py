"""``OpenAIModel``: any OpenAI-compatible chat-completions endpoint through the ``openai`` SDK.

Streams text, reasoning (``reasoning_content``, where the endpoint sends it, as thought parts) and tool calls
(parallel calls included); argument deltas of streaming tools are passed on as they arrive. 429, 5xx, timeouts
and dropped connections are retried with exponential backoff (or after the answer's ``Retry-After``, when longer)
as long as nothing of the answer was passed on yet.

The request body is built here as plain JSON and posted with the client's ``post`` (the SDK's own path under
``chat.completions.create``, without its walk of the body against the parameter types: that walk costs tens of
milliseconds per request once a session has a history and a few tools, and changes nothing in a plain body).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from orchestrator.errors import ModelError
from orchestrator.events import Usage
from orchestrator.models.base import LLMModel, LlmRequest, LlmResponse
from orchestrator.models.constants import TOOL_STREAMING_ARGS
from orchestrator.types import Content, FunctionCall, Part

DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_BACKOFF_SECONDS = 0.5
MAX_RETRY_AFTER_SECONDS = 60.0
"""The longest an endpoint's ``Retry-After`` is waited for before a retry (a longer one fails the call now)."""
DEFAULT_TIMEOUT_SECONDS = 120.0
CHAT_COMPLETIONS = "/chat/completions"
RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError, openai.APITimeoutError)


class OpenAIModel(LLMModel):
    """A chat model behind an OpenAI-compatible endpoint."""

    def __init__(
        self,
        model_name: str,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF_SECONDS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        **client_kwargs: Any,
    ) -> None:
        super().__init__(model_name)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self._client = openai.AsyncOpenAI(
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-set",
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
            timeout=timeout,
            max_retries=0,  # retries are ours: only while nothing was passed on
            **client_kwargs,
        )

    async def close(self) -> None:
        await self._client.close()

    async def generate_content_async(self, request: LlmRequest) -> AsyncIterator[LlmResponse]:
        attempt = 0
        while True:
            yielded = False
            try:
                source = self._stream(request) if request.stream else self._once(request)
                async for response in source:
                    yielded = True
                    yield response
                return
            except RETRYABLE as exc:
                if yielded or attempt >= self.max_retries:
                    raise ModelError(f"model endpoint failed after {attempt + 1} attempt(s): {_describe(exc)}") from exc
                asked = _retry_after(exc)
                if asked is not None and asked > MAX_RETRY_AFTER_SECONDS:
                    raise ModelError(f"model endpoint asks to retry after {asked:.0f} s (more than "
                                     f"{MAX_RETRY_AFTER_SECONDS:.0f}): {_describe(exc)}") from exc
                await asyncio.sleep(max(self.retry_backoff * (2**attempt), asked or 0.0))
                attempt += 1
            except openai.APIError as exc:
                raise ModelError(f"model endpoint refused the request: {_describe(exc)}") from exc

    def _arguments(self, request: LlmRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model_name, "messages": to_messages(request)}
        if request.tools:
            kwargs["tools"] = [{"type": "function", "function": decl} for decl in request.tools]
            kwargs["parallel_tool_calls"] = request.parallel_tool_calls
        return kwargs

    async def _once(self, request: LlmRequest) -> AsyncIterator[LlmResponse]:
        completion = await self._client.post(CHAT_COMPLETIONS, body=self._arguments(request), cast_to=ChatCompletion)
        if not completion.choices:
            raise ModelError("model endpoint returned no choices")
        message = completion.choices[0].message
        calls = [
            {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            for tc in (message.tool_calls or [])
        ]
        reasoning = (message.model_extra or {}).get("reasoning_content") or ""
        usage = _usage(completion.usage)
        yield _complete(reasoning, message.content or "", calls, usage, completion.choices[0].finish_reason)

    async def _stream(self, request: LlmRequest) -> AsyncIterator[LlmResponse]:
        stream = await self._client.post(
            CHAT_COMPLETIONS,
            body={**self._arguments(request), "stream": True, "stream_options": {"include_usage": True}},
            cast_to=ChatCompletion, stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
        text, reasoning = "", ""
        calls: dict[int, dict[str, str]] = {}
        usage: Usage | None = None
        finish: str | None = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                delta = choice.delta
                thought = (delta.model_extra or {}).get("reasoning_content") if delta is not None else None
                if thought:
                    reasoning += thought
                    yield LlmResponse(content=Content(role="model", parts=[Part(text=thought, thought=True)]), partial=True)
                if delta is not None and delta.content:
                    text += delta.content
                    yield LlmResponse(content=Content(role="model", parts=[Part(text=delta.content)]), partial=True)
                for tc in (delta.tool_calls or []) if delta is not None else []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    if tc.id:
                        slot["id"] = tc.id
                    if tc.function is not None and tc.function.name:
                        slot["name"] = tc.function.name
                    piece = tc.function.arguments if tc.function is not None else None
                    if piece:
                        slot["arguments"] += piece
                        if slot["name"] in request.streaming_tools:
                            call = FunctionCall(id=slot["id"], name=slot["name"], args={TOOL_STREAMING_ARGS: piece})
                            yield LlmResponse(
                                content=Content(role="model", parts=[Part(function_call=call)]),
                                partial=True, streaming_tool_call=True,
                            )
                if choice.finish_reason:
                    finish = choice.finish_reason
        yield _complete(reasoning, text, [calls[i] for i in sorted(calls)], usage, finish)


def _complete(reasoning: str, text: str, calls: list[dict[str, str]], usage: Usage | None, finish: str | None) -> LlmResponse:
    parts: list[Part] = []
    if reasoning:
        parts.append(Part(text=reasoning, thought=True))
    if text:
        parts.append(Part(text=text))
    malformed: dict[str, str] = {}
    for call in calls:
        call_id = call["id"] or f"call_{uuid.uuid4().hex[:24]}"
        raw = call["arguments"].strip()
        try:
            args = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            malformed[call_id] = call["arguments"]
            args = {}
        parts.append(Part(function_call=FunctionCall(id=call_id, name=call["name"], args=args)))
    return LlmResponse(
        content=Content(role="model", parts=parts), usage=usage, finish_reason=finish, malformed_calls=malformed
    )


def to_messages(request: LlmRequest) -> list[dict[str, Any]]:
    """The request as chat-completions messages."""
    messages: list[dict[str, Any]] = []
    if request.system_instruction:
        messages.append({"role": "system", "content": request.system_instruction})
    for content in request.contents:
        if content.role == "model":
            text = "".join(p.text for p in content.parts if p.text and not p.thought)
            calls = [p.function_call for p in content.parts if p.function_call]
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}}
                    for c in calls
                ]
            if text or calls:
                messages.append(message)
            continue
        responses = [p.function_response for p in content.parts if p.function_response]
        for response in responses:
            messages.append(
                {"role": "tool", "tool_call_id": response.id, "content": json.dumps(response.response, ensure_ascii=False, default=str)}
            )
        text = "".join(p.text for p in content.parts if p.text and not p.thought)
        if text:
            messages.append({"role": "user", "content": text})
    return messages


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    return Usage(
        prompt_tokens=raw.prompt_tokens or 0, completion_tokens=raw.completion_tokens or 0, total_tokens=raw.total_tokens or 0
    )


def _retry_after(exc: Exception) -> float | None:
    """The seconds a 429 or 503 answer's ``Retry-After`` asks for (seconds or an HTTP date), if it says."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}: {exc}" if status else str(exc) or type(exc).__name__
