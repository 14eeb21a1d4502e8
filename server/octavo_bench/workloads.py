"""Seeded, tokenized workloads for the offline benchmark.

Every prompt is a list of token ids, built once up front, so that Octavo and every
baseline see exactly the same input. ``scale`` shrinks request counts and lengths for
quick runs (``scale=1.0`` is the workload the issue describes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORKLOAD_NAMES = ("a", "b", "c", "d", "e", "f")
DEFAULT_SEED = 1234

TOPICS = (
    "photosynthesis",
    "a black hole",
    "the Roman Empire",
    "machine learning",
    "a volcano",
    "the stock market",
    "quantum entanglement",
    "the French Revolution",
    "a neural network",
    "plate tectonics",
    "the immune system",
    "inflation",
    "a compiler",
    "the water cycle",
    "democracy",
    "DNA",
    "the Renaissance",
    "a blockchain",
    "climate change",
    "gravity",
    "the Silk Road",
    "an operating system",
    "vaccination",
    "the Pythagorean theorem",
    "jazz",
    "a supernova",
    "supply and demand",
    "the printing press",
    "a rainbow",
    "the Internet",
    "evolution",
    "the Great Wall of China",
    "a hash table",
    "electricity",
)

QUESTIONS = (
    "How do I reset my password?",
    "What are your opening hours?",
    "Can I get a refund?",
    "How long does shipping take?",
    "Do you ship abroad?",
    "How do I cancel my order?",
    "Is there a student discount?",
    "Where is my parcel?",
    "Can I change my address?",
    "Which payment methods do you accept?",
    "How do I contact support?",
    "Do you offer gift cards?",
    "Can I return a used item?",
    "How do I track an order?",
    "Is my data stored securely?",
    "Can I pick up in store?",
)

SYSTEM_WORDS = (
    "customer",
    "order",
    "refund",
    "policy",
    "shipping",
    "account",
    "support",
    "product",
    "warranty",
    "delivery",
    "payment",
    "invoice",
    "discount",
    "return",
    "exchange",
    "store",
    "always",
    "never",
    "politely",
    "clearly",
    "within",
    "business",
    "days",
    "agent",
    "must",
    "should",
    "please",
    "verify",
    "identity",
    "before",
    "sharing",
    "details",
    "escalate",
    "manager",
    "complaint",
    "response",
    "friendly",
    "concise",
    "accurate",
    "information",
)


@dataclass
class Workload:
    """A named batch of requests: token-id prompts and the exact number of tokens each wants."""

    name: str
    description: str
    prompts: list[list[int]]
    max_tokens: list[int]
    warmup_prompt: list[int] | None = None  # run untimed first (e.g. to fill a prefix cache)

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def total_output_tokens(self) -> int:
        return sum(self.max_tokens)

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(len(prompt) for prompt in self.prompts) / len(self.prompts)

    @property
    def mean_total_tokens(self) -> float:
        """Mean final length (prompt + output) of a sequence of this workload."""
        return self.mean_prompt_tokens + self.total_output_tokens / len(self.prompts)

    def summary(self) -> dict:
        return {
            "description": self.description,
            "num_requests": self.num_requests,
            "mean_prompt_tokens": round(self.mean_prompt_tokens, 1),
            "max_prompt_tokens": max(len(prompt) for prompt in self.prompts),
            "total_output_tokens": self.total_output_tokens,
            "mean_total_tokens": round(self.mean_total_tokens, 1),
        }


def scaled(value: int, scale: float, minimum: int = 1) -> int:
    """``value * scale`` rounded, never below ``minimum``."""
    return max(minimum, round(value * scale))


def chat_prompt(tokenizer, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn conversation rendered with the tokenizer's chat template."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": user})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def chat_workload(tokenizer, scale: float) -> Workload:
    """(a) 32 chat-templated "What is <topic>?" prompts, exactly 128 new tokens each."""
    count, new_tokens = scaled(32, scale, 2), scaled(128, scale, 2)
    prompts = [
        chat_prompt(tokenizer, f"What is {TOPICS[i % len(TOPICS)]}? Explain it simply.")
        for i in range(count)
    ]
    return Workload(
        "a",
        f"{count} chat prompts x {new_tokens} new tokens (greedy, ignore_eos)",
        prompts,
        [new_tokens] * count,
    )


def sampleable_token_ids(tokenizer) -> list[int]:
    """Every id of the tokenizer except its special tokens."""
    special = set(tokenizer.all_special_ids)
    return [token for token in range(len(tokenizer)) if token not in special]


def mixed_workload(tokenizer, scale: float, seed: int = DEFAULT_SEED) -> Workload:
    """(b) 64 requests, random-token prompts of 16-512 tokens, 16-256 new tokens (seeded)."""
    rng = random.Random(seed)
    count = scaled(64, scale, 2)
    prompt_lo, output_lo = scaled(16, scale), scaled(16, scale)
    prompt_hi, output_hi = scaled(512, scale, prompt_lo), scaled(256, scale, output_lo)
    vocabulary = sampleable_token_ids(tokenizer)
    prompts, max_tokens = [], []
    for _ in range(count):
        length = rng.randint(prompt_lo, prompt_hi)
        prompts.append([rng.choice(vocabulary) for _ in range(length)])
        max_tokens.append(rng.randint(output_lo, output_hi))
    description = (
        f"{count} requests, prompts {prompt_lo}-{prompt_hi} tokens, "
        f"outputs {output_lo}-{output_hi} tokens (seed {seed})"
    )
    return Workload("b", description, prompts, max_tokens)


def single_stream_workload(tokenizer, scale: float) -> Workload:
    """(c) one chat prompt, exactly 128 new tokens: single-stream decode speed."""
    new_tokens = scaled(128, scale, 2)
    prompt = chat_prompt(tokenizer, "Write a short story about a lighthouse keeper.")
    return Workload("c", f"1 stream x {new_tokens} new tokens", [prompt], [new_tokens])


def system_prompt_text(tokenizer, num_tokens: int, seed: int = DEFAULT_SEED) -> str:
    """A seeded pseudo-policy text of about ``num_tokens`` tokens (cut at a word boundary)."""
    rng = random.Random(seed)
    words = ["You are a support agent for Octavo Stores."]
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < num_tokens:
        sentence = " ".join(rng.choice(SYSTEM_WORDS) for _ in range(rng.randint(6, 14)))
        words.append(sentence.capitalize() + ".")
    text = " ".join(words)
    ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids).rsplit(" ", 1)[0]


def shared_prefix_workload(tokenizer, scale: float, seed: int = DEFAULT_SEED) -> Workload:
    """(d) 64 requests sharing a ~1,000-token system prompt, each with its own question.

    ``warmup_prompt`` (one more question with the same system prompt) is run untimed
    first so the timed requests measure cache hits; the timed ones are submitted together.
    """
    count, new_tokens = scaled(64, scale, 2), scaled(32, scale, 2)
    system = system_prompt_text(tokenizer, scaled(1000, scale, 32), seed)
    prompts = [
        chat_prompt(tokenizer, f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}", system)
        for i in range(count + 1)
    ]
    shared = common_prefix_length(prompts)
    description = f"{count} requests sharing a {shared}-token prefix, {new_tokens} new tokens each"
    return Workload("d", description, prompts[1:], [new_tokens] * count, prompts[0])


def long_context_workload(tokenizer, scale: float, seed: int = DEFAULT_SEED) -> Workload:
    """(e) 16 seeded random-token prompts of 1,536 tokens, 256 new tokens each: decode over
    contexts of 1.5-1.8k tokens, where attention reads more than the weights do."""
    rng = random.Random(seed + 5)
    count, length = scaled(16, scale, 2), scaled(1536, scale, 8)
    new_tokens = scaled(256, scale, 2)
    vocabulary = sampleable_token_ids(tokenizer)
    prompts = [[rng.choice(vocabulary) for _ in range(length)] for _ in range(count)]
    description = f"{count} requests, {length}-token prompts, {new_tokens} new tokens each"
    return Workload("e", description, prompts, [new_tokens] * count)


def long_stream_workload(tokenizer, scale: float, seed: int = DEFAULT_SEED) -> Workload:
    """(f) one seeded random-token prompt of 6,000 tokens, 128 new tokens: single-stream
    decode over a long context (a long chat or document), where each step reads about half
    as many bytes of cache as of weights (SmolLM2 in fp32) and one sequence must keep every
    thread busy."""
    rng = random.Random(seed + 6)
    length, new_tokens = scaled(6000, scale, 8), scaled(128, scale, 2)
    vocabulary = sampleable_token_ids(tokenizer)
    prompt = [rng.choice(vocabulary) for _ in range(length)]
    return Workload(
        "f", f"1 stream, {length}-token prompt, {new_tokens} new tokens", [prompt], [new_tokens]
    )


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Number of leading tokens all prompts share."""
    shortest = min(len(prompt) for prompt in prompts)
    for index in range(shortest):
        if any(prompt[index] != prompts[0][index] for prompt in prompts):
            return index
    return shortest


BUILDERS = {
    "a": lambda tokenizer, scale, seed: chat_workload(tokenizer, scale),
    "b": mixed_workload,
    "c": lambda tokenizer, scale, seed: single_stream_workload(tokenizer, scale),
    "d": shared_prefix_workload,
    "e": long_context_workload,
    "f": long_stream_workload,
}


def build_workloads(
    tokenizer, names: list[str], scale: float, seed: int = DEFAULT_SEED
) -> dict[str, Workload]:
    """The named workloads, in the order given."""
    return {name: BUILDERS[name](tokenizer, scale, seed) for name in names}
