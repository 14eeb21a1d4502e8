"""`python -m octavo_bench kv-offload`: multi-turn chat whose histories outgrow the KV
pool, with and without the KV offload tier (``--kv-offloading-size``).

``--conversations`` chats, each opening with its own ``--system-tokens`` prompt, take
``--turns`` turns round-robin: every turn re-sends the whole history (earlier prompts and
replies) plus a new ``--user-tokens`` message and generates ``--reply-tokens`` greedy
tokens. The primary pool holds the final histories of only ``--pool-conversations`` of
them, so by a conversation's next turn its blocks have been reused by the others: without
the tier the history is recomputed, with it (sized for every conversation, 1.5x) the
evicted blocks are loaded back. Requests run one at a time on the offline engine (TTFT is
the prefill, never a queue), both settings on the same engine settings in one run, after
an untimed warm-up. Token ids are random (seeded), the model the embedded SmolLM2-135M
unless ``--model``. On CPU the tier is a file mapping the kernel pages to disk.

Reported: TTFT p50/p99 per turn and over the turns after the first, prompt tokens
recomputed (the engine's counters: prompt tokens - prefix-cache hits, the pool's and the
tier's apart), wall and CPU seconds, whether the greedy output is identical, and the no
tier / tier ratios. ``--engines`` may add ``vllm``: vLLM's CPU build with its native
offloading (``kv_offloading_size``) is tried on a short request; the report says whether
it ran or why it refused. Writes kv_offload.json and kv_offload.png.
"""

from __future__ import annotations

import argparse
import random
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from octavo import LLM, SamplingParams
from octavo.model_executor.model_folders import resolve_model_folder
from octavo_bench.engine_options import add_engine_options, default_dtype
from octavo_bench.kv_offload_report import (
    NO_TIER,
    TIER,
    EngineCounters,
    KvOffloadReport,
    SettingResult,
    TurnRecord,
)
from octavo_bench.parsers import add_engines_option, add_output_dir, register_subcommand
from octavo_bench.report import machine_info, save
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup, add_vllm_arguments, run_runner

BLOCK_SIZE = 16
TOKEN_RANGE = (100, 20000)  # random token ids drawn from here
ENGINES = (TIER, NO_TIER, "vllm")
TIER_HEADROOM = 1.5  # the tier holds every conversation's final history, times this


@dataclass
class ChatWorkload:
    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int
    seed: int

    @property
    def final_history(self) -> int:
        """Tokens of a conversation's last prompt plus its reply."""
        return self.system_tokens + self.turns * (self.user_tokens + self.reply_tokens)

    def system_prompt(self, conversation: int) -> list[int]:
        return self._tokens(f"system-{conversation}", self.system_tokens)

    def user_message(self, conversation: int, turn: int) -> list[int]:
        return self._tokens(f"user-{conversation}-{turn}", self.user_tokens)

    def _tokens(self, name: str, count: int) -> list[int]:
        draw = random.Random(f"{self.seed}-{name}")
        return [draw.randrange(*TOKEN_RANGE) for _ in range(count)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    add_engine_options(parser, {"dtype": default_dtype(), "num_threads": None})
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4, help="turns of each conversation")
    parser.add_argument("--system-tokens", type=int, default=384)
    parser.add_argument("--user-tokens", type=int, default=48, help="a new message's tokens")
    parser.add_argument("--reply-tokens", type=int, default=24, help="greedy tokens a turn")
    parser.add_argument(
        "--pool-conversations",
        type=float,
        default=2.0,
        help="final histories the primary KV pool holds (fewer than --conversations)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_engines_option(parser, ENGINES)
    add_vllm_arguments(parser)
    add_output_dir(parser, "kv_offload")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "kv-offload",
        "multi-turn chat TTFT with and without the KV offload tier",
        __doc__,
        "",
        add_arguments,
        run,
    )


def check_sizes(args: argparse.Namespace) -> None:
    for name in ("conversations", "turns", "system_tokens", "user_tokens", "reply_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.pool_conversations < args.conversations:
        raise ValueError("--pool-conversations must be above 0 and below --conversations")


def run(args: argparse.Namespace) -> int:
    check_sizes(args)
    folder = resolve_model_folder(args.model)
    workload = ChatWorkload(
        args.conversations,
        args.turns,
        args.system_tokens,
        args.user_tokens,
        args.reply_tokens,
        args.seed,
    )
    sizes = EngineSizes.of(folder, args.dtype, workload, args.pool_conversations)
    report = KvOffloadReport(machine_info(dtype=args.dtype), run_config(args, sizes))
    outputs = {}
    for name, tier_gib in ((TIER, sizes.tier_gib), (NO_TIER, None)):
        if name in args.engines:
            result, outputs[name] = run_setting(folder, args, workload, sizes, name, tier_gib)
            report.settings.append(result)
    if len(outputs) == 2:
        report.same_output = outputs[TIER] == outputs[NO_TIER]
    if "vllm" in args.engines:
        report.vllm = probe_vllm(folder, args, sizes)
    save(report, args.output_dir, "kv_offload")
    return 0


@dataclass
class EngineSizes:
    block_bytes: int
    pool_blocks: int
    tier_gib: float
    max_model_len: int

    @classmethod
    def of(cls, folder: Path, dtype: str, workload: ChatWorkload, pool_conversations: float):
        import torch

        from octavo.kv_cache.cache_tensors import bytes_per_block
        from octavo.model_executor.model_config import ModelConfig

        config = ModelConfig.from_folder(folder)
        block_bytes = bytes_per_block(config, BLOCK_SIZE, getattr(torch, dtype))
        blocks_each = -(-workload.final_history // BLOCK_SIZE) + 1
        pool_blocks = max(blocks_each + 1, int(pool_conversations * blocks_each))
        tier_blocks = int(TIER_HEADROOM * workload.conversations * blocks_each)
        max_len = -(-(workload.final_history + 1) // BLOCK_SIZE) * BLOCK_SIZE
        return cls(block_bytes, pool_blocks, tier_blocks * block_bytes / (1 << 30), max_len)

    @property
    def kv_cache_memory(self) -> int:
        return (self.pool_blocks + 1) * self.block_bytes  # one more: the null block


def run_config(args: argparse.Namespace, sizes: EngineSizes) -> dict:
    return {
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "dtype": args.dtype,
        "num_threads": args.num_threads,
        "conversations": args.conversations,
        "turns": args.turns,
        "system_tokens": args.system_tokens,
        "user_tokens": args.user_tokens,
        "reply_tokens": args.reply_tokens,
        "seed": args.seed,
        "block_size": BLOCK_SIZE,
        "block_bytes": sizes.block_bytes,
        "pool_blocks": sizes.pool_blocks,
        "kv_cache_memory": sizes.kv_cache_memory,
        "kv_offloading_size_gib": sizes.tier_gib,
        "max_model_len": sizes.max_model_len,
    }


def run_setting(folder, args, workload, sizes, name, tier_gib) -> tuple[SettingResult, list]:
    """Every turn of every conversation through one engine; the result and the replies."""
    llm = LLM(
        str(folder),
        dtype=args.dtype,
        num_threads=args.num_threads,
        max_model_len=sizes.max_model_len,
        kv_cache_memory=sizes.kv_cache_memory,
        kv_offloading_size=tier_gib,
    )
    result = SettingResult(name, tier_gib)
    try:
        llm.generate({"prompt_token_ids": workload.user_message(-1, -1)}, greedy(8), use_tqdm=False)
        before, start, cpu = llm.engine.stats(), time.perf_counter(), cpu_seconds()
        replies = run_turns(llm, workload, result)
        result.wall_s, result.cpu_s = time.perf_counter() - start, cpu_seconds() - cpu
        result.counters = counters_between(before, llm.engine.stats())
    finally:
        llm.shutdown()
    return result, replies


def run_turns(llm: LLM, workload: ChatWorkload, result: SettingResult) -> list[list[int]]:
    histories = [workload.system_prompt(c) for c in range(workload.conversations)]
    replies = []
    for turn in range(workload.turns):
        for c in range(workload.conversations):
            prompt = histories[c] + workload.user_message(c, turn)
            request_id = f"{result.name}-{c}-{turn}"
            out, ttft, ttft_cpu = one_request(llm, request_id, prompt, workload.reply_tokens)
            record = TurnRecord(turn, c, len(prompt), out.num_cached_tokens, ttft, ttft_cpu)
            result.records.append(record)
            reply = list(out.outputs[0].token_ids)
            histories[c] = prompt + reply
            replies.append(reply)
        print(f"{result.name}: turn {turn} done", flush=True)
    return replies


def one_request(llm: LLM, request_id: str, prompt: list[int], reply_tokens: int):
    """Step the engine through one request alone: its final output, and the wall and CPU
    seconds to its first token (CPU time: a loaded machine stretches wall time only)."""
    engine = llm.engine
    start, cpu = time.perf_counter(), cpu_seconds()
    engine.add_request(request_id, prompt, greedy(reply_tokens))
    first: tuple[float, float] | None = None
    while True:
        for output in engine.step():
            if first is None and output.outputs and output.outputs[0].token_ids:
                first = (time.perf_counter() - start, cpu_seconds() - cpu)
            if output.finished:
                assert first is not None
                return output, *first


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def counters_between(before, after) -> EngineCounters:
    tier_before, tier_after = before.kv_offload, after.kv_offload

    def tier(name: str) -> int:
        return 0 if tier_after is None else getattr(tier_after, name) - getattr(tier_before, name)

    return EngineCounters(
        after.prompt_tokens - before.prompt_tokens,
        after.prefix_cache_hits - before.prefix_cache_hits,
        tier("hits"),
        tier("stored_blocks"),
        tier("loaded_blocks"),
    )


def probe_vllm(folder: Path, args: argparse.Namespace, sizes: EngineSizes) -> dict:
    """vLLM's CPU build with ``kv_offloading_size`` on one short request: did it run?"""
    setup = VllmSetup.from_args(args)
    if setup.python is None:
        return {"outcome": f"not run: {setup.skip_reason}"}
    prompt = [TOKEN_RANGE[0] + i for i in range(3 * BLOCK_SIZE)]
    request = {
        "model": str(folder),
        "dtype": setup.dtype,
        "max_model_len": sizes.max_model_len,
        "llm_kwargs": {
            "kv_offloading_size": sizes.tier_gib,
            "kv_offloading_backend": "native",
            "enable_prefix_caching": True,
        },
        "warmup": {"prompts": [prompt], "max_tokens": [4]},
        "workloads": [{"name": "probe", "prompts": [prompt[::-1]], "max_tokens": [4]}],
    }
    log = args.output_dir / "kv_offload-vllm.log"
    try:
        ran = run_runner(setup, request, log)
    except VllmRunError as error:
        why = first_error_line(log) or str(error)
        return {**setup.describe(), "outcome": f"refused native offloading on CPU: {why}"}
    return {
        **setup.describe(),
        "version": ran.get("vllm_version"),
        "outcome": "ran with native offloading on CPU (its multi-turn TTFT is not measured here)",
    }


def first_error_line(log: Path) -> str | None:
    """The log's first ``...Error: ...`` line (the root cause vLLM gives), if any."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [found.group(0) for line in lines if (found := re.search(r"\w+Error: .*", line))]
    return errors[0].strip() if errors else None
