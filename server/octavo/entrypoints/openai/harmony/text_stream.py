"""Reading a Harmony reply's text (decoded with its special tokens) message by message.

A gpt-oss reply is a run of messages, the first one's ``<|start|>assistant`` already in
the prompt::

    <|channel|>analysis<|message|>…<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

Each message's header (up to ``<|message|>``) names its channel and recipient; its body
runs to ``<|end|>``, ``<|call|>`` or ``<|return|>``. What a message is:

- addressed ``to=functions.NAME`` (in any channel): a call of NAME, the body its arguments;
- the ``analysis`` channel, or addressed to a built-in tool (``browser.*``, ``python``):
  reasoning;
- ``final``, and ``commentary`` without a recipient (a preamble): content.

The same state machine serves streamed and whole replies, so streamed pieces join into
the whole reply's parts wherever the text was split: a marker cut across deltas
(``<|me`` then ``ssage|>``) is held back until it is known. A reply that never opens a
message (not Harmony at all) is content, as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
MESSAGE_ENDS = ("<|end|>", "<|call|>", "<|return|>")
FUNCTIONS = "functions."
RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
PieceKind = Literal["reasoning", "content", "call"]


@dataclass(frozen=True)
class Header:
    """What a message's header says: its channel, recipient and content type."""

    channel: str | None = None
    recipient: str | None = None

    @classmethod
    def parse(cls, text: str) -> Header:
        found = RECIPIENT.search(text)
        recipient = found.group(1) if found else None
        channel = None
        if CHANNEL in text:
            after = text.split(CHANNEL, 1)[1]
            words = after.split(CONSTRAIN, 1)[0].split()
            channel = next((word for word in words if not word.startswith("to=")), None)
        return cls(channel, recipient)

    @property
    def kind(self) -> PieceKind:
        if self.recipient is not None and self.recipient.startswith(FUNCTIONS):
            return "call"
        if self.channel == "analysis" or self.recipient is not None:
            return "reasoning"
        return "content"

    @property
    def function(self) -> str | None:
        return self.recipient[len(FUNCTIONS) :] if self.kind == "call" else None


@dataclass(frozen=True)
class HarmonyPiece:
    """A piece of one message's body; ``opens``: the message's first piece (a call's
    first piece carries its name, even with no text yet)."""

    kind: PieceKind
    text: str
    message: int  # the message's index in the reply
    function: str | None = None  # calls: the function's name
    opens: bool = False


class HarmonyTextStream:
    """``feed`` each new text, then ``finish``; each returns the pieces ready now."""

    def __init__(self) -> None:
        self.pending = ""  # a header being read, or a body's tail that may be a marker
        self.header: Header | None = None  # the open message's (None: reading a header)
        self.messages = 0  # messages opened so far
        self.opened = False

    def feed(self, text: str) -> list[HarmonyPiece]:
        buffer, self.pending = self.pending + text, ""
        pieces: list[HarmonyPiece] = []
        while buffer:
            buffer = self._header(buffer) if self.header is None else self._body(buffer, pieces)
        return pieces

    def finish(self) -> list[HarmonyPiece]:
        """What was held back, once the reply has ended (cut short: the body so far)."""
        rest, self.pending = self.pending, ""
        if self.header is not None:
            return [self._piece(rest)] if rest else []
        if self.messages or not _spoken(rest):
            return []  # an unfinished header after a message: nothing was said in it
        return [HarmonyPiece("content", rest, 0, opens=True)]  # never spoke Harmony

    def _header(self, buffer: str) -> str:
        at = buffer.find(MESSAGE)
        if at < 0:
            self.pending = buffer
            return ""
        self.header, self.opened = Header.parse(buffer[:at]), False
        return buffer[at + len(MESSAGE) :]

    def _body(self, buffer: str, pieces: list[HarmonyPiece]) -> str:
        ends = [at for at in (buffer.find(end) for end in MESSAGE_ENDS) if at >= 0]
        if ends:
            at = min(ends)
            pieces.append(self._piece(buffer[:at]))
            marker = next(end for end in MESSAGE_ENDS if buffer.startswith(end, at))
            self.header, self.messages = None, self.messages + 1
            return buffer[at + len(marker) :]
        keep = max(_marker_prefix_length(buffer, end) for end in MESSAGE_ENDS)
        self.pending = buffer[len(buffer) - keep :]
        body = buffer[: len(buffer) - keep]
        if body or not self.opened:
            pieces.append(self._piece(body))
        return ""

    def _piece(self, text: str) -> HarmonyPiece:
        assert self.header is not None
        opens, self.opened = not self.opened, True
        header = self.header
        return HarmonyPiece(header.kind, text, self.messages, header.function, opens)


def _spoken(text: str) -> bool:
    """Whether a header-state leftover holds more than Harmony's own framing."""
    return bool(text.replace(START, "").replace("assistant", "", 1).strip())


def _marker_prefix_length(text: str, marker: str) -> int:
    """The longest end of ``text`` that is the beginning of ``marker`` (0 if none)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def read_pieces(text: str) -> list[HarmonyPiece]:
    """A whole reply's pieces (what its streamed pieces join into)."""
    stream = HarmonyTextStream()
    return stream.feed(text) + stream.finish()
