"""``FusedMoE``'s CUDA path hands the Triton fused-MoE kernel this rank's experts, biases
and expert map: its output equals the grouped CPU path's on every rank layout.

Without a GPU the kernel runs under ``TRITON_INTERPRET=1`` on CPU tensors (tiny shapes).
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

from expert_names import GPT_OSS, QWEN_MOE
from octavo.model_executor.layers.activation import ClampedSwigluAndMul, SiluAndMul
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.layers.moe.grouped import grouped_experts
from test_parallel_layers import rank_of

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EXPERTS, TOP_K, HIDDEN, INTER, TOKENS = 4, 2, 32, 32, 6
LAYOUTS = [(0, 1, False), (1, 2, False), (1, 2, True)]  # (rank, ranks, expert parallel)


def random_moe(
    gpt_oss: bool,
    rank: int,
    ranks: int,
    expert_parallel: bool,
    swiglu: ClampedSwigluAndMul | None = None,
) -> FusedMoE:
    options = (
        dict(
            names=GPT_OSS,
            router="softmax_after_topk",
            renormalize=False,
            activation=swiglu or ClampedSwigluAndMul(),
            bias=True,
            router_bias=True,
        )
        if gpt_oss
        else dict(names=QWEN_MOE, renormalize=True, activation=SiluAndMul())
    )
    with rank_of(rank, ranks):
        moe = FusedMoE(
            EXPERTS, TOP_K, HIDDEN, INTER, enable_expert_parallel=expert_parallel, **options
        )
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in moe.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return moe.to(DEVICE)


@pytest.mark.parametrize(("rank", "ranks", "expert_parallel"), LAYOUTS)
@pytest.mark.parametrize("gpt_oss", [False, True])
def test_the_triton_path_equals_the_grouped_path(gpt_oss, rank, ranks, expert_parallel):
    assert_paths_agree(random_moe(gpt_oss, rank, ranks, expert_parallel))


def test_the_configs_swiglu_alpha_and_limit_reach_the_kernel():
    """A config's ``swiglu_alpha`` / ``swiglu_limit`` (not gpt-oss's 1.702 / 7): the Triton
    path applies the same constants as the grouped (CPU) path."""
    assert_paths_agree(random_moe(True, 0, 1, False, ClampedSwigluAndMul(alpha=0.5, limit=0.4)))


def assert_paths_agree(moe: FusedMoE) -> None:
    hidden = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        weights, ids = moe.router(hidden)
        triton_out = moe.experts_triton(hidden, weights, ids)
        experts = moe.placement.num_local_experts
        grouped = grouped_experts(hidden, weights, ids, experts, moe.run_expert, moe.expert_map)
    torch.testing.assert_close(triton_out, grouped, rtol=1e-4, atol=1e-4)
