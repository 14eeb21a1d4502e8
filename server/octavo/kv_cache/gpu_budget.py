"""How many bytes a GPU worker gives its KV cache.

Two ways, as in vLLM: ``--kv-cache-memory`` names the bytes (refused when they do not fit
next to the weights and one step's activations), or ``--gpu-memory-utilization`` is this
instance's share of the device: the KV cache gets what the weights and the activations
leave of it (other processes' memory is theirs, not subtracted; a KV cache larger than
what is free is refused). The activations are measured on a GPU
(``worker/memory_profile``: one dummy forward of the largest step, plus the sampler's
working copies); the estimate here from the largest step's shapes (its tokens, the logits
rows that reach the LM head and the rows the sampler works on, ``StepRows``) remains for
pipeline stages, which cannot run a step alone. The arithmetic is plain numbers
(``GpuMemory``), so it is tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.kv_cache.cache_tensors import ModelShape

# Bytes per vocabulary entry of a logits row besides the LM head's own output: its fp32
# copy and a log-softmax (logprobs, prompt logprobs).
LOGIT_COPY_BYTES = 8
# ... and of a sampled row: the sampler's fp32 working copies (masked or penalised logits,
# probabilities, the random draw's noise, a filter's copy).
SAMPLER_BYTES_PER_LOGIT = 16


@dataclass(frozen=True)
class StepRows:
    """The most rows one step's tensors can have."""

    tokens: int  # tokens of the forward pass (the token budget)
    logits: int  # hidden rows that reach the LM head
    sampled: int  # logits rows the sampler and the speculative verifier work on


def step_rows(
    max_num_batched_tokens: int,
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    scored_rows: int | None = None,
) -> StepRows:
    """The row bound of one step, as the scheduler and the runner make steps.

    Every logits row is one token of the step (``step_inputs.lay_out``), so the token
    budget bounds them: a sampling sequence's last token, each of a speculating sequence's
    ``k + 1`` verified tokens (at most ``max_num_seqs`` sequences), or a prompt token scored
    for ``prompt_logprobs`` (``ModelRunner._prompt_scoring``; the scheduler scores at most
    ``scored_rows`` a step, ``None``: only the token budget bounds them). The sampler
    expands a row to each of its ``n`` forks, which are running sequences: at most
    ``max_num_seqs`` plain rows, or ``k + 1`` rows for each speculating one (and never more
    than the step's tokens plus its forks).
    """
    per_sequence = 1 + num_speculative_tokens
    scored = max_num_batched_tokens if scored_rows is None else scored_rows
    logits = min(max_num_batched_tokens, max_num_seqs * per_sequence + scored)
    sampled = min(max_num_seqs * per_sequence, max_num_seqs + max_num_batched_tokens)
    return StepRows(max_num_batched_tokens, logits, sampled)


def activation_bytes(config: ModelShape, rows: StepRows, dtype: torch.dtype) -> int:
    """Bytes one step's activations may take at their peak.

    Per token: a few hidden-sized tensors, the fused QKV and two intermediate-sized ones
    (model dtype). Per logits row: the LM head's output (model dtype), its fp32 copy and
    a log-softmax. Per sampled row: the sampler's fp32 working copies.
    """
    element = torch.empty((), dtype=dtype).element_size()
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = (6 * config.hidden_size + 3 * config.intermediate_size + qkv) * element
    logits = rows.logits * config.vocab_size * (element + LOGIT_COPY_BYTES)
    return rows.tokens * per_token + logits + sampler_bytes(rows, config.vocab_size)


def sampler_bytes(rows: StepRows, vocab_size: int) -> int:
    """The sampler's fp32 working copies of a step's sampled rows (the part of a step's
    activations a profiled forward does not reach)."""
    return rows.sampled * vocab_size * SAMPLER_BYTES_PER_LOGIT


def unprofiled_bytes(rows: StepRows, vocab_size: int) -> int:
    """What a profiled forward does not reach: each logits row's fp32 copy and
    log-softmax (a step scoring prompt logprobs has ``rows.logits`` of them) and the
    sampler's working copies."""
    return rows.logits * vocab_size * LOGIT_COPY_BYTES + sampler_bytes(rows, vocab_size)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the worker sees it once its weights are loaded."""

    total: int
    free: int  # the driver's free bytes (torch's cached blocks are not free to others)
    reserved: int  # held by torch's caching allocator
    allocated: int  # in live tensors: the weights

    @classmethod
    def of(cls, device: torch.device) -> GpuMemory:
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        return cls(total, free, reserved, torch.cuda.memory_allocated(device))

    @property
    def available(self) -> int:
        """What this process can still allocate: free, plus cached but unused."""
        return self.free + self.reserved - self.allocated


def utilization_budget(
    memory: GpuMemory, utilization: float, activations: int, device: object = "the GPU"
) -> int:
    """``--gpu-memory-utilization``, as vLLM: this instance's share of the device
    (``total * utilization``) less this process's peak, its weights and one step's
    activations. Other processes' memory is not subtracted: two servers at 0.45 share one
    GPU. Refused (ValueError) when nothing is left for the KV cache, or when the KV cache
    would need more than is free (other processes hold the rest of the share)."""
    share = int(memory.total * utilization)
    budget = share - memory.allocated - activations
    if budget <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {utilization} gives this instance {_gib(share)} of "
            f"{device} ({_gib(memory.total)}), but the weights take {_gib(memory.allocated)} "
            f"and one step's activations about {_gib(activations)}: nothing is left for the "
            "KV cache; raise --gpu-memory-utilization (or lower --max-num-batched-tokens / "
            "--max-num-seqs)"
        )
    room = memory.available - activations
    if budget > room:
        raise ValueError(
            f"--gpu-memory-utilization {utilization} leaves the KV cache {_gib(budget)} on "
            f"{device}, but only {_gib(max(0, room))} is free after the weights and one "
            f"step's activations ({_gib(memory.total - memory.free - memory.reserved)} is "
            "held by other processes); lower --gpu-memory-utilization or free the GPU"
        )
    return budget


def requested_budget(memory: GpuMemory, kv_bytes: int, activations: int, device: object) -> int:
    """``--kv-cache-memory`` on a GPU: exactly those bytes, refused when they do not fit in
    what is free next to the weights and one step's activations."""
    room = memory.available - activations
    if kv_bytes > room:
        raise ValueError(
            f"--kv-cache-memory {_gib(kv_bytes)} does not fit on {device}: "
            f"{_gib(memory.available)} is free after the weights and one step's activations "
            f"need about {_gib(activations)}, leaving {_gib(max(0, room))}; lower "
            "--kv-cache-memory (or --max-num-batched-tokens / --max-num-seqs)"
        )
    return kv_bytes


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
