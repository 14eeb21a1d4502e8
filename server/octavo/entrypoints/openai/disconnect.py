"""Abort non-streaming work when the client goes away.

Streaming responses learn about a disconnect from Starlette, which cancels the body
iterator. A non-streaming handler is not cancelled, so it polls the connection while it
waits and cancels its own work (whose cleanup aborts the engine requests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")
POLL_SECONDS = 0.1


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client leaves."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
