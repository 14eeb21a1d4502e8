"""The MoE router: which ``top_k`` experts each token goes to, and with what weight.

The router's linear is replicated on every rank, in the model's dtype (as transformers
keeps it). Two kinds, each computed exactly as transformers does:

- ``"softmax"`` (Qwen-MoE, Mixtral): softmax over all experts in float32, top-k of the
  probabilities, renormalised to sum to 1 when ``renormalize`` (Mixtral always;
  Qwen3-MoE per ``norm_topk_prob``). Mixtral keeps the weights in float32; Qwen casts
  them to the model's dtype (``weights_in_model_dtype``).
- ``"softmax_after_topk"`` (gpt-oss): top-k of the logits (router bias included), then a
  softmax over the k selected, in the logits' dtype.
- ``"sigmoid"`` (DeepSeek-V3): sigmoid scores in float32, renormalised (``norm_topk_prob``)
  with transformers' ``+ 1e-20``.

A ``Selection`` adds DeepSeek's options to ``"softmax"`` and ``"sigmoid"``: group-limited
top-k, the ``e_score_correction_bias`` (``group_limited.py``), ``routed_scaling_factor``
and float32 logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model_executor.layers.moe.group_limited import (
    PLAIN_SELECTION,
    Selection,
    select_experts,
)

ROUTER_KINDS = ("softmax", "softmax_after_topk", "sigmoid")


class TopKRouter(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        *,
        kind: str,
        renormalize: bool,
        bias: bool = False,
        weights_in_model_dtype: bool = False,
        selection: Selection = PLAIN_SELECTION,
    ) -> None:
        super().__init__()
        if kind not in ROUTER_KINDS:
            raise ValueError(f"unknown router {kind!r}; supported: {', '.join(ROUTER_KINDS)}")
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and num_experts {num_experts}")
        self.kind, self.top_k, self.renormalize = kind, top_k, renormalize
        self.weights_in_model_dtype = weights_in_model_dtype
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_experts), requires_grad=False) if bias else None
        self.selection = selection
        self.e_score_correction_bias = None
        if selection.correction_bias:
            self.e_score_correction_bias = nn.Parameter(
                torch.empty(num_experts), requires_grad=False
            )

    def _apply(self, fn, recurse: bool = True):
        """With ``float32_logits`` the router stays float32 whatever the model's dtype, as
        transformers keeps DeepSeek's ``gate.weight`` / ``e_score_correction_bias``."""
        super()._apply(fn, recurse)
        if self.selection.float32_logits:
            for parameter in (self.weight, self.e_score_correction_bias):
                if parameter is not None and parameter.is_floating_point():
                    parameter.data = parameter.data.float()
        return self

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden [T, H]`` → ``(weights [T, k], expert ids [T, k])``."""
        if self.kind == "sigmoid" or self.selection != PLAIN_SELECTION:
            return self._selected(hidden)
        logits = F.linear(hidden, self.weight, self.bias)
        if self.kind == "softmax_after_topk":
            values, ids = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(values, dim=-1, dtype=values.dtype), ids
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        values, ids = torch.topk(probabilities, self.top_k, dim=-1)
        if self.renormalize:
            values = values / values.sum(dim=-1, keepdim=True)
        if self.weights_in_model_dtype:
            values = values.to(logits.dtype)
        return values, ids

    def _selected(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek's routing (``Selection``): weights in float32, as transformers keeps them."""
        if self.selection.float32_logits:
            logits = F.linear(hidden.float(), self.weight.float())
        else:
            logits = F.linear(hidden, self.weight, self.bias).float()
        if self.kind == "sigmoid":
            scores = logits.sigmoid()
        else:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        bias = self.e_score_correction_bias
        values, ids = select_experts(scores, self.top_k, self.selection, bias)
        if self.renormalize:
            epsilon = 1e-20 if self.kind == "sigmoid" else 0.0
            values = values / (values.sum(dim=-1, keepdim=True) + epsilon)
        return values * self.selection.scaling_factor, ids
