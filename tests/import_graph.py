"""The product's imports as a graph, read from the source (``ast``), for the layering tests: which product module
each module imports at its top (an import under ``if TYPE_CHECKING:`` is for annotations and is not one), and which
inside a function; its circles; what one module reaches."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANES = ("worker", "orchestrator")


@dataclass
class ImportGraph:
    top: dict[str, set[str]] = field(default_factory=dict)
    """Module → the product modules it imports when it is loaded."""
    inner: dict[str, set[str]] = field(default_factory=dict)
    """Module → the product modules it imports inside a function."""

    def reaches(self, start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name == goal:
                return True
            if name not in seen:
                seen.add(name)
                todo.extend(self.top.get(name, ()))
        return False

    def circles(self) -> list[list[str]]:
        """Every group of modules that import each other at load time (strongly connected, more than one)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []

        def visit(name: str) -> None:
            index[name] = low[name] = len(index)
            stack.append(name)
            for other in self.top[name]:
                if other not in index:
                    visit(other)
                    low[name] = min(low[name], low[other])
                elif other in stack:
                    low[name] = min(low[name], index[other])
            if low[name] == index[name]:
                group = []
                while not group or group[-1] != name:
                    group.append(stack.pop())
                if len(group) > 1:
                    found.append(sorted(group))

        for name in sorted(self.top):
            if name not in index:
                visit(name)
        return found

    def dodges(self) -> list[tuple[str, str]]:
        """Imports inside a function that, made at the top, would close a circle."""
        return sorted((name, other) for name, others in self.inner.items() for other in others
                      if self.reaches(other, name))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_graph() -> ImportGraph:
    files = {module_name(path): path for plane in PLANES for path in (ROOT / plane).rglob("*.py")}
    graph = ImportGraph()
    for name, path in files.items():
        graph.top[name], graph.inner[name] = set(), set()
        _read(name, path, files, graph)
    return graph


def _read(name: str, path: Path, files: dict[str, Path], graph: ImportGraph) -> None:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def loaded(node: ast.Import | ast.ImportFrom) -> set[str]:
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
        return {found for found in map(lambda w: _product_module(w, files), wanted) if found and found != name}

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                walk_else(child, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (graph.inner if in_function else graph.top)[name].update(loaded(child))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    def walk_else(node: ast.If, in_function: bool) -> None:
        for child in node.orelse:
            walk(ast.Module(body=[child], type_ignores=[]), in_function)

    walk(ast.parse(path.read_text(encoding="utf-8")), False)


def _product_module(name: str, files: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in files:
            return ".".join(parts)
        parts.pop()
    return None
