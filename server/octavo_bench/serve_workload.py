"""Seeded synthetic prompts and Poisson arrival times for ``python -m octavo_bench serve``.

Prompts are random sequences of common English words. Each word is one token for the
usual BPE tokenizers (Llama, SmolLM2, Qwen, GPT-2 style) when preceded by a space, so
``input_len`` words give roughly ``input_len`` prompt tokens on any server, and no
client-side tokenizer is needed. The exact prompt sizes come back in the server's usage.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

_WORD_TEXT = (
    "the time people year way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money story "
    "fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office "
    "door health person art war history party result change morning reason research girl "
    "guy moment air teacher force education river garden music market paper table window "
    "light road field summer winter letter picture station island bridge forest mountain "
    "village doctor report season animal planet engine signal answer travel dinner "
    "color voice energy figure cloud stone horse train ocean silver green"
)
WORDS = list(dict.fromkeys(_WORD_TEXT.split()))  # unique, in order: seeded draws stay stable


@dataclass(frozen=True)
class LengthRange:
    """An inclusive range of lengths; ``low == high`` for a fixed length."""

    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True)
class PromptSpec:
    """One benchmark request: the prompt text and how many tokens to ask for."""

    text: str
    input_words: int
    max_tokens: int


def parse_length(text: str) -> LengthRange:
    """An argparse type: ``128`` or an inclusive range ``64:256`` (both >= 1)."""
    low_text, _, high_text = text.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if high_text else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LOW:HIGH, got {text!r}") from None
    if low < 1 or high < low:
        raise argparse.ArgumentTypeError(f"need 1 <= LOW <= HIGH, got {text!r}")
    return LengthRange(low, high)


def build_prompts(
    count: int, input_len: LengthRange, output_len: LengthRange, seed: int
) -> list[PromptSpec]:
    """``count`` seeded prompts; the same arguments always give the same prompts."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        words = input_len.draw(rng)
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        prompts.append(PromptSpec(text, words, output_len.draw(rng)))
    return prompts


def arrival_times(count: int, request_rate: float, seed: int) -> list[float]:
    """Send times (s after the start) of ``count`` requests arriving as a Poisson process.

    Gaps are exponential with mean ``1 / request_rate``; the first request leaves at 0.
    An infinite rate sends every request at once.
    """
    if count <= 0:
        return []
    if math.isinf(request_rate):
        return [0.0] * count
    if not request_rate > 0:
        raise ValueError(f"request rate must be > 0, got {request_rate}")
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + rng.expovariate(request_rate))
    return times


def level_seed(seed: int, concurrency: int) -> int:
    """A distinct, reproducible seed per concurrency level (so levels share no prompts)."""
    return seed * 1_000_003 + concurrency
