"""`python -m octavo_bench random-model`: a random-weight checkpoint of a real model's shape
for an architecture, written by transformers, with the embedded model's tokenizer.

Throughput does not depend on what the weights say (the benchmarks run greedy with
``ignore_eos``), so architectures can be compared, and against vLLM, on the same folder
without downloading weights. The shapes are SmolLM2-135M's (hidden 576, 9 heads of 64,
3 KV heads); the MoE ones give each token about the dense model's MLP work. The GPU
benchmark's shapes are real models' (llama-1b, llama-8b, qwen3-0.6b; the last two with
their own vocabulary sizes, larger than the embedded tokenizer's: ids past it decode to
nothing). The encoder presets (``bert-small``, ``cross-encoder-minilm``) are
rerank_models.py's. ``--config-only`` writes config.json and the tokenizer alone, for an engine run
with ``--load-format dummy`` (no 16 GB checkpoint written for the 8B shape).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from octavo_bench.parsers import register_subcommand, standalone_parser
from octavo_bench.rerank_models import ENCODER_PRESETS, build_encoder

SMOL_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}
MOE_SHAPE = {**SMOL_SHAPE, "num_hidden_layers": 16, "tie_word_embeddings": False}
LLAMA_1B_SHAPE = {  # Llama-3.2-1B's decoder (for the GPU benchmark: 1.1B parameters)
    **SMOL_SHAPE,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
LLAMA_8B_SHAPE = {  # Llama-3.1-8B's (8.0B parameters, untied 128256-token vocabulary)
    **LLAMA_1B_SHAPE,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "head_dim": 128,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
QWEN3_06B_SHAPE = {  # Qwen3-0.6B's (q/k RMSNorm from the qwen3 architecture; tied)
    **SMOL_SHAPE,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
# The 2025 layouts at the MoE presets' scale (hidden 576, 16 layers: a run takes minutes on
# 2 CPU cores). Kept as the real models have them: every per-head dimension, so the KV cache
# and state bytes per layer, the layer pattern, the routing and the shared experts.
# Scaled: hidden 2048 -> 576, so the head counts / 4 (the KV heads of Qwen3-Next kept);
# layers 27 / 48 -> 16; routed experts 64 / 512 -> 32, each sized so that a token's active
# experts (shared included) do about the dense preset's MLP work (1,536 wide).
DEEPSEEK_V2_LITE_SHAPE = {  # MLA (no q LoRA) + DeepSeekMoE; the 1st layer dense
    **MOE_SHAPE,
    "num_attention_heads": 4,  # 16 in V2-Lite
    "num_key_value_heads": 4,
    "head_dim": 64,  # transformers' rope tables are qk_rope_head_dim wide
    "kv_lora_rank": 512,  # a 576-value latent per token and layer, as in V2-Lite
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "first_k_dense_replace": 1,
    "n_routed_experts": 32,  # 64 in V2-Lite
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "moe_intermediate_size": 192,  # (6 + 2) x 192 = 1,536 (1,408 in V2-Lite)
    "topk_method": "greedy",  # group routing off, as in V2-Lite
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "max_position_embeddings": 163840,
    "rope_parameters": {  # V2-Lite's YaRN (its softmax scale carries the mscale)
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
}
QWEN3_NEXT_SHAPE = {  # 3 gated DeltaNet : 1 gated attention; MoE + a gated shared expert
    **MOE_SHAPE,
    "num_attention_heads": 4,  # 16 in Qwen3-Next-80B-A3B
    "num_key_value_heads": 2,  # kept: 2,048 B of bf16 KV per token and attention layer
    "head_dim": 256,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
    "linear_num_key_heads": 4,  # 16 in Qwen3-Next
    "linear_num_value_heads": 8,  # 32 in Qwen3-Next
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "num_experts": 32,  # 512 in Qwen3-Next
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 144,  # 10 x 144 + 144 = 1,584 (512 in Qwen3-Next)
    "shared_expert_intermediate_size": 144,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
}
PRESETS: dict[str, tuple[str, dict]] = {  # name -> (transformers model_type, config)
    "llama": ("llama", SMOL_SHAPE),
    "llama-1b": ("llama", LLAMA_1B_SHAPE),
    "llama-8b": ("llama", LLAMA_8B_SHAPE),
    "qwen3-0.6b": ("qwen3", QWEN3_06B_SHAPE),
    "qwen3": ("qwen3", SMOL_SHAPE),
    "qwen3-moe": (
        "qwen3_moe",
        {**MOE_SHAPE, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 384},
    ),
    "mixtral": (
        "mixtral",
        {**MOE_SHAPE, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 768},
    ),
    "deepseek-v2-lite": ("deepseek_v2", DEEPSEEK_V2_LITE_SHAPE),
    "qwen3-next": ("qwen3_next", QWEN3_NEXT_SHAPE),
}


def build_random_model(preset: str, target: Path, config_only: bool = False) -> Path:
    """``target`` with a random ``preset`` checkpoint (kept if it already holds one); with
    ``config_only`` its config.json and tokenizer alone (for ``--load-format dummy``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from octavo.model_executor.embedded import embedded_model_folder
    from octavo.model_executor.model_folders import load_tokenizer

    if (target / "config.json").is_file():
        return target
    model_type, shape = PRESETS[preset]
    tokenizer = load_tokenizer(embedded_model_folder())
    tokens = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = AutoConfig.for_model(model_type, **{"vocab_size": len(tokenizer), **tokens, **shape})
    if config_only:  # the class a checkpoint's save would name (what the engine reads)
        config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
        config.save_pretrained(target)
        tokenizer.save_pretrained(target)
        return target
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "preset",
        choices=sorted(PRESETS) + sorted(ENCODER_PRESETS),
        help="architecture and shape (bert-small, cross-encoder-minilm: BERT encoders for "
        "the embeddings and rerank benchmarks)",
    )
    parser.add_argument("output", type=Path, help="folder to write the checkpoint into")
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="write config.json and the tokenizer only, no weights (for --load-format dummy)",
    )


def run(args: argparse.Namespace) -> int:
    if args.preset in ENCODER_PRESETS:
        print(build_encoder(args.preset, args.output))
        return 0
    print(build_random_model(args.preset, args.output, args.config_only))
    return 0


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "random-model",
        "write a random-weight checkpoint of an architecture (for the other benchmarks)",
        __doc__,
        "",
        add_arguments,
        run,
    )


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("random-model", __doc__, "", add_arguments)
