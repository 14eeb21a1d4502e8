"""Deciding, after each new token, whether a sequence is done and why."""

from __future__ import annotations

from octavo.scheduler.sequence import Sequence


def check_stop(
    seq: Sequence,
    token_id: int,
    stop_string: str | None,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> None:
    """Set ``finish_reason``/``stop_reason`` on ``seq`` if ``token_id`` ends it."""
    params = seq.params
    generated = seq.num_output_tokens
    if generated >= params.min_tokens:
        if not params.ignore_eos and token_id in eos_token_ids:
            seq.finish_reason = "stop"
            return
        if token_id in params.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token_id
            return
        if stop_string is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop_string
            return
    if (
        params.max_tokens is not None and generated >= params.max_tokens
    ) or seq.num_tokens >= max_model_len:
        seq.finish_reason = "length"
