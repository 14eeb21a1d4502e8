"""The text of a served stream, decoded in the API process (vLLM v1's output processor).

The engine core's step loop is the server's bottleneck at high concurrency: decoding each
streamed row's new token there cost about 6 µs a row and step (1.5 ms a step at 256
streams). So a stream without stop strings goes to the core with ``detokenize=False``
(token ids only) and its text is decoded here, by the same ``IncrementalDetokenizer``
(one per completion, primed with the prompt), as each delta reaches the server. A stream
with stop strings keeps its text in the core: the core must see a stop string to end the
sequence at that token.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.outputs import CompletionOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


def decodes_in_server(params: SamplingParams, tokenizer: Any) -> bool:
    """Can this request's text be decoded here: a generating stream of deltas whose text
    is wanted, no stop strings, and a fast tokenizer (the stream ``feed`` uses)?"""
    return (
        params.pooling is None
        and params.detokenize
        and not params.stop
        and params.output_kind is RequestOutputKind.DELTA
        and getattr(tokenizer, "backend_tokenizer", None) is not None
    )


class StreamText:
    """Fills in the text of one request's delta outputs from their token ids."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer, self._prompt, self._params = tokenizer, prompt_token_ids, params
        self._by_index: dict[int, IncrementalDetokenizer] = {}

    @staticmethod
    def core_params(params: SamplingParams) -> SamplingParams:
        """What the core is sent instead: the same request without text."""
        return replace(params, detokenize=False)

    def fill(self, completion: CompletionOutput) -> None:
        """Set a delta's text: its new tokens' characters (a split character waits for
        the token that completes it; the last delta flushes what is left)."""
        detokenizer = self._by_index.get(completion.index)
        if detokenizer is None:
            detokenizer = IncrementalDetokenizer(self._tokenizer, self._prompt, self._params)
            self._by_index[completion.index] = detokenizer
        detokenizer.feed(completion.delta_token_ids)
        completion.text = completion.delta_text = detokenizer.get_delta(completion.finished)
