"""The two planes: worker never imports orchestrator; public names are exported; the run contract at the bottom; no
modules that import each other."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import orchestrator
import worker
from orchestrator.errors import OrchestratorError
from tests import import_graph
from worker.errors import WorkerError


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".") if not m.name.endswith("__main__")]


def test_no_worker_module_loads_orchestrator():
    modules = _modules(worker)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'orchestrator'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_module_imports():
    for name in _modules(worker) + _modules(orchestrator):
        importlib.import_module(name)


def _packages(package) -> list:
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
            if m.ispkg]


def test_public_names_are_exported_and_listed():
    for package in (worker, orchestrator, *_packages(worker), importlib.import_module("orchestrator.skills")):
        assert package.__doc__, f"{package.__name__} says nothing of what it holds"
        for name in package.__all__:
            assert hasattr(package, name), f"{package.__name__}.{name} is in __all__ but missing"


def test_seed_import_paths_resolve():
    for module, name in [
        ("orchestrator.code_executors", "create_local_workspace_runtime"),
        ("orchestrator.code_executors", "create_container_workspace_runtime"),
        ("orchestrator.code_executors.cube", "CubeCodeExecutor"),
        ("orchestrator.code_executors.cube", "CubeCodeExecutorConfig"),
        ("orchestrator.code_executors.cube", "create_cube_workspace_runtime"),
        ("orchestrator.skills", "create_default_skill_repository"),
        ("orchestrator.skills", "SkillToolSet"),
        ("orchestrator.skills.tools", "LinkSkillStager"),
        ("orchestrator.agents", "LlmAgent"),
        ("orchestrator.runners", "Runner"),
        ("orchestrator.sessions", "InMemorySessionService"),
        ("orchestrator.types", "Content"),
        ("orchestrator.tools", "FunctionTool"),
        ("orchestrator.models", "OpenAIModel"),
        ("orchestrator.context", "InvocationContext"),
    ]:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_the_cli_starts_without_loading_the_model_sdk():
    code = "import sys, orchestrator.cli; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_cli_and_a_listing_load_only_what_they_use():
    code = ("import sys, orchestrator.cli; before = set(sys.modules); import orchestrator.cli.skills; "
            "print(sorted(m for m in ('pydantic_settings', 'orchestrator.config', 'worker.config') if m in before)); "
            "print(sorted(m for m in ('worker.egress.proxy', 'worker.runtimes', 'worker.contract', "
            "'orchestrator.skills.tools') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "[]"], out  # no settings for --help; no proxy or runtime for a listing


def _loaded_by(module: str) -> list[str]:
    code = (f"import sys; before = set(sys.modules); import {module}; "
            "print(' '.join(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'worker')))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


RUN_CONTRACT = {"worker", "worker.lazy", "worker.contract", "worker.defaults", "worker.names", "worker.errors"}
"""All the run contract loads of the worker: its package, its limits, its names (runtimes, environment variables,
egress entries) and the errors they raise."""
LOCAL_SANDBOX = {"worker.egress.proxy", "worker.egress.listener"} | {
    name for name in _modules(worker) if name.startswith(("worker.sandbox.", "worker.runtimes.local."))}
"""The local runtime's sandbox: what a Docker or Cube worker, the API and a client never need."""


def test_the_run_contract_is_at_the_bottom():
    assert set(_loaded_by("worker.contract")) <= RUN_CONTRACT, _loaded_by("worker.contract")


def test_the_worker_top_level_holds_a_handful_of_modules():
    top = sorted(m.name for m in pkgutil.iter_modules(worker.__path__) if not m.ispkg)
    assert len(top) <= 12, top


def test_the_runtime_base_does_not_load_the_local_sandbox():
    for module in ("worker.runtimes.base", "worker.outcome"):
        assert not set(_loaded_by(module)) & LOCAL_SANDBOX, (module, sorted(set(_loaded_by(module)) & LOCAL_SANDBOX))


def test_no_modules_import_each_other_and_no_import_in_a_function_dodges_a_circle():
    graph = import_graph.read_graph()
    assert graph.circles() == []
    assert graph.dodges() == []


def test_the_import_graph_sees_a_circle_and_a_dodge():
    graph = import_graph.ImportGraph(top={"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()},
                                     inner={"a": set(), "b": set(), "c": set(), "d": {"a"}})
    assert graph.circles() == [["a", "b", "c"]] and graph.dodges() == []
    graph.top["c"] = set()
    graph.inner["c"] = {"a"}
    assert graph.circles() == [] and graph.dodges() == [("c", "a")]


IN_SANDBOX = {"orchestrator.tools.file_tools.workspace_skill.ops"}
"""Runs inside a workspace and imports nothing of either plane, so its one exception is its own."""


def _exceptions_defined_in(package) -> list[type[BaseException]]:
    found = []
    for name in _modules(package):
        if name in IN_SANDBOX:
            continue
        module = importlib.import_module(name)
        found += [value for value in vars(module).values() if isinstance(value, type)
                  and issubclass(value, BaseException) and value.__module__ == name]
    return found


def test_every_error_is_under_its_planes_root():
    for package, root in ((worker, WorkerError), (orchestrator, OrchestratorError)):
        outside = sorted(f"{error.__module__}.{error.__qualname__}" for error in _exceptions_defined_in(package)
                         if not issubclass(error, root))
        assert outside == [], f"errors outside {root.__name__}: {outside}"


def _worker_imports_of_the_control_plane() -> dict[str, set[str]]:
    """Each worker module the control plane's code imports (module level, in functions, under ``TYPE_CHECKING``),
    with the files that import it."""
    found: dict[str, set[str]] = {}
    root = Path(orchestrator.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name == "worker" or name.startswith("worker."):
                    found.setdefault(name, set()).add(str(path.relative_to(root.parent)))
    return found


def test_the_control_plane_imports_the_worker_only_through_its_front_doors():
    """``worker``, its top-level modules and its packages (each ``__init__`` exports what the control plane may
    use); never a module inside a worker package."""
    behind = {module: sorted(files) for module, files in _worker_imports_of_the_control_plane().items()
              if module.count(".") > 1}
    assert behind == {}, f"imports past a worker package's __init__: {behind}"
    assert _worker_imports_of_the_control_plane(), "the scan found no imports of the worker at all"


def test_routes_parse_and_answer_and_nothing_imports_them_but_the_app():
    """What the API's routes and the console's pages share (accepting a run, following it, registering a library)
    lives below them, in ``orchestrator.services``: no module but the app imports a route module, and the services
    import no front end."""
    graph = import_graph.read_graph()
    routes = {name for name in graph.top if name.startswith("orchestrator.api.routes.")}
    assert routes, "the scan found no route modules"
    importers = {name: sorted(imported & routes) for name, imported in graph.top.items()
                 if imported & routes and name not in {"orchestrator.api.app", "orchestrator.api.routes"}}
    assert importers == {}, importers
    fronts = ("orchestrator.api", "orchestrator.console", "orchestrator.mcp_server", "orchestrator.cli")
    upward = {name: sorted(i for i in imported if i.startswith(fronts)) for name, imported in graph.top.items()
              if name.startswith("orchestrator.services") and any(i.startswith(fronts) for i in imported)}
    assert upward == {}, upward
