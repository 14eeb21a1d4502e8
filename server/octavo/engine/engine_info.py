"""What the event loop may know about the loaded engine, read once on the engine thread."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from octavo.lora_request import StartupAdapters
from octavo.multimodal.media_fetch import MediaConnector

# A normalizer (NFC, say) may shrink text before it is split into tokens; twice the
# longest token's length keeps the "cannot fit" bound safely above any real prompt.
NORMALIZER_MARGIN = 2


@dataclass(frozen=True)
class KVCacheFacts:
    """The KV cache as allocated (vLLM's ``CacheConfig`` fields of the same names)."""

    block_size: int  # tokens per block
    num_gpu_blocks: int  # blocks allocated (on a CPU engine too, as vLLM counts them)
    cache_dtype: str  # --kv-cache-dtype
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None  # --kv-cache-memory (None: sized automatically)

    @property
    def num_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks


@dataclass
class EngineInfo:
    """Facts about the loaded engine that the event loop may read freely."""

    tokenizer: Any  # a private copy: the engine thread keeps using its own
    max_model_len: int
    tokenizer_size: int
    prompt_token_limit: int  # prompt token ids must be below this (``inputs.token_range``)
    model_name: str
    max_num_seqs: int
    kv_cache_tokens: int  # tokens the whole KV cache holds
    max_token_chars: int  # characters of text the longest token can stand for
    vocab_size: int = 0  # the model's (logits width; structured output's bitmasks)
    eos_token_ids: frozenset[int] = frozenset()
    enable_lora: bool = False
    max_loras: int = 0
    startup_adapters: StartupAdapters = field(default_factory=StartupAdapters)  # --lora-modules
    kv_cache: KVCacheFacts | None = None  # None without an engine (``octavo launch render``)
    runner: Any = None  # RunnerSettings: generate or pooling, pooling defaults (None: render)
    image_processor: Any = None  # MultiModalProcessor, a private copy (None: text-only)
    media: MediaConnector = field(default_factory=MediaConnector)  # image URLs: data: only
    architecture: str = ""  # config.json's, e.g. GptOssForCausalLM (Harmony chat)

    @property
    def max_prompt_chars(self) -> int:
        """A text longer than this surely needs more than ``max_model_len`` tokens."""
        return self.max_model_len * self.max_token_chars * NORMALIZER_MARGIN

    @property
    def default_max_sequences_per_request(self) -> int:
        """Sequences of ``max_model_len`` tokens the KV cache holds, at least max_num_seqs."""
        return max(self.max_num_seqs, self.kv_cache_tokens // self.max_model_len)


def read_engine_info(engine: Any) -> EngineInfo:
    """The facts of an ``LLMEngine`` (called on the engine thread, once it is loaded)."""
    tokenizer = copy.deepcopy(engine.tokenizer)
    kv_cache = read_kv_cache_facts(engine)
    return EngineInfo(
        tokenizer=tokenizer,
        max_model_len=engine.max_model_len,
        tokenizer_size=len(engine.tokenizer),
        prompt_token_limit=engine.prompt_token_limit,
        model_name=engine.model_name,
        max_num_seqs=engine.args.max_num_seqs,
        kv_cache_tokens=kv_cache.num_tokens,
        max_token_chars=longest_token_chars(tokenizer),
        vocab_size=engine.vocab_size,
        eos_token_ids=engine.scheduler.limits.eos_token_ids,
        enable_lora=engine.args.enable_lora,
        max_loras=engine.args.max_loras,
        startup_adapters=engine.startup_adapters,
        kv_cache=kv_cache,
        runner=engine.parts.runner,
        image_processor=copy.deepcopy(engine.mm_processor),
        media=engine.media,
        architecture=engine.parts.config.architecture,
    )


def read_kv_cache_facts(engine: Any) -> KVCacheFacts:
    args = engine.args
    return KVCacheFacts(
        block_size=engine.kv.block_size,
        num_gpu_blocks=engine.stats().num_blocks,
        cache_dtype=args.kv_cache_dtype,
        enable_prefix_caching=args.enable_prefix_caching,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory,
    )


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters of text one token decodes to, bounded from above.

    A token's vocabulary string is never shorter than the text it decodes to: byte-level
    BPE spells each byte as one character, SentencePiece spells a space as one '▁' and a
    fallback byte as '<0xNN>', and added tokens are spelled as their text.
    """
    return max((len(token) for token in tokenizer.get_vocab()), default=1)
