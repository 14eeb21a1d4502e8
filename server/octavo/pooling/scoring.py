"""Scoring text pairs with a pooling model, shared by ``/score``, ``/rerank`` and ``LLM.score``.

A cross-encoder (a sequence classifier with one label) reads each pair as one prompt, the
tokenizer's pair encoding (``[CLS] a [SEP] b [SEP]`` with token types 0 then 1); its logit
goes through a sigmoid, as sentence-transformers' ``CrossEncoder`` does by default. A
bi-encoder (an embedding model) embeds each text on its own and scores a pair by the cosine
of the two vectors (vLLM's behaviour). One first text is paired with every second text;
several are zipped with the second texts (the counts must match).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from octavo.pooling.params import PoolingParams


class ScoringInputError(ValueError):
    """Bad scoring input; ``param`` names the request field it is about."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ScorePrompt:
    """One prompt to pool: its token ids and, for a BERT pair, its token types."""

    token_ids: list[int]
    token_type_ids: tuple[int, ...] | None = None

    def pooling_params(self) -> PoolingParams:
        return PoolingParams(token_type_ids=self.token_type_ids)


@dataclass(frozen=True)
class ScoringPlan:
    """The prompts that score ``pair_count`` pairs and how their vectors become scores."""

    prompts: list[ScorePrompt]
    cross_encoder: bool
    first_count: int  # bi-encoder: the first texts' prompts come first, then the second's
    pair_count: int

    def pair_prompt_index(self, pair: int) -> int:
        """The prompt that stands for a pair: its own, or a bi-encoder's second text."""
        return pair if self.cross_encoder else self.first_count + pair

    def scores(self, vectors: Sequence[Sequence[float]]) -> list[float]:
        """One score per pair from the pooled vectors of ``prompts`` (same order)."""
        if self.cross_encoder:
            return [cross_encoder_score(vector) for vector in vectors]
        firsts, seconds = vectors[: self.first_count], vectors[self.first_count :]
        return [
            cosine_similarity(firsts[0 if self.first_count == 1 else index], seconds[index])
            for index in range(self.pair_count)
        ]


def as_texts(value: str | Sequence[str], param: str) -> list[str]:
    """One text or a non-empty list of texts."""
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise ScoringInputError(f"{param} must not be empty", param)
    if not all(isinstance(text, str) for text in texts):
        raise ScoringInputError(f"{param} must be a string or a list of strings", param)
    return texts


def check_pair_counts(firsts: list[str], seconds: list[str], names: tuple[str, str]) -> None:
    """One first text goes with every second one; several must match them one to one."""
    if len(firsts) != 1 and len(firsts) != len(seconds):
        raise ScoringInputError(
            f"{names[0]} has {len(firsts)} texts and {names[1]} {len(seconds)}: give one "
            f"{names[0]}, or as many as {names[1]}",
            names[0],
        )


def truncation_limit(value: int | None, max_model_len: int) -> int | None:
    """``truncate_prompt_tokens``: None (refuse long prompts), -1 (the context) or 1..context."""
    if value is None:
        return None
    if value == -1:
        return max_model_len
    if value < 1 or value > max_model_len:
        raise ScoringInputError(
            f"truncate_prompt_tokens must be -1 or in [1, {max_model_len}], got {value}",
            "truncate_prompt_tokens",
        )
    return value


def plan_scores(
    tokenizer,
    firsts: list[str],
    seconds: list[str],
    cross_encoder: bool,
    limit: int | None,
    max_model_len: int,
) -> ScoringPlan:
    """Tokenize every prompt needed to score the pairs (``limit``: ``truncation_limit``'s)."""
    pair_count = len(seconds)
    if cross_encoder:
        pairs = [(firsts[0 if len(firsts) == 1 else i], seconds[i]) for i in range(pair_count)]
        prompts = [
            _encode(tokenizer, (first, second), limit, max_model_len, f"pair {index}")
            for index, (first, second) in enumerate(pairs)
        ]
    else:
        texts = [*firsts, *seconds]
        prompts = [
            _encode(tokenizer, (text,), limit, max_model_len, f"text {index}")
            for index, text in enumerate(texts)
        ]
    return ScoringPlan(prompts, cross_encoder, len(firsts), pair_count)


def _encode(
    tokenizer, texts: tuple[str, ...], limit: int | None, max_model_len: int, what: str
) -> ScorePrompt:
    truncation = {"truncation": True, "max_length": limit} if limit is not None else {}
    encoded = tokenizer(*texts, **truncation)
    token_ids = list(encoded["input_ids"])
    if len(token_ids) > max_model_len:
        raise ScoringInputError(
            f"{what} has {len(token_ids)} tokens, more than this model's max_model_len of "
            f"{max_model_len}; shorten it or set truncate_prompt_tokens",
            "truncate_prompt_tokens",
        )
    types = encoded.get("token_type_ids")
    return ScorePrompt(token_ids, tuple(types) if types is not None and len(texts) > 1 else None)


def cross_encoder_score(logits: Sequence[float]) -> float:
    """A one-label cross-encoder's relevance: the sigmoid of its logit."""
    if len(logits) != 1:
        raise ScoringInputError(
            f"scoring needs a cross-encoder with one label; this classifier has {len(logits)} "
            "(use /classify for its class probabilities)",
            "model",
        )
    return sigmoid(logits[0])


def sigmoid(value: float) -> float:
    """1 / (1 + e^-x), without overflow for large negative x."""
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exp = math.exp(value)
    return exp / (1.0 + exp)


def cosine_similarity(first: Sequence[float], second: Sequence[float]) -> float:
    dot = sum(a * b for a, b in zip(first, second, strict=True))
    norms = math.sqrt(sum(a * a for a in first)) * math.sqrt(sum(b * b for b in second))
    return dot / norms if norms else 0.0


def class_probabilities(logits: Sequence[float]) -> list[float]:
    """A classifier's probabilities: softmax over its labels (sigmoid for one label), as
    vLLM's classify."""
    if len(logits) == 1:
        return [sigmoid(logits[0])]
    top = max(logits)
    exps = [math.exp(value - top) for value in logits]
    total = sum(exps)
    return [value / total for value in exps]


def class_label(probs: Sequence[float], labels: Sequence[str]) -> str:
    """The most probable class's name (``id2label``), else its index as text."""
    best = max(range(len(probs)), key=probs.__getitem__)
    return labels[best] if best < len(labels) else str(best)
