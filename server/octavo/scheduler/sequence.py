"""One completion being generated: its tokens, progress through the KV cache, and fate."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from octavo.kv_cache.block_hash import BlockKeys, HashChain
from octavo.lora_request import LoRARequest
from octavo.multimodal.inputs import ImageInput
from octavo.sampling_params import SamplingParams

SEED_STRIDE = 0x9E3779B1  # spreads the seeds of one request's n completions apart
SPEC_ACCEPTANCE_START = 0.75  # a new sequence's assumed share of proposals accepted


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # holds blocks; a remote prefill fills them
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    index: int  # which of the request's n completions
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose keys/values are in the cache
    num_in_flight: int = 0  # async scheduling: sampled by a launched step, not yet appended
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache on first admission
    prompt_logprobs: list = field(default_factory=list)  # TokenLogprobs of prompt tokens 1..
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that matched
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    announced: bool = False  # the model runner has been sent this sequence
    forked: bool = False  # the request's other n - 1 completions were forked from this one
    fork_seq_ids: list[int] = field(default_factory=list)  # ids planned for those forks
    spec_token_ids: list[int] = field(default_factory=list)  # proposed next tokens, unverified
    spec_acceptance: float = SPEC_ACCEPTANCE_START  # moving average: proposals accepted
    spec_steps_held: int = 0  # steps its proposals were held back (see SpeculationPolicy)
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base)
    images: list[ImageInput] = field(default_factory=list)  # its prompt's images, in order
    # P/D disaggregation: the remote prefill its prompt's KV comes from, until it has come
    # (a ``kv_transfer.params.RemotePrefill``; None for every other sequence)
    remote_kv: object | None = None
    hash_chain: HashChain = field(init=False, repr=False)  # its full blocks' prefix hashes

    def __post_init__(self) -> None:
        keys = block_keys(self.lora_request, self.params.cache_salt, self.images)
        self.hash_chain = HashChain(keys)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def lora_id(self) -> int | None:
        return None if self.lora_request is None else self.lora_request.lora_int_id

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def awaits_fork(self) -> bool:
        """True for the first completion of an ``n > 1`` request that has not forked yet."""
        return self.index == 0 and self.params.n > 1 and not self.forked and not self.fork_seq_ids

    def fork(self, seq_id: int, index: int) -> Sequence:
        """A sibling completion that shares this sequence's computed prompt."""
        return Sequence(
            seq_id=seq_id,
            request_id=self.request_id,
            index=index,
            token_ids=self.prompt_token_ids,
            num_prompt_tokens=self.num_prompt_tokens,
            params=self.params,
            num_computed_tokens=self.num_computed_tokens,
            arrival_time=self.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            lora_request=self.lora_request,
            images=self.images,
            announced=True,
            forked=True,
        )


def block_keys(
    lora: LoRARequest | None, cache_salt: str | None, images: list[ImageInput] = ()
) -> BlockKeys:
    """What its blocks' hashes hold besides tokens: the same prompt under two adapters,
    with two cache salts, or with two different images, shares no KV."""
    spans = tuple((image.offset, image.end, image.content_hash) for image in images)
    if lora is None:
        return BlockKeys(cache_salt=cache_salt, image_spans=spans)
    return BlockKeys(lora.lora_name, lora.lora_path, cache_salt, spans)


def sequence_seed(request_seed: int | None, index: int) -> int | None:
    """The seed of completion ``index`` of a request seeded with ``request_seed``."""
    if request_seed is None:
        return None
    return (request_seed + index * SEED_STRIDE) % 2**63
