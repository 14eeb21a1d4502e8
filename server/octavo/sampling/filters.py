"""Truncation filters that remove unlikely tokens before sampling.

Each filter works in place on a float32 ``[rows, vocab]`` tensor of temperature-scaled
logits and sets removed tokens to -inf. Per-row settings come as Python lists; rows
whose filter is off are left untouched and cost nothing.

A full sort of a large vocabulary is slow on CPU, so nothing here sorts the whole
vocabulary unless it has to: top-k uses ``topk(k)``, and top-p on the CPU looks at a
growing number of best tokens until they hold enough probability mass. That loop reads
back from the device on every round, so on an accelerator top-p instead finds each row's
exact threshold by a fixed-length bisection (``top_p_threshold``): no sort, no host sync.
"""

from __future__ import annotations

import torch

from octavo.sampling.host_lists import device_tensor
from octavo.sampling.top_p_threshold import top_p_thresholds

TOP_P_FIRST_WIDTH = 64  # best tokens inspected first when looking for the top-p nucleus
TOP_P_GROWTH = 8  # how much the inspected width grows when the nucleus is wider


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> None:
    """Keep each row's ``top_k`` best tokens, then its smallest set reaching mass ``top_p``.

    ``top_k`` <= 0 (or >= vocab) and ``top_p`` >= 1 mean "off" for that row. When both
    are on, top-p is measured on the probabilities renormalised over the top-k tokens.
    Tokens tied with the last kept one are kept as well.
    """
    vocab_size = logits.shape[1]
    k_rows = [i for i, k in enumerate(top_k) if 0 < k < vocab_size]
    k_set = set(k_rows)
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0 and i not in k_set]
    if k_rows:
        _apply_top_k_rows(logits, k_rows, [top_k[i] for i in k_rows], [top_p[i] for i in k_rows])
    if p_rows:
        _apply_top_p_rows(logits, p_rows, [top_p[i] for i in p_rows])


def _apply_top_k_rows(
    logits: torch.Tensor, rows: list[int], ks: list[int], ps: list[float]
) -> None:
    """Top-k (and top-p within the top-k) for the given rows, in place."""
    device = logits.device
    index = device_tensor(rows, torch.long, device)
    sub = logits[index]
    values = sub.topk(max(ks), dim=1, sorted=True).values
    ks_t = device_tensor(ks, torch.long, device)
    positions = torch.arange(values.shape[1], device=device).unsqueeze(0)
    values = values.masked_fill(positions >= ks_t.unsqueeze(1), float("-inf"))
    counts = ks_t
    if any(p < 1.0 for p in ps):
        ps_t = device_tensor(ps, torch.float32, device)
        nucleus = _nucleus_size(torch.softmax(values, dim=1), ps_t)
        counts = torch.where(ps_t < 1.0, torch.minimum(ks_t, nucleus), ks_t)
    thresholds = values.gather(1, (counts - 1).unsqueeze(1))
    logits[index] = sub.masked_fill(sub < thresholds, float("-inf"))


def _apply_top_p_rows(logits: torch.Tensor, rows: list[int], ps: list[float]) -> None:
    """Top-p for the given rows: the growing search on the CPU, the bisection elsewhere."""
    index = device_tensor(rows, torch.long, logits.device)
    sub = logits[index]
    probs = torch.softmax(sub, dim=1)
    ps_t = device_tensor(ps, torch.float32, logits.device)
    if logits.device.type == "cpu":
        thresholds = _growing_search_thresholds(probs, ps_t)
    else:
        thresholds = top_p_thresholds(probs, ps_t)
    logits[index] = sub.masked_fill(probs < thresholds.unsqueeze(1), float("-inf"))


def _growing_search_thresholds(probs: torch.Tensor, ps_t: torch.Tensor) -> torch.Tensor:
    """Each row's smallest kept probability, inspecting only as many best tokens as
    needed (fastest on the CPU, where reading ``pending`` back costs nothing)."""
    rows, vocab_size = probs.shape
    device = probs.device
    thresholds = torch.zeros(rows, dtype=torch.float32, device=device)
    pending = torch.arange(rows, device=device)
    width = min(TOP_P_FIRST_WIDTH, vocab_size)
    while pending.numel() > 0:
        best = probs[pending].topk(width, dim=1, sorted=True).values
        wanted = ps_t[pending]
        enough = (best.sum(dim=1) >= wanted) | (width == vocab_size)
        counts = _nucleus_size(best, wanted)
        smallest_kept = best.gather(1, (counts - 1).unsqueeze(1)).squeeze(1)
        thresholds[pending[enough]] = smallest_kept[enough]
        pending = pending[~enough]
        width = min(width * TOP_P_GROWTH, vocab_size)
    return thresholds


def _nucleus_size(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Number of leading tokens kept by top-p: those whose better tokens hold < p mass.

    ``sorted_probs`` is ``[rows, width]`` in descending order. The best token is always
    kept because the mass before it is 0 < p.
    """
    mass_before = torch.cumsum(sorted_probs, dim=1) - sorted_probs
    counts = (mass_before < top_p.unsqueeze(1)).sum(dim=1)
    return counts.clamp_(min=1, max=sorted_probs.shape[1])


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> None:
    """Drop tokens whose probability is below ``min_p`` times the row's top probability."""
    rows = [i for i, p in enumerate(min_p) if p > 0.0]
    if not rows:
        return
    index = device_tensor(rows, torch.long, logits.device)
    sub = logits[index]
    probs = torch.softmax(sub, dim=1)
    scale = device_tensor([min_p[i] for i in rows], torch.float32, logits.device)
    threshold = probs.amax(dim=1, keepdim=True) * scale.unsqueeze(1)
    logits[index] = sub.masked_fill(probs < threshold, float("-inf"))
