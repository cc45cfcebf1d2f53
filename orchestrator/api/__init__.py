"""The HTTP API (FastAPI), versioned under ``/v1``, with the web console (``orchestrator.console``) at ``/ui``.

Exports are imported on first use (``worker.lazy``): the console imports the API's routes and services, and the
app imports the console, so importing a part of the API does not build the app.
"""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.api.app": ["build_services", "create_app"],
})
