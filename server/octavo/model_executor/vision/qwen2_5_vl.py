"""The Qwen2.5-VL vision transformer as transformers' ``Qwen2_5_VisionTransformerPretrainedModel``
runs it.

The processor flattens each image into patches of ``temporal_patch_size x patch_size x
patch_size`` pixels (an image is two equal frames), ordered merge unit by merge unit; a
bias-free 3-D convolution embeds each patch. 2-D rotary embeddings carry a patch's row and
column (the first half of each head's frequencies from the row, the second from the
column). The layers are CLIP's pre-norm layers with RMSNorm, a fused biased ``qkv``
projection and a biased SiLU-gated feed-forward; most attend within windows
(``qwen_windows.py``), the ``fullatt_block_indexes`` ones within each image. The patch
merger norms each patch, concatenates a merge unit's ``merge x merge`` patches and
projects them through ``Linear -> GELU -> Linear`` to the language model's width: one
feature per merge unit, in the processor's order (one ``<|image_pad|>`` each).

Module names are the checkpoint's except inside a block, where CLIP's names stand for
Qwen's (``QWEN_BLOCK_NAMES``: the model file renames checkpoint tensors).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
from torch import nn

from octavo.model_executor.vision.clip import CLIPEncoderLayer, GatedVisionMLP, LayerOptions
from octavo.model_executor.vision.qwen_windows import (
    patch_coordinates,
    run_in_segments,
    window_plan,
)

NORM_EPS = 1e-6  # transformers hard-codes it (not in the config)
# A block's checkpoint module names -> the CLIP layer's names we build.
QWEN_BLOCK_NAMES = {
    ".norm1.": ".layer_norm1.",
    ".norm2.": ".layer_norm2.",
    ".attn.proj.": ".self_attn.out_proj.",
    ".attn.": ".self_attn.",
}


class PatchEmbed(nn.Module):
    """A 3-D convolution over one patch (bias-free in Qwen2.5-VL, biased in Qwen3-VL)."""

    def __init__(self, config, bias: bool = False) -> None:
        super().__init__()
        self.patch_shape = (
            config.in_channels,
            config.temporal_patch_size,
            config.patch_size,
            config.patch_size,
        )
        self.hidden = config.hidden_size
        kernel = self.patch_shape[1:]
        self.proj = nn.Conv3d(config.in_channels, self.hidden, kernel, kernel, bias=bias)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[patches, C * T * P * P]`` -> ``[patches, hidden]``."""
        patches = pixel_values.view(-1, *self.patch_shape).to(self.proj.weight.dtype)
        return self.proj(patches).view(-1, self.hidden)


class PatchMerger(nn.Module):
    def __init__(self, width: int, out_width: int, merge: int) -> None:
        super().__init__()
        self.unit_width = width * merge * merge
        self.ln_q = nn.RMSNorm(width, eps=NORM_EPS)
        self.mlp = nn.Sequential(
            nn.Linear(self.unit_width, self.unit_width),
            nn.GELU(),
            nn.Linear(self.unit_width, out_width),
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(hidden).view(-1, self.unit_width))


class PatchRotary:
    """float32 cos/sin ``[patches, head_dim]`` from each patch's (row, column)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        spatial = head_dim // 2
        # (built on the host: the model itself is built on the meta device)
        exponents = torch.arange(0, spatial, 2, dtype=torch.float, device="cpu") / spatial
        self.inv_freq = 1.0 / (theta**exponents)

    def __call__(self, coordinates: torch.Tensor, device: torch.device) -> tuple:
        angles = (coordinates[..., None].float() * self.inv_freq).flatten(1)  # rows, then cols
        angles = torch.cat([angles, angles], dim=-1).to(device)
        return angles.cos(), angles.sin()


def layer_config(config) -> SimpleNamespace:
    """The tower's config in the names CLIP's layers read."""
    return SimpleNamespace(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_heads,
        hidden_act=config.hidden_act,
        layer_norm_eps=NORM_EPS,
    )


QWEN_LAYER = LayerOptions(
    norm=functools.partial(nn.RMSNorm, eps=NORM_EPS),
    mlp=functools.partial(GatedVisionMLP, bias=True),
    fused_qkv=True,
)


class Qwen2_5_VisionTower(nn.Module):
    """``patch_embed``, ``blocks`` and ``merger``: pixels to language-model features."""

    def __init__(self, config) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        self.window = config.window_size // self.merge // config.patch_size
        self.full_attention = set(config.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(config)
        shape = layer_config(config)
        self.blocks = nn.ModuleList(
            CLIPEncoderLayer(shape, QWEN_LAYER) for _ in range(config.depth)
        )
        self.merger = PatchMerger(config.hidden_size, config.out_hidden_size, self.merge)
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.rotary = PatchRotary(config.hidden_size // config.num_heads, float(theta))

    def forward(
        self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """All images' patches (concatenated) -> ``[merge units, out_hidden]``, in order."""
        plan = window_plan(grids, self.merge, self.window)
        order = plan.order.to(pixel_values.device)
        hidden = self.by_window(self.patch_embed(pixel_values), order)
        cos, sin = self.rotary(patch_coordinates(grids, self.merge), hidden.device)
        cos, sin = cos.to(hidden.dtype), sin.to(hidden.dtype)
        rotation = (self.by_window(cos, order), self.by_window(sin, order))
        for index, block in enumerate(self.blocks):
            full = index in self.full_attention
            lengths = plan.frame_lengths if full else plan.window_lengths
            hidden = run_in_segments(block, hidden, rotation, lengths)
        merged = self.merger(hidden)
        return merged[torch.argsort(order)]

    def by_window(self, rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Per-patch ``rows`` with their merge units in window order."""
        unit = self.merge * self.merge
        return rows.view(-1, unit, rows.shape[-1])[order].reshape(rows.shape)
