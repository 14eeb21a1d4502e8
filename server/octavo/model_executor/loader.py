"""Loading a model's weights onto a device (where its files are: ``model_folders.py``)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from octavo.model_executor.dummy_weights import fill_dummy_weights
from octavo.model_executor.footprint import weight_bytes as weight_bytes  # its old home
from octavo.model_executor.footprint import weight_footprint
from octavo.model_executor.layers.linear import LinearBase
from octavo.model_executor.layers.moe.fused_moe import FusedMoE
from octavo.model_executor.layers.vocab import QuantizedVocabEmbedding
from octavo.model_executor.load_formats import check_load_format
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.models.causal_lm import CausalLM
from octavo.model_executor.models.registry import model_class
from octavo.model_executor.quantized_checkpoint import checkpoint_tensors
from octavo.model_executor.weights import load_weights

logger = logging.getLogger(__name__)


def load_model(
    folder: Path,
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    load_format: str = "auto",
) -> CausalLM:
    """The model of ``folder`` on ``device``: the checkpoint's weights, or with
    ``load_format="dummy"`` random ones (no weight file read; ``dummy_weights``)."""
    check_load_format(load_format, quantization)
    with torch.device("meta"):
        skeleton = model_class(config.architecture)(config, quantization)
    model = skeleton.to_empty(device=device).to(dtype)
    model.set_rotary(max_positions, dtype, device)
    model.tie_lm_head()  # to_empty gave the embedding and the LM head each their own storage
    with torch.no_grad():
        if load_format == "dummy":
            fill_dummy_weights(model)
        else:
            load_weights(model, folder, checkpoint_tensors(folder, config, quantization))
            # beside the checkpoint: Dense modules, a reranker's head from LM-head rows
            model.load_derived_weights(folder)
    for module in list(model.modules()):  # (a method may replace a module's children)
        if isinstance(module, LinearBase | QuantizedVocabEmbedding | FusedMoE):
            module.process_weights_after_loading()  # e.g. prepack bf16 weights for oneDNN
    footprint = weight_footprint(model)
    logger.info(
        "loaded %s (%s) as %s on %s%s: weights %.1f MiB incl. %.1f MiB of prepacked copies "
        "(a tied LM head's; %.1f MiB prepacked in all)",
        folder.name,
        config.architecture,
        dtype,
        device,
        f", {quantization} linears" if quantization else "",
        footprint.total / 2**20,
        footprint.copies / 2**20,
        footprint.prepacked / 2**20,
    )
    return model.eval()
