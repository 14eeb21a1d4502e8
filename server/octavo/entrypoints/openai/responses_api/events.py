"""A streamed response as the Responses API's server-sent events.

The chat pipeline's deltas (reasoning, content, tool-call pieces, in that order) open
and fill one output item at a time; a new kind of piece closes the open item first:

    response.created, response.in_progress
    reasoning:  output_item.added, content_part.added, reasoning_text.delta…,
                reasoning_text.done, content_part.done, output_item.done
    text:       output_item.added, content_part.added, output_text.delta…,
                output_text.done, content_part.done, output_item.done
    a call:     output_item.added, function_call_arguments.delta…,
                function_call_arguments.done, output_item.done
    response.completed (response.incomplete when max_output_tokens cut it)

Every event carries ``sequence_number`` (0, 1, 2, …) and goes out as
``event: <type>`` + ``data: <json>``, as OpenAI sends them.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.entrypoints.openai.responses import DeltaMessage, DeltaToolCall
from octavo.entrypoints.openai.responses_api.objects import (
    FunctionCallItem,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponseUsage,
)


class ResponseEvents:
    """Turns one response's deltas into event frames; ``response`` fills as they come."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.sequence_number = 0
        self.open: OutputItem | None = None
        self.calls: dict[int, FunctionCallItem] = {}  # by the chat tool-call index

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def _response_event(self, kind: str) -> str:
        return self.event(kind, response=self.response.model_dump())

    def start(self) -> list[str]:
        return [
            self._response_event("response.created"),
            self._response_event("response.in_progress"),
        ]

    def delta(self, delta: DeltaMessage) -> list[str]:
        frames = self.reasoning(delta.reasoning) if delta.reasoning else []
        if delta.content:
            frames += self.text(delta.content)
        for piece in delta.tool_calls or []:
            frames += self.tool_call(piece)
        return frames

    def finish(self, usage: ResponseUsage, cut_short: bool) -> list[str]:
        frames = [] if self.response.output else self.text("")  # at least a message
        frames += self.close("incomplete" if cut_short else "completed")
        self.response.finish(usage, cut_short)
        done = "response.incomplete" if cut_short else "response.completed"
        return [*frames, self._response_event(done)]

    def error(self, message: str, code: str) -> str:
        return self.event("error", code=code, message=message, param=None)

    # ----- one item at a time ----------------------------------------------------------
    def _open(self, item: OutputItem) -> list[str]:
        frames = self.close("completed")
        self.response.output.append(item)
        self.open = item
        frames.append(
            self.event("response.output_item.added", **self._where(), item=item.model_dump())
        )
        return frames

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"output_index": len(self.response.output) - 1}

    def _in_item(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open.id, **self._where()}

    def reasoning(self, text: str) -> list[str]:
        frames: list[str] = []
        if not isinstance(self.open, ReasoningItem):
            frames += self._open(ReasoningItem(content=[ReasoningText()]))
            frames.append(self._part_event("response.content_part.added", ReasoningText()))
        self.open.content[0].text += text
        frames.append(
            self.event(
                "response.reasoning_text.delta", **self._in_item(), content_index=0, delta=text
            )
        )
        return frames

    def text(self, text: str) -> list[str]:
        frames: list[str] = []
        if not isinstance(self.open, MessageItem):
            frames += self._open(MessageItem(content=[OutputText()]))
            frames.append(self._part_event("response.content_part.added", OutputText()))
        if text:
            self.open.content[0].text += text
            frames.append(
                self.event(
                    "response.output_text.delta",
                    **self._in_item(),
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return frames

    def tool_call(self, piece: DeltaToolCall) -> list[str]:
        frames: list[str] = []
        arguments = (piece.function.arguments if piece.function else None) or ""
        if piece.id is not None:
            name = piece.function.name if piece.function else None
            item = FunctionCallItem(call_id=piece.id, name=name or "")
            self.calls[piece.index] = item
            frames += self._open(item)
        item = self.calls[piece.index]
        if arguments:
            item.arguments += arguments
            frames.append(
                self.event(
                    "response.function_call_arguments.delta", **self._in_item(), delta=arguments
                )
            )
        return frames

    def _part_event(self, kind: str, part: OutputText | ReasoningText) -> str:
        return self.event(kind, **self._in_item(), content_index=0, part=part.model_dump())

    def close(self, status: ItemStatus) -> list[str]:
        """The open item's closing events (none when no item is open)."""
        item = self.open
        if item is None:
            return []
        item.status = status
        frames = self._closing_events(item)
        frames.append(
            self.event("response.output_item.done", **self._where(), item=item.model_dump())
        )
        self.open = None
        return frames

    def _closing_events(self, item: OutputItem) -> list[str]:
        if isinstance(item, FunctionCallItem):
            return [
                self.event(
                    "response.function_call_arguments.done",
                    **self._in_item(),
                    arguments=item.arguments,
                )
            ]
        part = item.content[0]
        if isinstance(item, ReasoningItem):
            done = self.event(
                "response.reasoning_text.done", **self._in_item(), content_index=0, text=part.text
            )
        else:
            done = self.event(
                "response.output_text.done",
                **self._in_item(),
                content_index=0,
                text=part.text,
                logprobs=[],
            )
        return [done, self._part_event("response.content_part.done", part)]
