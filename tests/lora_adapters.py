"""LoRA adapters made in the test with peft: random, non-zero A and B, saved in PEFT's
format, and the HF transformers + PEFT reference model for them."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    base_folder: Path,
    folder: Path,
    seed: int,
    rank: int = 8,
    targets: list[str] | None = None,
    alpha: int = 16,
) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets or ALL_MODULES,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:  # B starts at zero in PEFT: make the delta real
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    peft_model.save_pretrained(folder)
    return folder


def hf_with_adapter(base_folder: Path, adapter: Path | None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
    return model if adapter is None else PeftModel.from_pretrained(model, adapter).eval()


def variant(
    source: Path, folder: Path, config=None, tensors=None, raw_config: str | bytes | None = None
) -> Path:
    """A copy of the adapter ``source`` in ``folder``, with ``config`` (a function of the
    config dict, returning what to write) and/or ``tensors`` (a function of the tensor
    dict) applied, or the config replaced by ``raw_config`` text."""
    import json

    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True)
    settings = json.loads((source / "adapter_config.json").read_text())
    text = raw_config if raw_config is not None else json.dumps((config or _same)(settings))
    config_file = folder / "adapter_config.json"
    config_file.write_bytes(text if isinstance(text, bytes) else text.encode())
    weights = load_file(source / "adapter_model.safetensors")
    save_file((tensors or _same)(weights), folder / "adapter_model.safetensors")
    return folder


def _same(value):
    return value


def lora_test_app(folder, config, modules):
    """The served tiny model with LoRA on (two slots, rank up to 8) and ``modules`` at start."""
    from server_harness import build_local_app

    return build_local_app(
        str(folder),
        config,
        dtype="float32",
        max_model_len=128,
        kv_cache_memory=8 << 20,
        max_loras=2,
        max_lora_rank=8,
        lora_modules=modules,
    )
