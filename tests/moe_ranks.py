"""One rank of a two-process ``FusedMoE`` run over gloo (spawned by ``test_moe_layer.py``):
builds gpt-oss's MoE under its real tensor-parallel group, loads its part of the given
checkpoint, and reports its all-reduced output with tensor and with expert parallelism."""

from __future__ import annotations

import torch
import torch.distributed as dist

from expert_names import GPT_OSS
from octavo.distributed import parallel_state
from octavo.distributed.parallel_state import TensorParallelGroup
from octavo.model_executor.layers.activation import ClampedSwigluAndMul
from octavo.model_executor.layers.moe import FusedMoE


def gpt_oss_moe(sizes: tuple[int, int, int, int], checkpoint: dict, expert_parallel: bool):
    experts, top_k, hidden, inter = sizes
    moe = FusedMoE(
        experts,
        top_k,
        hidden,
        inter,
        names=GPT_OSS,
        router="softmax_after_topk",
        renormalize=False,
        activation=ClampedSwigluAndMul(),
        bias=True,
        router_bias=True,
        enable_expert_parallel=expert_parallel,
    )
    for name, tensor in checkpoint.items():
        moe.load_checkpoint_tensor(name, tensor)
    return moe


def rank_main(rank: int, world: int, port: int, sizes, checkpoint, hidden, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    parallel_state.set_tensor_parallel_group(TensorParallelGroup(rank, world))
    outputs = {}
    with torch.no_grad():
        for expert_parallel in (False, True):
            outputs[expert_parallel] = gpt_oss_moe(sizes, checkpoint, expert_parallel)(hidden)
    # as numpy arrays: pickled by value (a tensor travels as a shared-memory handle whose
    # file this process's exit can remove before the parent opens it)
    results.put((rank, {key: value.numpy() for key, value in outputs.items()}))
    dist.destroy_process_group()
