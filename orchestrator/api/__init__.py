"""The HTTP API (FastAPI), versioned under ``/v1``."""

from orchestrator.api.app import build_services, create_app, create_documents
from orchestrator.api.services import Services

__all__ = ["Services", "build_services", "create_app", "create_documents"]
