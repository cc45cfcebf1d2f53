"""Models: the interface and the OpenAI-compatible implementation."""

from orchestrator.models import constants
from orchestrator.models.base import LlmRequest, LlmResponse, LLMModel
from orchestrator.models.openai_model import OpenAIModel

__all__ = ["LLMModel", "LlmRequest", "LlmResponse", "OpenAIModel", "constants"]
