"""Incremental detokenization: turn generated token ids into streamed text.

Decoding the whole output after every token costs O(length) per step, and decoding a
single token on its own is wrong for many tokenizers (SentencePiece drops the leading
space of the first token; byte-level BPE may split one character over several tokens).
So we keep two offsets into the token list:

* ``prefix_offset``: start of a small window of already-emitted tokens used as context;
* ``read_offset``: first token whose text has not been emitted yet.

Each step decodes ``tokens[prefix_offset:read_offset]`` and ``tokens[prefix_offset:]``;
the extra characters of the second are the new text. If that text ends in U+FFFD the
last token ended inside a multi-byte character, so we wait for the next token.

A fast (Rust) tokenizer does the same in one call per token with ``tokenizers``'
``DecodeStream``, primed with the prompt context; the two-decode window is the fallback
for other tokenizers and is still used to flush an output that ends mid-character.

Stop strings are searched only in the newly added text (plus ``longest stop - 1``
characters before it), and ``get_delta`` holds back that many characters while the
request runs because they might still turn into a stop string.

The engine calls ``update`` each step only where ``every_step``. A completion whose text
nobody reads before it ends (one final output, no stop strings: offline ``LLM.generate``)
is ``deferred``: ``catch_up`` feeds the generated ids through the same stream in one loop
when its output is made. Same text, without a call chain per token and step (at 256 rows
1.5 ms a step). With ``detokenize=False`` there is no text at all (the server's streams:
their text is decoded in the API process, ``stream_text.py``).
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream

from octavo.sampling_params import RequestOutputKind, SamplingParams

CONTEXT_TOKENS = 5  # prompt tokens decoded as context in front of the first output token
REPLACEMENT_CHAR = "\ufffd"  # what tokenizers produce for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Streams the text of one sequence's generated tokens.

    ``tokenizer`` is any Hugging Face tokenizer (anything with
    ``decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=...)``).
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._params = params
        self._stops: list[str] = list(params.stop or [])
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        context = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._all_ids: list[int] = context  # prompt context followed by generated ids
        self._num_context = len(context)
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._text = ""
        self._sent = 0  # characters of ``_text`` already returned by ``get_delta``
        self._stop_hit: str | None = None
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers only
        # Slow (Python) tokenizers join added tokens with spaces unless told not to; fast
        # ones never do (vLLM's fast detokenizer ignores the flag the same way).
        self._spacing = (
            {}
            if self._backend is not None
            else {"spaces_between_special_tokens": params.spaces_between_special_tokens}
        )
        self._stream = None
        if self._backend is not None:
            self._stream = DecodeStream(ids=context, skip_special_tokens=params.skip_special_tokens)
        # Text read only once the completion ends, no stop string to look for, and a fast
        # tokenizer's stream (which passes over ids it has no token for, never raising).
        final_only = params.output_kind is RequestOutputKind.FINAL_ONLY
        fast = self._stream is not None
        self.deferred = params.detokenize and final_only and not self._stops and fast
        self.every_step = params.detokenize and not self.deferred

    @property
    def output_text(self) -> str:
        """The generated text decoded so far (truncated at a stop string, if one hit)."""
        return self._text

    @property
    def token_ids(self) -> list[int]:
        """The generated token ids (without the prompt context)."""
        return self._all_ids[self._num_context :]

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended generation, or ``None``."""
        return self._stop_hit

    def update(self, token_id: int) -> str | None:
        """Append one generated token; return the stop string if one now appears."""
        if self._stop_hit is not None:
            raise ValueError("update() called after a stop string already ended the output")
        self._all_ids.append(token_id)
        previous_length = len(self._text)
        self._text += self._decode_new_text()
        num_generated = len(self._all_ids) - self._num_context  # without copying them
        if not self._stops or num_generated < self._params.min_tokens:
            return None
        return self._check_stop(previous_length)

    def catch_up(self, output_token_ids: list[int]) -> None:
        """Decode the generated ids not seen yet (a ``deferred`` completion's: a fast
        tokenizer, no stop strings), as ``update`` would one by one."""
        self.feed(output_token_ids[len(self._all_ids) - self._num_context :])

    def feed(self, new_ids: list[int]) -> None:
        """``update`` for each of ``new_ids`` in one loop (a fast tokenizer's stream, no
        stop strings)."""
        if not new_ids:
            return
        assert self._stream is not None and not self._stops, "feed needs update's checks"
        pieces = [self._text]
        for token_id in new_ids:
            self._all_ids.append(token_id)
            pieces.append(self._decode_new_text())
        self._text = "".join(pieces)

    def get_delta(self, finished: bool) -> str:
        """Return the text not handed out yet.

        While not ``finished`` the last ``len(longest stop) - 1`` characters are held
        back. When ``finished`` everything is flushed, including a trailing incomplete
        character if the output really ends in one.
        """
        if finished:
            if self._stop_hit is None:
                self._text += self._flush_pending()
            end = len(self._text)
        else:
            end = max(self._sent, len(self._text) - self._holdback)
        delta = self._text[self._sent : end]
        self._sent = end
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids,
            skip_special_tokens=self._params.skip_special_tokens,
            clean_up_tokenization_spaces=False,
            **self._spacing,
        )

    def _decode_new_text(self) -> str:
        """The completed new text ("" while the last token ends inside a character)."""
        if self._stream is None:
            return self._decode_window()
        text = self._stream.step(self._backend, self._all_ids[-1])
        if text is None:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._all_ids)
        return text

    def _decode_window(self) -> str:
        """Decode the window and return the completed new text ("" if still incomplete)."""
        prefix_text = self._decode(self._all_ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._all_ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._all_ids)
        return full_text[len(prefix_text) :]

    def _flush_pending(self) -> str:
        """Text of tokens still waiting for the rest of a character, decoded as-is."""
        if self._read_offset >= len(self._all_ids):
            return ""
        prefix_text = self._decode(self._all_ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._all_ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._all_ids)
        return full_text[len(prefix_text) :]

    def _check_stop(self, previous_length: int) -> str | None:
        """Find the earliest stop string touching the new text and truncate there."""
        start = max(0, previous_length - self._holdback)
        best: tuple[int, str] | None = None
        for stop in self._stops:
            position = self._text.find(stop, start)
            if position != -1 and (best is None or position < best[0]):
                best = (position, stop)
        if best is None:
            return None
        position, stop = best
        if self._params.include_stop_str_in_output:
            position += len(stop)
        self._text = self._text[:position]
        self._stop_hit = stop
        return stop
