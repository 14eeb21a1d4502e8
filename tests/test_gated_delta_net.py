"""Gated DeltaNet (Qwen3-Next's linear attention) against transformers'
``Qwen3NextGatedDeltaNet`` with the same weights: sequences of different lengths go through
Octavo's mixer in pieces (prefill chunks shorter and longer than the delta rule's 64-token
chunk, cut at odd places, then single-token decodes batched beside a chunk), each piece's
output equal to the same rows of HF's no-cache forward of the whole sequence; slots that
hold stale values are ignored where a sequence starts."""

from __future__ import annotations

import pytest
import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.model_executor.layers.state.gated_delta_net import GatedDeltaNet, GatedDeltaNetSpec
from octavo.model_executor.layers.state.gated_delta_rule import (
    DeltaInputs,
    chunked_delta_rule,
    recurrent_delta_step,
)
from state_steps import state_step_metadata

HIDDEN, NUM_SLOTS = 32, 6
MIXER = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 12,
    "linear_conv_kernel_dim": 4,
}
LENGTHS = (150, 9, 70, 3)
SLOTS = (4, 1, 5, 2)
STEPS = [  # per step: (sequence, first token, tokens); prefill chunks first, then decodes
    [(0, 0, 40), (1, 0, 5), (2, 0, 2)],
    [(0, 40, 75), (2, 2, 66), (3, 0, 2), (1, 5, 1)],
    [(0, 115, 33), (1, 6, 1), (3, 2, 1)],
    [(2, 68, 1), (0, 148, 1), (1, 7, 1)],
    [(0, 149, 1), (1, 8, 1), (2, 69, 1)],
]


def step_meta(pieces: list[tuple[int, int, int]]) -> AttentionMetadata:
    """The metadata a state layer reads for one step of ``pieces``."""
    return state_step_metadata(
        [count for _, _, count in pieces],
        [first + count for _, first, count in pieces],
        [SLOTS[seq] for seq, _, _ in pieces],
        [first > 0 for _, first, _ in pieces],
    )


@pytest.fixture(scope="module")
def mixers() -> tuple[torch.nn.Module, GatedDeltaNet]:
    """HF's mixer with widened random weights, and Octavo's loaded from its state dict."""
    from transformers import AutoConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    config = AutoConfig.for_model("qwen3_next", hidden_size=HIDDEN, num_hidden_layers=1, **MIXER)
    torch.manual_seed(0)
    theirs = Qwen3NextGatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        for name, parameter in theirs.named_parameters():
            if name != "A_log":  # keep transformers' decay rates (log of 0.01 .. 16)
                parameter.normal_(0.0 if "norm" not in name else 1.0, 0.3)
    spec = GatedDeltaNetSpec(2, 4, 8, 12, 4, config.rms_norm_eps)
    ours = GatedDeltaNet(HIDDEN, spec, lambda: None)
    for name, tensor in theirs.state_dict().items():
        module_name, _, kind = name.rpartition(".")
        module = ours.get_submodule(module_name)
        if hasattr(module, "weight_loader"):
            module.weight_loader(getattr(module, kind), tensor, name)
        else:
            getattr(module, kind).copy_(tensor)
    return theirs, ours


def test_state_spec_is_the_conv_window_and_the_delta_matrices(mixers):
    _, ours = mixers
    spec = ours.state_spec()
    assert spec.shapes == ((2 * 16 + 48, 3), (4, 8, 12))
    assert spec.dtype is None
    assert spec.bytes_per_slot(torch.float32) == (80 * 3 + 4 * 8 * 12) * 4


def test_chunked_prefills_and_decodes_match_whole_sequences(mixers):
    theirs, ours = mixers
    generator = torch.Generator().manual_seed(1)
    seqs = [torch.randn(n, HIDDEN, generator=generator) for n in LENGTHS]
    with torch.no_grad():
        expected = [theirs(seq[None])[0] for seq in seqs]
    spec = ours.state_spec()
    state = tuple(torch.randn(NUM_SLOTS, *shape, generator=generator) for shape in spec.shapes)
    done = [0] * len(LENGTHS)
    for pieces in STEPS:
        hidden = torch.cat([seqs[i][first : first + n] for i, first, n in pieces])
        out = ours(hidden, state, step_meta(pieces))
        want = torch.cat([expected[i][first : first + n] for i, first, n in pieces])
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        for i, _, n in pieces:
            done[i] += n
    assert done == list(LENGTHS)


def test_recurrent_steps_equal_one_chunk():
    """The decode update token by token ends where the chunked form does, with the same
    outputs, from a nonzero state (the UT transform is exact, not an approximation)."""
    generator = torch.Generator().manual_seed(2)
    heads, length, k_dim, v_dim = 3, 70, 8, 5

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    key = torch.nn.functional.normalize(draw(heads, length, k_dim), dim=-1)
    decay = -torch.rand(heads, length, generator=generator, dtype=torch.float64)
    beta = torch.rand(heads, length, generator=generator, dtype=torch.float64)
    sequence = DeltaInputs(draw(heads, length, k_dim), key, draw(heads, length, v_dim), decay, beta)
    start = draw(heads, k_dim, v_dim)
    chunked, chunked_state = chunked_delta_rule(sequence, start)
    state, outputs = start[None], []
    for t in range(length):
        token = (sequence.query, sequence.key, sequence.value, sequence.decay, sequence.beta)
        out, state = recurrent_delta_step(DeltaInputs(*(x[:, t : t + 1] for x in token)), state)
        outputs.append(out[0])
    torch.testing.assert_close(torch.stack(outputs, dim=1), chunked)
    torch.testing.assert_close(state[0], chunked_state)
