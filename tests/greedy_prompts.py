"""The prompts and the batch run shared by the greedy token-identity tests: eight prompts
of mixed lengths (one longer than a small step budget, so its prefill is chunked)."""

from __future__ import annotations

from octavo import LLM, SamplingParams

MAX_NEW_TOKENS = 20
TOPICS = ["PagedAttention", "a cat", "Kubernetes", "the moon", "rust", "tea", "jazz", "GPUs"]


def mixed_prompts(tokenizer) -> list[list[int]]:
    prompts = []
    for index, topic in enumerate(TOPICS):
        question = f"Tell me about {topic}." + " Please explain it in detail." * (index * 7)
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text))
    return prompts


def run_batch(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
