"""Runners drive agents over sessions."""

from orchestrator.runners.runner import Runner

__all__ = ["Runner"]
