"""``SkillMcpServer``: a skill library served over MCP, every run in Skillrun's sandboxes.

Built on the ``mcp`` SDK's low-level ``Server``, so the tools are declared exactly as the skill tools declare
themselves to an agent (``SkillToolSet``: the guide's names and schemas; ``skill_search`` where the library is
past the overview's size), and served over stdio (``skillrun mcp``) or streamable HTTP (the API's ``/mcp``).

* **Tools** run through the skill tools with a context per MCP session (``Conversation``): loading a skill returns
  its instructions and docs, and ``skill_run`` goes through the dispatcher the caller's scope names (the queue and
  its workers when Redis is configured), in the session's own workspace, within ``McpCaps``.
* **Resources**: each skill's ``SKILL.md`` (``skill://<name>/SKILL.md``) and docs (``skill://<name>/<doc path>``),
  listed a page of skills at a time and readable, plus ``skill://overview``: every skill's name and description.
* **Scope**: ``scope_of(request)`` says what the caller may use — the team behind the HTTP request's key, or the
  one library of a stdio server (``request`` is ``None`` then).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import mimetypes
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import anyio
from mcp import McpError, types
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.helper_types import ReadResourceContents
from starlette.requests import Request

from orchestrator.errors import SkillError
from orchestrator.mcp_server.content import call_result
from orchestrator.mcp_server.conversation import Conversation, ForeignSessionError, Scope
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.skill import SKILL_FILE
from orchestrator.skills.tools.skill_toolset import SkillToolSet
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import wrap_result
from worker.contract import RunLimits

RESOURCE_NOT_FOUND = -32002
SKILLS_PER_PAGE = 50
OVERVIEW_URI = "skill://overview"
END_GRACE_SECONDS = 30.0
INSTRUCTIONS = (
    "Skillrun serves a library of Agent Skills. Read skill://overview (or call skill_list) to see the skills; "
    "skill_load returns a skill's instructions and, on request, its docs; skill_run runs a shell command in the "
    "skill's folder inside this session's isolated workspace, whose work/ and out/ folders persist across the "
    "session's runs; name the files to return with output_files globs."
)
ScopeOf = Callable[[Request | None], Awaitable[Scope]]
_conversation: contextvars.ContextVar[Conversation] = contextvars.ContextVar("skillrun_mcp_conversation")


@dataclass(frozen=True)
class McpCaps:
    """Bounds of what ``skill_run`` returns to an MCP client (the client is told them in the tool's description)."""

    output_file_bytes: int = 1024 * 1024
    output_total_bytes: int = 8 * 1024 * 1024

    def limits(self) -> RunLimits:
        return RunLimits(output_file_bytes=self.output_file_bytes, output_total_bytes=self.output_total_bytes)

    def note(self) -> str:
        return (f" Output files come back as content (text, images, other files as embedded resources) up to "
                f"{self.output_file_bytes:,} bytes each and {self.output_total_bytes:,} bytes in all; past that a "
                f"file is cut (truncated: true).")


class SkillMcpServer(Server):
    """See the module docstring."""

    def __init__(self, scope_of: ScopeOf, caps: McpCaps | None = None, name: str = "skillrun") -> None:
        super().__init__(name, instructions=INSTRUCTIONS)
        self._scope_of = scope_of
        self.caps = caps or McpCaps()
        self._toolsets: weakref.WeakKeyDictionary[BaseSkillRepository, SkillToolSet] = weakref.WeakKeyDictionary()
        self.list_tools()(self._list_tools)
        self.call_tool(validate_input=False)(self._call_tool)  # the skill tools check arguments, naming each problem
        self.list_resources()(self._list_resources)
        self.list_resource_templates()(self._resource_templates)
        self.read_resource()(self._read_resource)

    async def run(self, read_stream: Any, write_stream: Any, *args: Any, **kwargs: Any) -> None:
        """Serve one MCP session (the SDK calls this per session) with a ``Conversation`` of its own, ended with it.
        When the client's stream ends (it went away, closed stdin, its HTTP session was ended) the calls still
        under way are cancelled, and with them their runs: the SDK alone would wait for them to finish."""
        conversation = Conversation()
        token = _conversation.set(conversation)
        serve = super().run
        try:
            async with anyio.create_task_group() as group:
                into_session, session_read = anyio.create_memory_object_stream[Any](0)

                async def forward() -> None:
                    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                        async with into_session:
                            async for message in read_stream:
                                await into_session.send(message)
                    group.cancel_scope.cancel()

                async def session() -> None:
                    await serve(session_read, write_stream, *args, **kwargs)
                    group.cancel_scope.cancel()

                group.start_soon(forward)
                group.start_soon(session)
        finally:
            _conversation.reset(token)
            with anyio.CancelScope(shield=True), anyio.move_on_after(END_GRACE_SECONDS):
                await conversation.end()

    async def _scope(self) -> Scope:
        try:
            request = self.request_context.request
        except LookupError:
            request = None
        return await self._scope_of(request if isinstance(request, Request) else None)

    def _toolset(self, scope: Scope) -> SkillToolSet:
        toolset = self._toolsets.get(scope.repository)
        if toolset is None:
            toolset = SkillToolSet(scope.repository, dispatcher=scope.dispatcher,
                                   run_tool_kwargs={"limits": self.caps.limits()}, egress=scope.egress)
            self._toolsets[scope.repository] = toolset
        return toolset

    async def _tools(self, scope: Scope) -> dict[str, BaseTool]:
        return {tool.name: tool for tool in await self._toolset(scope).get_tools(None)}

    async def _list_tools(self) -> list[types.Tool]:
        tools = await self._tools(await self._scope())
        return [
            types.Tool(name=tool.name, description=tool.description + (self.caps.note() if tool.name == "skill_run" else ""),
                       inputSchema=tool.parameters_schema())
            for tool in tools.values()
        ]

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        scope = await self._scope()
        conversation = _conversation.get()
        try:
            conversation.claim(scope)
        except ForeignSessionError as exc:
            return call_result(name, {"error": str(exc)})
        tool = (await self._tools(scope)).get(name)
        if tool is None:
            return call_result(name, {"error": f"unknown tool {name!r}; the tools are: "
                                               f"{', '.join(sorted(await self._tools(scope)))}"})
        context = conversation.context(scope)
        if name == "skill_run":
            conversation.will_run(scope)
        answer = wrap_result(await tool.run_async(tool_context=context, args=arguments))
        conversation.record(context)
        return call_result(name, answer)

    async def _list_resources(self, request: types.ListResourcesRequest) -> types.ListResourcesResult:
        repository = (await self._scope()).repository
        cursor = request.params.cursor if request.params is not None else None
        start = _page_start(cursor)
        return await asyncio.to_thread(_resource_page, repository, start)

    async def _resource_templates(self) -> list[types.ResourceTemplate]:
        return [
            types.ResourceTemplate(uriTemplate="skill://{name}/SKILL.md", name="skill",
                                   description="A skill's SKILL.md: front matter and instructions",
                                   mimeType="text/markdown"),
            types.ResourceTemplate(uriTemplate="skill://{name}/{doc}", name="skill-doc",
                                   description="A doc file of a skill (see skill_list_docs)"),
        ]

    async def _read_resource(self, uri: Any) -> list[ReadResourceContents]:
        repository = (await self._scope()).repository
        text, mime = await asyncio.to_thread(_read, repository, str(uri))
        return [ReadResourceContents(content=text, mime_type=mime)]


def _page_start(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not (cursor.isascii() and cursor.isdecimal()) or len(cursor) > 9:
        raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"invalid cursor {cursor[:40]!r}"))
    return int(cursor)


def _resource_page(repository: BaseSkillRepository, start: int) -> types.ListResourcesResult:
    """``SKILLS_PER_PAGE`` skills' resources from the ``start``-th skill (the overview first, on the first page)."""
    summaries = sorted(repository.summaries(), key=lambda s: s.name)
    resources: list[types.Resource] = []
    if start == 0:
        resources.append(types.Resource(uri=OVERVIEW_URI, name="overview", mimeType="text/markdown",
                                        description="Every skill's name and description"))
    for summary in summaries[start:start + SKILLS_PER_PAGE]:
        resources.append(types.Resource(uri=_uri(summary.name, "SKILL.md"), name=f"{summary.name}/SKILL.md",
                                        description=summary.description, mimeType="text/markdown"))
        try:
            docs = repository.get(summary.name).doc_names
        except SkillError:  # changed since it was listed: its SKILL.md entry says enough
            continue
        for doc in docs:
            resources.append(types.Resource(uri=_uri(summary.name, doc), name=f"{summary.name}/{doc}",
                                            mimeType=_mime(doc)))
    following = start + SKILLS_PER_PAGE
    return types.ListResourcesResult(resources=resources, nextCursor=str(following) if following < len(summaries) else None)


def _read(repository: BaseSkillRepository, uri: str) -> tuple[str, str]:
    """A resource's text and MIME type."""
    if uri == OVERVIEW_URI:
        summaries = sorted(repository.summaries(), key=lambda s: s.name)
        return "\n".join(f"- {s.name}: {s.description}" for s in summaries), "text/markdown"
    parts = urlsplit(uri)
    name, path = parts.netloc, unquote(parts.path.lstrip("/"))
    if parts.scheme != "skill" or not name or not path or parts.query or parts.fragment:
        raise _not_found(f"{uri!r} is not a skill resource: skill://<skill name>/SKILL.md or skill://<name>/<doc>")
    try:
        skill = repository.get(name)
    except SkillError as exc:
        raise _not_found(str(exc)) from None
    if path == "SKILL.md":
        return (skill.path / SKILL_FILE).read_text(encoding="utf-8", errors="replace"), "text/markdown"
    doc = skill.doc(path)
    if doc is None:
        raise _not_found(f"skill {name!r} has no doc {path!r} (docs: {', '.join(skill.doc_names) or 'none'})")
    return doc.content, _mime(path)


def _uri(skill: str, path: str) -> str:
    return f"skill://{skill}/{quote(path)}"


def _mime(path: str) -> str:
    return "text/markdown" if path.endswith(".md") else mimetypes.guess_type(path)[0] or "text/plain"


def _not_found(message: str) -> McpError:
    return McpError(types.ErrorData(code=RESOURCE_NOT_FOUND, message=message))
