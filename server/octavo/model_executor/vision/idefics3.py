"""The Idefics3 / SmolVLM vision tower (SigLIP adapted to tiles of any size), as
transformers' ``Idefics3VisionTransformer`` runs it.

Patches are embedded by a strided convolution (with a bias; no class token). A tile may be
smaller than the tower's ``image_size`` or padded (``patch_mask``: the patches holding
pixels): each patch takes the position embedding of the bucket its fractional row and
column fall in on the tower's ``image_size / patch_size`` grid, padding patches position 0
and no attention from the others. The encoder layers are CLIP's (the same pre-norm
layer), followed by ``post_layernorm``. Module names are the checkpoint's.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.vision.clip import CLIPEncoder


class Idefics3VisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        patch = config.patch_size
        self.per_side = config.image_size // patch
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=patch, stride=patch
        )
        self.position_embedding = nn.Embedding(self.per_side**2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
        """``[tiles, channels, H, W]`` and bool ``[tiles, H/patch, W/patch]`` →
        ``[tiles, patches, hidden]``."""
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        return patches + self.position_embedding(self.position_ids(patch_mask))

    def position_ids(self, patch_mask: torch.Tensor) -> torch.Tensor:
        """Each patch's bucket on the tower's grid from its fractional coordinates in the
        tile's own patches (computed as transformers does, so the buckets are its own)."""
        side = self.per_side
        boundaries = torch.arange(1 / side, 1.0, 1 / side, device=patch_mask.device)
        rows = bucketed(patch_mask[:, :, 0].sum(dim=1), patch_mask.shape[1], boundaries)
        cols = bucketed(patch_mask[:, 0, :].sum(dim=1), patch_mask.shape[2], boundaries)
        ids = (rows[:, :, None] * side + cols[:, None, :]).flatten(1)
        return torch.where(patch_mask.flatten(1), ids, 0)


def bucketed(used: torch.Tensor, length: int, boundaries: torch.Tensor) -> torch.Tensor:
    """``[tiles, length]``: the bucket of ``index / used`` (per tile) for each index."""
    indices = torch.arange(length, device=used.device, dtype=torch.float32)
    fractions = (indices[None, :] * (1.0 / used)[:, None]).clamp(max=1.0 - 1e-6)
    return torch.bucketize(fractions, boundaries, right=True)


def patch_mask_of(pixel_mask: torch.Tensor, patch: int) -> torch.Tensor:
    """bool ``[tiles, H/patch, W/patch]``: the patches with at least one real pixel."""
    grid = pixel_mask.unfold(1, patch, patch).unfold(2, patch, patch)
    return grid.sum(dim=(-1, -2)) > 0


class Idefics3VisionTransformer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.embeddings = Idefics3VisionEmbeddings(config)
        self.encoder = CLIPEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor, pixel_mask: torch.Tensor) -> torch.Tensor:
        """``[tiles, channels, H, W]`` and their real pixels ``[tiles, H, W]`` →
        ``[tiles, patches, hidden]``."""
        patch_mask = patch_mask_of(pixel_mask, self.patch_size)
        hidden = self.embeddings(pixel_values, patch_mask)
        keys = patch_mask.flatten(1)[:, None, None, :]  # padding patches are not attended
        attention_mask = None if bool(keys.all()) else keys
        for layer in self.encoder.layers:
            hidden = layer(hidden, attention_mask)
        return self.post_layernorm(hidden)
