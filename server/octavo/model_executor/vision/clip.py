"""The CLIP vision tower (LLaVA's image encoder) as transformers' ``CLIPVisionModel`` runs it.

Patches are embedded by a strided convolution, a class token leads them, learned position
embeddings are added and ``pre_layrnorm`` applied; each encoder layer is pre-norm
(LayerNorm → bidirectional multi-head attention → residual, LayerNorm → MLP → residual).
``hidden_states(pixels, num_layers)`` returns transformers' ``hidden_states`` tuple up to
the layers a caller reads (LLaVA reads the second to last and never runs the last layer).
Module and parameter names are the checkpoint's, so the loader copies tensors by name.
The tower is small next to the language model: every tensor-parallel rank holds all of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model_executor.vision.activations import activation


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        size, patch = config.image_size, config.patch_size
        self.num_positions = (size // patch) ** 2 + 1
        self.class_embedding = nn.Parameter(torch.empty(config.hidden_size))
        self.patch_embedding = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=patch, stride=patch, bias=False
        )
        self.position_embedding = nn.Embedding(self.num_positions, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[images, channels, H, W]`` → ``[images, 1 + patches, hidden]``."""
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        if patches.shape[1] + 1 != self.num_positions:
            raise ValueError(
                f"an image of {tuple(pixel_values.shape[-2:])} pixels gives {patches.shape[1]} "
                f"patches; the vision tower takes {self.num_positions - 1}"
            )
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class CLIPAttention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        images, tokens, width = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(images, tokens, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(hidden)), heads(self.k_proj(hidden)), heads(self.v_proj(hidden))
        attended = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(attended.transpose(1, 2).reshape(images, tokens, width))


class CLIPMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.act = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(hidden)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.layer_norm1(hidden))
        return hidden + self.mlp(self.layer_norm2(hidden))


class CLIPEncoder(nn.Module):
    def __init__(self, config, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(num_layers))


class CLIPVisionTower(nn.Module):
    """``embeddings``, ``pre_layrnorm`` and the first ``num_layers`` encoder layers (the
    ones a caller reads; the post-layernorm and pooler are not built)."""

    def __init__(self, config, num_layers: int) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = CLIPEncoder(config, num_layers)

    def hidden_states(self, pixel_values: torch.Tensor) -> list[torch.Tensor]:
        """transformers' ``hidden_states``: the embeddings, then each built layer's output."""
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))
        states = [hidden]
        for layer in self.encoder.layers:
            hidden = layer(hidden)
            states.append(hidden)
        return states


def feature_layers(layers: int | list[int], num_hidden_layers: int) -> list[int]:
    """The ``hidden_states`` indices a ``vision_feature_layer`` setting names (negative
    ones count from the end, as Python indexing of transformers' tuple does)."""
    indices = [layers] if isinstance(layers, int) else list(layers)
    count = num_hidden_layers + 1
    return [index % count for index in indices]
