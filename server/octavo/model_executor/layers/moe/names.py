"""How a checkpoint names one MoE block's router and experts (names relative to the block).

Each MoE model class declares its own (``expert_names``); this is the shape of the answer.

Two layouts exist: one tensor per expert and projection (Qwen-MoE, Mixtral: what
``save_pretrained`` writes and what the Hub holds), or every expert stacked in one tensor
per projection (gpt-oss: ``gate_up_proj [E, H, 2I]`` with gate and up interleaved on the
last dimension, ``down_proj [E, I, H]``, optionally as MXFP4 ``_blocks``/``_scales``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertNames:
    router_weight: str
    router_bias: str | None = None
    router_score_bias: str | None = None  # DeepSeek-V3's e_score_correction_bias [E]
    # one tensor per expert: format strings with ``{e}`` for the expert's index
    gate: str | None = None  # [I, H]
    up: str | None = None  # [I, H]
    down: str | None = None  # [H, I]
    # all experts stacked (gpt-oss's layout)
    fused_gate_up: str | None = None  # [E, H, 2I], gate/up interleaved on the last dim
    fused_gate_up_bias: str | None = None  # [E, 2I], interleaved
    fused_down: str | None = None  # [E, I, H]
    fused_down_bias: str | None = None  # [E, H]

    def __post_init__(self) -> None:
        per_expert = (self.gate, self.up, self.down)
        if all(per_expert) == (self.fused_gate_up is not None and self.fused_down is not None):
            raise ValueError("ExpertNames needs either gate/up/down or fused_gate_up/fused_down")

    @property
    def fused(self) -> bool:
        return self.fused_gate_up is not None
