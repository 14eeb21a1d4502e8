"""How one request wants its tokens chosen and when it wants generation to stop.

Field names and defaults follow vLLM's ``SamplingParams`` so that clients (and the
OpenAI-compatible server) can pass the same values. Everything is checked once, in
``__post_init__``; a bad value raises ``ValueError`` naming the offending field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from octavo.kv_transfer.params import parse_kv_transfer_params
from octavo.pooling.params import PoolingParams
from octavo.structured_output.params import StructuredOutputsParams

GREEDY_TEMPERATURE = 1e-5  # temperatures below this are treated as 0 (greedy decoding)
MAX_CACHE_SALT_LENGTH = 1024  # characters of a request's cache_salt


class RequestOutputKind(enum.Enum):
    """What each output of a running request carries (vLLM's names)."""

    CUMULATIVE = 0  # everything generated so far, every step
    DELTA = 1  # only what is new since the previous output (the server's streams)
    FINAL_ONLY = 2  # one output, when the request finishes (offline ``LLM.generate``)


@dataclass
class SamplingParams:
    """Sampling and stopping settings of one request.

    ``top_k`` of 0 or -1 disables top-k filtering. ``logprobs`` is the number of top
    alternatives to return per generated token (0 = only the chosen token's logprob,
    ``None`` = no logprobs at all). ``prompt_logprobs`` asks the same for every prompt
    token after the first (scored while the prompt is computed; such a prompt never
    reuses the prefix cache). ``max_tokens=None`` means "until the context is full".
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # slow tokenizers (as in HF and vLLM)
    include_stop_str_in_output: bool = False
    # False: no text at all, only token ids (vLLM's field; the server sends its streams'
    # requests so and decodes their text itself, ``engine/stream_text.py``)
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # streamed outputs every this many tokens (the first and last at once), at least the
    # engine's --stream-interval (vLLM's field); None: the engine's
    stream_interval: int | None = None
    structured_outputs: StructuredOutputsParams | None = None  # a JSON schema, regex, ...
    # Set only by ``for_pooling``: the request returns one vector, no tokens.
    pooling: PoolingParams | None = None
    # Only requests with the same salt share prefix-cache blocks (vLLM's request field).
    cache_salt: str | None = None
    # vLLM's P/D disaggregation contract (``kv_transfer/params.py``): checked, carried as sent.
    kv_transfer_params: dict | None = None

    @classmethod
    def for_pooling(cls, pooling: PoolingParams) -> SamplingParams:
        """How the engine carries a pooling request: its prompt is computed, its final
        hidden states pooled, and nothing is sampled (``pooling`` must be resolved)."""
        if not pooling.is_resolved:
            raise ValueError("pooling params must be resolved against the model's defaults")
        return cls(
            max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY, pooling=pooling
        )

    @property
    def computes_whole_prompt(self) -> bool:
        """Every prompt position must run (prompt logprobs, mean/CLS pooling): the prefix
        cache is not read for it."""
        if self.prompt_logprobs is not None:
            return True
        return self.pooling is not None and self.pooling.pooling_type.needs_every_token

    def __post_init__(self) -> None:
        self._normalise_stops()
        self._validate_numbers()
        self._validate_lengths()
        self._validate_cache_salt()
        parse_kv_transfer_params(self.kv_transfer_params)  # ValueError (400) if malformed

    @property
    def is_greedy(self) -> bool:
        """True when the most likely token is always picked (temperature ~ 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def any_penalty(self) -> bool:
        """True when a repetition, presence or frequency penalty changes the logits."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def top_k_enabled(self) -> bool:
        """True when top-k filtering is on (``top_k`` > 0)."""
        return self.top_k > 0

    def _normalise_stops(self) -> None:
        """Turn ``stop`` and ``stop_token_ids`` into plain lists and check their items."""
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        for text in self.stop:
            _require(isinstance(text, str), f"stop must contain strings, got {text!r}")
            _require(text != "", "stop strings must not be empty")
        _require(
            self.detokenize or not self.stop,
            "stop strings are only supported when detokenize is True; "
            "set detokenize=True to use stop",
        )
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        for token_id in self.stop_token_ids:
            _require(
                _is_int(token_id) and token_id >= 0,
                f"stop_token_ids must be non-negative integers, got {token_id!r}",
            )

    def _validate_numbers(self) -> None:
        """Range-check the fields that shape the next-token distribution."""
        _require(_is_int(self.n) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}")
        _check_real("temperature", self.temperature)
        _require(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check_real("top_p", self.top_p)
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _require(
            _is_int(self.top_k) and self.top_k >= -1,
            f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k!r}",
        )
        _check_real("min_p", self.min_p)
        _require(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_real(name, value)
            _require(-2.0 <= value <= 2.0, f"{name} must be in [-2, 2], got {value}")
        _check_real("repetition_penalty", self.repetition_penalty)
        _require(
            self.repetition_penalty > 0.0,
            f"repetition_penalty must be > 0, got {self.repetition_penalty}",
        )
        _require(
            self.seed is None or _is_int(self.seed),
            f"seed must be an integer or None, got {self.seed!r}",
        )
        interval = self.stream_interval
        _require(
            interval is None or (_is_int(interval) and interval >= 1),
            f"stream_interval must be at least 1, got {interval!r}",
        )

    def _validate_lengths(self) -> None:
        """Check the token-count limits and the number of logprobs asked for."""
        _require(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            f"max_tokens must be None or an integer >= 1, got {self.max_tokens!r}",
        )
        _require(
            _is_int(self.min_tokens) and self.min_tokens >= 0,
            f"min_tokens must be an integer >= 0, got {self.min_tokens!r}",
        )
        _require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
        )
        # The upper bound is the engine's --max-logprobs (``check_max_logprobs``).
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None or (_is_int(value) and value >= 0),
                f"{name} must be None or an integer >= 0, got {value!r}",
            )

    def _validate_cache_salt(self) -> None:
        salt = self.cache_salt
        _require(
            salt is None or (isinstance(salt, str) and 0 < len(salt) <= MAX_CACHE_SALT_LENGTH),
            f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_LENGTH} "
            f"characters, got {salt!r:.80}",
        )

    def check_max_logprobs(self, max_logprobs: int) -> None:
        """ValueError when ``logprobs`` or ``prompt_logprobs`` asks for more than
        ``max_logprobs`` (the engine's ``--max-logprobs``), worded as vLLM's."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _require(
                value is None or value <= max_logprobs,
                f"Requested {name} of {value}, which is greater than max allowed: "
                f"{max_logprobs} (--max-logprobs)",
            )


def _is_int(value: object) -> bool:
    """True for real integers (``bool`` is not accepted as a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_real(name: str, value: object) -> None:
    """Reject values that are not ints/floats (or are NaN) with a message naming ``name``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    _require(ok, f"{name} must be a number, got {value!r}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
