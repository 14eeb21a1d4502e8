"""The uvicorn settings every Octavo server shares (the CLI's and the tests')."""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI

from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.http_protocol import protocol_with_header_timeout

# Connections above --limit-concurrency that uvicorn still lets in: the app refuses API
# requests over the limit itself (503) but always answers the probes, which need room.
PROBE_HEADROOM = 64


def uvicorn_config(app: FastAPI, config: ServerConfig, **settings: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` with the header deadline and the connection cap of ``config``."""
    return uvicorn.Config(
        app,
        http=protocol_with_header_timeout(config.header_timeout),
        limit_concurrency=config.limit_concurrency + PROBE_HEADROOM,
        **settings,
    )
