"""Running a workload through Octavo's engine step by step, sampling KV use every step."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from octavo import LLM, SamplingParams
from octavo.engine.llm_engine import LLMEngine
from octavo.engine.stats import EngineStats
from octavo.outputs import RequestOutput
from octavo_bench.report import RunResult
from octavo_bench.sampling_choice import GREEDY, SamplingChoice
from octavo_bench.workloads import Workload

_request_ids = itertools.count()


@dataclass
class StepTracker:
    """Per-step samples of KV utilisation (tokens held / slots allocated) and concurrency."""

    utilisation: list[float] = field(default_factory=list)
    peak_running: int = 0

    def sample(self, stats: EngineStats) -> None:
        if stats.kv_cache_slots_allocated > 0:
            self.utilisation.append(stats.kv_cache_tokens_held / stats.kv_cache_slots_allocated)
        self.peak_running = max(self.peak_running, stats.num_running)


def greedy(max_tokens: int) -> SamplingParams:
    """Exactly ``max_tokens`` greedy tokens."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)


def params_for(max_tokens: int, sampling: SamplingChoice) -> SamplingParams:
    """Exactly ``max_tokens`` tokens drawn as ``sampling`` says (seed 0 when greedy; sampled
    requests draw from the engine's RNG, as vLLM's benchmarks' requests do)."""
    if sampling.is_greedy:
        return greedy(max_tokens)
    return SamplingParams(**sampling.fields(), max_tokens=max_tokens, ignore_eos=True)


def warm_up(llm: LLM, prompt: list[int]) -> None:
    """A short untimed generate (2 prompts x 8 tokens) so lazy initialisation is not timed."""
    llm.generate([prompt, prompt[::-1]], greedy(8), use_tqdm=False)


def submit(
    engine: LLMEngine,
    prompts: list[list[int]],
    max_tokens: list[int],
    sampling: SamplingChoice = GREEDY,
) -> None:
    for prompt, count in zip(prompts, max_tokens, strict=True):
        engine.add_request(f"bench-{next(_request_ids)}", prompt, params_for(count, sampling))


def drain(engine: LLMEngine, total: int, tracker: StepTracker, desc: str) -> list[RequestOutput]:
    """Step until every request has finished; returns the finished outputs."""
    finished: list[RequestOutput] = []
    with tqdm(total=total, desc=desc, unit="req", leave=False) as bar:
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished.append(output)
                    bar.update()
            tracker.sample(engine.stats())
    return finished


def time_to_first_token(output: RequestOutput) -> float | None:
    metrics = output.metrics
    if metrics.first_token_time is None:
        return None
    return metrics.first_token_time - metrics.arrival_time


def per_request_tpot_ms(outputs: list[RequestOutput]) -> list[float]:
    """Each request's (last token time - first token time) / (tokens - 1), in ms."""
    per_request = []
    for out in outputs:
        times, count = out.metrics, len(out.outputs[0].token_ids)
        if count > 1 and times.first_token_time is not None and times.last_token_time is not None:
            seconds = times.last_token_time - times.first_token_time
            per_request.append(1000 * seconds / (count - 1))
    return per_request


def hit_rate(before: EngineStats, after: EngineStats) -> float | None:
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    if queries <= 0:
        return None
    return (after.prefix_cache_hits - before.prefix_cache_hits) / queries


def run_workload(
    llm: LLM, workload: Workload, label: str = "octavo", sampling: SamplingChoice = GREEDY
) -> RunResult:
    """Submit the whole workload at once and step the engine until it is done (timed)."""
    engine = llm.engine
    if workload.warmup_prompt is not None:
        submit(engine, [workload.warmup_prompt], workload.max_tokens[:1], sampling)
        drain(engine, 1, StepTracker(), f"{label} {workload.name} warm-up")
    tracker, before = StepTracker(), engine.stats()
    start = time.perf_counter()
    submit(engine, workload.prompts, workload.max_tokens, sampling)
    outputs = drain(engine, workload.num_requests, tracker, f"{label} {workload.name}")
    wall = time.perf_counter() - start
    after = engine.stats()
    generated = sum(len(output.outputs[0].token_ids) for output in outputs)
    ttfts = [t for t in map(time_to_first_token, outputs) if t is not None]
    return RunResult(
        engine=label,
        workload=workload.name,
        num_requests=workload.num_requests,
        output_tokens=generated,
        wall_s=wall,
        ttft_s=ttfts,
        kv_utilisation=tracker.utilisation,
        peak_running=tracker.peak_running,
        num_preemptions=after.num_preemptions - before.num_preemptions,
        prefix_cache_hit_rate=hit_rate(before, after),
    )
