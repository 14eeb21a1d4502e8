"""Rope variants (yarn, dynamic NTK, longrope, partial rotary, per-layer-type bases) and
their config spellings, against transformers' own rope code and rotary modules."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

from octavo.kernels import cpu_build
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.rope_parameters import rope_parameters_for
from octavo.model_executor.rotary import RotaryEmbedding, apply_rotary, rope_frequencies

HEAD_DIM = 64
LONG_FACTORS = {
    "short_factor": [1.0 + i / 16 for i in range(HEAD_DIM // 2)],
    "long_factor": [2.0 + i for i in range(HEAD_DIM // 2)],
}
SIZES = {"hidden_size": 4 * HEAD_DIM, "num_attention_heads": 4, "head_dim": HEAD_DIM}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
DEEPSEEK_YARN = {
    **YARN,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "mscale": 1.0,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}
# (model_type, config kwargs, rope_type to ask transformers for, seq_len for transformers)
CASES = {
    "linear": ("llama", {"rope_scaling": {"type": "linear", "factor": 4.0}}, "linear", None),
    "llama3": (
        "llama",
        {
            "rope_theta": 500000.0,
            "max_position_embeddings": 131072,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        "llama3",
        None,
    ),
    "gpt-oss yarn": ("gpt_oss", {}, "yarn", None),
    "qwen3 yarn": (
        "qwen3",
        {"rope_theta": 1e6, "max_position_embeddings": 131072, "rope_scaling": YARN},
        "yarn",
        None,
    ),
    "deepseek yarn": ("llama", {"rope_scaling": DEEPSEEK_YARN}, "yarn", None),
    "yarn attention_factor": (
        "llama",
        {"rope_scaling": {**YARN, "attention_factor": 0.8, "beta_fast": 16}},
        "yarn",
        None,
    ),
    "yarn partial": (
        "qwen3",
        {"rope_scaling": YARN, "partial_rotary_factor": 0.5, "max_position_embeddings": 131072},
        "yarn",
        None,
    ),
    "dynamic": ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic", None),
    "longrope short": (
        "phi3",
        {
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", **LONG_FACTORS},
        },
        "longrope",
        None,
    ),
}


def hf_config(model_type: str, kwargs: dict):
    return AutoConfig.for_model(model_type, **SIZES, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_frequencies_and_attention_factor_match_transformers(case):
    model_type, kwargs, rope_type, seq_len = CASES[case]
    config = hf_config(model_type, kwargs)
    expected, expected_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    ours = rope_frequencies(HEAD_DIM, rope_parameters_for(config.to_dict()))
    torch.testing.assert_close(ours.inv_freq, expected, rtol=1e-6, atol=0)
    assert math.isclose(ours.attention_factor, expected_factor, rel_tol=1e-12)


def test_longrope_long_factors_and_partial_rotary_match_transformers():
    """Phi-4-mini's shape: longrope on the first 3/4 of each head."""
    factors = {key: values[: HEAD_DIM * 3 // 8] for key, values in LONG_FACTORS.items()}
    config = hf_config(
        "phi3",
        {
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "longrope", **factors},
        },
    )
    ours = rope_frequencies(HEAD_DIM, rope_parameters_for(config.to_dict()))
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu")
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=4097)
    assert ours.rotary_dim == 48 and ours.long_from == 4096
    torch.testing.assert_close(ours.inv_freq, short, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.long_inv_freq, long, rtol=1e-6, atol=0)
    assert math.isclose(ours.attention_factor, factor) and factor > 1


def hf_cos_sin(rotary, positions: torch.Tensor, dtype: torch.dtype, **kwargs):
    x = torch.zeros(1, dtype=dtype)
    cos, sin = rotary(x, positions[None], **kwargs)
    return cos[0], sin[0]


def our_cos_sin(config, positions, dtype, layer_type="full_attention", max_positions=8192):
    rope = rope_parameters_for(config.to_dict(), layer_type)
    rotary = RotaryEmbedding(HEAD_DIM, max_positions, rope, dtype, torch.device("cpu"))
    return rotary.cos[positions], rotary.sin[positions]


def assert_tables_equal(ours, theirs) -> None:
    for mine, expected in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_yarn_tables_fold_the_attention_factor_as_gpt_oss_does(dtype):
    config = hf_config("gpt_oss", {})
    positions = torch.tensor([0, 1, 5, 4095, 4096, 7000])
    half_cos, half_sin = hf_cos_sin(GptOssRotaryEmbedding(config), positions, dtype)
    theirs = torch.cat((half_cos, half_cos), -1), torch.cat((half_sin, half_sin), -1)
    ours = our_cos_sin(config, positions, dtype)  # gpt-oss rotates halves, as NeoX does
    assert_tables_equal(ours, theirs)
    assert ours[0][0].abs().max() > 1.3  # cos(0) * mscale


def test_longrope_tables_short_below_and_long_from_the_original_length():
    """A prompt within 4096 matches transformers' short table; a token decoded at 4096 or
    later (transformers then sees seq_len > 4096) matches its long table."""
    config = hf_config("phi3", CASES["longrope short"][1])
    prompt = torch.arange(0, 4096, 7)
    theirs = hf_cos_sin(Phi3RotaryEmbedding(config), prompt, torch.float32)
    assert_tables_equal(our_cos_sin(config, prompt, torch.float32), theirs)
    for position in (4096, 6000):
        one = torch.tensor([position])
        theirs = hf_cos_sin(Phi3RotaryEmbedding(config), one, torch.float32)
        assert_tables_equal(our_cos_sin(config, one, torch.float32), theirs)


def vllm_dynamic_ntk_inv_freq(theta: float, dim: int, max_position: int, factor: float):
    """vLLM's ``DynamicNTKScalingRotaryEmbedding._compute_cos_sin_cache`` frequencies, written
    out: one static base for a length of ``max_position * factor`` (the formula vLLM's Llama
    path has long used; vLLM PR #41277, 2026, reworked it for Nomic's embedders)."""
    max_len = max_position * factor
    base = theta * ((factor * max_len / max_position) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def test_dynamic_ntk_matches_transformers_within_and_vllm_beyond():
    config = hf_config("llama", {"max_position_embeddings": 2048, **CASES["dynamic"][1]})
    within = torch.arange(0, 2048, 5)
    theirs = hf_cos_sin(LlamaRotaryEmbedding(config), within, torch.float32)
    assert_tables_equal(our_cos_sin(config, within, torch.float32, max_positions=4096), theirs)
    # beyond 2048: vLLM's static table, computed here from its formula (not transformers')
    beyond = torch.tensor([2048, 3000, 4095])
    angles = torch.outer(beyond.float(), vllm_dynamic_ntk_inv_freq(10000.0, HEAD_DIM, 2048, 2.0))
    cos, sin = our_cos_sin(config, beyond, torch.float32, max_positions=4096)
    torch.testing.assert_close(cos[:, : HEAD_DIM // 2], angles.cos(), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(sin[:, HEAD_DIM // 2 :], angles.sin(), rtol=2e-6, atol=2e-6)
    # and not transformers' per-length recomputation (a batch ending at position 3000)
    per_length = hf_cos_sin(LlamaRotaryEmbedding(config), beyond[1:2], torch.float32)[0]
    assert (per_length[0, : HEAD_DIM // 2] - cos[1, : HEAD_DIM // 2]).abs().max() > 1e-2


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_gemma3_bases_per_layer_type(layer_type):
    config = hf_config("gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    positions = torch.tensor([0, 3, 100, 4000])
    rotary = Gemma3RotaryEmbedding(config)
    theirs = hf_cos_sin(rotary, positions, torch.float32, layer_type=layer_type)
    assert_tables_equal(our_cos_sin(config, positions, torch.float32, layer_type), theirs)


def test_rope_parameters_for_transformers_5_configs():
    gemma = AutoConfig.for_model("gemma3_text").to_dict()
    assert rope_parameters_for(gemma, "sliding_attention")["rope_theta"] == 10000.0
    assert rope_parameters_for(gemma)["rope_theta"] == 1000000.0
    gpt_oss = rope_parameters_for(AutoConfig.for_model("gpt_oss").to_dict(), "sliding_attention")
    assert gpt_oss["rope_type"] == "yarn" and gpt_oss["truncate"] is False
    assert gpt_oss["factor"] == 32.0 and gpt_oss["original_max_position_embeddings"] == 4096
    qwen3 = rope_parameters_for(AutoConfig.for_model("qwen3").to_dict())
    assert qwen3["rope_type"] == "default" and qwen3["rope_theta"] == 10000.0
    with pytest.raises(ValueError, match="no entry for layer type 'chunked_attention'"):
        rope_parameters_for(gemma, "chunked_attention")


def test_rope_parameters_for_transformers_4_spellings():
    old_gemma3 = {
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    assert rope_parameters_for(old_gemma3, "sliding_attention") == {
        "rope_type": "default",
        "rope_theta": 1e4,
    }
    full = rope_parameters_for(old_gemma3)
    assert (full["rope_type"], full["factor"], full["rope_theta"]) == ("linear", 8.0, 1e6)
    phi3 = rope_parameters_for(
        {
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 4096,
            "max_position_embeddings": 131072,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "su", **LONG_FACTORS},
        }
    )
    assert phi3["rope_type"] == "longrope" and "type" not in phi3
    assert phi3["original_max_position_embeddings"] == 4096
    assert phi3["partial_rotary_factor"] == 0.75 and phi3["max_position_embeddings"] == 131072
    assert rope_parameters_for({})["rope_type"] == "default"


def test_model_config_reads_per_layer_rope_parameters():
    raw = AutoConfig.for_model("gemma3_text").to_dict()
    rope = ModelConfig.from_dict({**raw, "architectures": ["LlamaForCausalLM"]}).rope
    assert rope == {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "max_position_embeddings": 131072,
    }


def test_bad_rope_settings_are_clear_errors():
    with pytest.raises(ValueError, match="unsupported rope_type 'mrope'"):
        rope_frequencies(HEAD_DIM, {"rope_type": "mrope", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_frequencies(
            HEAD_DIM, {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.01}
        )
    with pytest.raises(ValueError, match="long_factor has 2 entries, expected 32"):
        rope_frequencies(
            HEAD_DIM,
            {
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "original_max_position_embeddings": 4096,
                "factor": 4.0,
                "short_factor": [1.0] * 32,
                "long_factor": [1.0, 2.0],
            },
        )
    with pytest.raises(ValueError, match="needs 'original_max_position_embeddings'"):
        rope_frequencies(HEAD_DIM, {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})


@pytest.fixture(params=["torch", "native"])
def path(request):
    if request.param == "torch":
        cpu_build.use_torch_path()
        yield "torch"
        cpu_build.use_torch_path(False)
        return
    if cpu_build.cpu_ops() is None:
        if shutil.which("c++"):
            pytest.fail(f"a C++ compiler is here but no kernels: {cpu_build.unavailable_reason()}")
        pytest.skip(reason=f"no C++ compiler on this machine: {cpu_build.unavailable_reason()}")
    yield "native"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_rotary_apply_matches_phi3(path, dtype):
    """Only the first rotary_dim dims of each head rotate; the rest pass through."""
    config = hf_config("phi3", {"partial_rotary_factor": 0.5})
    rope = rope_parameters_for(config.to_dict())
    rotary = RotaryEmbedding(HEAD_DIM, 512, rope, dtype, torch.device("cpu"))
    tokens, heads = 9, 3
    positions = torch.randint(0, 512, (tokens,))
    qkv = torch.randn(tokens, 2 * heads * HEAD_DIM, dtype=dtype)  # q and k rows, as a qkv view
    qk = qkv.view(tokens, 2 * heads, HEAD_DIM)
    cos, sin = hf_cos_sin(Phi3RotaryEmbedding(config), positions, dtype)
    q = qk.transpose(0, 1)[None]  # [1, heads, tokens, head_dim]
    expected, _ = apply_rotary_pos_emb(q, q, cos[None], sin[None])
    rotary.for_step(positions).apply_(qk)
    rotated = qk.transpose(0, 1)[None]
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(rotated, expected, rtol=tolerance, atol=tolerance)
    assert torch.equal(rotated[..., 32:], expected[..., 32:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scaled_tables_through_the_native_kernel(dtype):
    """The native kernel reads the same tables: yarn's attention factor included."""
    ops = cpu_build.cpu_ops()
    if ops is None:
        pytest.skip(reason=f"native kernels unavailable here: {cpu_build.unavailable_reason()}")
    rope = rope_parameters_for(hf_config("gpt_oss", {}).to_dict())
    rotary = RotaryEmbedding(HEAD_DIM, 8192, rope, dtype, torch.device("cpu"))
    qk = torch.randn(6, 5, HEAD_DIM, dtype=dtype)
    positions = torch.tensor([0, 1, 4095, 4096, 5000, 8191])
    cos, sin = rotary.tables(positions)
    expected = apply_rotary(qk, cos, sin)
    ops.rotary_embedding(positions, qk, rotary.cos, rotary.sin)
    if dtype == torch.float32:  # same operations in the same order
        assert torch.equal(qk, expected)
    torch.testing.assert_close(qk.float(), expected.float(), rtol=2e-2, atol=2e-2)
