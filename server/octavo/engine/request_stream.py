"""The outputs of one engine request, handed from the engine thread to one HTTP handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from octavo.outputs import RequestOutput


class RequestFailed(Exception):
    """The engine failed this one request (other requests go on)."""


class RequestStream:
    """The outputs of one request, in order; ``close()`` aborts it if unfinished."""

    def __init__(self, request_id: str, release: Callable[[list[RequestStream]], None]) -> None:
        self.request_id = request_id
        self.finished = False
        self.closed = False
        self.release = release  # the engine's: abort the unfinished, forget all
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Yield each output once, ending after the final one.

        Raises ``RequestFailed`` when the engine failed the request, and the engine
        wrapper's own exceptions (say ``EngineDead``) when they are put here.
        """
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            if item.error is not None:
                raise RequestFailed(f"the engine failed this request: {item.error}")
            yield item

    async def final(self) -> RequestOutput:
        """Wait for the request to finish and return its last (complete) output."""
        last: RequestOutput | None = None
        async for output in self.outputs():
            last = output
        assert last is not None
        return last

    def close(self) -> None:
        """Stop following the request; abort it in the engine if it is still running."""
        self.release([self])


def close_streams(streams: list[RequestStream]) -> None:
    """Close several streams of one engine at once (one abort command for all of them)."""
    if streams:
        streams[0].release(streams)
