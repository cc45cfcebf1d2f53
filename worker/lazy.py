"""Package exports imported on first use (PEP 562), so importing one part of a package does not load the rest.

A package's ``__init__`` names what it exports and where each name lives; ``from package import Name`` then
imports that module when ``Name`` is first asked for. Any other name is left to the import system, which looks
for a submodule of that name (``from worker import defaults`` imports ``worker.defaults`` alone). The package's
``if TYPE_CHECKING:`` block repeats the imports for type checkers and editors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, list[str]]) -> tuple[list[str], Callable[[str], Any],
                                                                     Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose ``exports`` map a module to the names it
    gives the package."""
    module_of = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # asked once: later uses are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return sorted(module_of), __getattr__, __dir__


__all__ = ["lazy_exports"]
