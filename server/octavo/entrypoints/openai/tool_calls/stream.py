"""Streaming a reply that may call tools, one choice at a time, as OpenAI streams it.

- named function: the arguments stream as they are generated; the first piece carries
  the call's id, type and name;
- ``required``: the calls are complete only at the end (a JSON array), so they go out
  then, one delta per call;
- ``auto``: content streams while it surely is content (``safe_prefix`` of the parser:
  up to a ``<tool_call>`` tag, say); a call goes out whole as soon as its block is closed
  (parsers with ``settled``: the text up to the last closed block reads the same whatever
  follows it); the rest is parsed at the end into content and the calls not yet sent.
"""

from __future__ import annotations

from octavo.entrypoints.openai.responses import DeltaFunction, DeltaMessage, DeltaToolCall
from octavo.entrypoints.openai.tool_calls.parsers import ParsedToolCall
from octavo.entrypoints.openai.tool_calls.plan import ToolPlan, new_call_id


class ToolCallStream:
    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of ``text`` already sent as content
        self.named_id: str | None = None  # set once the named call's first piece is out
        self.num_calls = 0
        self.settled = 0  # auto: the text up to here has had its calls sent

    def delta(self, new_text: str) -> DeltaMessage | None:
        """What to send for ``new_text`` now (``None``: nothing yet)."""
        self.text += new_text
        mode = self.plan.mode
        if mode == "named":
            return self._named_piece(new_text) if new_text else None
        if mode == "required":
            return None
        if mode == "auto":
            return self._auto_piece()
        piece, self.sent = self.text[self.sent :], len(self.text)
        return DeltaMessage(content=piece) if piece else None

    def _auto_piece(self) -> DeltaMessage | None:
        """The content that is surely content, and the calls whose blocks have closed."""
        piece: dict = {}
        safe = self.plan.parser.safe_prefix(self.text)
        if safe > self.sent:
            piece["content"], self.sent = self.text[self.sent : safe], safe
        calls = self._settled_calls()
        if calls:
            piece["tool_calls"] = calls
        return DeltaMessage(**piece) if piece else None

    def _settled_calls(self) -> list[DeltaToolCall]:
        settled = self.plan.parser.settled
        end = settled(self.text) if settled is not None else 0
        if end <= self.settled:
            return []
        self.settled = end
        calls = self.plan.read(self.text[:end]).calls[self.num_calls :]
        return [self._call_piece(call) for call in calls]

    def finish(self) -> list[DeltaMessage]:
        """What is left to send once the choice has finished."""
        if self.plan.mode == "named":
            return [] if self.named_id else [self._named_piece("")]
        if self.plan.mode == "none":
            return []
        parsed = self.plan.read(self.text[self.sent :])
        deltas = [DeltaMessage(content=parsed.content)] if parsed.content else []
        calls = parsed.calls[self.num_calls :]  # those sent as their blocks closed: not again
        return deltas + [self._whole_call(call) for call in calls]

    def _named_piece(self, arguments: str) -> DeltaMessage:
        first = self.named_id is None
        if first:
            self.named_id, self.num_calls = new_call_id(), 1
        function = DeltaFunction(name=self.plan.name if first else None, arguments=arguments)
        call = DeltaToolCall(
            index=0,
            id=self.named_id if first else None,
            type="function" if first else None,
            function=function,
        )
        return DeltaMessage(tool_calls=[call])

    def _whole_call(self, call: ParsedToolCall) -> DeltaMessage:
        return DeltaMessage(tool_calls=[self._call_piece(call)])

    def _call_piece(self, call: ParsedToolCall) -> DeltaToolCall:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        function = DeltaFunction(name=call.name, arguments=call.arguments)
        return DeltaToolCall(index=index, id=new_call_id(), type="function", function=function)
