"""Turning a model name into a loaded model and tokenizer on a device."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from octavo.model_executor.embedded import embedded_model_folder
from octavo.model_executor.gguf_folder import gguf_model_folder
from octavo.model_executor.hub import download_snapshot, hub_offline, parse_hub_model
from octavo.model_executor.layers.linear import LinearBase
from octavo.model_executor.layers.vocab import QuantizedVocabEmbedding
from octavo.model_executor.llama import LlamaForCausalLM
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.quantized_checkpoint import checkpoint_tensors
from octavo.model_executor.rotary import RotaryEmbedding
from octavo.model_executor.weights import load_weights

logger = logging.getLogger(__name__)


def resolve_model_folder(model: str | None, revision: str | None = None) -> Path:
    """``None`` means the embedded default; else a hub model or a local Hugging Face folder."""
    if model is None:
        return embedded_model_folder()
    hub = parse_hub_model(model, revision)
    if hub is not None:
        return download_snapshot(hub)
    if revision:
        logger.warning("--revision %s ignored: %s is a local folder", revision, model)
    folder = Path(model.removeprefix("file://")).expanduser()
    if folder.suffix == ".gguf" and folder.is_file():
        return gguf_model_folder(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"model path {str(folder)!r} is not a folder with a config.json")
    return folder


def check_model_early(model: str | None, revision: str | None = None) -> None:
    """Refuse a bad model reference before a server opens its port, without downloading.

    Local folders must exist; hub references must parse, and when offline they must be
    in the local cache. Online downloads are left to the engine load (behind /health 503).
    """
    if model is None:
        return
    hub = parse_hub_model(model, revision)
    if hub is None:
        resolve_model_folder(model, revision)
    elif hub_offline():
        download_snapshot(hub)


def load_model(
    folder: Path,
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
) -> LlamaForCausalLM:
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config, quantization)
    model = skeleton.to_empty(device=device).to(dtype)
    model.rotary = RotaryEmbedding(config.head_dim, max_positions, config.rope, dtype, device)
    model.tie_lm_head()  # to_empty gave the embedding and the LM head each their own storage
    with torch.no_grad():
        load_weights(model, folder, checkpoint_tensors(folder, config, quantization))
    for module in model.modules():
        if isinstance(module, LinearBase | QuantizedVocabEmbedding):
            module.process_weights_after_loading()  # e.g. prepack bf16 weights for oneDNN
    logger.info(
        "loaded %s (%s) as %s on %s%s: weights take %.1f MiB",
        folder.name, config.architecture, dtype, device,
        f", {quantization} linears" if quantization else "", weight_bytes(model) / 2**20,
    )  # fmt: skip
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as stored (quantized or prepacked ones included; a
    tensor shared by two modules counted once)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [getattr(m, "packed_weight", None) for m in model.modules()]
    unique = {_storage_key(t): t.numel() * t.element_size() for t in tensors if t is not None}
    return sum(unique.values())


def _storage_key(tensor: torch.Tensor) -> int:
    """Shared storage is one key; oneDNN-packed (opaque) tensors have no data pointer."""
    return tensor.data_ptr() if tensor.layout == torch.strided else id(tensor)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
