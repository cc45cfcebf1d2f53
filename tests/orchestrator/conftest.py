"""Fixtures for agent tests: a scripted model server on loopback and the real openai client pointed at it."""

from __future__ import annotations

import pytest

from orchestrator.models import OpenAIModel
from tests.model_server import ScriptedModelServer


@pytest.fixture
def model_server() -> ScriptedModelServer:
    server = ScriptedModelServer().start()
    yield server
    server.stop()


@pytest.fixture
def model(model_server: ScriptedModelServer) -> OpenAIModel:
    return OpenAIModel(model_name="test-model", api_key="test-key", base_url=model_server.base_url, retry_backoff=0.01)


def system_message(body: dict) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def declared_tools(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def tool_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] == "tool"]
