"""``skillrun mcp``: serve the skill library to an MCP client over stdio (see ``orchestrator.mcp_server``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from orchestrator.cli.common import repository
from orchestrator.config import get_settings
from orchestrator.dispatch import dispatcher_for
from orchestrator.mcp_server import McpCaps, serve_stdio


def serve_mcp(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="skillrun mcp: %(levelname)s %(message)s")
    settings = get_settings()
    library = repository(args)
    caps = McpCaps(settings.mcp_output_file_bytes, settings.mcp_output_total_bytes)

    async def serve() -> None:
        dispatcher, _ = dispatcher_for(settings)
        dispatcher.start()
        try:
            await serve_stdio(library, dispatcher, caps)
        finally:
            await dispatcher.close()

    asyncio.run(serve())
    return 0
