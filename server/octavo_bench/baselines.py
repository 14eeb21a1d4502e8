"""The HF transformers baseline (``generate``, in this process); vLLM's is ``vllm_baseline``.

HF runs static, left-padded batches (padded with the EOS id), greedy unless told, with
``min_new_tokens = max_new_tokens`` so every row yields exactly the tokens asked for.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from octavo_bench.report import VLLM, RunResult
from octavo_bench.sampling_choice import GREEDY, SamplingChoice
from octavo_bench.workloads import Workload

HF_BASELINES = {"hf-fp32": torch.float32, "hf-bf16": torch.bfloat16}
ALL_BASELINES = (*HF_BASELINES, VLLM)
HF_WORKLOADS = ("a", "b", "c")  # the throughput workloads the HF baselines run too
VLLM_WORKLOADS = ("a", "b", "c", "e", "f")  # and vLLM's (long contexts too)
HF_MIXED_BATCH = 16  # (b) runs in static batches of this many requests, sorted by length


@dataclass
class HFBatch:
    prompts: list[list[int]]
    max_new_tokens: int
    requested_tokens: int  # what the requests asked for (<= rows * max_new_tokens)


def load_hf(folder: Path, dtype: torch.dtype, device: torch.device | str = "cpu"):
    """HF transformers' model of ``folder`` on ``device``: its checkpoint, or random weights
    made on the device when the folder has only a config (as Octavo's ``--load-format
    dummy``: throughput does not depend on what the weights say)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    with torch.device(device):
        config = AutoConfig.from_pretrained(folder)
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of a batch padded on the left, as HF batching expects."""
    width = max(len(prompt) for prompt in prompts)
    ids = [[pad_id] * (width - len(prompt)) + prompt for prompt in prompts]
    mask = [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts]
    return torch.tensor(ids), torch.tensor(mask)


def hf_generate(model, batch: HFBatch, pad_id: int, sampling: SamplingChoice = GREEDY) -> int:
    """Generate exactly ``batch.max_new_tokens`` tokens per row (greedy unless ``sampling``
    says otherwise); returns tokens made."""
    input_ids, attention_mask = left_padded(batch.prompts, pad_id)
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=batch.max_new_tokens,
            min_new_tokens=batch.max_new_tokens,
            pad_token_id=pad_id,
            **sampling.hf_generate_kwargs(),
        )
    new_tokens = out.shape[1] - input_ids.shape[1]
    if new_tokens != batch.max_new_tokens:
        raise RuntimeError(f"HF generated {new_tokens} tokens, expected {batch.max_new_tokens}")
    return new_tokens * len(batch.prompts)


def hf_batches(workload: Workload) -> list[HFBatch]:
    """(a) and (c): one batch of all requests; (b): batches of 16 sorted by prompt length."""
    pairs = list(zip(workload.prompts, workload.max_tokens, strict=True))
    if workload.name != "b":
        return [HFBatch(workload.prompts, max(workload.max_tokens), workload.total_output_tokens)]
    pairs.sort(key=lambda pair: len(pair[0]))
    chunks = [pairs[i : i + HF_MIXED_BATCH] for i in range(0, len(pairs), HF_MIXED_BATCH)]
    return [
        HFBatch([p for p, _ in chunk], max(n for _, n in chunk), sum(n for _, n in chunk))
        for chunk in chunks
    ]


def run_hf_workload(
    model, workload: Workload, label: str, pad_id: int, sampling: SamplingChoice
) -> RunResult:
    batches = hf_batches(workload)
    generated = 0
    start = time.perf_counter()
    for batch in tqdm(batches, desc=f"{label} {workload.name}", unit="batch", leave=False):
        generated += hf_generate(model, batch, pad_id, sampling)
    wall = time.perf_counter() - start
    note = ""
    if len(batches) > 1:
        note = (
            f"static batches of {HF_MIXED_BATCH} sorted by prompt length; each batch runs to "
            "its longest request, tok/s counts only the requested tokens"
        )
    requested = sum(batch.requested_tokens for batch in batches)
    return RunResult(
        label, workload.name, workload.num_requests, requested, wall, generated, note=note
    )


def run_hf(
    folder: Path,
    label: str,
    workloads: list[Workload],
    warmup_prompt: list[int],
    pad_id: int,
    sampling: SamplingChoice = GREEDY,
) -> list[RunResult]:
    """Load the model in the baseline's dtype, warm up, and time each workload once."""
    model = load_hf(folder, HF_BASELINES[label])
    hf_generate(model, HFBatch([warmup_prompt, warmup_prompt[::-1]], 8, 16), pad_id, sampling)
    results = [run_hf_workload(model, workload, label, pad_id, sampling) for workload in workloads]
    del model
    gc.collect()
    return results
