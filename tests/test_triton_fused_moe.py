"""The Triton fused-MoE kernels against a naive per-token loop over the routed experts.

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on CPU tensors (tiny shapes);
with one, the same tests run compiled on CUDA tensors, plus realistic shapes in bf16.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():  # must be set before triton is first imported
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before this module: run with TRITON_INTERPRET=1")
    os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass

import pytest

from octavo.model_executor.layers.moe.triton_fused_moe import (
    SwigluConstants,
    align_pairs,
    fused_moe_triton,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NO_GPU = "needs a CUDA GPU (none on CI: the kernels are checked there under TRITON_INTERPRET)"
# Triton 3.7's interpreter returns garbage from tl.dot on bf16 operands (loads are fine).
BF16_DOT = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the interpreter's bf16 tl.dot is wrong"
)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
EXPERTS, TOP_K, HIDDEN, INTER = 4, 2, 32, 48  # tiny: the interpreter is slow


@dataclass
class MoeCase:
    hidden: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    expert_map: torch.Tensor | None = None

    def to(self, device: torch.device, dtype: torch.dtype) -> MoeCase:
        """The case on a device, hidden/weights/biases in ``dtype`` (routing unchanged)."""
        moved = {name: None if t is None else t.to(device) for name, t in vars(self).items()}
        for name in ("hidden", "w13", "w2", "w13_bias", "w2_bias"):
            if moved[name] is not None:
                moved[name] = moved[name].to(dtype)
        return MoeCase(**moved)


def make_case(
    tokens: int,
    experts: int = EXPERTS,
    local_experts: int = EXPERTS,
    routed_to: list[int] | None = None,
    top_k: int = TOP_K,
    size: tuple[int, int] = (HIDDEN, INTER),
    biases: bool = False,
    seed: int = 0,
) -> MoeCase:
    """Random weights; each token picks ``top_k`` distinct experts among ``routed_to``."""
    gen = torch.Generator().manual_seed(seed)
    hidden_size, inter = size
    allowed = torch.tensor(routed_to if routed_to is not None else range(experts))
    picks = [allowed[torch.randperm(len(allowed), generator=gen)[:top_k]] for _ in range(tokens)]
    topk_ids = torch.stack(picks) if picks else torch.zeros(0, top_k, dtype=torch.long)
    weights = torch.rand(tokens, top_k, generator=gen)
    case = MoeCase(
        hidden=torch.randn(tokens, hidden_size, generator=gen),
        w13=torch.randn(local_experts, 2 * inter, hidden_size, generator=gen) / hidden_size**0.5,
        w2=torch.randn(local_experts, hidden_size, inter, generator=gen) / inter**0.5,
        topk_weights=weights / weights.sum(dim=1, keepdim=True),
        topk_ids=topk_ids,
    )
    if biases:
        case.w13_bias = torch.randn(local_experts, 2 * inter, generator=gen)
        case.w2_bias = torch.randn(local_experts, hidden_size, generator=gen)
    return case


GPT_OSS_SWIGLU = SwigluConstants()


def reference_activation(
    gate: torch.Tensor, up: torch.Tensor, activation: str, swiglu: SwigluConstants
) -> torch.Tensor:
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    limit = swiglu.limit
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(swiglu.alpha * gate)


def reference_expert(
    case: MoeCase, expert: int, row: torch.Tensor, activation: str, swiglu: SwigluConstants
):
    gate_up = case.w13[expert].float() @ row
    if case.w13_bias is not None:
        gate_up = gate_up + case.w13_bias[expert].float()
    gate, up = gate_up.chunk(2)
    out = case.w2[expert].float() @ reference_activation(gate, up, activation, swiglu)
    return out if case.w2_bias is None else out + case.w2_bias[expert].float()


def reference_moe(
    case: MoeCase, activation: str, swiglu: SwigluConstants = GPT_OSS_SWIGLU
) -> torch.Tensor:
    """One token, one routed slot at a time, in fp32."""
    out = torch.zeros(case.hidden.shape, dtype=torch.float32, device=case.hidden.device)
    for token, row in enumerate(case.hidden.float()):
        for slot, expert in enumerate(case.topk_ids[token].tolist()):
            if case.expert_map is not None:
                expert = int(case.expert_map[expert])
            if expert >= 0:
                weight = case.topk_weights[token, slot].float()
                out[token] += weight * reference_expert(case, expert, row, activation, swiglu)
    return out


def run_kernel(
    case: MoeCase, activation: str, swiglu: SwigluConstants | None = None
) -> torch.Tensor:
    return fused_moe_triton(
        case.hidden,
        case.w13,
        case.w2,
        case.topk_weights,
        case.topk_ids,
        activation,
        w13_bias=case.w13_bias,
        w2_bias=case.w2_bias,
        expert_map=case.expert_map,
        swiglu=swiglu,
    )


def assert_close(
    case: MoeCase,
    activation: str,
    dtype: torch.dtype,
    swiglu: SwigluConstants = GPT_OSS_SWIGLU,
) -> None:
    actual = run_kernel(case, activation, swiglu)
    expected = reference_moe(case, activation, swiglu)
    assert actual.dtype == case.hidden.dtype and actual.shape == case.hidden.shape
    error = (actual.float() - expected).abs().max()
    assert error <= TOLERANCE[dtype] * max(expected.abs().max(), 1.0), error


@pytest.mark.parametrize("activation", ["silu", "clamped_swiglu"])
@pytest.mark.parametrize("tokens", [1, 5, 20])  # 5: small row blocks; 20: large ones
def test_matches_the_per_token_loop(activation, tokens):
    case = make_case(tokens, routed_to=[0, 1, 3], biases=activation == "clamped_swiglu")
    assert_close(case.to(DEVICE, torch.float32), activation, torch.float32)


def test_clamped_swiglu_clamps_large_gates_and_ups():
    case = make_case(12, biases=True, seed=1)
    case.hidden *= 8.0  # gate and up values well past +-7
    gate_up = torch.einsum("th,eih->tei", case.hidden, case.w13)
    assert (gate_up > 7).any() and (gate_up < -7).any()
    assert_close(case.to(DEVICE, torch.float32), "clamped_swiglu", torch.float32)


def test_clamped_swiglu_takes_the_configs_alpha_and_limit():
    """Not gpt-oss's 1.702 / 7: a config's ``swiglu_alpha`` / ``swiglu_limit`` reach the
    kernel (the old kernel had them as constants, off by far more than the tolerance)."""
    case = make_case(12, biases=True, seed=6)
    case.hidden *= 4.0
    swiglu = SwigluConstants(alpha=0.75, limit=2.5)
    gate_up = torch.einsum("th,eih->tei", case.hidden, case.w13)
    assert (gate_up.abs() > swiglu.limit).float().mean() > 0.2  # the limit clamps
    case = case.to(DEVICE, torch.float32)
    assert_close(case, "clamped_swiglu", torch.float32, swiglu)
    gpt_oss = reference_moe(case, "clamped_swiglu")
    assert (run_kernel(case, "clamped_swiglu", swiglu) - gpt_oss).abs().max() > 0.1


def test_experts_on_other_ranks_add_nothing():
    case = make_case(17, experts=8, local_experts=EXPERTS, biases=True, seed=2)
    case.expert_map = torch.tensor([-1, 0, -1, 1, 2, -1, 3, -1])
    case.topk_ids[0] = torch.tensor([0, 2])  # a token with no expert on this rank
    case = case.to(DEVICE, torch.float32)
    assert_close(case, "silu", torch.float32)
    assert torch.equal(run_kernel(case, "silu")[0], torch.zeros(HIDDEN, device=DEVICE))


def test_strided_hidden_and_weights():
    case = make_case(9, seed=3).to(DEVICE, torch.float32)
    wide = torch.zeros(9, 2 * HIDDEN, device=DEVICE)
    wide[:, 1::2] = case.hidden
    case.hidden = wide[:, 1::2]
    case.w13 = case.w13.transpose(1, 2).contiguous().transpose(1, 2)
    assert not case.hidden.is_contiguous() and not case.w13.is_contiguous()
    assert_close(case, "silu", torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=BF16_DOT)])
def test_half_precision(dtype):
    case = make_case(6, biases=True, seed=4)
    assert_close(case.to(DEVICE, dtype), "clamped_swiglu", dtype)


def test_no_tokens():
    case = make_case(0).to(DEVICE, torch.float32)
    assert run_kernel(case, "silu").shape == (0, HIDDEN)


def test_alignment_puts_every_pair_once_in_a_block_of_its_expert():
    local_ids = torch.tensor([3, 0, -1, 3, 3, 0, 1, -1, 3, 3])
    aligned = align_pairs(local_ids, num_experts=5, block_m=2)
    blocks = aligned.pair_ids.view(aligned.num_blocks, 2)
    seen = []
    for expert, block in zip(aligned.block_experts.tolist(), blocks.tolist(), strict=True):
        real = [pair for pair in block if pair < len(local_ids)]
        assert expert >= 0 or not real
        assert all(local_ids[pair] == expert for pair in real)
        seen += real
    assert sorted(seen) == [pair for pair, e in enumerate(local_ids.tolist()) if e >= 0]
    assert aligned.block_experts.tolist()[:5] == [0, 1, 3, 3, 3]  # expert 2, 4: no blocks


def test_alignment_reads_nothing_on_the_host_so_a_graph_can_hold_it():
    """No op of the alignment reads device values on the host (CUDA's bincount would: it
    sizes its output by the largest key), so a CUDA graph can capture a MoE layer. Checked
    by recording it on CPU as a decode graph would, on ids unlike the recorded ones."""
    from octavo.model_executor.cpu_graphs import CpuGraphRecorder

    local_ids = torch.tensor([3, 0, -1, 3, 3, 0, 1, -1, 3, 3])
    with torch.inference_mode():
        tape = CpuGraphRecorder().record(lambda: align_pairs(local_ids, 5, 2).pair_ids)
        local_ids.copy_(torch.tensor([1, 1, 4, -1, 0, 2, 2, 2, 3, 4]))
        assert torch.equal(tape(), align_pairs(local_ids, 5, 2).pair_ids)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation": "gelu"}, "unknown MoE activation"),
        ({"w2": torch.zeros(EXPERTS, HIDDEN, INTER + 1)}, "does not match w13"),
        ({"hidden": torch.zeros(3, HIDDEN + 1)}, "does not match hidden"),
        ({"topk_weights": torch.zeros(3, TOP_K + 1)}, "differ in shape"),
        ({"w13_bias": torch.zeros(EXPERTS, INTER)}, "w13_bias has shape"),
        ({"w2": torch.zeros(EXPERTS, HIDDEN, INTER, dtype=torch.float16)}, "differ in dtype"),
    ],
)
def test_bad_arguments_are_named(change, message):
    case = make_case(3)
    arguments = {
        "hidden": case.hidden,
        "w13": case.w13,
        "w2": case.w2,
        "topk_weights": case.topk_weights,
        "topk_ids": case.topk_ids,
        "activation": "silu",
    }
    with pytest.raises(ValueError, match=message):
        fused_moe_triton(**(arguments | change))


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize(
    ("activation", "shape"),
    [
        ("silu", {"tokens": 257, "experts": 64, "top_k": 8, "size": (2048, 768)}),
        ("clamped_swiglu", {"tokens": 64, "experts": 32, "top_k": 4, "size": (2880, 2880)}),
    ],
)
def test_realistic_shapes_on_cuda(activation, shape):
    experts = shape["experts"]
    case = make_case(**shape, local_experts=experts // 2, biases=activation != "silu", seed=5)
    case.expert_map = torch.full((experts,), -1, dtype=torch.long)
    case.expert_map[::2] = torch.arange(experts // 2)  # every other expert on this rank
    assert_close(case.to(DEVICE, torch.bfloat16), activation, torch.bfloat16)
