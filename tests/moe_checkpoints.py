"""Filling a ``FusedMoE`` from a checkpoint's tensors, for the MoE layer tests."""

from __future__ import annotations


def load_whole_checkpoint(moe, checkpoint: dict) -> None:
    """Hands every tensor to ``moe`` and checks that they filled every slot it expects."""
    loaded: set[str] = set()
    for name, tensor in checkpoint.items():
        loaded.update(moe.load_checkpoint_tensor(name, tensor))
    assert loaded == moe.expected_keys()
