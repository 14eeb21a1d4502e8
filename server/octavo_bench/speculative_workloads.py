"""Workloads for the speculative-decoding benchmark: input-grounded and free generation.

Input-grounded: chat prompts that hand the model a paragraph and ask it to copy it with
a small edit, so the answer quotes the prompt (what prompt lookup is built for). Free:
open-ended stories, where the output rarely repeats the prompt. Greedy; grounded answers
end at EOS (both engines emit the same tokens, so tok/s compare), stories run to
``max_tokens``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from octavo_bench.workloads import TOPICS, chat_prompt

SENTENCES = (
    "The operator watches InferenceService objects and writes their status back.",
    "Each replica serves the model on port 8000 behind a ClusterIP service.",
    "Prefix caching lets requests that share a system prompt reuse its KV blocks.",
    "The scheduler admits waiting requests while the token budget allows.",
    "Autoscaling follows the number of running requests reported by the metrics.",
    "A pod disruption budget keeps one replica serving during node drains.",
    "Weights are downloaded once into the cache volume and shared by restarts.",
    "Streaming responses send one server-sent event for every batch of new tokens.",
    "Preempted sequences give their blocks back and are recomputed later.",
    "The health endpoint answers only once the model has finished loading.",
)
EDITS = (
    "Fix any typos and keep everything else exactly the same",
    "Copy it exactly, but replace the word 'the' with 'this' where it starts a sentence",
    "Repeat it word for word as a numbered list, one sentence per line",
)


@dataclass
class SpecWorkload:
    name: str  # "grounded" or "free"
    prompts: list[list[int]]
    max_tokens: int
    ignore_eos: bool


def grounded_workload(tokenizer, count: int, max_tokens: int, seed: int = 7) -> SpecWorkload:
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        paragraph = " ".join(rng.sample(SENTENCES, 4))
        task = EDITS[index % len(EDITS)]
        prompts.append(chat_prompt(tokenizer, f"{task}:\n\n{paragraph}"))
    return SpecWorkload("grounded", prompts, max_tokens, ignore_eos=False)


def free_workload(tokenizer, count: int, max_tokens: int) -> SpecWorkload:
    prompts = [
        chat_prompt(tokenizer, f"Write a short story about {TOPICS[i % len(TOPICS)]}.")
        for i in range(count)
    ]
    return SpecWorkload("free", prompts, max_tokens, ignore_eos=True)
