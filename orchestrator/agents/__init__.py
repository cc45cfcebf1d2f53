"""Agents: the interface and the model-driven ``LlmAgent``."""

from orchestrator.agents.base import BaseAgent
from orchestrator.agents.llm_agent import LlmAgent

__all__ = ["BaseAgent", "LlmAgent"]
