"""Deciding, after each new token, whether a sequence is done and why."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.scheduler.sequence import Sequence


@dataclass(frozen=True)
class StopLimits:
    """What ends every sequence of a model: its EOS token ids and its context length."""

    eos_token_ids: frozenset[int]
    max_model_len: int


def check_stop(seq: Sequence, token_id: int, limits: StopLimits) -> None:
    """Set ``finish_reason``/``stop_reason`` on ``seq`` if ``token_id`` ends it.

    EOS and stop token ids count once ``min_tokens`` were generated; the length limit
    always. Stop strings are the detokenizer's (``apply_stop_string``).
    """
    params = seq.params
    generated = seq.num_output_tokens
    if generated >= params.min_tokens:
        if not params.ignore_eos and token_id in limits.eos_token_ids:
            seq.finish_reason = "stop"
            return
        if token_id in params.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token_id
            return
    if (
        params.max_tokens is not None and generated >= params.max_tokens
    ) or seq.num_tokens >= limits.max_model_len:
        seq.finish_reason = "length"


def apply_stop_string(
    seq: Sequence, stop_string: str | None, num_tokens: int | None = None
) -> bool:
    """Finish ``seq`` with ``stop_string`` if one just matched at the token that made it
    ``num_tokens`` long (default: its last); True if that changed its fate.

    Stop strings are found by the detokenizer after the scheduler's own checks: a match
    wins over the length limit (as the checks above order them), never over EOS or a
    stop token id of the same token, and only once ``min_tokens`` tokens were generated.
    Tokens kept after the match in the same (speculative) step are dropped.
    """
    num_tokens = seq.num_tokens if num_tokens is None else num_tokens
    ended_later = num_tokens < seq.num_tokens  # on a token after the match
    if stop_string is None or (seq.finish_reason not in (None, "length") and not ended_later):
        return False
    if num_tokens - seq.num_prompt_tokens < seq.params.min_tokens:
        return False
    seq.finish_reason, seq.stop_reason = "stop", stop_string
    del seq.token_ids[num_tokens:]
    return True
