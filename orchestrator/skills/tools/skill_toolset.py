"""``SkillToolSet``: the seven skill tools of the guide, and ``skill_search`` for large libraries.

``skill_list``, ``skill_list_tools``, ``skill_load``, ``skill_select_tools``, ``skill_list_docs``,
``skill_select_docs`` and ``skill_run``. Loading and selecting write the skill state keys (see
``orchestrator.skills.state``; their scope follows the agent's load mode) through the tool call's
``state_delta``; ``skill_run`` goes through a dispatcher (the same the HTTP API uses) with the session id as the
workspace id, so a session's ``work/`` and ``out/`` persist across its runs. ``skill_search`` is declared only
when the library is past the size at which the overview lists every skill. The agent's ``SkillOptions`` (load
mode, loaded cap, content in tool results, search page size) are read from the invocation's agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import ValidationError

from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.context import InvocationContext
from orchestrator.dispatch import BaseDispatcher, InlineDispatcher
from orchestrator.errors import RunRefusedError, SkillError
from orchestrator.skills.admission import run_egress, undeclared_secrets
from orchestrator.skills.options import options_of
from orchestrator.skills.overview import is_cut
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.state import (
    ALL_DOCS,
    key,
    loaded_skills,
    selected_docs,
    selected_tools,
    touch,
)
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool
from orchestrator.tools.toolset import BaseToolSet
from worker.contract import WORKSPACE_ID_PATTERN, RunRequest
from worker.errors import WorkerError
from worker.runtimes import LocalWorkspaceRuntime
from worker.validation import validate_request
from worker.workspaces import BaseSkillStager

Mode = Literal["add", "replace", "clear"]
SKIPPED_SHOWN = 50
"""Refused files a tool result lists (a command can leave thousands); the rest are counted."""
RUN_TOOL_OPTIONS = {"save_as_artifacts", "omit_inline_content", "timeout", "runtime", "limits"}


def workspace_id_for(user_id: str, session_id: str) -> str:
    """A session's workspace id: ``<user>.<session>`` when that is a valid workspace id, else its hash, so two
    users' sessions of the same id never share a workspace."""
    candidate = f"{user_id}.{session_id}"
    if WORKSPACE_ID_PATTERN.fullmatch(candidate):
        return candidate
    return "s" + hashlib.sha256(candidate.encode()).hexdigest()[:40]


class SkillToolSet(BaseToolSet):
    """The skill tools over ``repository``."""

    def __init__(
        self,
        repository: BaseSkillRepository,
        skill_stager: BaseSkillStager | None = None,
        run_tool_kwargs: dict[str, Any] | None = None,
        dispatcher: BaseDispatcher | None = None,
        name: str = "skill_tools",
        egress: Callable[[str], list[str]] | None = None,
    ) -> None:
        """``egress``: the control plane's look-up of a team's egress allow-list (``orchestrator.egress``); a run
        of a skill declaring hosts (``metadata.egress``) then reaches those its team's list also allows. Without
        it, runs have no network."""
        super().__init__(name=name)
        unknown = set(run_tool_kwargs or {}) - RUN_TOOL_OPTIONS
        if unknown:
            raise ValueError(f"unknown run_tool_kwargs: {', '.join(sorted(unknown))} (known: {', '.join(sorted(RUN_TOOL_OPTIONS))})")
        self.repository = repository
        self.skill_stager = skill_stager
        self.run_tool_kwargs = dict(run_tool_kwargs or {})
        self._dispatcher = dispatcher
        self._owns_dispatcher = dispatcher is None
        self.egress = egress
        self._tools: list[BaseTool] = [
            FunctionTool(f) for f in (
                self.skill_list, self.skill_list_tools, self.skill_load, self.skill_select_tools,
                self.skill_list_docs, self.skill_select_docs, self.skill_run,
            )
        ]
        self._search_tool = FunctionTool(self.skill_search)

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        options = options_of(invocation_context.agent if invocation_context is not None else None)
        if is_cut(self.repository.index(), options):
            return [*self._tools, self._search_tool]
        return list(self._tools)

    @property
    def dispatcher(self) -> BaseDispatcher:
        if self._dispatcher is None:
            runtime = self.repository.workspace_runtime or create_local_workspace_runtime(stager=self.skill_stager)
            if self.skill_stager is not None and isinstance(runtime, LocalWorkspaceRuntime):
                runtime.stager = self.skill_stager
            self._dispatcher = InlineDispatcher({runtime.name.value: runtime})
        return self._dispatcher

    async def close(self) -> None:
        if self._owns_dispatcher and self._dispatcher is not None:
            await self._dispatcher.close()
            self._dispatcher = None

    def skill_list(self) -> list[str]:
        """List the names of all available skills."""
        return self.repository.skill_list()

    def skill_list_tools(self, skill_name: str) -> Any:
        """List the tools a skill declares in the Tools: section of its SKILL.md.

        Args:
            skill_name: The skill's name, as skill_list returns it.
        """
        try:
            return self.repository.get(skill_name).tools
        except SkillError as exc:
            return {"error": str(exc)}

    def skill_load(
        self, skill_name: str, tool_context: InvocationContext, docs: list[str] | None = None, include_all_docs: bool = False
    ) -> Any:
        """Load a skill: its full instructions join the context, and all its declared tools are selected.

        Args:
            skill_name: The skill to load.
            docs: Doc file names to load with it (see skill_list_docs).
            include_all_docs: Load every doc of the skill.
        """
        try:
            skill = self.repository.get(skill_name)
        except SkillError as exc:
            return {"error": str(exc)}
        options = options_of(tool_context.agent)
        mode = options.load_mode
        delta = tool_context.actions.state_delta
        if docs and not include_all_docs:
            unknown = [d for d in docs if skill.doc(d) is None]
            if unknown:
                return {"error": f"skill {skill_name!r} has no doc {', '.join(map(repr, unknown))} (docs: {skill.doc_names})"}
        delta[key("loaded", skill_name, mode)] = "1"
        if include_all_docs:
            delta[key("docs", skill_name, mode)] = ALL_DOCS
        elif docs:
            delta[key("docs", skill_name, mode)] = json.dumps(list(docs))
        if selected_tools(tool_context.state, skill_name) is None:
            delta[key("tools", skill_name, mode)] = json.dumps(skill.tools)
        evicted = touch(tool_context.state, delta, skill_name, mode, options.max_loaded_skills)
        message = f"skill {skill_name!r} loaded"
        if not evicted and not options.content_in_tool_results:
            return message
        answer: dict[str, Any] = {"result": message}
        if evicted:
            answer["unloaded"] = evicted
        if options.content_in_tool_results:
            chosen = skill.doc_names if include_all_docs else list(docs or [])
            answer["instructions"] = skill.body
            answer["docs"] = {name: skill.doc(name).content for name in chosen}
        return answer

    def skill_search(self, query: str, tool_context: InvocationContext, page: int = 1) -> Any:
        """Find skills by what they do: names and descriptions of the best matches, a page at a time.

        Args:
            query: The task in a few words, e.g. "convert invoices to PDF".
            page: Which page of results, from 1.
        """
        if not query.strip():
            return {"error": "the query is empty: describe the task in a few words"}
        if page < 1:
            return {"error": f"page must be 1 or more (got {page})"}
        size = options_of(tool_context.agent).search_page_size
        index = self.repository.index()
        hits = index.search(query, size + 1, offset=(page - 1) * size)
        return {
            "skills": [{"name": h.summary.name, "description": h.summary.description} for h in hits[:size]],
            "page": page,
            "more": len(hits) > size,
        }

    def skill_select_tools(
        self,
        skill_name: str,
        tool_context: InvocationContext,
        tools: list[str] | None = None,
        include_all_tools: bool = False,
        mode: Mode = "replace",
    ) -> Any:
        """Choose which of a loaded skill's tools are offered, to save tokens.

        Args:
            skill_name: The skill whose tools to choose.
            tools: Tool names (from skill_list_tools).
            include_all_tools: Select every declared tool.
            mode: "add" to the selection, "replace" it (default), or "clear" it.
        """
        try:
            declared = self.repository.get(skill_name).tools
        except SkillError as exc:
            return {"error": str(exc)}
        unknown = [t for t in tools or [] if t not in declared]
        if unknown:
            return {"error": f"skill {skill_name!r} does not declare {', '.join(map(repr, unknown))} (tools: {declared})"}
        current = selected_tools(tool_context.state, skill_name) or []
        if mode == "clear":
            chosen: list[str] = []
        elif include_all_tools:
            chosen = list(declared)
        elif mode == "add":
            chosen = current + [t for t in tools or [] if t not in current]
        else:
            chosen = list(dict.fromkeys(tools or []))
        options = options_of(tool_context.agent)
        tool_context.actions.state_delta[key("tools", skill_name, options.load_mode)] = json.dumps(chosen)
        self._touch_if_loaded(tool_context, skill_name)
        return {"selected_tools": chosen, "include_all_tools": bool(include_all_tools and mode != "clear")}

    def skill_list_docs(self, skill_name: str) -> Any:
        """List the doc files of a skill.

        Args:
            skill_name: The skill whose docs to list.
        """
        try:
            return self.repository.get(skill_name).doc_names
        except SkillError as exc:
            return {"error": str(exc)}

    def skill_select_docs(
        self,
        skill_name: str,
        tool_context: InvocationContext,
        docs: list[str] | None = None,
        include_all_docs: bool = False,
        mode: Mode = "replace",
    ) -> Any:
        """Choose which docs of a skill join the context.

        Args:
            skill_name: The skill whose docs to choose.
            docs: Doc file names (from skill_list_docs).
            include_all_docs: Select every doc.
            mode: "add" to the selection, "replace" it (default), or "clear" it.
        """
        try:
            skill = self.repository.get(skill_name)
        except SkillError as exc:
            return {"error": str(exc)}
        unknown = [d for d in docs or [] if skill.doc(d) is None]
        if unknown:
            return {"error": f"skill {skill_name!r} has no doc {', '.join(map(repr, unknown))} (docs: {skill.doc_names})"}
        current = selected_docs(tool_context.state, skill_name)
        options = options_of(tool_context.agent)
        docs_key = key("docs", skill_name, options.load_mode)
        if mode == "clear":
            chosen: list[str] = []
            tool_context.actions.state_delta[docs_key] = json.dumps(chosen)
        elif include_all_docs:
            chosen = skill.doc_names
            tool_context.actions.state_delta[docs_key] = ALL_DOCS
        else:
            if mode == "add":
                base = skill.doc_names if current == ALL_DOCS else list(current)
                chosen = base + [d for d in docs or [] if d not in base]
            else:
                chosen = list(dict.fromkeys(docs or []))
            tool_context.actions.state_delta[docs_key] = json.dumps(chosen)
        self._touch_if_loaded(tool_context, skill_name)
        answer: dict[str, Any] = {"selected_docs": chosen, "include_all_docs": bool(include_all_docs and mode != "clear")}
        if options.content_in_tool_results:
            answer["docs"] = {name: skill.doc(name).content for name in chosen}
        return answer

    @staticmethod
    def _touch_if_loaded(tool_context: InvocationContext, skill_name: str) -> None:
        if skill_name in loaded_skills(tool_context.state):
            options = options_of(tool_context.agent)
            touch(tool_context.state, tool_context.actions.state_delta, skill_name, options.load_mode,
                  options.max_loaded_skills)

    def _egress(self, skill: str, owner: str) -> list[str]:
        """What a run of ``skill`` for ``owner`` may reach."""
        return run_egress(self.repository, skill, self.egress(owner))

    async def skill_run(
        self,
        skill: str,
        command: str,
        tool_context: InvocationContext,
        output_files: list[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        secrets: list[str] | None = None,
    ) -> dict[str, Any]:
        """Run a shell command in the skill's folder inside this session's isolated workspace.

        Args:
            skill: The skill whose folder the command runs in.
            command: The shell command (bash). Use $WORK_DIR, $OUTPUT_DIR and the other workspace variables.
            output_files: Glob patterns of files to return, e.g. ["out/*.txt", "$OUTPUT_DIR/result.json"].
            env: Extra environment variables for the command.
            timeout: Seconds before the command is killed.
            secrets: Names of the team's secrets the skill declares, given to the command as environment variables
                (their values never come back).
        """
        try:
            ref = self.repository.skill_ref(skill)
            fields: dict[str, Any] = {k: v for k, v in self.run_tool_kwargs.items()}
            if timeout is not None:
                fields["timeout"] = timeout
            if secrets:
                problem = undeclared_secrets(self.repository, skill, secrets)
                if problem is not None:
                    return {"error": problem}
                fields["secrets"] = secrets
            if self.egress is not None:
                fields["egress"] = await asyncio.to_thread(self._egress, skill, tool_context.session.user_id)
            request = RunRequest(
                skill=ref, command=command, output_files=output_files or [], env=env or {},
                workspace_id=workspace_id_for(tool_context.session.user_id, tool_context.session.id), **fields,
            )
            validate_request(request)  # refused before it is recorded or queued
            # The session's user owns the run and its workspace (the team, through the API), whatever its id
            result = await self.dispatcher.run(request, owner=tool_context.session.user_id)
        except (SkillError, RunRefusedError, WorkerError) as exc:
            return {"error": str(exc)}
        except ValidationError as exc:
            return {"error": "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())}
        answer = result.tool_result()
        if result.skipped_files:
            answer["skipped_files"] = [s.model_dump() for s in result.skipped_files[:SKIPPED_SHOWN]]
            if len(result.skipped_files) > SKIPPED_SHOWN:
                answer["skipped_files_not_shown"] = len(result.skipped_files) - SKIPPED_SHOWN
        if result.egress_refused:  # what the run tried to reach and could not, so the model need not guess
            answer["egress_refused"] = result.egress_refused
            answer["egress_refusals"] = [r.model_dump() for r in result.egress_refusals[:SKIPPED_SHOWN]]
        return answer
