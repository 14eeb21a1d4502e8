"""What `octavo_bench gpu` times on one engine: decode steps at batch 1 and 32 (marginal
step time: two runs of different lengths, so prefill and start-up cancel), the GPU's own
kernel time per step (torch.profiler, host overhead visible beside it), nano-vllm's offline
shape, the copy bandwidth behind the roofline, and HF ``generate`` as the baseline."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import torch

from octavo_bench.baselines import HFBatch, left_padded, load_hf

_seeds = count(1)  # every run draws fresh prompts: no prefix-cache hit between two runs


@dataclass(frozen=True)
class DecodeTiming:
    tok_s: float  # output tokens per second of the full run (prefill included)
    step_ms: float  # one decode step: (full run - short run) / (steps between them)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_device_memory() -> None:
    """What a released engine held goes back to the device (between two engine builds)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def copy_bandwidth(device: torch.device, size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    synchronize(device)
    return 2 * size * repeats / (time.perf_counter() - start)


def prompts_of(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, min(vocab, 30000), (count, length), generator=generator)
    return ids.tolist()


def timed_generate(llm, prompts: list[list[int]], params) -> tuple[float, int]:
    """Wall seconds of one ``generate`` and the output tokens it made."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    return wall, sum(len(out.outputs[0].token_ids) for out in outputs)


def decode_timing(llm, batch: int, prompt_len: int, max_tokens: int) -> DecodeTiming:
    """``batch`` prompts of ``prompt_len`` random ids, greedy, ``ignore_eos`` (a warm-up
    run first: the first steps of a batch size compile or allocate)."""
    vocab = llm.engine.vocab_size
    short = max(1, max_tokens // 8)
    timed_generate(llm, prompts_of(batch, prompt_len, vocab, next(_seeds)), _greedy(short))
    short_s, _ = timed_generate(
        llm, prompts_of(batch, prompt_len, vocab, next(_seeds)), _greedy(short)
    )
    full_s, tokens = timed_generate(
        llm, prompts_of(batch, prompt_len, vocab, next(_seeds)), _greedy(max_tokens)
    )
    step_ms = 1000.0 * (full_s - short_s) / max(1, max_tokens - short)
    return DecodeTiming(tokens / full_s, step_ms)


def _greedy(tokens: int):
    from octavo import SamplingParams

    return SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)


def gpu_ms_per_step(llm, prompt_len: int, steps: int = 32) -> float | None:
    """Kernel time of one batch-1 decode step on the GPU (torch.profiler's CUDA activity:
    kernels and copies, not the host's gaps between them); None off CUDA. Prints the
    kernels that take the most of it (ms and launches per step)."""
    if llm.engine.parts.device.type != "cuda":
        return None
    short = kernel_times(llm, prompt_len, 4)
    long = kernel_times(llm, prompt_len, 4 + steps)
    print_top_kernels(long, short, steps)
    return (sum(us for us, _ in long.values()) - sum(us for us, _ in short.values())) / (
        1000.0 * steps
    )


def kernel_times(llm, prompt_len: int, tokens: int) -> dict[str, tuple[float, int]]:
    """Each CUDA kernel's (or copy's) name -> (microseconds, launches) over one generate."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    prompts = prompts_of(1, prompt_len, llm.engine.vocab_size, next(_seeds))
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        llm.generate(prompts, _greedy(tokens), use_tqdm=False)
        torch.cuda.synchronize()
    times: dict[str, tuple[float, int]] = {}
    for event in profiler.events():
        if event.device_type == DeviceType.CUDA:
            us, calls = times.get(event.name, (0.0, 0))
            times[event.name] = (us + event.time_range.elapsed_us(), calls + 1)
    return times


def print_top_kernels(long: dict, short: dict, steps: int, top: int = 15) -> None:
    """The kernels of the marginal steps (``long`` minus ``short``), most time first."""
    rows = []
    for name, (us, calls) in long.items():
        short_us, short_calls = short.get(name, (0.0, 0))
        rows.append(((us - short_us) / steps / 1000.0, (calls - short_calls) / steps, name))
    rows.sort(reverse=True)
    print(f"top kernels of a batch-1 decode step ({len(rows)} kernel names):")
    for ms, calls, name in rows[:top]:
        print(f"  {ms:8.4f} ms  {calls:6.1f}x  {name[:110]}")
    total_calls = sum(calls for _, calls, _ in rows)
    print(f"  launches per step: {total_calls:.1f}")


@dataclass(frozen=True)
class OfflineShape:
    """nano-vllm's bench.py: ``seqs`` requests, random ids, prompt and output lengths
    uniform in [low, high] (seeded), temperature 0.6, ``ignore_eos``."""

    seqs: int = 256
    low: int = 100
    high: int = 1024
    seed: int = 0


def offline_workload(llm, shape: OfflineShape) -> tuple[list[list[int]], list]:
    """nano-vllm's prompts (random ids) and sampling parameters, after a short warm-up."""
    from octavo import SamplingParams

    generator = torch.Generator().manual_seed(shape.seed)

    def lengths() -> list[int]:
        drawn = torch.randint(shape.low, shape.high + 1, (shape.seqs,), generator=generator)
        return drawn.tolist()

    vocab = min(llm.engine.vocab_size, 10000)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths()]
    params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True) for n in lengths()]
    llm.generate(prompts_of(1, 16, vocab, next(_seeds)), _greedy(4), use_tqdm=False)
    return prompts, params


def offline_tok_s(llm, shape: OfflineShape) -> float:
    """Output tokens per second of nano-vllm's offline workload (after a short warm-up)."""
    wall, tokens = timed_generate(llm, *offline_workload(llm, shape))
    return tokens / wall


def hf_tok_s(folder: Path, dtype: torch.dtype, device: torch.device, batch: HFBatch) -> float:
    model = load_hf(folder, dtype, device)
    ids, mask = (t.to(device) for t in left_padded(batch.prompts, 0))
    settings = dict(do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **settings)
        synchronize(device)
        start = time.perf_counter()
        length = batch.max_new_tokens
        out = model.generate(ids, max_new_tokens=length, min_new_tokens=length, **settings)
        synchronize(device)
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - start)
