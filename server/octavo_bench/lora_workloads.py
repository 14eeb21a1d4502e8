"""The multi-LoRA benchmark's inputs: chat prompts of about ``num_tokens`` tokens, one per
user, and PEFT adapters of the base model made here with peft (seeded random A and B, so
every adapter's delta is non-zero and different), spread over the users round-robin."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from octavo import LoRARequest
from octavo_bench.workloads import SYSTEM_WORDS, TOPICS, chat_prompt

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def user_prompts(tokenizer, count: int, num_tokens: int, seed: int = 11) -> list[list[int]]:
    """``count`` different chat prompts of about ``num_tokens`` tokens each (template
    included), each asking about a topic after a seeded note of filler words."""
    rng = random.Random(seed)
    template = len(chat_prompt(tokenizer, ""))
    prompts = []
    for index in range(count):
        question = f"User {index}: what does this note say about {TOPICS[index % len(TOPICS)]}?"
        budget = num_tokens - template - len(tokenizer.encode(question))
        prompts.append(chat_prompt(tokenizer, f"{question}\n{_note(tokenizer, rng, budget)}"))
    return prompts


def _note(tokenizer, rng: random.Random, num_tokens: int) -> str:
    """Seeded filler words, cut to at most ``num_tokens`` tokens (empty when none fit)."""
    if num_tokens <= 0:
        return ""
    words = " ".join(rng.choice(SYSTEM_WORDS + TOPICS) for _ in range(num_tokens))
    return tokenizer.decode(tokenizer.encode(words, add_special_tokens=False)[:num_tokens])


def make_adapters(
    base_folder: Path, target: Path, count: int, rank: int = 16, alpha: int = 32
) -> list[Path]:
    """``count`` PEFT adapter folders of ``base_folder`` under ``target`` (adapter-0, ...):
    one peft model, its LoRA weights re-drawn from seed ``i`` before each save."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=TARGET_MODULES,
        init_lora_weights=False,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    folders = []
    for index in range(count):
        _randomise(peft_model, seed=index, bound=1.0 / rank)
        folders.append(target / f"adapter-{index}")
        peft_model.save_pretrained(folders[-1])
    return folders


def _randomise(peft_model, seed: int, bound: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:  # A and B both non-zero: a real delta
                parameter.uniform_(-bound, bound, generator=generator)


def round_robin(folders: list[Path], num_users: int) -> list[LoRARequest | None]:
    """User ``i`` gets adapter ``i % len(folders)``; no folders: every user the base model."""
    if not folders:
        return [None] * num_users
    requests = [LoRARequest(f"adapter-{i}", i + 1, str(folder)) for i, folder in enumerate(folders)]
    return [requests[user % len(requests)] for user in range(num_users)]
