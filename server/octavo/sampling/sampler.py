"""Turn one step's logits into one next token per sequence.

Processing order for a batch (each stage is skipped when no row needs it):

0. structured output: tokens a row's grammar forbids are set to -inf (a masked copy);
1. logprobs from the raw logits (``log_softmax`` before anything below);
2. ``min_tokens``: EOS and stop tokens are blocked until enough tokens were generated;
3. penalties: repetition (prompt + output), presence and frequency (output only);
4. greedy rows take the ``argmax``;
5. other rows: temperature, top-k, top-p, min-p, then a random draw.

On the CPU, step 5 is one native kernel over each row (``native_sampler``: the filters and
an inverse-CDF draw with one random number per row, from the row's generator). Elsewhere,
and on a CPU without the native kernels, the random draw is the "exponential race"
(``random_draws.race``): with ``q ~ Exp(1)`` per token, ``argmax(probs / q)`` is an exact
sample from ``probs``. Seeded rows draw from their own ``torch.Generator`` either way, so
their tokens do not depend on the rest of the batch; ``random_draws`` keeps each draw on
its generator's device.

On an accelerator the host never waits in the middle of a step: per-row settings go to
the device through pinned memory (``host_lists``), top-p needs no read-back
(``top_p_threshold``), greedy and sampled rows' tokens meet in one device tensor, and
that tensor (with the requested logprobs packed beside it, ``pack_logprobs``) comes
back in one transfer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from octavo.sampling.filters import apply_min_p, apply_top_k_top_p
from octavo.sampling.host_lists import device_tensor
from octavo.sampling.logprobs import packed_logprobs, unpack_logprobs
from octavo.sampling.native_sampler import argmax_indices, draw_rows, native_sampling_ops
from octavo.sampling.penalties import (
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    mask_token_rows,
)
from octavo.sampling.pending import PendingSample, read_back
from octavo.sampling.random_draws import race
from octavo.sampling.token_logprobs import TokenLogprobs
from octavo.sampling_params import SamplingParams
from octavo.structured_output.matcher import GrammarState, apply_grammar_bitmasks

__all__ = ["SampleResult", "Sampler", "SamplingRow", "target_probabilities"]


@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence for this step.

    ``generator`` (``None`` = global RNG) is best created on the logits' device
    (``random_draws.generator_for``); one on another device works but costs a copy per
    step. ``eos_token_ids``
    (unless ``params.ignore_eos``) and ``params.stop_token_ids`` are blocked while fewer
    than ``params.min_tokens`` tokens have been generated.
    """

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None
    eos_token_ids: frozenset[int] = frozenset()
    grammar: GrammarState | None = None  # structured output: what may come next

    def blocked_token_ids(self) -> list[int]:
        """Token ids that must not be sampled this step because of ``min_tokens``."""
        if len(self.output_token_ids) >= self.params.min_tokens:
            return []
        blocked = set(self.params.stop_token_ids or ())
        if not self.params.ignore_eos:
            blocked |= self.eos_token_ids
        return sorted(blocked)


@dataclass
class SampleResult:
    """One token per row, plus its logprobs where the row asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    """Stateless batch sampler; call it with ``[B, vocab]`` logits and ``B`` rows.
    ``native=False`` keeps CPU rows on the torch path, draws and logprobs (the reference the
    kernels are measured against)."""

    def __init__(self, native: bool = True) -> None:
        self.native = native

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        return self.launch(logits, rows).result()

    def launch(self, logits: torch.Tensor, rows: list[SamplingRow]) -> PendingSample:
        """Queue the step's sampling on the logits' device; the ids stay there (the next
        step's inputs can take them) and reach the host when ``result()`` is asked for."""
        _check_inputs(logits, rows)
        if not rows:
            return PendingSample.known(SampleResult(token_ids=[], logprobs=[]))
        allowed = logits
        if any(row.grammar is not None for row in rows):
            allowed = apply_grammar_bitmasks(logits, [row.grammar for row in rows])
        if _is_plain_greedy(rows):
            chosen = argmax_indices(allowed, self.native)
            return read_back(chosen, None, _plain_result(len(rows)))
        work = _prepare_logits(allowed, rows)  # never changes ``logits`` (raw, for logprobs)
        chosen = _choose_tokens(work, rows, self.native)
        logprob_rows = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        if not logprob_rows:
            return read_back(chosen, None, _plain_result(len(rows)))
        return _launch_with_logprobs(chosen, logits, rows, logprob_rows, self.native)


def _plain_result(batch: int) -> Callable[[torch.Tensor], SampleResult]:
    def finish(host: torch.Tensor) -> SampleResult:
        return SampleResult(token_ids=host.tolist(), logprobs=[None] * batch)

    return finish


def _launch_with_logprobs(
    chosen: torch.Tensor,
    logits: torch.Tensor,
    rows: list[SamplingRow],
    logprob_rows: list[int],
    native: bool,
) -> PendingSample:
    """The chosen ids and the logprob rows' entries (from the raw ``logits``), read back in
    one transfer."""
    wanted = [rows[i].params.logprobs or 0 for i in logprob_rows]
    picked = chosen
    if len(logprob_rows) < len(rows):
        picked = chosen[device_tensor(logprob_rows, torch.long, chosen.device)]
    packed = packed_logprobs(logits, logprob_rows, picked, max(wanted), native)
    batch = len(rows)

    def finish(host: torch.Tensor) -> SampleResult:
        entries = unpack_logprobs(host[batch:].view(len(logprob_rows), -1), wanted)
        result = SampleResult(token_ids=host[:batch].tolist(), logprobs=[None] * batch)
        for i, entry in zip(logprob_rows, entries, strict=True):
            result.logprobs[i] = entry
        return result

    return read_back(chosen, packed.flatten(), finish)


def _check_inputs(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Reject logits whose shape does not match the rows."""
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [batch, vocab], got {tuple(logits.shape)}")
    if logits.shape[0] != len(rows):
        raise ValueError(f"logits has {logits.shape[0]} rows but {len(rows)} rows were given")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating point tensor, got {logits.dtype}")


def _is_plain_greedy(rows: list[SamplingRow]) -> bool:
    """True when a single ``argmax`` over the raw logits gives every row's answer."""
    return all(
        row.params.is_greedy
        and not row.params.any_penalty
        and row.params.logprobs is None
        and not row.blocked_token_ids()
        for row in rows
    )


def _prepare_logits(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Return float32 logits with ``min_tokens`` blocking and penalties applied.

    The caller's tensor is never modified: it is copied when anything has to change.
    """
    blocked = [row.blocked_token_ids() for row in rows]
    penalised = [i for i, row in enumerate(rows) if row.params.any_penalty]
    if not any(blocked) and not penalised:
        return logits.float()
    work = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    work.copy_(logits)  # a fresh contiguous float32 copy
    if any(blocked):
        mask_token_rows(work, range(len(rows)), blocked)
    if penalised:
        _apply_penalties(work, [rows[i] for i in penalised], penalised)
    return work


def _apply_penalties(work: torch.Tensor, rows: list[SamplingRow], indices: list[int]) -> None:
    """Apply repetition/presence/frequency penalties to ``work[indices]`` in place."""
    params = [row.params for row in rows]
    repeated = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if repeated:
        apply_repetition_penalty(
            work,
            [indices[i] for i in repeated],
            [rows[i].prompt_token_ids + rows[i].output_token_ids for i in repeated],
            [params[i].repetition_penalty for i in repeated],
        )
    counted = [i for i, p in enumerate(params) if p.presence_penalty or p.frequency_penalty]
    if counted:
        apply_presence_frequency_penalties(
            work,
            [indices[i] for i in counted],
            [rows[i].output_token_ids for i in counted],
            [params[i].presence_penalty for i in counted],
            [params[i].frequency_penalty for i in counted],
        )


def _choose_tokens(work: torch.Tensor, rows: list[SamplingRow], native: bool) -> torch.Tensor:
    """``[rows]`` token ids on the device: ``argmax`` for greedy rows, a draw for others."""
    sampled = [i for i, row in enumerate(rows) if not row.params.is_greedy]
    if not sampled:
        return argmax_indices(work, native)
    sampled_index = device_tensor(sampled, torch.long, work.device)
    picks = _draw(work, [rows[i] for i in sampled], sampled_index, native)
    if len(sampled) == len(rows):
        return picks
    greedy_index = device_tensor(
        [i for i, row in enumerate(rows) if row.params.is_greedy], torch.long, work.device
    )
    chosen = torch.empty(len(rows), dtype=torch.long, device=work.device)
    chosen[sampled_index] = picks
    chosen[greedy_index] = argmax_indices(work[greedy_index], native)
    return chosen


def _draw(
    work: torch.Tensor, rows: list[SamplingRow], index: torch.Tensor, native: bool
) -> torch.Tensor:
    """A token for each of ``rows`` (``work[index]``): the native kernel on the CPU, else the
    filters, a softmax and the exponential race."""
    ops = native_sampling_ops(work.device) if native else None
    if ops is not None:
        return draw_rows(ops, work if len(rows) == work.shape[0] else work[index], rows)
    return race(_probabilities(work, rows, index), [row.generator for row in rows])


def _probabilities(
    work: torch.Tensor, rows: list[SamplingRow], index: torch.Tensor
) -> torch.Tensor:
    """The distributions ``rows`` (``work[index]``) draw from: temperature, top-k, top-p,
    min-p, softmax."""
    logits = work[index]  # advanced indexing copies, so the filters may work in place
    temperatures = [row.params.temperature for row in rows]
    if any(t != 1.0 for t in temperatures):
        logits.div_(_row_tensor(temperatures, work.device).unsqueeze(1))
    apply_top_k_top_p(
        logits, [row.params.top_k for row in rows], [row.params.top_p for row in rows]
    )
    apply_min_p(logits, [row.params.min_p for row in rows])
    return torch.softmax(logits, dim=-1)


def target_probabilities(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Each row's distribution after all of its processing (``min_tokens``, penalties,
    temperature, filters): what the sampler draws from. A greedy row's is one-hot on its
    ``argmax``. Speculative decoding verifies proposals against these."""
    _check_inputs(logits, rows)
    work = _prepare_logits(logits, rows)
    probs = torch.zeros_like(work)
    sampled = [i for i, row in enumerate(rows) if not row.params.is_greedy]
    if sampled:
        index = device_tensor(sampled, torch.long, work.device)
        probs[index] = _probabilities(work, [rows[i] for i in sampled], index)
    greedy = [i for i, row in enumerate(rows) if row.params.is_greedy]
    if greedy:
        index = device_tensor(greedy, torch.long, work.device)
        probs[index, argmax_indices(work[index])] = probs.new_ones(())  # no scalar copy
    return probs


def row_argmax(values: torch.Tensor) -> list[int]:
    """Index of each row's largest value, the first on ties (``argmax_indices``)."""
    return argmax_indices(values).tolist()


def _row_tensor(values: list[float], device: torch.device) -> torch.Tensor:
    """A float32 ``[rows]`` tensor of per-row settings."""
    return device_tensor(values, torch.float32, device)
