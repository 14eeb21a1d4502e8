"""The longest context a model's config allows, derived as vLLM's ``_get_and_verify_max_len``.

The configured length is the smallest of the length keys a config names (GPT-2's
``n_positions``, MPT's ``max_seq_len``, ...; ``model_max_length``, Command-R's, wins when
present). Rope scaling stretches it: ``linear``, ``dynamic`` and the other scaled types
multiply it by ``factor``; ``yarn`` multiplies ``original_max_position_embeddings``;
``llama3`` and ``longrope`` configs already name the stretched length in
``max_position_embeddings`` (and Gemma 3's is already scaled), so it is kept. A LongRoPE
model defaults to its ``original_max_position_embeddings`` (its short factors, vLLM's
default too); every other model to the longest length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

LENGTH_KEYS = (
    "max_position_embeddings",  # OPT, Llama and most others
    "n_positions",  # GPT-2
    "max_seq_len",  # MPT
    "seq_length",  # ChatGLM2
    "model_max_length",  # Command-R
    "max_target_positions",  # Whisper
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
DEFAULT_LENGTH = 2048  # vLLM's assumption for a config without any length key
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")  # max_position_embeddings is already long

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContextLength:
    """The longest ``max_model_len`` a config allows and its default."""

    longest: int
    default: int
    source: str  # how ``longest`` was derived, e.g. "max_position_embeddings=64 x 2.0 (linear)"
    configured: int  # the config's own length, before rope scaling

    def resolve(self, requested: int | None) -> int:
        """``requested`` (``--max-model-len``) when the model allows it, else a ValueError."""
        if requested is None:
            return self.default
        if requested > self.longest:
            raise ValueError(
                f"max_model_len {requested} exceeds the model's limit of {self.longest} "
                f"({self.source} in config.json); a RoPE model can go further with rope "
                "scaling, e.g. --hf-overrides "
                '\'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
                f'"original_max_position_embeddings": {self.configured}}}}}\''
            )
        return requested


def context_length_of(raw: dict, rope: dict) -> ContextLength:
    """``raw``: the (text) config.json's fields; ``rope``: its full-attention rope settings
    (``rope_parameters.rope_parameters_for``)."""
    configured, source = configured_length(raw)
    length: float = configured
    if "gemma3" not in str(raw.get("model_type", "")):
        length, source = _rope_scaled(configured, source, rope)
    longest = int(length)
    default = longest
    if rope.get("rope_type") == "longrope":
        original = raw.get("original_max_position_embeddings")
        default = int(original or rope.get("original_max_position_embeddings") or longest)
    return ContextLength(longest, min(default, longest), source, configured)


def configured_length(raw: dict) -> tuple[int, str]:
    """The smallest length key's value (``model_max_length`` wins), with its name."""
    found = {key: raw[key] for key in LENGTH_KEYS if raw.get(key) is not None}
    if raw.get("model_max_length"):
        return int(raw["model_max_length"]), f"model_max_length={raw['model_max_length']}"
    if not found:
        logger.warning(
            "config.json names none of %s: assuming %d positions", LENGTH_KEYS, DEFAULT_LENGTH
        )
        return DEFAULT_LENGTH, f"no length key: {DEFAULT_LENGTH} assumed"
    key = min(found, key=lambda name: found[name])
    return int(found[key]), f"{key}={found[key]}"


def _rope_scaled(length: float, source: str, rope: dict) -> tuple[float, str]:
    rope_type = rope.get("rope_type", "default")
    factor = rope.get("factor")
    if rope_type in UNSCALED_ROPE_TYPES or factor is None:
        return length, source
    if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
        original = rope["original_max_position_embeddings"]
        source = f"original_max_position_embeddings={original}"
        length = original
    return length * float(factor), f"{source} x rope factor {factor} ({rope_type})"
