"""`python -m octavo_bench lora`: many LoRA adapters served at once against the base model.

Workload: ``--num-users`` (20) concurrent users, all requests in flight at once, each a
different chat prompt of about ``--prompt-tokens`` (100) tokens and exactly
``--max-tokens`` (128) greedy new tokens (``ignore_eos``). Variants: ``base`` (LoRA
disabled in the engine), ``base+lora`` (``enable_lora`` but no adapter requests: the
cost of the LoRA-enabled path alone), and one run per ``--adapter-counts`` entry (1, 4,
16), the users spread over that many adapters round-robin, ``max_loras`` = the count
(every adapter has a slot: no swapping while timed). Adapters are made here with peft
on the base model (rank ``--rank``, alpha 2×rank, q/k/v/o projections, seeded random A
and B) in a temporary folder. Prefix caching is off in every run, so each one prefills
every prompt (caches are not shared across adapters). Each engine first runs the whole
round untimed with 8 new tokens (adapters loaded into their slots, kernels of the
step's shapes built); then ``--repeats`` (3) timed rounds, interleaved across the
variants (round 1 of each, then round 2 of each, ...), so that the machine's drift
during the run weighs on every variant alike; the report keeps every round and the
medians. Every variant's engine stays open for the whole run (one KV budget each).

Reported per variant: output tok/s, mean TPOT (per request, the time between its first
and last token over the further tokens; mean over requests), and the ratio to ``base``;
the target is 4 adapters ≥ 0.8× base. JSON + PNG.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from octavo import LLM, LoRARequest
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
from octavo.outputs import RequestOutput
from octavo_bench.engine_options import add_engine_options, default_dtype, threads_used
from octavo_bench.engine_runs import StepTracker, drain, greedy, per_request_tpot_ms
from octavo_bench.lora_workloads import TARGET_MODULES, make_adapters, round_robin, user_prompts
from octavo_bench.parsers import add_output_dir, register_subcommand
from octavo_bench.report import machine_info, ratio, save, table

BASE = "base"
BASE_LORA = "base+lora"
TARGET_ADAPTERS, TARGET_RATIO = 4, 0.8
WARM_UP_TOKENS = 8
_request_ids = itertools.count()


@dataclass(frozen=True)
class Variant:
    name: str
    enable_lora: bool
    adapters: int  # adapters the users are spread over (0: the base model)


@dataclass
class LoraRun:
    variant: str
    enable_lora: bool
    adapters: int
    users: int
    tok_s: list[float] = field(default_factory=list)  # one per timed round
    tpot_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0  # per round
    peak_running: int = 0

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s)

    @property
    def median_tpot_ms(self) -> float | None:
        return statistics.median(self.tpot_ms) if self.tpot_ms else None


def variants(counts: list[int]) -> list[Variant]:
    named = [Variant(BASE, False, 0), Variant(BASE_LORA, True, 0)]
    return named + [Variant(_adapters_name(n), True, n) for n in counts]


def _adapters_name(count: int) -> str:
    return f"{count} adapter" + ("" if count == 1 else "s")


def parse_counts(text: str) -> list[int]:
    """``"1,4,16"`` -> [1, 4, 16]: positive, distinct, in the order given."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"--adapter-counts {text!r} is not a comma-separated list of integers"
        ) from None
    if not counts or any(count < 1 for count in counts):
        raise ValueError(f"--adapter-counts {text!r}: give one or more counts >= 1")
    return list(dict.fromkeys(counts))


@dataclass
class LoraReport:
    settings: dict[str, Any]
    runs: list[LoraRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine_info)

    def run(self, name: str) -> LoraRun | None:
        return next((run for run in self.runs if run.variant == name), None)

    def versus_base(self, run: LoraRun) -> float | None:
        base = self.run(BASE)
        return ratio(run.median_tok_s, base.median_tok_s) if base else None

    def target(self) -> dict[str, Any]:
        """4 adapters' tok/s over base's, against the 0.8 goal (None: not both measured)."""
        measured = self.run(_adapters_name(TARGET_ADAPTERS))
        value = None if measured is None else self.versus_base(measured)
        met = None if value is None else value >= TARGET_RATIO
        return {
            "variant": _adapters_name(TARGET_ADAPTERS),
            "minimum_vs_base": TARGET_RATIO,
            "vs_base": value,
            "met": met,
        }

    def to_json(self) -> dict[str, Any]:
        runs = [
            {
                **asdict(r),
                "median_tok_s": r.median_tok_s,
                "median_tpot_ms": r.median_tpot_ms,
                "vs_base": self.versus_base(r),
            }
            for r in self.runs
        ]
        return {
            "settings": self.settings,
            "runs": runs,
            "target": self.target(),
            "notes": self.notes,
            "machine": self.machine,
        }

    def text(self) -> str:
        rows = [
            [
                r.variant,
                str(r.adapters),
                f"{r.median_tok_s:.1f}",
                " / ".join(f"{v:.1f}" for v in r.tok_s),
                _fmt(r.median_tpot_ms, " ms"),
                _fmt(self.versus_base(r), "x"),
                str(r.peak_running),
            ]
            for r in self.runs
        ]
        headers = [
            "variant",
            "adapters",
            "tok/s (median)",
            "rounds",
            "mean TPOT",
            "vs base",
            "peak running",
        ]
        s = self.settings
        title = (
            f"\n{s['model']} ({s['dtype']}, {s['threads']} threads): {s['num_users']} users"
            f" x {s['max_tokens']} tokens, rank-{s['rank']} adapters round-robin"
        )
        return "\n".join([title, table(headers, rows), self.target_line(), *self.notes])

    def target_line(self) -> str:
        goal = self.target()
        if goal["vs_base"] is None:
            return f"target: {goal['variant']} >= {TARGET_RATIO}x base: not measured"
        verdict = "met" if goal["met"] else "NOT met"
        return (
            f"target: {goal['variant']} >= {TARGET_RATIO}x base: {goal['vs_base']:.2f}x ({verdict})"
        )

    def draw(self, plt: Any) -> Any:
        figure, (speed, tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
        names = [r.variant for r in self.runs]
        bars = speed.bar(names, [r.median_tok_s for r in self.runs])
        speed.bar_label(
            bars,
            [f"{r.median_tok_s:.0f}\n{_fmt(self.versus_base(r), 'x')}" for r in self.runs],
            fontsize=8,
        )
        base = self.run(BASE)
        if base is not None:
            speed.axhline(
                TARGET_RATIO * base.median_tok_s,
                color="grey",
                linestyle="--",
                linewidth=1,
                label=f"{TARGET_RATIO}x base",
            )
            speed.legend(fontsize=8, loc="lower right")
        speed.set_ylim(0, 1.3 * max(r.median_tok_s for r in self.runs))
        speed.set_title("output tok/s (median of rounds)", fontsize=10)
        bars = tpot.bar(names, [r.median_tpot_ms or 0.0 for r in self.runs], color="tab:orange")
        tpot.bar_label(bars, [_fmt(r.median_tpot_ms, "") for r in self.runs], fontsize=8)
        tpot.set_title("mean TPOT, ms (median of rounds)", fontsize=10)
        for axis in (speed, tpot):
            axis.tick_params(axis="x", labelsize=8)
        figure.suptitle(self.target_line(), fontsize=10)
        return figure


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2)")
    parser.add_argument("--num-users", type=int, default=20, help="concurrent users")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per user")
    parser.add_argument("--prompt-tokens", type=int, default=100, help="about, per prompt")
    parser.add_argument(
        "--adapter-counts", default="1,4,16", help="adapters the users share (default: %(default)s)"
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per variant")
    add_engine_options(
        parser, {"dtype": default_dtype(), "num_threads": None, "kv_cache_memory": 2**30}
    )
    add_output_dir(parser, "lora")


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "lora",
        "many LoRA adapters at once vs the base model",
        __doc__,
        "",
        add_arguments,
        run,
    )


def run(args: argparse.Namespace) -> int:
    counts = parse_counts(args.adapter_counts)
    if min(args.num_users, args.max_tokens, args.repeats, args.rank) < 1:
        raise ValueError("--num-users, --max-tokens, --repeats and --rank must be >= 1")
    folder = resolve_model_folder(args.model)
    prompts = user_prompts(load_tokenizer(folder), args.num_users, args.prompt_tokens)
    threads = threads_used(args.num_threads)
    report = LoraReport(settings(args, folder, threads, counts, prompts))
    with tempfile.TemporaryDirectory(prefix="octavo-bench-lora-") as scratch, ExitStack() as stack:
        adapters = make_adapters(folder, Path(scratch), max(counts), args.rank, 2 * args.rank)
        engines = []
        for variant in variants(counts):
            requests = round_robin(adapters[: variant.adapters], args.num_users)
            llm = stack.enter_context(open_engine(folder, variant, args, threads))
            warm_up(llm, prompts, requests)
            engines.append(
                (
                    llm,
                    requests,
                    LoraRun(variant.name, variant.enable_lora, variant.adapters, len(prompts)),
                )
            )
        for round_index in range(args.repeats):  # rounds interleaved: drift hits every variant
            for llm, requests, result in engines:
                label = f"{result.variant} round {round_index + 1}/{args.repeats}"
                timed_round(llm, prompts, requests, args.max_tokens, label, result)
        report.runs = [result for _, _, result in engines]
    save(report, args.output_dir, "lora")
    return 0


def settings(
    args: argparse.Namespace,
    folder: Path,
    threads: int,
    counts: list[int],
    prompts: list[list[int]],
) -> dict[str, Any]:
    return {
        "model": folder.name,
        "dtype": args.dtype,
        "threads": threads,
        "num_users": args.num_users,
        "max_tokens": args.max_tokens,
        "mean_prompt_tokens": round(statistics.fmean(map(len, prompts)), 1),
        "adapter_counts": counts,
        "rank": args.rank,
        "lora_alpha": 2 * args.rank,
        "target_modules": TARGET_MODULES,
        "repeats": args.repeats,
        "enable_prefix_caching": False,
        "kv_cache_memory": args.kv_cache_memory,
    }


def open_engine(folder: Path, variant: Variant, args: argparse.Namespace, threads: int) -> LLM:
    """The variant's engine (LoRA slots for every adapter it spreads users over)."""
    lora = (
        {
            "enable_lora": True,
            "max_loras": max(1, variant.adapters),
            "max_cpu_loras": max(1, variant.adapters),
            "max_lora_rank": args.rank,
        }
        if variant.enable_lora
        else {}
    )
    return LLM(
        str(folder),
        dtype=args.dtype,
        max_model_len=1024,
        num_threads=threads,
        kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=False,
        **lora,
    )


def warm_up(llm: LLM, prompts: list[list[int]], requests: list[LoRARequest | None]) -> None:
    """The whole round with a few new tokens, untimed: lazy initialisation, adapter loads
    into their slots and the kernels of the step's shapes (prefill chunks, rows per
    adapter) happen here, not in the first timed round."""
    llm.generate(prompts, greedy(WARM_UP_TOKENS), use_tqdm=False, lora_request=requests)


def timed_round(
    llm: LLM,
    prompts: list[list[int]],
    requests: list[LoRARequest | None],
    max_tokens: int,
    label: str,
    result: LoraRun,
) -> None:
    """Every user's request added at once, the engine stepped until all have finished."""
    engine, tracker = llm.engine, StepTracker()
    start = time.perf_counter()
    for prompt, request in zip(prompts, requests, strict=True):
        engine.add_request(
            f"lora-{next(_request_ids)}", prompt, greedy(max_tokens), lora_request=request
        )
    outputs = drain(engine, len(prompts), tracker, label)
    wall = time.perf_counter() - start
    result.output_tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
    result.tok_s.append(result.output_tokens / wall)
    tpot = mean_tpot_ms(outputs)
    if tpot is not None:
        result.tpot_ms.append(tpot)
    result.peak_running = max(result.peak_running, tracker.peak_running)


def mean_tpot_ms(outputs: list[RequestOutput]) -> float | None:
    """Mean over requests of (last token time - first token time) / (tokens - 1), in ms."""
    per_request = per_request_tpot_ms(outputs)
    return statistics.fmean(per_request) if per_request else None
