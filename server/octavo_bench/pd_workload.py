"""The mixed workload of ``python -m octavo_bench pd``: long prompts and short chats.

Two seeded streams of requests, each arriving as a Poisson process at its own steady
rate, merged by arrival time: **long** requests (a long prompt, a few output tokens: a
document to summarise, a RAG context) and **short** chats (a short prompt, a streamed
reply of a few dozen tokens). Prompts are random common words (about one token each,
``serve_workload``), so the same seed gives the same requests to every setup.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo_bench.serve_workload import LengthRange, PromptSpec, arrival_times, build_prompts

LONG, SHORT = "long", "short"


@dataclass(frozen=True)
class StreamSpec:
    """One kind of request: how many, their sizes and their steady arrival rate."""

    kind: str
    count: int
    prompt_words: int
    max_tokens: int
    rate_per_s: float


@dataclass(frozen=True)
class MixedRequest:
    kind: str  # LONG or SHORT
    prompt: PromptSpec
    at_s: float  # send time, seconds after the run began


def stream_requests(spec: StreamSpec, seed: int) -> list[MixedRequest]:
    """``spec.count`` requests of one kind with their seeded arrival times."""
    words, tokens = (
        LengthRange(spec.prompt_words, spec.prompt_words),
        LengthRange(spec.max_tokens, spec.max_tokens),
    )
    prompts = build_prompts(spec.count, words, tokens, seed)
    times = arrival_times(spec.count, spec.rate_per_s, seed + 1)
    return [MixedRequest(spec.kind, p, t) for p, t in zip(prompts, times, strict=True)]


def mixed_requests(long: StreamSpec, short: StreamSpec, seed: int) -> list[MixedRequest]:
    """Both streams merged by arrival time (distinct seeds: no prompt is shared)."""
    merged = stream_requests(long, seed * 2 + 11) + stream_requests(short, seed * 2 + 12)
    return sorted(merged, key=lambda request: request.at_s)
