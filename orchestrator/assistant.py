"""The ready-made skill assistant that ``skillrun chat`` and the HTTP API serve.

An ``LlmAgent`` on the configured OpenAI-compatible model, with the skill tools over the configured skills roots
and three-tier injection shaped by the ``SKILLRUN_SKILL_*`` settings (overview size, load mode, loaded cap), running skill commands through the given dispatcher; sessions in Redis when
``SKILLRUN_REDIS_URL`` is set, else as files under ``SKILLRUN_DATA_DIR``.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.agents import LlmAgent
from orchestrator.config import Settings
from orchestrator.dispatch import BaseDispatcher
from orchestrator.models import OpenAIModel
from orchestrator.sessions import (
    BaseSessionService,
    FileSessionService,
    RedisSessionService,
)
from orchestrator.skills import BaseSkillRepository, SkillOptions, SkillToolSet

INSTRUCTION = """You are a helpful assistant with access to Agent Skills.
When a task matches a skill, load it first, read its instructions, then run its commands with skill_run and
report what the commands produced. When the skill list is cut and none of the listed skills fits, find one with
skill_search. Write outputs to $OUTPUT_DIR and collect them with output_files."""


def create_assistant(settings: Settings, repository: BaseSkillRepository, dispatcher: BaseDispatcher | None = None,
                     egress: Callable[[str], list[str]] | None = None) -> LlmAgent:
    """The assistant; ``egress`` looks up a team's egress allow-list for its ``skill_run`` (``SkillToolSet``)."""
    model = OpenAIModel(model_name=settings.model, api_key=settings.openai_api_key, base_url=settings.openai_base_url)
    return LlmAgent(
        name="skillrun_assistant",
        description="An assistant that uses the team's Agent Skills.",
        model=model,
        instruction=INSTRUCTION,
        tools=[SkillToolSet(repository, dispatcher=dispatcher, egress=egress)],
        skill_repository=repository,
        skill_options=SkillOptions.from_settings(settings),
        max_steps=settings.max_steps,
    )


def create_session_service(settings: Settings) -> BaseSessionService:
    if settings.redis_url:
        return RedisSessionService(settings.redis_url)
    return FileSessionService(settings.data_dir / "sessions")
