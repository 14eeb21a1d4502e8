"""Running the vision workloads through Octavo (offline ``LLM.generate`` with
``multi_modal_data``) and through HF ``generate``, timed the same way.

A throughput workload is one timed call over all its requests: Octavo gets them as one
batch; HF runs them one at a time (``generate`` on a batch of prompts with different
image counts means padded ``pixel_values`` and left padding the processor does not do for
Qwen2.5-VL; one at a time is how a plain HF script serves images). A TTFT workload times
each request alone with ``max_tokens=1``; the HF processor runs inside every timed call,
on every engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from octavo import LLM, SamplingParams
from octavo.model_executor.image_embeds import EncoderCache
from octavo_bench.report import HF, OCTAVO
from octavo_bench.vision_report import VisionResult
from octavo_bench.vision_workloads import THROUGHPUT, VisionWorkload

# (workload, the indices of the requests to run) -> output tokens made
Generate = Callable[[VisionWorkload, list[int]], int]


def request_groups(workload: VisionWorkload) -> list[list[int]]:
    """Throughput: all requests in one timed call; TTFT: each request alone."""
    indices = list(range(workload.num_requests))
    return [indices] if workload.kind == THROUGHPUT else [[index] for index in indices]


def measure(engine: str, workload: VisionWorkload, generate: Generate) -> VisionResult:
    seconds, tokens = [], 0
    for group in request_groups(workload):
        start = time.perf_counter()
        tokens += generate(workload, group)
        seconds.append(time.perf_counter() - start)
    result = VisionResult(
        engine,
        workload.name,
        workload.kind,
        workload.num_requests,
        workload.images_per_request,
        seconds,
        tokens,
    )
    report_progress(result)
    return result


def report_progress(result: VisionResult) -> None:
    if result.kind == THROUGHPUT:
        seconds = result.seconds[0]
        what = f"{result.num_requests} requests in {seconds:.2f} s = {result.value:.2f} req/s"
    else:
        what = f"TTFT median {result.value:.0f} ms over {result.num_requests} requests"
    print(f"{result.engine} ({result.workload}): {what}", flush=True)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)


def octavo_generate(llm: LLM) -> Generate:
    def generate(workload: VisionWorkload, indices: list[int]) -> int:
        prompts = [
            {"prompt": workload.prompts[i], "multi_modal_data": {"image": workload.images[i]}}
            for i in indices
        ]
        outputs = llm.generate(prompts, greedy(workload.max_tokens), use_tqdm=len(indices) > 1)
        return sum(len(output.outputs[0].token_ids) for output in outputs)

    return generate


def run_octavo(
    llm: LLM, workloads: list[VisionWorkload], warmup: VisionWorkload
) -> tuple[list[VisionResult], dict[str, dict[str, int]]]:
    """Each workload's result after the untimed warm-up, and the encoder cache's hits and
    misses during each (empty when the engine's runner is in other processes)."""
    generate = octavo_generate(llm)
    generate(warmup, list(range(warmup.num_requests)))
    cache = encoder_cache(llm)
    results, cache_use = [], {}
    for workload in workloads:
        before = (cache.hits, cache.misses) if cache is not None else (0, 0)
        results.append(measure(OCTAVO, workload, generate))
        if cache is not None:
            cache_use[workload.name] = {
                "hits": cache.hits - before[0],
                "misses": cache.misses - before[1],
            }
    return results, cache_use


def encoder_cache(llm: LLM) -> EncoderCache | None:
    """The in-process model runner's encoder cache, or None."""
    worker = getattr(llm.engine.executor, "worker", None)
    runner = getattr(worker, "runner", None)
    return getattr(runner, "encoder_cache", None)


def hf_generate(folder: Path, dtype: str) -> Generate:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=getattr(torch, dtype))
    model.eval()
    pad_id = model.generation_config.eos_token_id

    def one(text: str, images: list, max_tokens: int) -> int:
        inputs = processor(text=[text], images=images, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
        return out.shape[1] - inputs["input_ids"].shape[1]

    def generate(workload: VisionWorkload, indices: list[int]) -> int:
        return sum(
            one(workload.prompts[i], workload.images[i], workload.max_tokens) for i in indices
        )

    return generate


def run_hf(
    folder: Path, dtype: str, workloads: list[VisionWorkload], warmup: VisionWorkload
) -> list[VisionResult]:
    generate = hf_generate(folder, dtype)
    generate(warmup, list(range(warmup.num_requests)))
    return [measure(HF, workload, generate) for workload in workloads]
