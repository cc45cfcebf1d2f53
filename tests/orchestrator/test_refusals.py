"""The service layer refuses with the plane's errors, and one table answers each of them over HTTP."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import orchestrator.errors
import orchestrator.services
from orchestrator.api.responses import REFUSALS, refusal
from orchestrator.errors import (
    InvalidRunError,
    RunLostError,
    RunNotFoundError,
    SkillNotFoundError,
    UnavailableError,
)
from orchestrator.libraries import LibraryError, LibraryLimitError
from orchestrator.quotas import QuotaExceededError
from orchestrator.skills import create_default_skill_repository, run_egress, undeclared_secrets
from worker import errors as worker_errors
from worker.errors import EnvironmentNotReadyError

SERVICES = Path(orchestrator.services.__file__).parent


def _raised_names(path: Path) -> set[str]:
    """The names of the classes a module raises (``raise X(...)``; ``raise missing_run(...)`` raises what that
    function's annotation names, ``RunLostError | RunNotFoundError``)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
            names.add(node.exc.func.id)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names and node.returns is not None:
            names.discard(node.name)
            names.update(n.id for n in ast.walk(node.returns) if isinstance(n, ast.Name))
    return names


def test_every_refusal_the_services_raise_has_an_http_status():
    raised = set().union(*(_raised_names(path) for path in SERVICES.glob("*.py")))
    assert raised, "the service layer raises nothing: the scan is broken"
    classes = {name: getattr(orchestrator.errors, name, None) or getattr(worker_errors, name, None) for name in raised}
    assert all(classes.values()), f"raised but not the planes' errors: {[n for n, c in classes.items() if c is None]}"
    unanswered = [name for name, cls in classes.items() if not any(base in REFUSALS for base in cls.__mro__)]
    assert unanswered == []


@pytest.mark.parametrize(("error", "status"), [
    (RunNotFoundError("r1"), 404),
    (RunLostError("r1"), 410),
    (InvalidRunError("timeout: too long"), 422),
    (EnvironmentNotReadyError("not built"), 409),
    (LibraryError("not an archive"), 422),
    (LibraryLimitError("at most 10 libraries"), 409),
])
def test_a_refusal_is_answered_with_its_nearest_classes_status(error: Exception, status: int):
    answer = refusal(error)
    assert (answer.status_code, answer.detail, answer.headers) == (status, str(error), None)


def test_waiting_may_help_says_when_to_try_again():
    assert refusal(QuotaExceededError("runs", "at most 5 runs at once", retry_after=3)).headers == {"Retry-After": "3"}
    assert refusal(QuotaExceededError("storage", "over the storage quota")).headers is None
    away = refusal(UnavailableError("Redis cannot be reached", 5))
    assert (away.status_code, away.headers) == (503, {"Retry-After": "5"})


def _library(root: Path) -> Path:
    folder = root / "github"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: github\ndescription: Calls GitHub.\nmetadata:\n  secrets: [GH_TOKEN]\n"
                                     "  egress: [api.github.com, uploads.github.com]\n---\nCall the API.\n")
    return root


def test_what_a_run_of_a_skill_may_be_given_is_one_rule(tmp_path):
    """The API's and the console's submissions and the skill tools' skill_run (agents, MCP clients) ask one rule:
    secrets the skill declares, hosts it declares that its team also allows."""
    repository = create_default_skill_repository(str(_library(tmp_path)))
    assert undeclared_secrets(repository, "github", ["GH_TOKEN"]) is None
    assert undeclared_secrets(repository, "github", ["GH_TOKEN", "AWS_KEY"]) == (
        "skill 'github' does not declare the secret AWS_KEY (it declares: GH_TOKEN; metadata.secrets in its SKILL.md)")
    assert run_egress(repository, "github", []) == []
    assert run_egress(repository, "github", ["api.github.com", "pypi.org"]) == ["api.github.com:443"]
    assert run_egress(repository, "missing", []) == []  # the skill is not read when the team allows nothing
    with pytest.raises(SkillNotFoundError):
        run_egress(repository, "missing", ["api.github.com"])
