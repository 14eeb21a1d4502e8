"""The outputs of one engine request, handed from the engine thread to one HTTP handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from octavo.engine.output_accumulator import OutputAccumulator
from octavo.engine.stream_text import StreamText
from octavo.outputs import RequestOutput


class RequestFailed(Exception):
    """The engine failed this one request (other requests go on)."""


class RequestStream:
    """The outputs of one request, in order; ``close()`` aborts it if unfinished."""

    def __init__(
        self,
        request_id: str,
        release: Callable[[list[RequestStream]], None],
        text: StreamText | None = None,
    ) -> None:
        self.request_id = request_id
        self.text = text  # the engine decodes the text with it (the core sends ids only)
        self.finished = False
        self.closed = False
        self.release = release  # the engine's: abort the unfinished, forget all
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._accumulator = OutputAccumulator()
        self._error: BaseException | None = None
        self.on_finish: Callable[[RequestOutput], None] | None = None  # e.g. a log line

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Yield the request so far each time something new arrived, ending after the final.

        The engine sends deltas; the accumulator turns those that arrived together into
        one view. Raises ``RequestFailed`` when the engine failed the request, and the
        engine client's own exceptions (say ``EngineDead``) when they are put here.
        """
        while not self.finished:
            deltas = await self._take()
            if not deltas:
                self.finished = True
                raise self._error  # type: ignore[misc]
            view = self._accumulator.merge(deltas)
            self.finished = view.finished
            if view.error is not None:
                raise RequestFailed(f"the engine failed this request: {view.error}")
            if self.finished and self.on_finish is not None:
                self.on_finish(view)
            yield view

    async def _take(self) -> list[RequestOutput]:
        """The outputs waiting now (at least one), up to the first error put here."""
        if self._error is not None:
            return []
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        deltas = []
        for item in items:
            if isinstance(item, BaseException):
                self._error = item
                break
            deltas.append(item)
        return deltas

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
