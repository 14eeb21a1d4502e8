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

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model_executor.rotary import apply_rotary
from octavo.model_executor.vision.activations import activation

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [tokens, head_dim]: rotary patch positions


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
    def __init__(self, config, bias: bool = True, fused_qkv: bool = False) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        if fused_qkv:  # one [3 * hidden, hidden] projection, q then k then v (Qwen2.5-VL)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        else:
            self.q_proj = nn.Linear(hidden, hidden, bias=bias)
            self.k_proj = nn.Linear(hidden, hidden, bias=bias)
            self.v_proj = nn.Linear(hidden, hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        """``attention_mask``: bool, True where a patch may be attended (broadcast to
        ``[images, heads, tokens, tokens]``); None: every patch sees every patch.
        ``rope``: rotates queries and keys by each patch's position (Pixtral)."""
        images, tokens, width = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(images, tokens, self.num_heads, -1).transpose(1, 2)

        q, k, v = (heads(x) for x in self.project(hidden))
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.out_proj(attended.transpose(1, 2).reshape(images, tokens, width))

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if hasattr(self, "qkv"):
            return self.qkv(hidden).chunk(3, dim=-1)
        return self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)


class CLIPMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.act = activation(config.hidden_act)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(hidden)))


class GatedVisionMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``, without biases (Pixtral's feed-forward) or with
    (Qwen2.5-VL's)."""

    def __init__(self, config, bias: bool = False) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.act = activation(config.hidden_act)
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(hidden)) * self.up_proj(hidden))


@dataclass(frozen=True)
class LayerOptions:
    """Where a tower's encoder layer differs from CLIP's: its norm (made from the hidden
    size; None: LayerNorm with the config's ``layer_norm_eps``), its feed-forward block
    (made from the config), whether its attention projections have biases and whether
    Q, K and V are one ``qkv`` projection."""

    norm: Callable[[int], nn.Module] | None = None
    mlp: Callable[[object], nn.Module] = CLIPMLP
    bias: bool = True
    fused_qkv: bool = False


CLIP_LAYER = LayerOptions()


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config, options: LayerOptions = CLIP_LAYER) -> None:
        super().__init__()
        norm = options.norm or functools.partial(nn.LayerNorm, eps=config.layer_norm_eps)
        self.layer_norm1 = norm(config.hidden_size)
        self.self_attn = CLIPAttention(config, options.bias, options.fused_qkv)
        self.layer_norm2 = norm(config.hidden_size)
        self.mlp = options.mlp(config)

    def forward(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.layer_norm1(hidden), attention_mask, rope)
        return hidden + self.mlp(self.layer_norm2(hidden))


class CLIPEncoder(nn.Module):
    def __init__(self, config, num_layers: int, options: LayerOptions = CLIP_LAYER) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config, options) for _ in range(num_layers))


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
