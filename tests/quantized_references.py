"""Comparing a quantized model with its float reference over whole greedy sequences.

``greedy_runs`` gives the Octavo engine's greedy tokens and the logprob it gave each one;
``reference_logprobs`` scores the same tokens with HF transformers in fp32 (one
teacher-forced forward pass per sequence); ``reference_greedy`` is HF's own greedy
output; ``forced_torch_path`` runs the engine on the torch path (weights dequantized
exactly, float matmuls) instead of the native integer kernels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from octavo import LLM, SamplingParams
from octavo.kernels import cpu_build

from conftest import hf_greedy


@dataclass(frozen=True)
class GreedyRun:
    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]  # the engine's logprob of each of its tokens


def greedy_runs(folder, prompts: list[str], max_tokens: int, **engine) -> list[GreedyRun]:
    """Octavo greedy decoding (EOS ignored) with each chosen token's logprob, in fp32."""
    engine = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory": 64 << 20, **engine}
    with LLM(str(folder), **engine) as llm:
        return greedy_runs_of(llm, prompts, max_tokens)


def greedy_runs_of(llm: LLM, prompts: list[str], max_tokens: int) -> list[GreedyRun]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [
        GreedyRun(
            list(output.prompt_token_ids),
            list(output.outputs[0].token_ids),
            [entry.logprob for entry in output.outputs[0].logprobs],
        )
        for output in outputs
    ]


def reference_logprobs(model, run: GreedyRun) -> list[float]:
    """The HF model's logprob of each of ``run.tokens`` after the prompt and the tokens
    before it."""
    ids = torch.tensor([run.prompt_ids + run.tokens])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    start = len(run.prompt_ids) - 1  # the row that predicts the first generated token
    rows = torch.log_softmax(logits[start : start + len(run.tokens)], dim=-1)
    return rows.gather(1, torch.tensor(run.tokens).unsqueeze(1)).squeeze(1).tolist()


def largest_logprob_gap(model, runs: list[GreedyRun]) -> float:
    """max |engine logprob - reference logprob| over every token of every run."""
    return max(
        abs(ours - theirs)
        for run in runs
        for ours, theirs in zip(run.logprobs, reference_logprobs(model, run), strict=True)
    )


def reference_greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """HF greedy decoding of exactly ``max_tokens`` tokens (EOS ignored, as the engine)."""
    return hf_greedy(model, prompt_ids, max_tokens, ignore_eos=True)


def hf_float32(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@contextmanager
def forced_torch_path() -> Iterator[None]:
    """The torch path in this process and in worker processes (they inherit the
    variable); the native kernels load again afterwards."""
    os.environ[cpu_build.DISABLE_ENV] = "0"
    cpu_build.use_torch_path()
    try:
        yield
    finally:
        del os.environ[cpu_build.DISABLE_ENV]
        cpu_build.use_torch_path(False)
