"""The multi-tenant workload of ``python -m octavo_bench routed``.

Each tenant (an application) has its own long system prompt; many users of each tenant
send a short question after it. Requests of all tenants arrive interleaved (seeded
shuffle), so a router that keeps each tenant on the replica holding its prompt's KV
blocks prefills each system prompt about once, while round-robin spreads every tenant
over every replica and prefills each prompt once per replica (or more, after eviction).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from octavo_bench.serve_workload import PromptSpec

WORDS = (
    "account",
    "answer",
    "archive",
    "balance",
    "billing",
    "branch",
    "budget",
    "cache",
    "catalog",
    "channel",
    "claim",
    "client",
    "cluster",
    "contract",
    "credit",
    "customer",
    "delivery",
    "deposit",
    "device",
    "discount",
    "document",
    "engine",
    "invoice",
    "ledger",
    "license",
    "market",
    "member",
    "network",
    "order",
    "payment",
    "policy",
    "pricing",
    "product",
    "profile",
    "quota",
    "record",
    "refund",
    "region",
    "renewal",
    "report",
    "route",
    "schedule",
    "service",
    "session",
    "storage",
    "supplier",
    "support",
    "ticket",
    "transfer",
    "vendor",
    "warranty",
    "workflow",
)


@dataclass(frozen=True)
class TenantWorkload:
    tenants: int = 8
    users_per_tenant: int = 12
    system_words: int = 300  # about 1.3 tokens a word with SmolLM2's tokenizer
    question_words: int = 12
    max_tokens: int = 16
    seed: int = 0


def system_prompt(tenant: int, words: int, rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"You are the assistant of tenant {tenant}. Company handbook: {body}."


def tenant_prompts(workload: TenantWorkload) -> list[tuple[int, PromptSpec]]:
    """(tenant, prompt) for every request, in arrival order."""
    rng = random.Random(workload.seed)
    systems = [system_prompt(t, workload.system_words, rng) for t in range(workload.tenants)]
    requests = []
    for tenant, system in enumerate(systems):
        for user in range(workload.users_per_tenant):
            question = " ".join(rng.choice(WORDS) for _ in range(workload.question_words))
            text = f"{system}\n\nUser {user}: {question}?\nAssistant:"
            words = len(text.split())
            requests.append((tenant, PromptSpec(text, words, workload.max_tokens)))
    rng.shuffle(requests)
    return requests
