"""What several commands share: the skill repository the command line points at."""

from __future__ import annotations

import argparse

from orchestrator.config import get_settings
from orchestrator.skills import BaseSkillRepository, create_default_skill_repository


def repository(args: argparse.Namespace) -> BaseSkillRepository:
    """``--skills-root`` (repeatable), else ``SKILLS_ROOT``, else ``./skills``; cached, so a command that asks more
    than once (``chat``: every model request) parses and indexes the library once."""
    roots = args.skills_root or get_settings().skills_roots()
    return create_default_skill_repository(roots, use_cached_repository=True)
