"""A chat request's choices read as Harmony replies, whole or streamed.

For a Harmony model the chat path hands its replies here instead of to the reasoning
and tool-call parsers (``serving_chat.py`` asks ``job.harmony``): the ``analysis``
channel becomes ``reasoning_content`` (dropped with ``include_reasoning: false``), the
``final`` channel and commentary preambles the content, and ``commentary`` messages
addressed ``to=functions.NAME`` tool calls, streamed as they are written (the first
piece carries the call's id and name, the rest its arguments). Calls are read only with
``tool_choice`` ``auto``; otherwise what the model addressed to a function stays content
(the client sees what was written rather than a call it did not offer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.entrypoints.openai.harmony.reply import HarmonyReply
from octavo.entrypoints.openai.harmony.text_stream import (
    HarmonyPiece,
    HarmonyTextStream,
    read_pieces,
)
from octavo.entrypoints.openai.logprobs_format import all_logprobs, new_logprobs
from octavo.entrypoints.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    FunctionCallOut,
    ToolCallOut,
)
from octavo.entrypoints.openai.tool_calls.plan import finish_reason_with_calls, new_call_id
from octavo.outputs import CompletionOutput

if TYPE_CHECKING:
    from octavo.entrypoints.openai.serving_chat import ChatJob


@dataclass
class ChoiceStream:
    """One streamed choice: its text stream and the calls it has opened."""

    text: HarmonyTextStream = field(default_factory=HarmonyTextStream)
    call_index: dict[int, int] = field(default_factory=dict)  # message -> chat call index

    @property
    def num_calls(self) -> int:
        return len(self.call_index)


@dataclass
class HarmonyChoices:
    """What one chat request's replies are read into (``serving_chat.ChatJob.harmony``)."""

    calls: bool = False  # tool_choice auto: function-addressed messages are calls
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only
    include_reasoning: bool = True
    streams: dict[int, ChoiceStream] = field(default_factory=dict)

    def served(self, pieces: list[HarmonyPiece]) -> list[HarmonyPiece]:
        """The pieces as this request takes them: calls as content without ``auto``,
        reasoning dropped with ``include_reasoning: false``."""
        if not self.calls:
            pieces = [_as_content(piece) if piece.kind == "call" else piece for piece in pieces]
        if not self.include_reasoning:
            pieces = [piece for piece in pieces if piece.kind != "reasoning"]
        return pieces

    # ----- whole replies ---------------------------------------------------------------
    def full_choice(self, job: ChatJob, output: CompletionOutput) -> ChatChoice:
        reply = HarmonyReply.of(self.served(read_pieces(output.text)))
        kept = reply.calls if self.parallel else reply.calls[:1]
        calls = [
            ToolCallOut(
                id=new_call_id(), function=FunctionCallOut(name=c.name, arguments=c.arguments)
            )
            for c in kept
        ]
        message = AssistantMessage.with_reasoning(
            reply.reasoning, role=job.role, content=reply.content, tool_calls=calls
        )
        return ChatChoice(
            index=output.index,
            message=message,
            logprobs=job.logprobs(all_logprobs(output)),
            finish_reason=finish_reason_with_calls(calls, output.finish_reason),
            stop_reason=output.stop_reason,
        )

    # ----- streamed replies ------------------------------------------------------------
    def delta_choices(self, job: ChatJob, output: CompletionOutput) -> list[ChatChunkChoice]:
        """The chunks this output update makes (as ``serving_chat.delta_choices``)."""
        if output.index in job.finished_choices:
            return []
        job.tokens_by_choice[output.index] = len(output.token_ids)
        stream = self.streams.setdefault(output.index, ChoiceStream())
        pieces = stream.text.feed(output.delta_text)
        if output.finished:
            job.finished_choices.add(output.index)
            pieces += stream.text.finish()
        deltas = [delta for piece in self.served(pieces) if (delta := self._delta(stream, piece))]
        logprobs = job.logprobs(new_logprobs(output))
        if not deltas and (logprobs is not None or output.finished):
            deltas = [DeltaMessage()]
        choices = [
            ChatChunkChoice(index=output.index, delta=delta, logprobs=logprobs if i == 0 else None)
            for i, delta in enumerate(deltas)
        ]
        if output.finished:
            calls = range(stream.num_calls)
            choices[-1].finish_reason = finish_reason_with_calls(calls, output.finish_reason)
            choices[-1].stop_reason = output.stop_reason
        return choices

    def _delta(self, stream: ChoiceStream, piece: HarmonyPiece) -> DeltaMessage | None:
        if piece.kind == "call":
            return self._call_delta(stream, piece)
        if not piece.text:
            return None
        if piece.kind == "reasoning":
            return DeltaMessage().with_reasoning(piece.text)
        return DeltaMessage(content=piece.text)

    def _call_delta(self, stream: ChoiceStream, piece: HarmonyPiece) -> DeltaMessage | None:
        if piece.opens and (self.parallel or not stream.call_index):
            stream.call_index[piece.message] = stream.num_calls
            function = DeltaFunction(name=piece.function, arguments=piece.text)
            call = DeltaToolCall(
                index=stream.call_index[piece.message],
                id=new_call_id(),
                type="function",
                function=function,
            )
            return DeltaMessage(tool_calls=[call])
        index = stream.call_index.get(piece.message)
        if index is None or not piece.text:
            return None  # a call dropped by parallel_tool_calls: false, or nothing new
        function = DeltaFunction(arguments=piece.text)
        return DeltaMessage(tool_calls=[DeltaToolCall(index=index, function=function)])


def _as_content(piece: HarmonyPiece) -> HarmonyPiece:
    return HarmonyPiece("content", piece.text, piece.message, None, piece.opens)
