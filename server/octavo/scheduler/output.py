"""What the scheduler hands the executor each step: plain data, no engine objects.

Everything here is ids, token ids and numbers, so it can cross a process boundary (one
worker per rank with tensor parallelism) unchanged. The model runner keeps what it needs
between steps (each sequence's token history, sampling settings and random generator)
and forgets a sequence when its id appears in ``finished_seq_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.kv_cache.offload_tier import TierCopy
from octavo.lora_request import LoRARequest
from octavo.multimodal.inputs import ImageInput
from octavo.sampling_params import SamplingParams

# Async scheduling: a decode's input whose token the previous step is still sampling (the
# runner takes it from that step's sampled ids on the device).
IN_FLIGHT_TOKEN = -1


@dataclass
class NewSequenceData:
    """A sequence the runner has not seen yet: sent once, on its first scheduled step."""

    seq_id: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    seed: int | None  # seeds this sequence's own random generator (None: the global RNG)
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base)
    images: list[ImageInput] = field(default_factory=list)  # its prompt's images


@dataclass
class ScheduledSequence:
    """One sequence's share of a step: which tokens to compute and where their K/V go."""

    seq_id: int
    token_ids: list[int]  # the tokens whose keys/values this step computes
    num_computed_tokens: int  # tokens already in the cache: positions start here
    block_ids: list[int]  # the sequence's whole block table
    sample: bool  # the chunk reaches the last known token, so a next token is sampled
    fork_seq_ids: list[int] = field(default_factory=list)  # children sampling from this row
    num_spec_tokens: int = 0  # the last ones of ``token_ids`` are proposals to verify
    state_slot: int = 0  # models with state layers: the sequence's slot (0: the null slot)
    # KV cache groups (a hybrid model's sliding and full layers): each group's block table;
    # None for one group (``block_ids`` serves every layer)
    group_block_ids: tuple[list[int], ...] | None = None

    @property
    def is_speculative(self) -> bool:
        return self.num_spec_tokens > 0

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledSequence] = field(default_factory=list)  # several tokens each
    decodes: list[ScheduledSequence] = field(default_factory=list)  # one token (+ proposals)
    new_sequences: list[NewSequenceData] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination)
    # KV offload tier: saves and loads, made in this order before block_copies
    tier_copies: list[TierCopy] = field(default_factory=list)
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # forks' state slots
    finished_seq_ids: list[int] = field(default_factory=list)  # the runner may forget these
    preempted_seq_ids: list[int] = field(default_factory=list)
    unloaded_lora_ids: list[int] = field(default_factory=list)  # adapters the workers drop
    computed_at_schedule: bool = False  # async scheduling: tokens counted computed when planned

    @property
    def scheduled(self) -> list[ScheduledSequence]:
        return self.prefills + self.decodes

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes
