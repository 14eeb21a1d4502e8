"""Which prompt token ids a loaded model accepts: one rule for the engine and the server."""

from __future__ import annotations

from collections.abc import Sequence


def prompt_token_limit(vocab_size: int, tokenizer_size: int) -> int:
    """Prompt token ids must be below this: ids the model embeds *and* the tokenizer decodes.

    ``vocab_size`` is the model's embedding rows (config.json), ``tokenizer_size`` is
    ``len(tokenizer)``; they differ when the embedding is padded or tokens were added.
    """
    return min(vocab_size, tokenizer_size)


def check_prompt_token_ids(token_ids: Sequence[int], limit: int) -> None:
    """``ValueError`` unless every id is in ``[0, limit)`` (``limit``: ``prompt_token_limit``)."""
    if any(not 0 <= token < limit for token in token_ids):
        raise ValueError(f"prompt token ids must be in [0, {limit})")
