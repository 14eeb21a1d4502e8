"""The GPU rotary kernel equals the torch path on the views the attention layers rotate: the
joint query+key heads inside the fused QKV rows, and a head's leading dims (partial rotary).
Without a GPU it runs under ``TRITON_INTERPRET=1`` (conftest sets it) on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from octavo.model_executor.rotary import RotaryEmbedding, apply_rotary
from octavo.model_executor.triton_rotary import rotary_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def fused_qkv(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=DEVICE)


def torch_rotated(x: torch.Tensor, table: RotaryEmbedding, positions: torch.Tensor):
    cos, sin = table.tables(positions)
    return apply_rotary(x, cos, sin)


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_the_joint_query_key_view_rotates_as_the_torch_path(partial):
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    table = RotaryEmbedding(HEAD_DIM, 64, rope, torch.float32, DEVICE)
    qkv = fused_qkv(5)
    positions = torch.tensor([0, 3, 17, 63, 9], device=DEVICE)
    joint = qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].view(5, HEADS + KV_HEADS, HEAD_DIM)
    view = joint[..., : table.rotary_dim]
    expected = torch_rotated(view, table, positions)
    not_rotated, values = (
        joint[..., table.rotary_dim :].clone(),
        qkv[:, joint.numel() // 5 :].clone(),
    )
    rotary_triton(positions, view, table.cos, table.sin)
    assert torch.allclose(view, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(joint[..., table.rotary_dim :], not_rotated)  # partial: the rest stays
    assert torch.equal(qkv[:, joint.numel() // 5 :], values)  # the value heads stay


def test_bad_shapes_are_refused_and_no_tokens_is_a_no_op():
    table = RotaryEmbedding(
        HEAD_DIM, 8, {"rope_type": "default", "rope_theta": 1e4}, torch.float32, DEVICE
    )
    empty = torch.empty(0, 2, HEAD_DIM, device=DEVICE)
    rotary_triton(torch.empty(0, dtype=torch.long, device=DEVICE), empty, table.cos, table.sin)
    two, three = (torch.zeros(n, dtype=torch.long, device=DEVICE) for n in (2, 3))
    for positions, shape, refusal in [
        (three, (2, 2, 16), "positions"),
        (two, (2, 2, 8), "do not fit"),
        (two, (2, 16), "even rotary_dim"),
    ]:
        with pytest.raises(ValueError, match=refusal):
            rotary_triton(positions, torch.randn(shape, device=DEVICE), table.cos, table.sin)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")
def test_a_step_takes_the_kernel_on_gpu_in_bfloat16():
    table = RotaryEmbedding(
        128,
        4096,
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        torch.bfloat16,
        "cuda",
    )
    positions = torch.randint(0, 4096, (9,), device="cuda")
    qk = torch.randn(9, 40, 128, device="cuda", dtype=torch.bfloat16)
    expected = torch_rotated(qk.float(), table, positions).float()
    step = table.for_step(positions)
    assert step.rows is None  # the kernel's path
    step.apply_(qk)
    assert torch.allclose(qk.float(), expected, rtol=2e-2, atol=2e-2)
