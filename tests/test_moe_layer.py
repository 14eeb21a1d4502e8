"""The mixture-of-experts layer (``layers/moe``) against transformers' own MoE blocks.

Each kind (Qwen3-MoE, Mixtral, gpt-oss) is built from a tiny seeded config; the HF
block's weights are written out in the checkpoint form the Hub holds and loaded through
``FusedMoE.load_checkpoint_tensor``; router choices must be equal, outputs equal to fp32
rounding. Tensor and expert parallelism run as two ranks in one process (as
``test_parallel_layers.py`` does): each rank loads its part, the all-reduce is the sum.
"""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers
from safetensors import safe_open
from torch import nn
from transformers import GptOssConfig, MixtralConfig, Qwen3MoeConfig

import moe_ranks
from expert_names import GPT_OSS, MIXTRAL, QWEN_MOE
from moe_checkpoints import load_whole_checkpoint
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.checkpoint_slice import CheckpointSlice
from octavo.model_executor.layers.activation import ClampedSwigluAndMul, SiluAndMul
from octavo.model_executor.layers.moe import FusedMoE
from octavo.model_executor.layers.moe.mxfp4 import dequantize_mxfp4
from test_parallel_layers import on_ranks

EXPERTS, TOP_K, HIDDEN, INTER, TOKENS = 4, 2, 32, 64, 9
# transformers' modeling modules import triton: they are imported inside the tests, after
# collection, so that the Triton test modules can still set TRITON_INTERPRET first.


@dataclass(frozen=True)
class Kind:
    name: str
    hf_block: Callable[[bool], nn.Module]  # norm_topk_prob -> the HF block
    options: Callable[[bool], dict]  # norm_topk_prob -> FusedMoE's keyword arguments


def qwen_block(norm: bool) -> nn.Module:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTER,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=norm,
    )
    return Qwen3MoeSparseMoeBlock(config)


def mixtral_block(_: bool) -> nn.Module:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
    )
    return MixtralSparseMoeBlock(config)


def gpt_oss_block(_: bool) -> nn.Module:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = GptOssConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
    )
    return GptOssMLP(config)


KINDS = {
    "qwen3_moe": Kind(
        "qwen3_moe",
        qwen_block,
        lambda norm: dict(
            names=QWEN_MOE,
            router="softmax",
            renormalize=norm,
            activation=SiluAndMul(),
            router_weights_in_model_dtype=True,
        ),
    ),
    "mixtral": Kind(
        "mixtral",
        mixtral_block,
        lambda _: dict(names=MIXTRAL, router="softmax", renormalize=True, activation=SiluAndMul()),
    ),
    "gpt_oss": Kind(
        "gpt_oss",
        gpt_oss_block,
        lambda _: dict(
            names=GPT_OSS,
            router="softmax_after_topk",
            renormalize=False,
            activation=ClampedSwigluAndMul(),
            bias=True,
            router_bias=True,
        ),
    ),
}
CASES = [("qwen3_moe", True), ("qwen3_moe", False), ("mixtral", True), ("gpt_oss", False)]


def seeded_block(kind: str, norm: bool, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    block = KINDS[kind].hf_block(norm).eval()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.normal_(0.0, 0.3)
    return block


def hub_checkpoint(kind: str, block: nn.Module) -> dict[str, torch.Tensor]:
    """The block's weights as the Hub (and ``save_pretrained``) stores them."""
    state = {name: t.detach().clone() for name, t in block.state_dict().items()}
    if kind == "gpt_oss":
        return state  # stored fused, as in memory
    names = QWEN_MOE if kind == "qwen3_moe" else MIXTRAL
    gate_up, down = state.pop("experts.gate_up_proj"), state.pop("experts.down_proj")
    for e in range(EXPERTS):
        state[names.gate.format(e=e)] = gate_up[e, :INTER].clone()
        state[names.up.format(e=e)] = gate_up[e, INTER:].clone()
        state[names.down.format(e=e)] = down[e].clone()
    return state


def build_moe(kind: str, norm: bool, checkpoint: dict, **overrides) -> FusedMoE:
    options = {**KINDS[kind].options(norm), **overrides}
    moe = FusedMoE(EXPERTS, TOP_K, HIDDEN, INTER, **options)
    load_whole_checkpoint(moe, checkpoint)
    moe.process_weights_after_loading()
    return moe


def hf_output(block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = block(hidden.unsqueeze(0))
    return (out[0] if isinstance(out, tuple) else out).squeeze(0)


def hf_router(block: nn.Module) -> nn.Module:
    return block.router if hasattr(block, "router") else block.gate


@pytest.mark.parametrize(("kind", "norm"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_choices_and_weights_equal_transformers(kind, norm, dtype):
    block = seeded_block(kind, norm).to(dtype)
    moe = build_moe(kind, norm, hub_checkpoint(kind, block)).to(dtype)
    hidden = torch.randn(64, HIDDEN, dtype=dtype)
    with torch.no_grad():
        _, hf_weights, hf_ids = hf_router(block)(hidden)
        weights, ids = moe.router(hidden)
    assert torch.equal(ids, hf_ids)
    assert weights.dtype == hf_weights.dtype
    assert torch.equal(weights, hf_weights)


@pytest.mark.parametrize(("kind", "norm"), CASES)
def test_fused_moe_equals_the_transformers_block(kind, norm):
    block = seeded_block(kind, norm)
    moe = build_moe(kind, norm, hub_checkpoint(kind, block))
    hidden = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        out = moe(hidden)
    torch.testing.assert_close(out, hf_output(block, hidden), rtol=1e-5, atol=1e-5)


def on_two_ranks(monkeypatch, kind: str, norm: bool, checkpoint: dict, **options):
    """Each rank's FusedMoE, its all-reduce left to the caller (the sum of the outputs)."""
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, tensor: tensor)
    return on_ranks(2, lambda: build_moe(kind, norm, checkpoint, **options))


@pytest.mark.parametrize(("kind", "norm"), CASES)
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_two_ranks_sum_to_the_single_process_output(monkeypatch, kind, norm, expert_parallel):
    block = seeded_block(kind, norm)
    checkpoint = hub_checkpoint(kind, block)
    hidden = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        expected = build_moe(kind, norm, checkpoint)(hidden)
        ranks = on_two_ranks(
            monkeypatch, kind, norm, checkpoint, enable_expert_parallel=expert_parallel
        )
        total = sum(rank(hidden) for rank in ranks)
    for rank in ranks:  # each holds half: whole experts (EP) or half of each (TP)
        assert rank.w13.shape == ((2, 2 * INTER, HIDDEN) if expert_parallel else (4, INTER, HIDDEN))
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
@pytest.mark.parametrize("tokens", [3, 40])  # int8: the block kernel, then _int_mm or a GEMM
@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_quantized_experts_stay_close_to_float(kind, quantization, tokens):
    block = seeded_block(kind, True)
    checkpoint = hub_checkpoint(kind, block)
    hidden = torch.randn(tokens, HIDDEN)
    with torch.no_grad():
        expected = build_moe(kind, True, checkpoint)(hidden)
        moe = build_moe(kind, True, checkpoint, quantization=quantization)
        out = moe(hidden)
    assert moe.w13 is None and len(moe.quantized.gate_up) == EXPERTS
    relative = (out - expected).norm() / expected.norm()
    assert relative < (0.02 if quantization == "int8" else 0.06), relative


def test_unsupported_expert_quantization_is_a_clear_error():
    with pytest.raises(ValueError, match="'gptq' is not supported for MoE experts"):
        FusedMoE(EXPERTS, TOP_K, HIDDEN, INTER, names=QWEN_MOE, quantization="gptq")


def test_missing_and_misshapen_expert_weights_are_named():
    checkpoint = hub_checkpoint("mixtral", seeded_block("mixtral", True))
    moe = FusedMoE(EXPERTS, TOP_K, HIDDEN, INTER, names=MIXTRAL)
    loaded = set()
    for name, tensor in checkpoint.items():
        if name != "experts.2.w3.weight":
            loaded.update(moe.load_checkpoint_tensor(name, tensor))
    assert moe.expected_keys() - loaded == {"experts.2.up"}
    assert moe.load_checkpoint_tensor("experts.9.w1.weight", torch.zeros(1)) == []
    with pytest.raises(ValueError, match=r"experts.1.w2.weight: checkpoint shape \(64, 32\)"):
        moe.load_checkpoint_tensor("experts.1.w2.weight", torch.zeros(INTER, HIDDEN))


def mxfp4_pair(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks ``[E, rows, columns/32, 16]`` and scales near 2^0."""
    generator = torch.Generator().manual_seed(seed)
    shape = (EXPERTS, rows, columns // 32)
    blocks = torch.randint(0, 256, (*shape, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(120, 130, shape, dtype=torch.uint8, generator=generator)
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_dequantization_is_bit_equal_to_transformers(dtype):
    blocks, scales = mxfp4_pair(2 * INTER, HIDDEN, seed=3)
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    expected = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, H, 2I]
    assert torch.equal(dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2), expected)


@pytest.mark.parametrize("inter", [64, 32])  # halves of 32 and 16 columns: whole groups or not
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_mxfp4_experts_load_like_their_dequantized_form(monkeypatch, inter, expert_parallel):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    block = seeded_block("gpt_oss", False)
    dense = {
        k: v for k, v in hub_checkpoint("gpt_oss", block).items() if "proj" not in k or "bias" in k
    }
    packed = dict(dense)
    for name, (rows, columns) in {
        "gate_up_proj": (2 * inter, HIDDEN),
        "down_proj": (HIDDEN, inter),
    }.items():
        blocks, scales = mxfp4_pair(rows, columns, seed=len(name))
        packed[f"experts.{name}_scales"] = scales  # the scales first: either order loads
        packed[f"experts.{name}_blocks"] = blocks
        dense[f"experts.{name}"] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    dense["experts.gate_up_proj_bias"] = torch.randn(EXPERTS, 2 * inter)
    packed["experts.gate_up_proj_bias"] = dense["experts.gate_up_proj_bias"]
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, tensor: tensor)
    hidden = torch.randn(TOKENS, HIDDEN)
    outputs = []
    for checkpoint in (dense, packed):
        ranks = on_ranks(2, lambda c=checkpoint: mxfp4_moe(c, inter, expert_parallel))
        with torch.no_grad():
            outputs.append(sum(rank(hidden) for rank in ranks))
    assert torch.equal(outputs[0], outputs[1])


def mxfp4_moe(checkpoint: dict, inter: int, expert_parallel: bool) -> FusedMoE:
    options = {**KINDS["gpt_oss"].options(False), "enable_expert_parallel": expert_parallel}
    moe = FusedMoE(EXPERTS, TOP_K, HIDDEN, inter, **options)
    load_whole_checkpoint(moe, checkpoint)
    return moe


HF_MODELS = {
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        Qwen3MoeConfig,
        dict(num_experts=EXPERTS, moe_intermediate_size=INTER),
        "mlp",
    ),
    "mixtral": (
        "MixtralForCausalLM",
        MixtralConfig,
        dict(num_local_experts=EXPERTS, intermediate_size=INTER),
        "block_sparse_moe",
    ),
    "gpt_oss": (
        "GptOssForCausalLM",
        GptOssConfig,
        dict(num_local_experts=EXPERTS, intermediate_size=INTER),
        "mlp",
    ),
}


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_loads_the_moe_block_of_a_checkpoint_saved_by_transformers(monkeypatch, tmp_path, kind):
    model_class, config_class, sizes, block_name = HF_MODELS[kind]
    torch.manual_seed(5)
    config = config_class(
        vocab_size=64,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts_per_tok=TOP_K,
        **sizes,
    )
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(tmp_path)
    prefix = f"model.layers.0.{block_name}."
    monkeypatch.setattr(TensorParallelGroup, "all_reduce", lambda self, tensor: tensor)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as reader:
        tensors = {
            name.removeprefix(prefix): CheckpointSlice(reader.get_slice(name))
            for name in reader.keys()  # noqa: SIM118 (safe_open is not a mapping)
            if name.startswith(prefix)
        }
        norm = getattr(config, "norm_topk_prob", True)  # Qwen3-MoE's default: False
        ranks = on_ranks(2, lambda: build_moe(kind, norm, tensors))
    hidden = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        total = sum(rank(hidden) for rank in ranks)
    block = model.model.layers[0].mlp  # saved as block_name (Mixtral: block_sparse_moe)
    torch.testing.assert_close(total, hf_output(block, hidden), rtol=1e-5, atol=1e-5)


def test_two_processes_over_gloo_all_reduce_to_the_single_process_output():
    block = seeded_block("gpt_oss", False)
    checkpoint = hub_checkpoint("gpt_oss", block)
    hidden = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        expected = build_moe("gpt_oss", False, checkpoint)(hidden)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    sizes = (EXPERTS, TOP_K, HIDDEN, INTER)
    procs = [
        context.Process(
            target=moe_ranks.rank_main, args=(rank, 2, port, sizes, checkpoint, hidden, results)
        )
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    reports = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    for outputs in reports.values():  # every rank holds the summed output
        for expert_parallel in (False, True):
            output = torch.from_numpy(outputs[expert_parallel])
            torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
