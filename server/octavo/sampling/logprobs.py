"""Log-probabilities reported back to the client for each generated token.

They are taken from the raw model logits (before penalties, temperature and
filtering), which is what vLLM reports by default. On the CPU one native kernel packs the
entries from torch's ``log_softmax`` (``octavo_cpu.row_logprobs``: the same values and
ranks, without torch's gather, comparison, count, topk and concatenation over the whole
``[rows, vocab]`` tensor).
"""

from __future__ import annotations

import torch

from octavo.sampling.host_lists import device_tensor
from octavo.sampling.token_logprobs import TokenLogprobs


def raw_logprobs(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Return float32 ``log_softmax`` of the given rows of the unmodified logits."""
    if len(rows) < logits.shape[0]:
        logits = logits[device_tensor(rows, torch.long, logits.device)]
    return torch.log_softmax(logits.float(), dim=-1)


def packed_logprobs(
    logits: torch.Tensor, rows: list[int], chosen: torch.Tensor, widest: int, native: bool = True
) -> torch.Tensor:
    """``pack_logprobs`` of ``raw_logprobs(logits, rows)``, ``chosen`` one id per row: on
    the CPU packed by the native kernel (unless ``native`` is False), elsewhere with torch
    ops."""
    logprobs = raw_logprobs(logits, rows)
    ops = _native_ops(logprobs) if native else None
    if ops is None:
        return pack_logprobs(logprobs, chosen, widest)
    packed = torch.empty(len(rows), 3 + 2 * widest, dtype=torch.long)
    ops.row_logprobs(packed, logprobs.contiguous(), chosen.contiguous(), widest)
    return packed


def logprob_entries(
    logits: torch.Tensor, chosen: list[int], num_top: list[int]
) -> list[TokenLogprobs]:
    """One ``TokenLogprobs`` per row of the raw ``logits`` (one read-back from the device)."""
    rows = list(range(logits.shape[0]))
    chosen_ids = device_tensor(chosen, torch.long, logits.device)
    packed = packed_logprobs(logits, rows, chosen_ids, max(num_top, default=0))
    return unpack_logprobs(packed.cpu(), num_top)


def _native_ops(logits: torch.Tensor):
    from octavo.kernels.cpu_build import native_op_owner

    return native_op_owner(logits.device, "row_logprobs")


def pack_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, widest: int) -> torch.Tensor:
    """Everything ``TokenLogprobs`` needs, as one int64 ``[rows, 3 + 2 * widest]`` tensor
    on the device: chosen id, its logprob, its rank, ``widest`` top ids, their logprobs.
    Logprobs travel as their float32 bit patterns (``unpack_logprobs`` turns them back),
    so ids and values come back to the host in one exact transfer."""
    chosen_lp = logprobs.gather(1, chosen.unsqueeze(1))
    above = (logprobs > chosen_lp).sum(dim=1, keepdim=True, dtype=torch.int32)  # 2x int64's
    ranks = above.to(torch.int64) + 1
    parts = [chosen.unsqueeze(1), _bits(chosen_lp), ranks]
    if widest > 0:
        values, indices = logprobs.topk(widest, dim=1, sorted=True)
        parts += [indices, _bits(values)]
    return torch.cat(parts, dim=1)


def unpack_logprobs(packed: torch.Tensor, num_top: list[int]) -> list[TokenLogprobs]:
    """The ``TokenLogprobs`` of a ``pack_logprobs`` tensor already on the host."""
    widest = (packed.shape[1] - 3) // 2
    chosen_values = _floats(packed[:, 1]).tolist()
    top_ids = packed[:, 3 : 3 + widest].tolist()
    top_values = _floats(packed[:, 3 + widest :]).tolist()
    return [
        TokenLogprobs(
            token_id=token_id,
            logprob=chosen_values[i],
            rank=rank,
            top=list(zip(top_ids[i][: num_top[i]], top_values[i][: num_top[i]], strict=True)),
        )
        for i, (token_id, rank) in enumerate(packed[:, [0, 2]].tolist())
    ]


def _bits(values: torch.Tensor) -> torch.Tensor:
    """float32 values as int64 holding their bit patterns (exact, reversible)."""
    return values.contiguous().view(torch.int32).to(torch.int64)


def _floats(bits: torch.Tensor) -> torch.Tensor:
    """The float32 values whose bit patterns ``_bits`` stored."""
    return bits.to(torch.int32).view(torch.float32)
