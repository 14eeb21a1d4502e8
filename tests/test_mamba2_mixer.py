"""The Mamba2 mixer (``layers/state/mamba2_mixer``) against transformers' Granite 4.0
hybrid Mamba layer with the same weights: sequences fed in pieces (prefill chunks that
cross the SSD block size, then batched decodes, stale slots of fresh sequences ignored)
equal HF's no-cache forward of each whole sequence, and each slot ends holding the
sequence's final states. Two tensor-parallel ranks (threads of this process) compose to
the one-rank mixer, with B/C groups split and with the one group replicated."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from octavo.attention.metadata import AttentionMetadata
from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.layers.state.mamba2_mixer import Mamba2Mixer, Mamba2Spec
from state_steps import state_step_metadata

SHAPES = {  # 4 heads of 16 in 2 groups, blocks of 8 tokens
    "hidden_size": 32,
    "mamba_n_heads": 4,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 8,
    "num_hidden_layers": 1,
    "layer_types": ["mamba"],
    "vocab_size": 64,
}
LENGTHS = (21, 6, 13)
SLOTS = (3, 1, 4)
STEPS = [  # per step: (sequence, first token, tokens), prefill chunks before decodes
    [(0, 0, 11), (1, 0, 4)],
    [(0, 11, 9), (2, 0, 12), (1, 4, 1)],
    [(0, 20, 1), (1, 5, 1), (2, 12, 1)],
]


def step_meta(pieces: list[tuple[int, int, int]]) -> AttentionMetadata:
    """The metadata a state layer reads for one step of ``pieces``."""
    return state_step_metadata(
        [count for _, _, count in pieces],
        [first + count for _, first, count in pieces],
        [SLOTS[seq] for seq, _, _ in pieces],
        [first > 0 for _, first, _ in pieces],
    )


def hf_layer(**overrides):
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
        GraniteMoeHybridMambaLayer,
    )

    config = GraniteMoeHybridConfig(**{**SHAPES, **overrides})
    torch.manual_seed(0)
    layer = GraniteMoeHybridMambaLayer(config, 0).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.2)
    return config, layer


def octavo_mixer(config, layer) -> Mamba2Mixer:
    spec = Mamba2Spec(
        hidden_size=config.hidden_size,
        num_heads=config.mamba_n_heads,
        head_dim=config.mamba_d_head,
        state_size=config.mamba_d_state,
        n_groups=config.mamba_n_groups,
        conv_kernel=config.mamba_d_conv,
        chunk_size=config.mamba_chunk_size,
        norm_eps=config.rms_norm_eps,
        conv_bias=config.mamba_conv_bias,
        proj_bias=config.mamba_proj_bias,
    )
    mixer = Mamba2Mixer(spec, lambda: None)
    filled = set()
    for name, tensor in layer.state_dict().items():
        filled.update(mixer.load_checkpoint_tensor(name, tensor))
    assert filled == mixer.expected_keys()
    return mixer


@pytest.mark.parametrize("proj_bias", [False, True])
def test_pieces_match_whole_sequences(proj_bias):
    config, layer = hf_layer(mamba_proj_bias=proj_bias)
    mixer = octavo_mixer(config, layer)
    generator = torch.Generator().manual_seed(1)
    seqs = [torch.randn(n, config.hidden_size, generator=generator) for n in LENGTHS]
    with torch.no_grad():
        expected = [layer(seq[None])[0] for seq in seqs]
    conv_shape, ssm_shape = mixer.state_spec().shapes
    state = (torch.randn(6, *conv_shape), torch.randn(6, *ssm_shape))  # stale slots
    for step in STEPS:
        meta = step_meta(step)
        hidden = torch.cat([seqs[seq][first : first + n] for seq, first, n in step])
        with torch.no_grad():
            out = mixer(hidden, state, meta)
        want = torch.cat([expected[seq][first : first + n] for seq, first, n in step])
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert_final_states(config, layer, seqs, state)


def assert_final_states(config, layer, seqs, state) -> None:
    """Each slot holds what HF's cache holds after its whole sequence."""
    from transformers import DynamicCache

    conv_state, ssm_state = state
    for seq, slot in zip(seqs, SLOTS, strict=True):
        cache = DynamicCache(config=config)
        with torch.no_grad():
            layer(seq[None], cache=cache)
        hf_conv = cache.get_conv_state(0, state_idx=0)[0]
        hf_ssm = cache.get_recurrent_state(0, state_idx=0)[0]
        torch.testing.assert_close(conv_state[slot], hf_conv[:, 1:])
        torch.testing.assert_close(ssm_state[slot], hf_ssm, rtol=1e-4, atol=1e-4)


class ThreadRanks:
    """A tensor-parallel group whose ranks are threads of this process: ``all_reduce``
    waits for every rank's tensor and gives each the sum (in rank order)."""

    def __init__(self, size: int) -> None:
        self.size, self.barrier = size, threading.Barrier(size)
        self.parts: list[torch.Tensor | None] = [None] * size
        self.local = threading.local()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.parts[self.local.rank] = tensor.clone()
        self.barrier.wait()
        total = sum(self.parts[1:], self.parts[0])
        self.barrier.wait()
        return tensor.copy_(total)

    def run(self, work) -> list:
        """``work(rank)`` on every rank at once; the results in rank order."""
        results = [None] * self.size

        def one(rank: int) -> None:
            self.local.rank = rank
            results[rank] = work(rank)

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results


@contextlib.contextmanager
def rank_of(rank: int, size: int):
    parallel_state.set_tensor_parallel_group(TensorParallelGroup(rank, size))
    try:
        yield
    finally:
        parallel_state.set_tensor_parallel_group(TensorParallelGroup())


def run_steps(mixer: Mamba2Mixer, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    conv_shape, ssm_shape = mixer.state_spec().shapes
    state = (torch.zeros(6, *conv_shape), torch.zeros(6, *ssm_shape))
    outputs = []
    for step in STEPS[:2]:
        hidden = torch.cat([seqs[seq][first : first + n] for seq, first, n in step])
        with torch.no_grad():
            outputs.append(mixer(hidden, state, step_meta(step)))
    return outputs


@pytest.mark.parametrize("groups", [2, 1])
def test_two_ranks_compose_to_one(groups):
    """Heads split over two ranks; two groups split, or one replicated (its gated norm
    then sums squares over the ranks); the row-parallel out_proj sums the ranks."""
    config, layer = hf_layer(mamba_n_groups=groups, mamba_proj_bias=True)
    generator = torch.Generator().manual_seed(2)
    seqs = [torch.randn(n, config.hidden_size, generator=generator) for n in LENGTHS]
    expected = run_steps(octavo_mixer(config, layer), seqs)
    ranks = ThreadRanks(2)
    mixers = []
    for rank in range(2):
        with rank_of(rank, 2):
            mixers.append(octavo_mixer(config, layer))
        mixers[-1].out_proj.tp = ranks
        assert (mixers[-1].norm.spans is not None) == (groups == 1)
        if mixers[-1].norm.spans is not None:
            mixers[-1].norm.spans = ranks
    outputs = ranks.run(lambda rank: run_steps(mixers[rank], seqs))
    for got, want in zip(outputs[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for got, want in zip(outputs[1], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
