"""An encoder step's prompts attend in one padded, masked call (``encoder_attention``):
equal to each prompt attending on its own (the torch path's per-chunk loop), with a
window both ways (ModernBERT's local layers) and with fewer key/value heads."""

from __future__ import annotations

import pytest
import torch

from octavo.attention import torch_ops
from octavo.attention.encoder_attention import encoder_attention, handles
from octavo.attention.options import FULL_ATTENTION, AttentionOptions

LENGTHS = [5, 17, 1, 9]
LOCAL = AttentionOptions(sliding_window=4, window_both_ways=True)


def one_by_one(query, key, value, scale, options) -> torch.Tensor:
    outputs, start = [], 0
    for length in LENGTHS:
        rows = slice(start, start + length)
        spans = [(0, length)]
        outputs.append(
            torch_ops.causal_attention(
                query[rows], key[rows], value[rows], scale, options=options, spans=spans
            )
        )
        start += length
    return torch.cat(outputs)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("options", [FULL_ATTENTION, LOCAL], ids=["global", "local"])
def test_one_padded_call_equals_each_prompt_alone(kv_heads, options):
    generator = torch.Generator().manual_seed(3)
    tokens = sum(LENGTHS)
    query = torch.randn(tokens, 4, 8, generator=generator)
    key, value = (torch.randn(tokens, kv_heads, 8, generator=generator) for _ in range(2))
    expected = one_by_one(query, key, value, 0.3, options)
    got = encoder_attention(query, key, value, LENGTHS, 0.3, options)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_softcaps_sinks_and_chunks_take_the_per_prompt_loop():
    assert handles(FULL_ATTENTION) and handles(LOCAL)
    assert not handles(AttentionOptions(soft_cap=30.0))
    assert not handles(AttentionOptions(chunk_size=8))
    assert not handles(AttentionOptions(sinks=torch.zeros(4)))
