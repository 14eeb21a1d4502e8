"""The Qwen3-VL vision transformer as transformers' ``Qwen3VLVisionModel`` runs it.

Patches come as in Qwen2.5-VL (merge unit by merge unit, embedded by a 3-D convolution,
here with a bias) and get the same 2-D rotary; learned position embeddings on a square
grid are resampled to each image's patch grid (bilinear, corners aligned) and added.
The layers are CLIP's pre-norm layers (LayerNorm, a fused biased ``qkv``, a GELU-tanh
MLP) attending within each image. The patch merger (LayerNorm per patch, then a merge
unit's patches concatenated through ``Linear -> GELU -> Linear``) makes one feature per
merge unit; DeepStack mergers (LayerNorm over the concatenated unit) make the same from
the ``deepstack_visual_indexes`` layers' outputs, which the decoder adds to its hidden
states at the image's positions after its first layers.

Module names are the checkpoint's except inside a block (``QWEN3_BLOCK_NAMES``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from octavo.model_executor.vision.clip import CLIPEncoderLayer, LayerOptions
from octavo.model_executor.vision.qwen2_5_vl import (
    NORM_EPS,
    QWEN_BLOCK_NAMES,
    PatchEmbed,
    PatchRotary,
    layer_config,
)
from octavo.model_executor.vision.qwen_windows import patch_coordinates, run_in_segments

QWEN3_BLOCK_NAMES = {
    **QWEN_BLOCK_NAMES,
    ".mlp.linear_fc1.": ".mlp.fc1.",
    ".mlp.linear_fc2.": ".mlp.fc2.",
}
QWEN3_LAYER = LayerOptions(norm=functools.partial(nn.LayerNorm, eps=NORM_EPS), fused_qkv=True)


class Qwen3PatchMerger(nn.Module):
    """``norm`` per patch (or, ``after_merge``, over a merge unit's concatenated patches)."""

    def __init__(self, config, after_merge: bool) -> None:
        super().__init__()
        self.unit_width = config.hidden_size * config.spatial_merge_size**2
        self.after_merge = after_merge
        normed = self.unit_width if after_merge else config.hidden_size
        self.norm = nn.LayerNorm(normed, eps=NORM_EPS)
        self.linear_fc1 = nn.Linear(self.unit_width, self.unit_width)
        self.act = nn.GELU()
        self.linear_fc2 = nn.Linear(self.unit_width, config.out_hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.after_merge:
            units = self.norm(hidden.view(-1, self.unit_width))
        else:
            units = self.norm(hidden).view(-1, self.unit_width)
        return self.linear_fc2(self.act(self.linear_fc1(units)))


def bilinear_taps(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple:
    """Corner-aligned bilinear resampling of ``side`` learned rows to ``size`` positions:
    the two source rows of each position in ``index`` and their weights."""
    source = index.float() * (side - 1) / torch.clamp(size - 1, min=1)
    floor = torch.floor(source)
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (source[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


class Qwen3_VisionTower(nn.Module):
    """``patch_embed``, ``pos_embed``, ``blocks``, ``merger`` and ``deepstack_merger_list``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        self.patch_embed = PatchEmbed(config, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.side = int(config.num_position_embeddings**0.5)
        shape = layer_config(config)
        self.blocks = nn.ModuleList(
            CLIPEncoderLayer(shape, QWEN3_LAYER) for _ in range(config.depth)
        )
        self.merger = Qwen3PatchMerger(config, after_merge=False)
        self.deepstack_layers = list(config.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            Qwen3PatchMerger(config, after_merge=True) for _ in self.deepstack_layers
        )
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.rotary = PatchRotary(config.hidden_size // config.num_heads, float(theta))

    def forward(
        self, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """All images' patches -> ``[merge units, out_hidden * (1 + deepstack levels)]``:
        each unit's feature, then its DeepStack features, side by side."""
        coordinates = patch_coordinates(grids, self.merge)
        hidden = self.patch_embed(pixel_values)
        hidden = hidden + self.positions(coordinates, grids).to(hidden.dtype)
        rotation = tuple(t.to(hidden.dtype) for t in self.rotary(coordinates, hidden.device))
        frames = [h * w for t, h, w in grids for _ in range(t)]
        levels = []
        for index, block in enumerate(self.blocks):
            hidden = run_in_segments(block, hidden, rotation, frames)
            if index in self.deepstack_layers:
                merger = self.deepstack_merger_list[self.deepstack_layers.index(index)]
                levels.append(merger(hidden))
        return torch.cat([self.merger(hidden), *levels], dim=-1)

    def positions(
        self, coordinates: torch.Tensor, grids: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """Each patch's learned position embedding, resampled to its image's grid."""
        sizes = torch.cat([torch.tensor([[h, w]]).expand(t * h * w, 2) for t, h, w in grids])
        row_taps, row_weights = bilinear_taps(coordinates[:, 0], sizes[:, 0], self.side)
        col_taps, col_weights = bilinear_taps(coordinates[:, 1], sizes[:, 1], self.side)
        taps = (row_taps[:, :, None] * self.side + col_taps[:, None, :]).flatten(1)
        weights = (row_weights[:, :, None] * col_weights[:, None, :]).flatten(1)
        device = self.pos_embed.weight.device
        table = self.pos_embed(taps.to(device))
        return (table * weights.to(device)[:, :, None]).sum(1)  # float32 weights, as HF
