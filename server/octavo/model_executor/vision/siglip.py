"""The SigLIP vision tower (Gemma 3's image encoder), as transformers' ``SiglipVisionModel``
runs it without its pooling head (``vision_use_head``: Gemma 3 reads the patches).

Patches are embedded by a strided convolution (with a bias; no class token) and take one
learned position embedding each; the encoder layers are CLIP's (the same pre-norm layer:
LayerNorm → bidirectional attention → residual, LayerNorm → MLP → residual), followed by
``post_layernorm``. Module names are the checkpoint's (under ``vision_model.``).
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.vision.clip import CLIPEncoder


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        patch = config.patch_size
        self.num_patches = (config.image_size // patch) ** 2
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=patch, stride=patch
        )
        self.position_embedding = nn.Embedding(self.num_patches, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[images, channels, H, W]`` → ``[images, patches, hidden]``."""
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        if patches.shape[1] != self.num_patches:
            raise ValueError(
                f"an image of {tuple(pixel_values.shape[-2:])} pixels gives {patches.shape[1]} "
                f"patches; the vision tower takes {self.num_patches}"
            )
        return patches + self.position_embedding.weight


class SiglipVisionTransformer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = CLIPEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``last_hidden_state``: ``[images, patches, hidden]``."""
        hidden = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            hidden = layer(hidden)
        return self.post_layernorm(hidden)
