"""`python -m octavo_bench offline`: Octavo's offline throughput against HF and vLLM.

Workloads (token counts at ``--scale 1.0``):
  (a) 32 chat-templated "What is <topic>?" prompts x exactly 128 new tokens
  (b) 64 seeded requests, random-token prompts of 16-512 tokens, 16-256 new tokens
  (c) a single stream of 128 new tokens
  (d) 64 requests sharing a ~1,000-token system prompt, prefix cache on vs off (TTFT)
  (e) 16 random-token prompts of 1,536 tokens x 256 new tokens: long contexts (no HF run)
  (f) one random-token prompt of 6,000 tokens x 128 new tokens: a long single stream (no HF)
All greedy with ``ignore_eos`` unless ``--temperature`` (and ``--top-p``, ``--top-k``,
``--min-p``) make every engine sample; every run follows a short untimed warm-up, and
tok/s = output tokens / wall time.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from octavo import LLM
from octavo.arg_types import positive_float, positive_int
from octavo.model_executor.model_folders import load_tokenizer, resolve_model_folder
from octavo_bench import baselines, vllm_baseline
from octavo_bench.capacity import sequences_that_fit
from octavo_bench.engine_options import add_engine_options, default_dtype, threads_used
from octavo_bench.engine_runs import run_workload, warm_up
from octavo_bench.offline_rounds import Rounds
from octavo_bench.parsers import (
    add_output_dir,
    name_list,
    register_subcommand,
    standalone_parser,
)
from octavo_bench.report import (
    OCTAVO,
    OCTAVO_NO_CACHE,
    VLLM,
    BenchReport,
    RunResult,
    machine_info,
    save,
)
from octavo_bench.sampling_choice import add_sampling_arguments, sampling_from_args
from octavo_bench.vllm_baseline import VllmRunError, VllmSetup
from octavo_bench.vllm_turns import VllmTurns
from octavo_bench.workloads import (
    DEFAULT_SEED,
    WORKLOAD_NAMES,
    Workload,
    build_workloads,
    chat_prompt,
)

DEFAULT_KV_CACHE_MEMORY = 2 * 1024**3
DEFAULT_BASELINES = "hf-fp32,hf-bf16"
BLOCK_SIZE = 16
KV_WORKLOADS = ("a", "b")  # workloads whose KV utilisation and "sequences that fit" we report

EPILOG = """\
Octavo runs (a)-(c), (e) and (f) with prefix caching off, so the KV figures measure paging alone
(HF has no prefix cache either); (d) runs once with it off and once with it on.
HF baselines use static left-padded batches (batch 32 for (a), 1 for (c)); (b) runs
in static batches of 16 sorted by prompt length and counts only the requested tokens.

The vllm baseline runs vLLM's offline LLM.generate on the same token-id prompts
(greedy, ignore_eos, min_tokens) in a child process of the python of vLLM's own venv:
--vllm-python, else .venv-vllm/bin/python (`make vllm-venv` makes it), else this
interpreter if it has vllm; without any, the report notes it skipped and why. It runs
(a)-(c), (e) and (f) with Octavo's --max-model-len, dtype --vllm-dtype, its log in
OUTPUT_DIR/offline-vllm.log, and these defaults for vLLM's CPU backend unless set:
  VLLM_CPU_OMP_THREADS_BIND=<every CPU, e.g. 0-15>  VLLM_CPU_NUM_OF_RESERVED_CPU=0
  VLLM_CPU_KVCACHE_SPACE=4   (GiB of KV cache)
"""


@dataclass
class BenchSetup:
    folder: Path
    tokenizer: object
    workloads: dict[str, Workload]
    warmup_prompt: list[int]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads",
        type=name_list(WORKLOAD_NAMES),
        default=list(WORKLOAD_NAMES),
        help="comma-separated subset of a,b,c,d,e (default: all)",
    )
    parser.add_argument(
        "--baselines",
        type=name_list(baselines.ALL_BASELINES),
        default=DEFAULT_BASELINES.split(","),
        help="comma-separated subset of hf-fp32,hf-bf16,vllm; '' for none "
        f"(default: {DEFAULT_BASELINES})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed of the generated workloads (default: %(default)s)",
    )
    parser.add_argument(
        "--scale",
        type=positive_float,
        default=1.0,
        help="shrink request counts and lengths for quick runs (default: 1.0)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="run Octavo and vLLM on (a)-(c), (e), (f) this many times, taking turns; "
        "report the median of the rounds' ratios (offline_rounds; default: %(default)s)",
    )
    add_output_dir(parser, "offline")
    add_engine_arguments(parser)
    add_sampling_arguments(parser)
    vllm_baseline.add_vllm_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="local HF model folder (default: the embedded SmolLM2-135M-Instruct)",
    )
    add_engine_options(
        parser,
        {
            "dtype": default_dtype(),
            "max_model_len": 2048,
            "kv_cache_memory": DEFAULT_KV_CACHE_MEMORY,
            "max_num_seqs": 256,
            "max_num_batched_tokens": None,  # the offline LLM's own, 2048
            "num_threads": None,
            "quantization": None,
        },
    )


def register(kinds: argparse._SubParsersAction) -> None:
    register_subcommand(
        kinds,
        "offline",
        "offline throughput vs HF transformers and vLLM",
        __doc__,
        EPILOG,
        add_arguments,
        run,
    )


def build_parser() -> argparse.ArgumentParser:
    return standalone_parser("offline", __doc__, EPILOG, add_arguments)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from a list of command-line arguments (what the tests call)."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The benchmark: Octavo, then the baselines, then the table, JSON and PNG."""
    if not args.workloads:
        raise ValueError("--workloads must name at least one of a, b, c, d")
    vllm = VllmSetup.from_args(args) if VLLM in args.baselines else None
    if vllm is not None and vllm.python is None and args.vllm_python:
        raise ValueError(vllm.skip_reason)  # a wrong path: say so before the long Octavo runs
    torch.set_num_threads(threads_used(args.num_threads))  # HF's too, as Octavo's
    setup = prepare(args)
    report = BenchReport(torch_machine_info(args.dtype), run_config(args), setup.workloads)
    in_rounds = set(rounds_workloads(setup)) if args.rounds > 1 else set()
    run_octavo(args, setup, report, skip=in_rounds)
    run_baselines(args, setup, report, vllm)
    if in_rounds:
        run_rounds(args, setup, report, vllm)
    # Octavo's rows first (the rounds' median runs come last), the others as they ran
    report.results.sort(key=lambda r: (r.workload, not r.engine.startswith(OCTAVO)))
    save(report, args.output_dir, "offline")
    return 0


def torch_machine_info(dtype: str) -> dict:
    import transformers

    return machine_info(
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        dtype=dtype,
    )


def prepare(args: argparse.Namespace) -> BenchSetup:
    folder = resolve_model_folder(args.model)
    tokenizer = load_tokenizer(folder)
    workloads = build_workloads(tokenizer, args.workloads, args.scale, args.seed)
    fit_max_model_len(args, workloads.values())
    warmup_prompt = chat_prompt(tokenizer, "Say hello.")
    return BenchSetup(folder, tokenizer, workloads, warmup_prompt)


def fit_max_model_len(args: argparse.Namespace, workloads) -> None:
    """Raise --max-model-len (both engines') to what the longest request needs, in whole
    multiples of 1,024 tokens: (f)'s 6,128 tokens pass the default 2,048."""
    longest = max(
        (
            len(prompt) + tokens
            for w in workloads
            for prompt, tokens in zip(w.prompts, w.max_tokens, strict=True)
        ),
        default=0,
    )
    if longest > args.max_model_len:
        args.max_model_len = -(-longest // 1024) * 1024
        print(f"--max-model-len raised to {args.max_model_len} for a {longest}-token request")


def run_config(args: argparse.Namespace) -> dict:
    return {
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "scale": args.scale,
        "seed": args.seed,
        "workloads": args.workloads,
        "baselines": args.baselines,
        "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory,
        "block_size": BLOCK_SIZE,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "quantization": args.quantization,
        "num_threads": threads_used(args.num_threads),
        "sampling": sampling_from_args(args).describe(),
    }


def make_llm(args: argparse.Namespace, prefix_caching: bool) -> LLM:
    budget = {}  # unset: the offline LLM's own default
    if args.max_num_batched_tokens is not None:
        budget["max_num_batched_tokens"] = args.max_num_batched_tokens
    return LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        kv_cache_memory=args.kv_cache_memory,
        enable_prefix_caching=prefix_caching,
        block_size=BLOCK_SIZE,
        quantization=args.quantization,
        num_threads=args.num_threads,
        **budget,
    )


def record(report: BenchReport, result: RunResult) -> None:
    report.results.append(announced(result))


def announced(result: RunResult) -> RunResult:
    print(
        f"{result.engine} ({result.workload}): {result.output_tokens} tokens in "
        f"{result.wall_s:.2f} s = {result.tok_s:.1f} tok/s",
        flush=True,
    )
    return result


def run_octavo(
    args: argparse.Namespace, setup: BenchSetup, report: BenchReport, skip: set[str]
) -> None:
    """(a)-(c), (e), (f) (but those in ``skip``: run_rounds runs them) and (d) without
    prefix caching on one engine; (d) with it on a second."""
    chosen = {name: w for name, w in setup.workloads.items() if name not in skip}
    if not chosen:
        return
    llm = make_llm(args, prefix_caching=False)
    warm_up(llm, setup.warmup_prompt)
    for name, workload in chosen.items():
        label = OCTAVO_NO_CACHE if name == "d" else OCTAVO
        record(report, run_workload(llm, workload, label, sampling_from_args(args)))
        if name in KV_WORKLOADS:
            add_fit(report, llm, workload, args.kv_cache_memory)
    if "d" in chosen:
        del llm
        gc.collect()
        llm = make_llm(args, prefix_caching=True)
        warm_up(llm, setup.warmup_prompt)
        record(report, run_workload(llm, setup.workloads["d"], OCTAVO, sampling_from_args(args)))


def run_rounds(
    args: argparse.Namespace, setup: BenchSetup, report: BenchReport, vllm: VllmSetup | None
) -> None:
    """--rounds N of the workloads vLLM runs too, one workload at a time: Octavo's run,
    then vLLM's (vllm_turns: its runner loaded once, taking turns); each engine's row is
    then its median run, each ratio the median of the rounds' (offline_rounds), and the
    KV figures those of Octavo's median run."""
    chosen = [setup.workloads[name] for name in rounds_workloads(setup)]
    rounds = Rounds([w.name for w in chosen])
    llm = make_llm(args, prefix_caching=False)
    warm_up(llm, setup.warmup_prompt)
    sampling = sampling_from_args(args)

    def octavo_run(workload: Workload) -> RunResult:
        return announced(run_workload(llm, workload, OCTAVO, sampling))

    if vllm is not None and vllm.python is not None:
        take_turns(args, setup, vllm, rounds, octavo_run)
        note_vllm(report, vllm)
    # Without vLLM, or where its runner failed before a turn: Octavo's rounds alone.
    alone = [w for w in chosen if (w.name, OCTAVO) not in rounds.runs]
    for _ in range(args.rounds if alone else 0):
        for workload in alone:
            rounds.add(octavo_run(workload))
    rounds.settle(report)
    for workload in chosen:
        if workload.name in KV_WORKLOADS:
            add_fit(report, llm, workload, args.kv_cache_memory)


def rounds_workloads(setup: BenchSetup) -> list[str]:
    """The workloads --rounds runs: those vLLM runs too."""
    return [name for name in setup.workloads if name in baselines.VLLM_WORKLOADS]


def take_turns(
    args: argparse.Namespace,
    setup: BenchSetup,
    vllm: VllmSetup,
    rounds: Rounds,
    octavo_run: Callable[[Workload], RunResult],
) -> None:
    """Each round, each of the rounds' workloads: Octavo's run, then vLLM's (a skip reason
    instead where vLLM fails)."""
    chosen = [setup.workloads[name] for name in rounds.workloads]
    request = vllm_baseline.runner_request(
        setup.folder,
        vllm.dtype,
        args.max_model_len,
        chosen * args.rounds,
        setup.warmup_prompt,
        vllm_sampling(args),
    )
    print(f"starting vllm to take turns ({vllm.python}, {vllm.dtype})", flush=True)
    turns = VllmTurns(vllm, request, args.output_dir / "offline-vllm.log")
    try:
        with turns:
            for number in range(1, args.rounds + 1):
                print(f"round {number} of {args.rounds}", flush=True)
                for workload in chosen:
                    rounds.add(octavo_run(workload))
                    rounds.add(announced(turns.turn()))
    except VllmRunError as error:
        vllm.skip_reason = str(error)
    if turns.result:  # the runner's result file: what it says of vLLM
        vllm.facts.update(
            version=turns.result.get("vllm_version"),
            kernel_isa=turns.result.get("kernel_isa"),
            load_s=round(turns.result.get("load_s", 0.0), 2),
        )


def add_fit(report: BenchReport, llm: LLM, workload: Workload, budget: int) -> None:
    engine = llm.engine
    result = report.result(workload.name, OCTAVO)
    report.fits[workload.name] = sequences_that_fit(
        engine.parts.config,
        engine.parts.dtype,
        budget,
        engine.max_model_len,
        BLOCK_SIZE,
        workload.mean_total_tokens,
        result.peak_running if result else 0,
    )


def run_baselines(
    args: argparse.Namespace, setup: BenchSetup, report: BenchReport, vllm: VllmSetup | None
) -> None:
    chosen = [w for n, w in setup.workloads.items() if n in baselines.HF_WORKLOADS]
    pad_id = setup.tokenizer.eos_token_id
    for label in (b for b in args.baselines if b in baselines.HF_BASELINES):
        if not chosen:
            break
        sampling = sampling_from_args(args)
        for result in baselines.run_hf(
            setup.folder, label, chosen, setup.warmup_prompt, pad_id, sampling
        ):
            record(report, result)
    if any(b in baselines.HF_BASELINES for b in args.baselines) and "b" in setup.workloads:
        report.notes.append(
            "HF (b) runs static batches of 16 sorted by prompt length; each batch decodes to "
            "its longest request and tok/s counts only the requested tokens"
        )
    for_vllm = [w for n, w in setup.workloads.items() if n in baselines.VLLM_WORKLOADS]
    if vllm is not None and for_vllm and args.rounds == 1:  # else run_rounds takes turns
        run_vllm_baseline(args, setup, report, for_vllm, vllm)


def run_vllm_baseline(
    args: argparse.Namespace,
    setup: BenchSetup,
    report: BenchReport,
    chosen: list[Workload],
    vllm: VllmSetup,
) -> None:
    """vLLM in its own venv on the chosen workloads; a note instead when it cannot run."""
    if vllm.python is not None:
        for result in vllm_runs(args, setup, chosen, vllm):
            record(report, result)
    note_vllm(report, vllm)


def note_vllm(report: BenchReport, vllm: VllmSetup) -> None:
    """vLLM's settings in the report's config; a note (and a line) where it was skipped."""
    report.config[VLLM] = vllm.describe()
    if vllm.skip_reason:
        message = f"vllm baseline skipped: {vllm.skip_reason}"
        print(message, file=sys.stderr)
        report.notes.append(message)


def vllm_runs(
    args: argparse.Namespace, setup: BenchSetup, chosen: list[Workload], vllm: VllmSetup
) -> list[RunResult]:
    """One vLLM child over the chosen workloads; none, and ``vllm.skip_reason`` set, when
    it fails."""
    try:
        return vllm_baseline.run_offline(
            vllm,
            setup.folder,
            args.max_model_len,
            chosen,
            setup.warmup_prompt,
            args.output_dir / "offline-vllm.log",
            vllm_sampling(args),
        )
    except VllmRunError as error:
        vllm.skip_reason = str(error)
        return []


def vllm_sampling(args: argparse.Namespace) -> dict | None:
    """The sampling fields vLLM's runner gets: None for greedy."""
    sampling = sampling_from_args(args)
    return None if sampling.is_greedy else sampling.fields()
