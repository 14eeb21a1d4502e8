"""The text of a served stream, decoded in the API process (vLLM v1's output processor).

The engine core's step loop is the server's bottleneck at high concurrency: decoding each
streamed row's new token there cost about 6 µs a row and step (1.5 ms a step at 256
streams). So a stream of deltas goes to the core with ``detokenize=False`` and no stop
strings (token ids only), and its text is decoded here, by the same
``IncrementalDetokenizer`` (one per completion, primed with the prompt), as each delta
reaches the server. Stop strings are found here too, for a single completion without
logprobs: the delta is cut after the token that completed one (its later tokens dropped,
as the core's ``apply_stop_string`` drops them), the request ends here, and the engine
aborts it in the core (``AsyncEngine``), whose outputs for it after that are dropped.
A stream with several completions or logprobs keeps its stop strings in the core.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


def decodes_in_server(params: SamplingParams, tokenizer: Any) -> bool:
    """Can this request's text be decoded here: a generating stream of deltas whose text
    is wanted, a fast tokenizer, and stop strings only on one completion without logprobs
    (one to abort in the core, no logprobs to cut)?"""
    return (
        params.pooling is None
        and params.detokenize
        and params.output_kind is RequestOutputKind.DELTA
        and getattr(tokenizer, "backend_tokenizer", None) is not None
        and (not params.stop or (params.n == 1 and params.logprobs is None))
    )


class StreamText:
    """Fills in the text of one request's delta outputs from their token ids."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer, self._prompt, self._params = tokenizer, prompt_token_ids, params
        self._by_index: dict[int, IncrementalDetokenizer] = {}

    @staticmethod
    def core_params(params: SamplingParams) -> SamplingParams:
        """What the core is sent instead: the same request without text or stop strings."""
        return replace(params, detokenize=False, stop=None)

    def fill_output(self, output: RequestOutput) -> bool:
        """Fill each completion's text; True when a stop string ended the request now
        (``output`` is then its final one)."""
        stopped = False
        for completion in output.outputs:
            stopped |= self.fill(completion)
        if stopped:
            output.finished = True
        return stopped

    def fill(self, completion: CompletionOutput) -> bool:
        """Set a delta's text: its new tokens' characters (a split character waits for
        the token that completes it; the last delta flushes what is left). True when a
        stop string ended the completion at one of its tokens."""
        detokenizer = self._by_index.get(completion.index)
        if detokenizer is None:
            detokenizer = IncrementalDetokenizer(self._tokenizer, self._prompt, self._params)
            self._by_index[completion.index] = detokenizer
        if self._params.stop:
            stopped = _cut_at_stop_string(detokenizer, completion)
        else:
            stopped = False
            detokenizer.feed(completion.delta_token_ids)
        completion.text = completion.delta_text = detokenizer.get_delta(completion.finished)
        return stopped


def _cut_at_stop_string(detokenizer: IncrementalDetokenizer, completion: CompletionOutput) -> bool:
    """Feed the delta's tokens one at a time; at a stop string, end the completion there
    (``apply_stop_string``'s rules: it wins over the length limit, never over EOS or a stop
    token id of the same token). True when it ended the completion."""
    ids = completion.delta_token_ids
    for kept, token_id in enumerate(ids, start=1):
        if detokenizer.stop_reason is not None:
            return False  # ended earlier: the core's tokens after it
        stop = detokenizer.update(token_id)
        if stop is None:
            continue
        if kept == len(ids) and completion.finish_reason not in (None, "length"):
            return False  # the core ended it on this very token (EOS, a stop token id)
        completion.token_ids = completion.delta_token_ids = ids[:kept]
        completion.num_tokens -= len(ids) - kept
        completion.finish_reason, completion.stop_reason = "stop", stop
        return True
    return False
