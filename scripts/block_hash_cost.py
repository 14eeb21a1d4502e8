"""What prefix-cache block hashing costs per engine step, beside the step itself.

Runs ``--batch`` greedy requests (random prompts of ``--prompt-tokens``) for
``--new-tokens`` tokens each on one torch thread and times every ``engine.step()`` and,
inside it, every call of the KV cache manager's hasher (``BlockHasher.extend``: the
blocks that filled). Decode steps are those after every prompt was computed. Times are
the main thread's CPU time (``time.thread_time``: on one thread that is the whole step,
and a shared, busy CPU does not inflate it); wall times are printed beside. Also prints
one block's hash under each algorithm and under the old scheme (Python's ``hash``).

    .venv/bin/python scripts/block_hash_cost.py                # the embedded SmolLM2
    .venv/bin/python scripts/block_hash_cost.py --tiny         # the tests' tiny Llama
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octavo.config import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.kv_cache.block_hash import HASH_ALGOS, BlockHasher, HashChain
from octavo.model_executor.embedded import embedded_model_folder
from octavo.sampling_params import SamplingParams

BLOCK = 16


@dataclass
class TimedHasher:
    """The engine's hasher, with the seconds spent in it added up."""

    inner: BlockHasher
    seconds: float = 0.0  # CPU time of this thread

    def extend(self, chain: HashChain, *args: Any) -> list[bytes]:
        start = time.thread_time()
        try:
            return self.inner.extend(chain, *args)
        finally:
            self.seconds += time.thread_time() - start

    def hash_block(self, *args: Any) -> bytes:
        return self.inner.hash_block(*args)


def tiny_folder(root: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from transformers import AutoTokenizer

    from tiny_models import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    return build_tiny_model(root / "tiny", "llama3", tokenizer)


def measure(folder: Path, algo: str, batch: int, prompt: int, new: int) -> dict[str, float]:
    args = EngineArgs(
        model=str(folder),
        dtype="float32",
        max_num_seqs=batch,
        num_threads=1,
        prefix_caching_hash_algo=algo,
    )
    engine = LLMEngine(args)
    timed = TimedHasher(engine.kv.hasher)
    engine.kv.hasher = timed  # type: ignore[assignment]
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    for index in range(batch):
        tokens = [rng.randrange(100, 20000) for _ in range(prompt)]
        engine.add_request(f"r{index}", tokens, params)
    steps, walls, hashing = [], [], []
    try:
        while engine.has_unfinished_requests():
            prefilling = any(s.num_computed_tokens < s.num_prompt_tokens for s in _running(engine))
            before, start, wall = timed.seconds, time.thread_time(), time.perf_counter()
            engine.step()
            if not prefilling and len(_running(engine)) == batch:
                steps.append(time.thread_time() - start)
                walls.append(time.perf_counter() - wall)
                hashing.append(timed.seconds - before)
    finally:
        engine.shutdown()
    return {
        "decode_steps": len(steps),
        "step_ms": statistics.mean(steps) * 1e3,
        "wall_ms": statistics.mean(walls) * 1e3,
        "hash_us": statistics.mean(hashing) * 1e6,
        "max_hash_us": max(hashing) * 1e6,
        "max_share_pct": 100 * max(h / s for h, s in zip(hashing, steps, strict=True)),
        "share_pct": 100 * sum(hashing) / sum(steps),
    }


def _running(engine: LLMEngine) -> list[Any]:
    return list(engine.scheduler.running) + list(engine.scheduler.waiting)


def one_block_us(algo: str | None, repeats: int = 5000, trials: int = 5) -> float:
    """One block's hash in microseconds (the best of ``trials``: the CPU may be shared)."""
    tokens = tuple(range(1000, 1000 + BLOCK))
    if algo is None:  # the old scheme
        parent: Any = hash((None, tokens))
        run = lambda: hash((parent, tokens))  # noqa: E731
    else:
        hasher = BlockHasher.create(algo)
        parent = hasher.hash_block(None, tokens)
        run = lambda: hasher.hash_block(parent, tokens)  # noqa: E731
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random Llama")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=64)
    options = parser.parse_args()
    for algo in (None, *HASH_ALGOS):
        print(f"one block of {BLOCK} tokens, {algo or 'python hash'}: {one_block_us(algo):.2f} us")
    with tempfile.TemporaryDirectory() as root:
        folder = tiny_folder(Path(root)) if options.tiny else embedded_model_folder()
        for algo in HASH_ALGOS:
            result = measure(folder, algo, options.batch, options.prompt_tokens, options.new_tokens)
            print(
                f"{folder.name} {algo}: batch {options.batch}, {result['decode_steps']} decode "
                f"steps of {result['step_ms']:.2f} ms CPU ({result['wall_ms']:.2f} ms wall); "
                f"hashing {result['hash_us']:.1f} us a step = {result['share_pct']:.3f} % of "
                f"the step; at most {result['max_hash_us']:.1f} us = "
                f"{result['max_share_pct']:.2f} % in one step"
            )


if __name__ == "__main__":
    main()
