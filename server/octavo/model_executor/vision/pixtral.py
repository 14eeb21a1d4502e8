"""The Pixtral vision tower (Mistral 3's and Pixtral-12B's image encoder) as transformers'
``PixtralVisionModel`` runs it.

Each image keeps its own size: a bias-free strided convolution makes one patch per
``patch_size`` square (no class token, no learned positions), ``ln_pre`` (RMSNorm) norms
them, and 2-D rotary embeddings carry each patch's row and column into attention: the
head's rotary frequencies alternate between the row (even ones) and the column (odd ones).
The encoder layers are CLIP's pre-norm layers with RMSNorm, bias-free attention
projections and a SiLU-gated feed-forward. Patches attend within their own image only:
the tower runs a batch of images of one size, each image a row of the batch.

Module names are the checkpoint's except inside a layer, where CLIP's names stand for
Pixtral's (``PIXTRAL_LAYER_NAMES``: the model file renames checkpoint tensors).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.model_executor.rotary import inverse_frequencies
from octavo.model_executor.vision.clip import (
    CLIPEncoder,
    GatedVisionMLP,
    LayerOptions,
    Rope,
)

PIXTRAL_NORM_EPS = 1e-5  # transformers' Pixtral hard-codes it (not in the config)
DEFAULT_ROPE_THETA = 10000.0
# A Pixtral layer's checkpoint module names -> the CLIP layer's names we build.
PIXTRAL_LAYER_NAMES = {
    ".attention_norm.": ".layer_norm1.",
    ".attention.o_proj.": ".self_attn.out_proj.",
    ".attention.": ".self_attn.",
    ".ffn_norm.": ".layer_norm2.",
    ".feed_forward.": ".mlp.",
}


def rope_theta_of(config) -> float:
    """The tower's rotary base (transformers 5's ``rope_parameters``, else ``rope_theta``)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", DEFAULT_ROPE_THETA)))


class PatchRotary:
    """cos/sin ``[rows * cols, head_dim]`` for a grid of patches, row-major (computed per
    call in float32 on the CPU: the model may be built on the meta device)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim = head_dim
        self.rope = {"rope_type": "default", "rope_theta": theta}

    def __call__(self, rows: int, cols: int, like: torch.Tensor) -> Rope:
        with torch.device("cpu"):
            inv_freq = inverse_frequencies(self.head_dim, self.rope)
            row_ids = torch.arange(rows).repeat_interleave(cols).float()
            col_ids = torch.arange(cols).repeat(rows).float()
        row_angles = torch.outer(row_ids, inv_freq[0::2])  # even frequencies: the row
        col_angles = torch.outer(col_ids, inv_freq[1::2])  # odd ones: the column
        half = torch.cat([row_angles, col_angles], dim=-1)
        angles = torch.cat([half, half], dim=-1)
        return (
            angles.cos().to(like.device, like.dtype),
            angles.sin().to(like.device, like.dtype),
        )


class PixtralVisionTower(nn.Module):
    """``patch_conv``, ``ln_pre`` and the first ``num_layers`` layers of ``transformer``."""

    def __init__(self, config, num_layers: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.patch_size = config.patch_size
        self.patch_conv = nn.Conv2d(
            config.num_channels, hidden, config.patch_size, config.patch_size, bias=False
        )
        norm = functools.partial(nn.RMSNorm, eps=PIXTRAL_NORM_EPS)
        self.ln_pre = norm(hidden)
        options = LayerOptions(norm=norm, mlp=GatedVisionMLP, bias=False)
        self.transformer = CLIPEncoder(config, num_layers, options)
        self.rotary = PatchRotary(hidden // config.num_attention_heads, rope_theta_of(config))

    def grid(self, pixel_values: torch.Tensor) -> tuple[int, int]:
        """The patch grid (rows, columns) of images ``[images, channels, H, W]``."""
        height, width = pixel_values.shape[-2:]
        return height // self.patch_size, width // self.patch_size

    def hidden_states(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """For ``[images, channels, H, W]`` of one size, transformers' ``hidden_states``:
        ``[images, patches, hidden]`` (row-major) after ``ln_pre``, then after each built
        layer."""
        patches = self.patch_conv(pixel_values.to(self.patch_conv.weight.dtype))
        hidden = self.ln_pre(patches.flatten(2).transpose(1, 2))
        rope = self.rotary(*patches.shape[-2:], hidden)
        states = [hidden]
        for layer in self.transformer.layers:
            hidden = layer(hidden, rope=rope)
            states.append(hidden)
        return states


def pixtral_checkpoint_name(name: str) -> str:
    """A tower tensor's name (after the model's prefix) with CLIP's in-layer names."""
    for pixtral, clip in PIXTRAL_LAYER_NAMES.items():
        if pixtral in name:
            return name.replace(pixtral, clip, 1)
    return name
