"""The gated delta rule: Gated DeltaNet's recurrence, in float32 torch (the CPU path and
the reference the Triton kernels of ``fla-core`` would have to match).

Per value head the state ``S [head_k_dim, head_v_dim]`` evolves token by token:

    S <- exp(g_t) * S                     (the gate: a decay in log space, g_t <= 0)
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T   (the delta rule: write the correction)
    o_t = S^T q_t

A decode token takes exactly these steps (batched over the decoding sequences). A prefill
chunk takes them ``CHUNK`` tokens at a time: inside a chunk the corrections ``u`` solve one
unit lower-triangular system (the UT transform), so a chunk costs a few matmuls instead of
``CHUNK`` sequential updates; the chunks are scanned in order. Both read the state the
sequence's slot held and write the new one back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octavo.attention.metadata import AttentionMetadata

CHUNK = 64  # tokens per chunk of a prefill (transformers' and fla's default)
L2_EPS = 1e-6


@dataclass
class DeltaInputs:
    """One step's tokens, flat: ``query``/``key [T, v_heads, head_k_dim]`` (already one per
    value head, L2-normed, the query scaled), ``value [T, v_heads, head_v_dim]``, the log
    decay ``decay [T, v_heads]`` and the write strength ``beta [T, v_heads]``; float32."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    decay: torch.Tensor
    beta: torch.Tensor

    def rows(self, start: int, end: int) -> DeltaInputs:
        """Tokens ``[start, end)``, heads first (``[v_heads, length, ...]``)."""
        parts = (self.query, self.key, self.value, self.decay, self.beta)
        return DeltaInputs(*(part[start:end].transpose(0, 1) for part in parts))


def prepare_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> DeltaInputs:
    """Float32 inputs: each key head repeated for the value heads it serves (consecutive
    ones), queries and keys L2-normed, queries scaled by ``head_k_dim ** -0.5``."""
    repeats = value.shape[1] // key.shape[1]
    query, key = (x.float().repeat_interleave(repeats, dim=1) for x in (query, key))
    query = _l2_normalize(query) * query.shape[-1] ** -0.5
    return DeltaInputs(query, _l2_normalize(key), value.float(), decay.float(), beta.float())


def _l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def gated_delta_rule(
    inputs: DeltaInputs, state: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
    """``state [num_slots, v_heads, head_k_dim, head_v_dim]`` (the rows ``meta.state_slots``
    read, zeros where ``state_has_initial`` is False, and written back in place) →
    outputs ``[T, v_heads, head_v_dim]`` float32."""
    slots = meta.state_slots
    initial = state.index_select(0, slots).float()
    if meta.state_has_initial is not None:
        initial = initial * meta.state_has_initial.view(-1, 1, 1, 1).to(initial.dtype)
    out = torch.empty_like(inputs.value)
    final = torch.empty_like(initial)
    for i in range(meta.num_prefills):
        start = meta.query_start_loc_list[i]
        end = start + meta.query_lens_list[i]
        chunk_out, final[i] = chunked_delta_rule(inputs.rows(start, end), initial[i])
        out[start:end] = chunk_out.transpose(0, 1)
    if meta.num_decodes:
        first, decodes = meta.num_prefill_tokens, slice(meta.num_prefills, None)
        step = inputs.rows(first, out.shape[0])
        out[first:], final[decodes] = recurrent_delta_step(step, initial[decodes])
    state.index_copy_(0, slots, final.to(state.dtype))
    return out


def recurrent_delta_step(
    step: DeltaInputs, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of ``B`` sequences: ``step`` heads first (``[v_heads, B, ...]``),
    ``state [B, v_heads, head_k_dim, head_v_dim]`` → (outputs ``[B, v_heads,
    head_v_dim]``, the new states)."""
    query, key, value, decay, beta = (
        x.transpose(0, 1) for x in (step.query, step.key, step.value, step.decay, step.beta)
    )
    state = state * decay.exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", state, key)
    correction = (value - predicted) * beta[..., None]
    state = state + key[..., :, None] * correction[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", state, query), state


def chunked_delta_rule(
    sequence: DeltaInputs, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's tokens heads first (``[v_heads, length, ...]``) after ``state
    [v_heads, head_k_dim, head_v_dim]`` → (outputs ``[v_heads, length, head_v_dim]``, the
    state after the last token)."""
    length = sequence.query.shape[1]
    chunks = _ChunkTerms.of(sequence)
    out = torch.empty_like(chunks.corrections)
    for i in range(chunks.corrections.shape[1]):
        corrections = chunks.corrections[:, i] - chunks.state_reads[:, i] @ state
        out[:, i] = chunks.queries[:, i] @ state + chunks.scores[:, i] @ corrections
        state = state * chunks.chunk_decay[:, i] + chunks.keys_to_end[:, i].mT @ corrections
    return out.flatten(1, 2)[:, :length], state


@dataclass
class _ChunkTerms:
    """What every chunk of a sequence needs before the scan (``[v_heads, chunks, CHUNK,
    ...]``): with ``c_t`` the cumulative log decay from the chunk's start to token ``t``,

    * ``corrections`` and ``state_reads``: the UT system ``(I + A) x = rhs`` solved for
      ``rhs = beta * v`` and ``rhs = beta * exp(c) * k``, where ``A[t, s] = beta_t
      exp(c_t - c_s) k_t . k_s`` for ``s < t``; the corrections of the chunk are then
      ``corrections - state_reads @ S`` for the state ``S`` the chunk starts from;
    * ``scores``: ``exp(c_t - c_s) q_t . k_s`` for ``s <= t`` (the chunk's own writes read);
    * ``queries``: ``exp(c_t) q_t`` (the starting state read);
    * ``keys_to_end``: ``exp(c_last - c_s) k_s`` and ``chunk_decay``: ``exp(c_last)``.
    """

    corrections: torch.Tensor
    state_reads: torch.Tensor
    scores: torch.Tensor
    queries: torch.Tensor
    keys_to_end: torch.Tensor
    chunk_decay: torch.Tensor

    @classmethod
    def of(cls, sequence: DeltaInputs) -> _ChunkTerms:
        query, key, value, decay, beta = _padded_chunks(sequence)
        cumulative = decay.cumsum(-1)
        causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=query.device).tril()
        pairwise = cumulative[..., :, None] - cumulative[..., None, :]
        pairwise = pairwise.masked_fill(~causal, float("-inf")).exp()
        key_beta = key * beta[..., None]
        system = (key_beta @ key.mT) * pairwise  # its diagonal is ignored: unit triangular
        decayed_key_beta = key_beta * cumulative.exp()[..., None]
        solve = torch.linalg.solve_triangular
        return cls(
            corrections=solve(system, value * beta[..., None], upper=False, unitriangular=True),
            state_reads=solve(system, decayed_key_beta, upper=False, unitriangular=True),
            scores=(query @ key.mT) * pairwise,
            queries=query * cumulative.exp()[..., None],
            keys_to_end=key * (cumulative[..., -1:] - cumulative).exp()[..., None],
            chunk_decay=cumulative[..., -1].exp()[..., None, None],
        )


def _padded_chunks(sequence: DeltaInputs) -> tuple[torch.Tensor, ...]:
    """The sequence padded to whole chunks (padding decays by 1 and writes nothing), each
    tensor ``[v_heads, chunks, CHUNK, ...]``."""
    heads, length = sequence.query.shape[:2]
    pad = -length % CHUNK
    vectors = (F.pad(x, (0, 0, 0, pad)) for x in (sequence.query, sequence.key, sequence.value))
    scalars = (F.pad(x, (0, pad)) for x in (sequence.decay, sequence.beta))
    query, key, value = (x.view(heads, -1, CHUNK, x.shape[-1]) for x in vectors)
    decay, beta = (x.view(heads, -1, CHUNK) for x in scalars)
    return query, key, value, decay, beta
