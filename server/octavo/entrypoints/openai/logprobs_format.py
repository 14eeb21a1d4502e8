"""Engine logprobs in OpenAI's two formats: chat (``content`` list) and legacy completions."""

from __future__ import annotations

import math
from typing import Any

from octavo.entrypoints.openai.responses import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from octavo.outputs import CompletionOutput
from octavo.sampling.token_logprobs import TokenLogprobs

LOGPROB_FLOOR = -9999.0  # what OpenAI reports instead of -inf (JSON has no infinity)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2 style byte-level BPE: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


_BYTE_OF_CHAR = _byte_level_alphabet()


def clamp(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


class TokenDecoder:
    """Token id -> (text, UTF-8 bytes), cached; bytes are exact for byte-level BPE."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> str:
        return self._lookup(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return self._lookup(token_id)[1]

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            piece = self._tokenizer.convert_ids_to_tokens(token_id) or ""
            if piece and all(char in _BYTE_OF_CHAR for char in piece):
                raw = [_BYTE_OF_CHAR[char] for char in piece]
            else:
                raw = list(text.encode("utf-8"))
            found = self._cache[token_id] = (text, raw)
        return found


def chat_logprobs(
    entries: list[TokenLogprobs], decoder: TokenDecoder, num_top: int
) -> ChatLogprobs:
    """Chat format: one entry per token with its bytes and ``num_top`` alternatives."""
    content = [
        ChatTokenLogprob(
            token=decoder.text(entry.token_id),
            logprob=clamp(entry.logprob),
            bytes=decoder.bytes(entry.token_id),
            top_logprobs=[
                TopLogprob(token=decoder.text(token), logprob=clamp(lp), bytes=decoder.bytes(token))
                for token, lp in entry.top[:num_top]
            ],
        )
        for entry in entries
    ]
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: list[TokenLogprobs], decoder: TokenDecoder, num_top: int, text_offset: int
) -> tuple[CompletionLogprobs, int]:
    """Legacy format; returns it and the text offset just after the last token."""
    result = CompletionLogprobs()
    for entry in entries:
        token = decoder.text(entry.token_id)
        top = {decoder.text(alt): clamp(lp) for alt, lp in entry.top[:num_top]}
        top.setdefault(token, clamp(entry.logprob))
        result.tokens.append(token)
        result.token_logprobs.append(clamp(entry.logprob))
        result.top_logprobs.append(top)
        result.text_offset.append(text_offset)
        text_offset += len(token)
    return result, text_offset


def prompt_scoring_logprobs(
    prompt_ids: list[int],
    entries: list[TokenLogprobs | None],
    decoder: TokenDecoder,
    num_top: int,
) -> CompletionLogprobs:
    """The echoed prompt's part of the legacy format: ``None`` for the first token (nothing
    precedes it), then each prompt token's logprob and ``num_top`` alternatives."""
    first = decoder.text(prompt_ids[0]) if prompt_ids else ""
    result = CompletionLogprobs(
        tokens=[first], token_logprobs=[None], top_logprobs=[None], text_offset=[0]
    )
    scored, _ = completion_logprobs(
        [entry for entry in entries[1:] if entry is not None], decoder, num_top, len(first)
    )
    return result.followed_by(scored)


def all_logprobs(output: CompletionOutput) -> list[TokenLogprobs]:
    """The logprobs of every token in this output (the engine's list may run ahead)."""
    return (output.logprobs or [])[: len(output.token_ids)]


def new_logprobs(output: CompletionOutput) -> list[TokenLogprobs]:
    """The logprobs of the tokens that are new in this output (``delta_token_ids``)."""
    if output.delta_logprobs is not None:
        return output.delta_logprobs
    end = len(output.token_ids)
    return (output.logprobs or [])[end - len(output.delta_token_ids) : end]
