"""The default token budget of a step, by device and use (the server or the offline ``LLM``).

On a GPU these are vLLM's (``EngineArgs.get_batch_defaults``): a GPU of at least 70 GiB
that is not an A100 (H100, H200, MI300X) takes steps of 16,384 tokens offline and 8,192
served, other GPUs 8,192 and 2,048 (vLLM measured larger steps slowing an A100, its PR
#17885). Larger steps finish a batch's prompts in fewer steps, and each step with a prompt
chunk runs eagerly, its decode rows too (no CUDA graph covers it): an H200 took 74 such
steps of 2,048 tokens for nano-vllm's offline shape (256 prompts of 100-1,024 tokens).

On CPU, measured here: 512 served (a step of 2,048 prompt tokens stalls every stream for
about half a second: TTFT p50 at 20 users 912 -> 440 ms), 2,048 offline, where no stream
waits for a step and bigger steps are a few % more throughput.

``--performance-mode throughput`` (vLLM 0.32's) doubles these budgets and the default
``--max-num-seqs``, where they are not given, as vLLM doubles them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server's API process reads these defaults without torch
    import torch

CPU_SERVED_TOKENS = 512
CPU_OFFLINE_TOKENS = 2048
LARGE_GPU_BYTES = 70 * 2**30
LARGE_GPU_TOKENS = {"served": 8192, "offline": 16384}
GPU_TOKENS = {"served": 2048, "offline": 8192}
DEFAULT_MAX_NUM_SEQS = 256
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")  # vLLM's --performance-mode


def throughput_factor(mode: str) -> int:
    """How much larger the default batch and step are in this performance mode."""
    return 2 if mode == "throughput" else 1


def default_max_num_seqs(mode: str) -> int:
    """``max_num_seqs`` when none is given."""
    return DEFAULT_MAX_NUM_SEQS * throughput_factor(mode)


def is_large_gpu(total_bytes: int, name: str) -> bool:
    """vLLM's larger defaults: 70 GiB or more, and not an A100."""
    return total_bytes >= LARGE_GPU_BYTES and "a100" not in name.lower()


def default_token_budget(device: torch.device, offline: bool, mode: str = "balanced") -> int:
    """``max_num_batched_tokens`` when none is given (the module doc)."""
    return _device_token_budget(device, offline) * throughput_factor(mode)


def _device_token_budget(device: torch.device, offline: bool) -> int:
    use = "offline" if offline else "served"
    if device.type != "cuda":
        return CPU_OFFLINE_TOKENS if offline else CPU_SERVED_TOKENS
    import torch

    properties = torch.cuda.get_device_properties(device)
    large = is_large_gpu(properties.total_memory, properties.name)
    return (LARGE_GPU_TOKENS if large else GPU_TOKENS)[use]
