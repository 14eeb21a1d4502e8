"""Block arithmetic for models whose every layer slides with one window (vLLM's
``SlidingWindowManager``): keys more than ``window - 1`` positions behind the next token
to compute are never read again, so the blocks that hold only such keys can be freed.

The query at position ``i`` sees keys ``j`` with ``i - window < j <= i``. A sequence with
``num_computed`` tokens computes next the token at position ``num_computed`` (and later
ones), so positions ``< num_computed - window + 1`` are dead: that many leading tokens,
whole blocks of them, are skipped.
"""

from __future__ import annotations


def num_skipped_blocks(
    num_computed: int, window: int | None, block_size: int, chunk: int | None = None
) -> int:
    """Leading blocks of a sequence that hold only keys no future query sees. A chunked
    local layer (``chunk``, Llama 4's) sees only its own chunk: keys before the start of
    the chunk of position ``num_computed`` are dead."""
    if chunk is not None:
        return num_computed // chunk * chunk // block_size
    if window is None:
        return 0
    return max(0, num_computed - window + 1) // block_size


def max_blocks_per_sequence(
    max_model_len: int, block_size: int, window: int | None, max_step_tokens: int
) -> int:
    """The most blocks one sequence ever holds at once: the whole context without a
    window; with one, the window's keys plus one step's tokens (``max_step_tokens``,
    lookahead included), whose first block may start mid-block (hence the ``+ 1``)."""
    whole = -(-max_model_len // block_size)
    if window is None:
        return whole
    live = -(-(window - 1 + max_step_tokens) // block_size) + 1
    return min(whole, live)
